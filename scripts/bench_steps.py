#!/usr/bin/env python3
"""Seconds a training step takes, per stage, eager and captured as a CUDA graph (not a test): the fusion stage
and every method trained by epochs, each at its own batch size (DAEH's 18, DJSRH's 32, ...) or at
``--batch-size``, on a MIRFlickr-shaped synthetic set of 512-d features.

Issue 48's comparison of every method on Flickr8k is tens of thousands of such steps a run: on a GPU a
step of small matrix products is its kernel launches, which a captured step (``--cuda-graph``,
:mod:`ucmfh.captured_step`) makes one. The stages are :mod:`bench_dispatch`'s (scripts/), timed from
outside the training code as it counts them: each is fitted on ``k × batch`` items (``--steps k``),
validation off, for one epoch and for two; the difference of the two wall times over ``k`` is one step of
the second epoch (and a ``k``-th of the epoch's own work: its plan, its read of the loss, a capture again
where the learning rate or UCCH's momentum changes by epoch), without the set-up both share (the pairwise
statistics of DAEH, CIRH and DGCPN grow with the items). Medians of ``--repeats``, after one untimed fit (kernels, cuBLAS's workspaces). On a
CPU the captured path is the eager one (graphs are CUDA's): only ``eager`` is timed.

    python scripts/bench_steps.py --device cuda                    # every stage, eager and captured
    python scripts/bench_steps.py --device cuda --only daeh --json
    python scripts/bench_steps.py --device cpu --steps 20          # eager on the CPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_dispatch, beside this script
from bench_dispatch import Stage, stages  # noqa: E402

import ucmfh.captured_step as captured_step  # noqa: E402
from ucmfh.captured_step import capture_steps  # noqa: E402
from ucmfh.methods import METHODS  # noqa: E402

PATHS = ("eager", "graph")
COUNTS = {"captures": 0, "replays": 0}  # of the stage being timed: a graph path that captured nothing is said
EAGER: List[str] = []  # why a stage asked to be captured ran eagerly (a capture refused, ...)


def counted(graphs: type) -> type:
    """``graphs`` (ucmfh.captured_step.CudaGraphs, or a test's) with each capture and replay counted in COUNTS."""
    class Counted(graphs):  # type: ignore[valid-type, misc]
        def capture(self, body, before, stream):  # type: ignore[no-untyped-def]
            replay, out, ran = super().capture(body, before, stream)
            COUNTS["captures"] += 1

            def replay_counted() -> None:
                COUNTS["replays"] += 1
                replay()

            return replay_counted, out, ran

    return Counted


def wall(stage: Stage, steps: int, epochs: int, captured: bool, device: str) -> float:
    """Wall seconds of ``epochs`` epochs of ``steps`` full batches of ``stage``, its data and settings made first."""
    fit = stage.prepare(steps * stage.batch_size, epochs)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with capture_steps(captured, on_eager=lambda message: EAGER.append(message) if message not in EAGER else None):
        fit()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def seconds_a_step(stage: Stage, captured: bool, device: str, steps: int, repeats: int) -> float:
    """One step's wall seconds: two epochs less one, over its steps (module docstring), median of ``repeats``."""
    wall(stage, steps, 1, captured, device)  # untimed: the first fit loads kernels and workspaces
    return statistics.median((wall(stage, steps, 2, captured, device) - wall(stage, steps, 1, captured, device)) / steps
                             for _ in range(repeats))


HEADER = f"{'stage':<10} {'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speed-up':>8} {'captures':>8} {'replays':>8}"


def line(name: str, row: Dict[str, object]) -> str:
    """One stage's figures: milliseconds a step, eager and captured, and their ratio; the graph path's captures
    and replays (every fit timed), and why it ran eagerly where it did."""
    graph = row.get("graph")
    ratio = f"{row['eager'] / graph:.1f}x" if graph else "-"
    captured = "-" if graph is None else f"{1e3 * graph:.2f}"
    counts = f"{row['captures']:>8} {row['replays']:>8}" if graph is not None else f"{'-':>8} {'-':>8}"
    eager = "".join(f"\n  {message}" for message in row.get("eager_because", []))
    return f"{name:<10} {row['batch_size']:>5} {1e3 * row['eager']:>9.2f} {captured:>9} {ratio:>8} {counts}{eager}"


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=0, help="One batch size for every stage (0: each method's "
                   "own; the fusion stage's 128).")
    p.add_argument("--n-bits", type=int, default=64)
    p.add_argument("--width", type=int, default=512, help="Feature width of the synthetic set (CLIP's: 512).")
    p.add_argument("--steps", type=int, default=50, help="Full batches an epoch.")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", action="append", help="Time only these stages, in this order (repeatable): fusion or "
                   "a method.")
    p.add_argument("--json", action="store_true", help="Print the figures as JSON (seconds a step).")
    args = p.parse_args(argv)
    if args.batch_size == 1 or args.batch_size < 0:
        p.error(f"--batch-size must be at least 2 (contrastive losses need negatives), or 0, got {args.batch_size}")
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    known = ["fusion"] + [m for m in METHODS if not METHODS[m].closed_form]
    for name in args.only or ():
        if name not in known:
            p.error(f"--only {name!r}: not a stage trained by epochs; one of {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no GPU")
    dispatch_args = argparse.Namespace(batch_size=args.batch_size or 128, n_bits=args.n_bits, width=args.width,
                                       only=args.only or [m for m in known])
    paths = PATHS if args.device == "cuda" else PATHS[:1]
    rows: Dict[str, Dict[str, object]] = {}
    stopped: Optional[KeyboardInterrupt] = None
    graphs = captured_step.CudaGraphs
    captured_step.CudaGraphs = counted(graphs)  # every CapturedStep of the run counts, restored after it
    with tempfile.TemporaryDirectory() as scratch:
        chosen = stages(dispatch_args, args.device, Path(scratch), own_batch=not args.batch_size)
        try:
            for stage in sorted(chosen, key=lambda s: dispatch_args.only.index(s.name)):
                COUNTS.update(captures=0, replays=0)
                EAGER.clear()
                rows[stage.name] = {"batch_size": stage.batch_size, **{
                    path: seconds_a_step(stage, path == "graph", args.device, args.steps, args.repeats)
                    for path in paths}}
                if "graph" in paths:
                    rows[stage.name].update(COUNTS, eager_because=list(EAGER))
                if not args.json:
                    print(*([HEADER] if len(rows) == 1 else []), line(stage.name, rows[stage.name]), sep="\n",
                          flush=True)
        except KeyboardInterrupt as err:  # Ctrl-C, or the checklist's cap (SIGTERM): the stages timed are kept
            stopped = err
            print(f"stopped while timing {stage.name} ({err}); {len(rows)} stage(s) timed", file=sys.stderr)
        finally:
            captured_step.CudaGraphs = graphs
    if args.json:
        name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
        print(json.dumps({"device": name, "torch": torch.__version__, "steps": args.steps,
                          "stages": rows}, indent=1, sort_keys=True))
    if stopped is not None:
        sys.exit(128 + (getattr(stopped, "signum", None) or 2))  # the shell's code of the signal (SIGINT's: 130)


if __name__ == "__main__":
    main()
