"""The front doors end to end on a tiny synthetic file: ``ucmfh`` and ``demo.py``."""
from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

import click
import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import ROOT, cli_commands, no_traceback, runs_a_front_door
from ucmfh.app.cli import main

TINY_ARGS = ["--n-query", "40", "--n-retrieval", "200", "--n-train", "120", "--d-img", "24", "--d-txt", "16",
             "--n-classes", "6"]


def test_ucmfh_make_train_evaluate(tmp_path):
    runner = CliRunner()
    data = tmp_path / "toy.h5"
    result = runner.invoke(main, ["make-synthetic", str(data), *TINY_ARGS])
    assert result.exit_code == 0, result.output
    assert "valid" in runner.invoke(main, ["validate", str(data)]).output
    results = tmp_path / "results.jsonl"
    common = ["-d", str(data), "--results", str(results), "--quiet", "--device", "cpu"]
    result = runner.invoke(main, ["train-hash", *common, "--out", str(tmp_path / "runs"), "--epochs", "1",
                                  "--method", "ucmfh", "-b", "8", "-b", "16", "--amp", "bf16"])
    assert result.exit_code == 0, result.output
    assert "fusion encoder: training" in result.output and "unimodal" in result.output and "random" in result.output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["n_bits"], r["protocol"]) for r in rows] == [(8, "unimodal"), (8, "fused"), (16, "unimodal"), (16, "fused")]
    for r in rows:
        assert 0 <= r["map_i2t"] <= 1 and 0 <= r["map_t2i"] <= 1
        assert {"dataset", "task", "loss", "seed", "epochs", "train_time_s", "git_commit", "random_map_i2t",
                "dataset_path", "dataset_fingerprint", "run", "settings"} <= set(r)
        assert r["dataset"] == "toy" and r["settings"]["hash"]["n_bits"] == r["n_bits"]
        assert r["score_seconds"] > 0 and r["train_time_s"] > 0
    # the fusion stage's seconds beside its hashing stage's: the run's cost is both (its own meta says them)
    fusion_seconds = torch.load(Path(rows[0]["checkpoint"]).parent.parent / "fusion.pt",
                                weights_only=False)["meta"]["seconds"]
    assert {r["fusion_train_time_s"] for r in rows} == {round(fusion_seconds, 2)}
    # and its threads as saved (train_threads are the hashing stage's: a reused encoder's own went unsaid)
    assert {r["fusion_train_threads"] for r in rows} == {torch.get_num_threads()}
    checkpoint = Path(rows[2]["checkpoint"])
    assert checkpoint.name == "hash16.pt" and checkpoint.parent.parent.parent.name.startswith("toy-")
    assert torch.load(checkpoint, weights_only=False)["hash_config"]["amp"] == "bf16"
    result = runner.invoke(main, ["evaluate", *common, "-c", str(checkpoint), "--protocol", "unimodal"])
    assert result.exit_code == 0, result.output
    again = json.loads(results.read_text().splitlines()[-1])
    assert (again["map_i2t"], again["map_t2i"]) == (rows[2]["map_i2t"], rows[2]["map_t2i"])
    codes = tmp_path / "codes16.h5"
    result = runner.invoke(main, ["encode", "-d", str(data), "-c", str(checkpoint), "-o", str(codes), "--quiet"])
    assert result.exit_code == 0, result.output
    metrics_out = tmp_path / "metrics.json"
    result = runner.invoke(main, ["evaluate", "--codes", str(codes), "--metrics-out", str(metrics_out), "--quiet",
                                  "--results", str(results)])
    assert result.exit_code == 0, result.output
    metrics = json.loads(metrics_out.read_text())
    assert abs(metrics["i2t"]["map@50"] - rows[2]["map_i2t"]) < 1e-9, metrics["i2t"]
    # a second train-hash with other hashing settings reuses the fusion encoder of the same identity
    result = runner.invoke(main, ["train-hash", *common, "--out", str(tmp_path / "runs"), "--epochs", "1",
                                  "--method", "ucmfh", "-b", "8", "--amp", "bf16", "--lr-fusion", "0"])
    assert result.exit_code == 0, result.output
    assert f"fusion encoder: already trained, reused {checkpoint.parent.parent / 'fusion.pt'}" in result.output
    last = json.loads(results.read_text().splitlines()[-1])
    assert last["fusion_train_time_s"] == rows[0]["fusion_train_time_s"]  # reused: its seconds as saved
    assert last["fusion_train_threads"] == rows[0]["fusion_train_threads"]
    saved = torch.load(last["checkpoint"], weights_only=False)
    assert saved["hash_config"]["lr_fusion"] == 0.0 and last["checkpoint"] != rows[0]["checkpoint"]
    assert (checkpoint.parent / "hash8.pt").exists()  # the first run's checkpoint is still there


def test_ucmfh_reports_bad_input_without_traceback(tmp_path, monkeypatch, tiny_path):
    runner = CliRunner()
    result = runner.invoke(main, ["train-fusion", "-d", "nosuch", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "nosuch.h5: no such dataset file" in result.output
    assert "Traceback" not in result.output
    monkeypatch.chdir(tmp_path)  # a file of another kind here: named as given, not as data/features.npy.h5
    np.save("features.npy", np.zeros((3, 4)))
    result = runner.invoke(main, ["train-hash", "-d", "features.npy", "-b", "16"])
    assert result.exit_code == 2 and result.output == ("Error: features.npy: not a dataset file (an .h5 file of the "
                                                       "format, docs/data.md); convert yours with 'ucmfh convert' "
                                                       "(npz: .npy or .npz features)\n")
    result = runner.invoke(main, ["train-hash", "-d", tiny_path, "--amp", "tf32", "--device", "cpu", "--out", "runs"])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        "Error: --amp 'tf32' runs a GPU's float32 matmuls in TF32 and needs a CUDA device; this run trains on cpu "
        "(use --amp 'none' or 'bf16')")
    result = runner.invoke(main, ["train-hash", "-d", "x.h5", "-b", "4"])
    assert result.exit_code == 2 and "'--n-bits' / '-b': 4 is not in the range 8<=x<=256" in result.output
    assert "Traceback" not in result.output
    # a data folder that is not there is said so, not 'datasets in it: none'
    result = runner.invoke(main, ["train-hash", "-d", "wiki", "--data-dir", "nowhere"])
    assert result.exit_code == 2 and result.output.startswith(
        "Error: nowhere/wiki.h5: no such dataset file, and no folder nowhere (--data-dir, else $UCMFH_DATA_DIR, "
        "else data)"), result.output
    # the datasets it lists are datasets: a text file named .h5 and a codes file were listed among them
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.h5").write_text("a text file")
    shutil.copy(tiny_path, folder / "tiny.h5")
    with h5py.File(folder / "codes.h5", "w") as f:
        f.create_group("query"), f.create_group("retrieval")
    result = runner.invoke(main, ["train-hash", "-d", "wiki", "--data-dir", str(folder)])
    assert result.exit_code == 2 and f"no such dataset file (datasets in {folder}: ['tiny'])" in result.output
    # a codes file (ucmfh encode) given as the dataset: named as one, with what reads it, not '/train: missing group'
    codes = tmp_path / "codes.h5"
    with h5py.File(codes, "w") as f:
        f.attrs["format"] = "ucmfh-codes"
    result = runner.invoke(main, ["train-hash", "-d", str(codes), "-b", "16", "--out", "runs"])
    assert result.exit_code == 2 and result.output == (f"Error: {codes}: a codes file of 'ucmfh encode', not a "
                                                       f"dataset; 'ucmfh evaluate --codes {codes}' scores it\n")


def test_ucmfh_as_released_trains_no_fusion_stage_from_either_front_door(tmp_path, monkeypatch, capsys, tiny_path):
    """fusion_start=random (UCMFH's released task 1: a fusion encoder of random weights trained with the heads)
    trains the hashing stage alone: no fusion checkpoint, no fusion stage's seconds in its rows; demo.py's
    --fusion_start random is the same run (reused), and the default is another one."""
    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    argv = ["train-hash", "-d", tiny_path, "--method", "ucmfh", "-b", "16", "--epochs", "1", "--quiet", "--device",
            "cpu", "--out", str(out), "--results", str(results)]
    result = CliRunner().invoke(main, [*argv, "--method-param", "fusion_start=random"])
    assert result.exit_code == 0, result.output
    assert "fusion encoder" not in result.output and not list(out.rglob("fusion.pt"))
    rows = [json.loads(line) for line in results.read_text().splitlines() if '"hashing"' in line]
    assert rows and all("fusion_train_time_s" not in r for r in rows)
    assert {r["settings"]["hash"]["method_params"]["fusion_start"] for r in rows} == {"random"}
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    args = ["--dataset", tiny_path, "--epoch", "1", "--hash_lens", "16", "--out", str(out), "--results", "",
            "--device", "cpu", "--task", "1"]
    assert demo.main([*args, "--fusion-start", "random"]) == 0
    assert "already trained, reused" in capsys.readouterr().out
    assert demo.main(args) == 0  # task 0's encoder first, then the heads on it
    said = capsys.readouterr().out
    assert "fusion encoder: training" in said and "hashing 16 bits: training" in said and list(out.rglob("fusion.pt"))


def test_demo_tasks_0_to_3(tmp_path, monkeypatch, capsys):
    """The four tasks in this process, as demo.py's main runs them, then a missing checkpoint in a real process of
    demo.py: one line, exit 2 (each process imports torch again: seconds of the suite)."""
    runner = CliRunner()
    assert runner.invoke(main, ["make-synthetic", str(tmp_path / "toy.h5"), *TINY_ARGS]).exit_code == 0
    monkeypatch.setenv("UCMFH_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    args = ["--dataset", "toy", "--epoch", "1", "--hash_lens", "16", "--out", str(tmp_path / "runs"), "--results",
            str(tmp_path / "r.jsonl"), "--device", "cpu"]
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # put back after the test
    for task in (0, 1, 2, 3):
        assert demo.main([*args, "--task", str(task)]) == 0
        out = capsys.readouterr().out
        assert "I->T" in out and "fused: UCMFH's protocol" in out
        if task > 1:  # the model scored, named (a training task names the checkpoint it saves)
            name = "fusion.pt" if task == 2 else "hash16.pt"
            assert [line for line in out.splitlines() if line.startswith("evaluating ")][0].endswith(name), out
    # ucmfh's warnings one line each, as the ucmfh command says them (they were a file, a line and its code)
    assert getattr(warnings.showwarning, "ucmfh", False)
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["task"] for r in rows] == ["fusion"] * 2 + ["hashing"] * 2 + ["fusion"] * 2 + ["hashing"] * 2
    # the releases each row was made with (an installed copy's git_commit is None: its one record)
    import ucmfh
    assert {row["versions"]["ucmfh"] for row in rows} == {ucmfh.__version__}
    assert rows[0]["versions"]["torch"] == metadata.version("torch") and rows[0]["versions"]["scikit-learn"]
    args[args.index("--hash_lens") + 1] = "32"  # a length never trained
    missing = subprocess.run([sys.executable, str(ROOT / "demo.py"), *args, "--task", "3"],
                             env={**os.environ, "UCMFH_DATA_DIR": str(tmp_path)}, capture_output=True, text=True)
    assert missing.returncode == 2 and "train it first with --task 1" in missing.stderr
    # its training interrupted (its state saved): it said 'train it first', which then refused for want of --resume
    wanted = missing.stderr.split("error: ")[1].split(": no checkpoint")[0]
    Path(wanted.replace(".pt", ".state.pt")).write_bytes(b"")
    assert demo.main([*args, "--task", "3"]) == 2
    assert capsys.readouterr().err == f"error: {wanted}: no checkpoint of these settings yet: its training was " \
                                      "interrupted; finish it with --task 1 --resume\n"
    # task 3 found the checkpoint task 1 wrote: the same MAP
    assert (rows[7]["map_i2t"], rows[7]["map_t2i"]) == (rows[3]["map_i2t"], rows[3]["map_t2i"])
    # tasks 2 and 3 on the default dataset where no run of it is: refused before its 103 MB are made
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    monkeypatch.chdir(fresh)
    monkeypatch.delenv("UCMFH_DATA_DIR")
    assert demo.main(["--task", "3", "--epoch", "1", "--hash_lens", "16", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == "error: runs: no run on the synthetic dataset to evaluate; train one first " \
                                      "with --task 1\n"
    assert os.listdir(fresh) == []



@pytest.mark.parametrize("argv, says", [
    (["--hash_lens", "7"], "argument --hash_lens: must be in [8, 256], got 7"),
    (["--epoch", "0"], "argument --epoch: must be at least 1, got 0"),
    (["--batch_size", "1"], "argument --batch_size: must be at least 2, got 1"),
    (["--save-interval", "-1"], "argument --save-interval: must be at least 0, got -1"),
    (["--save-interval", "nan"], "argument --save-interval: expected a number, got 'nan'"),
    (["--epoch", "ten"], "argument --epoch: expected an integer, got 'ten'"),
    # training's options, which evaluating took and ignored
    (["--task", "3", "--resume"], "argument --resume: goes with --task 0 and 1 (training); --task 3 evaluates"),
    (["--task", "2", "--save-interval", "5"],
     "argument --save-interval: goes with --task 0 and 1 (training); --task 2 evaluates"),
    (["--task", "3", "--no-cuda-graph"],  # said as --cuda_graph, the flag not given
     "argument --no_cuda_graph: goes with --task 0 and 1 (training); --task 3 evaluates"),
    # the fusion stage alone has no heads whose fusion encoder it would choose
    (["--task", "0", "--fusion_start", "random"], "argument --fusion_start: chooses task 1's fusion encoder (and the "
                                                  "one task 3 evaluates); --task 0 is the fusion stage's"),
])
def test_demo_names_the_flag_of_a_bad_value(capsys, argv, says):
    """demo.py's flags are UCMFH's (--hash_lens, --epoch): a bad value is said by its flag, before any work,
    not by the setting it feeds (n_bits, epochs)."""
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    with pytest.raises(SystemExit) as ended:
        demo.parse_args(argv)
    assert ended.value.code == 2 and capsys.readouterr().err.splitlines() == [  # one line, no usage above it
        f"{demo.parser().prog}: error: {says}"]


def test_demo_takes_either_spelling_of_a_flag_and_refuses_torchrun(capsys, monkeypatch):
    """UCMFH's flags have underscores (--hash_lens, --batch_size), demo.py's own had dashes (--data-dir): each
    said 'unrecognized arguments' in the other spelling. Under torchrun every process trained the run alone and
    one of them ended in a traceback: refused in one line, naming what to run instead."""
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    args = demo.parse_args(["--data_dir", "d", "--batch-size", "64", "--save_interval=0", "--hash-lens", "32",
                            "--no-cuda-graph"])
    assert (args.data_dir, args.batch_size, args.save_interval, args.hash_lens, args.cuda_graph) == \
        ("d", 64, 0.0, 32, False)
    args = demo.parse_args(["--batch", "8", "--hash", "16", "--save", "5"])  # abbreviations, as before
    assert (args.batch_size, args.hash_lens, args.save_interval) == (8, 16, 5.0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert demo.main(["--task", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: demo.py trains in one process; under torchrun run the ucmfh "
                                              "command: torchrun --nproc-per-node N -m ucmfh train-hash")


def test_demo_names_no_remedy_it_has_no_flag_for(capsys, monkeypatch, tiny_path, tmp_path):
    """An error whose remedy is --overwrite (ucmfh's commands have it) is said by demo.py without it: demo.py
    has no --overwrite (an interrupted run's message sent its users to it)."""
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)

    def saved(*_):
        raise FileExistsError("fusion.state.pt: an interrupted run of these settings is saved here; continue it "
                              "with --resume")

    monkeypatch.setattr(demo, "check_interrupted", saved)
    code = demo.main(["--task", "0", "--dataset", tiny_path, "--out", str(tmp_path / "runs"), "--results",
                      str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.endswith("continue it with --resume\n") and "--overwrite" not in err
    assert "--resume" in {flag for action in demo.parser()._actions for flag in action.option_strings}


@click.command("crash")
def _crash():
    raise RuntimeError("a bug, not a user error")


def test_a_command_that_crashes_fails_the_test_that_ran_it():
    """The guard of conftest.py: a CliRunner result ending in an exception other than SystemExit fails the
    test at once, whatever the test then asserts (no test passes on a crash)."""
    with pytest.raises(pytest.fail.Exception, match="raised RuntimeError instead of a one-line error"):
        CliRunner().invoke(_crash, [])
    assert CliRunner().invoke(main, ["methods", "--bogus"]).exit_code == 2  # click's usage error: a SystemExit


@pytest.mark.crash_ok
def test_a_test_marked_crash_ok_sees_the_crash_itself():
    result = CliRunner().invoke(_crash, [])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)


def test_a_traceback_of_a_front_door_in_a_subprocess_fails_the_test():
    assert runs_a_front_door([sys.executable, "-m", "ucmfh", "runs"]) and runs_a_front_door([sys.executable, str(ROOT / "demo.py")])
    assert runs_a_front_door([sys.executable, str(ROOT / "scripts" / "planted_bugs.py"), "--list"])
    assert not runs_a_front_door([sys.executable, "-c", "pass"]) and not runs_a_front_door("ucmfh runs")
    no_traceback("Error: x.h5: no such dataset file\n", ["ucmfh"])
    with pytest.raises(pytest.fail.Exception, match="crashed"):
        no_traceback(b"Traceback (most recent call last):\n  File ...\nRuntimeError: x\n", ["ucmfh"])


@pytest.mark.parametrize("argv, flag, says", [
    (["--method", "cca-itq", "--loss", "infonce"], "--loss", "has a loss of its own"),
    (["--method", "cca-itq", "--loss-param", "margin=1"], "--loss-param", "has a loss of its own"),
    (["--method", "two-tower", "--fusion-epochs", "2"], "--fusion-epochs", "trains no fusion stage"),
    (["--method", "two-tower", "--set", "fusion.d_model=64"], "--set", "it has no use for fusion.d_model"),
    (["--method", "cca-itq", "--epochs", "2"], "--epochs", "is fitted in closed form"),
    (["--method", "two-tower", "--protocol", "fused"], "--protocol", "is leak-free"),
    (["--method", "two-tower", "--method-param", "nosuch=1"], "--method-param", "has no parameter 'nosuch'"),
    (["--method", "two-tower", "--loss-param", "temperature=abc"], "--loss-param", "temperature must be a number"),
    (["--method", "distill", "--loss", "triplet"], "--loss", "loss must be 'infonce'"),
    (["--method", "ucmfh", "--set", "fusion.d_model=30"], "--set", "'fusion.d_model': n_heads must divide d_model"),
    (["--method", "two-tower", "--refit", "--val-fraction", "0"], "--val-fraction", "refit needs a validation split"),
    (["--method", "two-tower", "--set", "hash.seed=1"], "--set", "'hash.seed': use --seed"),
    (["--method", "djsrh", "--beta-schedule", "none"], "--beta-schedule", "fixes beta_schedule, whatever is asked"),
    # distill's teacher is frozen while the heads train: --lr-fusion changed nothing but the run's identity
    (["--method", "distill", "--lr-fusion", "0.5"], "--lr-fusion", "fixes lr_fusion, whatever is asked"),
])
def test_a_setting_the_library_refuses_is_refused_as_its_flag(tmp_path, argv, flag, says):
    """The library names the setting (ucmfh.methods.settings); train-hash names the flag that gave it, in one
    line, exit 2, before the dataset is read."""
    result = CliRunner().invoke(main, ["train-hash", "-d", str(tmp_path / "missing.h5"), "--out",
                                       str(tmp_path / "runs"), *argv])
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert error.startswith(f"Error: Invalid value for {flag}: ") and says in error, error
    assert "no such dataset file" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command, option", [
    ("train-hash", ["--fusion-epochs", "2"]), ("train-hash", ["--set", "fusion.d_model=64"]),
    ("train-hash", ["--lr-fusion", "1e-3"]), ("grid", ["--fusion-epochs", "2"]),
])
def test_a_fusion_setting_refused_for_the_default_method_says_ucmfh_is_a_flag_away(tmp_path, command, option):
    """UCMFH was the default method until 2026-11-23: its users' commands give fusion settings without --method.
    The refusal says the method was the default and how UCMFH's two stages are asked for; not when the method was
    given, nor for a setting that is not a fusion stage's."""
    flag = "--method" if command == "train-hash" else "--methods"
    common = [command, "-d", str(tmp_path / "missing.h5"), "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(main, [*common, *option])
    assert result.exit_code == 2 and "no such dataset file" not in result.output, result.output
    assert result.output.rstrip().endswith(f"(two-tower: the default of {flag}; UCMFH's two stages: {flag} ucmfh)")
    for given in ([flag, "two-tower", *option], ["--method-param" if command == "train-hash" else "--losses",
                                                   "nosuch=1" if command == "train-hash" else "nosuch"]):
        result = CliRunner().invoke(main, [*common, *given])
        assert result.exit_code == 2 and "Error: " in result.output and "default of" not in result.output, given
    assert CliRunner().invoke(main, [*common, flag, "ucmfh", *option]).output.rstrip().endswith(
        "missing.h5: no such dataset file")  # accepted: the data was next


def test_ucmfh_losses_lists_each_loss_s_parameters_as_a_command_line_takes_them():
    """'ucmfh losses' named the losses alone: their parameters were found in error messages. Each listed
    NAME=VALUE, given back as --loss-param would give it, builds the loss with its defaults."""
    from ucmfh.app.options import parse_params
    from ucmfh.losses import LOSSES, build_loss

    lines = CliRunner().invoke(main, ["losses"]).output.splitlines()
    assert [line.split()[0] for line in lines[::2]] == list(LOSSES)
    for name, line in zip(LOSSES, lines[1::2]):
        pairs = line.split("parameters: ")[1].split(", ")
        given = parse_params(tuple(pair.replace("'", "") for pair in pairs), "--loss-param")
        default = LOSSES[name]()
        built = build_loss(name, **given)
        assert {k: getattr(built, k, None) for k in given} == {k: getattr(default, k, None) for k in given}, name
        assert set(given) == set(inspect.signature(LOSSES[name]).parameters) - {"self"}


def test_a_boolean_parameter_takes_the_spelling_ucmfh_methods_lists(tmp_path):
    """'ucmfh methods' lists cirh's centred_similarity=False; given so, it was refused as "must be a bool like its
    default False, got 'False'"."""
    from ucmfh.app.options import parse_params

    assert parse_params(("a=False", "b=True", "c=false", "d=Falsey"), "--method-param") == {
        "a": False, "b": True, "c": False, "d": "Falsey"}
    listed = CliRunner().invoke(main, ["methods"])
    assert "centred_similarity=False" in listed.output, listed.output
    result = CliRunner().invoke(main, ["train-hash", "-d", str(tmp_path / "missing.h5"), "--method", "cirh",
                                       "--method-param", "centred_similarity=False"])
    assert result.exit_code == 2 and "no such dataset file" in result.output, result.output


def test_evaluate_refuses_the_fused_protocol_for_a_leak_free_checkpoint_as_its_flag(tmp_path, tiny_path):
    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    trained = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8", "--quiet",
                                        "--device", "cpu", "--out", str(out), "--results", str(results)])
    assert trained.exit_code == 0, trained.output
    checkpoint = json.loads(results.read_text().splitlines()[0])["checkpoint"]
    result = CliRunner().invoke(main, ["evaluate", "-d", tiny_path, "-c", checkpoint, "--protocol", "fused",
                                       "--results", str(results)])
    assert result.exit_code == 2 and "Error: Invalid value for --protocol: method 'cca-itq' is leak-free" in result.output


def test_a_setting_refused_while_the_work_ran_is_said_as_its_flag():
    """val_fraction too large for the training split is found when the split is cut: said as --val-fraction
    where the command has it, as the setting's name elsewhere (a library caller)."""
    from ucmfh.app.errors import describe
    from ucmfh.config import SettingError

    err = SettingError("val_fraction", "val_fraction 0.999 of 500 training units leaves fewer than 2 to train on")
    assert describe(err, {"--val-fraction"}) == ("--val-fraction 0.999 of 500 training units leaves fewer than 2 to "
                                                 "train on")
    assert describe(err, set()) == str(err)


@pytest.mark.parametrize("rank, said", [(None, "two-tower 16 bits interrupted; run the same command with --resume "
                                                 "to continue\n"),
                                         (0, "two-tower 16 bits interrupted; run the same command with --resume "
                                             "to continue\n"), (1, "")])
def test_in_a_process_group_rank_0_alone_says_how_to_go_on(monkeypatch, capsys, rank, said):
    """Every rank of an interrupted torchrun run stops, and each said the same line (rank 1's 'training state
    saved' too, which rank 0 alone writes): in a process group rank 0 says it for all (without one, as an
    extraction shard is, each process says its own); every rank ends with the signal's code."""
    import torch.distributed as dist

    from ucmfh.app.errors import interrupted
    from ucmfh.signals import TrainingInterrupted

    monkeypatch.setenv("RANK", "1")  # torchrun's, also for extraction's shards: not what decides
    if rank is not None:  # a process group joined, this process its rank
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    with pytest.raises(SystemExit) as ended:
        interrupted(TrainingInterrupted("two-tower 16 bits interrupted", "hash16.state.pt", 2))
    assert ended.value.code == 130 and capsys.readouterr().err == said


def _import_afresh(monkeypatch, *modules: str) -> None:
    """``modules`` imported afresh by the test, as they were for the tests after it: their entries in
    ``sys.modules`` and their packages' attributes (``import ucmfh.app.cli as cli`` reads ``ucmfh.app``'s, which
    a fresh import that ran whole set to the fresh module, whose patches then missed)."""
    for module in modules:
        parent, _, child = module.rpartition(".")
        if module in sys.modules and parent in sys.modules:
            monkeypatch.setattr(sys.modules[parent], child, sys.modules[module])
        monkeypatch.delitem(sys.modules, module, raising=False)


def test_a_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """The console script imported the command (and torch: seconds) before any guard: a Ctrl-C then was a
    traceback. It now calls ucmfh.__main__.run, which imports the command inside the guard."""
    import ucmfh.__main__ as entry

    class Interrupting:  # a Ctrl-C landing while ucmfh.app.cli is imported
        def find_spec(self, name, path=None, target=None):
            if name == "ucmfh.app.cli":
                raise KeyboardInterrupt
            return None

    _import_afresh(monkeypatch, "ucmfh.app.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    with pytest.raises(SystemExit) as ended:  # the console script's sys.exit(run()), as the command's own Ctrl-C
        entry.run()
    assert ended.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    assert '"ucmfh=ucmfh.__main__:run"' in (ROOT / "setup.py").read_text()


def _signals_as_at_a_start() -> None:
    """SIGINT and SIGTERM as a process starts with them: a test of what a signal does is of nothing otherwise (a
    handler an earlier test left would hear it instead; the guard of tests/conftest.py names that test)."""
    import signal

    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == \
        (signal.default_int_handler, signal.SIG_DFL), "a signal handler left by an earlier test of this process"


def _signal_while_importing(monkeypatch, module: str, signal_name: str) -> None:
    """The signal ``signal_name`` sent to this process as ``module`` is imported (afresh), for the test's length."""
    import signal

    _signals_as_at_a_start()

    class Stopping:
        def find_spec(self, name, path=None, target=None):
            if name == module:
                os.kill(os.getpid(), getattr(signal, signal_name))
            return None

    _import_afresh(monkeypatch, module)
    monkeypatch.setattr(sys, "meta_path", [Stopping(), *sys.meta_path])


def test_every_command_is_listed_and_made_where_the_group_says():
    """The group's table (ucmfh.app.cli.COMMANDS) names each command's module and line in 'ucmfh --help': each
    entry makes the command of its name, and the help lists every one, in a line of its own."""
    from ucmfh.app.cli import COMMANDS

    for name in COMMANDS:
        command = main.get_command(None, name)
        assert isinstance(command, click.Command) and command.name == name
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0
    for name, (_, line) in COMMANDS.items():
        assert f"  {name} " in listed.output and line in listed.output
    assert main.get_command(None, "no-such-command") is None


def test_a_command_added_to_the_group_runs_and_is_listed(monkeypatch):
    """click's add_command still adds a command (another program built on the group), beside the table's."""
    @click.command("hello")
    def hello():
        """Say hello."""
        click.echo("hello")

    monkeypatch.setitem(main.commands, "hello", hello)
    assert CliRunner().invoke(main, ["hello"]).output == "hello\n"
    assert "  hello           Say hello." in CliRunner().invoke(main, ["--help"]).output


@pytest.mark.parametrize("name, said", [
    ("trian-hash", "Error: No such command 'trian-hash'; did you mean 'train-hash' or 'train-seps'?"),
    ("run", "Error: No such command 'run'; did you mean 'runs'?"),
    ("xyzzy", "Error: No such command 'xyzzy'; the commands: compare, convert, encode, evaluate, extract, grid, "
              "index, losses, make-synthetic, methods, rerank, runs, search, train-fusion, train-hash, train-seps, "
              "validate"),
])
def test_an_unknown_command_is_told_the_closest_or_the_list(name, said):
    result = CliRunner().invoke(main, [name, "--epochs", "3"])
    assert result.exit_code == 2 and result.output == said + "\n"


@pytest.mark.parametrize("command, default", [("evaluate", "the file the checkpoint was trained on"),
                                              ("encode", "the file the checkpoint was trained on"),
                                              ("train-hash", "synthetic"), ("train-fusion", "synthetic")])
def test_the_dataset_default_a_command_states_is_the_one_it_uses(command, default):
    """evaluate -c scores on the file its checkpoint was trained on (no -d: no synthetic set is made), where its
    help said '[default: synthetic]' (an audit's find)."""
    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=1000).output.split())
    assert f"[default: {default}]" in text and text.count("[default: synthetic]") == (default == "synthetic")


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["runs", "--results", "docs/results/small.jsonl"],
                                  ["runs", "--results", "docs/results/flickr8k.jsonl", "--json"]])
def test_the_help_and_the_summary_of_runs_do_not_import_torch(argv):
    """Importing torch takes 1.5-5 s: 'ucmfh --help' and 'ucmfh runs' took 2 s each before the group imported
    its commands when asked; a fresh interpreter shows that neither imports it now."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom ucmfh.app.cli import main\n"
            f"result = CliRunner().invoke(main, {argv!r})\n"
            "assert result.exit_code == 0, result.output\nprint('torch' in sys.modules)")
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "False"


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_ctrl_c_or_sigterm_while_a_command_s_module_imports_is_one_line(monkeypatch, signal_name):
    """A command's module, imported when it runs, imports torch (seconds): a Ctrl-C or SIGTERM meanwhile ends
    the command in one line and the signal's code, as at any later moment."""
    import signal

    _signal_while_importing(monkeypatch, "ucmfh.app.hashing_cli", signal_name)
    result = CliRunner().invoke(main, ["methods"])
    code, said = (130, "interrupted") if signal_name == "SIGINT" else (143, "terminated")
    assert result.exit_code == code and result.output == f"{said}\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_ctrl_c_or_sigterm_while_a_command_s_options_are_checked_is_one_line(monkeypatch, tmp_path, signal_name):
    """--device's check imports torch (a second or more): a Ctrl-C then ended 'ucmfh index' in click's
    'Aborted!' and exit 1 (an audit's find); it is one line and the signal's code, as at any later moment."""
    import signal

    from ucmfh import utils

    def stopped(value):  # the signal landing while the option is checked
        os.kill(os.getpid(), getattr(signal, signal_name))
        return value

    _signals_as_at_a_start()
    monkeypatch.setattr(utils, "resolve_device", stopped)
    # --device checked first, as given first; a signal unheard would end in the --dataset error, not train
    result = CliRunner().invoke(main, ["train-hash", "--device", "cpu", "--epochs", "1", "--dataset",
                                       str(tmp_path / "absent.h5"), "--out", str(tmp_path / "runs")])
    code, said = (130, "interrupted") if signal_name == "SIGINT" else (143, "terminated")
    assert result.exit_code == code and result.output == f"{said}\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# 'ucmfh methods' run as the console script runs it, a signal sent as click closes the command's context: after
# the command's work, in click's own main, where click said 'Aborted!' (exit 1) or SIGTERM killed it (-15)
SIGNAL_AS_CLICK_CLOSES = """
import os, signal, sys
import click
closing = click.Context.close
def close(self):
    if self.parent is None:  # the group's context: the command's own has closed
        os.kill(os.getpid(), signal.{name})
    closing(self)
click.Context.close = close
sys.argv = ["ucmfh", "methods"]
from ucmfh.__main__ import run
sys.exit(run())
"""


@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_once_the_command_s_work_is_over_ends_it_with_its_output_whole(signal_name, code):
    """A Ctrl-C just after a command's work, in click's exit, said 'Aborted!' and exit 1; a SIGTERM there or in
    the interpreter's teardown (torch loaded: a second or more) killed it silently (-15), and lines of its output
    not yet flushed were lost (an audit's finds). Now it ends at once, exit 130 or 143, its output whole."""
    ran = subprocess.run([sys.executable, "-c", SIGNAL_AS_CLICK_CLOSES.format(name=signal_name)], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert (ran.returncode, ran.stderr, ran.stdout) == (code, "", _methods_said())


SIGNAL_IN_THE_TEARDOWN = """
import os, signal, sys, time
class Late:  # freed in the interpreter's teardown, where CPython has put SIGTERM's default action back
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
late = Late()
sys.argv = ["ucmfh", "methods"]
from ucmfh.__main__ import run
sys.exit(run())
"""


def test_a_program_ends_without_the_interpreter_s_teardown_where_a_signal_killed_it():
    """After its work, a command went through the interpreter's teardown (torch loaded: a third of a second or
    more) with SIGINT and SIGTERM back at their default action: a signal there killed it (-2, -15; an audit's,
    10 of 12 Ctrl-Cs). It ends once atexit's functions have run and its output is flushed, never torn down."""
    ran = subprocess.run([sys.executable, "-c", SIGNAL_IN_THE_TEARDOWN], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert (ran.returncode, ran.stderr, ran.stdout) == (0, "", _methods_said())


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_torch_imports_is_raised_once_the_import_is_done(tmp_path, monkeypatch, signal_name):
    """Torch's import calls Python from C++ (pybind11): a Ctrl-C raised there became a C++ exception, and 'ucmfh
    train-hash' ended in 'terminate called after throwing an instance of pybind11::error_already_set' and SIGABRT
    (2 of 30 Ctrl-Cs half a second in). The programs hold the signal while torch imports, and raise it after; here
    a module of the test's stands for torch."""
    import signal

    import time

    from ucmfh.signals import hold_signals_while_importing, terminate_as_interrupt

    (tmp_path / "slow_import.py").write_text(
        "import os, signal, time\n"
        f"os.kill(os.getpid(), signal.{signal_name})\n"
        "for _ in range(20):\n    time.sleep(0.001)  # where the interrupt was raised, the module half run\n"
        "DONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_import", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    restore = terminate_as_interrupt()  # SIGTERM as the programs have it: an interrupt that remembers the signal
    try:
        hold_signals_while_importing("slow_import")
        with pytest.raises(KeyboardInterrupt) as stopped:  # SIGTERM's too, remembering its signal
            import slow_import  # noqa: F401 - imported for its run
            assert slow_import.DONE  # imported whole, the signal held
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # then raised where this code runs
                time.sleep(0.001)
    finally:
        restore()
    assert sys.modules["slow_import"].DONE  # its whole module ran; the interrupt came after
    assert getattr(stopped.value, "signum", signal.SIGINT) == getattr(signal, signal_name)
    assert not [f for f in sys.meta_path if type(f).__name__ == "_HoldSignalsWhileImporting"]  # gone once used
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@functools.lru_cache(maxsize=None)
def _methods_said() -> str:
    """What 'ucmfh methods' says, all of it, in a process of its own (this one's registry may hold a test's
    methods)."""
    whole = subprocess.run([sys.executable, "-m", "ucmfh", "methods"], cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert whole.returncode == 0 and "two-tower" in whole.stdout, whole.stderr
    return whole.stdout


def test_cuda_graphs_asked_for_on_the_cpu_train_eagerly_and_say_so(tmp_path, tiny_path):
    """--cuda-graph where no step can be captured (here: the CPU) trains the run it names, the same model and
    row as without it (a capture is not part of a run's identity), and says why before the epochs."""
    results, out = tmp_path / "r.jsonl", tmp_path / "runs"
    args = ["train-hash", "-d", tiny_path, "-b", "8", "--epochs", "1", "--quiet", "--device", "cpu", "--out",
            str(out), "--results", str(results)]
    asked = CliRunner().invoke(main, [*args, "--cuda-graph"])
    assert asked.exit_code == 0, asked.output
    note = [line for line in asked.output.splitlines() if line.startswith("note: ")]
    assert note == ["note: CUDA graphs asked for, but two-tower 8 bits runs eagerly: CUDA graphs need a CUDA "
                    "device, and it trains on cpu"]
    assert asked.output.index(note[0]) < asked.output.index("I->T")
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "reused" in again.output and "note: " not in again.output
    first, second = (json.loads(line) for line in results.read_text().splitlines() if '"hashing"' in line)
    assert (first["map_i2t"], first["checkpoint"]) == (second["map_i2t"], second["checkpoint"])
    # the CPU threads the stage trained with, as saved: the row of the reused checkpoint says the training's too
    assert first["train_threads"] == second["train_threads"] == torch.get_num_threads()


@pytest.mark.parametrize("argv, said", [
    (["encode", "-c", "hash16.pt", "-o", ""], "--out: an empty path; give the file to write"),
    (["index", "coll.h5", "-c", "hash16.pt", "-o", ""], "--out: an empty path; give the folder to write"),
    (["runs", "--plot", ""], "Invalid value for --plot: an empty prefix; give the figures' path prefix (PREFIX_*.png)"),
    (["grid", "-d", "TINY", "-b", "16", "--epochs", "1", "--results", "g.jsonl", "--table", ""],
     "--table: an empty path; give the file to write"),
    (["train-hash", "-d", "TINY", "-b", "16", "--out", ""], "--out: an empty path; give the folder to write"),
    (["train-hash", "-d", "TINY", "--max-memory", "nan"],
     "Invalid value for '--max-memory': 'nan': expected a finite size such as 500MB or 8GiB"),
    (["train-hash", "-d", "TINY", "--batch-size", "99999999999999999999"],
     "Invalid value for '--batch-size': 99999999999999999999 is beyond any count here (at most 2147483647)"),
    (["grid", "-d", "TINY", "--jobs", "abc"], "Invalid value for '--jobs' / '-j': 'abc' is not a valid integer."),
    (["train-hash", "-d", "TINY", "--save-interval", "nan"], "Invalid value for '--save-interval': 'nan' is not a "
                                                             "finite number"),
    (["train-seps", "-d", "TINY", "--lr", "inf"], "Invalid value for '--lr': 'inf' is not a finite number"),
    (["train-hash", "-d", "TINY", "--loss-param", "temperature=0.1", "--loss-param", "temperature=0.2"],
     "Invalid value for --loss-param: temperature given twice (temperature=0.1 and temperature=0.2); give it once"),
    (["train-hash", "-d", "TINY", "-b", "16", "--set", "hash.hidden=2147483648"],
     "Invalid value for --set: 'hash.hidden': hidden must be in [0, 2147483647] (0: a linear head), got 2147483648"),
    # an override of a flag given too: the override won silently in train-fusion
    (["train-fusion", "-d", "TINY", "--epochs", "1", "--set", "fusion.epochs=2"],
     "Invalid value for --set: 'fusion.epochs': use --epochs"),
    (["train-fusion", "-d", "TINY", "--loss", "pairwise", "--loss-param", "temperature=0.1"],  # not '--loss'
     "Invalid value for --loss-param: loss 'pairwise' has no parameter 'temperature' (its parameters: alpha, "
     "normalize)"),
    (["train-hash", "-d", "wiki", "--data-dir", ""], "--data-dir: an empty path; give the folder of NAME.h5 dataset "
                                                     "files"),
    (["runs", "--history", ""], "Invalid value for --history: an empty run key; give a checkpoint file or a run key"),
    (["compare", "a", "b", "--resamples", "2147483647"],  # 17 GB asked for, then 'not enough memory'
     "Invalid value for '--resamples': 2147483647 is not in the range 100<=x<=1000000."),
    (["make-synthetic", "s.h5", "--n-query", "99999999999", "--n-retrieval", "99999999999"],
     "not enough memory for what was asked (Unable to allocate 1.46 TiB for an array with shape (199999999998,) and "
     "data type int64); ask for less"),
])
def test_an_empty_output_path_and_a_number_beyond_reason_are_refused_before_work(tmp_path, tiny_path, monkeypatch,
                                                                                argv, said):
    """'' wrote './.md', './_wiki_map_i2t.png' or into the current folder; NaN and infinities passed click's
    bounds into a traceback, or (--save-interval nan) into never saving; a batch of 10^20 items failed after
    training had started, in a message naming no flag. Each is one line before anything runs, and nothing is
    written. The line is all the command prints: no usage above it."""
    monkeypatch.chdir(tmp_path)
    argv = [tiny_path if arg == "TINY" else arg for arg in argv]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"Error: {said}"], result.output
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, said", [
    (["runs", "r.jsonl"], "Got unexpected extra argument (r.jsonl); give it as --results r.jsonl"),
    (["train-hash", "toy.h5"], "Got unexpected extra argument (toy.h5); give it as --dataset toy.h5"),
    (["evaluate", "toy.h5"], "Got unexpected extra argument (toy.h5); give it as --dataset toy.h5 or --codes toy.h5"),
    (["runs", "toy.h5"], "Got unexpected extra argument (toy.h5)"),  # runs reads no dataset: no flag named
    (["runs", "notes"], "Got unexpected extra argument (notes)"),
])
def test_a_file_given_without_its_flag_is_told_the_flag(argv, said):
    """A new user's 'ucmfh runs results.jsonl': the one line names the flag that takes such a file, where the
    command has one, and no other."""
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"Error: {said}"], result.output


@pytest.mark.parametrize("argv, said", [
    (["train-hash", "-d", "a.h5", "-d", "b.h5", "-b", "16", "-b", "32"], "Option '--dataset' / '-d' given twice"),
    (["train-hash", "--epochs", "1", "--seed", "1", "--epochs=2"], "Option '--epochs' given twice"),
    (["train-hash", "--results", "a.jsonl", "--results", "b.jsonl", "--results", "c.jsonl"],
     "Option '--results' given 3 times"),
    (["train-hash", "--cuda-graph", "--no-cuda-graph"], "Option '--cuda-graph' / '--no-cuda-graph' given twice"),
    (["evaluate", "-c", "x.pt", "-d", "a.h5", "--dataset", "b.h5"], "Option '--dataset' / '-d' given twice"),
    (["search", "index", "-q", "q.npy", "-k", "3", "-k", "1"], "Option '--k' / '-k' given twice"),
])
def test_an_option_of_one_value_given_twice_is_refused_before_work(tmp_path, monkeypatch, argv, said):
    """click keeps the last of an option given twice, silently: 'train-hash -d a.h5 -d b.h5' trained b alone and
    '--results a --results b' never wrote a. One line, exit 2, before any file is read; options that take several
    (-b) repeat as before."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"Error: {said}; give it once (only the last would count)"], result.output
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, said", [
    (["--hash_lens", "16", "--hash-lens=32"],
     "argument --hash_lens: given twice (--hash_lens 16, then --hash_lens 32)"),
    (["--dataset", "a", "--epoch", "2", "--dataset", "b"],
     "argument --dataset: given twice (--dataset a, then --dataset b)"),
    (["--resume", "--resume"], "argument --resume: given twice (--resume, then --resume)"),
])
def test_demo_refuses_a_flag_given_twice(capsys, argv, said):
    spec = importlib.util.spec_from_file_location("demo", ROOT / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    with pytest.raises(SystemExit) as ended:
        demo.parse_args(argv)
    assert ended.value.code == 2 and capsys.readouterr().err.splitlines() == [
        f"{demo.parser().prog}: error: {said}; give it once (only the last would count)"]
    assert "_given" not in vars(demo.parse_args(["--hash_lens", "16", "--cuda_graph"]))  # nothing left behind


def test_a_run_refused_once_started_leaves_no_folder_of_its_lock_alone(tmp_path, tiny_path):
    """A setting refused once the run has its folder (a validation split that leaves nothing to train on) left
    'runs/DATASET-FP/RUN/hash16.lock' behind, an empty run; the folder of a run that saved something stays."""
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "-b", "16", "--epochs", "1", "--val-fraction",
                                       "0.999", "--out", str(out), "--results", ""])
    assert result.exit_code == 2 and "training needs at least 2" in result.output
    assert not out.exists() or os.listdir(out) == []
    kept = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "-b", "16", "--epochs", "1", "--out", str(out),
                                     "--results", ""])
    assert kept.exit_code == 0 and len(list(out.glob("*/*/hash16.pt"))) == 1
    # a fusion stage refused once started, under its hashing run (ucmfh): its folder kept its fusion.lock alone
    from ucmfh.data.writer import write_dataset

    one = write_dataset(tmp_path / "one.h5", {s: {"image": np.eye(n, 4), "text": np.eye(n, 3)[::-1],
                                                  "labels": np.eye(3, dtype=np.uint8)[np.arange(n) % 3]}
                                              for s, n in (("train", 1), ("query", 3), ("retrieval", 6))})
    fusion = CliRunner().invoke(main, ["train-hash", "-d", one, "-b", "16", "--epochs", "1", "--method", "ucmfh",
                                       "--val-fraction", "0", "--out", str(tmp_path / "ucmfh"), "--results", ""])
    assert fusion.exit_code == 2 and "the fusion stage: 1 training item" in fusion.output, fusion.output
    assert not (tmp_path / "ucmfh").exists() or os.listdir(tmp_path / "ucmfh") == []


def test_torch_out_of_memory_is_a_user_error_and_other_runtime_errors_are_not():
    """A width beyond the machine ('DefaultCPUAllocator: can't allocate memory', CUDA's OutOfMemoryError) is one
    line and exit 2, as numpy's MemoryError is; any other RuntimeError stays a bug, shown whole."""
    from ucmfh.app.errors import as_user_error, describe

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 1099511627776 bytes.\nmore")
    said = describe(as_user_error(cpu))
    assert said.startswith("not enough memory for what was asked ([enforce fail") and "more" not in said
    oom = type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 9 GiB")
    assert isinstance(as_user_error(oom), MemoryError)
    bug = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    assert as_user_error(bug) is bug


def test_a_run_of_several_candidates_says_how_many_trainings_and_each_bar_which_it_is(tmp_path, tiny_path,
                                                                                     monkeypatch):
    """The default trains two temperatures a code length and keeps the better on validation: its first bar's
    time was read as the run's, and a second bar began without a word. Each length's training says how many
    trainings of up to how many epochs; each bar names its candidate and which of how many (its TensorBoard part,
    state and log keep the candidate's name alone)."""
    import ucmfh.trainer as trainer
    from ucmfh.app.experiment import trainings_line
    from ucmfh.methods.settings import stage_configs

    bars = []

    class Bar:
        def __init__(self, *args, **kwargs):
            bars.append(kwargs["desc"])

        def update(self, k):
            pass

        def set_postfix(self, **_):
            pass

        def close(self):
            pass

    monkeypatch.setattr(trainer, "tqdm", Bar)
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "-b", "16", "-b", "32", "--epochs", "2",
                                       "--set", "hash.hidden=32", "--out", str(tmp_path / "runs"), "--results",
                                       str(tmp_path / "r.jsonl")])
    assert result.exit_code == 0, result.output
    said = ("      2 candidates chosen on the validation split (t0.3, t0.1): 2 trainings of up to 2 epochs; early "
            "stopping may end each sooner")
    lines = result.output.splitlines()
    assert lines.count(said) == 2 and all(lines[lines.index(said, start) - 1].startswith(f"hashing {bits} bits: training")
                                          for start, bits in ((0, 16), (lines.index(said) + 1, 32))), result.output
    assert bars == [f"two-tower {bits} bits (t{t}, candidate {i} of 2)" for bits in (16, 32)
                    for i, t in ((1, "0.3"), (2, "0.1"))]
    for method, given, said in (("two-tower", {"val_fraction": 0.0}, None), ("cca-itq", {}, None),
                                ("two-tower", {"refit": True}, ", then the chosen one trained again"),
                                ("two-tower", {"epochs": 1}, " trainings of up to 1 epoch; ")):  # was '1 epochs'
        _, (hcfg,) = stage_configs(method, dataset="wiki", **given)
        line = trainings_line(hcfg)
        assert line is None if said is None else said in line


# A program (python -m ucmfh, demo.py) signalled as MODULE is imported: a KeyboardInterrupt raised inside an exec of
# a string (as a dataclass's methods are made) left CPython's mark of a Ctrl-C unhandled, and the process, stopped
# in one line, was then killed by SIGINT at its exit (-2; an audit's, 5 of 40 SIGTERMs a tenth of a second in);
# raised inside a class body, it became another error (a traceback, exit 1). Held until the imports were done, it
# took seconds to act (a second audit's: a Ctrl-C 0.26 s into demo.py ended it 4 s later). Nothing imported after
# the signal is written to MARKER: the program ends at once.
SIGNAL_IN_AN_IMPORT = """
import os, signal, sys
class Killing:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.{name})
class Stopping:
    sent = False
    def find_spec(self, name, path=None, target=None):
        if Stopping.sent:
            with open({marker!r}, "a") as f:
                f.write(name + "\\n")
        if name == "{module}" and not Stopping.sent:
            Stopping.sent = True
            if "{where}" == "exec":
                exec("os.kill(os.getpid(), signal.{name})", {{"os": os, "signal": signal}})
            elif "{where}" == "class":  # Python 3.11 raises RuntimeError('Error calling __set_name__ ...') over it
                type("Holder", (), {{"killing": Killing()}})
            else:
                os.kill(os.getpid(), signal.{name})
        return None
sys.meta_path.insert(0, Stopping())
"""
DEMO = [str(ROOT / "demo.py"), "--task", "3", "--dataset", "absent.h5"]


@pytest.mark.parametrize("program, module, where, signal_name", [
    (["-m", "ucmfh", "methods"], "click", "plain", "SIGINT"),  # the group's imports (click, ucmfh.app.errors, ...)
    (["-m", "ucmfh", "methods"], "ucmfh.app.cli", "plain", "SIGTERM"),
    (["-m", "ucmfh", "methods"], "ucmfh.app.cli", "exec", "SIGTERM"),
    (["-m", "ucmfh", "methods"], "ucmfh.app.hashing_cli", "class", "SIGINT"),  # the command's
    (DEMO, "ucmfh.app.experiment", "plain", "SIGINT"),  # demo.py's, its training module
    (DEMO, "ucmfh.app.experiment", "class", "SIGTERM"),
])
def test_a_signal_while_a_program_imports_ends_it_at_once_in_one_line(tmp_path, program, module, where, signal_name):
    marker = tmp_path / "imported_after.txt"
    (tmp_path / "sitecustomize.py").write_text(SIGNAL_IN_AN_IMPORT.format(module=module, name=signal_name,
                                                                          where=where, marker=str(marker)))
    ran = subprocess.run([sys.executable, *program], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}, timeout=120)
    code, said = (130, "interrupted\n") if signal_name == "SIGINT" else (143, "terminated\n")
    assert (ran.returncode, ran.stderr, ran.stdout) == (code, said, "")
    assert not marker.exists(), marker.read_text()


def test_an_error_said_to_a_standard_error_that_cannot_take_it_keeps_its_exit(tmp_path):
    """'2>/dev/full': click's message of an error raised OSError, past the command's end: exit 1 and a teardown;
    '2>&-': click wrote the error into standard output, the user's file. Exit 2 both, standard output clean."""
    argv = [sys.executable, "-m", "ucmfh", "runs", "--results", str(tmp_path / "absent.jsonl")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        ran = subprocess.run(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=full, env=env, timeout=120)
    assert (ran.returncode, ran.stdout) == (2, b"")
    ran = subprocess.run(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=None, env=env, timeout=120,
                         preexec_fn=lambda: os.close(2))
    assert (ran.returncode, ran.stdout) == (2, b"")


@pytest.mark.parametrize("command", ["train-hash", "grid"])
def test_the_help_s_training_defaults_are_the_default_method_s(command):
    """--val-fraction and --patience said 0 and 5 (FusionConfig's), where the default method holds out a tenth and
    stops after 10 (an audit's): the help names the values the default method and ucmfh run with."""
    from ucmfh.methods import DEFAULT_METHOD
    from ucmfh.methods.settings import stage_configs

    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=2000).output.split())
    for setting in ("val_fraction", "patience"):
        said = ", ".join(f"{getattr(stage_configs(m).hashes[0], setting):g} for {m}" for m in (DEFAULT_METHOD, "ucmfh"))
        assert f"[default: the method's (see 'ucmfh methods'): {said}]" in text, setting
    assert f"{stage_configs(DEFAULT_METHOD).hashes[0].epochs} for {DEFAULT_METHOD}; ucmfh's" in text


@pytest.mark.parametrize("command", [["train-hash"], ["grid"], ["runs"], ["compare", "cca-itq", "two-tower"]])
def test_code_lengths_as_a_list_are_said_to_take_a_flag_each(command, tmp_path):
    """'-b 8,16' (as grid's --methods and --seeds take their lists) was "'8,16' is not a valid integer range"."""
    result = CliRunner().invoke(main, [*command, "-b", "8,16", "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        "Error: Invalid value for '--n-bits' / '-b': '8,16': one code length a -b: -b 8 -b 16"), result.output


@pytest.mark.parametrize("argv, said", [
    (["train-hash", "--method", "two-towr"], "'two-towr' is not one of 'ucmfh', 'two-tower', "),
    (["train-hash", "--loss", "infonc"], "unknown loss 'infonc' (did you mean 'infonce'?); choose one of "),
    (["grid", "--methods", "cca-itq,two-towr"], "unknown methods ['two-towr'] (did you mean 'two-tower'?); methods: "),
    (["grid", "--losses", "balancd"], "unknown losses ['balancd'] (did you mean 'balanced'?); losses: "),
    (["grid", "--loss-params", "infonc:temperature=1"], "unknown loss 'infonc' (did you mean 'infonce'?); losses: "),
])
def test_a_mistyped_method_or_loss_name_is_said_with_the_name_meant(argv, said, tiny_path, tmp_path):
    """A method or loss name mistyped was refused with the whole list alone, where click suggests a mistyped
    option's name (an audit's)."""
    result = CliRunner().invoke(main, [*argv, "-d", tiny_path, "-b", "8", "--results", str(tmp_path / "r.jsonl"),
                                       "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and said in result.output, result.output
    assert "did you mean" in result.output.splitlines()[-1]
    from ucmfh.methods import build_method

    with pytest.raises(ValueError, match=r"^unknown method 'jdhs' \(did you mean 'jdsh'\?\); methods: ucmfh, "):
        build_method("jdhs")
    with pytest.raises(ValueError, match=r"^unknown method 'zzz'; methods: "):  # nothing near it: the list alone
        build_method("zzz")


def test_one_parameter_of_the_method_or_the_loss_is_set_as_compare_names_it(tiny_path, tmp_path):
    """'--set hash.loss_params.temperature=0.1', the path 'compare two-tower@hash.loss_params.temperature=0.1' and
    'runs' take, was refused ('hash settings are ...'), and a grid had no way to a method's parameter but a JSON
    dict (an audit's)."""
    from ucmfh.app.options import parse_overrides

    assert parse_overrides(("hash.loss_params.temperature=0.1", "hash.method_params.temperatures=0.2",
                            "hash.hidden=32")) == {"hash": {"loss_params": {"temperature": 0.1}, "hidden": 32,
                                                            "method_params": {"temperatures": 0.2}}}
    for twice in (("hash.loss_params.temperature=0.1", 'hash.loss_params={"temperature": 0.3}'),
                  ('hash.loss_params={"temperature": 0.3}', "hash.loss_params.temperature=0.1")):
        with pytest.raises(click.BadParameter, match="given twice"):
            parse_overrides(twice)
    results = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "two-tower", "-b", "8", "--epochs", "1",
                                       "--set", "hash.method_params.temperatures=0.2", "--set", "hash.hidden=32",
                                       "--results", str(results), "--out", str(tmp_path / "runs"), "--table",
                                       str(tmp_path / "t"), "--quiet"])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["settings"]["hash"]["method_params"]["temperatures"] == "0.2"


def test_methods_and_losses_list_themselves_as_json_for_a_script():
    """A script could list the methods and losses only by reading their tables (an audit's): --json gives a line
    of each, as the registries hold it."""
    from ucmfh.losses import LOSSES, loss_params
    from ucmfh.methods import METHODS

    methods = [json.loads(line) for line in CliRunner().invoke(main, ["methods", "--json"]).output.splitlines()]
    assert [m["name"] for m in methods] == list(METHODS)
    for method in methods:
        spec = METHODS[method["name"]]
        as_json = json.loads(json.dumps([spec.params, spec.fixed, spec.defaults]))  # tuples as lists
        assert [method["params"], method["fixed"], method["defaults"]] == as_json
        assert method["description"] == spec.description
    assert methods[1]["name"] == "two-tower" and methods[1]["loss"] == "infonce" and methods[1]["package"] is None
    losses = [json.loads(line) for line in CliRunner().invoke(main, ["losses", "--json"]).output.splitlines()]
    assert [(x["name"], x["params"]) for x in losses] == [(name, loss_params(name)) for name in LOSSES]


def test_no_help_shows_a_bound_or_default_of_none():
    """click writes an unset bound as None: -b of runs and compare read '[x<=None]' under their help."""
    for name, command in cli_commands():
        text = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=200).output
        assert "None" not in text.replace("(None", ""), name
