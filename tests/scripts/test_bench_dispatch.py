"""scripts/bench_dispatch.py's arithmetic: a step's count and an epoch's own, parted by two epoch lengths,
predict a third epoch's count exactly; its JSON has every stage asked for; a bad flag is one line, exit 2."""
from __future__ import annotations

import argparse
import json

import pytest

from conftest import load_script

bench = load_script("bench_dispatch")
SMALL = ["--batch-size", "16", "--n-bits", "16", "--width", "16"]


def test_a_step_and_an_epoch_s_own_count_predict_an_epoch_of_another_length(tmp_path):
    args = argparse.Namespace(batch_size=16, n_bits=16, width=16, only=["two-tower"])
    stage, = bench.stages(args, "cuda", tmp_path)
    parts = bench.per_step(stage, 16, "standin", epochs=1, steps=(2, 4))
    step, once = parts["step"], parts["epoch"]
    assert step.whole() and step.total() > 0 and step.ops["device"]["aten.mm"] >= 2  # each tower's product
    assert step.syncs == 0 and once.syncs == 1  # the epoch's read of its loss
    measured = bench.epoch(stage, 3, 1, 16, "standin")  # fits of 1 and 2 epochs on 3 × 16 items
    assert (measured - (step.scaled(3) + once)).zero()


def test_json_has_a_step_and_an_epoch_of_the_stage_asked_for(capsys):
    bench.main(SMALL + ["--only", "jdsh", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "standin" and out["batch_size"] == 16
    assert set(out["stages"]) == {"jdsh"}
    for parts in out["stages"].values():
        assert sum(parts["step"]["device"].values()) > 0 and parts["step"]["syncs"] == 0


@pytest.mark.parametrize("argv, flag", [(["--only", "cca-itq"], "--only"), (["--batch-size", "1"], "--batch-size"),
                                        (["--epochs", "0"], "--epochs")])
def test_a_bad_flag_is_refused_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err.splitlines()[-1]
