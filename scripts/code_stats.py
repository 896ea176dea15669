#!/usr/bin/env python3
"""What a saved model's codes look like on one split: how balanced and correlated the bits are, how many
items share a code, and how often a pair's image and text codes agree (an analysis, not a test).

For each checkpoint and modality (`unimodal`: image codes from images alone, text codes from texts
alone), over the split's items (a caption set's images once per id):

* ``items``: the items counted; ``distinct``: their distinct codes; ``largest``: the most items
  sharing one code (a query at that code meets them all at distance 0, tied);
* ``ones_min`` / ``ones_max``: the least and most balanced bit, as the share of items with bit +1;
* ``mean_abs_corr``: the mean |Pearson correlation| of two different bits over the items;
* ``pair_agreement`` (per checkpoint): the share of bits on which a pair's image and text codes agree,
  over every row of the split.

    python scripts/code_stats.py ../shared/data/flickr8k.h5 runs/flickr8k-*/two-tower-seed2023-*/hash16.pt --split retrieval
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, Optional

import numpy as np
import torch

from ucmfh.bits import pack
from ucmfh.checkpoint import CheckpointError, load_model
from ucmfh.data.format import DataError, first_of_each_id
from ucmfh.data.h5 import load_dataset
from ucmfh.evaluation import encode_split

SPLITS = ("query", "retrieval", "train")


def modality_stats(codes: np.ndarray) -> Dict[str, float]:
    """The statistics of one modality's codes. Shape: ±1 or real-valued codes [N, n_bits], N >= 1 (sign >= 0
    is a set bit, as everywhere: :func:`ucmfh.bits.pack`)."""
    bits = np.asarray(codes) >= 0
    _, counts = np.unique(pack(codes), axis=0, return_counts=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.corrcoef(bits.T.astype(np.float64)) if len(bits) > 1 else np.full((bits.shape[1],) * 2, np.nan)
    off = corr[~np.eye(bits.shape[1], dtype=bool)]
    off = off[np.isfinite(off)]  # a constant bit has no correlation
    return {"items": int(len(bits)), "distinct": int(len(counts)), "largest": int(counts.max()),
            "ones_min": float(bits.mean(0).min()), "ones_max": float(bits.mean(0).max()),
            "mean_abs_corr": float(np.abs(off).mean()) if len(off) else float("nan")}


def code_stats(codes_img: torch.Tensor, codes_txt: torch.Tensor, ids: Optional[torch.Tensor]) -> Dict[str, object]:
    """:func:`modality_stats` of each modality (images once per id when ``ids`` are given) and the pairs'
    agreement. Shape: ±1 codes [N, n_bits] each, the rows paired; ids [N] or None."""
    img, txt = codes_img.cpu().numpy(), codes_txt.cpu().numpy()
    images = img if ids is None else img[first_of_each_id(ids.cpu().numpy())]
    return {"img": modality_stats(images), "txt": modality_stats(txt),
            "pair_agreement": float(((img >= 0) == (txt >= 0)).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", help="a dataset file in the ucmfh HDF5 format")
    parser.add_argument("checkpoints", nargs="+", help="hashing checkpoints (hashN.pt) trained on its features")
    parser.add_argument("--split", choices=SPLITS, default="retrieval",
                        help="the split whose items are coded (default: retrieval, the training items of the shared sets)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        data = load_dataset(args.dataset)
        models = [(path, load_model(path, "hash", data.d_img, data.d_txt)[0]) for path in args.checkpoints]
    except (DataError, CheckpointError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2)
    split = getattr(data, args.split)
    print(f"{'checkpoint':<40} {'':>4} {'items':>6} {'distinct':>8} {'largest':>7} {'ones min-max':>13} "
          f"{'mean |corr|':>11}", file=sys.stderr)
    for path, model in models:
        row = {"checkpoint": path, "split": args.split,
               **code_stats(*encode_split(model, split, "unimodal", "cpu"), split.ids)}
        print(json.dumps(row), flush=True)
        for modality in ("img", "txt"):
            s = row[modality]
            print(f"{path[-40:]:<40} {modality:>4} {s['items']:>6} {s['distinct']:>8} {s['largest']:>7} "
                  f"{s['ones_min']:>6.2f}-{s['ones_max']:.2f} {s['mean_abs_corr']:>11.3f}", file=sys.stderr)
        print(f"{'':<40} pairs agree on {100 * row['pair_agreement']:.1f}% of the bits", file=sys.stderr)


if __name__ == "__main__":
    main()
