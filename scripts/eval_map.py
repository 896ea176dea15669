"""Evaluate a saved codes file: all metrics, both directions, to JSON (and PNG curves with --plot).

Example::

    python scripts/eval_map.py runs/nus64/codes.h5 --out runs/nus64/metrics.json --plot runs/nus64/curves
"""
from __future__ import annotations

import argparse
import json
import sys

from ucmfh.files import write_text_atomic
from ucmfh.metrics import evaluate_codes_file


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Evaluate a codes file written by ucmfh.codes.save_codes.")
    p.add_argument("codes", help="HDF5 codes file")
    p.add_argument("--k", type=int, default=50, help="K of MAP@K (default 50)")
    p.add_argument("--out", help="JSON output (default: print to stdout)")
    p.add_argument("--plot", metavar="PREFIX", help="write PREFIX_pr.png and PREFIX_pk.png (needs matplotlib)")
    p.add_argument("--no-map-all", action="store_true", help="skip MAP@all (the slowest metric)")
    p.add_argument("--empty", choices=("zero", "skip"), default="zero",
                   help="queries with no relevant item: score 0 (default) or leave out")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    p.add_argument("--chunk-size", type=int, default=1024, help="queries per chunk (memory)")
    args = p.parse_args(argv)

    results = evaluate_codes_file(
        args.codes, k=args.k, device=args.device, map_all=not args.no_map_all,
        empty=args.empty, chunk_size=args.chunk_size,
    )
    text = json.dumps(results, indent=1)
    if args.out:
        write_text_atomic(args.out, text + "\n")
    else:
        print(text)
    for name in ("i2t", "t2i"):
        print(f"{name}: MAP@{args.k} = {results[name][f'map@{args.k}']:.4f}", file=sys.stderr)
    if args.plot:
        from ucmfh.metrics.plots import plot_curves

        for path in plot_curves(results, args.plot):
            print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
