#!/usr/bin/env python3
"""Other query draws of the same items: how much of a comparison is the query draw (not a test).

A dataset file whose training split is its retrieval split (the shared sets: mirflickr730, wiki,
flickr8k1000) is pooled (query ∪ retrieval) and split again with seeded draws of the same number
of query units (distinct ids: the captions of one image stay together); the training split is the
new retrieval split. Pooled features, labels and ids are written; tokens are not.

    python scripts/query_draws.py ../shared/data/flickr8k1000.h5 --draws 5 --out /tmp/draws
    ucmfh grid -d /tmp/draws/flickr8k1000-draw1.h5 ... --methods two-tower,cca-itq -b 16
"""
from __future__ import annotations

import argparse
import os

import h5py
import numpy as np

from ucmfh.data.writer import write_dataset
from ucmfh.data.splits import SplitSizes, sample_split
from ucmfh.files import read_attrs


def pooled(path: str) -> dict:
    with h5py.File(path, "r") as f:
        if f["train/image"].shape != f["retrieval/image"].shape:
            raise SystemExit(f"{path}: its training split is not its retrieval split; not supported")
        names = [n for n in ("image", "text", "labels", "ids") if n in f["query"]]
        arrays = {n: np.concatenate([f[s][n][()] for s in ("query", "retrieval")]) for n in names}
        n_query_units = len(np.unique(f["query/ids"][()])) if "ids" in f["query"] else f["query/image"].shape[0]
        return {"arrays": arrays, "n_query": n_query_units, "attrs": read_attrs(f)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source")
    p.add_argument("--draws", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    src = pooled(a.source)
    arrays, ids = src["arrays"], src["arrays"].get("ids")
    n_units = len(np.unique(ids)) if ids is not None else len(arrays["image"])
    name = os.path.splitext(os.path.basename(a.source))[0]
    os.makedirs(a.out, exist_ok=True)
    for seed in range(a.first_seed, a.first_seed + a.draws):
        index = sample_split(len(arrays["image"]), SplitSizes(query=src["n_query"], train=n_units - src["n_query"]),
                             seed, ids=ids)
        rows = index.as_dict()
        splits = {s: {n: v[np.sort(rows[s])] for n, v in arrays.items()} for s in ("query", "retrieval", "train")}
        attrs = {k: v for k, v in src["attrs"].items() if k not in ("image_tokens", "text_tokens", "tokens_build")}
        attrs.update(name=f"{name}-draw{seed}",
                     split=f"query draw {seed} of {a.source} (query ∪ retrieval pooled; {src['n_query']} query units "
                           f"by scripts/query_draws.py, seed {seed}; train = retrieval)")
        out = write_dataset(os.path.join(a.out, f"{name}-draw{seed}.h5"), splits, attrs=attrs, overwrite=True)
        print(out, {s: len(r) for s, r in rows.items()})


if __name__ == "__main__":
    main()
