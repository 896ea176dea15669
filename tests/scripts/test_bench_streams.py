"""scripts/bench_streams.py on the CPU (threads without streams: streams are CUDA's): a row per stage asked for,
both walls measured over the same number of steps, the fits run in threads side by side; a fit that fails in a
thread is raised, not lost; a bad flag is one line, exit 2."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from conftest import load_script

bench = load_script("bench_streams")
SMALL = ["--device", "cpu", "--n-bits", "16", "--width", "16", "--steps", "2", "--epochs", "1", "--runs", "2"]


def test_a_row_per_stage_with_both_walls(capsys):
    bench.main(SMALL + ["--only", "djsrh", "--only", "two-tower", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert list(out["stages"]) == ["djsrh", "two-tower"] and out["device"] == "cpu"
    for name, batch in (("djsrh", 32), ("two-tower", 128)):
        row = out["stages"][name]
        assert row["batch_size"] == batch and row["runs"] == 2 and row["steps"] == 2 * 2 * 1
        assert row["one_after_another_s"] > 0 and row["side_by_side_s"] > 0
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
