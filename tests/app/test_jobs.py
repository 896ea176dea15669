"""``ucmfh grid --jobs N`` (:mod:`ucmfh.app.jobs`): cells side by side give the rows of one process, in
its order; an interrupted grid resumes to the same rows; a worker's error is one line."""
from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from click.testing import CliRunner

from ucmfh.app import jobs
from ucmfh.app.cli import main
from ucmfh.app.identity import RunOptions

# two methods (one with a fusion encoder its two code lengths share, one without) × two code lengths
GRID = ["-b", "8", "-b", "16", "--methods", "ucmfh,two-tower", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64",
        "--set", "hash.hidden=64", "--batch-size", "64", "--epochs", "2", "--device", "cpu"]
VARYING = {"time", "train_time_s", "checkpoint", "per_query"}  # the clock, and paths under each grid's --out


def _argv(tiny_path: str, folder: Path, *more: str) -> List[str]:
    return ["grid", "-d", tiny_path, *GRID, "--out", str(folder / "runs"), "--results", str(folder / "r.jsonl"),
            "--table", str(folder / "table"), *more]


def _rows(folder: Path) -> List[Dict[str, Any]]:
    return [{k: v for k, v in json.loads(line).items() if k not in VARYING}
            for line in (folder / "r.jsonl").read_text().splitlines()]


def _table(folder: Path) -> List[Dict[str, str]]:
    with open(folder / "table.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "train_time_s_mean"} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def one_process(tiny_path, tmp_path_factory) -> Path:
    """The grid run cell after cell in this process (--jobs 1): the rows every --jobs must give."""
    folder = tmp_path_factory.mktemp("jobs1")
    result = CliRunner().invoke(main, _argv(tiny_path, folder, "--quiet"))
    assert result.exit_code == 0, result.output
    return folder


def test_two_jobs_give_the_rows_of_one_in_its_order(tiny_path, tmp_path, one_process):
    result = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))
    assert result.exit_code == 0, result.output
    assert _rows(tmp_path) == _rows(one_process) and len(_rows(tmp_path)) == 2 * 2 + 2  # ucmfh: two protocols
    assert _table(tmp_path) == _table(one_process)
    lines = result.output.splitlines()
    for name in ("ucmfh seed 2023 8 bits", "ucmfh seed 2023 16 bits", "two-tower seed 2023 8 bits",
                 "two-tower seed 2023 16 bits"):
        assert sum(line.startswith("start ") and line.endswith(name) for line in lines) == 1
        assert sum(line.startswith("done  ") and f"{name}: " in line and line.endswith(" s") for line in lines) == 1
    # the two ucmfh cells share one fusion encoder: trained once, never by two workers at once
    assert result.output.count("fusion encoder: training") == 1
    assert result.output.count("fusion encoder: already trained, reused") == 1

    again = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))  # nothing left: no worker starts
    assert again.exit_code == 0 and again.output.count("skip") == 4 and "start" not in again.output


class _TermToGrid:
    """A progress bar that sends SIGTERM to the grid (the worker's parent) alone at the end of the first epoch,
    as a job scheduler would, and holds the worker there until the grid has passed the signal on to it."""

    def __init__(self, *args, **kwargs):
        self.n = kwargs.get("initial", 0)

    def update(self, k):
        self.n += k
        if self.n != 1:
            return
        training, got = signal.getsignal(signal.SIGTERM), []  # the training loop's: it stops at its next step

        def relay(signum, frame):
            got.append(signum)
            training(signum, frame)

        signal.signal(signal.SIGTERM, relay)
        os.kill(os.getppid(), signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)

    def set_postfix(self, **_):
        pass

    def close(self):
        pass


def sigterm_in_ucmfh_8_bits(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, with a SIGTERM to the grid at the end of the first
    epoch of the ucmfh 8-bit cell's first stage (its fusion encoder)."""
    from ucmfh import epochs

    real = epochs.tqdm
    if (task.hash_cfg.method, task.hash_cfg.n_bits) == ("ucmfh", 8):
        epochs.tqdm = _TermToGrid
    try:
        return jobs.run_cell(task)
    finally:
        epochs.tqdm = real


def damaged_two_tower_16_bits(task: jobs.CellTask) -> jobs.Outcome:
    """:func:`ucmfh.app.jobs.run_cell` in a worker, where the two-tower 16-bit cell meets bad data."""
    real = jobs.train_hash_stage

    def refuse(*args, **kwargs):
        raise ValueError(f"{task.data_path}: split 'train': damaged features")

    if (task.hash_cfg.method, task.hash_cfg.n_bits) == ("two-tower", 16):
        jobs.train_hash_stage = refuse
    try:
        return jobs.run_cell(task)
    finally:
        jobs.train_hash_stage = real


def test_an_interrupted_grid_of_two_jobs_resumes_to_the_rows_of_one(tiny_path, tmp_path, one_process, monkeypatch):
    """SIGTERM to the grid while a worker trains: the grid passes it on, every worker stops at a safe point,
    the finished cells' rows are kept and nothing else; the same command ends with the rows of a grid never
    stopped."""
    monkeypatch.setattr(jobs, "run_cell", sigterm_in_ucmfh_8_bits)  # what the workers are sent to run
    stopped = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))
    assert stopped.exit_code == 143, stopped.output
    assert (f"stopped {tiny_path} ucmfh seed 2023 8 bits: fusion interrupted by SIGTERM at epoch 2/2, step 1/7; "
            "training state saved to") in stopped.output
    assert "grid interrupted by SIGTERM" in stopped.output and "run the same command to continue" in stopped.output
    assert f"start {tiny_path} ucmfh seed 2023 16 bits" not in stopped.output  # no cell starts after the signal
    kept = _rows(tmp_path) if (tmp_path / "r.jsonl").exists() else []
    assert all(row in _rows(one_process) for row in kept) and not any(r["method"] == "ucmfh" for r in kept)
    monkeypatch.undo()

    resumed = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2"))
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.output and "fusion.state.pt" in resumed.output
    def order(row):
        return row["method"], row["n_bits"], row["protocol"]

    assert sorted(_rows(tmp_path), key=order) == sorted(_rows(one_process), key=order)
    assert _table(tmp_path) == _table(one_process)


def test_a_workers_error_ends_the_grid_in_one_line(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "run_cell", damaged_two_tower_16_bits)
    result = CliRunner().invoke(main, _argv(tiny_path, tmp_path, "--jobs", "2", "--protocol", "unimodal"))
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == f"Error: {tiny_path}: split 'train': damaged features"
    lines = result.output.splitlines()
    started = sum(line.startswith("start ") for line in lines)
    ended = sum(line.startswith(("done ", "stopped ", "failed ")) for line in lines)
    assert ended == started >= 2  # the other worker ended its cell or stopped it: no cell left running
    assert not (tmp_path / "table.md").exists()


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
