"""How much of a caption set's Hamming R@1 is decided by ties: the metric against its tie-free bounds.

A Hamming ranking of n-bit codes has n + 1 distances, so many database items share a query's
smallest distance; the metric breaks such ties by database index (docs/reference.md §6, §7). For
each query this script finds the nearest true match (an item with the query's id) and the items
that are at least as near, and reports, per database (`test`, `collection`) and direction:

* ``r1``: R@1 as the metric computes it (ties by index);
* ``r1_expected``: R@1 with ``ties="expected"``, the mean over every order of tied items (what
  ``ucmfh`` reports first since tie-aware metrics, docs/evaluation.md); it lies between the bounds:
* ``r1_ties_won``: R@1 if every tie went to the true match: a true match at the smallest distance;
* ``r1_alone``: R@1 if every tie went against it: a true match strictly nearer than every other item;
* ``as_near``: the mean number of other items at the nearest true match's distance or nearer.

The methods are trained as the grid trains them (`hash_config(method, n_bits=…, seed=…)`, their
defaults), on the training split, or read from saved hashing checkpoints (``--checkpoints``: any run's
``hashN.pt``, trained on the file's features), and scored on the query split, `unimodal`: an analysis
of the codes, nothing is selected on it.

    python scripts/hamming_ties.py ../shared/data/flickr8k1000.h5 --methods two-tower,cca-itq -b 16 -b 32
    python scripts/hamming_ties.py ../shared/data/flickr8k.h5 --checkpoints runs/flickr8k-*/*/hash16.pt
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch

from ucmfh.checkpoint import CheckpointError, load_model
from ucmfh.methods import hash_config
from ucmfh.data.format import DataError, first_of_each_id
from ucmfh.data.h5 import load_dataset
from ucmfh.metrics.captions import DATABASES, databases
from ucmfh.metrics.ranking import hits_at_ranks
from ucmfh.evaluation import encode_split
from ucmfh.methods import fit_hashing


def tie_bounds(query: torch.Tensor, database: torch.Tensor, query_ids: torch.Tensor,
               database_ids: torch.Tensor) -> Dict[str, float]:
    """R@1 (ties by index) and its tie-free bounds, in %, and the mean number of other items at least
    as near as the nearest true match. Every query needs a true match in the database.

    Shape: ±1 codes query [Q, n], database [N, n]; ids [Q], [N] int64.
    """
    n_bits = query.shape[1]
    distance = (n_bits - query.double() @ database.double().T) / 2  # [Q, N] Hamming distances
    match = query_ids[:, None] == database_ids[None, :]
    if not match.any(1).all():
        raise ValueError("every query needs a true match in the database")
    nearest_match = torch.where(match, distance, torch.full_like(distance, np.inf)).min(1).values
    nearer_others = ((distance <= nearest_match[:, None]) & ~match).sum(1)
    nearest = distance.min(1).values
    first = (distance == nearest[:, None]).double().argmax(1)  # the smallest index at the smallest distance
    expected = hits_at_ranks(query, database, query_ids, database_ids, (1,), ties="expected")
    return {
        "r1": 100.0 * match.gather(1, first[:, None]).double().mean().item(),
        "r1_expected": 100.0 * expected.mean().item(),
        "r1_ties_won": 100.0 * (nearest_match == nearest).double().mean().item(),
        "r1_alone": 100.0 * (nearer_others == 0).double().mean().item(),
        "as_near": nearer_others.double().mean().item(),
    }


def caption_set_ties(codes_query: Tuple[torch.Tensor, torch.Tensor], codes_retrieval: Tuple[torch.Tensor, torch.Tensor],
                     query_ids: torch.Tensor, retrieval_ids: torch.Tensor) -> Dict[str, Dict[str, Dict[str, float]]]:
    """:func:`tie_bounds` of both directions on both databases of a caption set (docs/reference.md §7):
    unique query images against captions, every query caption against images."""
    unique = torch.from_numpy(first_of_each_id(query_ids.cpu().numpy())).to(query_ids.device)
    out = {}
    for name, db in databases((*codes_query, query_ids), (*codes_retrieval, retrieval_ids)).items():
        out[name] = {
            "i2t": tie_bounds(codes_query[0][unique], db["txt"], query_ids[unique], db["txt_ids"]),
            "t2i": tie_bounds(codes_query[1], db["img"], query_ids, db["img_ids"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a caption set in the ucmfh HDF5 format (ids, no labels)")
    parser.add_argument("--methods", default="two-tower,cca-itq")
    parser.add_argument("-b", "--bits", type=int, action="append", help="code lengths (default 16, 32)")
    parser.add_argument("--seeds", default="2023,1,2")
    parser.add_argument("--checkpoints", nargs="+", metavar="HASH_PT",
                        help="score these saved hashing checkpoints instead of training (--methods, -b, --seeds unused)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        data = load_dataset(args.dataset)
        if not data.caption_set:
            raise DataError(f"{args.dataset}: not a caption set (it has labels); R@1 by id needs one")
        saved = [(path, *load_model(path, "hash", data.d_img, data.d_txt)) for path in args.checkpoints or ()]
    except (DataError, CheckpointError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)

    def runs():
        """(row label, model) of each checkpoint, or of each run trained here."""
        if saved:
            for path, model, _, cfg, _ in saved:
                yield {"checkpoint": path, "method": cfg.method, "n_bits": cfg.n_bits, "seed": cfg.seed}, model
            return
        for method in args.methods.split(","):
            for n_bits in args.bits or [16, 32]:
                for seed in (int(s) for s in args.seeds.split(",")):
                    cfg = hash_config(method, n_bits=n_bits, seed=seed, device="cpu")
                    yield {"method": method, "n_bits": n_bits, "seed": seed}, fit_hashing(data, cfg, progress=False)[0]

    rows: List[Dict] = []
    for label, model in runs():
        query, retrieval = (encode_split(model, split, "unimodal", "cpu") for split in (data.query, data.retrieval))
        rows.append({**label, **caption_set_ties(query, retrieval, data.query.ids, data.retrieval.ids)})
        print(json.dumps(rows[-1]), flush=True)
    print("\nmean over seeds (each checkpoint alone), `unimodal`, R@1 I→T / T→I in %: by index | tie-aware | "
          "ties won | alone; other items as near")
    for key in dict.fromkeys((r.get("checkpoint"), r["method"], r["n_bits"]) for r in rows):
        mine = [r for r in rows if (r.get("checkpoint"), r["method"], r["n_bits"]) == key]
        name = f"{key[1]:>10} {key[2]:>3} bits" if key[0] is None else key[0]
        for db in DATABASES:
            m = {d: {k: np.mean([r[db][d][k] for r in mine]) for k in mine[0][db][d]} for d in ("i2t", "t2i")}
            print(f"{name} {db:>10}: {m['i2t']['r1']:.1f} / {m['t2i']['r1']:.1f} | "
                  f"{m['i2t']['r1_expected']:.1f} / {m['t2i']['r1_expected']:.1f} | "
                  f"{m['i2t']['r1_ties_won']:.1f} / {m['t2i']['r1_ties_won']:.1f} | "
                  f"{m['i2t']['r1_alone']:.1f} / {m['t2i']['r1_alone']:.1f}; "
                  f"{m['i2t']['as_near']:.1f} / {m['t2i']['as_near']:.1f}")


if __name__ == "__main__":
    main()
