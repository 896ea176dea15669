"""Past runs from results files: filtered, deduplicated, and summarised over seeds.

Rows that score the same run the same way (``run``, ``protocol``, ``k``, and for
two-stage search its ``stage`` and candidates) are one measurement: the last one
counts (``ucmfh evaluate`` of a checkpoint scores its run again). Runs that differ
only in their seed form one group, summarised as mean ± sample standard deviation. A
checkpoint scored on another dataset than its training's (a row's ``trained_on``) is a
group of its own, marked with the dataset it was trained on.
Every row any command appends (training, evaluation, codes files, SEPS, re-ranking)
is summarised; a field a row lacks is shown as ``-``.
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ucmfh.app.identity import key_of
from ucmfh.config import EXPECTED
from ucmfh.files import read_jsonl
from ucmfh.metrics.collapse import COLLAPSED, collapsed
from ucmfh.printable import pad, printable, shown_width

DIRECTIONS = ("map_i2t", "map_t2i")
# R@K of a caption set's row, in %, each summarised like a field of its own: r{K}_{direction}
RECALL_AT_K = tuple(f"r{k}_{d}" for k in (1, 5, 10) for d in ("i2t", "t2i"))
# the prefix of a figure of the hash heads' real-valued outputs ranked by cosine (a row's ``real_valued``)
REAL = "real_"
RANDOM = "random_"  # the figures of random codes of the row's length: the floor


def _value(row: Dict[str, Any], field: str) -> Optional[float]:
    """A row's figure; ``r1_i2t``, ``r5_t2i`` … read R@K from its recall dicts, ``real_`` + a field
    reads it from the scores of the real-valued head outputs (``real_valued``), and a field +
    ``_expected`` its tie-aware twin."""
    real, key, rank = _where(field)
    if real:
        row = row.get("real_valued")
        if row is None:
            return None
    value = row.get(key)
    return value if rank is None or value is None else value.get(rank)


@functools.lru_cache(maxsize=None)
def _where(field: str) -> Tuple[bool, str, Optional[str]]:
    """Where a row holds ``field`` (:func:`_value`): in its real-valued scores or not, under which key, and at
    which rank of a recall dict (None: the key's value itself); worked out once a field (a lab's 'ucmfh runs'
    reads some 40 fields of each of 100,000 rows)."""
    real = field.startswith(REAL)
    field = field[len(REAL):] if real else field
    floor = RANDOM if field.startswith(RANDOM) else ""  # random codes' R@K: in their recall dicts as well
    base, twin = (field[: -len(EXPECTED)], EXPECTED) if field.endswith(EXPECTED) else (field, "")
    if base[len(floor):] in RECALL_AT_K:
        rank, direction = base[len(floor) + 1:].split("_")
        return real, f"{floor}recall_{direction}{twin}", rank
    return real, field, None


def scores_line(rows: Sequence[Dict[str, Any]]) -> str:
    """One run's scores in a line, tie-aware where the rows have them: per protocol (and database of a
    caption set), MAP@k I→T / T→I, or R@1 I→T / T→I in % and rSum."""
    def value(row: Dict[str, Any], field: str) -> float:
        twin = _value(row, field + EXPECTED)
        return _value(row, field) if twin is None else twin

    parts = []
    for row in rows:
        where = " ".join(str(row[key]) for key in ("protocol", "database") if row.get(key) is not None)
        if row.get("recall_i2t") is not None:
            scores = f"R@1 {value(row, 'r1_i2t'):.1f} / {value(row, 'r1_t2i'):.1f} (rSum {value(row, 'rsum'):.1f})"
        else:
            scores = f"MAP@{row.get('k')} {value(row, 'map_i2t'):.4f} / {value(row, 'map_t2i'):.4f}"
        parts.append(f"{where}: {scores}")
    return "; ".join(parts)


def headline(entry: Dict[str, Any], field: str) -> str:
    """The field a table leads with: its tie-aware twin where the rows have one, else the field itself
    (rows from before tie-aware scores, or of a stage without ties)."""
    return field + EXPECTED if f"{field}{EXPECTED}_mean" in entry else field


def read_results(paths: Sequence[str], warn: Optional[Callable[[str], None]] = None,
                 containing: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """The rows of one or more results files, in order (grids run side by side each keep their own file);
    a missing file is an error that names it, before any is read. A line that is not a JSON row, and a
    row that names no dataset and task (no command wrote it), are skipped and said to ``warn`` (default:
    a warning). ``containing``: only the lines holding one of these texts are read (:func:`ucmfh.files.read_jsonl`;
    a run asked for by its key in a lab's file of many)."""
    for path in paths:
        if not path:  # '' is where the training commands write no rows; nothing to read
            raise ValueError("--results '': an empty path; name a results file to read")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such results file (runs append their rows to --results)")
    rows = []
    scored: Dict[tuple, Tuple[str, Dict[str, Any]]] = {}  # a measurement -> the file that scored it last, its row
    clashes: Dict[Tuple[str, str], int] = {}
    for path in paths:
        found = read_jsonl(path, on_skip=warn, containing=containing)
        kept = [row for row in found if row.get("dataset") is not None and row.get("task") is not None]
        if len(kept) < len(found):
            message = (f"{path}: {len(found) - len(kept)} row(s) without a dataset and a task (not results of a "
                       "ucmfh command); skipped")
            warnings.warn(message, stacklevel=2) if warn is None else warn(message)
        problems = [row_problem(row) for row in kept]
        if any(problems):  # a row edited by hand, or damaged: its figures would be summed into the others'
            first = next(problem for problem in problems if problem)
            message = (f"{path}: {sum(map(bool, problems))} row(s) with a value no ucmfh command writes (first: "
                       f"{first}); skipped")
            warnings.warn(message, stacklevel=2) if warn is None else warn(message)
            kept = [row for row, problem in zip(kept, problems) if not problem]
        # scores of a measurement replaced by other scores, of another file or later in the same one (a run trained
        # again, with another thread count, into a results file shared by two --out folders): said, not silently
        for row in kept:
            measurement = _measurement(row)
            earlier = scored.get(measurement)
            if earlier is not None and _other_scores(earlier[1], row):  # compared only where a run comes again
                clashes[(earlier[0], path)] = clashes.get((earlier[0], path), 0) + 1
            scored[measurement] = (path, row)
        rows += [_located(row, path) for row in kept]
    for (first, last), n in clashes.items():
        why = "trained apart: on another machine, or with another number of CPU threads, a row's train_threads"
        message = (f"{last}: {n} row(s) score runs {first} scored too, with other scores ({why}); {last}'s, read "
                   "last, are used" if first != last else
                   f"{last}: {n} row(s) score runs scored earlier in the file, with other scores ({why}); the later "
                   "rows are used")
        warnings.warn(message, stacklevel=2) if warn is None else warn(message)
    return rows


def _other_scores(earlier: Dict[str, Any], later: Dict[str, Any]) -> bool:
    """Whether two rows of one measurement score it differently: a figure both have differs (a newer ucmfh's rows
    add tie-aware twins to an older one's)."""
    return any(earlier[key] != value for key, value in later.items()
               if key.startswith(("map_", "recall_", "rsum")) and key in earlier)


def row_problem(row: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a results row's values, or None: a score (``map_*``, ``rsum*``) that is not a finite
    number, a recall that is not a number or numbers by rank (random codes' ``random_*`` alike), settings that
    are not a mapping, a code length or seed that is not a whole number; the same of its real-valued outputs'
    scores (``real_valued``)."""
    def number(value: Any) -> bool:  # finite: a NaN (JSON's NaN) would poison every mean and deviation
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for key, value in row.items():
        score = key[len(RANDOM):] if key.startswith(RANDOM) else key  # random codes' scores: the same rules
        if score.startswith(("map_", "rsum")) and not number(value):
            return f"{key}={value!r}"
        if score.startswith("recall_") and not (
                number(value) or isinstance(value, dict) and all(map(number, value.values()))):  # by rank
            return f"{key}={value!r}"
    if "settings" in row and not (isinstance(row["settings"], dict)
                                  and all(v is None or isinstance(v, dict) for v in row["settings"].values())):
        return f"settings={row['settings']!r}"  # a stage's settings a mapping, or None where it trained none
    for key in ("dataset", "dataset_fingerprint", "method", "protocol", "database"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return f"{key}={row[key]!r}"
    if row.get("trained_on") is not None and not isinstance(row["trained_on"], dict):
        return f"trained_on={row['trained_on']!r}"
    if "real_valued" in row:  # the scores of the real-valued head outputs: the same rules
        real = row["real_valued"]
        problem = row_problem(real) if isinstance(real, dict) else repr(real)
        if problem is not None:
            return f"real_valued: {problem}"
    for key in ("n_bits", "seed", "k"):
        if row.get(key) is not None and (not isinstance(row[key], int) or isinstance(row[key], bool)):
            return f"{key}={row[key]!r}"
    m = row.get("candidates")  # an older rerank's -m 5: its R@10 read from a list of 5, which it is no more
    if isinstance(m, int) and m < 10 and any(
            isinstance(row.get(key), dict) and "10" in row[key] for key in ("recall_i2t", "recall_t2i")):
        return f"candidates={m}, an R@10 read from a list of {m} (an older ucmfh's rerank -m {m})"
    return None


# a row's files, written relative to where its command ran
ROW_FILES = ("checkpoint", "per_query")


def _located(row: Dict[str, Any], results: str) -> Dict[str, Any]:
    """``row`` with each relative file path that is not found from here but is from the folder of its results
    file or the one above it (where a command writing ``runs/results.jsonl`` ran) made absolute: another
    folder's rows are read as they were written there."""
    folder = os.path.dirname(os.path.abspath(results))
    for key in ROW_FILES:
        path = row.get(key)
        if not isinstance(path, str) or os.path.isabs(path) or os.path.exists(path):
            continue
        found = next((c for c in (os.path.join(folder, path), os.path.join(os.path.dirname(folder), path))
                      if os.path.exists(c)), None)
        if found:
            row = {**row, key: found}
    return row


def _matches(value: Any, wanted: Sequence[Any]) -> bool:
    return not wanted or value in wanted


def _dataset_matches(row: Dict[str, Any], wanted: Sequence[str]) -> bool:
    """A row's dataset is one of ``wanted``: by its name (``-d wiki``), or by its file (``-d data/wiki.h5``, the
    path a run was given)."""
    if _matches(row.get("dataset"), wanted):
        return True
    files = [os.path.realpath(w) for w in wanted if w.endswith(".h5")]
    return bool(files) and bool(row.get("dataset_path")) and os.path.realpath(row["dataset_path"]) in files


def filter_rows(
    rows: Iterable[Dict[str, Any]], dataset: Sequence[str] = (), method: Sequence[str] = (),
    loss: Sequence[str] = (), n_bits: Sequence[int] = (), protocol: Sequence[str] = (), seed: Sequence[int] = (),
    task: Sequence[str] = (), k: Sequence[int] = (),
) -> List[Dict[str, Any]]:
    return [r for r in rows
            if _dataset_matches(r, dataset) and _matches(method_of(r), method) and _matches(r.get("task"), task)
            and _matches(r.get("loss"), loss) and _matches(r.get("n_bits"), n_bits) and _matches(r.get("k"), k)
            and _matches(seed_of(r), seed) and _matches(r.get("protocol"), protocol)]


def held_by(rows: Iterable[Dict[str, Any]]) -> str:
    """What rows hold, for a message where a selection left none: their tasks, datasets, methods, code lengths,
    protocols and seeds, each sorted (numbers as numbers), e.g. ``datasets wiki; methods cca-itq; ...``."""
    rows = list(rows)
    if not rows:
        return "no rows"

    def order(value: Any) -> Tuple[Any, ...]:
        return (isinstance(value, str), value if isinstance(value, (int, float)) else str(value))

    fields = (("tasks", lambda r: r.get("task")), ("datasets", lambda r: r.get("dataset")), ("methods", method_of),
              ("code lengths", lambda r: r.get("n_bits")), ("protocols", lambda r: r.get("protocol")),
              ("seeds", seed_of))
    # a field some rows lack (a fusion stage's rows have no method nor code length) is said of those that have it
    held = [(name, sorted({value(r) for r in rows} - {None}, key=order)) for name, value in fields]
    return "; ".join(f"{name} " + ", ".join(str(v) for v in values) for name, values in held if values)


def the_checkpoint(rows: Iterable[Dict[str, Any]], where: str) -> str:
    """The one checkpoint the rows were scored with (a run's stable name, whatever else was trained since; a
    SEPS run's ``seps.pt``); ``ValueError`` when they name none or several (``where``: the results file)."""
    named = [r.get("checkpoint") or r.get("seps_checkpoint") for r in rows
             if r.get("checkpoint") or r.get("task") == "seps" and r.get("seps_checkpoint")]
    # one file named two ways (a training row's path relative to where it ran, 'evaluate -c''s as typed) is one
    by_file: Dict[str, str] = {}
    for path in named:
        by_file.setdefault(os.path.realpath(path) if os.path.exists(path) else path, path)
    found = list(by_file.values())
    if not found:
        raise ValueError(f"{where}: no run with a checkpoint matches")
    if len(found) > 1:
        shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        raise ValueError(f"{where}: {len(found)} checkpoints match ({shown})")
    return found[0]


# settings that are columns of the summary already
COLUMNS = ("seed", "loss", "n_bits")


def _beyond_columns(settings: Dict[str, Any]) -> Dict[str, Any]:
    return {stage: {k: v for k, v in values.items() if k not in COLUMNS} for stage, values in settings.items()}


def settings_of(row: Dict[str, Any]) -> Dict[str, Any]:
    """A row's settings by stage: ``settings`` of a training or evaluation row; the hashing and SEPS
    settings of a re-ranking or SEPS row (``hash_settings``, ``seps_settings``)."""
    settings = row.get("settings") or {stage: row.get(f"{stage}_settings") for stage in ("hash", "seps")}
    return {stage: values for stage, values in settings.items() if values is not None}


def beyond_defaults(row: Dict[str, Any]) -> Optional[List[str]]:
    """The settings of a hashing row's run that differ from its method's defaults on its dataset, beyond the
    columns of a table (``hash.epochs=3``; [] for none): a run cut short is said beside the default's figures. None
    where they cannot be told (another task, a method not registered here, a row without settings). Imports the
    method registry (and torch)."""
    from ucmfh.methods import METHODS

    method, settings = method_of(row), row.get("settings")
    if row.get("task") != "hashing" or method not in METHODS or not isinstance(settings, dict):
        return None
    defaults = _default_settings(method, row.get("dataset") if isinstance(row.get("dataset"), str) else None,
                                 row["n_bits"] if isinstance(row.get("n_bits"), int) else None)
    if defaults is None:
        return None
    actual = _beyond_columns({stage: v for stage, v in settings.items() if isinstance(v, dict)})
    # a setting the row lacks is not known to differ (a row written by hand): those it has, against today's
    return [f"{stage}.{name}={value!r}" for stage, values in actual.items() for name, value in sorted(values.items())
            if name not in defaults.get(stage, {}) or defaults[stage][name] != value]


@functools.lru_cache(maxsize=None)
def _default_settings(method: str, dataset: Optional[str], n_bits: Optional[int]) -> Optional[Dict[str, Any]]:
    """A run's settings (as rows hold them, beyond the columns) at ``method``'s defaults on ``dataset``; None where
    they cannot be resolved. Once per method, dataset and length: a lab's compare reads thousands of rows."""
    from ucmfh.app.identity import run_settings
    from ucmfh.config import SettingError
    from ucmfh.methods.settings import stage_configs

    try:
        fcfg, hcfgs = stage_configs(method, dataset=dataset, **({"n_bits": n_bits} if n_bits is not None else {}))
    except (SettingError, ValueError, TypeError):
        return None
    return _beyond_columns({stage: v for stage, v in run_settings(fcfg, hcfgs[0], 1).items() if v is not None})


def beyond_defaults_of(rows: Iterable[Dict[str, Any]]) -> List[str]:
    """Every setting beyond its method's defaults of any of ``rows`` (:func:`beyond_defaults`), each once."""
    return list(dict.fromkeys(d for row in rows for d in beyond_defaults(row) or []))


def beyond_defaults_note(rows_by_name: Dict[str, Iterable[Dict[str, Any]]]) -> Optional[str]:
    """For each name (a method, a side of 'ucmfh compare'), the settings of its rows beyond its method's defaults
    (:func:`beyond_defaults`), as ``two-tower hash.epochs=3; cca-itq ...``, or None where every row has its
    method's defaults: a table of the default method beside a baseline no longer hides that the method ran 3
    epochs of its 100."""
    said = {name: beyond_defaults_of(rows) for name, rows in rows_by_name.items()}
    said = {name: differ for name, differ in said.items() if differ}
    if not said:
        return None
    return "; ".join(f"{name} {', '.join(differ)}" for name, differ in said.items())


def method_of(row: Dict[str, Any]) -> Optional[str]:
    """A row's hashing method; a training row from before methods existed is 'ucmfh'; a SEPS row has none."""
    return row.get("method") or ("ucmfh" if row.get("task") in ("fusion", "hashing") else None)


def variant_of(row: Dict[str, Any]) -> str:
    """A row's method, with its loss when that is not the method's default: 'two-tower', 'ucmfh:infonce'."""
    from ucmfh.methods import METHODS  # the registry imports torch: 'runs' alone names no variant
    from ucmfh.methods.settings import default_loss

    method = row.get("method") or "ucmfh"
    default = default_loss(method) if method in METHODS else None
    if default is None:
        return method
    loss = row.get("loss")
    return method if loss in (None, default) else f"{method}:{loss}"


def seed_of(row: Dict[str, Any]) -> Optional[int]:
    """A row's seed: its own, else its hashing model's (a re-ranking row without SEPS); None if it has none."""
    seed = row.get("seed")
    return seed if seed is not None else (row.get("hash_settings") or {}).get("seed")


def _stage(row: Dict[str, Any]) -> Optional[str]:
    """What a two-stage search row measured: ``seps-rerank m=100``; None for any other row."""
    stage = row.get("stage")
    if stage is None:
        return None
    return f"{stage} m={row['candidates']}" if row.get("candidates") else stage


def trained_on(row: Dict[str, Any]) -> Optional[str]:
    """The dataset (label) a row's model was trained on, when that is not the dataset it was scored on."""
    return (row.get("trained_on") or {}).get("label")


def _measurement(row: Dict[str, Any]) -> tuple:
    run = row.get("run") or (row.get("checkpoint"), row.get("hash_checkpoint"), row.get("seps_checkpoint"),
                             row.get("codes"), row.get("seed"))
    # one model's codes of two dataset files are two measurements; two codes files of one model, of one file (its
    # fingerprint, as 'ucmfh encode' records it), one (codes files of before: their paths)
    scored_on = row.get("dataset_fingerprint") or row.get("codes")
    return (json.dumps(run, sort_keys=True), scored_on, row.get("task"), _stage(row), row.get("protocol"),
            row.get("database"), row.get("k"))


def latest(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The last row of each measurement (a run scored again replaces its earlier rows)."""
    last: Dict[tuple, Dict[str, Any]] = {}
    for row in rows:
        last[_measurement(row)] = row
    return list(last.values())


def _codes_of_no_model(row: Dict[str, Any]) -> Optional[str]:
    """The codes file of a row of ``evaluate --codes`` that records no model (an older ucmfh's: no method, seed or
    settings), which is then a setting of its own: the codes of two methods were averaged as two seeds of one."""
    return row.get("codes") if row.get("task") == "codes" and not row.get("settings") and not row.get("run") else None


def settings_key(row: Dict[str, Any]) -> str:
    """The key of a row's settings beyond the summary's columns (seed, loss, code length)."""
    return key_of(_beyond_columns(settings_of(row)))


# what marks a group some of whose seeds' codes collapsed, in every table of results, and the line that says it
COLLAPSE_MARK = "†"
COLLAPSE_NOTE = (f"{COLLAPSE_MARK}: in some of the seeds the codes collapsed (distinct codes of a modality at most "
                 f"{COLLAPSED:.0%} of its items): those seeds score a near-random order, averaged in with the others")
# and the line under a table some of whose rows an older ucmfh scored, counting no distinct codes: not marked either way
UNCHECKED_NOTE = (f"some rows were scored by an older ucmfh, which counted no distinct codes: codes of theirs that "
                  f"collapsed are not marked {COLLAPSE_MARK}; 'ucmfh evaluate -c CHECKPOINT' scores such a run again")
# and the line under a table some of whose groups average seeds trained with other CPU thread counts
THREADS_NOTE = ("some means are over seeds trained with other numbers of CPU threads (a row's train_threads): on a "
                "CPU another count sums in another order and trains another model; 'ucmfh runs --json' names them "
                "(mixed_threads)")


def unchecked(row: Dict[str, Any]) -> bool:
    """Whether ``row`` scores codes whose distinct codes it does not count (an older ucmfh's row, before 2026-11-27):
    a collapse of its codes cannot be marked."""
    return row.get("task") in ("hashing", "codes") and not row.get("stage") and "distinct_codes" not in row


def dataset_labels(entries: Sequence[Dict[str, Any]]) -> Dict[Tuple[Any, Any], str]:
    """How each dataset file of ``entries`` (rows, or :func:`summarize` groups) is named in a table or a figure, by
    its (name, fingerprint): its name, and where two files of one name are among them, the first 8 characters of
    its fingerprint beside it (``syn [058e9011]``). Every view of results names them so: a table keyed by the name
    alone showed one file's figures under the name and dropped the other's."""
    files: Dict[Any, set] = {}  # the dataset files of each name (entries that record one)
    for entry in entries:
        fingerprint = entry.get("dataset_fingerprint")
        files.setdefault(entry.get("dataset"), set()).update([fingerprint] if fingerprint else [])
    return {(entry.get("dataset"), entry.get("dataset_fingerprint")): printable(str(entry.get("dataset"))) + (
        f" [{str(entry['dataset_fingerprint'])[:8]}]" if len(files[entry.get("dataset")]) > 1
        and entry.get("dataset_fingerprint") else "") for entry in entries}


def summarize(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One entry per (dataset file, the dataset file trained on when another, task, method, loss, n_bits,
    protocol, k, other settings but the seed)."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in latest(rows):
        key = (row.get("dataset_fingerprint") or row.get("dataset"), row.get("dataset"),
               (row.get("trained_on") or {}).get("fingerprint"), trained_on(row), row.get("task"),
               method_of(row), row.get("loss"), row.get("n_bits"), _stage(row), row.get("protocol"),
               row.get("database"), row.get("k"), settings_key(row), _codes_of_no_model(row))
        groups.setdefault(key, []).append(row)
    out = []
    for key, group in groups.items():
        _, dataset, _, trained, task, method, loss, n_bits, stage, protocol, database, k, settings, _ = key
        entry: Dict[str, Any] = {
            "dataset": dataset, "dataset_fingerprint": group[0].get("dataset_fingerprint"), "trained_on": trained,
            "task": task, "method": method, "loss": loss,
            "n_bits": n_bits, "stage": stage, "protocol": protocol, "database": database, "k": k, "n_seeds": len(group),
            "seeds": sorted(seed for seed in map(seed_of, group) if seed is not None),
            "checkpoints": sorted({r["checkpoint"] for r in group if r.get("checkpoint")}),
            "settings_key": settings[:6], "settings": _beyond_columns(settings_of(group[0])),
            # seeds whose codes collapsed (a near-random order's scores, averaged in with the others): marked
            "collapsed_seeds": sum(bool(collapsed(r.get("distinct_codes") or {})) for r in group),
            "unchecked_seeds": sum(unchecked(r) for r in group),
            # the CPU thread counts its seeds trained with, where they differ (on a CPU another count trains another
            # model: a mean over seeds of several counts is not one setting's)
            "mixed_threads": sorted({t for r in group for t in (r.get("train_threads"), r.get("fusion_train_threads"))
                                     if isinstance(t, int)}),
        }
        if len(entry["mixed_threads"]) < 2:
            entry["mixed_threads"] = []
        scores = (*DIRECTIONS, "rsum", *RECALL_AT_K)
        scores += tuple(f + EXPECTED for f in scores)
        for field in (*scores, *(RANDOM + f for f in (*DIRECTIONS, "rsum", *RECALL_AT_K)), *(REAL + f for f in scores)):
            if _value(group[0], field) is None:  # a figure these rows do not have (most of the fields of any row)
                continue
            values = [value for value in (_value(r, field) for r in group) if value is not None]
            # a figure some of the group's rows lack (rows of an older version: no tie-aware twins) is left out,
            # not taken over the rows that have it: every figure of an entry is over its n_seeds rows, and the
            # headline falls back to the figure they all have
            if values and len(values) == len(group):
                entry[f"{field}_mean"] = statistics.fmean(values)
                entry[f"{field}_std"] = sample_std(values)
        for clock in ("train_time_s", "fusion_train_time_s"):  # a method on a fusion stage: that stage's too
            times = [r[clock] for r in group if r.get(clock)]
            entry[f"{clock}_mean"] = statistics.fmean(times) if times else None
        out.append(entry)
    out.sort(key=lambda e: (str(e["dataset"]), str(e["trained_on"] or ""), str(e["task"]), str(e["method"]),
                            str(e["loss"]), e["n_bits"] or 0, str(e["stage"]), str(e["protocol"]), str(e["database"]),
                            e["settings_key"]))
    return out


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation of ``values`` (0.0 for one), in floats, each sum exactly rounded: what
    :func:`statistics.stdev` gives to the last digit or so, where its exact fractions took a quarter of a lab's
    'ucmfh runs'."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))


def settings_legend(groups: List[Dict[str, Any]]) -> List[str]:
    """For each settings key, its values of the settings that vary among the keys of the same method and stages (a
    fusion stage alone, a hashing stage alone, both, a SEPS stage ...): described against another method's key,
    the one setting two runs of a method differ by was lost among that method's every default."""
    keys = {g["settings_key"]: (g.get("method"), g["settings"]) for g in groups}
    if len(keys) < 2:  # nothing to tell apart: where the key comes from, still
        return [f"settings {key}: the settings every row shares ('ucmfh runs --json' prints them)" for key in keys]
    alike: Dict[tuple, List[Dict[str, Any]]] = {}
    for method, settings in keys.values():
        alike.setdefault((method, tuple(settings)), []).append(settings)
    lines = ["settings (each key's values of what varies among the keys of its method and stages; '--method "
             "METHOD@KEY' keeps one, 'ucmfh compare METHOD@KEY METHOD@KEY' pairs two):"]
    for key, (method, settings) in keys.items():
        stages = tuple(settings)
        others = alike[method, stages]
        varying = [(stage, name) for stage in stages for name in sorted({n for o in others for n in o[stage]})
                   if len({repr(o[stage].get(name, "-")) for o in others}) > 1]
        only = f"the only settings{f' of {method}' if method else ''}" + (
            f" with stages {' + '.join(stages)}" if stages else " without settings")
        values = [f"{stage}.{name}={repr(settings[stage][name]) if name in settings[stage] else '-'}"
                  for stage, name in varying]
        lines.append(f"  {key}: {', '.join(values) or only}")
    return lines


def _cell(entry: Dict[str, Any], field: str, digits: int = 4) -> str:
    """``mean ± std`` of a field over the group's seeds; the mean alone for one seed; ``-`` when absent."""
    if f"{field}_mean" not in entry:
        return "-"
    mean = f"{entry[f'{field}_mean']:.{digits}f}"
    return mean if entry["n_seeds"] < 2 else f"{mean} ± {entry[f'{field}_std']:.{digits}f}"


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def format_summary(groups: List[Dict[str, Any]]) -> str:
    """A plain-text table of :func:`summarize` output, with a legend of the settings keys."""
    if not groups:
        return "no runs match"
    captions = any(g["database"] for g in groups)
    labels = dataset_labels(groups)
    columns = [("dataset", lambda g: _text(labels[g["dataset"], g["dataset_fingerprint"]]))]
    if any(g.get("trained_on") for g in groups):
        columns.append(("trained on", lambda g: _text(g.get("trained_on"))))
    columns += [("task", lambda g: _text(g["task"])), ("method", lambda g: _text(g["method"])),
                ("loss", lambda g: _text(g["loss"])), ("bits", lambda g: _text(g["n_bits"]))]
    if any(g["stage"] for g in groups):
        columns.append(("stage", lambda g: _text(g["stage"])))
    columns.append(("protocol", lambda g: _text(g["protocol"])))
    if captions:
        columns.append(("database", lambda g: _text(g["database"])))
    columns += [("k", lambda g: _text(g["k"])), ("seeds", lambda g: str(g["n_seeds"]) + COLLAPSE_MARK * bool(
        g.get("collapsed_seeds")))]
    if captions:  # a caption set's headline
        columns += [("R@1 I->T", lambda g: _cell(g, headline(g, "r1_i2t"), 1)),
                    ("R@1 T->I", lambda g: _cell(g, headline(g, "r1_t2i"), 1))]
    columns += [("MAP I->T", lambda g: _cell(g, headline(g, "map_i2t"))),
                ("MAP T->I", lambda g: _cell(g, headline(g, "map_t2i")))]
    if captions:
        columns.append(("rSum", lambda g: _cell(g, headline(g, "rsum"), 1)))
    tie_aware = any(headline(g, "map_i2t") != "map_i2t" for g in groups)
    if tie_aware:
        columns.append(("ties by index", lambda g: "-" if headline(g, "map_i2t") == "map_i2t" or any(
            f"{d}_mean" not in g for d in DIRECTIONS) else " / ".join(f"{g[f'{d}_mean']:.4f}" for d in DIRECTIONS)
            + (f", rSum {g['rsum_mean']:.1f}" if "rsum_mean" in g else "")))  # '-' where rows lack the figure
    columns += [("random I->T", lambda g: _cell({**g, "n_seeds": 1}, "random_map_i2t")),
                ("settings", lambda g: g["settings_key"])]
    cells = [[show(g) for _, show in columns] for g in groups]
    widths = [max(shown_width(name), *(shown_width(row[i]) for row in cells)) for i, (name, _) in enumerate(columns)]
    lines = ["  ".join(pad(name, w) for (name, _), w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(pad(cell, w) for cell, w in zip(row, widths)).rstrip() for row in cells]
    lines.append("mean ± sample standard deviation over seeds (the mean alone for one seed); unimodal = cross-modal "
                 "retrieval, fused = UCMFH's protocol (leaks the paired modality)")
    if tie_aware:
        lines.append("R@1, MAP and rSum: the mean over every order of tied items (tie-aware, docs/evaluation.md); "
                     "'ties by index': MAP (and rSum) with ties broken by database index, as the field's code does "
                     "(means over seeds); '-': rows scored by index order only, whose figure leads")
    if captions:
        lines.append("caption sets: R@1 in %, MAP by id, rSum = R@1+R@5+R@10 of both directions in %; database "
                     "test = the query split, collection = query and retrieval together")
    if any(g.get("collapsed_seeds") for g in groups):
        lines.append(COLLAPSE_NOTE)
    if any(g.get("unchecked_seeds") for g in groups):
        lines.append(UNCHECKED_NOTE)
    if any(g.get("mixed_threads") for g in groups):
        lines.append(THREADS_NOTE)
    if any(g.get("trained_on") for g in groups):
        lines.append("trained on: a checkpoint trained on that dataset, scored on this one ('ucmfh evaluate -c'); "
                     "'-': trained on this one")
    if any(g["stage"] for g in groups):
        lines.append("stage: two-stage search ('ucmfh rerank'), m = the Hamming candidates re-ranked")
    if any(label != str(name) for (name, _), label in labels.items()):
        lines.append("dataset [fingerprint]: dataset files of one name and other contents, told apart by the first "
                     "characters of their contents' SHA-256 (as their run folders are named)")
    return "\n".join(lines + settings_legend(groups))
