"""Runs you can trust: identity, safe results, per-length reporting, resume, clean errors (the app layer)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.app.runs import scores_line, summarize
from ucmfh.data.synthetic import make_synthetic
from ucmfh.data.writer import write_dataset
from ucmfh.files import append_jsonl, read_jsonl

from conftest import ROOT, TINY, dead_pid

TINY_ARGS = ["--n-query", "40", "--n-retrieval", "200", "--n-train", "120", "--d-img", "24", "--d-txt", "16",
             "--n-classes", "6"]
SMALL = ["--method", "ucmfh", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--set", "hash.hidden=64", "--batch-size", "32",
         "--device", "cpu", "--quiet"]


def _make(tmp_path: Path, name: str, seed: int = 0) -> str:
    path = tmp_path / f"{name}.h5"
    result = CliRunner().invoke(main, ["make-synthetic", str(path), *TINY_ARGS, "--seed", str(seed)])
    assert result.exit_code == 0, result.output
    return str(path)


def _train(*args: str) -> str:
    """train-hash with SMALL's settings, but a batch size of ``args``' own (an option is given once)."""
    small = list(SMALL)
    if "--batch-size" in args:
        del small[small.index("--batch-size"):small.index("--batch-size") + 2]
    result = CliRunner().invoke(main, ["train-hash", *small, *args])
    assert result.exit_code == 0, result.output
    return result.output


def _rows(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_files_with_one_name_never_share_a_run(tmp_path):
    """Two make-synthetic files (both named 'synthetic' inside) trained into one --out."""
    a, b = _make(tmp_path, "A", seed=1), _make(tmp_path, "B", seed=2)
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    _train("-d", a, "--out", out, "--results", str(results), "--epochs", "1", "-b", "16")
    [row_a] = [r for r in _rows(results) if r["protocol"] == "unimodal"]
    before = Path(row_a["checkpoint"]).read_bytes()
    log_b = _train("-d", b, "--out", out, "--results", str(results), "--epochs", "1", "-b", "16")
    assert "fusion encoder: training" in log_b and "reused" not in log_b  # B trains its own fusion stage
    [row_b] = [r for r in _rows(results)[2:] if r["protocol"] == "unimodal"]
    assert (row_a["dataset"], row_b["dataset"]) == ("A", "B")
    assert row_a["dataset_fingerprint"] != row_b["dataset_fingerprint"]
    assert row_a["dataset_path"] == os.path.realpath(a) and row_b["dataset_path"] == os.path.realpath(b)
    assert row_a["checkpoint"] != row_b["checkpoint"] and row_a["run"] != row_b["run"]
    assert Path(row_a["checkpoint"]).read_bytes() == before  # A's checkpoint untouched, its row still true


def test_a_dataset_file_renamed_or_copied_finds_its_runs(tmp_path):
    """A run's identity is the file's content and the settings, but its folder was found by the file's name: a
    copy (or the file renamed) trained the same run again, and demo.py's task 3 said 'train it first'."""
    a = _make(tmp_path, "A", seed=1)
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    _train("-d", a, "--out", out, "--results", str(results), "--epochs", "1", "-b", "16")
    copy = tmp_path / "copy.h5"
    copy.write_bytes(Path(a).read_bytes())
    log = _train("-d", str(copy), "--out", out, "--results", str(results), "--epochs", "1", "-b", "16")
    assert "reused" in log and "training" not in log, log
    first, again = [r for r in _rows(results) if r["protocol"] == "unimodal"]
    assert again["checkpoint"] == first["checkpoint"] and again["run"] == first["run"]
    assert (first["dataset"], again["dataset"]) == ("A", "copy")  # each row says the file it scored
    assert os.listdir(out) == [os.path.relpath(first["checkpoint"], out).split(os.sep)[0]]  # one folder: A's
    # a folder under the copy's name (another run of it: SEPS, another method) takes no run away from A's
    (Path(out) / f"copy-{first['dataset_fingerprint'][:8]}").mkdir()
    log = _train("-d", str(copy), "--out", out, "--results", str(results), "--epochs", "1", "-b", "16")
    assert "reused" in log and "training" not in log, log
    assert _rows(results)[-1]["checkpoint"] == first["checkpoint"]
    # a new run of the copy goes under the copy's name
    log = _train("-d", str(copy), "--out", out, "--results", str(results), "--epochs", "1", "-b", "16", "--seed", "5")
    assert f"copy-{first['dataset_fingerprint'][:8]}" in _rows(results)[-1]["checkpoint"], log


VARIANTS = [["--lr-fusion", "0"], ["--loss-param", "temperature=0.3"], ["--beta-schedule", "hashnet"],
            ["--modality-dropout", "0.2"], ["--batch-size", "40"], ["--amp", "bf16"], ["--method-param", "code_weight=1"]]


def test_every_setting_is_part_of_a_runs_identity(tmp_path, tiny_path):
    """Runs that differ in one setting write different checkpoints and say so in their rows."""
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    common = ["-d", tiny_path, "--out", out, "--results", str(results), "--epochs", "1", "-b", "8",
              "--protocol", "unimodal"]
    for option in [[], *VARIANTS]:
        _train(*common, *option)
    rows = _rows(results)
    assert len(rows) == 1 + len(VARIANTS)
    for key in ("checkpoint", "run"):
        assert len({r[key] for r in rows}) == len(rows), key
    assert len({json.dumps(r["settings"], sort_keys=True) for r in rows}) == len(rows)
    assert all(Path(r["checkpoint"]).exists() for r in rows)


def _append_many(path: str, tag: int) -> None:
    for i in range(200):
        append_jsonl(path, [{"writer": tag, "i": i, "pad": "x" * 300}])


def test_concurrent_appends_keep_every_row(tmp_path):
    """Two processes appending 200 rows each to one results file keep all 400."""
    path = str(tmp_path / "results.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, tag)) for tag in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = read_jsonl(path)
    assert len(rows) == 400
    assert sorted((r["writer"], r["i"]) for r in rows) == [(w, i) for w in (0, 1) for i in range(200)]
    # the writers' lock, left for the next one, is hidden: the user's folder lists their results file alone
    assert [name for name in os.listdir(tmp_path) if not name.startswith(".")] == ["results.jsonl"]


# one thread per process: the reference and the resumed run compute alike, and busy cores are not oversubscribed
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ucmfh", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=ENV)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ucmfh", *args], capture_output=True, text=True, cwd=ROOT, env=ENV)


def test_two_concurrent_runs_into_one_results_file(tmp_path, tiny_path):
    results = tmp_path / "r.jsonl"
    procs = [_cli("train-hash", *SMALL, "-d", tiny_path, "--out", str(tmp_path / "runs"), "--results", str(results),
                  "--epochs", "2", "-b", "8", "-b", "16", "--seed", str(seed)) for seed in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = _rows(results)
    assert sorted((r["seed"], r["n_bits"], r["protocol"]) for r in rows) == sorted(
        (s, b, p) for s in (1, 2) for b in (8, 16) for p in ("unimodal", "fused"))


def test_every_code_length_is_checked_before_training(tmp_path, tiny_path):
    """-b 16 -b 7 fails at once, before any training."""
    result = CliRunner().invoke(main, ["train-hash", *SMALL, "-d", tiny_path, "--out", str(tmp_path / "runs"),
                                       "--results", str(tmp_path / "r.jsonl"), "-b", "16", "-b", "7"])
    assert result.exit_code == 2 and "'--n-bits' / '-b': 7 is not in the range 8<=x<=256" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r.jsonl").exists()


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"finished before the condition held: {proc.communicate()}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.02)


def _weights(path: str) -> dict:
    return torch.load(path, weights_only=False)["state_dict"]


def test_sigint_keeps_finished_lengths_and_resume_finishes_the_rest(tmp_path, tiny_path, monkeypatch):
    """A Ctrl-C during -b 16 (after its 5th epoch) keeps -b 8's rows; --resume ends as an uninterrupted run does.
    In this process, at a known epoch: a signal to a real process at a moment it cannot know is
    test_sigkill_late_in_a_stage_then_resume_gives_identical_codes's, and tests/app/test_cli.py's."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    common = ["train-hash", *SMALL, "-d", tiny_path, "--epochs", "12", "-b", "8", "-b", "16",
              "--protocol", "unimodal", "--save-interval", "0"]
    ref = CliRunner().invoke(main, [*common, "--out", str(tmp_path / "ref"), "--results", str(tmp_path / "ref.jsonl")])
    assert ref.exit_code == 0, ref.output
    out, results = tmp_path / "runs", tmp_path / "r.jsonl"
    bars = [StopAfter(None), StopAfter(None), StopAfter(5)]  # the fusion encoder's, -b 8's, then -b 16's
    made = iter(bars)
    monkeypatch.setattr(trainer_module, "tqdm", lambda *a, **kw: next(made)(*a, **kw))
    stopped = CliRunner().invoke(main, [*common, "--out", str(out), "--results", str(results)])
    assert stopped.exit_code == 130, stopped.output
    assert [len(bar.starts) for bar in bars] == [1, 1, 1] and bars[2].epoch == 6  # stopped once -b 16 had 5 epochs
    assert "interrupted by SIGINT" in stopped.stderr and "--resume" in stopped.stderr
    assert [r["n_bits"] for r in _rows(results)] == [8]  # the finished length's result is kept
    monkeypatch.undo()
    refused = CliRunner().invoke(main, [*common, "--out", str(out), "--results", str(results)])  # before any work
    assert refused.exit_code == 2 and "interrupted run of these settings" in refused.output
    done = CliRunner().invoke(main, [*common, "--out", str(out), "--results", str(results), "--resume"])
    assert done.exit_code == 0, done.output
    assert "already trained" in done.stdout and "resuming" in done.stdout
    mine, theirs = _rows(results), _rows(tmp_path / "ref.jsonl")
    assert [(r["n_bits"], r["map_i2t"], r["map_t2i"]) for r in mine[1:]] == \
        [(r["n_bits"], r["map_i2t"], r["map_t2i"]) for r in theirs]
    assert not list(out.rglob("*.state.pt"))


def _saved_epoch(out: Path, stage: str) -> int:
    """The epoch of the training state a run has saved for ``stage`` (-1 while there is none)."""
    for path in out.rglob(f"{stage}.state.pt"):
        try:
            return torch.load(path, weights_only=False)["epoch"]
        except (OSError, RuntimeError, EOFError):  # replaced while read
            pass
    return -1


@pytest.mark.parametrize("save_interval", ["0", pytest.param("0.5", marks=pytest.mark.slow)])
def test_sigkill_late_in_a_stage_then_resume_gives_identical_codes(tmp_path, tiny_path, save_interval):
    """A run killed late in its hashing stage (once a seeded epoch of
    12-18 of 24 is saved; the process is stopped first, so no race decides where) continues with --resume
    to the same codes, MAP and best epoch (the best-so-far record restored, not only the weights: here the best
    epoch is the last, so that one forgotten is tests/methods/test_registry.py's to find). With a save interval
    in seconds, the state saved last may be older than the last epoch: resume from it still
    ends the same. The process killed is a real one; the uninterrupted run and the resume run in this one."""
    target = random.Random(31).randint(12, 18)
    print(f"killing once hash16.state.pt holds epoch {target}")
    common = ["train-hash", *SMALL, "-d", tiny_path, "--epochs", "24", "-b", "16", "--save-interval", save_interval,
              "--val-fraction", "0.2"]
    out, results = tmp_path / "runs", tmp_path / "r.jsonl"
    proc = _cli(*common, "--out", str(out), "--results", str(results))
    _wait_for(lambda: _saved_epoch(out, "hash16") >= target and proc.send_signal(signal.SIGSTOP) is None, proc)
    proc.kill()
    proc.wait()
    # a temporary file of a killed writer, as SIGKILL during a save leaves one
    [state] = list(out.rglob("*.state.pt"))
    stale = state.parent / f".{state.name}.tmp{dead_pid()}"
    stale.write_bytes(b"half a file")
    refused = CliRunner().invoke(main, [*common, "--out", str(out), "--results", str(results)])  # no --resume: …
    assert refused.exit_code == 2 and not stale.exists()  # … refused, but the killed run's temporary file is gone
    done = CliRunner().invoke(main, [*common, "--out", str(out), "--results", str(results), "--resume"])
    assert done.exit_code == 0, done.output
    ref = CliRunner().invoke(main, [*common, "--out", str(tmp_path / "ref"), "--results", str(tmp_path / "ref.jsonl")])
    assert ref.exit_code == 0, ref.output
    mine, theirs = _rows(results), _rows(tmp_path / "ref.jsonl")
    assert [(r["protocol"], r["map_i2t"], r["map_t2i"], r["best_epoch"]) for r in mine] == \
        [(r["protocol"], r["map_i2t"], r["map_t2i"], r["best_epoch"]) for r in theirs]
    assert 1 < theirs[0]["best_epoch"]  # the record had moved before the kill, or the test shows nothing
    a, b = _weights(mine[0]["checkpoint"]), _weights(theirs[0]["checkpoint"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not stale.exists() and not list(out.rglob(".*.tmp*")) and not list(out.rglob("*.state.pt"))


@pytest.mark.parametrize("device, message", [
    ("cuda", "torch sees no CUDA GPU"), ("foo", "device 'foo': unknown"),
])
def test_bad_device_is_one_line_on_both_front_doors(tmp_path, tiny_path, device, message):
    """--device cuda without a GPU and --device foo, from ucmfh and demo.py."""
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--device", device])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    demo = subprocess.run([sys.executable, str(ROOT / "demo.py"), "--dataset", tiny_path, "--device", device,
                           "--out", str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert demo.returncode == 2 and message in demo.stderr and "Traceback" not in demo.stderr
    assert len(demo.stderr.strip().splitlines()) == 1


def test_encode_refuses_to_overwrite_and_epochs_must_be_positive(tmp_path, tiny_path):
    """encode -o over an existing file needs --overwrite; --epochs 0 is refused."""
    results = tmp_path / "r.jsonl"
    _train("-d", tiny_path, "--out", str(tmp_path / "runs"), "--results", str(results), "--epochs", "1", "-b", "8")
    checkpoint = _rows(results)[0]["checkpoint"]
    out = tmp_path / "codes.h5"
    out.write_bytes(b"precious")
    runner = CliRunner()
    result = runner.invoke(main, ["encode", "-d", tiny_path, "-c", checkpoint, "-o", str(out), "--quiet"])
    assert result.exit_code == 2 and "exists" in result.output and "--overwrite" in result.output
    assert "overwrite=True" not in result.output and out.read_bytes() == b"precious"
    result = runner.invoke(main, ["encode", "-d", tiny_path, "-c", checkpoint, "-o", str(out), "--quiet",
                                  "--overwrite"])
    assert result.exit_code == 0 and out.read_bytes() != b"precious"
    # a leak-free method's codes have no fused view: refused, as evaluate refuses it (they were written, labelled fused)
    leak_free = runner.invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8", "--out",
                                     str(tmp_path / "runs"), "--results", str(tmp_path / "cca.jsonl"), "--quiet"])
    assert leak_free.exit_code == 0, leak_free.output
    result = runner.invoke(main, ["encode", "-d", tiny_path, "-c", _rows(tmp_path / "cca.jsonl")[0]["checkpoint"], "-o",
                                  str(tmp_path / "f.h5"), "--quiet", "--protocol", "fused"])
    assert result.exit_code == 2 and "Invalid value for --protocol: method 'cca-itq' is leak-free" in result.output
    assert not (tmp_path / "f.h5").exists()
    # without -d: the file the checkpoint was trained on (the default 'synthetic' made data/synthetic.h5, 103 MB,
    # then failed on its widths); another file's widths are refused naming that file
    plain = runner.invoke(main, ["encode", "-c", checkpoint, "-o", str(tmp_path / "own.h5"), "--quiet"])
    assert plain.exit_code == 0 and f"dataset: {tiny_path}" in plain.output, plain.output
    wide = tmp_path / "wide.h5"
    make_synthetic(wide, dataclasses.replace(TINY, d_img=TINY.d_img + 1))
    other = runner.invoke(main, ["encode", "-c", checkpoint, "-d", str(wide), "-o", str(tmp_path / "w.h5"), "--quiet"])
    assert other.exit_code == 2 and other.output.endswith(f"was asked for by {wide}\n"), other.output
    # the recorded file replaced by another since: refused, not encoded in its place
    moved = tmp_path / "moved.h5"
    make_synthetic(moved, TINY)
    trained = runner.invoke(main, ["train-hash", "-d", str(moved), "--method", "cca-itq", "-b", "8", "--out",
                                   str(tmp_path / "runs2"), "--results", str(tmp_path / "m.jsonl"), "--quiet"])
    assert trained.exit_code == 0, trained.output
    make_synthetic(moved, dataclasses.replace(TINY, seed=TINY.seed + 1), overwrite=True)
    changed = runner.invoke(main, ["encode", "-c", _rows(tmp_path / "m.jsonl")[0]["checkpoint"], "-o",
                                   str(tmp_path / "m.h5"), "--quiet"])
    assert changed.exit_code == 2 and f"{moved}, the dataset it was trained on, has changed since" in changed.output
    # evaluate -c without -d: the same file, not a synthetic set made for it (103 MB, then refused for its widths)
    scored = runner.invoke(main, ["evaluate", "-c", checkpoint, "--results", "", "--quiet"])
    assert scored.exit_code == 0 and f"dataset: {tiny_path}" in scored.output, scored.output
    changed = runner.invoke(main, ["evaluate", "-c", _rows(tmp_path / "m.jsonl")[0]["checkpoint"], "--results", ""])
    assert changed.exit_code == 2 and "has changed since (its content is not the one trained on): give the one to " \
                                      "score with -d" in changed.output, changed.output
    result = runner.invoke(main, ["train-hash", "-d", tiny_path, "--epochs", "0"])
    assert result.exit_code == 2 and "--epochs" in result.output and "Traceback" not in result.output
    result = runner.invoke(main, ["train-hash", "-d", tiny_path, "--set", "hash.epochs=0"])
    assert result.exit_code == 2 and "epochs must be >= 1, got 0" in result.output


def test_runs_summarises_over_seeds(tmp_path):
    rows = []
    for seed, (i2t, t2i) in zip((1, 2, 3), ((0.5, 0.6), (0.7, 0.8), (0.6, 0.7))):
        settings = {"fusion": {"seed": seed, "epochs": 5}, "hash": {"seed": seed, "n_bits": 16}}
        rows.append({"dataset": "d", "dataset_fingerprint": "f", "task": "hashing", "method": "ucmfh",
                     "loss": "original", "n_bits": 16, "protocol": "unimodal", "k": 50, "seed": seed,
                     "run": f"r{seed}", "settings": settings, "map_i2t": i2t, "map_t2i": t2i})
    rows.append({**rows[0], "map_i2t": 0.5, "source": "evaluate"})  # the same run scored again: one measurement
    other = {"fusion": {"seed": 1, "epochs": 9}, "hash": {"seed": 1, "n_bits": 16}}
    rows.append({**rows[0], "run": "r9", "settings": other, "map_i2t": 0.9})
    path = tmp_path / "results.jsonl"
    append_jsonl(path, rows)
    groups = summarize(read_jsonl(path))
    assert [g["n_seeds"] for g in groups] in ([3, 1], [1, 3])
    [three] = [g for g in groups if g["n_seeds"] == 3]
    assert three["map_i2t_mean"] == pytest.approx(0.6) and three["map_i2t_std"] == pytest.approx(0.1)
    result = CliRunner().invoke(main, ["runs", "--results", str(path), "-d", "d", "-b", "16"])
    assert result.exit_code == 0, result.output
    assert "0.6000 ± 0.1000" in result.output and "fusion.epochs=9" in result.output
    result = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2 and "no such results file" in result.output
    result = CliRunner().invoke(main, ["runs", "--results", ""])  # said "Error: : no such results file"
    assert result.exit_code == 2 and "Error: --results '': an empty path" in result.output
    # a selection that matches nothing: what the file holds, so the right filter can be given
    result = CliRunner().invoke(main, ["runs", "--results", str(path), "-b", "64", "--seed", "9"])
    assert result.exit_code == 0 and result.stdout == "" and result.stderr.strip() == (
        f"no runs match the selection; {path} holds: tasks hashing; datasets d; methods ucmfh; code lengths 16; "
        "protocols unimodal; seeds 1, 2, 3"), result.output
    # rows of one cut-off alone, as the training commands' -k scored them (there was no -k filter; an audit's)
    append_jsonl(tmp_path / "ks.jsonl", [*rows[:3], *({**row, "k": 100, "map_i2t": 0.1} for row in rows[:3])])
    for k, mean in (("50", "0.6000 ± 0.1000"), ("100", "0.1000 ± 0.0000")):
        cut = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "ks.jsonl"), "-k", k])
        assert cut.exit_code == 0 and mean in cut.output and f"{mean}" in cut.output, cut.output
        assert len([g for g in map(json.loads, CliRunner().invoke(
            main, ["runs", "--results", str(tmp_path / "ks.jsonl"), "-k", k, "--json"]).stdout.splitlines())]) == 1
    # --protocol is repeatable, as every other filter (it took one)
    append_jsonl(tmp_path / "both.jsonl",
                 [*rows[:3], *({**row, "protocol": "fused", "map_i2t": 0.2} for row in rows[:3])])
    for protocols, n_groups in (([], 2), (["fused"], 1), (["fused", "unimodal"], 2)):
        found = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "both.jsonl"), "--json",
                                          *(f"--protocol={p}" for p in protocols)])
        assert found.exit_code == 0 and len(found.stdout.splitlines()) == n_groups, found.output
    # ... with --json too: it printed nothing at all; stdout keeps JSON rows (none), the note goes to stderr
    quiet = CliRunner().invoke(main, ["runs", "--results", str(path), "-b", "64", "--json"])
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr.startswith("no runs match the selection; ")
    # grids run side by side keep a file each: the files are read as one, a seed's group spans them
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    append_jsonl(first, rows[:2])
    append_jsonl(second, rows[2:])
    both = CliRunner().invoke(main, ["runs", "--results", str(first), "--results", str(second), "-d", "d", "--json"])
    assert both.exit_code == 0, both.output
    read = sorted((json.loads(line) for line in both.output.splitlines()), key=lambda g: g["n_seeds"])
    assert [g["n_seeds"] for g in read] == [1, 3] and read[1]["map_i2t_std"] == pytest.approx(0.1)
    assert read[0]["map_i2t_std"] is None and read[0]["map_t2i_std"] is None  # one seed: no spread, not 0.0
    missing = CliRunner().invoke(main, ["runs", "--results", str(first), "--results", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and f"{tmp_path / 'none.jsonl'}: no such results file" in missing.output
    # a run two files score differently (trained apart, e.g. with other thread counts): said, the last file's used
    (tmp_path / "c.jsonl").write_text(json.dumps({**rows[1], "map_i2t": 0.99}) + "\n" + json.dumps(rows[2]) + "\n")
    clash = CliRunner().invoke(main, ["runs", "--results", str(first), "--results", str(tmp_path / "c.jsonl"),
                                      "-d", "d", "--json"])
    assert clash.exit_code == 0 and clash.stderr.splitlines() == [
        f"warning: {tmp_path / 'c.jsonl'}: 1 row(s) score runs {first} scored too, with other scores (trained apart: "
        "on another machine, or with another number of CPU threads, a row's train_threads); "
        f"{tmp_path / 'c.jsonl'}'s, read last, are used"], clash.stderr
    assert "warning" not in both.stderr  # the same run in two files with one score: no clash
    # within one file too (two --out folders share runs/results.jsonl: a run trained again with other threads)
    (tmp_path / "one.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rows[1], {**rows[1], "map_i2t": 0.99},
                                                                            {**rows[2], "map_i2t_expected": 0.5})))
    within = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "one.jsonl"), "-d", "d", "--json"])
    assert within.exit_code == 0 and within.stderr.splitlines() == [
        f"warning: {tmp_path / 'one.jsonl'}: 1 row(s) score runs scored earlier in the file, with other scores "
        "(trained apart: on another machine, or with another number of CPU threads, a row's train_threads); the "
        "later rows are used"], within.stderr  # a figure one row adds (a newer ucmfh's tie-aware twin): no clash


@pytest.mark.parametrize("value, expected", [("0", "torch"), ("1", "auto")])
def test_the_app_passes_ucmfh_native_down_to_the_library(monkeypatch, value, expected):
    """The library reads no environment variable: the ucmfh command reads UCMFH_NATIVE and sets the backend."""
    from ucmfh.metrics import set_backend

    monkeypatch.setenv("UCMFH_NATIVE", value)
    previous = set_backend("auto" if expected == "torch" else "torch")
    try:
        assert CliRunner().invoke(main, ["losses"]).exit_code == 0
        assert set_backend("auto") == expected
    finally:
        set_backend(previous)


def test_an_environment_variable_of_ours_set_to_nothing_it_can_be_is_one_line(monkeypatch, tmp_path):
    """UCMFH_NATIVE=maybe was taken as 1, silently; UCMFH_DATA_DIR set empty was '--data-dir: an empty path' where
    no --data-dir was given: it is unset."""
    monkeypatch.setenv("UCMFH_NATIVE", "maybe")
    result = CliRunner().invoke(main, ["losses"])
    assert result.exit_code == 2 and result.output == \
        "Error: UCMFH_NATIVE=maybe: give 0 (rank on the torch path) or 1 (the compiled kernels where they serve, " \
        "the default)\n"
    monkeypatch.delenv("UCMFH_NATIVE")
    monkeypatch.setenv("UCMFH_DATA_DIR", "")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["train-hash", "-d", "wiki"])
    assert result.exit_code == 2 and "data/wiki.h5: no such dataset file" in result.output, result.output


def _row(**kw) -> dict:
    base = {"dataset": "d", "dataset_fingerprint": "f", "task": "hashing", "method": "two-tower", "loss": "infonce",
            "n_bits": 16, "protocol": "unimodal", "k": 50, "seed": 1, "run": "r1", "checkpoint": "runs/a/hash16.pt",
            "settings": {"fusion": None, "hash": {"seed": 1, "n_bits": 16, "hidden": 8}},
            "map_i2t": 0.5, "map_t2i": 0.6}
    return {**base, **kw}


def test_runs_summarises_every_row_shape_readably(tmp_path):
    """Rows of every command (training, fusion, codes files, SEPS, re-ranking without a seed) in one
    results file summarise; the table keeps its columns apart and says '-' for what a row lacks."""
    caption = {"database": "test", "recall_i2t": {"1": 10.0, "5": 20.0, "10": 30.0},
               "recall_t2i": {"1": 5.0, "5": 15.0, "10": 25.0}, "rsum": 105.0}
    rerank = {"task": "rerank", "method": "two-tower", "n_bits": 16, "protocol": "unimodal", "dataset": "d",
              "hash_checkpoint": "runs/a/hash16.pt", "hash_settings": {"seed": 1, "n_bits": 16}, **caption}
    rows = [
        _row(), _row(seed=2, run="r2", checkpoint="runs/b/hash16.pt", map_i2t=0.7,
                     settings={"fusion": None, "hash": {"seed": 2, "n_bits": 16, "hidden": 8}}),
        _row(task="fusion", method="ucmfh", loss="original", n_bits=None, run="f1", checkpoint="runs/f/fusion.pt",
             settings={"fusion": {"seed": 1}, "hash": None}),
        _row(method="cca-itq", loss=None, run="c1", checkpoint="runs/c/hash16.pt", **caption),
        {"task": "codes", "codes": "codes.h5", "dataset": "d", "protocol": "unimodal", "loss": "-", "n_bits": 16,
         "k": 50, "map_i2t": 0.4, "map_t2i": 0.3},
        {"task": "seps", "stage": "seps-full", "candidates": None, "dataset": "d", "protocol": "unimodal", "seed": 7,
         "run": "s1", "seps_settings": {"seed": 7}, **caption},
        {**rerank, "stage": "hamming", "candidates": 100},
        {**rerank, "stage": "cosine-rerank", "candidates": 100, "rsum": 120.0},
        {**rerank, "stage": "seps-rerank", "candidates": 100, "seed": 7, "seps_settings": {"seed": 7}, "rsum": 130.0},
    ]
    path = tmp_path / "r.jsonl"
    append_jsonl(path, rows)
    result = CliRunner().invoke(main, ["runs", "--results", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = lines[0].split()
    assert header[:5] == ["dataset", "task", "method", "loss", "bits"] and "stage" in header
    table = [line.split() for line in lines[1:len(rows)]]  # one line per group: the two seeds are one
    assert lines[len(rows)].startswith("mean ± sample standard deviation")
    assert len({tuple(line[1:3]) for line in table}) == 6 and "None" not in result.output
    [two_tower] = [line for line in table if line[2] == "two-tower" and line[1] == "hashing"]
    assert two_tower[3] == "infonce" and "0.6000 ± 0.1414" in " ".join(two_tower)
    [cca] = [line for line in table if line[2] == "cca-itq"]
    assert cca[3] == "-" and "±" not in " ".join(cca)  # no loss of its own; one seed: its mean alone
    assert header[header.index("seeds") + 1:header.index("seeds") + 5] == ["R@1", "I->T", "R@1", "T->I"]
    assert cca[cca.index("test") + 3:cca.index("test") + 5] == ["10.0", "5.0"]  # a caption set's headline: R@1
    stages = [" ".join(line) for line in table if line[1] == "rerank"]
    assert [s for s in stages if "hamming m=100" in s] and [s for s in stages if "seps-rerank m=100" in s]
    legend = result.output.split("settings (each key's values of what varies among the keys of its method and "
                                  "stages; '--method METHOD@KEY' keeps one, 'ucmfh compare METHOD@KEY METHOD@KEY' "
                                  "pairs two):\n")[1].splitlines()
    assert "fusion." not in " ".join(legend)  # a fusion row is not compared field by field with hashing rows
    assert "  " + next(g for g in summarize(rows) if g["task"] == "fusion")["settings_key"] + \
        ": the only settings of ucmfh with stages fusion" in legend
    groups = summarize(read_jsonl(path))
    assert {g["stage"] for g in groups} == {None, "seps-full", "hamming m=100", "cosine-rerank m=100",
                                             "seps-rerank m=100"}
    one = CliRunner().invoke(main, ["runs", "--results", str(path), "--method", "cca-itq"])  # one key: said too
    key = next(g for g in groups if g["method"] == "cca-itq")["settings_key"]
    assert one.exit_code == 0 and f"settings {key}: the settings every row shares" in one.output, one.output


def test_tables_keep_their_columns_under_a_chinese_dataset_name(tmp_path):
    """A dataset named in Chinese (a file 数据集.h5) takes two terminal columns a character: counted by ``len``,
    every column after it slid left on its lines; ``runs``'s table and a command's result table keep them."""
    from ucmfh.app.table import format_table

    def task_columns(lines: List[str]) -> set:  # where the second column begins, in terminal columns
        before = [line[:line.index("task" if line.startswith("dataset") else "hashing")] for line in lines]
        return {sum(2 if "\u4e00" <= c <= "\u9fff" else 1 for c in text) for text in before}  # CJK: two each

    rows = [_row(dataset="数据集"), _row(dataset="wiki", dataset_fingerprint="g", run="r2")]
    path = tmp_path / "r.jsonl"
    append_jsonl(path, rows)
    result = CliRunner().invoke(main, ["runs", "--results", str(path)])
    assert result.exit_code == 0, result.output
    assert len(task_columns(result.output.splitlines()[:3])) == 1, result.output
    table = format_table(rows)
    assert len(task_columns(table.splitlines()[:3])) == 1, table


def test_a_finished_cell_says_its_scores_in_a_line_tie_aware_first():
    """What a grid prints under each finished cell: MAP@k of a labelled set, R@1 and rSum of each database of
    a caption set, the tie-aware twin where a row has it."""
    labelled = [{"protocol": "unimodal", "k": 50, "map_i2t": 0.81234, "map_t2i": 0.75, "map_i2t_expected": 0.8},
                {"protocol": "fused", "k": 50, "map_i2t": 0.9, "map_t2i": 0.85}]
    assert scores_line(labelled) == "unimodal: MAP@50 0.8000 / 0.7500; fused: MAP@50 0.9000 / 0.8500"
    recall = {"recall_i2t": {"1": 16.64, "5": 40.0, "10": 52.0}, "recall_t2i": {"1": 13.9, "5": 35.0, "10": 48.0},
              "rsum": 205.5}
    captions = [{"protocol": "unimodal", "database": "test", "k": 50, **recall,
                 "recall_i2t_expected": {"1": 16.6, "5": 40.0, "10": 52.0}, "rsum_expected": 205.46},
                {"protocol": "unimodal", "database": "collection", "k": 50, **recall}]
    assert scores_line(captions) == ("unimodal test: R@1 16.6 / 13.9 (rSum 205.5); "
                                     "unimodal collection: R@1 16.6 / 13.9 (rSum 205.5)")


def test_each_figure_of_a_group_is_read_from_where_rows_hold_it():
    """A group's means of R@K (from the recall dicts by rank), of tie-aware twins and of the real-valued outputs'
    scores (``real_valued``), each over the group's rows; a figure not every row has is left out."""
    recall = lambda top: {"1": top, "5": top + 10, "10": top + 20}  # noqa: E731
    rows = [_row(run=f"r{seed}", seed=seed, database="test", recall_i2t=recall(10.0 * seed),
                 recall_i2t_expected=recall(10.0 * seed - 1), recall_t2i=recall(5.0), rsum=100.0 + seed,
                 real_valued={"map_i2t": 0.1 * seed, "recall_t2i": recall(2.0 * seed)},
                 **({"map_t2i_expected": 0.3} if seed == 1 else {})) for seed in (1, 2)]
    [entry] = summarize(rows)
    assert entry["r1_i2t_mean"] == 15.0 and entry["r5_i2t_mean"] == 25.0 and entry["r10_t2i_mean"] == 25.0
    assert entry["r1_i2t_expected_mean"] == 14.0 and entry["rsum_mean"] == 101.5
    assert entry["real_map_i2t_mean"] == pytest.approx(0.15) and entry["real_r5_t2i_mean"] == 13.0
    assert entry["map_i2t_mean"] == 0.5 and "map_t2i_expected_mean" not in entry  # one row of two has it
    assert "real_map_t2i_mean" not in entry and "r1_t2i_expected_mean" not in entry


def test_a_row_with_a_value_no_command_writes_is_skipped_and_said(tmp_path):
    """A row edited by hand or damaged (a score 'abc' or null, settings that are a string) was a traceback in
    'ucmfh runs' (TypeError, KeyError, AttributeError); it is skipped with one warning naming it, and the
    others are summarised."""
    path = tmp_path / "r.jsonl"
    append_jsonl(path, [_row(map_i2t="abc"), _row(run="r2", map_t2i=None), _row(run="r3", settings="x"),
                        _row(run="r4", recall_i2t={"1": "a"}), _row(run="r6", seed=3, map_i2t=float("nan")),
                        _row(run="r7", seed=4, real_valued={"map_i2t": "0.27"}),  # were tracebacks
                        _row(run="r8", seed=5, real_valued={"map_i2t": float("nan")}),
                        _row(run="r9", seed=6, real_valued=[1, 2]), _row(run="r5", seed=2)])
    result = CliRunner().invoke(main, ["runs", "--results", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}: 8 row(s) with a value no ucmfh command writes (first: map_i2t='abc'); skipped" in \
        result.stderr
    [group] = [json.loads(line) for line in result.stdout.splitlines()]
    assert group["seeds"] == [2]
    # an older ucmfh's 'rerank -m 5': its R@10 read from a list of 5 (today's refuses -m below 10)
    from ucmfh.app.runs import row_problem

    recall = {"1": 2.0, "5": 14.0, "10": 14.0}
    assert row_problem({"candidates": 5, "recall_i2t": recall}) == \
        "candidates=5, an R@10 read from a list of 5 (an older ucmfh's rerank -m 5)"
    assert row_problem({"candidates": 10, "recall_i2t": recall}) is None
    assert row_problem({"candidates": None, "recall_i2t": recall}) is None  # SEPS over every pair
    # random codes' R@K, by rank as every recall (they were numbers alone: any random_ score)
    assert row_problem({"random_recall_i2t": recall, "random_rsum": 3.0}) is None
    assert row_problem({"random_recall_t2i": {"1": "a"}}) == "random_recall_t2i={'1': 'a'}"
    assert row_problem({"random_map_i2t": None}) == "random_map_i2t=None"


def test_a_figure_some_seeds_lack_is_left_out_not_taken_over_the_others():
    """A group of two seeds, one row of an older version without tie-aware twins: the headline was the one newer
    row's twin, shown as '± 0.0000' over '2 seeds'; every figure of an entry is over all its rows."""
    new, old = _row(map_i2t_expected=0.45, map_t2i_expected=0.55), _row(run="r2", seed=2, map_i2t=0.7)
    [group] = summarize([new, old])
    assert group["n_seeds"] == 2 and "map_i2t_expected_mean" not in group
    assert group["map_i2t_mean"] == pytest.approx(0.6)


def test_a_codes_row_of_a_method_without_a_loss_of_its_own_says_null_as_its_training_rows_do():
    """Codes rows said loss '-' where cca-itq's training rows say null: 'ucmfh runs --loss -' kept the codes rows of
    such a method alone."""
    from ucmfh.metrics.report import codes_file_row

    metrics = {"settings": {"k": 50, "n_bits": 16, "path": "c.h5", "attrs": {"loss": "-", "method": "cca-itq"}},
               "i2t": {"map@50": 0.3}, "t2i": {"map@50": 0.4}}
    assert codes_file_row(metrics)["loss"] is None
    metrics["settings"]["attrs"]["loss"] = "infonce"
    assert codes_file_row(metrics)["loss"] == "infonce"


def test_two_dataset_files_of_one_name_are_told_apart_in_the_table(tmp_path):
    """Two files named wiki (one edited): two groups, which the table showed as two identical 'wiki' lines."""
    path = tmp_path / "r.jsonl"
    append_jsonl(path, [_row(dataset="wiki", dataset_fingerprint="aaaaaaaa11"),
                        _row(dataset="wiki", dataset_fingerprint="bbbbbbbb22", run="r2", map_i2t=0.51),
                        _row(dataset="other", dataset_fingerprint="cccccccc33", run="r3")])
    result = CliRunner().invoke(main, ["runs", "--results", str(path)])
    assert result.exit_code == 0, result.output
    names = [line.split("  ")[0] for line in result.output.splitlines()[1:4]]
    assert names == ["other", "wiki [aaaaaaaa]", "wiki [bbbbbbbb]"], result.output
    assert "dataset [fingerprint]: dataset files of one name and other contents" in result.output


def test_runs_names_one_checkpoint_or_says_why_not(tmp_path):
    """A stable way to name a run's checkpoint, whatever else was trained since (no glob)."""
    path = tmp_path / "r.jsonl"
    append_jsonl(path, [_row(), _row(seed=2, run="r2", checkpoint="runs/b/hash16.pt")])
    runner = CliRunner()
    one = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--seed", "2"])
    assert one.exit_code == 0 and one.output == "runs/b/hash16.pt\n"
    two = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "-d", "d"])
    assert two.exit_code == 2 and two.output.strip().splitlines() == [
        f"Error: {path}: 2 checkpoints match (runs/a/hash16.pt, runs/b/hash16.pt); "
        "name one run with -d, --task, --method, --loss, -b and --seed"]
    # one file named two ways (a training row's relative path, 'evaluate -c''s absolute one) is one checkpoint
    (tmp_path / "runs" / "b").mkdir(parents=True)
    (tmp_path / "runs" / "b" / "hash16.pt").write_bytes(b"")
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        both = tmp_path / "both.jsonl"
        append_jsonl(both, [_row(seed=2, run="r2", checkpoint="runs/b/hash16.pt"),
                            _row(seed=2, run="r2", checkpoint=str(tmp_path / "runs/b/hash16.pt"), source="evaluate")])
        one = runner.invoke(main, ["runs", "--results", str(both), "--checkpoint", "--seed", "2"])
    finally:
        os.chdir(cwd)
    assert one.exit_code == 0 and one.output == "runs/b/hash16.pt\n", one.output
    none = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--seed", "3"])
    assert none.exit_code == 2 and none.output == (
        f"Error: {path}: no run with a checkpoint matches ({path} holds: tasks hashing; datasets d; methods two-tower; "
        "code lengths 16; protocols unimodal; seeds 1, 2); name one run with -d, --task, --method, --loss, -b and "
        "--seed\n")
    # -d as the path a run was given matches the runs of that file
    data = tmp_path / "data" / "d.h5"
    append_jsonl(path, [_row(seed=3, run="r3", checkpoint="runs/c/hash16.pt", dataset_path=str(data))])
    by_path = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "-d",
                                   os.path.relpath(data), "--seed", "3"])
    assert by_path.exit_code == 0 and by_path.output == "runs/c/hash16.pt\n"
    append_jsonl(path, [{"task": "seps", "dataset": "d", "seed": 2, "seps_checkpoint": "runs/s/seps.pt"},
                        {"task": "rerank", "dataset": "d", "seps_checkpoint": "runs/s/seps.pt", "seed": 2}])
    seps = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--task", "seps"])
    assert seps.exit_code == 0 and seps.output == "runs/s/seps.pt\n"
    # what SEPS rows lack (a method, a code length, a protocol) is not said as 'None'
    none = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--seed", "9"])
    assert none.exit_code == 2 and "methods two-tower; code lengths 16; protocols unimodal; seeds 1, 2, 3)" in \
        none.output and "None" not in none.output, none.output


def test_runs_of_two_settings_are_told_apart_by_a_settings_key(tmp_path):
    """Two runs of one method, dataset, length and seed that differ in a setting: --checkpoint names their
    settings keys and how to pick one, and --method METHOD@KEY (or @STAGE.NAME=VALUE, as compare's) picks it."""
    from ucmfh.app.runs import settings_key

    path = tmp_path / "r.jsonl"
    wide = _row(run="r2", checkpoint="runs/b/hash16.pt", settings={"fusion": None, "hash": {"seed": 1, "n_bits": 16,
                                                                                             "hidden": 64}})
    append_jsonl(path, [_row(), wide, _row(method="cca-itq", loss=None, run="r3", checkpoint="runs/c/hash16.pt")])
    narrow_key, wide_key = settings_key(_row())[:6], settings_key(wide)[:6]
    runner = CliRunner()
    both = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--method", "two-tower"])
    first, second = sorted([f"two-tower@{narrow_key}", f"two-tower@{wide_key}"])
    assert both.exit_code == 2 and both.output == (
        f"Error: {path}: 2 checkpoints match (runs/a/hash16.pt, runs/b/hash16.pt), of settings {first}, {second}; "
        f"name one with --method {first} (and -d, -b, --seed)\n")
    for method, expected in ((f"two-tower@{wide_key}", "runs/b/hash16.pt"), ("two-tower@hash.hidden=8",
                                                                               "runs/a/hash16.pt")):
        one = runner.invoke(main, ["runs", "--results", str(path), "--checkpoint", "--method", method])
        assert one.exit_code == 0 and one.output == f"{expected}\n", one.output
    # a key beside a plain method: the runs of either, in the summary
    summary = runner.invoke(main, ["runs", "--results", str(path), "--json", "--method", f"two-tower@{wide_key}",
                                   "--method", "cca-itq"])
    assert summary.exit_code == 0
    assert sorted(json.loads(line)["method"] for line in summary.output.splitlines()) == ["cca-itq", "two-tower"]
    # a loss other than the method's default is part of the name a key goes with, as in compare
    triplet = tmp_path / "t.jsonl"
    append_jsonl(triplet, [_row(loss="triplet"), {**wide, "loss": "triplet"}])
    named = runner.invoke(main, ["runs", "--results", str(triplet), "--checkpoint", "--method", "two-tower"])
    suggested = named.output.split("name one with --method ")[1].split(" ")[0]
    assert suggested.startswith("two-tower:triplet@")
    picked = runner.invoke(main, ["runs", "--results", str(triplet), "--checkpoint", "--method", suggested])
    assert picked.exit_code == 0 and picked.output.endswith("hash16.pt\n"), picked.output
    bad = runner.invoke(main, ["runs", "--results", str(path), "--method", "two-tower@zz"])
    assert bad.exit_code == 2 and "--method: 'zz' in 'two-tower@zz' is neither a settings key" in bad.output


def test_a_row_appended_to_a_last_line_without_newline_is_kept(tmp_path):
    """A results file whose last line has no newline (an editor's) keeps the next row on a line of
    its own; rows glued by older versions are read back; a line that is not rows is skipped with a warning."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}')  # no newline at the end
    append_jsonl(path, [{"c": 3}, {"d": 4}])
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n{"c": 3}\n{"d": 4}\n'
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]
    glued = tmp_path / "glued.jsonl"
    glued.write_text('{"a": 1}{"b": 2}\n[1, 2]\n{"c": \n{"d": 4}\n')
    with pytest.warns(UserWarning) as caught:
        assert read_jsonl(glued) == [{"a": 1}, {"b": 2}, {"d": 4}]
    assert [str(w.message) for w in caught] == [f"{glued}: line 2: not a JSON row ([1, 2]); skipped",
                                                f'{glued}: line 3: not a JSON row ({{"c":); skipped']


def test_every_output_is_checked_before_any_work_and_named_by_its_flag(tmp_path, tiny_path, read_only_dir):
    """An output that cannot be written is refused before anything trains or is read, in one
    line naming the flag and the path, exit 2: --out and --results of train-hash (both front doors) and
    the outputs of the other commands."""
    ro, ok = read_only_dir, tmp_path / "ok"
    train = ["train-hash", *SMALL, "-d", tiny_path, "--epochs", "1", "-b", "8"]
    cases = [
        ([*train, "--out", str(ro / "runs"), "--results", str(ok / "r.jsonl")], f"--out {ro / 'runs'}: cannot be written"),
        ([*train, "--out", str(ok / "runs"), "--results", str(ro / "r.jsonl")], f"--results {ro / 'r.jsonl'}: cannot"),
        ([*train, "--out", str(ok / "runs"), "--results", str(tmp_path)], f"--results {tmp_path}: is a folder, not"),
        (["train-fusion", "--set", "fusion.d_model=32", "-d", tiny_path, "--out", str(ro / "runs")],
         f"--out {ro / 'runs'}: cannot"),
        (["grid", "-d", tiny_path, "--methods", "cca-itq", "--out", str(ok / "runs"), "--results", str(ok / "g.jsonl"),
          "--table", str(ro / "t")], f"--table {ro / 't.md'}: cannot be written"),
        (["evaluate", "--codes", str(ok / "c.h5"), "--metrics-out", str(ro / "m.json")],
         f"--metrics-out {ro / 'm.json'}: cannot be written"),
        (["encode", "-d", tiny_path, "-c", str(ok / "h.pt"), "-o", str(ro / "c.h5")], f"--out {ro / 'c.h5'}: cannot"),
        (["index", tiny_path, "-c", str(ok / "h.pt"), "-o", str(ro / "ix")], f"--out {ro / 'ix'}: cannot be written"),
        (["make-synthetic", str(ro / "s.h5")], f"OUT {ro / 's.h5'}: cannot be written"),
        # two outputs into one file: the table replaced the grid's results, and the grid could not resume
        (["grid", "-d", tiny_path, "--methods", "cca-itq", "--out", str(ok / "runs"), "--results", str(ok / "t.md"),
          "--table", str(ok / "t")], f"--results and --table: both would write {ok / 't.md'}; give each its own"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.splitlines() == [result.output.splitlines()[0]], result.output  # nothing else ran
        assert result.output.startswith(f"Error: {message}"), (args, result.output)
    assert not ok.exists() and not list(ro.iterdir())
    demo = subprocess.run([sys.executable, str(ROOT / "demo.py"), "--dataset", tiny_path, "--epoch", "1",
                           "--out", str(ro / "runs"), "--results", str(tmp_path / "r.jsonl")],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert demo.returncode == 2 and demo.stdout == ""
    assert demo.stderr.splitlines() == [f"error: --out {ro / 'runs'}: cannot be written (in {ro}): "
                                        f"{'Operation not permitted' if os.geteuid() == 0 else 'Permission denied'}"]
    # a results file that fails after the run all the same (a full disk): the rows' fate and the way on
    from ucmfh.app.table import report

    said = []
    with pytest.raises(OSError, match=r"--results .*: the rows above were not appended \(.*\); the checkpoints are "
                                      "saved, so the same command scores them again without training"):
        report([{**_row(), "ranking": "hamming", "dataset": "d"}], str(tmp_path), said.append)
    assert said and "I->T" in said[0]  # the scores are shown all the same
    # ... or a file that became another program's while the run trained: refused, the scores shown still
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    said.clear()
    with pytest.raises(ValueError, match="not a JSON-lines results file"):
        report([{**_row(), "ranking": "hamming", "dataset": "d"}], str(notes), said.append)
    assert said and "I->T" in said[0] and notes.read_text() == "my notes\n"


@pytest.mark.parametrize("args, error", [
    (["--set", "hash.hidden=abc"], "Error: Invalid value for --set: 'hash.hidden': hidden must be an integer, got 'abc'"),
    (["--method", "ucmfh", "--set", "fusion.d_model=abc"],
     "Error: Invalid value for --set: 'fusion.d_model': d_model must be an integer, got 'abc'"),
    (["--set", "hash.supervised=1"], "Error: Invalid value for --set: 'hash.supervised': supervised must be true or false, "
                                     "got 1"),
    (["-b", "16", "--set", "hash.n_bits=32"], "Error: Invalid value for --set: 'hash.n_bits': use -b/--n-bits"),
    (["--set", "hash.seed=3"], "Error: Invalid value for --set: 'hash.seed': use --seed"),
    (["--loss-param", "temperature=abc"],
     "Error: Invalid value for --loss-param: loss 'infonce': temperature must be a number, got 'abc'"),
    (["--method", "ucmfh", "--loss", "triplet", "--loss-param", "margin=x"],
     "Error: Invalid value for --loss-param: loss 'triplet': margin must be a number, got 'x'"),
    (["--loss-param", "foo=1"], "Error: Invalid value for --loss-param: loss 'infonce' has no parameter 'foo' (its "
                                "parameters: temperature, learnable, min_temperature, max_temperature)"),
    (["--method-param", "nosuch=1"], "Error: Invalid value for --method-param: method 'two-tower' has no parameter "
                                     "'nosuch' (its parameters: temperatures)"),
])
def test_ill_typed_settings_are_one_line_naming_the_setting(tmp_path, tiny_path, args, error):
    """An ill-typed --set, --loss-param or --method-param is refused before the dataset is read, naming the flag
    and the setting."""
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--out", str(tmp_path / "runs"), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error")] == [error]
    assert "dataset:" not in result.output and not (tmp_path / "runs").exists()


def test_demo_evaluates_the_run_it_trained_without_repeating_epoch(tmp_path, capsys):
    """README's `demo.py --task 1 --epoch 20`, then `--task 2/3` without --epoch: the saved run of these
    settings is evaluated; a --epoch that was never trained is one line naming the epochs that were."""
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    common = ["--dataset", _make(tmp_path, "small"), "--hash_lens", "16", "--out", str(tmp_path / "runs"),
              "--results", str(tmp_path / "r.jsonl"), "--device", "cpu", "--protocol", "unimodal", "--batch_size", "64"]
    assert demo.main(["--task", "1", "--epoch", "1", *common]) == 0
    trained = _rows(tmp_path / "r.jsonl")[-1]
    capsys.readouterr()
    for task, checkpoint in ((3, trained["checkpoint"]), (2, str(Path(trained["checkpoint"]).parents[1] / "fusion.pt"))):
        assert demo.main(["--task", str(task), *common]) == 0
        assert f"evaluating {checkpoint}: the saved run of these settings (1 epoch)" in capsys.readouterr().out
    assert _rows(tmp_path / "r.jsonl")[-2]["map_i2t"] == trained["map_i2t"]  # task 3 scored the trained model
    assert demo.main(["--task", "3", "--epoch", "5", *common]) == 2
    [error] = capsys.readouterr().err.strip().splitlines()
    assert error.startswith("error: ") and error.endswith(
        "no checkpoint of these settings (5 epochs); saved runs of them with other epochs: use --epoch 1")


def test_a_resumed_run_counts_the_training_time_of_its_interrupted_part(tiny_path, tmp_path, monkeypatch):
    """A run's ``train_time_s`` is the time of all its training: an interrupted run's state holds the seconds
    it trained (``elapsed``), and the run resumed from it adds them to its own, not only the time since it
    resumed. The state's seconds are set to 1,000 to tell the two apart."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    argv = ["train-hash", "-d", tiny_path, "-b", "16", "--results", str(results), "--out", str(out), "--device", "cpu",
            "--quiet", "--epochs", "4", "--set", "hash.hidden=32", "--loss-param", "temperature=0.3", "--refit",
            "--save-interval", "1e9"]
    monkeypatch.setattr(trainer_module, "tqdm", StopAfter(2))
    stopped = CliRunner().invoke(main, argv)
    assert stopped.exit_code != 0 and not results.exists()
    [path] = out.rglob("hash16.state.pt")
    state = torch.load(path, weights_only=False)
    assert 0 < state["elapsed"] < 1000
    torch.save({**state, "elapsed": 1000.0}, path)
    monkeypatch.setattr(trainer_module, "tqdm", StopAfter(None))
    done = CliRunner().invoke(main, [*argv, "--resume"])
    assert done.exit_code == 0, done.output
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert 1000 < row["train_time_s"] < 1000 + 600 and row["refit_epochs"] is not None
    assert not list(out.rglob("*.state.pt"))  # the run's, and its refit's, removed once it is saved


TWO_TOWER = ["train-hash", "--method", "two-tower", "--set", "hash.hidden=32", "-b", "16", "--device", "cpu", "--quiet"]

# holds the lock of a run the way a training process does (ucmfh.app.stage.training_lock), until killed
HOLD_LOCK = ("import fcntl, os, sys, time\n"
             "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
             "fcntl.flock(fd, fcntl.LOCK_EX)\n"
             "os.ftruncate(fd, 0)\n"  # as training_lock does: the pid of the run before is longer when pids wrap
             "os.write(fd, f'{os.getpid()}\\n'.encode())\n"
             "print('held', flush=True)\n"
             "time.sleep(120)\n")


def test_a_second_process_training_the_same_run_is_refused_until_the_first_ends(tmp_path, tiny_path):
    """While a process trains a run (holds its lock), the same run asked for by another process is one line,
    exit 2, naming the run folder and the pid, whether or not a training state is saved there yet; once
    that process is gone (killed: the kernel drops its lock, the lock file stays) the run trains."""
    out, results = tmp_path / "runs", tmp_path / "r.jsonl"
    argv = [*TWO_TOWER, "-d", tiny_path, "--epochs", "1", "--out", str(out), "--results", str(results)]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    checkpoint = Path(json.loads(results.read_text().splitlines()[0])["checkpoint"])
    checkpoint.unlink()  # the run not trained yet, as when the first process is still at it
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(checkpoint.with_suffix(".lock"))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        message = (f"{checkpoint.parent}: another process (pid {holder.pid}) is training this run; wait for it or "
                   "use another --out")
        refused = CliRunner().invoke(main, argv)
        assert refused.exit_code == 2 and refused.output.strip().endswith(message), refused.output
        state = checkpoint.with_name("hash16.state.pt")
        state.write_bytes(b"")  # the first process has saved its training state: still not an interrupted run
        refused = CliRunner().invoke(main, argv)
        assert refused.exit_code == 2 and refused.output.strip().endswith(message), refused.output
        state.unlink()
        assert not checkpoint.exists()
    finally:
        holder.kill()
        holder.wait()
    assert checkpoint.with_suffix(".lock").exists()  # left by the killed process: blocks nothing
    again = CliRunner().invoke(main, argv)
    assert again.exit_code == 0 and "training" in again.output and checkpoint.exists(), again.output


def test_two_processes_started_together_on_one_run_train_it_once(tmp_path, tiny_path):
    """Two processes started at once on the same run: one trains it, the other is refused (or, started after
    the first saved it, reuses it); never both train and write the checkpoint."""
    argv = [*TWO_TOWER, "-d", tiny_path, "--epochs", "3", "--out", str(tmp_path / "runs")]
    procs = [_cli(*argv, "--results", str(tmp_path / f"r{i}.jsonl")) for i in range(2)]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        trained, reused = "hashing 16 bits: training" in out, "already trained, reused" in out
        refused = p.returncode == 2 and "is training this run; wait for it or use another --out" in err
        assert (p.returncode == 0 and trained != reused) or refused, (p.returncode, out, err)
        outcomes.append("trained" if trained else "reused" if reused else "refused")
    assert sorted(outcomes) in (["refused", "trained"], ["reused", "trained"]), outcomes


def test_a_checkpoint_scored_on_another_dataset_is_not_a_run_of_that_dataset(tmp_path):
    """``ucmfh evaluate -c`` of a model trained on A, scored on B: its rows say so (``trained_on``, A's
    identity as the checkpoint records it), their run key is not B's run of the same settings, and ``ucmfh
    runs`` shows them apart, marked, leaving B's own run as it was."""
    a, b = _make(tmp_path, "A", seed=1), _make(tmp_path, "B", seed=2)
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    for path in (a, b):
        trained = CliRunner().invoke(main, [*TWO_TOWER, "-d", path, "--epochs", "1", "--out", out,
                                            "--results", str(results)])
        assert trained.exit_code == 0, trained.output
    row_a, row_b = _rows(results)
    assert "trained_on" not in row_a and "trained_on" not in row_b
    scored = CliRunner().invoke(main, ["evaluate", "-c", row_a["checkpoint"], "-d", b, "--device", "cpu", "--quiet",
                                       "--results", str(results)])
    assert scored.exit_code == 0, scored.output
    assert f"trained on {os.path.realpath(a)}, scored here on {b}" in scored.output
    [cross] = _rows(results)[2:]
    assert cross["dataset"] == "B" and cross["trained_on"] == {
        "label": "A", "path": os.path.realpath(a), "fingerprint": row_a["dataset_fingerprint"]}
    assert cross["run"] not in (row_a["run"], row_b["run"]) and cross["settings"] == row_b["settings"]
    groups = summarize(_rows(results))
    assert [(g["dataset"], g["trained_on"], g["map_i2t_mean"]) for g in groups] == [
        ("A", None, row_a["map_i2t"]), ("B", None, row_b["map_i2t"]), ("B", "A", cross["map_i2t"])]
    table = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "B"])
    assert table.exit_code == 0, table.output
    header, *lines = table.output.splitlines()
    assert header.split()[:4] == ["dataset", "trained", "on", "task"]
    assert lines[0].split()[:3] == ["B", "-", "hashing"] and lines[1].split()[:3] == ["B", "A", "hashing"]
    assert "trained on: a checkpoint trained on that dataset, scored on this one" in table.output
    again = CliRunner().invoke(main, ["evaluate", "-c", row_b["checkpoint"], "-d", b, "--device", "cpu", "--quiet",
                                      "--results", str(results)])  # its own dataset: the run scored again
    assert again.exit_code == 0 and "trained on" not in again.output, again.output
    assert "trained_on" not in _rows(results)[-1] and _rows(results)[-1]["run"] == row_b["run"]
    # its codes of B say so too ('ucmfh encode'), and two codes files of one model of one file are one measurement
    codes = [str(tmp_path / f"{name}.h5") for name in ("c1", "c2")]
    for path in codes:
        encoded = CliRunner().invoke(main, ["encode", "-c", row_a["checkpoint"], "-d", b, "-o", path, "--quiet",
                                            "--device", "cpu"])
        assert encoded.exit_code == 0 and f"trained on {os.path.realpath(a)}, encoded here on {b}" in encoded.output
    from_codes = tmp_path / "codes.jsonl"
    scored = CliRunner().invoke(main, ["evaluate", "--codes", codes[0], "--codes", codes[1], "--results",
                                       str(from_codes)])
    assert scored.exit_code == 0, scored.output
    first, second = _rows(from_codes)
    assert first["trained_on"] == cross["trained_on"] and first["dataset_fingerprint"] == row_b["dataset_fingerprint"]
    assert first["map_i2t"] == second["map_i2t"] and first["codes"] != second["codes"]
    [group] = summarize(_rows(from_codes))
    assert (group["dataset"], group["trained_on"], group["n_seeds"], group["seeds"]) == ("B", "A", 1, [row_a["seed"]])


def _captions(path: Path, query_images: List[int], seed: int) -> str:
    """A caption set of 30 training images and 6 query images, 3 captions each (``image {i}, caption {j}``):
    its query images are images ``query_images`` of the training numbering, by their captions; the ids are
    its own (query ids after the training ones), the features random."""
    rng = np.random.default_rng(seed)

    def split(images: List[int], first_id: int) -> Dict[str, np.ndarray]:
        ids = np.repeat(np.arange(first_id, first_id + len(images)), 3)
        image = np.repeat(rng.normal(size=(len(images), 8)), 3, axis=0).astype(np.float32)
        return {"image": image, "text": rng.normal(size=(len(ids), 6)).astype(np.float32), "ids": ids,
                "text_raw": np.array([f"image {i}, caption {j}" for i in images for j in range(3)], dtype=object)}

    train = split(list(range(30)), 0)
    return write_dataset(path, {"train": train, "retrieval": train, "query": split(query_images, 1000)})


def h5_splits(path: str) -> Dict[str, Dict[str, np.ndarray]]:
    """A dataset file's splits as write_dataset takes them (image, text, ids, text_raw)."""
    import h5py

    with h5py.File(path, "r") as f:
        return {s: {k: f[s][k][()] for k in ("image", "text", "ids", "text_raw")} for s in ("train", "query",
                                                                                           "retrieval")}


def test_a_checkpoint_scored_on_its_own_training_items_says_so(tmp_path):
    """Scored on another export of items it was trained on (86 of flickr8k1000's 100 query images are full
    Flickr8k's training images), a model scored R@1 73 against its honest 15, under a neutral note. The items
    are matched by their captions: the rows say how many of the queries were trained on, and a warning says the
    scores are inflated."""
    a = _captions(tmp_path / "A.h5", list(range(100, 106)), seed=1)
    b = _captions(tmp_path / "B.h5", [0, 1, 2, 3, 200, 201], seed=1)  # 4 of its 6 query images are A's training
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    trained = CliRunner().invoke(main, [*TWO_TOWER, "-d", a, "--epochs", "1", "--out", out, "--results", str(results)])
    assert trained.exit_code == 0, trained.output
    row, n = _rows(results)[0], len(_rows(results))  # a caption set's: a row per database
    scored = CliRunner().invoke(main, ["evaluate", "-c", row["checkpoint"], "-d", b, "--device", "cpu", "--quiet",
                                       "--results", str(results)])
    assert scored.exit_code == 0, scored.output
    assert (f"warning: 4 of the 6 query items of {b} are items of the training split of {os.path.realpath(a)} (by "
            "their captions)") in scored.output and "inflated" in scored.output
    assert all(r["trained_on"]["queries_trained_on"] == [4, 6] for r in _rows(results)[n:]) and _rows(results)[n:]
    own = CliRunner().invoke(main, ["evaluate", "-c", row["checkpoint"], "-d", a, "--device", "cpu", "--quiet",
                                    "--results", ""])
    assert own.exit_code == 0 and "warning" not in own.output, own.output
    # a labelled set's texts are tags, which repeat across images: not matched
    from ucmfh.data.h5 import queries_trained_on

    labelled = {s: {**arrays, "labels": np.eye(2, dtype=np.uint8)[arrays["ids"] % 2]}
                for s, arrays in h5_splits(b).items()}
    assert queries_trained_on(write_dataset(tmp_path / "L.h5", labelled), a) is None
    assert queries_trained_on(b, a) == (4, 6)


def test_a_labelled_set_s_queries_trained_on_in_another_file_are_found_by_their_features(tmp_path, tiny_path):
    """A labelled set's texts are tags, which repeat, so its queries were not matched at all: a query draw of
    mirflickr730 holding 91 of its 100 query items from the training split was scored under a note alone. They
    are matched by their whole image and text rows."""
    import h5py

    from ucmfh.data.h5 import rows_found_in

    with h5py.File(tiny_path, "r") as f:
        splits = {s: {k: f[s][k][()] for k in ("image", "text", "labels", "ids")} for s in ("train", "query",
                                                                                           "retrieval")}
    train, query = splits["train"], splits["query"]
    for k in ("image", "text", "labels"):  # the first three query rows: training items copied whole
        query[k][:3] = train[k][[5, 9, 2]]
    query["image"][3] = train["image"][7]  # an image alone: not the item
    rest = {k: np.delete(v, [2, 5, 9], axis=0) for k, v in train.items()}  # the draw's own training split
    draw = write_dataset(tmp_path / "draw.h5", {"train": rest, "retrieval": rest, "query": query})
    assert rows_found_in(draw, "query", tiny_path, "train") == (3, len(query["ids"]))
    out, results = str(tmp_path / "runs"), tmp_path / "r.jsonl"
    trained = CliRunner().invoke(main, [*TWO_TOWER, "-d", tiny_path, "--epochs", "1", "--out", out, "--results",
                                        str(results)])
    assert trained.exit_code == 0, trained.output
    scored = CliRunner().invoke(main, ["evaluate", "-c", _rows(results)[0]["checkpoint"], "-d", draw, "--device",
                                       "cpu", "--quiet", "--results", str(results)])
    assert scored.exit_code == 0, scored.output
    assert f"warning: 3 of the {len(query['ids'])} query items of {draw} are items of the training split" in \
        scored.output and "(by their features)" in scored.output


def test_collapsed_codes_are_said_and_recorded(tmp_path):
    """A model that gives (almost) every item one code scores the level of a random order, which a MAP alone
    does not tell from a weak ranking: DGCPN on Wiki gave every item one code at 16 bits in the published
    comparison. Each row records the distinct codes of the retrieval split per modality, and a warning says
    when they collapsed."""
    from ucmfh.checkpoint import save_checkpoint
    from ucmfh.config import HashConfig
    from ucmfh.data.h5 import load_dataset
    from ucmfh.models.hashing import FeatureHasher

    path = _make(tmp_path, "A")
    data = load_dataset(path)
    cfg = HashConfig(method="two-tower", n_bits=16, hidden=0)
    model = FeatureHasher(data.d_img, data.d_txt, 16, 0).eval()
    with torch.no_grad():
        model.txt_head.net[0].weight.zero_()  # every text: the sign of the bias
    ckpt = save_checkpoint(tmp_path / "c.pt", model, None, cfg)
    results = tmp_path / "r.jsonl"
    out = CliRunner().invoke(main, ["evaluate", "-c", ckpt, "-d", path, "--device", "cpu", "--quiet",
                                    "--results", str(results)])
    assert out.exit_code == 0, out.output
    n = len(data.retrieval)
    q = len(data.query)
    assert (f"warning: collapsed codes (unimodal): distinct codes of the retrieval texts 1 for {n} items, query "
            f"texts 1 for {q} items; its scores") in out.stderr and "warning" not in out.stdout  # stdout: a script's
    assert "images" not in out.output.split("warning")[1].split("\n")[0]
    [row] = _rows(results)
    assert row["distinct_codes"]["txt"] == [1, n] and 1 < row["distinct_codes"]["img"][0] <= n
    assert row["distinct_codes"]["query_txt"] == [1, q] and 1 < row["distinct_codes"]["query_img"][0] <= q
    # the same codes scored from a codes file: said and recorded too (evaluate --codes counted nothing)
    codes = tmp_path / "c.h5"
    encoded = CliRunner().invoke(main, ["encode", "-c", ckpt, "-d", path, "-o", str(codes), "--device", "cpu",
                                        "--quiet"])
    assert encoded.exit_code == 0, encoded.output
    scored = CliRunner().invoke(main, ["evaluate", "--codes", str(codes), "--results", str(tmp_path / "c.jsonl")])
    assert scored.exit_code == 0 and "distinct codes of the retrieval texts 1 for" in scored.output, scored.output
    assert _rows(tmp_path / "c.jsonl")[0]["distinct_codes"] == row["distinct_codes"]
    # marked wherever its scores are averaged in: 'runs' and a grid's table (only the training log said it)
    from ucmfh.app.grid import markdown
    from ucmfh.app.runs import COLLAPSE_NOTE, UNCHECKED_NOTE, variant_of

    table = CliRunner().invoke(main, ["runs", "--results", str(results)])
    assert table.exit_code == 0 and COLLAPSE_NOTE in table.output, table.output
    header, line = table.output.splitlines()[:2]
    assert line[header.index("seeds"):].startswith("1†"), table.output
    md = markdown([row], [variant_of(row)], [16])
    assert f"{row['map_i2t_expected']:.3f} / {row['map_t2i_expected']:.3f}†" in md and COLLAPSE_NOTE + "." in md
    assert UNCHECKED_NOTE not in table.output and UNCHECKED_NOTE not in md
    # a row of an older ucmfh, which counted no distinct codes: not marked either way, and the table says so (its
    # collapse went unmarked beside a marked row of the same model, an audit of a study across an upgrade)
    older = {k: v for k, v in row.items() if k != "distinct_codes"}
    with open(tmp_path / "older.jsonl", "w") as f:
        f.write(json.dumps(older) + "\n")
    table = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "older.jsonl")])
    assert table.exit_code == 0 and UNCHECKED_NOTE in table.output and COLLAPSE_NOTE not in table.output
    assert UNCHECKED_NOTE + "." in markdown([older], [variant_of(older)], [16])
    from ucmfh.metrics.collapse import collapsed

    # judged against what the codes could be: 8 bits hold 256 codes, whatever the items
    assert collapsed({"img": [3, 100_000], "txt": [200, 100_000], "n_bits": 8}) == []
    assert collapsed({"img": [2, 100_000], "txt": [200, 100_000], "n_bits": 8}) == ["img"]
    assert collapsed({"img": [999, 100_000], "txt": [1001, 100_000], "n_bits": 64}) == ["img"]
    # a query side whose codes collapsed ranks the database one way for every query
    assert collapsed({"img": [500, 500], "txt": [500, 500], "query_img": [1, 50], "query_txt": [40, 50],
                      "n_bits": 16}) == ["query_img"]


def test_a_validation_split_that_tells_nothing_apart_is_said(tmp_path):
    """Three training items of three classes: the one held out for validation shares a label with neither of
    the two trained on, so it scored 0 at every epoch, and early stopping, the epoch kept and two-tower's
    temperature were each chosen by a tie, under a normal table."""
    from ucmfh.data.writer import write_dataset

    rng = np.random.default_rng(0)

    def split(classes):
        return {"image": rng.normal(size=(len(classes), 8)), "text": rng.normal(size=(len(classes), 6)),
                "labels": np.eye(4, dtype=np.uint8)[classes]}

    path = write_dataset(tmp_path / "d.h5", {"train": split([2, 3, 0]), "query": split(np.arange(10) % 4),
                                             "retrieval": split(np.arange(30) % 4)})
    out = CliRunner().invoke(main, ["train-hash", "-d", path, "-b", "16", "--epochs", "3", "--set", "hash.hidden=32",
                                    "--device", "cpu", "--out", str(tmp_path / "runs"), "--results", "", "--quiet"])
    assert out.exit_code == 0, out.output
    assert ("warning: validation scored 0.0000 at each of its 3 epochs: the epoch kept (1) was chosen by nothing"
            in out.output)
    assert "warning: the candidates scored alike on validation: t0.3 was chosen by nothing" in out.stderr
    assert "warning" not in out.stdout  # a command's warnings on stderr, beside its errors (they were on stdout)


def test_resume_with_nothing_saved_names_no_file_the_run_never_writes(tmp_path, tiny_path):
    """--resume of a run never started: two-tower saves one state a temperature candidate
    (hash8.t0.3.state.pt), so the message named a hash8.state.pt that no run writes; it names the checkpoint."""
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--epochs", "1", "-b", "8", "--set",
                                       "hash.hidden=64", "--device", "cpu", "--out", str(out), "--results",
                                       str(tmp_path / "r.jsonl"), "--resume"])
    assert result.exit_code == 0, result.output
    log = result.output
    [line] = [line for line in log.splitlines() if line.startswith("nothing to resume")]
    checkpoint = line.split(" beside ")[1].split(" (")[0]
    assert line == f"nothing to resume: no training state is saved beside {checkpoint} (a stage not started " \
                   "before); training it from the start"
    assert checkpoint.endswith("hash8.pt") and os.path.isfile(checkpoint)
    # a state of the same method, seed and stage under another key (other flags, or an older ucmfh's key of
    # these: '--set hash.dropout=0' has another since integers of float settings became floats) is named
    run_folder = os.path.dirname(checkpoint)
    other = run_folder.rsplit("-", 1)[0] + "-0123abcd"
    os.makedirs(other)
    open(os.path.join(other, "hash16.t0.3.state.pt"), "wb").close()
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--epochs", "1", "-b", "16", "--set",
                                       "hash.hidden=64", "--device", "cpu", "--out", str(out), "--results",
                                       str(tmp_path / "r.jsonl"), "--resume"])
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("nothing to resume")]
    assert line.endswith(f"hash16.pt; states of other settings of this method and seed are saved in {other} "
                         "(another run's flags: resume it with those; or an older ucmfh's key of these flags, which "
                         "only that version resumes); training it from the start"), line


def test_resume_with_nothing_saved_names_the_stages_of_older_keys_nested_ones_too(tmp_path):
    """ucmfh's hashing stage sits in its fusion stage's run folder: a '--resume' after an upgrade that changed the
    fusion key found the old hashing state nowhere and said 'a stage not started before', and of the fusion stage
    finished under the old key the same (an audit of a study across an upgrade). Both are named."""
    from ucmfh.app.stage import _other_settings

    data = tmp_path / "syn-b2445271"
    old_hash = data / "original-seed4-e96dcf9f" / "hash-9b882683"
    new_hash = data / "original-seed4-ecda245c" / "hash-6a8b466a"
    for folder in (old_hash, new_hash, data / "original-seed5-e96dcf9f" / "hash-9b882683"):
        folder.mkdir(parents=True)
        (folder / "hash64.state.pt").touch()  # another seed's, and this run's own, are not the other settings'
        (folder.parent / "fusion.pt").touch()
    (new_hash / "hash64.state.pt").unlink()
    assert _other_settings(str(new_hash / "hash64.pt")) == ([str(old_hash)], [])
    assert _other_settings(str(new_hash.parent / "fusion.pt")) == ([], [str(old_hash.parent)])
    assert _other_settings(str(data / "two-tower-seed4-0123abcd" / "hash64.pt")) == ([], [])


def test_resume_in_another_number_of_processes_is_refused_naming_the_state(tmp_path, tiny_path, monkeypatch):
    """A run of these settings interrupted in 2 processes (its identity says so, its state lies where torchrun's
    run keeps it), then ``--resume`` in one: refused before anything trains, in one line that names the state and
    how to resume it, where it said 'nothing to resume' and trained another run from the start. Without
    --resume the one-process run is another run, trained as such (docs/distributed.md)."""
    import types

    import ucmfh.app.identity as identity_module
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    argv = ["train-hash", "-d", tiny_path, "-b", "16", "--results", str(results), "--out", str(out), "--device", "cpu",
            "--quiet", "--epochs", "3", "--set", "hash.hidden=32", "--loss-param", "temperature=0.3"]
    with monkeypatch.context() as patched:  # the run's identity that of 2 processes, its training one process's
        patched.setattr(identity_module, "current_group", lambda: types.SimpleNamespace(world_size=2))
        patched.setattr(trainer_module, "tqdm", StopAfter(1))
        stopped = CliRunner().invoke(main, argv)
    assert stopped.exit_code != 0 and not results.exists()
    [state] = out.rglob("hash16.state.pt")
    refused = CliRunner().invoke(main, [*argv, "--resume"])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.splitlines() == [
        f"Error: {state}: an interrupted run of these settings in 2 processes is saved here (epoch 2 of 3), and this "
        "one runs in 1: a run's number of processes is part of its identity; resume it with torchrun "
        "--nproc-per-node 2"]
    assert not list(out.rglob("hash16.pt"))
    fresh = CliRunner().invoke(main, argv)
    assert fresh.exit_code == 0, fresh.output
    [row] = _rows(results)
    assert "processes" not in row["settings"]["hash"] and state.exists()  # the other run's state is left alone


def test_an_interrupt_while_scoring_says_how_to_go_on(tmp_path, tiny_path, monkeypatch):
    """Ctrl-C while a trained model was scored said 'interrupted' alone: its checkpoint is saved, and the same
    command scores it again without training it."""
    import ucmfh.app.experiment as experiment

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    real = experiment.evaluate_hashing
    monkeypatch.setattr(experiment, "evaluate_hashing", stopped)
    args = ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8", "--device", "cpu", "--quiet", "--out",
            str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    [line] = [line for line in result.output.splitlines() if "while scoring" in line]
    assert line.startswith("interrupted while scoring ") and line.endswith(
        "hash8.pt, which is saved; the same command scores it again, without training it"), line
    monkeypatch.setattr(experiment, "evaluate_hashing", real)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "already trained, reused" in again.output, again.output


def test_an_interrupt_while_a_stage_sets_up_says_so(tmp_path, tiny_path, monkeypatch):
    """Ctrl-C in a plan's set-up (DAEH's pass over every pair of training items: minutes at 100,000) said
    'interrupted' alone."""
    from ucmfh.methods.daeh import Daeh

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Daeh, "plan", stopped)
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "daeh", "-b", "8", "--epochs", "1",
                                       "--device", "cpu", "--quiet", "--out", str(tmp_path / "runs"), "--results", ""])
    assert result.exit_code == 130, result.output
    assert result.output.splitlines()[-1] == ("interrupted while hashing 8 bits set up its training, before its first "
                                              "epoch: nothing of it was saved"), result.output


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_row_s_commit_is_ucmfh_s_checkout_s_not_a_project_s_that_holds_an_installed_copy(tmp_path, monkeypatch):
    """Installed into a project's .venv, ucmfh recorded the project's HEAD as its own git_commit."""
    from ucmfh.app import identity

    def repo(top, package_at):
        module = top / package_at / "ucmfh" / "app" / "identity.py"
        module.parent.mkdir(parents=True)
        module.write_text("")
        git = ["git", "-C", str(top), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
        head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
        return str(module), head

    for package_at, own in ((".venv/lib/site-packages", False), (".", True)):
        module, head = repo(tmp_path / package_at.strip("./").replace("/", "-"), package_at)
        monkeypatch.setattr(identity, "__file__", module)
        identity.git_commit.cache_clear()
        assert identity.git_commit() == (head if own else None), package_at
    # an edit of the checkout's package not yet committed: its rows are not that commit's figures (an audit's)
    Path(module).write_text("# edited\n")
    identity.git_commit.cache_clear()
    assert identity.git_commit() == head + "+dirty"
    Path(module).parent.joinpath("new.py").write_text("")  # untracked alone: the commit's files unchanged
    subprocess.run(["git", "-C", str(Path(module).parents[2]), "checkout", "-q", "--", "."], check=True)
    identity.git_commit.cache_clear()
    assert identity.git_commit() == head
    identity.git_commit.cache_clear()


def test_an_installed_copy_s_commit_is_the_one_pip_recorded_of_its_git_url(tmp_path, monkeypatch):
    """Installed from a git URL, a copy's rows said its version, 0.1.0, alone: pip records the commit it installed
    (direct_url.json, PEP 610), which is the copy's, where the copy is the one imported."""
    from importlib import metadata

    from ucmfh.app import identity

    site = tmp_path / "site-packages"
    (site / "ucmfh").mkdir(parents=True)
    info = site / "ucmfh-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ucmfh\nVersion: 0.1.0\n")
    commit = "f849cee" + "0" * 33
    monkeypatch.setattr(metadata, "distribution", lambda name: metadata.PathDistribution(info))
    for recorded, package, expected in (
            ({"url": "https://x/ucmfh.git", "vcs_info": {"vcs": "git", "commit_id": commit}}, site / "ucmfh", commit),
            ({"url": "file:///src/ucmfh", "dir_info": {}}, site / "ucmfh", None),  # a folder: no commit
            ({"url": "https://x/ucmfh.git", "vcs_info": {"vcs": "git", "commit_id": commit}}, tmp_path / "ucmfh",
             None)):  # a checkout imported beside the installed copy: not its commit
        (info / "direct_url.json").write_text(json.dumps(recorded))
        assert identity.installed_commit(str(package)) == expected, (recorded, package)
    (info / "direct_url.json").unlink()  # installed from an index
    assert identity.installed_commit(str(site / "ucmfh")) is None


def test_a_ctrl_c_as_a_candidate_s_training_ends_or_between_two_candidates_stops_and_says_to_resume(
        tiny_path, tmp_path, monkeypatch):
    """A Ctrl-C heard after a fit's last look at it (the last epoch's validation, its bar) was lost: the next
    candidate trained and the command ended 0. One between two candidates said 'interrupted' alone, and left a
    state that refused the same command. Each now stops the run with the line that says --resume, which
    finishes it."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    argv = [*TWO_TOWER, "-d", tiny_path, "--epochs", "2", "--results", str(results), "--out", str(out)]
    monkeypatch.setattr(trainer_module, "tqdm", StopAfter(2))  # at the bar of the first candidate's last epoch
    stopped = CliRunner().invoke(main, argv)
    assert stopped.exit_code == 130 and not results.exists(), stopped.output
    [state] = out.rglob("*.state.pt")
    assert stopped.output.splitlines()[-1] == (
        f"two-tower 16 bits interrupted by SIGINT as its training ended; its training state saved to {state}; run "
        "the same command with --resume to continue")
    fits = trainer_module.fit
    calls = []

    def second_stopped(*args, **kwargs):  # a Ctrl-C after the first candidate's fit returned, before the next one
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return fits(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "tqdm", StopAfter(None))
    monkeypatch.setattr(trainer_module, "fit", second_stopped)
    between = CliRunner().invoke(main, [*argv, "--resume"])
    assert between.exit_code == 130 and between.output.splitlines()[-1] == (
        f"hashing 16 bits interrupted outside its epochs (resuming, or between its fits); the training states "
        f"saved so far are kept beside {state.parent / 'hash16.pt'}; run the same command with --resume to continue")
    monkeypatch.setattr(trainer_module, "fit", fits)
    done = CliRunner().invoke(main, [*argv, "--resume"])
    assert done.exit_code == 0 and len(results.read_text().splitlines()) == 1 and not list(out.rglob("*.state.pt"))


def test_a_key_is_told_by_what_varies_among_its_own_method_s_keys():
    """A run of cca-itq, then two-tower at its defaults and at --epochs 2: each two-tower key was described
    against cca-itq's, listing seven two-tower defaults as if the user had set them, and the one setting the
    two runs differ by was lost among them."""
    from ucmfh.app.runs import settings_legend

    def hashing(method, **settings):
        return {"task": "hashing", "dataset": "wiki", "method": method, "run": f"{method}{settings}", "loss": None,
                "n_bits": 16, "seed": 1,
                "protocol": "unimodal", "k": 50, "map_i2t": 0.3, "map_t2i": 0.3,
                "settings": {"fusion": None, "hash": {"method": method, "seed": 1, "n_bits": 16, **settings}}}

    rows = [hashing("cca-itq", ridge=1.0), hashing("two-tower", epochs=100, hidden=4096, lr_head=0.001),
            hashing("two-tower", epochs=2, hidden=4096, lr_head=0.001)]
    groups = summarize(rows)
    keys = {(g["method"], g["settings"]["hash"].get("epochs")): g["settings_key"] for g in groups}
    legend = settings_legend(groups)
    assert legend[0].startswith("settings (each key's values of what varies among the keys of its method and stages;")
    assert sorted(legend[1:]) == sorted([f"  {keys['cca-itq', None]}: the only settings of cca-itq with stages hash",
                                         f"  {keys['two-tower', 100]}: hash.epochs=100",
                                         f"  {keys['two-tower', 2]}: hash.epochs=2"])


def test_the_sample_standard_deviation_is_statistics_own_to_rounding():
    """Summaries' spreads in floats with exactly rounded sums, where statistics.stdev's fractions took a quarter
    of a lab's 'ucmfh runs' (10,000 rows: 6.0 s to 3.9 s in all)."""
    import random
    import statistics

    from ucmfh.app.runs import sample_std

    rng = random.Random(0)
    for n in (2, 3, 5, 40):
        for scale in (1e-6, 1.0, 1e4):
            values = [0.5 + scale * rng.random() for _ in range(n)]
            assert sample_std(values) == pytest.approx(statistics.stdev(values), rel=1e-12, abs=1e-18)
    assert sample_std([0.25]) == 0.0 and sample_std([0.3, 0.3, 0.3]) == 0.0


def test_a_run_resumed_with_another_thread_count_says_so(tmp_path, tiny_path, monkeypatch):
    """On the CPU another thread count trains another model (ucmfh's fusion encoder sums in another order): a run
    stopped under one count and resumed under another ended without a word, its row naming the second count
    alone (the reproducibility audit's). The state keeps its threads, and the resume says so."""
    from conftest import AtFirstEpoch

    from ucmfh import trainer

    class Stop(AtFirstEpoch):
        def first_epoch_ended(self):
            os.kill(os.getpid(), signal.SIGINT)

    args = ["train-hash", "-d", tiny_path, "--epochs", "3", "-b", "8", "--set", "hash.hidden=64", "--device", "cpu",
            "--val-fraction", "0", "--save-interval", "0", "--out", str(tmp_path / "runs"), "--results",
            str(tmp_path / "r.jsonl")]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setattr(trainer, "tqdm", Stop)
        stopped = CliRunner().invoke(main, args)
        assert stopped.exit_code == 130, stopped.output
        monkeypatch.undo()
        torch.set_num_threads(2)
        resumed = CliRunner().invoke(main, [*args, "--resume"])
    finally:
        torch.set_num_threads(threads)
    assert resumed.exit_code == 0, resumed.output
    assert ("note: trained with 1 CPU thread before its stop, resumed with 2: on the CPU another count sums in "
            "another order, so the model can differ from the run never stopped (OMP_NUM_THREADS=1 resumes it as it "
            "began)") in resumed.output


def test_a_mean_over_seeds_of_other_thread_counts_is_said(tmp_path):
    """Seeds trained with 1 and 2 CPU threads (a grid grown by a seed, two machines' rows in one file) were averaged
    as one setting's without a word (the reproducibility audit's): the table says so, --json names the counts."""
    rows = [{"dataset": "d", "dataset_fingerprint": "f", "task": "hashing", "method": "ucmfh", "loss": "original",
             "n_bits": 16, "protocol": "unimodal", "k": 50, "seed": seed, "run": f"r{seed}", "map_i2t": 0.5,
             "map_t2i": 0.5, "train_threads": 1, "fusion_train_threads": threads,
             "settings": {"fusion": {"seed": seed}, "hash": {"seed": seed, "n_bits": 16}}}
            for seed, threads in ((1, 1), (2, 2))]
    path = tmp_path / "r.jsonl"
    append_jsonl(path, rows)
    shown = CliRunner().invoke(main, ["runs", "--results", str(path)])
    assert shown.exit_code == 0 and "some means are over seeds trained with other numbers of CPU threads" in \
        shown.output, shown.output
    [entry] = [json.loads(line) for line in CliRunner().invoke(main, ["runs", "--results", str(path),
                                                                      "--json"]).output.splitlines()]
    assert entry["mixed_threads"] == [1, 2]
    append_jsonl(tmp_path / "one.jsonl", [{**row, "fusion_train_threads": 1} for row in rows])
    same = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "one.jsonl")])
    assert same.exit_code == 0 and "CPU threads" not in same.output


def test_a_run_s_lock_taken_as_its_holder_removed_it_is_taken_again_on_the_file_there(tmp_path, monkeypatch):
    """A process that opened a run's lock file as its holder, refused, removed it (and the run's bare folder)
    held a lock of no file once the holder let go, which a third process's new lock file did not see: both
    trained the run (a concurrency audit's, by reading). A lock is kept only on the file at its path."""
    import fcntl

    import ucmfh.app.stage as stage

    checkpoint = str(tmp_path / "run" / "hash16.pt")
    real, removed = fcntl.flock, []

    def holder_removes_it_first(fd, how):
        if not removed:  # between this process's open and its flock, the holder drops its bare folder
            os.unlink(stage._lock_path(checkpoint))
            removed.append(True)
        return real(fd, how)

    monkeypatch.setattr(stage.fcntl, "flock", holder_removes_it_first)
    fd, refusal = stage._try_lock(checkpoint)
    try:
        assert refusal is None and removed and stage._still_there(fd, stage._lock_path(checkpoint))
        monkeypatch.setattr(stage.fcntl, "flock", real)
        assert stage._try_lock(checkpoint)[1].endswith("is training this run; wait for it or use another --out")
    finally:
        os.close(fd)
