"""A run's random draws kept to itself (:func:`separate_draws`), so that training runs side by side in one
process, in threads, each train the model they train alone.

A run draws from torch's global generators: its initial weights from the CPU's as its plan is made, its dropout
from its device's at each step (a GPU's in each captured graph's replay). Runs in threads of one process would
interleave those draws. Inside :func:`separate_draws`, a run's start — its seeds, its validation split, its plan
and model made — holds one process-wide lock (:func:`setting_up`), and so does each of its steps, with the
device's generator set to the run's own state (:class:`RunDraws`), which goes on from where the run's last step
left it. On a GPU that state is one of PyTorch's graph-safe generator states: a graph captured while it is set
holds it, and each replay advances that state alone, whichever thread replays and whatever state is set then.
On the CPU the state is the generator's bytes, set before each step and read back after it.

A run's own state begins where a run alone would have its generator: seeded by the run's seed, then advanced by
its set-up's draws. So a run side by side draws the numbers it draws alone (``tests/test_run_draws.py``).
Outside the block no state is swapped, and a step takes no lock.

Whatever the block, a run leaves the caller's global generators as it found them (:func:`run_under_way`): a
notebook's own draws after a fit are those it would have made without it.

Why: a GPU step of a few small kernels keeps most of the GPU idle, and processes sharing one GPU take turns on
it; kernels of one process's threads, each on a stream of its own, may run at once
(``scripts/bench_streams.py`` measures whether they do).
"""
from __future__ import annotations

import contextlib
import random
import threading
import warnings
from typing import Any, ContextManager, Dict, Iterator, List, Optional

import numpy as np
import torch

_LOCK = threading.RLock()  # a run's set-up, and each step with its draws' state set
_ON = [0]  # the separate_draws blocks under way, every thread's
_RUNS: Dict[int, List[bool]] = {}  # each thread's runs under way (run_under_way): whether each keeps its draws apart
_SAVED: List[Optional[tuple]] = [None]  # the generators' states the first of the runs under way found
_WARNED: set = set()  # the threads told their draws interleave, while runs are under way: each told once
_NOTHING = contextlib.nullcontext()


@contextlib.contextmanager
def separate_draws() -> Iterator[None]:
    """Inside the block (process-wide: every thread's runs, until the last such block of any thread ends), runs
    started keep their draws to themselves."""
    with _LOCK:
        _ON[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ON[0] -= 1


def drawing_separately() -> bool:
    """Whether :func:`separate_draws` is on."""
    return _ON[0] > 0


@contextlib.contextmanager
def setting_up() -> Iterator[None]:
    """A run's start, its seeds set and its plan made, in one piece under :func:`separate_draws` (else as it is);
    and any other draw from torch's generators outside a run's steps (a model built to load a checkpoint into),
    which a run side by side would otherwise find in its own state, were it stepping meanwhile."""
    with _LOCK if _ON[0] else _NOTHING:
        yield


@contextlib.contextmanager
def building_to_replace() -> Iterator[None]:
    """A model built only to have its weights replaced (a checkpoint's, a closed-form fit's): its initial weights
    drawn under :func:`setting_up` from a copy of torch's generator, so that the caller's draws are as they were,
    and in float32 whatever the caller's default dtype (a float64 one made a model of float64 weights)."""
    dtype = torch.get_default_dtype()
    with setting_up(), torch.random.fork_rng(devices=[]):
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(dtype)


@contextlib.contextmanager
def run_under_way(device: torch.device, keeps_apart: bool = True) -> Iterator[None]:
    """A run's whole life, its start to its end: the caller's global generators, which runs seed for their own
    draws (:func:`ucmfh.utils.seed_everything`) — Python's, NumPy's, torch's on the CPU and on every GPU in use —
    cuDNN's flags and torch's default dtype are as the first run found them when the last run under way ends,
    whatever ends it (runs of several threads end in any order). While runs are under way the default dtype is
    float32, the command line's: a caller's float64 trained a model of float64 weights from other draws. A run
    that starts while a run of another thread is under way, their
    draws not kept apart (:func:`separate_draws`; a run whose start is not one piece under :func:`setting_up`
    passes ``keeps_apart=False``), says so in a ``RuntimeWarning``: each would draw the other's numbers, and
    train another model than it trains alone."""
    me, apart = threading.get_ident(), keeps_apart and drawing_separately()
    with _LOCK:  # no other run's set-up or step between the reads (a step swaps its own state in)
        if not _RUNS:  # the first run under way: the caller's state, as it stands
            gpus = (range(torch.cuda.device_count()) if device.type == "cuda" or torch.cuda.is_initialized()
                    else range(0))  # CUDA not started: nothing drawn there yet to keep
            _SAVED[0] = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                         [(gpu, torch.cuda.get_rng_state(gpu)) for gpu in gpus],
                         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                         torch.get_default_dtype())
            torch.set_default_dtype(torch.float32)
        others = [keeps for thread, runs in _RUNS.items() if thread != me for keeps in runs]
        _RUNS.setdefault(me, []).append(apart)
        told = me in _WARNED  # a fit of several runs (candidates, a refit) warned at each of them
        clash = others and not (apart and all(others))
        if clash:
            _WARNED.add(me)
    if clash and not told:
        warnings.warn("a run started in one thread while another thread's run is under way: their random draws "
                      "interleave, and each trains another model than it trains alone; start them inside "
                      "ucmfh.separate_draws()", RuntimeWarning, stacklevel=3)
    try:
        yield
    finally:
        with _LOCK:
            runs = _RUNS[me]
            runs.pop()
            if not runs:
                del _RUNS[me]
            if not _RUNS:  # the last run under way: the state the first one found
                _WARNED.clear()
                py, np_state, cpu, gpus, deterministic, benchmark, dtype = _SAVED[0]
                random.setstate(py)
                np.random.set_state(np_state)
                torch.set_rng_state(cpu)
                for gpu, state in gpus:
                    torch.cuda.set_rng_state(state, gpu)
                torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic, benchmark
                torch.set_default_dtype(dtype)
                _SAVED[0] = None


def cuda_generator(device: torch.device) -> Any:
    """The default generator of ``device`` (the current GPU where it names no index)."""
    return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]


_ACTIVE = threading.local()  # the RunDraws whose state the device's generator holds in this thread, if any


def state_replaced(state: Any) -> None:
    """The device's generator was set to ``state`` inside this thread's :meth:`RunDraws.active` block (a refused
    capture's undoing, :func:`ucmfh.captured_step.undo_refused_capture`): the run's draws go on from it, where
    the state it held is left marked as capturing."""
    draws = getattr(_ACTIVE, "draws", None)
    if draws is not None and draws.device.type == "cuda":
        draws.state = state


class RunDraws:
    """A run's own draws on ``device`` (:mod:`ucmfh.run_draws`), made at the end of its set-up, under
    :func:`setting_up`: from there on the state of the device's generator as it stands, the run's alone.
    Outside :func:`separate_draws` it holds nothing and :meth:`active` does nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.state: Optional[Any] = None
        if not _ON[0]:
            return
        if device.type == "cuda":  # a graph-safe state of its own, as the device's generator stands
            self.state = cuda_generator(device).clone_state()
        elif device.type == "cpu":
            self.state = torch.default_generator.get_state()

    def active(self) -> ContextManager[None]:
        """The block's draws on the device from this run's state, which goes on from the block's end; the state
        set before is set again after. Under the process-wide lock (nothing where the run holds no state: every
        step of every run enters it)."""
        return _NOTHING if self.state is None else self._swapped()

    @contextlib.contextmanager
    def _swapped(self) -> Iterator[None]:
        with _LOCK:
            if self.device.type == "cuda":
                generator = cuda_generator(self.device)
                before = generator.graphsafe_get_state()
                generator.graphsafe_set_state(self.state)  # a graph captured now holds it; replays advance it
                _ACTIVE.draws = self
                try:
                    yield
                finally:
                    _ACTIVE.draws = None
                    generator.graphsafe_set_state(before)
            else:
                before = torch.default_generator.get_state()
                torch.default_generator.set_state(self.state)
                try:
                    yield
                finally:
                    self.state = torch.default_generator.get_state()
                    torch.default_generator.set_state(before)
