"""``ucmfh grid --jobs N`` (:mod:`ucmfh.app.jobs`): cells side by side, stopped by a signal and resumed,
give the rows of one process in its order; a worker's error is one line."""
from __future__ import annotations

import csv
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from itertools import product
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from click.testing import CliRunner

from conftest import ROOT, AtFirstEpoch, SigtermFromAThread
from ucmfh import signals
from ucmfh.app import jobs
from ucmfh.app.cli import main
from ucmfh.app.experiment import VARYING
from ucmfh.app.identity import RunOptions
from ucmfh.app.runs import scores_line

# two methods (one with a fusion encoder its two code lengths share, one without) × two code lengths
GRID = ["-b", "8", "-b", "16", "--methods", "ucmfh,two-tower", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64",
        "--set", "hash.hidden=64", "--batch-size", "64", "--epochs", "2", "--device", "cpu"]


def _argv(tiny_path: str, folder: Path, *more: str) -> List[str]:
    return ["grid", "-d", tiny_path, *GRID, "--out", str(folder / "runs"), "--results", str(folder / "r.jsonl"),
            "--table", str(folder / "table"), *more]


def _rows(folder: Path) -> List[Dict[str, Any]]:
    return [{k: v for k, v in json.loads(line).items() if k not in VARYING}
            for line in (folder / "r.jsonl").read_text().splitlines()]


def _table(folder: Path) -> List[Dict[str, str]]:
    with open(folder / "table.csv", newline="") as f:
        return [{k: v for k, v in row.items() if not k.endswith("time_s_mean")} for row in csv.DictReader(f)]


@pytest.fixture()
def one_process(tiny_path, tmp_path_factory) -> Path:
    """The grid run cell after cell in this process (--jobs 1): the rows every --jobs must give. One torch
    thread, as each worker of --jobs 2 has here (a thread count of its own may round otherwise)."""
    folder = tmp_path_factory.mktemp("jobs1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(main, _argv(tiny_path, folder, "--quiet"))
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    assert sum(line.startswith("      unimodal: MAP@50 0.") for line in result.output.splitlines()) == 4  # each cell's
    return folder


class _TermToGrid(AtFirstEpoch):
    """A progress bar that holds each worker at the end of its first epoch until both are there (a barrier of
    files in $GRID_TEST_BARRIER: a loaded machine may start one worker's training late), then has one of them
    send SIGTERM to the grid (the workers' parent) alone, as a job scheduler would, and holds each worker until
    the grid has passed the signal on to it."""

    def first_epoch_ended(self):
        training, got = signal.getsignal(signal.SIGTERM), []  # the training loop's: it stops at its next step

        def relay(signum, frame):
            got.append(signum)
            training(signum, frame)

        signal.signal(signal.SIGTERM, relay)
        deadline = time.monotonic() + 60
        _both_here_then_signal_the_grid()
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)


def _both_here_then_signal_the_grid() -> None:
    """Wait (a minute at most) until both workers are here, a barrier of files in $GRID_TEST_BARRIER (a loaded
    machine may start one late); then one of the two sends SIGTERM to the grid, the workers' parent."""
    barrier = os.environ["GRID_TEST_BARRIER"]
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    if min(os.listdir(barrier), key=int) == str(os.getpid()):
        os.kill(os.getppid(), signal.SIGTERM)


def sigterm_in_first_epoch(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, with a SIGTERM to the grid at the end of the first epoch
    of the cell's first stage."""
    from ucmfh import trainer

    return _run_cell_with(trainer, "tqdm", _TermToGrid, task)


def _run_cell_with(module: Any, name: str, value: Any, task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, with ``module.name`` replaced by ``value`` while it runs."""
    real = getattr(module, name)
    setattr(module, name, value)
    try:
        return jobs.run_cell(task)
    finally:
        setattr(module, name, real)


def test_two_jobs_stopped_and_resumed_give_the_rows_of_one_in_its_order(tiny_path, tmp_path, one_process,
                                                                         monkeypatch):
    """SIGTERM to the grid while both workers train: the grid passes it on, each worker stops at its next
    step with its state saved, nothing is appended and no cell starts. The same command then runs the
    four cells two at a time, and ends with the rows of --jobs 1, in its order, in the results file and
    the table."""
    torch.set_num_threads(2)  # each of the two workers: 1, as the baseline
    monkeypatch.setattr(jobs, "run_cell", sigterm_in_first_epoch)  # what the workers are sent to run
    (tmp_path / "barrier").mkdir()
    monkeypatch.setenv("GRID_TEST_BARRIER", str(tmp_path / "barrier"))  # the workers inherit it
    stopped = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))
    assert stopped.exit_code == 143, stopped.output
    # the first two cells in the grid's order (ucmfh 16 bits waits for the fusion encoder of ucmfh 8 bits)
    for name, stage in (("ucmfh seed 2023 8 bits", "fusion"), ("two-tower seed 2023 8 bits", "two-tower 8 bits")):
        assert f"stopped {tiny_path} {name}: {stage} interrupted by SIGTERM at epoch 2/2, step 1/" in stopped.output
    assert stopped.output.count("training state saved to") == 2 and stopped.output.count("start ") == 2
    assert ("grid interrupted by SIGTERM: 0 of the 4 cells to run finished, 2 stopped (each says above what it "
            "kept); run the same command to continue") in stopped.output
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "table.md").exists()
    monkeypatch.undo()

    resumed = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))
    assert resumed.exit_code == 0, resumed.output
    assert _rows(tmp_path) == _rows(one_process) and len(_rows(tmp_path)) == 2 * 2 + 2  # ucmfh: two protocols
    assert _table(tmp_path) == _table(one_process)
    lines = resumed.output.splitlines()
    for name in ("ucmfh seed 2023 8 bits", "ucmfh seed 2023 16 bits", "two-tower seed 2023 8 bits",
                 "two-tower seed 2023 16 bits"):
        assert sum(line == f"start {tiny_path} {name}" for line in lines) == 1
        assert sum(line.startswith(f"done  {tiny_path} {name}: ") and line.endswith(" of 4 cells)") for line in lines) == 1
    # under each done line, the cell's scores as its rows hold them
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    for method, n_bits in product(("ucmfh", "two-tower"), (8, 16)):
        cell = [row for row in rows if (row["method"], row["n_bits"]) == (method, n_bits)]
        assert f"      {scores_line(cell)}" in lines and scores_line(cell).startswith("unimodal: MAP@50 0.")
    assert "resuming" in resumed.output and "fusion.state.pt (epoch 2 of 2)" in resumed.output
    # the two ucmfh cells share one fusion encoder: trained once (resumed), then reused, never by two at once
    assert resumed.output.count("fusion encoder: training") == 1
    assert resumed.output.count("fusion encoder: already trained, reused") == 1

    again = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))  # nothing left: no worker starts
    assert again.exit_code == 0 and again.output.count("skip") == 4 and "start" not in again.output


def sigterm_in_a_fit(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, whose closed-form fit (cca-itq's, no step to stop at) takes as
    long as it is let; once both workers fit (a barrier of files in $GRID_TEST_BARRIER: a worker still reading its
    data would stop there, before its fit), one of them sends SIGTERM to the grid."""
    import ucmfh.methods.cca_itq as cca_itq

    def fit(*args, **kwargs):
        _both_here_then_signal_the_grid()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a long fit, in Python as scikit-learn's CCA loops
            time.sleep(0.01)
        raise AssertionError("the fit was never stopped")

    return _run_cell_with(cca_itq, "fit_cca_itq", fit, task)


def test_a_closed_form_fit_stops_at_once_and_the_same_command_fits_it_again(tiny_path, tmp_path, monkeypatch):
    """A signal while workers fit cca-itq (no training step to stop at) stops them at once, each saying that a
    fit keeps no state, where they ignored it until the fits ended; the same command then fits both cells."""
    argv = ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "8", "-b", "16", "--device", "cpu", "--out",
            str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"), "--table", str(tmp_path / "table"),
            "--jobs", "2"]
    monkeypatch.setattr(jobs, "run_cell", sigterm_in_a_fit)
    (tmp_path / "barrier").mkdir()
    monkeypatch.setenv("GRID_TEST_BARRIER", str(tmp_path / "barrier"))  # the workers inherit it
    began = time.monotonic()
    stopped = CliRunner().invoke(main, argv)
    assert stopped.exit_code == 143, stopped.output
    assert time.monotonic() - began < 50  # not the fits' 60 s
    for n_bits in (8, 16):
        assert (f"stopped {tiny_path} cca-itq seed 2023 {n_bits} bits: cca-itq {n_bits} bits interrupted while "
                "fitting (a fit keeps no state: the same command fits it again)") in stopped.output
    assert ("grid interrupted by SIGTERM: 0 of the 2 cells to run finished, 2 stopped (each says above what it "
            "kept); run the same command to continue") in stopped.output
    assert not (tmp_path / "r.jsonl").exists()
    monkeypatch.undo()
    again = CliRunner().invoke(main, argv)
    assert again.exit_code == 0, again.output
    assert [json.loads(line)["n_bits"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [8, 16]


def test_a_signal_again_while_a_cell_stops_does_not_replace_its_interrupt(tiny_path, monkeypatch):
    """The grid sends its signal again until every worker has ended: one that lands while a cell's interrupt
    unwinds (its training state saved, its lock let go) was raised over it, and the cell said it had kept
    nothing. Between cells the worker's own handlers are back."""
    from ucmfh.app.identity import RunOptions
    from ucmfh.config import FusionConfig, HashConfig
    from ucmfh.signals import TrainingInterrupted

    def stopping(*args, **kwargs):
        try:
            raise TrainingInterrupted("two-tower 8 bits interrupted by SIGTERM at epoch 1/2; training state saved to "
                                      "s.state.pt", "s.state.pt", signal.SIGTERM)
        finally:  # the cell's clean-up, while the interrupt unwinds
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)

    monkeypatch.setattr(jobs, "train_hash_stage", stopping)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    task = jobs.CellTask(tiny_path, None, FusionConfig(), HashConfig(), RunOptions(), ("unimodal",), 50)
    outcome = jobs.run_cell(task)
    assert outcome.stopped == ("two-tower 8 bits interrupted by SIGTERM at epoch 1/2; training state saved to "
                               "s.state.pt") and outcome.signum == signal.SIGTERM
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_as_a_cell_returns_stops_nothing_and_its_handlers_are_put_back(tiny_path, monkeypatch):
    """A signal landing once the cell's work is done (as its outcome is made) escaped the cell: raised out of
    ``run_cell``, it left the cell's handler on, and the grid's next signal met the idle worker and printed a
    traceback. Now it stops nothing: the cell's rows come back and the worker's handlers are back."""
    from ucmfh.app.identity import RunOptions
    from ucmfh.config import FusionConfig, HashConfig

    class SignalledOutcome(jobs.Outcome):
        def __init__(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(jobs, "train_hash_stage", lambda *args, **kwargs: [{"n_bits": 8}])
    monkeypatch.setattr(jobs, "Outcome", SignalledOutcome)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    task = jobs.CellTask(tiny_path, None, FusionConfig(), HashConfig(), RunOptions(), ("unimodal",), 50)
    outcome = jobs.run_cell(task)
    assert outcome.rows == [{"n_bits": 8}] and outcome.stopped is None
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _held_at_start(queue) -> None:
    queue.put(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}))


def test_a_worker_starts_deaf_to_a_ctrl_c_and_the_parent_hears_it_after(monkeypatch):
    """A Ctrl-C reaches the whole process group: one landing as a worker starts (importing ucmfh, before its
    initializer ignores it) ended the worker with a traceback. Workers start with both signals held; the
    parent's handler hears a signal sent meanwhile, and its thread holds nothing after the start."""
    if not hasattr(signal, "pthread_sigmask"):
        pytest.skip("no signal masks on this platform")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    heard = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        with jobs._held():
            worker = context.Process(target=_held_at_start, args=(queue,))
            worker.start()
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert heard == [signal.SIGTERM]
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}
        assert queue.get(timeout=60) == [signal.SIGINT, signal.SIGTERM]
        worker.join(60)
    finally:
        signal.signal(signal.SIGTERM, before)


def finished_then_stopped(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker: the 16-bit cell finishes; the 8-bit cell then lets a signal
    escape its worker (one landing as its cell returned), once the 16-bit cell is done."""
    flag = os.path.join(os.environ["GRID_TEST_BARRIER"], "done")
    if task.hash_cfg.n_bits == 16:
        outcome = jobs.run_cell(task)
        open(flag, "w").close()
        return outcome
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.01)
    err = KeyboardInterrupt("interrupted by SIGTERM")
    err.signum = signal.SIGTERM
    raise err


def test_a_signal_escaping_a_worker_stops_its_cell_and_keeps_the_others_rows(tiny_path, tmp_path, monkeypatch):
    """A worker's interrupt that escaped its cell ended the grid with the worker's message, and the rows of a
    cell that had finished were never appended: the cell is said stopped, the others' rows kept."""
    monkeypatch.setattr(jobs, "run_cell", finished_then_stopped)
    monkeypatch.setenv("GRID_TEST_BARRIER", str(tmp_path))
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "8", "-b", "16",
                                       "--device", "cpu", "--out", str(tmp_path / "runs"), "--results",
                                       str(tmp_path / "r.jsonl"), "--table", str(tmp_path / "table"), "--jobs", "2"])
    assert result.exit_code == 143, result.output
    assert f"stopped {tiny_path} cca-itq seed 2023 8 bits: interrupted by SIGTERM" in result.output
    assert ("grid interrupted by SIGTERM: 1 of the 2 cells to run finished, 1 stopped (each says above what it "
            "kept); run the same command to continue") in result.output
    assert [json.loads(line)["n_bits"] for line in (tmp_path / "r.jsonl").read_text().splitlines()] == [16]


def damaged_two_tower_16_bits(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, where the two-tower 16-bit cell meets bad data."""
    def refuse(*args, **kwargs):
        raise ValueError(f"{task.data_path}: split 'train': damaged features")

    if (task.hash_cfg.method, task.hash_cfg.n_bits) == ("two-tower", 16):
        return _run_cell_with(jobs, "train_hash_stage", refuse, task)
    return jobs.run_cell(task)


def killed_16_bits(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker that is killed hard (the OOM killer) at the 16-bit cell."""
    if task.hash_cfg.n_bits == 16:
        time.sleep(0.5)  # the other cell under way
        os.kill(os.getpid(), signal.SIGKILL)
    return jobs.run_cell(task)


def test_a_worker_killed_hard_names_every_cell_it_ended(tiny_path, tmp_path, monkeypatch):
    """The pool breaks and every cell running in it ends: the error named the first one the wait returned (not
    always the one whose worker was killed) and the other cell ended without a line."""
    monkeypatch.setattr(jobs, "run_cell", killed_16_bits)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "two-tower",
                                       "--epochs", "20", "--set", "hash.hidden=64", "--device", "cpu", "--jobs", "2",
                                       "--out",
                                       str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"), "--table",
                                       str(tmp_path / "t")])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[-1] == ("Error: a worker process of the grid ended abruptly (killed, or out of memory), which ended "
                         "the cells running (each named above); run the same command to continue")
    started = [line.split("start ")[1] for line in lines if line.startswith("start ")]
    ended = [line for line in lines if line.startswith(("done ", "failed "))]
    assert len(started) == 2 and len(ended) == 2, result.output
    assert any(line.startswith("failed ") and "16 bits: a worker process of the grid ended abruptly" in line
               for line in ended), result.output


@pytest.mark.parametrize("workers", ["processes", "threads"])
def test_a_workers_error_ends_the_grid_in_one_line(tiny_path, tmp_path, monkeypatch, workers):
    if workers == "processes":
        monkeypatch.setattr(jobs, "run_cell", damaged_two_tower_16_bits)
    else:  # the threads share the module: the 16-bit cell alone meets bad data
        real = jobs.train_hash_stage

        def damaged_16_bits(data, fusion_cfg, hash_cfg, *args, **kwargs):
            if hash_cfg.n_bits == 16:
                raise ValueError(f"{tiny_path}: split 'train': damaged features")
            return real(data, fusion_cfg, hash_cfg, *args, **kwargs)

        monkeypatch.setattr(jobs, "train_hash_stage", damaged_16_bits)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "two-tower",
                                       "--epochs", "2", "--device", "cpu", "--jobs", "2", "--out", str(tmp_path / "runs"),
                                       "--results", str(tmp_path / "r.jsonl"), "--table", str(tmp_path / "table"),
                                       "--workers", workers])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == f"Error: {tiny_path}: split 'train': damaged features"
    lines = result.output.splitlines()
    started = sum(line.startswith("start ") for line in lines)
    ended = sum(line.startswith(("done ", "stopped ", "failed ")) for line in lines)
    assert ended == started >= 2  # the other worker ended its cell or stopped it: no cell left running
    assert not (tmp_path / "table.md").exists()


def _cut_short() -> ImportError:
    """What pybind11 makes of a module's initialisation that a signal's KeyboardInterrupt cut short."""
    try:
        try:
            raise KeyboardInterrupt("stopped")
        except KeyboardInterrupt as stop:
            raise ImportError("initialization failed") from stop
    except ImportError as err:
        return err


def test_a_stop_that_cut_an_import_short_is_a_stop_not_a_user_error(tiny_path, tmp_path, monkeypatch):
    """A grid's worker importing scikit-learn as Ctrl-C came (cca-itq's first cell in it) failed its cell with
    'initialization failed' and ended the grid as a user error, exit 2, instead of stopped, 130."""
    from ucmfh.app.errors import interrupt_behind

    cut = _cut_short()
    assert isinstance(interrupt_behind(cut), KeyboardInterrupt) and interrupt_behind(ImportError("x")) is None

    def cut_short(*args, **kwargs):
        raise _cut_short()

    from ucmfh.app import grid

    monkeypatch.setattr(jobs, "train_hash_stage", cut_short)
    monkeypatch.setattr(grid, "train_hash_stage", cut_short)
    for extra in (["--jobs", "2", "--workers", "threads"], []):
        result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "two-tower",
                                           "--epochs", "2", "--device", "cpu", "--out", str(tmp_path / "runs"),
                                           "--results", str(tmp_path / "r.jsonl"), "--table", str(tmp_path / "t"),
                                           *extra])
        assert result.exit_code == 130 and "initialization failed" not in result.output, (extra, result.output)


def test_a_signal_that_threads_cannot_act_on_before_the_last_cells_end_is_said(tiny_path, tmp_path, monkeypatch):
    """In threads a closed-form fit runs to its end: a SIGTERM as the last cells fitted was met by silence, then
    a grid that ended 0 as if none had come. It is said when it comes, and again when every cell has finished."""
    import signal
    import time

    real = jobs.train_hash_stage

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # to the grid's thread, which its handler tells the cells of
        time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(jobs, "train_hash_stage", signalled)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "cca-itq",
                                       "--device", "cpu", "--out", str(tmp_path / "runs"), "--jobs", "2", "--workers",
                                       "threads", "--results", str(tmp_path / "r.jsonl"), "--table",
                                       str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert "SIGTERM: stopping the running cells (in threads a closed-form fit or a scoring runs to its end first)" \
        in result.output
    assert "SIGTERM came as the last cells ran to their end: every cell finished" in result.output
    assert len(open(tmp_path / "r.jsonl").readlines()) == 2


@pytest.mark.parametrize("extra", [[], ["--jobs", "2", "--workers", "threads"]])
def test_rows_another_grid_appended_meanwhile_are_not_appended_again(tiny_path, tmp_path, monkeypatch, extra):
    """Two grids started together on one results file: the second found the first's checkpoint, scored it as
    reused and appended the same rows again (four runs, six rows)."""
    from ucmfh.app import grid
    from ucmfh.app.table import append_results

    results = tmp_path / "r.jsonl"
    real = jobs.train_hash_stage

    def beside(*args, **kwargs):  # the grid beside this one appends the cell's rows first
        rows = real(*args, **kwargs)
        append_results(results, rows)
        return rows

    monkeypatch.setattr(jobs, "train_hash_stage", beside)
    monkeypatch.setattr(grid, "train_hash_stage", beside)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "two-tower",
                                       "--epochs", "1", "--set", "hash.hidden=32", "--device", "cpu", "--out",
                                       str(tmp_path / "runs"), "--results", str(results), "--table",
                                       str(tmp_path / "t"), *extra])
    assert result.exit_code == 0, result.output
    assert len(results.read_text().splitlines()) == 2
    assert result.output.count("already (appended meanwhile by a grid beside this one)") == 2


def test_a_cell_left_alone_trains_with_the_threads_of_a_worker_of_the_jobs_asked_for(tiny_path, tmp_path):
    """A worker's threads were those of the run split between the cells left to run: a --jobs 2 grid resumed
    with one cell left (or grown by a seed) trained it with both threads where its neighbours had one each, and
    on the CPU the thread count can change a cell's rows (an audit's: ucmfh's MAP moved by 0.002). Each worker
    has the share of one of the jobs asked for, however many cells are left."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "8", "--jobs", "2",
                                           "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"),
                                           "--quiet"])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    assert {json.loads(line)["train_threads"] for line in (tmp_path / "r.jsonl").read_text().splitlines()} == {1}


def test_threads_without_jobs_are_refused(tiny_path, tmp_path):
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--workers", "threads", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        "Error: Invalid value for --workers: threads run the cells of --jobs N at once; with --jobs 1 they run one "
        "after another in this process: give --jobs N")
    assert not (tmp_path / "r").exists()


def test_jobs_and_torchrun_s_ranks_are_refused_together(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it (the command alone: no process group joined)
    grid = main.get_command(None, "grid")
    result = CliRunner().invoke(grid, ["-d", tiny_path, "--jobs", "2", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        "Error: Invalid value for '--jobs' / '-j': cells side by side and torchrun's ranks do not mix: use one or the "
        "other")
    assert not (tmp_path / "r").exists()


def test_jobs_below_one_are_refused(tiny_path, tmp_path):
    for jobs_asked in ("0", "-2"):
        result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--jobs", jobs_asked, "--out", str(tmp_path / "r")])
        assert result.exit_code == 2 and f"Invalid value for '--jobs' / '-j': {jobs_asked} is not in the range x>=1" \
            in result.output
    assert not (tmp_path / "r").exists()


def test_workers_spread_over_several_gpus_and_share_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for count, device, spread in ((4, "auto", 4), (4, "cuda", 4), (1, "cuda", 0), (4, "cuda:1", 0), (4, "cpu", 0)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        side = jobs.SideBySide(2, device, "r.jsonl", RunOptions(), ("unimodal",), 50, None)
        assert side.gpus() == spread, (count, device)


def test_two_threads_stopped_and_resumed_give_the_rows_of_one_in_its_order(tiny_path, tmp_path, one_process,
                                                                            monkeypatch):
    """--workers threads: the cells in threads of the grid's process. SIGTERM while both train stops each at its
    next step with its state saved (the grid passes it on: a thread hears no signal), nothing appended; the same
    command then ends with the rows of --jobs 1 (each cell's draws its own: ucmfh.run_draws), in its order."""
    from ucmfh import trainer

    torch.set_num_threads(2)  # each of the two threads: 1, as the baseline
    monkeypatch.setattr(trainer, "tqdm", SigtermFromAThread)
    stopped = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2", "--workers", "threads"))
    assert stopped.exit_code == 143, stopped.output
    for name, stage in (("ucmfh seed 2023 8 bits", "fusion"), ("two-tower seed 2023 8 bits", "two-tower 8 bits")):
        assert f"stopped {tiny_path} {name}: {stage} interrupted by SIGTERM at epoch 2/2, step 1/" in stopped.output
    assert stopped.output.count("training state saved to") == 2 and stopped.output.count("start ") == 2
    assert not (tmp_path / "r.jsonl").exists() and not signals._IN_THREADS
    assert "note: on the CPU the cells' steps take turns in threads" in stopped.output
    monkeypatch.undo()

    resumed = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2", "--workers", "threads"))
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.output and resumed.output.count("fusion encoder: training") == 1
    assert _rows(tmp_path) == _rows(one_process) and _table(tmp_path) == _table(one_process)


def test_a_worker_whose_grid_is_killed_hard_ends_too(tmp_path):
    """A grid killed hard (SIGKILL, the OOM killer) left its workers: re-parented, deaf to SIGTERM between cells,
    alive for ever, and holding the grid's output open (a '| tee' of it waited for ever). A worker now watches its
    grid's process and ends when it is gone."""
    child = ("import os, sys; grid = os.getppid(); sys.path.insert(0, sys.argv[1]); import ucmfh.app.jobs as jobs; "
             "jobs.ORPHAN_POLL_S = 0.1; print(os.getpid(), flush=True); jobs._end_with_parent(grid)")
    grid = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
            "time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", grid, child, str(ROOT)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def alive() -> bool:
        try:
            with open(f"/proc/{worker}/status") as status:
                return not any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive()


def test_a_worker_of_a_broken_pool_ends_once_its_cell_has_stopped():
    """From Python 3.12 a broken pool (a worker killed: the OOM killer) ends its other workers by SIGTERM alone and
    waits for them, holding its lock: a worker between cells ignores SIGTERM, and the grid hung for ever, deaf to
    Ctrl-C (an audit's, on 3.12.1 and 3.13.0; test_a_worker_killed_hard_names_every_cell_it_ended hung there). Told
    that its pool broke, a worker ends once no cell's work is under way in it, the stopped cell's state saved."""
    child = ("import os, sys, threading, time, types; sys.path.insert(0, sys.argv[1]); import ucmfh.app.jobs as jobs; "
             "jobs.ORPHAN_POLL_S = 0.05; jobs._IN_CELL[0] = True; broken = types.SimpleNamespace(value=1); "
             "threading.Thread(target=jobs._end_with_parent, args=(os.getppid(), broken), daemon=True).start(); "
             "time.sleep(0.5); print('alive while its cell stops', flush=True); jobs._IN_CELL[0] = False; "
             "time.sleep(60); print('still alive between cells', flush=True)")
    started = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", child, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert ended.returncode == 0 and ended.stdout == "alive while its cell stops\n", ended
    assert time.monotonic() - started < 30


def test_a_signal_as_the_grid_s_workers_shut_down_is_said(tiny_path, tmp_path, monkeypatch):
    """A SIGTERM after the last cell ended, as the grid waited for its workers to shut down, was heard and then
    forgotten: the grid ended 0 without a word of it (an audit's find, 'grid --jobs 2' signalled as it ended)."""
    import concurrent.futures as cf
    import signal
    import time

    real = cf.ThreadPoolExecutor.shutdown

    def shutdown(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # to the grid's handler, every cell having ended
        time.sleep(0.1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cf.ThreadPoolExecutor, "shutdown", shutdown)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "cca-itq",
                                       "--device", "cpu", "--out", str(tmp_path / "runs"), "--jobs", "2", "--workers",
                                       "threads", "--results", str(tmp_path / "r.jsonl"), "--table",
                                       str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert "SIGTERM came as the last cells ran to their end: every cell finished" in result.output
