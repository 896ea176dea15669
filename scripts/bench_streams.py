#!/usr/bin/env python3
"""Do several training runs in one process, each on a CUDA stream of its own, share one GPU better than
runs one after another? (An experiment, not a test.)

Issue 48's goal 4 asks for the whole Flickr8k comparison (every method × 4 lengths × 3 seeds) on one GPU in
under 30 minutes. A captured step is bound by its kernels, each small (a batch of 128 or 32 items keeps a few of
the GPU's 132 multiprocessors busy), and processes sharing one GPU take turns on it (time-slicing: the
six-cell grid of ``grid --jobs 6`` ran 1.4× ``--jobs 1``, 2026-11-30), so ``--jobs`` overlaps only what cells
do off the GPU. Kernels of one process on several streams may run at once. This times ``--runs`` fits of one
stage (:mod:`bench_dispatch`'s: synthetic 512-d features, each method's own batch, validation off, steps
captured) one after another, then all at once in processes of their own (as ``grid --jobs`` runs its cells
today: the wall from the moment all are ready), then all at once in threads of this process, each with a stream
of its own, and prints the three walls and the ratios; set-up, warm-up and capture included, as a grid's cells
have them (``ucmfh grid --jobs N --workers threads`` runs a grid's cells so). The threads' captures refuse the
capturing thread's unsafe CUDA calls alone (``thread_local``, as every capture inside ``separate_draws`` does:
``global``, a lone run's, would refuse another thread's allocation during a capture); the captures
and replays in turn and in threads are counted and printed, and a fit that ran eagerly says why, so that an
eager figure never passes for a captured one.

The runs side by side are inside :func:`ucmfh.run_draws.separate_draws`: each run's dropout comes from a
generator state of its own (a graph-safe one on a GPU), so each should train the model it trains alone. Every
fit here has the same data and seed, so every model should be the same: the script says whether the fits in
turn gave one model, and whether those side by side gave that model too (a GPU's kernels that add with atomics
may make the first no already).

    python scripts/bench_streams.py --device cuda --runs 4 --only two-tower --only jdsh --only fusion
    python scripts/bench_streams.py --device cpu --runs 2 --steps 4 --epochs 2   # threads alone, no streams
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_dispatch, bench_steps, model_fingerprints
from bench_dispatch import Stage, stages  # noqa: E402
from bench_steps import COUNTS, EAGER, counted, heard  # noqa: E402
from model_fingerprints import weights_digest  # noqa: E402

import ucmfh.captured_step as captured_step  # noqa: E402
from ucmfh.captured_step import capture_steps  # noqa: E402
from ucmfh.methods import METHODS  # noqa: E402
from ucmfh.side_by_side import side_by_side as fits_side_by_side  # noqa: E402

Fit = Callable[[], object]


# each capture and replay counted in bench_steps.COUNTS (every thread's); the fits side by side, inside
# separate_draws, capture in thread_local mode (ucmfh.captured_step.CudaGraphs)
SideBySideGraphs = counted(captured_step.CudaGraphs)


def fingerprint(result: object) -> str:
    """A fit's model (the first of what it returns) as one hash of its weights (``model_fingerprints``')."""
    return weights_digest(result[0] if isinstance(result, tuple) else result).hexdigest()[:16]


def one_after_another(fits: List[Fit]) -> Tuple[float, List[str]]:
    """Seconds to run ``fits`` in turn, in this thread, and their models' fingerprints."""
    start, models = time.perf_counter(), []
    for fit in fits:
        models.append(fit())
    return time.perf_counter() - start, [fingerprint(model) for model in models]


def side_by_side(fits: List[Fit], device: str) -> Tuple[float, List[str]]:
    """Seconds to run ``fits`` at once, as :func:`ucmfh.side_by_side.side_by_side` runs a run's candidates (each
    in a thread of its own on a stream of its own, in a copy of this thread's context, each with its draws to
    itself), to the end of the GPU's work, and their models' fingerprints; a fit's error is raised here, after
    every thread has ended."""
    start = time.perf_counter()
    models = fits_side_by_side(fits, torch.device(device))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, [fingerprint(model) for model in models]


def _fit_in_a_process(name: str, settings: Dict[str, object], device: str, n: int, epochs: int, threads: int,
                      ready: Any, results: Any) -> None:
    """A worker of :func:`in_processes`: its stage's fit made, one untimed fit of one epoch (the process's first
    costs), then, once every worker is ready, the fit; its end (``time.monotonic``, one clock for every process
    of the machine) and model's fingerprint put on ``results`` (or its error)."""
    try:
        torch.set_num_threads(threads)
        with tempfile.TemporaryDirectory() as scratch, capture_steps(device == "cuda"):
            [stage] = stages(argparse.Namespace(**settings, only=[name]), device, Path(scratch), own_batch=True)
            stage.prepare(n, 1)()
            fit = stage.prepare(n, epochs)
            ready.wait()
            model = fit()
            results.put((time.monotonic(), fingerprint(model), None))
    except BaseException as err:  # noqa: BLE001 - said by the parent
        results.put((0.0, "", f"{type(err).__name__}: {err}"))
        ready.abort()


def in_processes(name: str, settings: Dict[str, object], device: str, runs: int, n: int,
                 epochs: int) -> Tuple[float, List[str]]:
    """Seconds for ``runs`` fits of stage ``name`` at once, each in a process of its own (``spawn``, as ``grid
    --jobs`` starts its workers, the threads split between them), from the moment all are ready to the last
    one's end, and their models' fingerprints; a fit's error is raised here."""
    context = multiprocessing.get_context("spawn")
    ready, results = context.Barrier(runs + 1), context.Queue()
    threads = max(1, torch.get_num_threads() // runs)
    workers = [context.Process(target=_fit_in_a_process, args=(name, settings, device, n, epochs, threads, ready,
                                                                 results)) for _ in range(runs)]
    for worker in workers:
        worker.start()
    try:
        ready.wait(timeout=600)
        start = time.monotonic()
        ends = [results.get(timeout=1800) for _ in range(runs)]
    except threading.BrokenBarrierError:
        ends = [results.get(timeout=60)]
    finally:
        for worker in workers:
            worker.join(timeout=60)
    errors = [error for _, _, error in ends if error]
    if errors:
        raise RuntimeError(f"a fit in a process of its own failed: {errors[0]}")
    return max(end for end, _, _ in ends) - start, [print_ for _, print_, _ in ends]


def measure(stage: Stage, runs: int, steps: int, epochs: int, device: str,
            settings: Dict[str, object]) -> Dict[str, object]:
    """The walls of ``runs`` fits of ``stage`` (``steps`` full batches an epoch, ``epochs`` epochs) one after
    another, in processes of their own and in threads of this one, each fit's data and settings made before the
    clock starts, after a fit of one epoch that pays the process's first costs."""
    n = steps * stage.batch_size
    stage.prepare(n, 1)()  # untimed: the process's one-time costs (CUDA's context, cuBLAS, kernels loaded)
    row: Dict[str, object] = {"runs": runs, "batch_size": stage.batch_size, "steps": runs * steps * epochs}
    for name, run in (("one_after_another", one_after_another), ("side_by_side", lambda fits: side_by_side(
            fits, device))):
        COUNTS.update(captures=0, replays=0)
        EAGER.clear()
        row[f"{name}_s"], row[f"{name}_models"] = run([stage.prepare(n, epochs) for _ in range(runs)])
        row.update({f"{name}_{key}": value for key, value in COUNTS.items()}, **{f"{name}_eager_because": list(EAGER)})
    row["processes_s"], row["processes_models"] = in_processes(stage.name, settings, device, runs, n, epochs)
    serial, parallel = row["one_after_another_models"], row["side_by_side_models"]
    row["same_models_in_turn"] = len(set(serial)) == 1
    row["same_models_side_by_side"] = row["same_models_in_turn"] and set(parallel) == set(serial)
    row["same_models_processes"] = row["same_models_in_turn"] and set(row["processes_models"]) == set(serial)
    return row


def line(name: str, row: Dict[str, object]) -> str:
    """A stage's figures: the three walls, the ratio of the fits in turn to each way at once, the captures and
    replays in turn and in threads (a fit that ran eagerly said on the lines below, with why), and whether the
    models were one."""
    ratio = row["one_after_another_s"] / row["side_by_side_s"]
    by_processes = row["one_after_another_s"] / row["processes_s"]
    counts = "".join(f" {str(row.get(f'{way}_captures', '-')) + '/' + str(row.get(f'{way}_replays', '-')):>12}"
                     for way in ("one_after_another", "side_by_side"))
    eager = "".join(f"\n  {way.replace('_', ' ')}: {message}" for way in ("one_after_another", "side_by_side")
                    for message in row.get(f"{way}_eager_because", []))
    same = "".join(f" {'yes' if row.get(key) else 'no':>5}" for key in (
        "same_models_in_turn", "same_models_processes", "same_models_side_by_side"))
    return (f"{name:<10} {row['batch_size']:>5} {row['runs']:>4} {row['steps']:>6} {row['one_after_another_s']:>10.2f} "
            f"{row['processes_s']:>10.2f} {row['side_by_side_s']:>10.2f} {by_processes:>7.2f}x {ratio:>7.2f}x"
            f"{counts}{same}{eager}")


# the captures and replays of all the fits, in turn and side by side (a fit that ran eagerly has none)
HEADER = (f"{'stage':<10} {'batch':>5} {'runs':>4} {'steps':>6} {'serial s':>10} {'procs s':>10} {'threads s':>10}"
          f" {'procs':>8} {'threads':>8} {'serial c/r':>12} {'threads c/r':>12} {'same':>5} {'same':>5} {'same':>5}")
# procs, threads: the wall of the fits in turn over that of the fits at once in processes, in threads; same:
# whether the fits in turn gave one model, whether those in processes gave it too, and those in threads


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--runs", type=int, default=4, help="Fits of each stage, one after another, then at once.")
    p.add_argument("--steps", type=int, default=100, help="Full batches an epoch.")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--n-bits", type=int, default=64)
    p.add_argument("--width", type=int, default=512, help="Feature width of the synthetic set (CLIP's: 512).")
    p.add_argument("--only", action="append", help="Only these stages, in this order (repeatable): fusion or a "
                   "method trained by epochs [default: two-tower].")
    p.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = p.parse_args(argv)
    for flag, value in (("--runs", args.runs), ("--steps", args.steps), ("--epochs", args.epochs)):
        if value < 1:
            p.error(f"{flag} must be at least 1, got {value}")
    known = ["fusion"] + [m for m in METHODS if not METHODS[m].closed_form]
    only = args.only or ["two-tower"]
    for name in only:
        if name not in known:
            p.error(f"--only {name!r}: not a stage trained by epochs; one of {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no GPU")
    dispatch_args = argparse.Namespace(batch_size=128, n_bits=args.n_bits, width=args.width, only=only)
    rows: Dict[str, Dict[str, object]] = {}
    graphs, captured_step.CudaGraphs = captured_step.CudaGraphs, SideBySideGraphs  # every fit's, restored after
    try:
        with tempfile.TemporaryDirectory() as scratch, capture_steps(args.device == "cuda", on_eager=heard):
            chosen = stages(dispatch_args, args.device, Path(scratch), own_batch=True)
            for stage in sorted(chosen, key=lambda s: only.index(s.name)):
                rows[stage.name] = measure(stage, args.runs, args.steps, args.epochs, args.device,
                                           {"batch_size": 128, "n_bits": args.n_bits, "width": args.width})
                if not args.json:
                    print(*([HEADER] if len(rows) == 1 else []), line(stage.name, rows[stage.name]), sep="\n",
                          flush=True)
    finally:
        captured_step.CudaGraphs = graphs
    if args.json:
        name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
        print(json.dumps({"device": name, "torch": torch.__version__, "stages": rows}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
