"""scripts/speed_report.py reads a `gpu_checklist.sh speed` folder as the checklist and its scripts write it:
each goal's row holds the measured figure and says whether it is met; a step that failed or did not run says
so instead of a figure."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_script

report = load_script("speed_report")
grid_jobs = load_script("bench_grid_jobs")
CHECKLIST = Path(__file__).resolve().parents[2] / "scripts" / "gpu_checklist.sh"
SUMMARY_FORMAT = "%-12s rc=%-3s %4d.%03d s"  # the checklist's printf


def _summary(steps):
    return "".join(SUMMARY_FORMAT % (name, rc, ms // 1000, ms % 1000) + "\n" for name, rc, ms in steps)


def _folder(tmp_path, monkeypatch, capsys, graph_s=12.5, flickr_rc=0):
    out = tmp_path / "gpu-out"
    out.mkdir()
    (out / "summary.txt").write_text(_summary([("env", 0, 1200), ("main-graph", 0, int(graph_s * 1000)),
                                               ("main-eager20", 0, 21300), ("bench-train", 0, 40000),
                                               ("steps", 0, 30000), ("flickr8k-graph", flickr_rc, 18000),
                                               ("grid-jobs", 0, 90000)]))
    steps = load_script("bench_steps")  # the lines the steps step writes
    (out / "steps.txt").write_text("\n".join([steps.HEADER] + [
        steps.line(name, row) for name, row in [
            ("daeh", {"batch_size": 18, "eager": 0.006, "graph": 0.0005, "captures": 1, "replays": 119}),
            ("ucch", {"batch_size": 256, "eager": 0.004, "graph": 0.004, "captures": 0, "replays": 0,
                      "eager_because": ["ucch 64 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: "
                                        "x)"]})]]) + "\n")
    clocks = {"fusion_train_time_s": 4.0, "train_time_s": 5.0, "score_seconds": 1.5}  # one scoring's rows
    rows = [{"task": "hashing", "protocol": "unimodal", "map_i2t": 0.83, "map_t2i": 0.826, "map_i2t_expected": 0.8301,
             "map_t2i_expected": 0.8262, **clocks},
            {"task": "hashing", "protocol": "fused", "map_i2t": 0.86, "map_t2i": 0.875, "map_i2t_expected": 0.8601,
             "map_t2i_expected": 0.8751, **clocks}]
    (out / "main-graph.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    throughput = {"ref": {"fusion": 10000.0, "hashing": 7000.0}, "ours-none": {"fusion": 12000.0, "hashing": 8000.0},
                  "ours-none-graph": {"fusion": 80000.0, "hashing": 30000.0}}
    (out / "bench-train.txt").write_text("throughput ...\njson: " + json.dumps({"throughput": throughput}) + "\n")
    (out / "flickr8k.jsonl").write_text(json.dumps({"task": "hashing", "database": "test", "recall_i2t_expected": {"1": 16.1},
                                                    "recall_t2i_expected": {"1": 13.9}}) + "\n")
    runs = iter([{"wall": 80.0, "n_cells": 6, "rows": [1]}, {"wall": 30.0, "n_cells": 6, "rows": [1]},
                 {"wall": 20.0, "n_cells": 6, "rows": [2]}])
    monkeypatch.setattr(grid_jobs, "run_grid", lambda *args: next(runs))
    monkeypatch.setattr("sys.argv", ["bench_grid_jobs.py", "--jobs", "1", "--jobs", "6", "--threads", "6", "--", "-d",
                                     "wiki"])
    grid_jobs.main()  # the lines the grid-jobs step writes
    (out / "grid-jobs.txt").write_text(capsys.readouterr().out)
    return out


def test_each_goal_is_read_from_what_its_step_wrote(tmp_path, monkeypatch, capsys):
    assert SUMMARY_FORMAT in CHECKLIST.read_text()
    out = _folder(tmp_path, monkeypatch, capsys)
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["1. main job, captured steps (wall s)"][1:] == ["12.5 (eager H200: 105)", "≤ 15", "yes"]
    assert rows["1. its parts (s)"][1] == ("fusion training 4.0, hashing training 5.0, scoring 1.5, the rest 2.0 "
                                           "(start-up, imports, the data)")
    assert rows["1. MAP@50 unimodal I→T / T→I"][1].startswith("0.8301 / 0.8262") and rows["1. MAP@50 unimodal I→T / T→I"][3] == "yes"
    assert rows["1. MAP@50 fused I→T / T→I"][3] == "no"  # 0.8601 is 0.0148 under 0.8749
    assert rows["2. fusion throughput, captured / reference (items/s)"][1].startswith("8.0×")
    assert rows["2. hashing throughput, captured / reference (items/s)"][3] == "no"  # 4.3×
    assert rows["3. full Flickr8k, default, 64 bits, captured (wall s)"][1:] == [
        "18.0 (eager H200: 144; R@1 test 16.1 / 13.9)", "≤ 20", "yes"]
    assert rows["4. six-cell grid, --jobs 6 against --jobs 1 (wall s)"][1:] == [
        "30.0 against 80.0 (2.7×); rows equal: yes", "faster, rows equal", "yes"]
    assert rows["4. six-cell grid, --jobs 6 --workers threads against --jobs 1 (wall s)"][1:] == [
        "20.0 against 80.0 (4.0×); rows equal: NO", "faster, rows equal", "no"]  # faster, but other rows
    assert report.main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["| goal | measured | goal value | met |", "|---|---|---|---|"]
    assert lines[-2:] == ["| daeh | 18 | 6.00 | 0.50 | 12.0× | 1 | 119 | – |",
                          "| ucch | 256 | 4.00 | 4.00 | 1.0× | 0 | 0 | ucch 64 bits runs eagerly: its capture as a "
                          "CUDA graph failed (RuntimeError: x) |"]
    # the goals (goal 4 in processes and in threads); a blank line, the steps' title, head and two stages
    assert len(lines) == 2 + 10 + 2 + 2 + 2


def test_a_run_asked_to_capture_that_ran_eagerly_is_said_so(tmp_path, monkeypatch, capsys):
    """The training commands say when a stage asked to capture its steps runs eagerly (a bf16 run, a method no
    graph replays, ...): its wall seconds are then not a captured figure, and the row says so."""
    out = _folder(tmp_path, monkeypatch, capsys)
    (out / "main-graph.txt").write_text("dataset: data/synthetic.h5\nnote: CUDA graphs asked for, but fusion runs "
                                        "eagerly: it trains under bf16 autocast\nfusion: 100%\n")
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["1. main job, captured steps (wall s)"][1] == (
        "12.5 (eager H200: 105); NOT captured: fusion runs eagerly: it trains under bf16 autocast")
    assert "NOT captured" not in rows["3. full Flickr8k, default, 64 bits, captured (wall s)"][1]
    # bench_train's captured variant says it too (a capture refused on the GPU), as the report reads it
    for _ in range(3):  # once a fit: said once
        load_script("bench_train").said_eager("hashing runs eagerly: its capture as a CUDA graph failed (RuntimeError: "
                                              "x)")
    (out / "bench-train.txt").write_text(capsys.readouterr().err + (out / "bench-train.txt").read_text())
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["2. fusion throughput, captured / reference (items/s)"][1].endswith(
        "; NOT captured: hashing runs eagerly: its capture as a CUDA graph failed (RuntimeError: x)")
    assert rows["2. fusion throughput, captured / reference (items/s)"][1].count("NOT captured") == 1


def test_a_results_line_cut_short_costs_its_row_not_the_table(tmp_path, monkeypatch, capsys):
    """A step killed while it appended (the cap's SIGKILL) leaves half a line: the report's json.loads of it was a
    traceback where speed.md's table should be."""
    out = _folder(tmp_path, monkeypatch, capsys)
    with open(out / "main-graph.jsonl", "a") as f:
        f.write('{"task": "hashing", "protocol": "unimodal", "map_i2t": 0.8')
    assert report.main([str(out)]) == 0
    said = capsys.readouterr()
    assert "| 1. main job, captured steps (wall s) | 12.5 (eager H200: 105) | ≤ 15 | yes |" in said.out
    assert "speed_report:" in said.err and "main-graph.jsonl" in said.err


def test_flickr8k_with_its_candidates_side_by_side_is_read_where_it_ran_against_one_after_another(
        tmp_path, monkeypatch, capsys):
    out = _folder(tmp_path, monkeypatch, capsys)
    name = "3. full Flickr8k, default, 64 bits, captured, candidates side by side (wall s)"
    assert name not in {row[0] for row in report.goal_rows(str(out))}  # the graphs group's: not run
    with open(out / "summary.txt", "a") as f:
        f.write(SUMMARY_FORMAT % ("flickr8k-side", 0, 12, 400) + "\n")
    first = json.loads((out / "flickr8k.jsonl").read_text())
    for r1, equal in ((16.1, "yes"), (15.0, "NO")):
        side = {**first, "recall_i2t_expected": {"1": r1}, "time": "later", "train_time_s": 9.0}
        (out / "flickr8k-side.jsonl").write_text(json.dumps(side) + "\n")
        rows = {row[0]: row for row in report.goal_rows(str(out))}
        assert rows[name][1:] == [f"12.4 (eager H200: 144; R@1 test {r1} / 13.9; rows of one after another: {equal})",
                                  "≤ 20", "yes"]


def test_a_failed_or_missing_step_is_said_not_guessed(tmp_path, monkeypatch, capsys):
    out = _folder(tmp_path, monkeypatch, capsys, flickr_rc=124)
    summary = (out / "summary.txt").read_text().splitlines()
    (out / "summary.txt").write_text("".join(line + "\n" for line in summary if not line.startswith("grid-jobs")))
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["3. full Flickr8k, default, 64 bits, captured (wall s)"][1] == "failed (rc 124, 18.0 s; see flickr8k-graph.txt)"
    summary = (out / "summary.txt").read_text().replace("steps        rc=0  ", "steps        rc=124")
    (out / "summary.txt").write_text(summary)
    why, finished = report.step_rows(str(out))
    assert why == "failed (rc 124, 30.0 s; see steps.txt); the stages it finished:" and len(finished) == 2
    (out / "steps.txt").write_text("Traceback ...\n")
    assert report.step_rows(str(out)) == ("failed (rc 124, 30.0 s; see steps.txt)", [])
    assert rows["4. six-cell grid, --jobs 6 against --jobs 1"][1] == "did not run"
    with pytest.raises(SystemExit) as exit_:
        report.main([str(tmp_path)])
    assert exit_.value.code == 2 and "no summary.txt" in capsys.readouterr().err


def test_the_graphs_run_s_tf32_figures_are_read_where_they_ran(tmp_path, monkeypatch, capsys):
    """The checklist's `graphs` run times TF32 matmuls: the main job under --amp tf32 (its wall and its MAPs, as
    goal 1's) and each stage's captured step, float32 against TF32; a run without those steps has no such rows."""
    out = _folder(tmp_path, monkeypatch, capsys)
    assert not any("tf32" in row[0].lower() for row in report.goal_rows(str(out)))
    with open(out / "summary.txt", "a") as summary:
        summary.write(_summary([("steps-tf32", 0, 20000), ("main-tf32", 0, 14200)]))
    steps = load_script("bench_steps")
    (out / "steps-tf32.txt").write_text("\n".join([steps.HEADER + steps.TF32, steps.line(
        "fusion", {"batch_size": 128, "eager": 0.0077, "graph": 0.00138, "captures": 1, "replays": 117,
                   "tf32": 0.00115})]) + "\n")
    (out / "main-tf32.jsonl").write_text((out / "main-graph.jsonl").read_text().replace("0.8301", "0.8101"))
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["1. main job, captured, --amp tf32 (wall s)"][1:] == ["14.2 (eager H200: 105)", "≤ 15", "yes"]
    assert rows["1. TF32: MAP@50 unimodal I→T / T→I"][1].startswith("0.8101 / 0.8262")
    assert rows["1. TF32: MAP@50 unimodal I→T / T→I"][3] == "no"  # 0.0198 below the eager run's 0.8299
    assert rows["1. MAP@50 unimodal I→T / T→I"][3] == "yes"  # the float32 run's, read from its own rows
    assert rows["a fusion step, captured, float32 → TF32 (ms)"][1] == "1.38 → 1.15 (1.20×)"


def test_the_compile_run_s_figures_are_read_where_they_ran(tmp_path, monkeypatch, capsys):
    """The checklist's `compile` run: each stage's captured step against the same step compiled (the compile's
    seconds beside it), a stage whose compile failed with its reason, then the main job so compiled on an empty
    and on a filled inductor cache (wall and MAPs, as goal 1's); a run without those steps has no such rows."""
    out = _folder(tmp_path, monkeypatch, capsys)
    assert not any("compiled" in row[0] for row in report.goal_rows(str(out)))
    with open(out / "summary.txt", "a") as summary:
        summary.write(_summary([("compile", 0, 150000), ("main-compile", 0, 61300), ("main-compile-warm", 0, 13900)]))
    steps = load_script("bench_steps")
    (out / "compile.txt").write_text("\n".join([steps.HEADER + steps.COMPILED, steps.line(
        "fusion", {"batch_size": 128, "eager": 0.0077, "graph": 0.00138, "captures": 1, "replays": 117,
                   "compiled": 0.00061, "compiled_first_epoch": 31.4}), steps.line(
        "ucmfh", {"batch_size": 128, "eager": 0.0121, "graph": 0.00191, "captures": 1, "replays": 117,
                  "compiled_error": "RuntimeError: no"})]) + "\n")
    for step in ("main-compile", "main-compile-warm"):
        (out / f"{step}.jsonl").write_text((out / "main-graph.jsonl").read_text())
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["a fusion step, captured → compiled and captured (ms)"][1] == \
        "1.38 → 0.61 (first epoch, the compile: 31.4 s)"
    assert rows["a ucmfh step, compiled and captured"][1] == "no figure; compiled: failed (RuntimeError: no)"
    assert rows["1. main job, compiled, captured, inductor cache empty (wall s)"][1:] == \
        ["61.3 (eager H200: 105)", "≤ 15", "no"]
    assert rows["1. main job, compiled, captured, inductor cache filled (wall s)"][3] == "yes"
    assert rows["1. compiled (filled cache): MAP@50 fused I→T / T→I"][1].startswith("0.8601 / 0.8751")


def test_the_streams_step_s_walls_are_read_where_it_ran(tmp_path, monkeypatch, capsys):
    """The `graphs` run's `streams` step: each stage's fits in turn against the same fits on streams of their own,
    as bench_streams.py prints them; a run without it has no such row, a failed one says so."""
    out = _folder(tmp_path, monkeypatch, capsys)
    assert not any("streams" in row[0] for row in report.goal_rows(str(out)))
    streams = load_script("bench_streams")
    with open(out / "summary.txt", "a") as summary:
        summary.write(_summary([("streams", 0, 60000)]))
    (out / "streams.txt").write_text("\n".join([streams.HEADER, streams.line("jdsh", {
        "runs": 4, "batch_size": 32, "steps": 2000, "one_after_another_s": 9.0, "side_by_side_s": 3.0,
        "processes_s": 6.0, "same_models_processes": True,
        "one_after_another_captures": 4, "one_after_another_replays": 1980, "side_by_side_captures": 3,
        "side_by_side_replays": 1485, "same_models_in_turn": True, "same_models_side_by_side": False,
        "side_by_side_eager_because": ["jdsh 64 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: "
                                       "x)"]})]) + "\n")
    [row] = [row for row in report.goal_rows(str(out)) if "streams" in row[0]]
    assert row[0] == ("4. 4 captured jdsh fits: in turn → in processes → in threads of one process, on streams of "
                      "their own (wall s)")
    assert row[1] == ("9.00 → 6.00 (1.50×) → 3.00 (3.00×); captures/replays 4/1980 → 3/1485; one model in turn: "
                      "yes, the same in processes: yes, in threads: no; side by side: jdsh 64 bits runs eagerly: its "
                      "capture as a CUDA graph failed (RuntimeError: x)")
    with open(out / "summary.txt", "a") as summary:
        summary.write(_summary([("streams", 124, 120000)]))
    assert [row for row in report.goal_rows(str(out)) if "streams" in row[0]][-1][1].startswith("failed (rc 124")


def test_a_step_the_call_s_budget_left_no_time_for_is_said_so(tmp_path, monkeypatch, capsys):
    out = _folder(tmp_path, monkeypatch, capsys)
    with open(out / "summary.txt", "a") as summary:
        summary.write("compile not started: the call's BUDGET of 580 s is spent\n")
        summary.write("comparison not started: the call's BUDGET of 580 s is spent\n")
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    assert rows["a step, compiled and captured"][1].startswith("not started: the call's budget was spent")
    assert rows["4. whole Flickr8k comparison, one GPU"][1].startswith("not started")
    assert rows["1. main job, captured steps (wall s)"][3] == "yes"  # the steps that ran keep their figures


def test_the_checklist_starts_no_step_once_its_budget_is_spent_and_refuses_an_unknown_group(tmp_path):
    """`BUDGET=S bash scripts/gpu_checklist.sh GROUP...`: the groups in the order asked, each one's steps in the
    file's order, each started while 30 s of the call remain (10 kept for the report), the others listed as not
    started (a python that sleeps half a second stands in for every command); an unknown group is one line, exit 2."""
    import os
    import subprocess

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsleep 0.5\n")
    fake.chmod(0o755)
    quick = tmp_path / "python-quick"  # where the budget is not the question
    quick.write_text("#!/bin/sh\n")
    quick.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").symlink_to(fake)  # the machine's, as fast
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out"), "BUDGET": "41", "DATA": str(tmp_path),
           "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(CHECKLIST), "compile", "graphs"], cwd=CHECKLIST.parents[1], env=env, check=True,
                   capture_output=True, timeout=60)
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    started = [line.split()[0] for line in lines if " rc=" in line]
    late = [line.split()[0] for line in lines if "not started" in line]
    # env starts with 31 s left; its five calls take 2.5 s, which leave less than 30 for the steps after it,
    # listed in the file's order, compile's before graphs'; graphs' flickr8k-side is skipped, its file not in DATA
    assert started == ["env"] and late[-1] == "main-tf32"
    assert started + late == ["env", "build", "native", "compile", "main-compile", "main-compile-warm", "streams",
                              "graph-tests", "steps-tf32", "main-tf32"]
    assert f"flickr8k-side skipped: no {tmp_path}/flickr8k.h5" in lines
    # the groups in the order asked: graphs' steps, then compile's
    (tmp_path / "out" / "summary.txt").unlink()
    subprocess.run(["bash", str(CHECKLIST), "graphs", "compile"], cwd=CHECKLIST.parents[1],
                   env={**env, "BUDGET": "0", "PYTHON": str(quick)}, check=True, capture_output=True, timeout=60)
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in lines if "skipped" not in line] == [
        "env", "build", "native", "streams", "graph-tests", "steps-tf32", "main-tf32", "compile", "main-compile",
        "main-compile-warm"]
    # the checks that are not issue 48's, in three groups (suite's side by side); seps skipped without its file
    (tmp_path / "out" / "summary.txt").unlink()
    subprocess.run(["bash", str(CHECKLIST), "checks", "extras", "suite"], cwd=CHECKLIST.parents[1],
                   env={**env, "BUDGET": "0", "PYTHON": str(quick)}, check=True, capture_output=True, timeout=60)
    lines = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    names = [line.split()[0] for line in lines]
    assert names[:9] == ["env", "build", "native", "main-job", "bench-eval", "metrics", "agreement",
                         "bench-train-all", "bf16"] and "seps skipped: no " in lines[9]
    assert sorted(names[10:]) == ["methods", "search", "tests", "torchrun"] and all(" rc=0 " in x for x in lines
                                                                                  if "skipped" not in x)
    done = subprocess.run(["bash", str(CHECKLIST), "speed", "nope"], cwd=CHECKLIST.parents[1], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().endswith("unknown group 'nope' (speed, compile, graphs, "
                                                                  "comparison, checks, extras or suite)")


def test_the_comparison_run_counts_its_cells(tmp_path, monkeypatch, capsys):
    """The `comparison` run: the cells finished so far (the rows of every call, one row or more a cell) and this
    call's seconds, stopped by its cap."""
    out = _folder(tmp_path, monkeypatch, capsys)
    assert not any("comparison" in row[0] for row in report.goal_rows(str(out)))
    with open(out / "summary.txt", "a") as summary:
        summary.write(_summary([("comparison", 124, 510300)]))
    rows = [{"method": m, "n_bits": b, "seed": 2023, "database": d} for m in ("jdsh", "daeh") for b in (16, 32)
            for d in ("test", "collection")]
    (out / "comparison.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    [row] = [row for row in report.goal_rows(str(out)) if "comparison" in row[0]]
    assert row[1] == "4 of 120; 510 s this call (rc 124)" and row[3] == "–"


def test_throughput_after_the_first_epoch_decides_goal_2_where_measured(tmp_path, monkeypatch, capsys):
    """bench_train with --epochs 2 or more: each fit's items/s after its first epoch (a capture and a warm-up
    behind it), what a long run trains at, decides goal 2; the whole fits' figure stays beside it."""
    out = _folder(tmp_path, monkeypatch, capsys)
    throughput = {"ref": {"fusion": 10000.0, "hashing": 7000.0, "fusion_steady": 11000.0, "hashing_steady": 7500.0},
                  "ours-none": {"fusion": 12000.0, "hashing": 8000.0, "fusion_steady": 13000.0,
                                "hashing_steady": 9000.0},
                  "ours-none-graph": {"fusion": 30000.0, "hashing": 20000.0, "fusion_steady": 88000.0,
                                      "hashing_steady": 30000.0}}
    (out / "bench-train.txt").write_text("json: " + json.dumps({"throughput": throughput}) + "\n")
    rows = {row[0]: row for row in report.goal_rows(str(out))}
    fusion = rows["2. fusion throughput, captured / reference (items/s)"]
    assert fusion[1] == ("8.0× after the first epoch (88,000 against 11,000; eager 1.2×); whole fits 3.0× (30,000 "
                         "against 10,000; eager 1.2×)") and fusion[3] == "yes"
    assert rows["2. hashing throughput, captured / reference (items/s)"][3] == "no"  # 4.0×


@pytest.mark.parametrize("argv, message", [([], "give a --jobs or --threads value"),
                                           (["--jobs", "1", "--threads", "1"], "--threads 1: threads run 2 cells")])
def test_the_grid_jobs_bench_refuses_nothing_to_run_and_threads_for_one_cell(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(grid_jobs, "run_grid", lambda *args: pytest.fail("a grid ran"))
    monkeypatch.setattr("sys.argv", ["bench_grid_jobs.py", *argv, "--", "-d", "wiki"])
    with pytest.raises(SystemExit) as exit_:
        grid_jobs.main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and message in err and out == ""  # before its first line
