"""A stage's life, written once for the fusion, hashing and SEPS stages (:func:`reuse_or_fit`): reused when
its checkpoint holds the identity asked for, else trained — continuing its saved training state only with
``--resume``, refusing to start over an interrupted one without it — then saved by rank 0 with its
identity, its training state removed, and every rank past a barrier before anyone reads it. One process at a
time trains a run (:func:`training_lock`): a second asking for the same run is refused.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ucmfh.app.identity import Run, RunOptions, key_of
from ucmfh.checkpoint import check_checkpoint_path
from ucmfh.distributed import current_group
from ucmfh.training_state import (StateFile, discard_state, drop_leftover_state, interrupted_at, saved_states,
                                  state_path_of, stopped_where, trained_seconds)
from ucmfh.files import write_json_atomic
from ucmfh.captured_step import capture_steps
from ucmfh.selection import History
from ucmfh.side_by_side import candidates_side_by_side
from ucmfh.signals import TrainingInterrupted, stopped_by
from ucmfh.training_log import TensorBoardLog, logging_to

try:  # POSIX advisory locks; elsewhere no run is locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

Log = Callable[[str], None]


BUSY_REMEDY = "; wait for it or use another --out"  # what a command refused as busy says to do


class RunInProgress(OSError):
    """Another process is training the run asked for (it holds the run's :func:`training_lock`)."""

    @property
    def fact(self) -> str:
        """The refusal without its remedy: a grid, which waits for the run, says this alone."""
        return str(self).removesuffix(BUSY_REMEDY)


def _lock_path(checkpoint: str) -> str:
    return os.path.splitext(checkpoint)[0] + ".lock"


def _try_lock(checkpoint: str) -> Tuple[Optional[int], Optional[str]]:
    """The run's lock taken (its file descriptor; closing it releases the lock), or why not: the refusal's text."""
    if fcntl is None:  # pragma: no cover
        return None, None
    folder = os.path.dirname(checkpoint) or "."
    try:  # a file in the run folder's way, a dangling link, a read-only folder: said of the folder, not errno's words
        os.makedirs(folder, exist_ok=True)
        fd = os.open(_lock_path(checkpoint), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        in_way = isinstance(err, (FileExistsError, NotADirectoryError))
        raise OSError(f"{folder}: the run's folder cannot be made or written ({err.strerror or err}"
                      f"{': a file is in its way' if in_way else ''}); give another --out") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _still_there(fd, _lock_path(checkpoint)):  # taken as its holder removed it (_drop_bare_folder):
            os.close(fd)  # a lock of no file, which another process's new lock file would not see: again
            return _try_lock(checkpoint)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        who = f"another process (pid {holder})" if holder.isdigit() else "another process"
        return None, f"{os.path.dirname(checkpoint)}: {who} is training this run{BUSY_REMEDY}"
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd, None


def _still_there(fd: int, path: str) -> bool:
    """Whether the file open as ``fd`` is still the one at ``path`` (not removed, nor replaced by another)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


@contextlib.contextmanager
def training_lock(checkpoint: str) -> Iterator[None]:
    """Hold the lock of the run whose checkpoint is ``checkpoint`` while this process trains it; a second
    process asking to train the same run is refused (:class:`RunInProgress`, one line) instead of training
    it again beside the first and writing the same checkpoint.

    ``fcntl.flock`` on ``STEM.lock`` beside the checkpoint (``hash64.lock``: the code lengths of a folder
    are runs of their own), non-blocking; the file holds the holder's pid, for the refusal. The kernel
    releases the lock when its process ends, however it ends, so a killed run's lock file blocks nothing.
    Under ``torchrun`` rank 0 takes it for all ranks, and every rank is refused with it."""
    group = current_group()
    fd, refusal = _try_lock(checkpoint) if group.is_main else (None, None)
    refusal = group.gather_objects(refusal)[0]
    if refusal is not None:
        raise RunInProgress(refusal)
    try:
        yield
    except BaseException:  # refused, or interrupted (a closed-form fit), before anything was saved: no folder of
        if fd is not None:  # the run's lock alone is left behind
            _drop_bare_folder(checkpoint)
        raise
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _drop_bare_folder(checkpoint: str) -> None:
    """Remove the run's lock file, and its folder where nothing else is in it (a run refused before it saved
    anything: a bad setting found once it started). The lock is still held: a process that opened the file
    meanwhile is refused as busy, one that comes after makes a lock of its own (and the folder stays)."""
    folder, lock = os.path.dirname(os.path.abspath(checkpoint)), _lock_path(checkpoint)
    try:
        if os.listdir(folder) == [os.path.basename(lock)]:
            os.unlink(lock)
            os.rmdir(folder)
            up = os.path.dirname(folder)
            # a hashing run's folder inside its fusion stage's (ucmfh, distill): that stage, refused first, left its
            # lock there, which this run's folder kept
            if os.path.basename(folder).startswith("hash-") and _only_free_locks(up):
                os.rmdir(up)
                up = os.path.dirname(up)
            if not os.listdir(up):  # the dataset's folder, made for this run alone
                os.rmdir(up)
    except OSError:  # another process's file appeared: its folder stays
        pass


def _only_free_locks(folder: str) -> bool:
    """Whether ``folder`` holds lock files alone, none held by a process; those are removed."""
    names = os.listdir(folder)
    if fcntl is None or not names or not all(name.endswith(".lock") for name in names):
        return False
    for name in names:
        fd = os.open(os.path.join(folder, name), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by none (BlockingIOError: held; the folder stays)
            os.unlink(os.path.join(folder, name))
        finally:
            os.close(fd)
    return True


def _refuse_busy(checkpoint: str) -> None:
    """Refuse a run another process is training now (its lock is held), else nothing."""
    fd, refusal = _try_lock(checkpoint)
    if fd is not None:
        os.close(fd)
    if refusal is not None:
        raise RunInProgress(refusal)


def _refuse_interrupted(checkpoint: str, locked: bool = False) -> None:
    """Refuse to start over the interrupted run saved beside ``checkpoint``; one another process trains now
    is refused as busy, unless this process holds its lock (``locked``: a second lock of one process would
    refuse the process itself, naming its own pid as another's)."""
    if current_group().is_main and not locked:  # rank 0 alone: ranks trying the lock at once would see each other
        _refuse_busy(checkpoint)  # its state is a running run's, not an interrupted one's
    saved = saved_states(checkpoint)
    if not saved:  # the run that held them ended meanwhile, and removed them: nothing interrupted to refuse
        return
    raise FileExistsError(f"{saved[0]}: an interrupted run of these settings is saved here "
                          f"({interrupted_at(checkpoint)}); continue it with --resume, or delete "
                          f"{'the file' if len(saved) == 1 else 'the files'} to start over")


# the numbers of processes looked through for an interrupted run of the same settings (refuse_other_processes)
MOST_PROCESSES = 64


def check_interrupted(runs: Sequence[Run], opts: RunOptions) -> None:
    """Refuse to start over an interrupted run unless ``opts.resume``, and a ``--resume`` of a run interrupted
    in another number of processes (:func:`refuse_other_processes`); call it before anything trains."""
    for run in runs:
        for index, checkpoint in enumerate(run.checkpoints):
            if current_group().is_main:
                drop_leftover_state(checkpoint)
            if not opts.resume and saved_states(checkpoint):
                _refuse_interrupted(checkpoint)
            refuse_other_processes(lambda n: replace(run, trained_in=n).checkpoints[index], run.trained_in, opts,
                                   run.dataset_dir)


def refuse_other_processes(checkpoint_in: Callable[[int], str], processes: int, opts: RunOptions,
                           folder: str) -> None:
    """Refuse a ``--resume`` that would train a stage from the start (``checkpoint_in(n)``: its checkpoint in n
    processes; it runs in ``processes``) where the same settings in another number of processes, another run (its
    dropout draws differ, docs/distributed.md), left a training state; else nothing. ``folder``: the dataset's
    folder under ``--out``, which holds every such state (none there: nothing to look for)."""
    ours = checkpoint_in(processes)
    if not opts.resume or opts.always_resumes or saved_states(ours) or os.path.exists(ours) or \
            not glob.glob(os.path.join(glob.escape(folder), "**", "*.state.pt"), recursive=True):
        return
    for n in range(1, MOST_PROCESSES + 1):
        checkpoint = checkpoint_in(n)
        if n == processes or not saved_states(checkpoint):
            continue
        how = "in one process (without torchrun)" if n == 1 else f"with torchrun --nproc-per-node {n}"
        raise FileExistsError(
            f"{saved_states(checkpoint)[0]}: an interrupted run of these settings in {n} process"
            f"{'es' if n > 1 else ''} is saved here ({interrupted_at(checkpoint)}), and this one runs in "
            f"{processes}: a run's number of processes is part of its identity; resume it {how}")


def state_for(checkpoint: str, opts: RunOptions, log: Log) -> StateFile:
    """The training state beside a checkpoint, whose :func:`training_lock` this process holds; an interrupted run
    is continued only with ``resume``."""
    if current_group().is_main:
        drop_leftover_state(checkpoint)
    state = StateFile(state_path_of(checkpoint), opts.save_interval, opts.resume)
    saved = saved_states(checkpoint)
    if saved:
        if not opts.resume:
            _refuse_interrupted(checkpoint, locked=True)
        where, before = stopped_where(checkpoint)
        log(f"resuming {', '.join(saved)} ({where})")  # '(finished)', '(epoch 3 of 100)', ...
        if before:
            count = " or ".join(map(str, before))
            log(f"note: trained with {count} CPU thread{'s' * (before != [1])} before its stop, resumed with "
                f"{torch.get_num_threads()}: on the CPU another count sums in another order, so the model can differ "
                f"from the run never stopped (OMP_NUM_THREADS={before[0]} resumes it as it began)")
    elif opts.resume and not opts.always_resumes:
        states, finished = _other_settings(checkpoint)
        if states:
            elsewhere = (f"; states of other settings of this method and seed are saved in {', '.join(states)} "
                         "(another run's flags: resume it with those; or an older ucmfh's key of these flags, "
                         "which only that version resumes)")
        elif finished:
            elsewhere = (f"; this stage of other settings of this method and seed is finished in "
                         f"{', '.join(finished)} (another run's flags, or an older ucmfh's key of these)")
        else:
            elsewhere = " (a stage not started before)"
        log(f"nothing to resume: no training state is saved beside {checkpoint}{elsewhere}; training it from the "
            "start")
    return state


def _other_settings(checkpoint: str) -> Tuple[List[str], List[str]]:
    """The run folders of the same method and seed as ``checkpoint``'s (``METHOD-seedS-KEY`` beside its own) that
    hold a state of the same stage, and those that hold it finished: where a '--resume' that found nothing here
    may have meant (a key changed since). A stage in its fusion stage's run folder (``ucmfh``'s hashing stage:
    ``FUSION-KEY/hash-KEY/hashN.pt``) is looked for in the other fusion keys' folders too, where an older ucmfh's
    run of these flags keeps it."""
    folder, stage = os.path.split(checkpoint)
    parent, mine = os.path.split(folder)
    runs = [os.path.join(parent, name) for name in _named_alike(parent, mine)]
    if mine.startswith("hash-"):
        grand, fusion_run = os.path.split(parent)
        runs += [os.path.join(grand, name, run) for name in _named_alike(grand, fusion_run) if name != fusion_run
                 for run in _named_alike(os.path.join(grand, name), mine)]
    runs = [run for run in runs if run != folder]
    states = [run for run in runs if saved_states(os.path.join(run, stage))]
    return states, [run for run in runs if run not in states and os.path.isfile(os.path.join(run, stage))]


def _named_alike(parent: str, name: str) -> List[str]:
    """The folders in ``parent`` named as ``name`` but for its last part (``two-tower-seed4-`` + any key)."""
    prefix = name.rsplit("-", 1)[0] + "-"
    try:
        return sorted(entry for entry in os.listdir(parent or ".")
                      if entry.startswith(prefix) and os.path.isdir(os.path.join(parent, entry)))
    except OSError:
        return []


def saved_epochs(run: Run, kind: str) -> Dict[int, str]:
    """The saved checkpoints (``kind`` 'fusion' or 'hash') of runs that differ from ``run`` in their
    epochs alone, by epochs: what a user who trained with ``--epochs 20`` and evaluates without it has."""
    def without_epochs(identity: Dict[str, Any]) -> Dict[str, Any]:
        return {stage: {k: v for k, v in (identity.get(stage) or {}).items() if k != "epochs"}
                for stage in ("fusion", "hash")}

    if kind == "fusion":
        wanted, pattern = without_epochs(run.fusion_identity), os.path.join(run.dataset_dir, "*", "identity.json")
    else:
        wanted = without_epochs(run.hash_dir_identity)
        pattern = os.path.join(run.dataset_dir, "*", *(["hash-*"] if run.fusion_cfg is not None else []),
                               "identity.json")
    found = {}
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as f:
                identity = json.load(f)
        except (OSError, ValueError):
            continue
        checkpoint = os.path.join(os.path.dirname(path), "fusion.pt" if kind == "fusion" else
                                  os.path.basename(run.hash_path))
        if without_epochs(identity) == wanted and os.path.exists(checkpoint):
            found[(identity.get(kind) or {}).get("epochs")] = checkpoint
    return found


def write_identity(directory: str, identity: Dict[str, Any], dataset: Dict[str, str]) -> None:
    write_json_atomic(os.path.join(directory, "identity.json"), {**identity, "dataset": dataset})


@dataclass
class Stage:
    """A stage of a run: what the log calls it, its checkpoint, the folder its ``identity.json`` goes to,
    its identity and the dataset's; ``folder_identity``, what that file says when the folder holds
    several such checkpoints (the code lengths of one hashing run), else the stage's identity."""

    name: str
    path: str
    directory: str
    identity: Dict[str, Any]
    dataset: Dict[str, str]
    folder_identity: Optional[Dict[str, Any]] = None


@dataclass
class Fitted:
    """A stage reused or trained: the model, the seconds its training took (as saved, when reused), its
    history (:meth:`History.as_dict`)."""

    model: Any
    seconds: float
    history: Dict[str, Any]


def reuse_or_fit(
    stage: Stage,
    opts: RunOptions,
    load: Callable[[], Tuple[Any, Dict[str, Any]]],
    fit: Callable[[StateFile, Any], Tuple[Any, History]],
    save: Callable[[Any, Dict[str, Any]], None],
    log: Log = print,
    note: str = "",
    prepare: Callable[[], Any] = lambda: None,
) -> Fitted:
    """The stage's model: reused when its checkpoint is saved with the same identity, else trained and saved.

    ``load()`` reads the checkpoint (model, meta); a checkpoint whose identity is another run's is refused.
    ``fit(state, base)`` trains, saving and resuming its training state in ``state``. ``save(model, meta)`` writes
    the checkpoint (rank 0 only). ``note`` ends the line that says it was reused. ``prepare()``, called
    only when the stage trains and before its clock starts, gets what it builds on (the fusion encoder of a
    hashing stage) and ``fit`` receives its result. The stage trains under its :func:`training_lock` (a
    second process asking for it meanwhile is refused).
    """
    group = current_group()
    key = key_of(stage.identity)

    def reuse() -> Fitted:
        model, meta = load()
        if meta.get("identity") != stage.identity:
            raise ValueError(f"{stage.path}: holds a {stage.name} of another run (its identity differs from the one "
                             "asked for); not reused. Move it away or use another --out")
        if group.is_main:
            drop_leftover_state(stage.path)
        log(f"{stage.name}: already trained, reused {stage.path} (run {key}{note})")
        if opts.tensorboard and group.is_main:  # the user asked for curves: say why none come
            log(f"note: --tensorboard: no curves of {stage.name}, which trains no epoch here ('ucmfh runs --history "
                f"{key}' prints those it trained)")
        return Fitted(model, meta.get("seconds", 0.0), meta["history"])

    if os.path.exists(stage.path):
        return reuse()
    with training_lock(stage.path):
        if os.path.exists(stage.path):  # trained by another process between the look above and the lock
            return reuse()
        return _train(stage, opts, fit, save, log, prepare, key)


def _train(stage: Stage, opts: RunOptions, fit: Callable[[StateFile, Any], Tuple[Any, History]],
           save: Callable[[Any, Dict[str, Any]], None], log: Log, prepare: Callable[[], Any], key: str) -> Fitted:
    """:func:`reuse_or_fit`'s training of a stage not saved yet, under its lock."""
    group = current_group()
    check_checkpoint_path(stage.path)  # before the hours of training that would end in its refusal
    base = prepare()  # before this stage's own line: what it builds on says its own first
    log(f"{stage.name}: training {stage.path} (run {key})")
    state = state_for(stage.path, opts, log)
    earlier = trained_seconds(stage.path)  # a resumed run: the time its interrupted part trained
    start = time.perf_counter()
    logs = []
    if opts.tensorboard and group.is_main:  # the run's curves in a folder of the run's own name
        logs.append(TensorBoardLog(os.path.join(opts.tensorboard, os.path.relpath(stage.directory, opts.out))))
    # asked for (--cuda-graph): every reason a stage runs eagerly is said; on by default: a refused capture alone
    asked = "CUDA graphs asked for, but " if opts.cuda_graph else ""
    with logging_to(*logs), capture_steps(opts.cuda_graph is not False, on_eager=lambda why: log(f"note: {asked}{why}"),
                                          every_reason=bool(opts.cuda_graph)), \
            candidates_side_by_side(opts.candidates_side_by_side):
        try:
            model, history = fit(state, base)
        except KeyboardInterrupt as err:  # between two fits (candidates), where a fit's own stop does not listen
            if isinstance(err, TrainingInterrupted):
                raise
            if not saved_states(stage.path):  # its set-up (DAEH's pass over every pair: minutes), said as such
                raise stopped_by(f"{str(err) or 'interrupted'} while {stage.name} set up its training, before its first "
                                 "epoch: nothing of it was saved", getattr(err, "signum", None)) from None
            # between two fits (candidates, a refit), or a resumed run's before its first epoch (its state read):
            # 'between its fits' was said of a one-fit method as its state loaded
            raise TrainingInterrupted(f"{stage.name} interrupted outside its epochs (resuming, or between its fits); "
                                      f"the training states saved so far are kept beside {stage.path}",
                                      saved_states(stage.path)[0],
                                      getattr(err, "signum", None)) from None
    seconds = earlier + time.perf_counter() - start
    meta = {"identity": stage.identity, "dataset": stage.dataset, "history": history.as_dict(), "seconds": seconds,
            "world_size": group.world_size, "threads": torch.get_num_threads()}
    if group.is_main:
        write_identity(stage.directory, stage.folder_identity or stage.identity, stage.dataset)
        save(model, meta)
        discard_state(state)
    group.barrier()  # every rank sees the checkpoint from here on
    return Fitted(model, seconds, meta["history"])
