#!/usr/bin/env python3
"""Seconds a training step takes, per stage, eager and captured as a CUDA graph (not a test): the fusion stage
and every method trained by epochs, each at its own batch size (DAEH's 18, DJSRH's 32, ...) or at
``--batch-size``, on a MIRFlickr-shaped synthetic set of 512-d features.

Issue 48's comparison of every method on Flickr8k is tens of thousands of such steps a run: on a GPU a
step of small matrix products is its kernel launches, which a captured step (``--cuda-graph``,
:mod:`ucmfh.captured_step`) makes one. The stages are :mod:`bench_dispatch`'s (scripts/), fitted on ``k × batch``
items (``--steps k``), validation off, for :data:`EPOCHS` epochs; a step's time is the last epoch's seconds
as the trainer records them (:class:`ucmfh.training_log.EpochRecord`: to the read of the epoch's loss, which
waits for the device's work) over its ``k`` steps, so the set-up of a fit (the pairwise statistics of DAEH, CIRH
and DGCPN, which grow with the items), its first epoch's warm-up and capture, and a capture again after the
first epoch (UCCH's, after its memory bank's warm-up) drop out. Medians of ``--repeats`` fits. On a CPU the
captured path is the eager one (graphs are CUDA's): only ``eager`` is timed.

    python scripts/bench_steps.py --device cuda                    # every stage, eager and captured
    python scripts/bench_steps.py --device cuda --only daeh --json
    python scripts/bench_steps.py --device cpu --steps 20          # eager on the CPU
    python scripts/bench_steps.py --device cuda --compile --only fusion --only ucmfh   # an experiment, below
    python scripts/bench_steps.py --device cuda --tf32 --only fusion --only ucmfh      # TF32 matmuls, captured

``--tf32`` also times each stage captured with its float32 matmuls in TF32 on the tensor cores (``--amp tf32``,
:func:`ucmfh.amp.matmul_precision`), against the captured float32 step: what TF32 buys a step whose matmuls
are a part of its kernels' time.

``--compile`` also times each stage with its loss compiled by ``torch.compile`` (inductor's fused kernels) and
its step captured: an experiment that asks what fewer, larger kernels would buy on a GPU, where a captured step
is bound by its kernels. The compile runs in the warm-up, on the batch the capture reads (on 2026-11-30, when
the warm-up read each batch's own tensors, the loss was compiled again inside the capture, which CUDA refused).
ucmfh does not compile; a step of its own (DGCPN's three updates) stays uncompiled. The compile is the first
epoch's work, not timed; its seconds are in the JSON (``compiled_first_epoch``). A compiled path that fails
says why on its stage's row and the next stage goes on.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_dispatch, beside this script
from bench_dispatch import Stage, stages  # noqa: E402
from bench_train import EpochSeconds  # noqa: E402

import ucmfh.captured_step as captured_step  # noqa: E402
from ucmfh.amp import matmul_precision  # noqa: E402
from ucmfh.captured_step import capture_steps  # noqa: E402
from ucmfh.methods import METHODS  # noqa: E402
from ucmfh.trainer import Plan  # noqa: E402
from ucmfh.training_log import logging_to  # noqa: E402

EPOCHS = 3  # a fit's epochs: the last is timed
PATHS = ("eager", "graph")
COUNTS = {"captures": 0, "replays": 0}  # of the stage being timed: a graph path that captured nothing is said
EAGER: List[str] = []  # why a stage asked to be captured ran eagerly (a capture refused, ...)
_COUNTING = threading.Lock()  # fits in threads (bench_streams.py) count into the one COUNTS


def _count(key: str) -> None:
    with _COUNTING:
        COUNTS[key] += 1


def heard(message: str) -> None:
    """:func:`ucmfh.captured_step.capture_steps`'s listener: why a stage ran eagerly, each reason once, in EAGER."""
    if message not in EAGER:
        EAGER.append(message)


def counted(graphs: type) -> type:
    """``graphs`` (ucmfh.captured_step.CudaGraphs, or a test's) with each capture and replay counted in COUNTS."""
    class Counted(graphs):  # type: ignore[valid-type, misc]
        def capture(self, body, before, stream):  # type: ignore[no-untyped-def]
            replay, out, ran = super().capture(body, before, stream)
            _count("captures")

            def replay_counted() -> None:
                _count("replays")
                replay()

            return replay_counted, out, ran

    return Counted


def compiled_for_full_batches(loss):  # type: ignore[no-untyped-def]
    """``loss`` compiled by ``torch.compile`` for the batch size of its first call (a run's first batch is a
    full one), shapes static; a batch of another size (an epoch's short last batch, which runs eagerly) calls
    ``loss`` as it is, rather than compiling it again for that size (dynamic shapes: a second compile)."""
    compiled, size = torch.compile(loss, dynamic=False), []

    def step_loss(batch):  # type: ignore[no-untyped-def]
        size[:] = size or [len(batch.index)]
        return compiled(batch) if len(batch.index) == size[0] else loss(batch)

    return step_loss


@contextlib.contextmanager
def compiled_losses():  # type: ignore[no-untyped-def]
    """Every plan made inside the block has its loss compiled by ``torch.compile`` (``--compile``,
    ``scripts/compiled_main.py``) for its full batches (:func:`compiled_for_full_batches`), its random
    draws (dropout) by torch's own kernels from the device's generator, as an eager step's, which a CUDA graph
    captures (inductor's ``fallback_random``; its own seeds are drawn by a call that a failed capture on the H200
    left unusable)."""
    import torch._inductor.config as inductor

    random, inductor.fallback_random = inductor.fallback_random, True
    made = Plan.__post_init__

    def post_init(plan: Plan) -> None:
        made(plan)
        if plan.loss is not None:
            plan.loss = compiled_for_full_batches(plan.loss)

    Plan.__post_init__ = post_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        Plan.__post_init__ = made  # type: ignore[method-assign]
        inductor.fallback_random = random


def seconds_a_step(stage: Stage, captured: bool, steps: int, repeats: int) -> Tuple[float, float]:
    """One step's seconds: the last of :data:`EPOCHS` epochs of ``steps`` full batches over its steps (module
    docstring), median of ``repeats`` fits, each with its data and settings made first; and the first fit's first
    epoch's seconds (its warm-up, its capture, a compile)."""
    figures, first = [], None
    for _ in range(repeats):
        fit, epochs = stage.prepare(steps * stage.batch_size, EPOCHS), EpochSeconds()
        with logging_to(epochs), capture_steps(captured, on_eager=heard):
            fit()
        figures.append(epochs.seconds[-1] / steps)
        first = epochs.seconds[0] if first is None else first
    return statistics.median(figures), first


HEADER = f"{'stage':<10} {'batch':>5} {'eager ms':>9} {'graph ms':>9} {'speed-up':>8} {'captures':>8} {'replays':>8}"
COMPILED = f" {'compiled ms':>11} {'speed-up':>8}"  # --compile's columns
TF32 = f" {'tf32 ms':>8} {'vs graph':>8}"  # --tf32's columns


def line(name: str, row: Dict[str, object]) -> str:
    """One stage's figures: milliseconds a step, eager and captured, and their ratio; the graph path's captures
    and replays (every fit timed), and why it ran eagerly where it did."""
    graph = row.get("graph")
    ratio = f"{row['eager'] / graph:.1f}x" if graph else "-"
    captured = "-" if graph is None else f"{1e3 * graph:.2f}"
    counts = f"{row['captures']:>8} {row['replays']:>8}" if graph is not None else f"{'-':>8} {'-':>8}"
    eager = "".join(f"\n  {message}" for message in row.get("eager_because", []))
    eager += "".join(f"\n  compiled: {message}" for message in row.get("compiled_eager_because", []))
    eager += f"\n  compiled: failed ({row['compiled_error']})" if "compiled_error" in row else ""
    compiled = ""
    if row.get("compiled"):
        speed_up = f"{row['eager'] / row['compiled']:.1f}x"
        compiled = f" {1e3 * row['compiled']:>11.2f} {speed_up:>8} (first epoch {row['compiled_first_epoch']:.1f} s)"
    tf32 = ""
    if row.get("tf32"):
        versus = f"{graph / row['tf32']:.2f}x" if graph else "-"
        tf32 = f" {1e3 * row['tf32']:>8.2f} {versus:>8}"
    return (f"{name:<10} {row['batch_size']:>5} {1e3 * row['eager']:>9.2f} {captured:>9} {ratio:>8} {counts}"
            f"{compiled}{tf32}{eager}")


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
    p.add_argument("--tf32", action="store_true", help="Also time each stage captured with TF32 matmuls "
                   "(--amp tf32; CUDA only).")
    p.add_argument("--compile", action="store_true", help="Also time each stage's loss compiled by torch.compile, "
                   "its step captured (an experiment; CUDA only).")
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
    if args.compile and args.device != "cuda":
        p.error("--compile: an experiment for a GPU's kernels; give --device cuda")
    if args.tf32 and args.device != "cuda":
        p.error("--tf32: a GPU's matmul format; give --device cuda")
    dispatch_args = argparse.Namespace(batch_size=args.batch_size or 128, n_bits=args.n_bits, width=args.width,
                                       only=args.only or [m for m in known])
    paths = (PATHS + ("compiled",) * args.compile + ("tf32",) * args.tf32) if args.device == "cuda" else PATHS[:1]
    rows: Dict[str, Dict[str, object]] = {}
    stopped: Optional[KeyboardInterrupt] = None
    graphs = captured_step.CudaGraphs
    captured_step.CudaGraphs = counted(graphs)  # every CapturedStep of the run counts, restored after it
    with tempfile.TemporaryDirectory() as scratch:
        chosen = stages(dispatch_args, args.device, Path(scratch), own_batch=not args.batch_size)
        try:
            for stage in sorted(chosen, key=lambda s: dispatch_args.only.index(s.name)):
                row: Dict[str, object] = {"batch_size": stage.batch_size}
                for path in paths:
                    COUNTS.update(captures=0, replays=0)
                    EAGER.clear()
                    if path == "compiled":  # an experiment: its failure is said, the next stage goes on
                        try:
                            with compiled_losses():
                                row[path], row[f"{path}_first_epoch"] = seconds_a_step(stage, True, args.steps,
                                                                                       args.repeats)
                        except Exception as err:  # noqa: BLE001
                            first = (str(err).strip().splitlines() or [""])[0]
                            row["compiled_error"] = f"{type(err).__name__}: {first}"
                    else:  # tf32: the captured step, its matmuls in TF32 (as --amp tf32 sets for a run)
                        with matmul_precision("tf32" if path == "tf32" else "none"):
                            row[path], row[f"{path}_first_epoch"] = seconds_a_step(stage, path != "eager", args.steps,
                                                                                   args.repeats)
                    if path == "graph":
                        row.update(COUNTS, eager_because=list(EAGER))
                    elif path == "compiled":  # its own captures, and why it ran eagerly, apart from the graph's
                        row.update({f"compiled_{key}": value for key, value in COUNTS.items()},
                                   compiled_eager_because=list(EAGER))
                rows[stage.name] = row
                if not args.json:
                    header = HEADER + COMPILED * args.compile + TF32 * args.tf32
                    print(*([header] if len(rows) == 1 else []), line(stage.name, row), sep="\n", flush=True)
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
