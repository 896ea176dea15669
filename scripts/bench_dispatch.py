#!/usr/bin/env python3
"""The aten operations one training step dispatches, per method (not a test): the fusion stage, every trained
hashing method and SEPS, counted by ``tests/dispatch_counter.py``, by default on the CUDA stand-in
(``tests/cuda_standin.py``), so that the CUDA branches (fused Adam, foreach updates) are the ones counted.

On a GPU nearly every operation is a kernel launch, and at batch 128 a step's time is its launches
(docs/benchmarks.md, "The GPU path"); the count shows them falling without a GPU.

Measured from outside the training code: each stage is fitted on ``k × batch`` items (so every step has
the whole batch) for E and for E + 1 epochs, validation off; the difference is one epoch, ``k`` steps and
the epoch's own work (its plan, its read of the loss). Two sizes of ``k`` part them: per step =
(epoch at k2 − epoch at k1) / (k2 − k1), per epoch = epoch at k1 − k1 × per step. Host syncs (the
stand-in's count) are parted the same way.

    python scripts/bench_dispatch.py                         # every stage, on the stand-in
    python scripts/bench_dispatch.py --only fusion --only ucmfh --json
    python scripts/bench_dispatch.py --device cuda           # the same count on a real GPU
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the stand-in and the counter live beside the tests that use them
from cuda_standin import cuda_standin  # noqa: E402
from cuda_standin import on_cuda, running_on_cuda  # noqa: E402
from dispatch_counter import TALLIES, DispatchCounter  # noqa: E402

from ucmfh.config import FusionConfig, SepsConfig  # noqa: E402
from ucmfh.data.h5 import Dataset, Split  # noqa: E402
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic_arrays  # noqa: E402
from ucmfh.data.writer import write_dataset  # noqa: E402
from ucmfh.fusion_stage import fit_fusion  # noqa: E402
from ucmfh.methods import METHODS, fit_hashing, hash_config  # noqa: E402
from ucmfh.models.fusion import FusionEncoder  # noqa: E402
from ucmfh.seps.fit import fit_seps  # noqa: E402

DEVICES = ("standin", "cpu", "cuda")
# SEPS's tokens: the shapes of mirflickr730_tokens (49 patches of 1280, words of 384)
PATCHES, D_PATCH, D_WORD, WORDS = 49, 1280, 384, (4, 12)

Fit = Callable[[], object]


class Tally:
    """Operations counted, by tally (``device``, ``host``, ``free``: tests/dispatch_counter.py) and name, and
    host syncs (the stand-in's; None elsewhere). Added, subtracted and scaled per operation, signs kept."""

    def __init__(self, ops: Dict[str, Dict[str, float]], syncs: Optional[float]) -> None:
        self.ops, self.syncs = ops, syncs

    def __add__(self, other: "Tally") -> "Tally":
        return self._combine(other, 1)

    def __sub__(self, other: "Tally") -> "Tally":
        return self._combine(other, -1)

    def _combine(self, other: "Tally", sign: int) -> "Tally":
        ops = {}
        for t in TALLIES:
            a, b = self.ops[t], other.ops[t]
            ops[t] = {k: v for k in set(a) | set(b) if (v := a.get(k, 0) + sign * b.get(k, 0))}
        return Tally(ops, None if self.syncs is None else self.syncs + sign * other.syncs)

    def scaled(self, factor: float) -> "Tally":
        return Tally({t: {k: v * factor for k, v in self.ops[t].items()} for t in TALLIES},
                     None if self.syncs is None else self.syncs * factor)

    def total(self, tally: str = "device") -> float:
        return sum(self.ops[tally].values())

    def top(self, k: int = 5) -> List[List]:
        """The ``k`` most frequent device operations, as ``[name, count]``."""
        return [[name, n] for name, n in sorted(self.ops["device"].items(), key=lambda kv: (-kv[1], kv[0]))[:k]]

    def whole(self) -> bool:
        """Whether every count is a whole number (a step's counts are, if every step is alike)."""
        return all(float(v).is_integer() for t in TALLIES for v in self.ops[t].values()) and \
            (self.syncs is None or float(self.syncs).is_integer())

    def zero(self) -> bool:
        return not any(self.ops.values()) and not self.syncs


class Stage(NamedTuple):
    """A trained stage: ``prepare(items, epochs)`` builds its data and settings, outside the count, and returns
    the fit to count; its steps take ``batch_size`` items."""

    name: str
    prepare: Callable[[int, int], Fit]
    batch_size: int


# ---------------------------------------------------------------- the stages


def make_data(n: int, width: int) -> Dataset:
    """A MIRFlickr-shaped synthetic set of ``n`` training items, features ``width`` wide."""
    arrays = make_synthetic_arrays(SyntheticSpec(n_query=10, n_retrieval=n, n_train=n, d_img=width, d_txt=width))

    def split(part: Dict) -> Split:
        return Split(torch.from_numpy(part["image"]), torch.from_numpy(part["text"]),
                     torch.from_numpy(part["labels"]), torch.from_numpy(part["ids"]))

    return Dataset(split(arrays["train"]), split(arrays["query"]), split(arrays["retrieval"]), {"name": "synthetic"})


def token_file(path: Path, n: int, seed: int = 0) -> str:
    """A token set of ``n`` training captions, one an image (random tokens of real shapes); the query split
    is a few more."""
    rng = np.random.default_rng(seed)

    def split(first_id: int, size: int) -> Dict[str, np.ndarray]:
        lengths = rng.integers(WORDS[0], WORDS[1] + 1, size=size)
        img_tok = rng.normal(size=(size, PATCHES, D_PATCH)).astype(np.float16)
        words = rng.normal(size=(int(lengths.sum()), D_WORD)).astype(np.float16)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return {"image": img_tok.mean(axis=1, dtype=np.float32), "ids": np.arange(first_id, first_id + size),
                "text": np.stack([words[a:b].mean(axis=0, dtype=np.float32) for a, b in zip(offsets, offsets[1:])]),
                "image_tokens": img_tok, "text_tokens": words, "text_offsets": offsets}

    train = split(0, n)
    return write_dataset(path, {"train": train, "query": split(n, 4), "retrieval": train}, {"name": "tokens"})


def stages(args: argparse.Namespace, device: str, scratch: Path, own_batch: bool = False) -> List[Stage]:
    """The fusion stage, every hashing method fitted by epochs (not the closed-form ones) and SEPS, at their
    default settings but for the batch (``args.batch_size``, or with ``own_batch`` each method's own), the
    code length, the epochs and validation (off)."""
    bs = args.batch_size

    def fusion(n: int, epochs: int) -> Fit:
        data = make_data(n, args.width)
        cfg = FusionConfig(epochs=epochs, batch_size=bs, val_fraction=0.0, device=device)
        return lambda: fit_fusion(data, cfg, progress=False)

    def batch(method: str) -> int:
        return hash_config(method).batch_size if own_batch else bs

    def hashing(method: str) -> Callable[[int, int], Fit]:
        def prepare(n: int, epochs: int) -> Fit:
            data = make_data(n, args.width)
            cfg = hash_config(method, drop_unused=True, n_bits=args.n_bits, epochs=epochs, batch_size=batch(method),
                              val_fraction=0.0, device=device)
            torch.manual_seed(0)
            encoder = FusionEncoder.from_config(data.d_img, data.d_txt, FusionConfig()) if METHODS[method].uses_fusion else None
            return lambda: fit_hashing(data, cfg, encoder, progress=False)
        return prepare

    def seps(n: int, epochs: int) -> Fit:
        path = scratch / f"tokens-{n}.h5"
        path = str(path) if path.exists() else token_file(path, n)  # E and E + 1 epochs: one file
        cfg = SepsConfig(epochs=epochs, batch_size=bs, val_fraction=0.0, patience=0, device=device)
        return lambda: fit_seps(path, cfg, progress=False)

    out = [Stage("fusion", fusion, bs)]
    out += [Stage(m, hashing(m), batch(m)) for m in METHODS if not METHODS[m].closed_form]
    out.append(Stage("seps", seps, bs))
    return [s for s in out if not args.only or s.name in args.only]


# ---------------------------------------------------------------- measurement


@contextlib.contextmanager
def on_device(device: str) -> Iterator[Optional[Dict[str, int]]]:
    """Inside, ``cuda`` is the stand-in (``standin``; yields its counts) or the device as it is (yields None)."""
    if device != "standin":
        yield None
        return
    with pytest.MonkeyPatch.context() as monkeypatch, cuda_standin(monkeypatch) as stats:
        yield stats


def count(fit: Fit, device: str) -> Tally:
    """The operations and host syncs of ``fit()``."""
    hooks = {"on_device": on_cuda, "running_on_device": lambda kwargs: running_on_cuda()} if device == "standin" else {}
    with on_device(device) as stats, DispatchCounter(**hooks) as counter:
        fit()
    return Tally(counter.tallies(), None if stats is None else stats["syncs"])


def epoch(stage: Stage, steps: int, epochs: int, batch_size: int, device: str) -> Tally:
    """What the (``epochs`` + 1)-th epoch of ``stage`` on ``steps`` full batches dispatches."""
    n = steps * batch_size
    return count(stage.prepare(n, epochs + 1), device) - count(stage.prepare(n, epochs), device)


def per_step(stage: Stage, batch_size: int, device: str, epochs: int = 1,
             steps: Sequence[int] = (2, 4)) -> Dict[str, Tally]:
    """``{"step": …, "epoch": …}``: what one step dispatches, and what an epoch does once besides its steps,
    parted by two epoch lengths (module docstring)."""
    k1, k2 = steps
    short, long = (epoch(stage, k, epochs, batch_size, device) for k in (k1, k2))
    step = (long - short).scaled(1 / (k2 - k1))
    return {"step": step, "epoch": short - step.scaled(k1)}


# ---------------------------------------------------------------- output


def _number(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:g}"


def table(rows: Dict[str, Dict[str, Tally]], head: bool = True) -> str:
    """One line a stage: a step's operations on the device, on the host, views and allocations, host syncs,
    the epoch's own device operations, the top 5 device operations of a step."""
    lines = [f"{'stage':<10} {'device':>6} {'host':>5} {'views':>5} {'syncs':>5} {'epoch':>5}  "
             "top 5 device ops a step"] if head else []
    for name, r in rows.items():
        step, once = r["step"], r["epoch"]
        top = ", ".join(f"{op.removeprefix('aten.')} {_number(n)}" for op, n in step.top())
        odd = "" if step.whole() else "  (not whole: steps differ)"
        lines.append(f"{name:<10} {_number(step.total()):>6} {_number(step.total('host')):>5} "
                     f"{_number(step.total('free')):>5} {_number(step.syncs):>5} {_number(once.total()):>5}  {top}{odd}")
    return "\n".join(lines)


def as_json(rows: Dict[str, Dict[str, Tally]]) -> Dict:
    return {name: {part: {**{t: t_ops for t, t_ops in tally.ops.items()}, "syncs": tally.syncs}
                   for part, tally in r.items()} for name, r in rows.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=DEVICES, default="standin",
                   help="standin: the CPU stand-in for CUDA (CUDA's branches, syncs counted); cpu; cuda: a GPU.")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n-bits", type=int, default=64)
    p.add_argument("--width", type=int, default=512, help="Feature width of the synthetic set (CLIP's: 512).")
    p.add_argument("--epochs", type=int, default=1, help="Epochs before the counted one (E).")
    p.add_argument("--only", action="append", help="Count only these stages (repeatable): fusion, a method, seps.")
    p.add_argument("--json", action="store_true", help="Print the counts as JSON, by operation.")
    args = p.parse_args(argv)
    if args.batch_size < 2:
        p.error(f"--batch-size must be at least 2 (contrastive losses need negatives), got {args.batch_size}")
    if args.epochs < 1:
        p.error(f"--epochs must be at least 1, got {args.epochs}")
    known = ["fusion", "seps"] + [m for m in METHODS if not METHODS[m].closed_form]
    for name in args.only or ():
        if name not in known:
            p.error(f"--only {name!r}: not a trained stage; one of {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this machine has no GPU (--device standin counts CUDA's branches on the CPU)")
    device = "cpu" if args.device == "cpu" else "cuda"
    rows: Dict[str, Dict[str, Tally]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for stage in stages(args, device, Path(scratch)):
            rows[stage.name] = per_step(stage, args.batch_size, args.device, args.epochs)
            if not args.json:
                print(table({stage.name: rows[stage.name]}, head=len(rows) == 1), flush=True)
    if args.json:
        print(json.dumps({"device": args.device, "batch_size": args.batch_size, "torch": torch.__version__,
                          "stages": as_json(rows)}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
