#!/usr/bin/env python3
"""Issue 48's goals against what ``bash scripts/gpu_checklist.sh speed`` measured (not a test).

Reads the checklist's output folder and prints one markdown table, a row per goal: what was measured, the
goal, and whether it is met, with the eager figures of the H200 (2026-11-27, issue 48) beside them; then a
second, a row per trained stage: the milliseconds of one step, eager and captured (``bench_steps.py``). A
step that did not run or failed says so in its row; nothing is guessed.

    python scripts/speed_report.py gpu-out
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
from ucmfh.app.experiment import VARYING  # noqa: E402  (a row's fields that differ between two runs of one setting)
from ucmfh.files import read_jsonl  # noqa: E402

# the eager figures on one H200 that issue 48 starts from (torch 2.11.0+cu130, 2026-11-27)
EAGER_H200 = {"main_job_s": 105.0, "flickr8k_s": 144.0,
              "map": {"unimodal": (0.8299, 0.8266), "fused": (0.8749, 0.8770)}}
GOALS = {"main_job_s": 15.0, "map_tolerance": 0.01, "throughput_ratio": 5.0, "flickr8k_s": 20.0}
_STEP = re.compile(r"^(\S+)\s+rc=(\d+)\s+([\d.]+) s$")
_NOT_STARTED = re.compile(r"^(\S+) not started: ")  # the call's BUDGET spent before the step's turn
NOT_STARTED = -1  # the exit status read for such a step
_SKIPPED = re.compile(r"^(\S+) skipped: (.*)$")  # a file the step reads not there (flickr8k.h5 not carried)
SKIPPED = -2


def read_summary(out: str) -> Dict[str, Dict[str, float]]:
    """``summary.txt``: each step's exit status and seconds (:data:`NOT_STARTED` and 0 for a step the call's
    budget left no time to start, :data:`SKIPPED` and why for one whose file was not there)."""
    steps: Dict[str, Dict[str, Any]] = {}
    for line in _lines(out, "summary.txt"):
        match, late, skipped = (pattern.match(line.strip()) for pattern in (_STEP, _NOT_STARTED, _SKIPPED))
        if match:
            steps[match.group(1)] = {"rc": int(match.group(2)), "seconds": float(match.group(3))}
        elif late:
            steps[late.group(1)] = {"rc": NOT_STARTED, "seconds": 0.0}
        elif skipped:
            steps[skipped.group(1)] = {"rc": SKIPPED, "seconds": 0.0, "why": skipped.group(2)}
    return steps


def _lines(out: str, name: str) -> List[str]:
    """The lines of file ``name`` in ``out``; none where a step did not write it."""
    path = os.path.join(out, name)
    return open(path, encoding="utf-8").read().splitlines() if os.path.exists(path) else []


def _rows(out: str, name: str) -> List[Dict[str, Any]]:
    """The rows of JSON-lines file ``name``: a line cut short (a step killed while it appended) is left out, said
    on stderr, where it cost the whole table."""
    path = os.path.join(out, name)
    return read_jsonl(path, on_skip=lambda line: print(f"speed_report: {line}", file=sys.stderr)) \
        if os.path.exists(path) else []


def _ran(steps: Dict[str, Dict[str, float]], name: str) -> Optional[str]:
    """Why step ``name`` has no figure (None when it ran and succeeded)."""
    if name not in steps:
        return "did not run"
    if steps[name]["rc"] == NOT_STARTED:
        return "not started: the call's budget was spent (BUDGET); run it in the next call"
    if steps[name]["rc"] == SKIPPED:
        return f"skipped: {steps[name]['why']}"
    if steps[name]["rc"] != 0:
        return f"failed (rc {steps[name]['rc']}, {steps[name]['seconds']:.1f} s; see {name}.txt)"
    return None


def eager_notes(out: str, step: str) -> List[str]:
    """The stages of ``step`` (a run asked to capture its steps) that said they ran eagerly, and why (the
    training commands' ``note: CUDA graphs asked for, but STAGE runs eagerly: WHY`` lines): its figure is
    then not a captured one."""
    return [line.split("but ", 1)[1].strip() for line in _lines(out, f"{step}.txt")
            if line.startswith("note: CUDA graphs asked for, but ")]


def _captured(out: str, step: str, measured: str) -> str:
    """``measured``, said to be eager where ``step``'s stages were not captured."""
    notes = list(dict.fromkeys(eager_notes(out, step)))  # a stage said once, however many fits said it
    return measured + (f"; NOT captured: {'; '.join(notes)}" if notes else "")


def _map(row: Dict[str, Any], field: str) -> float:
    return row.get(field + "_expected", row[field])  # tie-aware where the row has it


def map_rows(out: str, step: str, label: str) -> List[List[str]]:
    """The main job's MAP@50 of ``step`` (its rows, ``STEP.jsonl``) in each protocol against the eager H200's:
    goal, measured, tolerance, met."""
    hashing = {r["protocol"]: r for r in _rows(out, f"{step}.jsonl") if r.get("task") == "hashing"}
    rows = []
    for protocol, (i2t, t2i) in EAGER_H200["map"].items():
        row = hashing.get(protocol)
        if row is None:
            rows.append([f"{label}MAP@50 {protocol}", "no row", f"±{GOALS['map_tolerance']}", "–"])
            continue
        got = (_map(row, "map_i2t"), _map(row, "map_t2i"))
        ok = all(abs(a - b) <= GOALS["map_tolerance"] for a, b in zip(got, (i2t, t2i)))
        rows.append([f"{label}MAP@50 {protocol} I→T / T→I",
                     f"{got[0]:.4f} / {got[1]:.4f} (eager H200: {i2t:.4f} / {t2i:.4f})",
                     f"±{GOALS['map_tolerance']}", "yes" if ok else "no"])
    return rows


def main_job_rows(out: str, steps: Dict[str, Dict[str, float]], step: str, goal: str,
                  label: str) -> List[List[str]]:
    """Goal 1's rows for the main job run by ``step``: its wall seconds, then its MAPs (:func:`map_rows`)."""
    why = _ran(steps, step)
    seconds = None if why else steps[step]["seconds"]
    rows = [[goal, why or _captured(out, step, f"{seconds:.1f} (eager H200: {EAGER_H200['main_job_s']:.0f})"),
             f"≤ {GOALS['main_job_s']:.0f}", "–" if why else ("yes" if seconds <= GOALS["main_job_s"] else "no")]]
    return rows if why else rows + parts_rows(out, step, seconds, label) + map_rows(out, step, label)


def parts_rows(out: str, step: str, seconds: float, label: str) -> List[List[str]]:
    """Where the wall ``seconds`` of the main job run by ``step`` went, from its rows (``STEP.jsonl``): each stage's
    training, the scoring, and the rest (start-up, imports, the data); none where its rows do not say."""
    row = next((r for r in _rows(out, f"{step}.jsonl") if r.get("task") == "hashing"), None)
    parts = None if row is None else (row.get("fusion_train_time_s"), row.get("train_time_s"), row.get("score_seconds"))
    if parts is None or None in parts:
        return []
    fusion, hashing, scoring = parts
    rest = seconds - fusion - hashing - scoring
    return [[f"{label}its parts (s)", f"fusion training {fusion:.1f}, hashing training {hashing:.1f}, scoring "
             f"{scoring:.1f}, the rest {rest:.1f} (start-up, imports, the data)", "–", "–"]]


def tf32_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """``--amp tf32``'s rows (the checklist's ``graphs`` run; none where its steps did not run): the main job's
    wall seconds and MAPs, as goal 1's, and each stage's captured step in float32 and in TF32 (``steps-tf32``)."""
    rows = []
    if "main-tf32" in steps:
        rows += main_job_rows(out, steps, "main-tf32", "1. main job, captured, --amp tf32 (wall s)", "1. TF32: ")
    if "steps-tf32" in steps:
        for line in _lines(out, "steps-tf32.txt"):
            cells = line.split()
            if len(cells) == 9 and cells[1].isdigit() and cells[2] != "eager":
                rows.append([f"a {cells[0]} step, captured, float32 → TF32 (ms)", f"{cells[3]} → {cells[7]} "
                             f"({cells[8].replace('x', '×')})", "–", "–"])
        why = _ran(steps, "steps-tf32")
        if why:
            rows.append(["a step, captured, float32 → TF32", why, "–", "–"])
    return rows


def streams_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """The checklist's ``streams`` step (``bench_streams.py``; none where it did not run): for each stage, the
    wall of its fits one after another against the same fits at once in processes of their own and in threads of
    one process, each on a stream of its own, and whether they trained one model."""
    if "streams" not in steps:
        return []
    rows: List[List[str]] = []
    for line in _lines(out, "streams.txt"):
        cells = line.split()
        if len(cells) == 14 and cells[1].isdigit() and cells[8].endswith("x"):
            rows.append([f"4. {cells[2]} captured {cells[0]} fits: in turn → in processes → in threads of one "
                         "process, on streams of their own (wall s)",
                         f"{cells[4]} → {cells[5]} ({cells[7].replace('x', '×')}) → {cells[6]} "
                         f"({cells[8].replace('x', '×')}); captures/replays {cells[9]} → {cells[10]}; one model in "
                         f"turn: {cells[11]}, the same in processes: {cells[12]}, in threads: {cells[13]}",
                         "threads faster, the same models", "–"])
        elif line.startswith("  ") and rows:  # a fit that ran eagerly, and why
            rows[-1][1] += f"; {line.strip()}"
    why = _ran(steps, "streams")
    return rows + ([["4. fits on streams of their own", why, "faster", "–"]] if why else [])


def compile_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """``torch.compile``'s rows (the checklist's ``compile`` run; none where its steps did not run): each stage's
    captured step against the same step compiled and captured (``compile``: ``bench_steps.py --compile``, its
    first epoch's seconds, the compile's), or why it failed; then the main job so compiled on an empty inductor
    cache and on the filled one (``main-compile``, ``main-compile-warm``: wall seconds and MAPs, as goal 1's)."""
    rows: List[List[str]] = []
    if "compile" in steps:
        for line in _lines(out, "compile.txt"):
            cells = line.split()
            if len(cells) >= 12 and cells[1].isdigit() and cells[2] != "eager" and cells[9] == "(first":
                rows.append([f"a {cells[0]} step, captured → compiled and captured (ms)",
                             f"{cells[3]} → {cells[7]} (first epoch, the compile: {cells[11]} s)", "–", "–"])
            elif len(cells) >= 7 and cells[1].isdigit() and cells[2] != "eager":
                rows.append([f"a {cells[0]} step, compiled and captured", "no figure", "–", "–"])
            elif line.startswith("  compiled: ") and rows:
                rows[-1][1] += f"; {line.strip()}"
        why = _ran(steps, "compile")
        if why:
            rows.append(["a step, compiled and captured", why, "–", "–"])
    for step, label in (("main-compile", "empty"), ("main-compile-warm", "filled")):
        if step in steps:
            rows += main_job_rows(out, steps, step, f"1. main job, compiled, captured, inductor cache {label} "
                                  "(wall s)", f"1. compiled ({label} cache): ")
    return rows


def goal_rows(out: str) -> List[List[str]]:
    """The table's rows: goal, measured, goal value, met."""
    steps = read_summary(out)
    rows = []
    rows += main_job_rows(out, steps, "main-graph", "1. main job, captured steps (wall s)", "1. ")
    why = _ran(steps, "main-eager20")
    rows.append(["this card, eager main job, 20 epochs (wall s)", why or f"{steps['main-eager20']['seconds']:.1f}", "–", "–"])
    why = _ran(steps, "bench-train")
    bench = None
    if not why:
        lines = [line for line in _lines(out, "bench-train.txt") if line.startswith("json: ")]
        bench = json.loads(lines[-1][len("json: "):])["throughput"] if lines else None
        why = None if bench else "no json line in bench-train.txt"
    for stage in ("fusion", "hashing"):
        if why:
            rows.append([f"2. {stage} throughput, captured / reference", why, f"≥ {GOALS['throughput_ratio']:.0f}×", "–"])
            continue
        ref, eager, graph = (bench[v][stage] for v in ("ref", "ours-none", "ours-none-graph"))
        measured = f"{graph / ref:.1f}× ({graph:,.0f} against {ref:,.0f}; eager {eager / ref:.1f}×)"
        ratio = graph / ref
        if f"{stage}_steady" in bench["ref"]:  # after each fit's first epoch: what a long run trains at (the goal's)
            ref_s, eager_s, graph_s = (bench[v][f"{stage}_steady"] for v in ("ref", "ours-none", "ours-none-graph"))
            ratio = graph_s / ref_s
            measured = (f"{ratio:.1f}× after the first epoch ({graph_s:,.0f} against {ref_s:,.0f}; eager "
                        f"{eager_s / ref_s:.1f}×); whole fits {measured}")
        rows.append([f"2. {stage} throughput, captured / reference (items/s)", _captured(out, "bench-train", measured),
                     f"≥ {GOALS['throughput_ratio']:.0f}×", "yes" if ratio >= GOALS["throughput_ratio"] else "no"])
    return rows + flickr8k_rows(out, steps) + grid_jobs_rows(out, steps) + comparison_rows(out, steps) + streams_rows(
        out, steps) + tf32_rows(out, steps) + compile_rows(out, steps)


def flickr8k_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """Goal 3: the default on full Flickr8k, its candidates one after another (``flickr8k-graph``), then side by
    side in threads (``flickr8k-side``, the graphs group's: only where it ran), whose rows should be the first's."""
    rows = []
    first = [{k: v for k, v in r.items() if k not in VARYING} for r in _rows(out, "flickr8k.jsonl")]
    for step, results, how in (("flickr8k-graph", "flickr8k.jsonl", ""),
                               ("flickr8k-side", "flickr8k-side.jsonl", ", candidates side by side")):
        name = f"3. full Flickr8k, default, 64 bits, captured{how} (wall s)"
        why = _ran(steps, step)
        if why:
            if step == "flickr8k-graph" or step in steps:
                rows.append([name, why, f"≤ {GOALS['flickr8k_s']:.0f}", "–"])
            continue
        seconds = steps[step]["seconds"]
        test = [r for r in _rows(out, results) if r.get("database") == "test"]
        note = ""
        if test:
            recall = {d: test[0].get(f"recall_{d}_expected", test[0].get(f"recall_{d}", {})).get("1") for d in ("i2t", "t2i")}
            note = f"; R@1 test {recall['i2t']:.1f} / {recall['t2i']:.1f}"
        if how and first:
            same = first == [{k: v for k, v in r.items() if k not in VARYING} for r in _rows(out, results)]
            note += f"; rows of one after another: {'yes' if same else 'NO'}"
        rows.append([name, _captured(out, step, f"{seconds:.1f} (eager H200: {EAGER_H200['flickr8k_s']:.0f}{note})"),
                     f"≤ {GOALS['flickr8k_s']:.0f}", "yes" if seconds <= GOALS["flickr8k_s"] else "no"])
    return rows


def grid_jobs_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """Goal 4's first half: the six-cell grid's walls (``bench_grid_jobs.py``), each --jobs above 1, in worker
    processes and in threads, against --jobs 1, and whether its rows are those of --jobs 1."""
    why = _ran(steps, "grid-jobs")
    walls: Dict[Tuple[int, str], Tuple[float, str]] = {}
    if not why:
        for line in _lines(out, "grid-jobs.txt"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[0].isdigit():
                walls[int(cells[0]), cells[1]] = (float(cells[2]), cells[4])
        why = None if (1, "processes") in walls and len(walls) >= 2 else "no --jobs 1 line and another in grid-jobs.txt"
    if why:
        return [["4. six-cell grid, --jobs 6 against --jobs 1", why, "faster, rows equal", "–"]]
    one = walls.pop((1, "processes"))[0]
    return [[f"4. six-cell grid, --jobs {jobs}{' --workers threads' if workers == 'threads' else ''} against --jobs 1"
             " (wall s)", f"{wall:.1f} against {one:.1f} ({one / wall:.1f}×); rows equal: {equal}",
             "faster, rows equal", "yes" if wall < one and equal == "yes" else "no"]
            for (jobs, workers), (wall, equal) in walls.items()]


COMPARISON_CELLS = 10 * 4 * 3  # every method × 16/32/64/128 bits × 3 seeds


def comparison_rows(out: str, steps: Dict[str, Dict[str, float]]) -> List[List[str]]:
    """The checklist's ``comparison`` run (none where it did not run): the cells of the whole Flickr8k
    comparison finished so far (``comparison.jsonl``, this call's and the calls' before it) and this call's
    seconds; the whole's wall is the sum of its calls'."""
    if "comparison" not in steps:
        return []
    if steps["comparison"]["rc"] == NOT_STARTED:
        return [["4. whole Flickr8k comparison, one GPU", _ran(steps, "comparison"), "all in < 1800 s", "–"]]
    cells = {(r.get("method"), r.get("n_bits"), r.get("seed")) for r in _rows(out, "comparison.jsonl")}
    seconds = steps["comparison"]["seconds"]
    done = len(cells) == COMPARISON_CELLS
    return [["4. whole Flickr8k comparison, one GPU (cells finished; this call's wall s)",
             f"{len(cells)} of {COMPARISON_CELLS}; {seconds:.0f} s this call (rc {steps['comparison']['rc']})",
             "all in < 1800 s", "sum the calls' seconds" if done else "–"]]


def step_rows(out: str) -> Tuple[Optional[str], List[List[str]]]:
    """Why the ``steps`` step has no figures (None when it has some), and its table's rows, read from the lines
    ``bench_steps.py`` printed (a stage a line, so a step cut short keeps the stages it finished): stage,
    batch, eager and captured milliseconds a step, their ratio, the captured path's captures and replays, and
    why it ran eagerly where it said so (the indented line below a stage's)."""
    rows: List[List[str]] = []
    for line in _lines(out, "steps.txt"):
        cells = line.split()
        if line.startswith("  ") and rows and "runs eagerly: " in line:
            rows[-1][-1] = "; ".join(filter(None, [rows[-1][-1], line.strip()]))
        elif len(cells) == 7 and cells[1].isdigit() and cells[2] != "eager":
            rows.append([cells[0], cells[1], cells[2], cells[3], cells[4].replace("x", "×"), cells[5], cells[6], ""])
    rows = [["–" if cell == "-" else cell for cell in row[:-1]] + [row[-1] or "–"] for row in rows]
    why = _ran(read_summary(out), "steps")
    if why and rows:
        why = f"{why}; the stages it finished:"
    return (why or (None if rows else "no stage's line in steps.txt")), rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the checklist's output folder (OUT)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.out, "summary.txt")):
        parser.error(f"{args.out}: no summary.txt (the folder of a gpu_checklist.sh run)")
    env = os.path.join(args.out, "env.txt")
    if os.path.exists(env):
        print("machine: " + " ".join(open(env, encoding="utf-8").read().split()))
    print("| goal | measured | goal value | met |")
    print("|---|---|---|---|")
    for row in goal_rows(args.out):
        print("| " + " | ".join(row) + " |")
    why, rows = step_rows(args.out)
    print("\nA training step, eager and captured (`scripts/bench_steps.py`, synthetic 512-d features):"
          + (f" {why}" if why else ""))
    if rows:
        print("| stage | batch | eager ms | captured ms | speed-up | captures | replays | ran eagerly |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
