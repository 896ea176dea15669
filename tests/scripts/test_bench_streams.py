"""scripts/bench_streams.py on the CPU (threads without streams: streams are CUDA's): a row per stage asked for,
the three walls measured over the same number of steps, the fits run in processes and in threads side by side;
a fit that fails in a thread is raised, not lost; a bad flag is one line, exit 2."""
from __future__ import annotations

import json
import sys
import threading

import pytest
import torch

from conftest import load_script

bench = load_script("bench_streams")
sys.modules["bench_streams"] = bench  # the module a spawned worker's function is pickled from, and found by
SMALL = ["--device", "cpu", "--n-bits", "16", "--width", "16", "--steps", "2", "--epochs", "1", "--runs", "2"]


def test_a_stage_s_row_has_the_three_walls_and_says_whether_the_models_are_one(capsys):
    bench.main(SMALL + ["--only", "djsrh", "--json"])  # one stage: each way's processes take seconds to start
    out = json.loads(capsys.readouterr().out)
    assert list(out["stages"]) == ["djsrh"] and out["device"] == "cpu"
    for name, batch in (("djsrh", 32),):
        row = out["stages"][name]
        assert row["batch_size"] == batch and row["runs"] == 2 and row["steps"] == 2 * 2 * 1
        assert row["one_after_another_s"] > 0 and row["side_by_side_s"] > 0 and row["processes_s"] > 0
        assert len(row["processes_models"]) == 2  # each process's fit came back (its threads: the CPU's split)
        # graphs are CUDA's: on the CPU no fit captures, and none was asked to
        assert row["side_by_side_captures"] == row["side_by_side_replays"] == 0
        assert row["side_by_side_eager_because"] == []
        # one seed, one data: the fits in turn train one model, and side by side (their draws their own) that one
        assert row["same_models_in_turn"] and row["same_models_side_by_side"]
        assert len(set(row["one_after_another_models"] + row["side_by_side_models"])) == 1


def test_side_by_side_runs_each_fit_in_a_thread_of_its_own_and_raises_a_fit_s_error():
    seen = []
    barrier = threading.Barrier(3, timeout=10)  # all three at once, or the barrier breaks

    def fit():
        seen.append(threading.current_thread().name)
        barrier.wait()

    seconds, _ = bench.side_by_side([lambda: (fit(), torch.nn.Linear(1, 1))[1]] * 3, "cpu")
    assert seconds > 0 and len(set(seen)) == 3 and threading.main_thread().name not in seen

    def broken():
        raise ValueError("a fit's own error")

    with pytest.raises(ValueError, match="a fit's own error"):
        bench.side_by_side([broken, lambda: None], "cpu")


@pytest.mark.parametrize("argv, flag", [(["--only", "cca-itq"], "--only"), (["--runs", "0"], "--runs"),
                                        (["--steps", "0"], "--steps"), (["--epochs", "0"], "--epochs")])
def test_a_bad_flag_is_refused_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--device", "cpu"] + argv)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err.strip().splitlines()[-1]
