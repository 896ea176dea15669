#!/usr/bin/env python3
"""``ucmfh grid --jobs N`` against ``--jobs 1``, measured (not a test); figures in docs/benchmarks.md.

Runs the same grid once per ``--jobs`` value (worker processes), then once per ``--threads`` value (``--jobs N
--workers threads``: the cells in threads of one process, each on a CUDA stream of its own), each in a fresh
folder (nothing reused), and prints the wall seconds of each and whether its result rows equal those of the
first run (every field but the clock and the paths under its folder).
Everything after ``--`` is passed to ``ucmfh grid``::

    python scripts/bench_grid_jobs.py --jobs 1 --jobs 2 --threads 2 -- -d wiki --data-dir ../shared/data \\
        --methods two-tower,ucmfh -b 16 -b 32 --epochs 5 --device cpu
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from ucmfh.app.experiment import VARYING  # noqa: E402  (a row's fields that differ between two runs of one setting)


def run_grid(grid_args: List[str], jobs: int, workers: str, folder: str) -> Dict[str, Any]:
    """One grid at ``--jobs jobs --workers workers`` in ``folder``: its wall seconds, its number of cells, its rows."""
    results = os.path.join(folder, "results.jsonl")
    cmd = [sys.executable, "-m", "ucmfh", "grid", *grid_args, "--jobs", str(jobs), "--workers", workers, "--quiet",
           "--out", os.path.join(folder, "runs"), "--results", results, "--table", os.path.join(folder, "table")]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    with open(results) as f:
        rows = [json.loads(line) for line in f]
    return {"wall": wall, "n_cells": len({row["run"] for row in rows}),
            "rows": [{k: v for k, v in row.items() if k not in VARYING} for row in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, action="append", default=[], help="a --jobs value (repeatable)")
    parser.add_argument("--threads", type=int, action="append", default=[],
                        help="a --jobs value run with --workers threads (repeatable; after the --jobs values)")
    parser.add_argument("grid", nargs=argparse.REMAINDER, help="-- then the arguments of ucmfh grid")
    args = parser.parse_args()
    grid_args = args.grid[1:] if args.grid[:1] == ["--"] else args.grid
    if not args.jobs + args.threads:
        parser.error("give a --jobs or --threads value")
    if any(jobs < 2 for jobs in args.threads):  # ucmfh grid refuses threads for cells one after another
        parser.error(f"--threads {min(args.threads)}: threads run 2 cells or more at once")
    print(f"ucmfh grid {' '.join(grid_args)}; {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| --jobs | workers | wall s | cells | rows equal to the first |")
    print("|---|---|---|---|---|")
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for jobs, workers in [(j, "processes") for j in args.jobs] + [(j, "threads") for j in args.threads]:
            run = run_grid(grid_args, jobs, workers, os.path.join(tmp, f"jobs{jobs}-{workers}"))
            first = first or run
            print(f"| {jobs} | {workers} | {run['wall']:.1f} | {run['n_cells']} | "
                  f"{'yes' if run['rows'] == first['rows'] else 'NO'} |", flush=True)
    print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
