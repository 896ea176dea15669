"""What a training run reports after each epoch (:class:`EpochRecord`), to the logs listening
(:func:`logging_to`): TensorBoard event files (:class:`TensorBoardLog`, ``--tensorboard DIR``).

A log is listened to for a block of code: ``with logging_to(TensorBoardLog(folder)): fit_hashing(...)``; every
stage trained inside reports each epoch (:func:`ucmfh.trainer.train`, rank 0 only). A run that tries several
candidates or refits says which part is training (:func:`part`), so each keeps a curve of its own. Both are the
block's context (:mod:`contextvars`): runs in threads side by side (``ucmfh grid --jobs N --workers threads``)
each report to their own logs, and a thread started with a copy of its starter's context hears its blocks.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Protocol, Tuple


@dataclass
class EpochRecord:
    """One epoch of a training run: its stage (the plan's name) and part (a candidate or the refit, '' for
    the run itself), the epoch (from 1), the mean loss, the validation score (None without validation), each
    parameter group's learning rate, the plan's own scalars (β) and the seconds its steps took (to the read
    of its loss, which waits for the device's work; its validation not counted)."""

    stage: str
    part: str
    epoch: int
    loss: float
    validation: Optional[float]
    learning_rates: List[float]
    scalars: Dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


class EpochLog(Protocol):
    def record(self, record: EpochRecord) -> None: ...

    def close(self) -> None: ...


_LOGS: contextvars.ContextVar[Tuple[EpochLog, ...]] = contextvars.ContextVar("ucmfh_logs", default=())
_PARTS: contextvars.ContextVar[Tuple[Tuple[str, str], ...]] = contextvars.ContextVar("ucmfh_parts", default=())


@contextlib.contextmanager
def logging_to(*logs: EpochLog) -> Iterator[None]:
    """Every epoch trained inside the block is recorded by ``logs`` (closed at the block's end)."""
    token = _LOGS.set(_LOGS.get() + logs)
    try:
        yield
    finally:
        _LOGS.reset(token)
        for log in logs:
            log.close()


@contextlib.contextmanager
def part(name: str, shown: Optional[str] = None) -> Iterator[None]:
    """The epochs trained inside the block are the part ``name`` of their run (a candidate, the refit); ``shown``:
    how a progress bar names it, where not by ``name`` alone (``t0.3, candidate 1 of 2``)."""
    token = _PARTS.set(_PARTS.get() + ((name, shown or name),))
    try:
        yield
    finally:
        _PARTS.reset(token)


def current_logs() -> Tuple[EpochLog, ...]:
    return _LOGS.get()


def current_part() -> str:
    return "/".join(name for name, _ in _PARTS.get())


def shown_part() -> str:
    """The part as a progress bar names it (:func:`part`'s ``shown``)."""
    return "/".join(shown for _, shown in _PARTS.get())


def _folder_name(text: str) -> str:
    """A stage's or part's name as a folder name: ``hashing 64 bits`` -> ``hashing-64-bits``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


class TensorBoardLog:
    """Each stage's (and part's) curves in a TensorBoard folder of its own under ``folder``: ``loss``,
    ``validation``, ``lr`` (``lr/N`` per parameter group where there are several), the plan's scalars (``beta``)
    and ``seconds``, one point per epoch. A resumed run goes on with its curves: the points it trained
    again after its last saved state replace those of the interrupted run (TensorBoard's ``purge_step``).

    Needs the ``tensorboard`` package (``pip install 'ucmfh[tensorboard]'``); without it, building one
    raises ``ImportError`` naming the extra.
    """

    def __init__(self, folder: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError("training curves need the tensorboard package: pip install 'ucmfh[tensorboard]'") from None
        self.folder, self._writer_class, self.writers = folder, SummaryWriter, {}

    def record(self, record: EpochRecord) -> None:
        key = (record.stage, record.part)
        if key not in self.writers:  # the first epoch this process trains: later points of an earlier try go
            path = os.path.join(self.folder, _folder_name(record.stage),
                                *(_folder_name(p) for p in record.part.split("/") if p))
            self.writers[key] = self._writer_class(path, purge_step=record.epoch)
        writer, step = self.writers[key], record.epoch
        writer.add_scalar("loss", record.loss, step)
        if record.validation is not None:
            writer.add_scalar("validation", record.validation, step)
        for i, lr in enumerate(record.learning_rates):
            writer.add_scalar("lr" if len(record.learning_rates) == 1 else f"lr/{i}", lr, step)
        for name, value in record.scalars.items():
            writer.add_scalar(name, value, step)
        writer.add_scalar("seconds", record.seconds, step)
        writer.flush()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()
