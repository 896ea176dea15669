"""``--tensorboard DIR`` on the training commands: each run's curves in a folder of its own, checked before
anything trains."""
from __future__ import annotations

import builtins
from pathlib import Path

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.checkpoint import read_checkpoint
from ucmfh.files import read_jsonl

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _losses(folder: Path):
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("loss")]


def _argv(command, tiny_path, tmp_path, *extra):
    return [command, "-d", tiny_path, "--method", "ucmfh", "-b", "16", "--epochs", "2", "--set", "hash.hidden=32",
            "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--device", "cpu", "--quiet",
            "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"), *extra]


def test_train_hash_writes_each_stage_s_curves_in_its_run_s_folder(tiny_path, tmp_path):
    result = CliRunner().invoke(main, _argv("train-hash", tiny_path, tmp_path, "--tensorboard", str(tmp_path / "tb")))
    assert result.exit_code == 0, result.output
    row = read_jsonl(tmp_path / "r.jsonl")[0]
    checkpoint = Path(row["checkpoint"])
    folder = tmp_path / "tb" / checkpoint.parent.relative_to(tmp_path / "runs")
    history = read_checkpoint(checkpoint)["meta"]["history"]
    hashing = _losses(folder / "hashing-16-bits")
    assert [step for step, _ in hashing] == [1, 2]
    assert [value for _, value in hashing] == pytest.approx(history["loss"])
    fusion = [p for p in (tmp_path / "tb").rglob("fusion") if p.is_dir()]
    assert len(fusion) == 1 and [step for step, _ in _losses(fusion[0])] == [1, 2]


def test_a_run_reused_says_that_it_writes_no_curves(tiny_path, tmp_path):
    """A run trained before is reused and trains no epoch: the curves asked for are not written, and the command
    says so (it said nothing, and the folder stayed empty)."""
    assert CliRunner().invoke(main, _argv("train-hash", tiny_path, tmp_path)).exit_code == 0
    result = CliRunner().invoke(main, _argv("train-hash", tiny_path, tmp_path, "--tensorboard", str(tmp_path / "tb")))
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: --tensorboard")]
    assert len(notes) == 1 and "no curves of hashing 16 bits" in notes[0], result.output  # its fusion stage not read
    assert "ucmfh runs --history" in notes[0] and not (tmp_path / "tb").exists()


def test_a_tensorboard_folder_that_cannot_be_one_is_refused_before_training(tiny_path, tmp_path):
    (tmp_path / "a-file").write_text("mine")
    result = CliRunner().invoke(main, _argv("train-hash", tiny_path, tmp_path, "--tensorboard",
                                            str(tmp_path / "a-file")))
    assert result.exit_code == 2 and "--tensorboard" in result.output, result.output
    assert not (tmp_path / "runs").exists() and (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("command", ["train-hash", "grid"])
def test_without_tensorboard_the_command_names_the_extra_before_training(tiny_path, tmp_path, monkeypatch, command):
    real = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith(("torch.utils.tensorboard", "tensorboard")):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    argv = _argv(command, tiny_path, tmp_path, "--tensorboard", str(tmp_path / "tb"))
    if command == "grid":
        argv = [a for a in argv if a not in ("--method", "ucmfh")] + ["--methods", "ucmfh", "--table",
                                                                        str(tmp_path / "table")]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and "pip install 'ucmfh[tensorboard]'" in result.output, result.output
    assert not (tmp_path / "runs").exists()
