"""``ucmfh grid --jobs N``: a grid's cells trained side by side, by N worker processes (or threads) at once.

The parent (:class:`SideBySide`) keeps every decision of the grid: which cells run (the skip of finished
cells stays in :mod:`ucmfh.app.grid`), the order of the rows (each cell's rows in the grid's order, in the
results file and in the table, as one process gives them), and what is said: one line per cell started
and per cell ended, with its seconds and its log (no progress bars). A worker (:func:`run_cell`) trains
and scores one cell at a time in a fresh process (``spawn``) with :func:`ucmfh.app.experiment.train_hash_stage`,
so a cell's rows are the rows of the cell run alone on the same device with the same number of threads.

Devices: with ``--device auto`` or ``cuda`` and several visible GPUs, worker i trains on GPU i mod their
number; on one GPU every worker shares it. Threads: the threads one run would use (``OMP_NUM_THREADS``,
else torch's default, the machine's cores) are split evenly, at least one each.

``--workers threads``: the cells run in N threads of the grid's own process instead (:func:`run_cell_in_thread`),
each on a CUDA stream of its own, so that the kernels of several cells may run on one GPU at once, where
processes sharing a GPU take turns on it. Each cell keeps its random draws to itself
(:func:`ucmfh.run_draws.separate_draws`), so its rows are those of the cell run alone. A signal stops the
cells' training at its next step as it stops a worker's (:func:`ucmfh.signals.stop_threads`); a cell's other
work (a closed-form fit, the scoring) runs to its end, as a thread cannot be stopped halfway.

Cells that build on one fusion encoder not trained yet never run at once: the first trains it, the others
start once it is saved and reuse it (a second trainer would be refused by its training lock).

Ctrl-C and SIGTERM: the parent passes the signal on to every worker until all have ended. In training a
worker stops at its next step with its training state saved (:func:`ucmfh.signals.stop_on_signals`); in any
other work of a cell (a closed-form fit, a dataset's read, the scoring) at once, as one process stops on
Ctrl-C; as it starts and between cells it ignores both. The rows of every
finished cell are appended, and the same ``ucmfh grid`` command (with any ``--jobs``) goes on with the
rest. A worker's error stops the others the same way and ends the grid with its one line.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import contextvars
import dataclasses
import itertools
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import click
import torch

from ucmfh.app.environment import torchrun_sizes
from ucmfh.app.errors import USER_ERRORS, interrupt_behind, interrupted, say
from ucmfh.app.experiment import train_hash_stage
from ucmfh.app.identity import Run, RunOptions, key_of
from ucmfh.app.options import Count
from ucmfh.app.runs import scores_line
from ucmfh.app.stage import RunInProgress
from ucmfh.app.table import append_cell_rows
from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, load_dataset
from ucmfh.run_draws import separate_draws
from ucmfh.side_by_side import own_stream
from ucmfh.signals import resend_lost_interrupts, stop_on_signals, stop_threads, stopped_by
from ucmfh.utils import resolve_device

Rows = List[Dict[str, Any]]
POLL_S = 0.2  # how often the parent looks at its workers: a fusion encoder saved, a signal to pass on
BUSY_POLL_S = 5.0  # how often a cell another process trains is looked at again, once the others are done


def _check_jobs(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value > 1 and torchrun_sizes()[0] > 1:
        raise click.BadParameter("cells side by side and torchrun's ranks do not mix: use one or the other")
    return value


WORKERS = ("processes", "threads")


def jobs_option(fn: Callable) -> Callable:
    """``--jobs N`` (default 1: the cells one after another in this process) and ``--workers``, what runs them."""
    fn = click.option(
        "--workers", type=click.Choice(WORKERS), default="processes", show_default=True,
        help="What runs the --jobs cells at once: worker processes, or threads of this process, each cell on a CUDA "
             "stream of its own (kernels of several cells at once on one GPU, where processes take turns on it; "
             "a signal stops their training at its next step, other work of a cell runs to its end).")(fn)
    return click.option(
        "--jobs", "-j", type=Count(min=1), default=1, show_default=True, callback=_check_jobs,
        help="Cells run at once, each by a worker (no more workers than cells to run): on one GPU they "
             "share it, with several GPUs worker i uses GPU i mod their number, on the CPU they split its "
             "threads. A cell's rows are those of the cell run alone with the same thread count.")(fn)


@dataclass(frozen=True)
class CellTask:
    """What a worker needs to run one cell: the dataset file and every setting of the run."""

    data_path: str
    max_memory: Optional[int]
    fusion_cfg: FusionConfig
    hash_cfg: HashConfig
    opts: RunOptions
    protocols: Tuple[str, ...]
    k: int


@dataclass
class Outcome:
    """A worker's answer for one cell: its rows, log lines and seconds; or how it stopped: a signal's
    message (``stopped``, its training state saved) or a user error (``error``)."""

    log: List[str]
    rows: Rows = field(default_factory=list)
    seconds: float = 0.0
    stopped: Optional[str] = None
    signum: Optional[int] = None
    error: Optional[BaseException] = None


_datasets: Dict[Tuple[str, Optional[int]], Dataset] = {}  # a worker's datasets, each read once


def _start_worker(slots: Any, pids: Any, threads: int, gpus: int, grid: int, broken: Any) -> None:
    """A worker's set-up: its slot (and pid, where the parent signals it), threads and GPU. SIGINT and
    SIGTERM are ignored between cells (a Ctrl-C reaches the whole process group, and the parent decides the
    rest), and from the process's start (:func:`_held`); in a cell, training stops at a safe point on
    either, and any other work (a closed-form fit, a dataset's read, the scoring) at once (:func:`run_cell`)."""
    with slots.get_lock():
        slot = slots.value
        slots.value += 1
    for signum in _STOPS:
        signal.signal(signum, signal.SIG_IGN)
    resend_lost_interrupts()  # a cell's stop raised in importlib's lock callback was dropped, with a traceback
    _unblock()  # held since its start, by the mask of the parent's thread (_held): ignored now
    pids[slot] = os.getpid()
    torch.set_num_threads(threads)
    if gpus:
        torch.cuda.set_device(slot % gpus)
    threading.Thread(target=_end_with_parent, args=(grid, broken), name="ucmfh-orphan-watch", daemon=True).start()


ORPHAN_POLL_S = 1.0  # how often a worker looks for its grid's process, and whether its pool broke


def _end_with_parent(parent: int, broken: Any = None) -> None:
    """End this worker once its grid's process (``parent``, its pid as the grid gave it: a worker's own look at its
    parent, once that is gone, would be its new one) is gone (killed hard: SIGKILL, the OOM killer), which no signal
    says: re-parented, idle between cells and deaf to SIGTERM there, it lived on, and held the grid's output open
    (a ``| tee`` of it waited for ever). Its cell's files are written atomically; its state, as last saved,
    resumes. Also once the grid says its pool is ``broken`` (another worker killed) and no cell's work is under way
    here (a cell running stops on the grid's SIGTERM, its state saved): from Python 3.12 a broken pool ends its
    workers by SIGTERM alone, which a worker between cells ignores, and waited for them for ever (the grid hung)."""
    while True:
        time.sleep(ORPHAN_POLL_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        if broken is not None and broken.value and not _IN_CELL[0]:
            os._exit(0)


def _portable(err: BaseException) -> BaseException:
    """``err`` if it travels to the parent intact, else an error of its kind with its message."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # an exception whose constructor pickle cannot call again
        return (OSError if isinstance(err, OSError) else ValueError)(str(err))


_STOPS = (signal.SIGINT, signal.SIGTERM)
# whether a cell's work is under way in this worker: a signal once it is over (its outcome made, its handlers
# being put back) stops nothing, and raised there it escaped the cell and left its handler on between cells
_IN_CELL = [False]


def _stop_now(signum: int, frame: Any) -> None:  # noqa: ARG001 - signal handler signature
    """A cell's work stopped where it is. Not while an exception is handled or unwinds (the parent sends its
    signal again until the worker has ended): the interrupt of a cell already stopping (a training state saved,
    a lock let go) is not replaced by another one halfway."""
    if sys.exc_info()[1] is not None or not _IN_CELL[0]:
        return
    raise stopped_by(f"interrupted by {signal.Signals(signum).name} outside its training steps (nothing "
                     "half-written is kept: the same command does that work again)", signum)


def _unblock() -> None:
    block = getattr(signal, "pthread_sigmask", None)
    if block is not None:
        block(signal.SIG_UNBLOCK, _STOPS)


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """SIGINT and SIGTERM held (blocked) in this thread inside the block, let go after it (no signal masks on
    Windows: nothing held). A process started inside begins with both held too (a signal mask is kept across
    ``fork`` and ``exec``): a worker started so lets them go in :func:`_start_worker`, once it ignores both, where
    a Ctrl-C as it started, importing ucmfh before its initializer ran, ended it with a traceback. The parent's
    handlers stay: a signal it gets meanwhile is handled (by another thread's delivery, or as the block ends)."""
    block = getattr(signal, "pthread_sigmask", None)
    if block is None:
        yield
        return
    block(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        _unblock()


def _restore(handlers: Dict[int, Any]) -> None:
    """The worker's handlers between cells put back, with both signals held meanwhile (one between the two
    would meet a handler of the cell outside it); a signal held is then ignored."""
    with _held():
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def run_cell(task: CellTask) -> Outcome:
    """Train (or reuse) and score one cell in this worker; its log lines come back with its rows. SIGINT or
    SIGTERM stops training at its next step, its state saved, and any other work at once, as a Ctrl-C stops a
    cell run in one process: a closed-form fit has no step to stop at."""
    log: List[str] = []
    handlers: Dict[int, Any] = {}
    _IN_CELL[0] = True
    try:
        for signum in _STOPS:
            handlers[signum] = signal.signal(signum, _stop_now)
        key = (task.data_path, task.max_memory)
        if key not in _datasets:
            _datasets[key] = load_dataset(task.data_path, max_memory_bytes=task.max_memory)
        start = time.perf_counter()
        rows = train_hash_stage(_datasets[key], task.fusion_cfg, task.hash_cfg, task.opts, task.protocols, task.k,
                                log=log.append)
        _IN_CELL[0] = False  # done: a signal from here on stops nothing
        return Outcome(log, rows, time.perf_counter() - start)
    except KeyboardInterrupt as err:  # TrainingInterrupted's constructor does not survive pickle: its message does
        _IN_CELL[0] = False
        return _stopped(err, log)
    except USER_ERRORS as err:
        _IN_CELL[0] = False
        stop = interrupt_behind(err)
        return _stopped(stop, log) if stop is not None else Outcome(log, error=_portable(err))
    finally:
        _IN_CELL[0] = False
        _restore(handlers)


def _stopped(err: KeyboardInterrupt, log: List[str]) -> Outcome:
    return Outcome(log, stopped=str(err) or "interrupted", signum=getattr(err, "signum", None))


def _start_thread(slots: Iterator[int], threads: int, gpus: int) -> None:
    """A thread worker's set-up: its torch threads (this thread's alone) and its GPU where there are several
    (worker i on GPU i mod their number)."""
    slot = next(slots)
    torch.set_num_threads(threads)
    if gpus:
        torch.cuda.set_device(slot % gpus)


def run_cell_in_thread(task: CellTask, data: Dataset, device: torch.device) -> Outcome:
    """Train (or reuse) and score one cell in a thread worker of the grid's process, on a CUDA stream of its own
    where ``device`` (the grid's) is a GPU, with the dataset the grid has read. Its training stops at its next
    step, its state saved, on :func:`ucmfh.signals.stop_threads`; its other work runs to its end."""
    log: List[str] = []
    start = time.perf_counter()
    try:
        with own_stream(device):
            rows = train_hash_stage(data, task.fusion_cfg, task.hash_cfg, task.opts, task.protocols, task.k,
                                    log=log.append)
        return Outcome(log, rows, time.perf_counter() - start)
    except KeyboardInterrupt as err:
        return _stopped(err, log)
    except USER_ERRORS as err:
        stop = interrupt_behind(err)
        return _stopped(stop, log) if stop is not None else Outcome(log, error=err)


@dataclass
class _Cell:
    name: str
    key: str
    fusion_path: Optional[str]  # the fusion encoder it builds on, None for a method without one
    task: CellTask
    data: Dataset  # the grid's read of task.data_path (a thread worker's; a process reads the file again)
    rows: Rows = field(default_factory=list)
    state: str = "pending"  # then running, and done, stopped or failed; busy: another process trains its run
    appended: bool = False
    tried: float = 0.0  # when it was last found busy (time.monotonic)


class SideBySide:
    """The cells of a grid run by ``jobs`` workers at once, processes or threads (``workers``): :meth:`add` each
    cell to run, in the grid's order, then :meth:`run`.

    ``device``: the grid's ``--device``; ``results``: the results file the rows are appended to (in the
    grid's order); the other arguments as :func:`ucmfh.app.experiment.train_hash_stage` takes them.
    """

    def __init__(self, jobs: int, device: str, results: str, opts: RunOptions, protocols: Sequence[str], k: int,
                 max_memory: Optional[int], workers: str = "processes",
                 log: Callable[[str], None] = say,
                 finished_rows: Callable[[str], Optional[Rows]] = lambda key: None) -> None:
        """``finished_rows``: a run's rows in the results file (by its key), None where it has none: a cell another
        process was training, once that process has written them."""
        if workers not in WORKERS:
            raise ValueError(f"workers: one of {', '.join(WORKERS)}, got {workers!r}")
        self.jobs, self.device, self.results, self.log = jobs, device, results, log
        self.finished_rows = finished_rows
        self.in_threads = workers == "threads"
        self.opts = dataclasses.replace(opts, progress=False)  # N bars on one terminal say nothing
        self.protocols, self.k, self.max_memory = tuple(protocols), k, max_memory
        self.cells: List[_Cell] = []

    def add(self, name: str, run: Run, data_path: str, data: Dataset, fusion_cfg: FusionConfig) -> Rows:
        """Queue the cell of ``run`` on ``data``, read from ``data_path`` (``fusion_cfg``: the grid's, which a
        method without a fusion stage ignores). Returns the list its rows fill once it has run: the list of the
        cell queued before when it is the same run (a seed or dataset named twice), which then runs once."""
        key = key_of(run.hash_identity)
        for cell in self.cells:
            if cell.key == key:
                self.log(f"skip {name}: the same run as an earlier cell (run {key})")
                return cell.rows
        task = CellTask(data_path, self.max_memory, fusion_cfg, run.hash_cfg, self.opts, self.protocols, self.k)
        self.cells.append(_Cell(name, key, run.fusion_path if run.fusion_cfg is not None else None, task, data))
        return self.cells[-1].rows

    def workers(self) -> int:
        return min(self.jobs, len(self.cells))

    def threads(self) -> int:
        """Each worker's torch threads: those of one run, split between the ``jobs`` asked for, however many cells
        are left to run (on the CPU the count can change a cell's rows: a grid resumed with one cell left, or
        grown by a seed, trained it with every thread where its neighbours had their share)."""
        return max(1, torch.get_num_threads() // max(1, self.jobs))

    def gpus(self) -> int:
        """The GPUs the workers spread over (worker i on GPU i mod this), or 0: every worker on the device asked."""
        if self.device not in ("auto", "cuda") or not torch.cuda.is_available():
            return 0
        count = torch.cuda.device_count()
        return count if count > 1 else 0

    def run(self) -> None:
        """Run every cell added, ``jobs`` at a time, and append their rows to the results file.

        A signal ends the grid as a run's interrupt does (exit 128 + its number) once every worker has
        stopped; a worker's error is raised once the others have stopped."""
        if not self.cells:
            return
        n = self.workers()
        running: Dict[cf.Future, _Cell] = {}
        signum: Optional[int] = None
        error: Optional[BaseException] = None
        broken = False
        with stop_on_signals() as stop, contextlib.ExitStack() as side:
            pool, submit, stop_cells, end_workers = self._pool(n, side)
            try:
                while True:
                    if signum is None and stop["signal"] is not None and running:  # said at once: threads finish
                        self.log(f"{signal.Signals(stop['signal']).name}: stopping the running cells (in threads a "
                                 "closed-form fit or a scoring runs to its end first)" if self.in_threads else
                                 f"{signal.Signals(stop['signal']).name}: stopping the running cells")
                    signum = signum or stop["signal"]
                    if signum is not None or error is not None:  # no new cell; the running ones stop
                        stop_cells(signum or signal.SIGTERM)
                    else:
                        self._start_ready(submit, running, n)
                    if not running and (signum is not None or error is not None
                                        or not any(cell.state == "busy" for cell in self.cells)):
                        break
                    if not running:  # cells another process trains, alone left: looked at again in a while
                        time.sleep(POLL_S)
                        continue
                    ended, _ = cf.wait(running, timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
                    for future in ended:
                        cell = running.pop(future)
                        try:
                            outcome = future.result()
                        except KeyboardInterrupt as err:  # a signal in the worker as its cell ended: stopped
                            signum, error = self._ended(cell, Outcome([], stopped=str(err) or "interrupted",
                                                                      signum=getattr(err, "signum", None)),
                                                        signum, error)
                            continue
                        except BrokenProcessPool:  # a worker killed (out of memory, or a Ctrl-C as it started):
                            broken = True
                            cell.state = "failed"  # the pool breaks, and every cell running in it ends so; which
                            self.log(f"failed {cell.name}: a worker process of the grid ended abruptly")  # is not said
                            if signum is None and error is None:
                                error = ChildProcessError("a worker process of the grid ended abruptly (killed, or out "
                                                          "of memory), which ended the cells running (each named "
                                                          "above); run the same command to continue")
                            continue
                        except Exception as err:  # a bug in ucmfh: raised as it is, once the others stopped
                            cell.state = "failed"
                            error = error or err
                            continue
                        signum, error = self._ended(cell, outcome, signum, error)
                    self._append(in_order=signum is None and error is None)
            except BaseException:
                stop_cells(signal.SIGTERM)
                raise
            finally:
                if broken:  # the other workers end once their cells have stopped (Python 3.12 waited for ever)
                    end_workers()
                pool.shutdown(wait=True, cancel_futures=True)
            signum = signum or stop["signal"]  # one heard after the last cell ended, as the pool shut down: said
        self._append(in_order=False)  # every finished cell's rows are kept, whatever stopped the grid
        if error is not None:
            raise error
        finished = sum(cell.state == "done" for cell in self.cells)
        if signum is not None and finished == len(self.cells):  # the last cells ended before it stopped them
            self.log(f"{signal.Signals(signum).name} came as the last cells ran to their end: every cell finished")
        if signum is not None and finished < len(self.cells):  # a signal after the last cell ended stops nothing
            stopped = sum(cell.state == "stopped" for cell in self.cells)
            interrupted(stopped_by(f"grid interrupted by {signal.Signals(signum).name}: {finished} of the "
                                   f"{len(self.cells)} cells to run finished, {stopped} stopped (each says above "
                                   "what it kept)", signum), always_resumes=True)

    def _pool(self, n: int, side: contextlib.ExitStack) -> Tuple[cf.Executor, Callable[[_Cell], cf.Future],
                                                                 Callable[[int], None], Callable[[], None]]:
        """The ``n`` workers: their pool, how a cell is given to one, how a signal reaches the cells running, and
        how the workers of a broken pool are told to end once their cells have stopped (``side``: what the workers
        run inside, until they have ended)."""
        if self.in_threads:
            device = resolve_device(self.device)
            if device.type == "cpu":
                self.log("note: on the CPU the cells' steps take turns in threads (each holds its draws' lock for its "
                         "arithmetic); --workers processes runs them at once")
            side.enter_context(separate_draws())  # each cell's draws its own, as in a process alone
            pool: cf.Executor = cf.ThreadPoolExecutor(n, "ucmfh-cell", initializer=_start_thread, initargs=(
                itertools.count(), self.threads(), self.gpus()))

            def in_thread(cell: _Cell) -> cf.Future:  # in a copy of this thread's context: its blocks hold there
                return pool.submit(contextvars.copy_context().run, run_cell_in_thread, cell.task, cell.data, device)

            return pool, in_thread, stop_threads, lambda: None  # threads: no pool to break
        context = multiprocessing.get_context("spawn")  # fresh processes: no CUDA or thread pool state forked
        pids, broken = context.Array("i", n), context.Value("b", 0)
        pool = cf.ProcessPoolExecutor(n, context, initializer=_start_worker, initargs=(
            context.Value("i", 0), pids, self.threads(), self.gpus(), os.getpid(), broken))

        def end_workers() -> None:
            broken.value = 1

        return pool, lambda cell: pool.submit(run_cell, cell.task), lambda signum: _send(pids, signum), end_workers

    def _start_ready(self, submit: Callable[[_Cell], cf.Future], running: Dict[cf.Future, _Cell], n: int) -> None:
        """Start the first pending cells, in the grid's order, while a worker is free; a cell whose fusion
        encoder a running cell trains waits until it is saved. Once none is pending, a cell another process was
        training is looked at again every :data:`BUSY_POLL_S`: its rows from the results file, else started again."""
        for cell in self.cells:
            if len(running) >= n:
                return
            if cell.state != "pending":
                continue
            if cell.fusion_path is not None and not os.path.exists(cell.fusion_path) and \
                    any(other.fusion_path == cell.fusion_path for other in running.values()):
                continue
            self._start(cell, submit, running)
        if any(cell.state == "pending" for cell in self.cells):
            return
        for cell in self.cells:  # the others done or under way: a cell another process trained, looked at again
            if len(running) >= n:
                return
            if cell.state != "busy" or time.monotonic() - cell.tried < BUSY_POLL_S:
                continue
            rows = self.finished_rows(cell.key)
            if rows:  # that process wrote them: this grid's rows, in the file already
                cell.rows.extend(rows)
                cell.state, cell.appended = "done", True
                self.log(f"skip {cell.name}: finished by the other process (run {cell.key})")
                continue
            self._start(cell, submit, running, " (again)")

    def _start(self, cell: _Cell, submit: Callable[[_Cell], cf.Future], running: Dict[cf.Future, _Cell],
               note: str = "") -> None:
        with _held():  # a submit starts a worker where none is free: it starts deaf to both
            running[submit(cell)] = cell
        cell.state = "running"
        self.log(f"start {cell.name}{note}")

    def _ended(self, cell: _Cell, outcome: Outcome, signum: Optional[int],
               error: Optional[BaseException]) -> Tuple[Optional[int], Optional[BaseException]]:
        """Say how ``cell`` ended and keep its rows; the grid's signal and error, updated."""
        if isinstance(outcome.error, RunInProgress):  # the others first, then it is looked at again
            if cell.tried == 0.0:
                self.log(f"busy {cell.name}: {outcome.error.fact}; it is run after the other cells")
            cell.state, cell.tried = "busy", time.monotonic()
            return signum, error
        if outcome.error is not None:
            cell.state = "failed"
            self.log(f"failed {cell.name}: {outcome.error}")
            error = error or outcome.error
        elif outcome.stopped is not None:
            cell.state = "stopped"
            self.log(f"stopped {cell.name}: {outcome.stopped}")
            if error is None:  # a signal to the worker alone stops the grid too (one that names none: Ctrl-C's)
                signum = signum or outcome.signum or signal.SIGINT
        else:
            cell.state = "done"
            cell.rows.extend(outcome.rows)
            finished = sum(other.state == "done" for other in self.cells)
            self.log(f"done  {cell.name}: {outcome.seconds:.1f} s ({finished} of {len(self.cells)} cells)")
        for line in outcome.log:
            self.log(f"      {line}")
        if cell.state == "done" and outcome.rows:
            self.log(f"      {scores_line(outcome.rows)}")
        return signum, error

    def _append(self, in_order: bool) -> None:
        """Append the rows of the finished cells not appended yet: ``in_order``, only those that every
        earlier cell precedes (the results file keeps the grid's order), else all."""
        for cell in self.cells:
            if cell.state == "done" and not cell.appended:
                append_cell_rows(self.results, cell.rows, self.log, cell.name)
                cell.appended = True
            elif in_order and cell.state != "done":
                return


def _send(pids: Any, signum: int) -> None:
    """``signum`` to every worker that has started (a worker between cells ignores it)."""
    for pid in pids[:]:
        if pid:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # ended already
                pass
