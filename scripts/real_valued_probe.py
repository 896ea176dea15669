"""A real-valued embedding against real-valued CCA, ranked by cosine on the query split (`unimodal`).

One linear map per modality, on the centred, L2-normalised features, trained with InfoNCE on the
cosine of its outputs (the captions of an image are never each other's negatives), its best epoch
chosen on a seeded tenth of the training split (the trainer's validation score, by cosine), never on
the query split: method 'two-tower' with linear heads trained without codes (``relaxation =
'none'``). Real-valued CCA is method 'cca-itq' before its sign (PCA → CCA; ITQ's rotation keeps
cosines), fitted on the whole training split, at each ``--components``. Both are scored as a results
row's ``real_valued`` figures are (docs/evaluation.md): the real-valued embeddings, measured on an embedding trained as one, where the hashing methods' real-valued outputs
are their codes before the sign.

    python scripts/real_valued_probe.py ../shared/data/flickr8k1000.h5 --seeds 2023,1,2
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List, Tuple

import numpy as np
import torch
from torch import nn

from ucmfh.methods.cca_itq import fit_cca_itq
from ucmfh.methods import hash_config
from ucmfh.data.h5 import Dataset, load_dataset
from ucmfh.models.hashing import FeatureHasher
from ucmfh.evaluation import head_outputs_split, score_splits
from ucmfh.methods import fit_hashing
from ucmfh.metrics.arguments import DEFAULT_K


def fit_embedding(data: Dataset, seed: int, dim: int, temperature: float, lr: float,
                  epochs: int, patience: int) -> Tuple[FeatureHasher, float, int]:
    """A ``two-tower`` model with linear heads of ``dim`` outputs trained as a real-valued embedding
    (``relaxation = 'none'``) on the training split less its validation tenth; returns the model with
    its best validation epoch's weights, that epoch's score (by cosine) and the epoch."""
    cfg = hash_config("two-tower", n_bits=dim, hidden=0, relaxation="none", loss_params={"temperature": temperature},
                      lr_head=lr, epochs=epochs, patience=patience, seed=seed, device="cpu")
    model, history = fit_hashing(data, cfg, progress=False)
    return model, history.best_score, history.best_epoch


def query_scores(model: nn.Module, data: Dataset, k: int) -> Dict[str, Dict[str, float]]:
    """Each database's row (its name, or 'retrieval'): R@1 I→T / T→I on a caption set, else MAP@k."""
    query = head_outputs_split(model, data.query, "unimodal", "cpu")
    retrieval = head_outputs_split(model, data.retrieval, "unimodal", "cpu")
    out = {}
    for row in score_splits(query, retrieval, data, k, "cosine"):
        if "recall_i2t" in row:
            figures = {"r1_i2t": row["recall_i2t"]["1"], "r1_t2i": row["recall_t2i"]["1"], "rsum": row["rsum"]}
        else:
            figures = {"map_i2t": row["map_i2t"], "map_t2i": row["map_t2i"]}
        out[row.get("database", "retrieval")] = {key: round(float(v), 4) for key, v in figures.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a ucmfh HDF5 file")
    parser.add_argument("--seeds", default="2023,1,2")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--components", default="16,32,64,128", help="CCA's numbers of components")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    args = parser.parse_args()
    components = [int(c) for c in args.components.split(",")]
    if not all(8 <= n <= 256 for n in components):
        parser.error(f"--components must be between 8 and 256 (as code lengths), got {args.components}")
    torch.set_num_threads(1)

    data = load_dataset(args.dataset)
    rows: List[Dict] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        model, val, epoch = fit_embedding(data, seed, args.dim, args.temperature, args.lr, args.epochs, args.patience)
        rows.append({"model": f"linear InfoNCE {args.dim}", "seed": seed, "val_score": round(val, 4),
                     "best_epoch": epoch, **query_scores(model, data, args.k)})
        for n in components:
            cca, _ = fit_cca_itq(data.train, n, seed=seed)
            rows.append({"model": f"CCA {n}", "seed": seed, **query_scores(cca, data, args.k)})
    for row in rows:
        print(json.dumps(row))
    print("\nmean over seeds:")
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        figures = {db: {key: round(float(np.mean([r[db][key] for r in mine])), 3) for key in mine[0][db]}
                   for db in mine[0] if isinstance(mine[0][db], dict)}
        print(f"{name:>22}: {json.dumps(figures)}")


if __name__ == "__main__":
    main()
