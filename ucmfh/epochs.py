"""The epoch loop every trained stage shares (:func:`run_epochs`), resumable, and its training state.

A run given a :class:`StateFile` saves its whole training state (weights,
optimizer, random-number generators, position, loss history) atomically
every ``interval_s`` seconds at an epoch's end, at once when SIGINT or
SIGTERM arrives, and when it ends; the same call with ``resume=True`` continues
from it and ends with the same weights, codes and MAP as a run that was never
stopped (a finished state returns its result without training). The caller
removes the state (:func:`discard_state`) once it has saved the result.
"""
from __future__ import annotations

import contextlib
import glob
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch import nn
from tqdm.auto import tqdm

from ucmfh.config import identity_dict
from ucmfh.distributed import current_group
from ucmfh.files import atomic_file, temp_destination, torch_file_problem
from ucmfh.selection import History
from ucmfh.step import ReadAhead, Shuffle, epoch_plan


STATE_FORMAT = "ucmfh-training-state"


@dataclass
class StateFile:
    """Where a training run keeps its state, how often, and whether to continue from it.

    ``interval_s``: seconds between periodic saves, each at an epoch's end
    (0: after every epoch). SIGINT and SIGTERM save at once, after the step
    in progress. ``resume``: continue from the state at ``path`` if there is
    one (a missing file starts from the beginning).
    """

    path: str
    interval_s: float = 120.0
    resume: bool = False

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {self.interval_s}")


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal (``signum``; None: one that reached another rank); ``state_path``
    holds its saved state (or None)."""

    def __init__(self, message: str, state_path: Optional[str], signum: Optional[int] = None) -> None:
        super().__init__(message)
        self.state_path = state_path
        self.signum = signum


def read_state(path: str, device: torch.device) -> Dict[str, Any]:
    """A saved training state, checked to be one."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise ValueError(f"{path}: not a readable training state ({torch_file_problem(path, err)})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: not a ucmfh training state")
    return state


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Dict[str, Optional[int]]]:
    """While training (or another long loop that commits its work step by step, as an index build does),
    SIGINT and SIGTERM set ``flag["signal"]`` instead of killing the step in progress; the loop stops at its
    next safe point. (A KeyboardInterrupt could land anywhere, even in a callback that swallows it.)"""
    flag: Dict[str, Optional[int]] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_epochs(
    stage: str,
    cfg: Any,
    modules: Dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    n: int,
    device: torch.device,
    step: Callable[[torch.Tensor, Optional[torch.Tensor], int, int], torch.Tensor],
    state: Optional[StateFile],
    progress: bool,
    postfix: Callable[[int, int], Dict[str, str]] = lambda epoch, iteration: {},
    validate: Optional[Callable[[], float]] = None,
    shuffle: Optional[Shuffle] = None,
    ahead: Optional[Callable[[torch.Tensor], None]] = None,
) -> History:
    """The epoch loop both stages share; returns its :class:`History`.

    ``step(index, separate, epoch, iteration)`` does one optimisation step and
    returns its (detached) loss; ``validate()``, when given, scores the model
    after each epoch, and the best epoch's weights are loaded at the end;
    ``shuffle`` orders each epoch's items (:func:`batches`); ``ahead(index)``, when given, reads what
    the step of batch ``index`` will read from a file (into the cache it reads from) on a worker
    thread, while the step before it runs (:func:`ucmfh.step.split_ahead`; SEPS's token rows).
    Everything that decides what comes next — the modules and optimizer, the
    batch generator's state at the epoch's start, torch's own generators
    (dropout), the position, the running loss, the validation record and the
    best weights so far — is saved and restored, so a resumed run replays the
    rest of the run exactly.

    On several ranks (:mod:`ucmfh.distributed`) every rank runs this loop over the same global
    batches; rank 0 alone validates (its score is shared), writes the state and shows progress,
    and decisions (stop on a signal, save now) are taken by all ranks together.
    """
    group = current_group()
    group.broadcast_modules(modules.values())
    if group.rank:  # dropout masks of its own on each rank; rank 0 draws what one process would
        torch.manual_seed(cfg.seed + 7919 * group.rank)
    identity = identity_dict(cfg)
    history = History()
    best: Dict[str, Any] = {"score": -math.inf, "epoch": None, "weights": None}
    start_epoch, skip, iteration = 0, 0, 0
    total = torch.zeros((), device=device)
    resumed_gen = None
    elapsed, clock = 0.0, time.monotonic()  # seconds this run trained before it was resumed, and since
    if state is not None and state.resume and os.path.exists(state.path):
        saved = read_state(state.path, device)
        if saved["stage"] != stage or saved["config"] != identity:
            differ = sorted(k for k in set(saved["config"]) | set(identity)
                            if saved["config"].get(k) != identity.get(k))
            raise ValueError(f"{state.path}: saved by another {saved['stage']} run "
                             f"(settings that differ: {differ or 'stage'}); not resumed")
        if saved.get("world_size", 1) != group.world_size:
            raise ValueError(f"{state.path}: saved by a run on {saved.get('world_size', 1)} process(es), not "
                             f"{group.world_size}; resume it with the same number of processes")
        for name, module in modules.items():
            module.load_state_dict(saved["modules"][name])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch, skip, iteration = saved["epoch"], saved["step"], saved["iteration"]
        history = History(saved["history"], saved["validation"])
        best = saved["best"]
        total = saved["total"].to(device)
        resumed_gen = saved["generator"].cpu()
        elapsed = saved.get("elapsed", 0.0)  # older states did not record their seconds: count them as 0
        rngs = saved["rng"]
        if isinstance(rngs, torch.Tensor):  # a state saved before runs had ranks
            rngs = [(rngs, saved.get("cuda_rng"))]
        rng, cuda_rng = rngs[group.rank]
        torch.set_rng_state(rng.cpu())
        restore_cuda_rng(cuda_rng, device)

    def save(epoch: int, done: int, epoch_start_gen: torch.Tensor, epoch_total: torch.Tensor) -> None:
        """Write the training state (rank 0; every rank calls it, for its random-number state)."""
        rngs = group.gather_objects(
            (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None))
        if group.is_main:
            payload = {
                "format": STATE_FORMAT, "stage": stage, "config": identity, "world_size": group.world_size,
                "epoch": epoch, "step": done, "iteration": iteration, "history": list(history),
                "validation": history.validation, "best": best, "total": epoch_total.detach(),
                "modules": {name: m.state_dict() for name, m in modules.items()},
                "optimizer": optimizer.state_dict(), "generator": epoch_start_gen, "rng": rngs,
                "elapsed": elapsed + time.monotonic() - clock,
            }
            with atomic_file(state.path) as tmp:
                torch.save(payload, tmp)
        group.barrier()  # no rank goes on (or exits) before the state is written

    last_save = time.monotonic()
    bar = tqdm(total=cfg.epochs, initial=start_epoch, desc=stage, unit="epoch",
               disable=not (progress and group.is_main))
    with stop_on_signals() as stop, ReadAhead() as reads:
        for epoch in range(start_epoch, cfg.epochs):
            if resumed_gen is not None:  # replay the interrupted epoch's draws
                generator.set_state(resumed_gen)
                resumed_gen = None
            else:
                total = torch.zeros((), device=device)
            epoch_start_gen = generator.get_state()
            plan = epoch_plan(n, cfg.batch_size, getattr(cfg, "modality_dropout", 0.0), generator, device, shuffle)
            for done, (index, separate) in enumerate(plan, 1):
                if done <= skip:
                    continue
                if ahead is not None:
                    reads.wait()  # this batch's reads, done while the step before ran
                    if done < len(plan):
                        reads.start(ahead, plan[done][0])
                total += step(index, separate, epoch, iteration) * len(index)
                iteration += 1
                # a stop is one decision of every rank: a collective (and a host sync) every STOP_EVERY steps
                shared = group.world_size == 1 or done % STOP_EVERY == 0 or done == len(plan)
                if shared and group.any(stop["signal"] is not None, device):
                    name = signal.Signals(stop["signal"]).name if stop["signal"] else "a signal to another rank"
                    where = f"{stage} interrupted by {name} at epoch {epoch + 1}/{cfg.epochs}, step {done}/{len(plan)}"
                    if state is None:
                        raise TrainingInterrupted(f"{where}; nothing saved", None, stop["signal"])
                    save(epoch, done, epoch_start_gen, total)
                    raise TrainingInterrupted(f"{where}; training state saved to {state.path}", state.path,
                                              stop["signal"])
            skip = 0
            reads.wait()
            history.append(total.item() / n)  # one sync per epoch
            shown = {"loss": f"{history[-1]:.4f}", **postfix(epoch, iteration)}
            if validate is not None:
                score = group.broadcast_float(validate() if group.is_main else 0.0, device)
                history.validation.append([epoch + 1, score])
                shown["val"] = f"{score:.4f}"
                if score > best["score"]:
                    weights = {name: {k: v.detach().clone() for k, v in m.state_dict().items()}
                               for name, m in modules.items()}
                    best = {"score": score, "epoch": epoch + 1, "weights": weights}
            bar.update(1)
            bar.set_postfix(**shown)
            if cfg.patience and best["epoch"] is not None and epoch + 1 - best["epoch"] >= cfg.patience:
                break  # early stop: `patience` epochs without a better validation score
            due = state is not None and time.monotonic() - last_save >= state.interval_s  # rank 0's clock decides
            if state is not None and epoch + 1 < cfg.epochs and group.any(due and group.is_main, device):
                save(epoch + 1, 0, generator.get_state(), torch.zeros((), device=device))
                last_save = time.monotonic()
    bar.close()
    if state is not None and start_epoch < cfg.epochs:  # finished: resuming returns the result at once
        save(cfg.epochs, 0, generator.get_state(), torch.zeros((), device=device))
    if best["weights"] is not None:  # keep the best validation epoch
        for name, module in modules.items():
            module.load_state_dict(best["weights"][name])
        history.best_epoch = best["epoch"]
    return history


# Under torchrun the ranks decide together whether to stop (a signal may reach one rank only), at
# every STOP_EVERY-th step and an epoch's last: one collective per step would stall a GPU every step.
STOP_EVERY = 16


def restore_cuda_rng(saved: Any, device: torch.device) -> None:
    """Restore the training device's CUDA generator (the one that drives dropout) from a saved state: a
    tensor, that device's; a list (older states held every visible GPU's) is indexed
    by the device, and an entry the list does not have (another number of GPUs) is left as it is."""
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(saved):
            return
        saved = saved[index]
    torch.cuda.set_rng_state(saved.cpu(), device)


def candidate_path(path: str, candidate: str) -> str:
    """Where the candidate ``candidate`` of a run that chooses on validation
    (:meth:`ucmfh.methods.Method.choices`) keeps its training state: ``hash64.state.pt`` ->
    ``hash64.sign.state.pt``."""
    head, tail = os.path.split(path)
    stem, dot, rest = tail.partition(".")
    return os.path.join(head, f"{stem}.{candidate}{dot}{rest}")


def candidate_name(path: str, candidate_state: str) -> str:
    """The candidate whose state :func:`candidate_path` put at ``candidate_state``."""
    stem, dot, rest = os.path.basename(path).partition(".")
    return os.path.basename(candidate_state)[len(stem) + 1: -len(dot + rest)]


def state_paths(path: str) -> List[str]:
    """Every file a run with its state at ``path`` may have saved: its own and its candidates'."""
    head, tail = os.path.split(path)
    stem, dot, rest = tail.partition(".")
    name = f"{glob.escape(stem)}.*{glob.escape(dot + rest)}"
    found = set(glob.glob(os.path.join(glob.escape(head), name)))
    for temp in glob.glob(os.path.join(glob.escape(head), f".{name}.tmp*")):  # a candidate's first save, unfinished
        destination = temp_destination(temp)
        if destination is not None:
            found.add(os.path.join(head, destination))
    return [path, *sorted(found - {path})]


def discard_state(state: Optional[StateFile]) -> None:
    """Remove a finished run's training state, its candidates' too (call once its result is saved)."""
    if state is None:
        return
    for path in state_paths(state.path):
        if os.path.exists(path):
            os.remove(path)
