"""scripts/bench_steps.py on the CPU (eager only: graphs are CUDA's): a row per stage asked for, each at its
method's own batch size unless one is given, its JSON the same figures; a bad flag is one line, exit 2."""
from __future__ import annotations

import json

import pytest

from conftest import load_script

bench = load_script("bench_steps")
SMALL = ["--device", "cpu", "--n-bits", "16", "--width", "16", "--steps", "2", "--repeats", "1"]


def test_a_row_per_stage_at_each_method_s_own_batch_size(capsys):
    bench.main(SMALL + ["--only", "daeh", "--only", "jdsh"])
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["stage", "batch", "eager", "ms", "graph", "ms", "speed-up", "captures", "replays"]
    assert [row.split()[:2] for row in rows] == [["daeh", "18"], ["jdsh", "32"]]  # in the order asked
    for row in rows:
        assert row.split()[3:] == ["-", "-", "-", "-"]  # no graph on the CPU


def test_json_gives_seconds_a_step_at_the_batch_asked_for(capsys):
    bench.main(SMALL + ["--only", "two-tower", "--batch-size", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "cpu" and out["steps"] == 2 and set(out["stages"]) == {"two-tower"}
    row = out["stages"]["two-tower"]
    assert row["batch_size"] == 8 and set(row) == {"batch_size", "eager", "eager_first_epoch"}


@pytest.mark.parametrize("argv, flag", [(["--only", "cca-itq"], "--only"), (["--batch-size", "1"], "--batch-size"),
                                        (["--steps", "0"], "--steps"), (["--repeats", "0"], "--repeats"),
                                        (["--compile"], "--compile"), (["--tf32"], "--tf32")])
def test_a_bad_flag_is_refused_in_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--device", "cpu"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and flag in err[-1]


def test_on_cuda_both_paths_are_timed_and_the_captured_one_replays(capsys, monkeypatch):
    """On the CUDA stand-in, with its graphs (tests/test_captured_step.py): a row has the eager and the captured
    milliseconds, and the captured fits did capture and replay."""
    import ucmfh.captured_step as captured_module
    from cuda_standin import cuda_standin
    from test_captured_step import StandinGraphs

    StandinGraphs.log = []
    monkeypatch.setattr(captured_module, "CudaGraphs", StandinGraphs)
    with cuda_standin(monkeypatch):
        bench.main(["--device", "cuda", "--n-bits", "16", "--width", "16", "--steps", "6", "--repeats", "1",
                    "--only", "djsrh"])
    header, row = capsys.readouterr().out.splitlines()
    name, batch, eager, graph, ratio, captures, replays = row.split()
    assert (name, batch) == ("djsrh", "32") and graph != "-"  # timed (wall-clock noise may make it any number)
    float(eager), float(graph)
    # the graph path's captures and replays, counted (a path that fell back to eager would show none)
    assert int(captures) == StandinGraphs.log.count("capture") > 0
    assert int(replays) == StandinGraphs.log.count("replay") > 0
    assert captured_module.CudaGraphs is StandinGraphs  # the counting is the run's alone


def test_tf32_times_the_captured_step_with_tf32_matmuls(capsys, monkeypatch):
    """--tf32 on the CUDA stand-in: a third figure, the captured step timed again with its matmuls in TF32 (the
    precision read at each capture), and torch's setting as it was afterwards."""
    import torch

    import ucmfh.captured_step as captured_module
    from cuda_standin import cuda_standin
    from test_captured_step import StandinGraphs

    matmul, seen = torch.backends.cuda.matmul, []

    class Watched(StandinGraphs):
        def capture(self, body, before, stream):
            seen.append(matmul.fp32_precision)
            return super().capture(body, before, stream)

    monkeypatch.setattr(captured_module, "CudaGraphs", Watched)
    with cuda_standin(monkeypatch):
        bench.main(["--device", "cuda", "--n-bits", "16", "--width", "16", "--steps", "6", "--repeats", "1",
                    "--only", "djsrh", "--tf32"])
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-4:] == ["tf32", "ms", "vs", "graph"]
    assert row.split()[0] == "djsrh" and row.split()[-1].endswith("x") and float(row.split()[-2]) > 0
    assert seen == ["none", "tf32"] and matmul.fp32_precision == "none"


def test_a_graph_path_that_ran_eagerly_says_why(capsys, monkeypatch):
    """A capture refused on the GPU: the stage's row shows no capture and a line says why, not a speed-up of 1.0x
    with nothing to tell it from a graph that gained nothing."""
    import ucmfh.captured_step as captured_module
    from cuda_standin import cuda_standin
    from test_captured_step import StandinGraphs

    class RefusingGraphs(StandinGraphs):
        def capture(self, body, before, stream):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(captured_module, "CudaGraphs", RefusingGraphs)
    with cuda_standin(monkeypatch):
        bench.main(["--device", "cuda", "--n-bits", "16", "--width", "16", "--steps", "6", "--repeats", "1",
                    "--only", "djsrh"])
    header, row, why = capsys.readouterr().out.splitlines()
    assert row.split()[0] == "djsrh" and row.split()[-2:] == ["0", "0"]  # no capture, no replay
    assert why == ("  djsrh 16 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: operation not "
                   "permitted when stream is capturing)")


@pytest.mark.parametrize("as_json", [False, True])
def test_a_stop_keeps_the_stages_timed_and_exits_as_the_signal(capsys, monkeypatch, as_json):
    """The checklist caps the step with SIGTERM: the stages timed before it stay (their lines, or the JSON), one
    line names the stage it stopped in, and the exit code is the signal's (143), not a traceback."""
    from ucmfh.signals import TrainingInterrupted

    timed = iter([(0.002, 0.1)])

    def seconds_a_step(stage, *args):
        for seconds in timed:
            return seconds
        raise TrainingInterrupted(f"{stage.name} interrupted by SIGTERM; nothing saved", None, 15)

    monkeypatch.setattr(bench, "seconds_a_step", seconds_a_step)
    with pytest.raises(SystemExit) as exit_:
        bench.main(SMALL + ["--only", "two-tower", "--only", "jdsh"] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert exit_.value.code == 143
    assert err.strip() == "stopped while timing jdsh (jdsh interrupted by SIGTERM; nothing saved); 1 stage(s) timed"
    if as_json:
        assert set(json.loads(out)["stages"]) == {"two-tower"}
    else:
        assert [line.split()[0] for line in out.splitlines()] == ["stage", "two-tower"]
