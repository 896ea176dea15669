"""Time every metric of one direction at NUS-WIDE scale (synthetic data of bench_eval.py).

Example::

    python scripts/time_metrics.py --bits 64 --threads 1
    python scripts/time_metrics.py --bits 64 --backend torch   # the torch path on the CPU
"""
from __future__ import annotations

import argparse
import os
import time


import torch

from bench_eval import make_data
from ucmfh.metrics import (
    evaluate_direction,
    map_at_k,
    pr_curve_hamming,
    precision_at_k,
    set_backend,
)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-query", type=int, default=2100)
    p.add_argument("--n-retrieval", type=int, default=190_000)
    p.add_argument("--n-classes", type=int, default=21)
    p.add_argument("--bits", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=("auto", "native", "torch"), default="auto",
                   help="what computes Hamming metrics on the CPU (ucmfh.metrics.set_backend)")
    args = p.parse_args(argv)
    set_backend(args.backend)
    if args.threads:
        torch.set_num_threads(args.threads)
    qB, rB, qL, rL = make_data(args.n_query, args.n_retrieval, args.bits, args.n_classes)
    dev = torch.device(args.device)
    q, r = torch.from_numpy(qB).float().to(dev), torch.from_numpy(rB).float().to(dev)
    ql, rl = torch.from_numpy(qL).to(dev), torch.from_numpy(rL).to(dev)
    jobs = [
        ("MAP@50", lambda: map_at_k(q, r, ql, rl, k=50)),
        ("MAP@all", lambda: map_at_k(q, r, ql, rl, k=None)),
        ("PR curve by radius", lambda: pr_curve_hamming(q, r, ql, rl)),
        ("P@K curve, K up to 1000", lambda: precision_at_k(q, r, ql, rl)),
        ("evaluate_direction (all of one direction)", lambda: evaluate_direction(q, r, ql, rl)),
    ]
    print(f"{args.n_query} x {args.n_retrieval}, {args.bits} bits, backend {args.backend}, "
          f"threads {torch.get_num_threads()}, load {os.getloadavg()}")
    for name, job in jobs:
        start = time.perf_counter()
        job()
        print(f"{name:<45} {time.perf_counter() - start:8.2f} s", flush=True)


if __name__ == "__main__":
    main()
