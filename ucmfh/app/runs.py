"""Past runs from a results file: filtered, deduplicated, and summarised over seeds.

Rows that score the same run the same way (``run``, ``protocol``, ``k``) are
one measurement: the last one counts (``ucmfh evaluate`` of a checkpoint
scores its run again). Runs that differ only in their seed form one group,
summarised as mean ± sample standard deviation.
"""
from __future__ import annotations

import json
import os
import statistics
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ucmfh.app.experiment import key_of
from ucmfh.files import read_jsonl

DIRECTIONS = ("map_i2t", "map_t2i")
# R@1 of a caption set's row, in %: summarised like a field of its own
RECALL_AT_1 = ("r1_i2t", "r1_t2i")
# the prefix of a figure of the hash heads' real-valued outputs ranked by cosine (a row's ``real_valued``)
REAL = "real_"


def _value(row: Dict[str, Any], field: str) -> Optional[float]:
    """A row's figure; ``r1_i2t`` / ``r1_t2i`` read R@1 from its recall dict, and ``real_`` + a field
    reads it from the scores of the real-valued head outputs (``real_valued``)."""
    if field.startswith(REAL):
        real = row.get("real_valued")
        return None if real is None else _value(real, field[len(REAL):])
    if field in RECALL_AT_1:
        recall = row.get("recall_" + field[3:])
        return None if recall is None else recall.get("1")
    return row.get(field)


def read_results(path: str) -> List[Dict[str, Any]]:
    """The rows of a results file; a missing file is an error that names it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such results file (runs append their rows to --results)")
    return read_jsonl(path)


def _matches(value: Any, wanted: Sequence[Any]) -> bool:
    return not wanted or value in wanted


def filter_rows(
    rows: Iterable[Dict[str, Any]], dataset: Sequence[str] = (), method: Sequence[str] = (),
    loss: Sequence[str] = (), n_bits: Sequence[int] = (), protocol: Optional[str] = None,
) -> List[Dict[str, Any]]:
    return [r for r in rows
            if _matches(r.get("dataset"), dataset) and _matches(r.get("method", "ucmfh"), method)
            and _matches(r.get("loss"), loss) and _matches(r.get("n_bits"), n_bits)
            and (protocol is None or r.get("protocol") == protocol)]


# settings that are columns of the summary already
COLUMNS = ("seed", "loss", "n_bits")


def _beyond_columns(settings: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {stage: (None if values is None else {k: v for k, v in values.items() if k not in COLUMNS})
            for stage, values in (settings or {}).items()}


def _measurement(row: Dict[str, Any]) -> tuple:
    run = row.get("run") or (row.get("checkpoint"), row.get("codes"), row.get("seed"))
    return (json.dumps(run, sort_keys=True), row.get("protocol"), row.get("database"), row.get("k"))


def summarize(rows: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One entry per (dataset file, task, method, loss, n_bits, protocol, k, other settings but the seed)."""
    latest: Dict[tuple, Dict[str, Any]] = {}
    for row in rows:
        latest[_measurement(row)] = row
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for row in latest.values():
        settings = _beyond_columns(row.get("settings"))
        key = (row.get("dataset_fingerprint") or row.get("dataset"), row.get("dataset"), row.get("task"),
               row.get("method", "ucmfh"), row.get("loss"), row.get("n_bits"), row.get("protocol"),
               row.get("database"), row.get("k"), key_of(settings))
        groups.setdefault(key, []).append(row)
    out = []
    for key, group in groups.items():
        _, dataset, task, method, loss, n_bits, protocol, database, k, settings_key = key
        entry: Dict[str, Any] = {
            "dataset": dataset, "task": task, "method": method, "loss": loss, "n_bits": n_bits,
            "protocol": protocol, "database": database, "k": k, "n_seeds": len(group), "seeds": sorted(r.get("seed") for r in group),
            "settings_key": settings_key[:6], "settings": _beyond_columns(group[0].get("settings")),
        }
        scores = (*DIRECTIONS, "rsum", *RECALL_AT_1)
        for field in (*scores, *(f"random_{d}" for d in DIRECTIONS), "random_rsum", *(REAL + f for f in scores)):
            values = [_value(r, field) for r in group if _value(r, field) is not None]
            if values:
                entry[f"{field}_mean"] = statistics.fmean(values)
                entry[f"{field}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        times = [r["train_time_s"] for r in group if r.get("train_time_s")]
        entry["train_time_s_mean"] = statistics.fmean(times) if times else None
        out.append(entry)
    out.sort(key=lambda e: (str(e["dataset"]), str(e["task"]), str(e["method"]), str(e["loss"]),
                            e["n_bits"] or 0, str(e["protocol"]), str(e["database"]), e["settings_key"]))
    return out


def _flat(settings: Dict[str, Any]) -> Dict[str, Any]:
    return {f"{stage}.{k}": v for stage, values in settings.items() if values for k, v in values.items()}


def settings_legend(groups: List[Dict[str, Any]]) -> List[str]:
    """For each settings key, the settings in which it differs from the first group's."""
    keys = dict.fromkeys(g["settings_key"] for g in groups)
    if len(keys) < 2:
        return []
    flat = {g["settings_key"]: _flat(g["settings"]) for g in groups}
    base = flat[next(iter(keys))]
    lines = ["settings (each against the first key):"]
    for key in keys:
        differ = [f"{name}={flat[key].get(name)!r}" for name in sorted(set(base) | set(flat[key]))
                  if flat[key].get(name) != base.get(name)]
        lines.append(f"  {key}: {', '.join(differ) or 'the reference'}")
    return lines


def _cell(entry: Dict[str, Any], field: str) -> str:
    if f"{field}_mean" not in entry:
        return "-"
    return f"{entry[f'{field}_mean']:.4f} ± {entry[f'{field}_std']:.4f}"


def format_summary(groups: List[Dict[str, Any]]) -> str:
    """A plain-text table of :func:`summarize` output, with a legend of the settings keys."""
    if not groups:
        return "no runs match"
    captions = any(g["database"] for g in groups)
    header = (f"{'dataset':<14}{'task':<9}{'method':<8}{'loss':<10}{'bits':>5}  {'protocol':<9}"
              + (f"{'database':<11}" if captions else "") + f"{'k':>4}{'seeds':>6}"
              f"  {'MAP I->T':<17}{'MAP T->I':<17}" + (f"{'rSum':<15}" if captions else "")
              + f"{'random I->T':<12}{'settings':<8}")
    lines = [header]
    for g in groups:
        rand = f"{g['random_map_i2t_mean']:.4f}" if "random_map_i2t_mean" in g else "-"
        rsum = f"{g['rsum_mean']:.1f} ± {g['rsum_std']:.1f}" if "rsum_mean" in g else "-"
        lines.append(f"{str(g['dataset']):<14}{str(g['task']):<9}{str(g['method']):<8}{str(g['loss']):<10}"
                     f"{g['n_bits'] or '-':>5}  {str(g['protocol']):<9}"
                     + (f"{g['database'] or '-':<11}" if captions else "") + f"{g['k'] or '-':>4}{g['n_seeds']:>6}"
                     f"  {_cell(g, 'map_i2t'):<17}{_cell(g, 'map_t2i'):<17}" + (f"{rsum:<15}" if captions else "")
                     + f"{rand:<12}{g['settings_key']:<8}")
    lines.append("mean ± sample standard deviation over seeds; unimodal = cross-modal retrieval, "
                 "fused = UCMFH's protocol (leaks the paired modality)")
    if captions:
        lines.append("caption sets: MAP by id, rSum = R@1+R@5+R@10 of both directions in %; database test = the "
                     "query split, collection = query and retrieval together")
    return "\n".join(lines + settings_legend(groups))
