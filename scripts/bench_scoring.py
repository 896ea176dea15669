"""Time a results row's scoring: every figure of a trained model's row on a dataset file, both tie rules.

What ``ucmfh train-hash`` and ``ucmfh evaluate`` spend after encoding, per protocol: ``score_splits`` of the
query and retrieval splits, by Hamming distance of the codes and by cosine of the head outputs, with their
tie-aware twins (``expected=True``): MAP@k by label, or for a caption set both databases' R@1/5/10, rSum and
MAP@k by id. The head outputs are a fixed random projection of the file's features to ``--dim`` dimensions
(seed 0: the same every run), the codes their signs, so the rankings' ties are those of real data's structure,
not of noise. Example (full Flickr8k, ../shared/data)::

    python scripts/bench_scoring.py ../shared/data/flickr8k.h5 --threads 2 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, List, Tuple

import torch

from ucmfh.data.h5 import Split, load_dataset
from ucmfh.evaluation import score_splits
from ucmfh.similarity import sign_codes

RANKINGS = ("hamming", "cosine")


def head_outputs(split: Split, projections: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Image and text outputs of a split: its features through the fixed projections. Shape: -> two [N, dim]."""
    return split.img.float() @ projections[0], split.txt.float() @ projections[1]


def main(argv=None) -> List[Dict[str, object]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="a dataset file (ucmfh HDF5 format)")
    p.add_argument("--dim", type=int, default=64, help="head outputs' dimensions, the codes' bits (default 64)")
    p.add_argument("--k", type=int, default=50, help="MAP@k's k (default 50)")
    p.add_argument("--repeats", type=int, default=1, help="times each ranking is scored (default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--only", choices=RANKINGS, action="append", help="this ranking only (repeatable)")
    p.add_argument("--json", help="also write the timings and the figures as JSON here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_dataset(args.data)
    g = torch.Generator().manual_seed(0)
    projections = (torch.randn(data.query.img.shape[1], args.dim, generator=g),
                   torch.randn(data.query.txt.shape[1], args.dim, generator=g))
    query, retrieval = head_outputs(data.query, projections), head_outputs(data.retrieval, projections)
    print(f"{args.data}: {len(data.query)} queries, {len(data.retrieval)} retrieval items, "
          f"{'a caption set' if data.caption_set else 'labelled'}; {args.dim}-d outputs, k {args.k}, "
          f"threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for ranking in args.only or RANKINGS:
        q, r = (query, retrieval) if ranking == "cosine" else \
            (tuple(map(sign_codes, query)), tuple(map(sign_codes, retrieval)))
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            rows = score_splits(q, r, data, k=args.k, ranking=ranking, expected=True)
            seconds.append(time.perf_counter() - start)
        results.append({"ranking": ranking, "seconds": seconds, "rows": rows})
        print(f"{ranking:<8} {min(seconds):8.2f} s (best of {args.repeats}; "
              f"{', '.join(f'{s:.2f}' for s in seconds)})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"data": args.data, "dim": args.dim, "k": args.k, "threads": torch.get_num_threads(),
                       "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
