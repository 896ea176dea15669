"""Fits side by side in threads of one process (:func:`side_by_side`), each on a CUDA stream of its own: the
candidates a run chooses between on validation (:func:`ucmfh.methods.base.choose`), where a block asks for it
(:func:`candidates_side_by_side`, ``--candidates-side-by-side``).

Why: on a GPU a captured step of a few small kernels keeps most of the GPU idle; the steps of two fits on two
streams of one process may run at once, where one after another they take turns (``scripts/bench_streams.py``
measures whether they do). Each fit keeps its random draws to itself (:func:`ucmfh.run_draws.separate_draws`),
so each trains the model it trains alone, and the run's result is the one its candidates give one after another.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import signal
import threading
from typing import Callable, Iterator, List, Sequence, TypeVar

import torch

from ucmfh.run_draws import separate_draws
from ucmfh.signals import TrainingInterrupted, stop_on_signals, stop_threads
from ucmfh.streams import unshared_stream

T = TypeVar("T")
POLL_S = 0.2  # how often a signal heard here is passed on to the fits' threads

_CANDIDATES: contextvars.ContextVar[bool] = contextvars.ContextVar("ucmfh_candidates_side_by_side", default=False)


@contextlib.contextmanager
def candidates_side_by_side(on: bool = True) -> Iterator[None]:
    """Inside the block (its context), a run's candidates are trained side by side (:func:`side_by_side`)."""
    token = _CANDIDATES.set(on)
    try:
        yield
    finally:
        _CANDIDATES.reset(token)


def candidates_asked() -> bool:
    """Whether :func:`candidates_side_by_side` is on."""
    return _CANDIDATES.get()


@contextlib.contextmanager
def own_stream(device: torch.device) -> Iterator[None]:
    """The calling thread's work inside the block on a CUDA stream of its own, on ``device`` (the thread's current
    GPU where it names none); as it is off CUDA. PyTorch orders the work of two streams only where told: the new
    stream first waits for what the thread's stream holds so far (a split or a model another thread copied to the
    GPU), and at the end the thread's stream waits for the new one's work (what the block leaves on the GPU)."""
    if device.type != "cuda":
        yield
        return
    index = device if device.index is not None else None
    launcher, stream = torch.cuda.current_stream(index), unshared_stream(index)  # not another live run's
    stream.wait_stream(launcher)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        launcher.wait_stream(stream)


def side_by_side(fits: Sequence[Callable[[], T]], device: torch.device) -> List[T]:
    """Each of ``fits`` called at once in a thread of its own (on a CUDA ``device``, with a stream of its own), in a
    copy of this thread's context, each fit's draws its own; their results in order. SIGINT or SIGTERM stops
    their training at its next step, their states saved (a thread hears no signal: it is passed on); so does a
    fit's error the others' (no fit trains on for a run that fails). Once every fit has ended the first error is
    raised, else the first interrupt."""
    threads: List[int] = []

    def run(fit: Callable[[], T]) -> T:
        threads.append(threading.get_ident())
        with own_stream(device):
            return fit()

    with separate_draws(), stop_on_signals() as stop, cf.ThreadPoolExecutor(len(fits), "ucmfh-fit") as pool:
        futures = [pool.submit(contextvars.copy_context().run, run, fit) for fit in fits]
        while not all(future.done() for future in futures):
            cf.wait(futures, timeout=POLL_S, return_when=cf.ALL_COMPLETED)
            if stop["signal"] is not None:  # heard here (this process's main thread, or passed on to this one)
                stop_threads(stop["signal"])
            elif any(_failed(future) for future in futures):  # the others stop too, their states saved
                stop_threads(signal.SIGTERM, threads)
    errors = [future.exception() for future in futures if future.exception() is not None]
    failures = [err for err in errors if not isinstance(err, KeyboardInterrupt)]
    if failures:
        raise failures[0]
    if errors:  # each stopped fit's state named, not the first one's alone
        first, others = errors[0], [getattr(err, "state_path", None) for err in errors[1:]]
        if isinstance(first, TrainingInterrupted) and any(others):
            raise TrainingInterrupted(f"{first}; the others' states: {', '.join(p for p in others if p)}",
                                      first.state_path, first.signum)
        raise first
    return [future.result() for future in futures]


def _failed(future: cf.Future) -> bool:
    """Whether ``future`` ended in an error other than an interrupt."""
    return future.done() and future.exception() is not None and not isinstance(future.exception(), KeyboardInterrupt)
