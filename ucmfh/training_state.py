"""A training run's saved state and every rule about its files.

A run given a :class:`StateFile` saves its whole training state (weights, optimizer, random-number
generators, position, loss history; :mod:`ucmfh.trainer` writes it) atomically every ``interval_s``
seconds at an epoch's end, at once when SIGINT or SIGTERM arrives, and when it ends; the same run with
``resume=True`` continues from it. A run that chooses among candidates on validation keeps one state per
candidate (:func:`candidate_path`). A stage's state lies beside its checkpoint (:func:`state_path_of`);
once the checkpoint is saved the states are removed (:func:`discard_state`).
"""
from __future__ import annotations

import contextlib
import glob
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ucmfh.files import atomic_binary, remove_stale_temps, temp_destination, torch_file_problem

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


def read_state(path: str, device: torch.device) -> Dict[str, Any]:
    """A saved training state, checked to be one."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise ValueError(f"{path}: not a readable training state ({torch_file_problem(path, err)}); delete it to "
                         "train the run from its start") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: not a ucmfh training state; delete it to train the run from its start")
    return state


def write_state(path: str, payload: Dict[str, Any]) -> None:
    """Write a training state atomically: a save cut short leaves the previous state as it was."""
    with atomic_binary(path) as f:
        torch.save({"format": STATE_FORMAT, **payload}, f)


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


def state_path_of(checkpoint: str) -> str:
    """Where the training state of the stage saved at ``checkpoint`` lies: ``hash64.pt`` -> ``hash64.state.pt``."""
    return os.path.splitext(checkpoint)[0] + ".state.pt"


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


def saved_states(checkpoint: str) -> List[str]:
    """The training states saved beside ``checkpoint``: its run's, or its candidates' (a run that chooses
    on validation, :meth:`ucmfh.methods.Method.choices`)."""
    return [path for path in state_paths(state_path_of(checkpoint)) if os.path.exists(path)]


def interrupted_at(checkpoint: str) -> str:
    """Where the states saved beside ``checkpoint`` stand: ``epoch 3 of 100``, or for the candidates of a
    run that chooses ``t0.3: finished, t0.1: epoch 3 of 100``."""
    return stopped_where(checkpoint)[0]


def stopped_where(checkpoint: str) -> Tuple[str, List[int]]:
    """:func:`interrupted_at`'s words, and the CPU thread counts other than this process's that the states were
    trained with (states of an older ucmfh say none: on a CPU another count sums in another order, and a run
    resumed so trains another model than the run never stopped), each state read once."""
    where, threads, own = [], set(), state_path_of(checkpoint)
    for path in saved_states(checkpoint):
        saved = read_state(path, torch.device("cpu"))
        epochs = saved["config"]["epochs"]
        at = "finished" if saved["epoch"] >= epochs else f"epoch {saved['epoch'] + 1} of {epochs}"
        where.append(at if path == own else f"{candidate_name(own, path)}: {at}")
        threads.add(saved.get("threads"))
    now = torch.get_num_threads()
    return ", ".join(where), sorted(n for n in threads if isinstance(n, int) and n != now)


def trained_seconds(checkpoint: str) -> float:
    """The seconds of training that the states saved beside ``checkpoint`` hold (its run's, its candidates',
    its refit's), up to their last save: what a resumed run adds to its own time."""
    return sum(read_state(path, torch.device("cpu")).get("elapsed", 0.0) for path in saved_states(checkpoint))


def discard_state(state: Optional[StateFile]) -> None:
    """Remove a finished run's training state, its candidates' too (call once its result is saved)."""
    if state is None:
        return
    for path in state_paths(state.path):
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another process looking at the run
            os.remove(path)


def drop_leftover_state(checkpoint: str) -> None:
    """What a killed run may have left of a stage: temporary files of its writes, and a training
    state beside a finished checkpoint (the run died between saving one and removing the other)."""
    for path in (checkpoint, *state_paths(state_path_of(checkpoint))):
        remove_stale_temps(path)
    if os.path.exists(checkpoint):
        discard_state(StateFile(state_path_of(checkpoint)))
