"""``ucmfh compare BASE OTHER``: two methods, or two settings of one, on the same cells, the difference with a
95% interval.

Each side is a method (``two-tower``; with its loss where that is not the method's own: ``ucmfh:infonce``) and,
after ``@``, which of its settings: a key that ``ucmfh runs`` shows (``two-tower@b0a77f``) or settings as
``--set`` names them (``two-tower@hash.lr_head=0.01``, several comma-separated) (:class:`Side`).

For every cell both methods were scored on (dataset, code length, protocol, database of a
caption set, k) it reads the runs' per-query tie-aware scores (:mod:`ucmfh.app.per_query`),
pairs them by seed and query, and prints OTHER − BASE with a paired bootstrap interval over
queries and, where there are several, seeds (:mod:`ucmfh.metrics.intervals`): ``ahead`` or
``behind`` when the interval excludes zero, else ``level``.

With ``--pool`` the datasets are other query draws of the same items (``scripts/query_draws.py``):
each length is one cell, and a seed's queries are those of every draw, trained and scored apart, so a
small query split (mirflickr730's 100) is measured on several times as many queries.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import click
import numpy as np
from tqdm.auto import tqdm

from ucmfh.app.errors import UserError, user_errors, warn
from ucmfh.app.options import Count, json_or_text, results_to_read, row_filters
from ucmfh.app.per_query import load_per_query
from ucmfh.app.runs import (beyond_defaults_note, beyond_defaults_of, dataset_labels, filter_rows, held_by, latest,
                            read_results, seed_of, settings_key, settings_of, trained_on, variant_of)
from ucmfh.config import MOVED_TO_PARAMS, STAGES
from ucmfh.metrics.intervals import RESAMPLES, paired_bootstrap, verdict
from ucmfh.printable import pad, shown_width

# figure -> per part: (per-query score name, column of a [Q, 3] hits array or None, scale)
LABELLED = {"MAP I->T": [("ap_i2t", None, 1.0)], "MAP T->I": [("ap_t2i", None, 1.0)]}
CAPTIONS = {"R@1 I->T": [("hits_i2t", 0, 100.0)], "R@1 T->I": [("hits_t2i", 0, 100.0)],
            "rSum": [("hits_i2t", "all", 100.0), ("hits_t2i", "all", 100.0)], **LABELLED}
# each figure's field, as results rows and 'ucmfh runs --json' name it: the per-query scores are tie-aware
FIELDS = {"MAP I->T": "map_i2t_expected", "MAP T->I": "map_t2i_expected", "R@1 I->T": "r1_i2t_expected",
          "R@1 T->I": "r1_t2i_expected", "rSum": "rsum_expected"}


def _part(scores: Dict[str, np.ndarray], name: str, column: Any, scale: float) -> np.ndarray:
    values = scores[name].astype(np.float64)
    if column == "all":
        values = values.sum(axis=1)
    elif column is not None:
        values = values[:, column]
    return scale * values


def _cell_order(cell: tuple) -> tuple:
    """A cell's place in the table: its parts in order, code lengths and k by number (16 before 128)."""
    return tuple((x is None, 0, x, "") if isinstance(x, (int, float)) else (x is None, 1, 0, str(x)) for x in cell)


def check_draws(rows: List[Dict[str, Any]]) -> None:
    """Refuse, for ``--pool``, datasets that cannot be query draws of one set of items: their databases differ in
    size (a draw moves queries between splits of one file's items and keeps every split's size)."""
    sizes: Dict[Any, Dict[str, tuple]] = {}  # database -> dataset -> (images, texts)
    for row in rows:
        if row.get("n_database_img") is not None and row.get("n_database_txt") is not None:
            sizes.setdefault(row.get("database"), {}).setdefault(
                str(row.get("dataset")), (row["n_database_img"], row["n_database_txt"]))
    for database, by_dataset in sizes.items():
        if len(set(by_dataset.values())) > 1:
            given = "; ".join(f"{name}: {img} images, {txt} texts" for name, (img, txt) in sorted(by_dataset.items()))
            raise UserError(f"--pool: the datasets are not query draws of the same items (their "
                            f"{database + ' ' if database else ''}databases differ: {given})")


@dataclass(frozen=True)
class Side:
    """One side of a comparison, as given (``name``): a method's ``variant`` (:func:`ucmfh.app.runs.variant_of`)
    and, after '@', which of its settings: a ``key`` prefix as ``ucmfh runs`` shows it, or ``conditions``, each a
    setting's path (stage, name and, in a dict setting, its key) and the value it must have."""

    name: str
    variant: str
    key: Optional[str] = None
    conditions: Tuple[Tuple[Tuple[str, ...], Any, str], ...] = ()  # (path, value, the value as written)

    def holds(self, row: Dict[str, Any]) -> bool:
        """Whether ``row`` is one of this side's runs."""
        if variant_of(row) != self.variant:
            return False
        if self.key is not None and not settings_key(row).startswith(self.key):
            return False
        return all(has_setting(row, path, value, text) for path, value, text in self.conditions)


def has_setting(row: Dict[str, Any], path: Tuple[str, ...], value: Any, text: str) -> bool:
    """Whether ``row``'s setting at ``path`` is ``value``: a number equal to it (0 is 0.0), but a boolean only a
    boolean (0 is not false); a setting kept as text (a method parameter's '0.3,0.1') is the text as written."""
    found, held = setting_at(row, path)
    if not found:
        return False
    if isinstance(held, str) and not isinstance(value, str):
        return held == text
    if isinstance(held, bool) or isinstance(value, bool):
        return type(held) is type(value) and held == value
    return held == value


def setting_at(row: Dict[str, Any], path: Tuple[str, ...]) -> Tuple[bool, Any]:
    """(True, the value) of a row's setting at ``path`` (``("hash", "loss_params", "temperature")``); (False,
    None) where the row has none there."""
    value: Any = settings_of(row)
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _split_conditions(text: str) -> List[str]:
    """``a=1,b=[0.5,0.9],c="x,y"`` -> ['a=1', 'b=[0.5,0.9]', 'c="x,y"']: commas inside brackets or quotes belong
    to a value."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, char in enumerate(text):
        quoted = quoted != (char == '"')
        depth += 0 if quoted else {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        if char == "," and depth == 0 and not quoted:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def parse_side(text: str, argument: str) -> Side:
    """BASE or OTHER (``argument``) as a :class:`Side`: ``METHOD``, ``METHOD@KEY`` (4 to 12 hex digits, the start of
    a settings key) or ``METHOD@STAGE.NAME=VALUE,...`` (values read as JSON where they parse, as ``--set``'s)."""
    variant, at, which = text.partition("@")
    if not variant:
        raise UserError(f"{argument}: no method in {text!r} (METHOD, METHOD@KEY or METHOD@STAGE.NAME=VALUE)")
    if not at:
        return Side(text, variant)
    if re.fullmatch(r"[0-9a-f]{4,12}", which):
        return Side(text, variant, key=which)
    conditions = []
    for pair in _split_conditions(which):
        path, sep, value = pair.partition("=")
        stage, _, name = path.partition(".")
        if not sep or not name:
            raise UserError(f"{argument}: {pair!r} in {text!r} is neither a settings key ('ucmfh runs' shows them, 4 "
                            "to 12 hex digits) nor STAGE.NAME=VALUE (e.g. hash.lr_head=0.01)")
        if stage not in STAGES:
            raise UserError(f"{argument}: {path!r} in {text!r}: no stage {stage!r} (stages: {', '.join(STAGES)})")
        known = [f.name for f in dataclasses.fields(STAGES[stage])]
        parts = tuple(path.split("."))
        if stage == "hash" and parts[1:] in [("method_params", moved) for moved in MOVED_TO_PARAMS]:
            parts = ("hash", parts[2])  # a parameter that was a hashing setting: rows hold it there (identity_dict)
        elif name.split(".")[0] not in known:
            raise UserError(f"{argument}: {path!r} in {text!r}: {stage} settings are {', '.join(known)}")
        if any(p == parts for p, _, _ in conditions):
            raise UserError(f"{argument}: {path} given twice in {text!r}; give it once")
        conditions.append((parts, json_or_text(value), value))
    return Side(text, variant, conditions=tuple(conditions))


def check_side(rows: List[Dict[str, Any]], side: Side) -> None:
    """Refuse a side whose settings no row of its method has, naming what its method's rows hold instead."""
    mine = [row for row in rows if variant_of(row) == side.variant]
    if not mine or any(side.holds(row) for row in mine):
        return  # a method absent altogether is said with the cells (which methods the rows hold)
    if side.key is not None:
        keys = sorted({settings_key(row)[:6] for row in mine})
        raise UserError(f"{side.name}: no {side.variant} row has settings key {side.key}... (its keys: "
                        f"{', '.join(keys)}; 'ucmfh runs' shows what each sets)")
    for path, value, text in side.conditions:
        held = sorted({json.dumps(setting_at(row, path)[1]) for row in mine if setting_at(row, path)[0]})
        if not held:
            raise UserError(f"{side.name}: no {side.variant} row has a setting {'.'.join(path)}")
        if not any(has_setting(row, path, value, text) for row in mine):
            raise UserError(f"{side.name}: no {side.variant} row has {'.'.join(path)}={text} (its rows have "
                            f"{', '.join(held)})")
    raise UserError(f"{side.name}: no {side.variant} row has all of these settings at once")


def check_apart(rows: List[Dict[str, Any]], base: Side, other: Side) -> None:
    """Refuse two sides of one method that do not part its settings (beyond the seed and code length, which
    every comparison pairs): both select the same settings, or both hold two (each would be compared with the
    other, both ways round)."""
    held = [{settings_key(row)[:6] for row in rows if side.holds(row)} for side in (base, other)]
    hint = "part them by the keys or settings 'ucmfh runs' shows; seeds and code lengths by --seed and -b"
    if held[0] == held[1]:
        raise UserError(f"{base.name} and {other.name} select runs of the same settings ({', '.join(sorted(held[0]))})"
                        f"; {hint}")
    both = held[0] & held[1]
    if len(both) > 1:
        raise UserError(f"{base.name} and {other.name} both select the runs of settings {', '.join(sorted(both))}; "
                        f"{hint}")


def cells(rows: List[Dict[str, Any]], base: Side, other: Side, pool: bool = False,
          ) -> Dict[tuple, Dict[str, Dict[int, Dict[str, Dict[str, Any]]]]]:
    """The cells both sides were scored on: {(dataset, n_bits, protocol, database, k, base settings,
    other settings): {side's name: {seed: {dataset fingerprint: row}}}}, one dataset a cell (and rows of
    checkpoints trained on another dataset, ``trained_on``, a cell apart); with ``pool``
    every dataset in one cell per length (named by the datasets joined with '+').

    A side scored with several settings in one cell (a grid's ``--set``, a ``--refit`` run beside a
    plain one) is compared setting by setting: one cell for each pair of settings (the key of each,
    :func:`ucmfh.app.runs.settings_key`), but for a pair of one method's same settings (two sides of one
    method both hold them); a cell that only one side has is left out, whatever its settings."""
    found: Dict[tuple, Dict[str, Dict[str, Dict[int, Dict[str, Dict[str, Any]]]]]] = {}
    names: Dict[tuple, set] = {}
    labels = dataset_labels(rows)  # two files of one name apart ('syn [058e9011]'): by the name, one cell was lost
    for row in rows:
        sides = [side for side in (base, other) if side.holds(row)]
        if not sides:
            continue
        scored = (row.get("n_bits"), row.get("protocol"), row.get("database"), row.get("k"))
        # a checkpoint scored on another dataset than its training's: a cell of its own, as 'ucmfh runs' keeps it
        trained = (row.get("trained_on") or {}).get("fingerprint")
        where = ((None if pool else row.get("dataset_fingerprint"), trained), None if pool else row.get("dataset"),
                 *scored)  # pooled draws too: a checkpoint trained elsewhere is never one of the pool's runs
        names.setdefault(where, set()).add(labels[row.get("dataset"), row.get("dataset_fingerprint")]
                                           + (f" (trained on {trained_on(row)})" if trained else ""))
        for side in sides:
            by_setting = found.setdefault(where, {}).setdefault(side.name, {})
            by_seed = by_setting.setdefault(settings_key(row), {}).setdefault(seed_of(row), {})
            by_seed[str(row.get("dataset_fingerprint") or row.get("dataset"))] = row
    out = {}
    for where, sides in found.items():
        if base.name not in sides or other.name not in sides:
            continue
        for base_key, base_runs in sides[base.name].items():
            for other_key, other_runs in sides[other.name].items():
                if base.variant == other.variant and base_key == other_key:
                    continue  # the same runs on both sides
                out[("+".join(sorted(names[where])), *where[2:], base_key, other_key)] = {base.name: base_runs,
                                                                                         other.name: other_runs}
    return out


def in_seed_order(seeds: Iterable[Optional[int]]) -> List[Optional[int]]:
    """Seeds ascending, a row without one (None) last."""
    return sorted(seeds, key=lambda s: (s is None, s))


def compare_cell(methods: Dict[str, Dict[int, Dict[str, Dict[str, Any]]]], base: str, other: str, resamples: int,
                 load: Callable[[Dict[str, Any]], Dict[str, np.ndarray]] = load_per_query) -> List[Dict[str, Any]]:
    """Every figure of one cell: the two means and the paired difference with its interval. A seed counts
    where both methods were scored on every dataset of the cell; its queries are theirs, one after another.
    ``load``: a row's per-query scores (:func:`loader`: each file read once, whatever cells hold its row)."""
    datasets = sorted({d for by_seed in methods.values() for runs in by_seed.values() for d in runs})
    seeds = in_seed_order(s for s in set(methods[base]) & set(methods[other])
                          if all(sorted(methods[m][s]) == datasets for m in (base, other)))
    if not seeds:
        return []
    unpaired = in_seed_order((set(methods[base]) | set(methods[other])) - set(seeds))
    unscored = list(dict.fromkeys(row.get("checkpoint") for row in (methods[m][s][d] for m in (base, other)
                                  for s in seeds for d in datasets) if not isinstance(row.get("per_query"), str)))
    if len(unscored) > 1:  # each at once, where a call named one and the next call the next
        raise ValueError(f"{len(unscored)} runs' rows have no per-query scores (scored before they were kept); score "
                         "them again: " + "; ".join(f"'ucmfh evaluate -c {c}'" for c in unscored))
    scores = {m: [[load(methods[m][s][d]) for d in datasets] for s in seeds] for m in (base, other)}
    figures = CAPTIONS if "hits_i2t" in scores[base][0][0] else LABELLED
    out = []
    for figure, parts in figures.items():
        per_method = {m: [np.stack([np.concatenate([_part(sc, *part) for sc in per_seed]) for per_seed in scores[m]])
                          for part in parts] for m in (base, other)}
        for a, b in zip(per_method[base], per_method[other]):
            if a.shape != b.shape:
                raise ValueError(f"{base} and {other} were scored on different queries ({a.shape[1]} and {b.shape[1]})")
        clusters = _images(scores, parts) if figures is CAPTIONS else None
        interval = paired_bootstrap([b - a for a, b in zip(per_method[base], per_method[other])], resamples,
                                    clusters=clusters)
        out.append({"figure": figure, "seeds": seeds, "unpaired_seeds": unpaired,
                    **({"captions_apart": True} if figures is CAPTIONS and clusters is None else {}),
                    base: float(sum(p.mean() for p in per_method[base])),
                    other: float(sum(p.mean() for p in per_method[other])), "difference": interval,
                    "verdict": verdict(interval)})
    return out


def loader() -> Callable[[Dict[str, Any]], Dict[str, np.ndarray]]:
    """:func:`load_per_query` that reads each row's file once: a side with several settings is compared with each
    of the other side's, and its rows' files were read again for each pair."""
    loaded: Dict[int, Tuple[Dict[str, Any], Dict[str, np.ndarray]]] = {}

    def load(row: Dict[str, Any]) -> Dict[str, np.ndarray]:
        if id(row) not in loaded:  # the row kept beside its scores: its id is not another row's meanwhile
            loaded[id(row)] = (row, load_per_query(row))
        return loaded[id(row)][1]
    return load


def pairs_note(shared: Dict[tuple, Dict[str, Any]], base: str, other: str) -> Optional[str]:
    """A line for a comparison whose sides hold several settings in a cell, compared pair by pair (5 settings
    each: 25 comparisons a cell, silently), or None."""
    places = {cell[:-2] for cell in shared}
    if len(shared) <= len(places):
        return None
    counts = {side: len({cell[-2 if side == base else -1] for cell in shared}) for side in (base, other)}
    return (f"{len(shared)} comparisons in {len(places)} cell(s): {base} with {counts[base]} settings, {other} with "
            f"{counts[other]}, each pair compared; METHOD@KEY keeps one (keys: 'ucmfh runs')")


def _images(scores: Dict[str, List[List[Dict[str, np.ndarray]]]], parts: List[tuple]) -> Optional[List[np.ndarray]]:
    """The image of each query of each part of a caption set's figure (I→T: the image asked; T→I: the caption's
    image), the datasets of a cell numbered apart, for a bootstrap that resamples images; None where a run's
    per-query scores predate ``image_t2i`` (its captions resampled apart, as the table then says)."""
    runs = [by_dataset for per_seed in scores.values() for by_dataset in per_seed]
    if not all("image_t2i" in run for by_dataset in runs for run in by_dataset):
        return None
    first = runs[0]  # every seed and method scored the same queries of each dataset (their counts checked)
    if any(not np.array_equal(run["image_t2i"], mine["image_t2i"]) for by_dataset in runs
           for run, mine in zip(by_dataset, first)):
        return None
    offsets = np.cumsum([0] + [len(run["ap_i2t"]) for run in first])
    out = []
    for name, _, _ in parts:
        out.append(np.concatenate([offset + (np.arange(len(run["ap_i2t"])) if name.endswith("i2t")
                                             else run["image_t2i"].astype(np.int64))
                                   for run, offset in zip(first, offsets)]))
    return out


def over_what(results: List[Tuple[tuple, Dict[str, Any]]]) -> str:
    """What the intervals cover: queries, and seeds where a cell pairs several (one seed's interval covers
    another draw of queries alone, not another training run)."""
    counts = {len(r["seeds"]) for _, r in results}
    if counts == {1}:
        return "queries (one seed a cell: not over training runs)"
    return "queries and seeds" if 1 not in counts else "queries and seeds (queries alone where a cell has one seed)"


def several_settings(results: List[Tuple[tuple, Dict[str, Any]]]) -> bool:
    """Whether a method has several settings in a cell of ``results``: then the table has a settings column
    (the key of each, as 'ucmfh runs' shows it) and a plot's labels name the pair."""
    pairs: Dict[tuple, set] = {}
    for cell, _ in results:
        pairs.setdefault(cell[:5], set()).add(cell[5:])
    return any(len(found) > 1 for found in pairs.values())


def several_ks(results: List[Tuple[tuple, Dict[str, Any]]]) -> bool:
    """Whether the cells of ``results`` were scored at several k (MAP@k): then the table and a plot's labels
    say each cell's."""
    return len({cell[4] for cell, _ in results}) > 1


def cell_parts(cell: tuple, several: bool, ks: bool = False) -> List[str]:
    """A cell in the table's columns: dataset, bits, protocol, database, where ``ks`` its k, and where ``several``
    the settings pair."""
    dataset, n_bits, protocol, database, k, base_key, other_key = cell
    settings = [f"{base_key[:6]} / {other_key[:6]}"] if several else []
    return [str(dataset), f"{n_bits} bits", str(protocol), *([database] if database else []),
            *([f"k={k}"] if ks else []), *settings]


def cell_label(cell: tuple, several: bool, ks: bool = False) -> str:
    """A cell in one line (:func:`cell_parts`)."""
    return "  ".join(cell_parts(cell, several, ks))


def unpaired_line(unpaired: List[tuple], shared: Dict[tuple, Dict[str, Any]], out: List[Tuple[tuple, Dict[str, Any]]],
                  base: str, other: str) -> str:
    """The cells both sides were scored on but with no seed of both, which the table leaves out, in a line: each with
    its sides' seeds (a baseline scored at seed 0 beside a method's seed 2023)."""
    several, ks = several_settings(out), several_ks(out)

    def seeds(cell: tuple, side: str) -> str:
        return f"{side} seeds {', '.join(map(str, in_seed_order(shared[cell][side])))}"

    return "left out, no seed scored by both: " + "; ".join(
        f"{cell_label(cell, several, ks)} ({seeds(cell, base)}; {seeds(cell, other)})" for cell in unpaired)


def _format(results: List[Tuple[tuple, Dict[str, Any]]], base: str, other: str) -> str:
    several, ks = several_settings(results), several_ks(results)
    header = ["dataset", "bits", "protocol", "database", *(["k"] if ks else []), *(["settings"] if several else []),
              "seeds", "figure", base, other, "difference [95% interval]", "verdict"]
    lines = []
    for (dataset, n_bits, protocol, database, k, base_key, other_key), r in results:
        d = r["difference"]
        digits = 1 if r["figure"].startswith(("R@", "rSum")) else 4
        settings = [f"{base_key[:6]} / {other_key[:6]}"] if several else []
        # an interval that excludes zero is shown to the digit that says so: '+0.9 [+0.0, +1.7] ahead' read as one
        # touching zero (+0.03 it was)
        near = d["low"] if r["verdict"] == "ahead" else d["high"] if r["verdict"] == "behind" else None
        shown = digits
        while near is not None and shown < digits + 4 and float(f"{near:.{shown}f}") == 0:
            shown += 1
        lines.append([str(dataset), str(n_bits), str(protocol), database or "-", *([str(k)] if ks else []),
                      *settings, str(len(r["seeds"])), r["figure"], f"{r[base]:.{digits}f}", f"{r[other]:.{digits}f}",
                      f"{d['mean']:+.{shown}f} [{d['low']:+.{shown}f}, {d['high']:+.{shown}f}]", r["verdict"]])
    widths = [max(shown_width(h), *(shown_width(line[i]) for line in lines)) for i, h in enumerate(header)]
    text = ["  ".join(pad(h, w) for h, w in zip(header, widths)).rstrip()]
    text += ["  ".join(pad(c, w) for c, w in zip(line, widths)).rstrip() for line in lines]
    over = over_what(results)
    text.append(f"{other} − {base} on tie-aware per-query scores, paired by seed and query; interval: 95% paired "
                f"bootstrap over {over}; ahead / behind: it excludes zero, level: it does not")
    left = in_seed_order({seed for _, r in results for seed in r.get("unpaired_seeds", [])})
    if left:
        text.append(f"seeds {', '.join(map(str, left))}: scored for one of the two methods alone in some cells, "
                    "left out of those cells (a difference pairs a seed's runs)")
    if several:
        text.append(f"settings: {base}'s / {other}'s (the key 'ucmfh runs' shows): a method scored with several "
                    "settings in a cell is compared with each")
    text += limits(results)
    return "\n".join(text)


def limits(results: List[Tuple[tuple, Dict[str, Any]]]) -> List[str]:
    """What the intervals of ``results`` do not cover, as simulations measured it (2026-12-01, docs/evaluation.md):
    said under the table until the bootstrap covers it."""
    said = []
    if any(r.get("captions_apart") for _, r in results):  # per-query scores of an older ucmfh, without images
        said.append("caption set scored before 2026-12-01: T→I and rSum resample each caption as a query of its own, "
                    "the captions of one image apart: those intervals are too narrow (95% ones covered 66–79% in "
                    "simulation); score the runs again (ucmfh evaluate -c) for intervals over images")
    few = sorted({len(r["seeds"]) for _, r in results if 1 < len(r["seeds"]) < 5})
    if few:
        said.append(f"{'/'.join(map(str, few))} seeds: the seed part of an interval reaches no further than the seeds "
                    "scored (with 3, a 95% interval covered 84% in simulation)")
    if len(results) > 1:
        said.append(f"{len(results)} intervals, each at 95% on its own: about 1 in 20 cells with no true difference is "
                    "called ahead or behind")
    return said


@click.command("compare")
@click.argument("base")
@click.argument("other")
@results_to_read
@row_filters
@click.option("--resamples", type=Count(min=100, max=1_000_000), default=RESAMPLES, show_default=True,
              help="Bootstrap resamples (a million at most: beyond, the interval's last digit no longer moves, and "
                   "2**31 of them asked for 17 GB).")
@click.option("--pool", is_flag=True,
              help="The datasets named with -d are other query draws of the same items (scripts/query_draws.py): "
                   "one cell per length, each seed's queries those of every draw.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per cell and figure.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Also draw a forest plot of the differences and their intervals to this file (its name "
                   "ending in .png or .svg; needs ucmfh[plot]).")
@click.option("--overwrite", is_flag=True, help="Replace a file at --plot that is not a figure ucmfh wrote.")
@user_errors
def compare(base, other, results, dataset, n_bits, seed, k, protocol, resamples, pool, as_json, plot, overwrite,
            ) -> None:
    """OTHER − BASE (two methods, e.g. cca-itq two-tower, or two settings of one: two-tower@KEY or
    two-tower@hash.lr_head=0.01, KEY as 'ucmfh runs' shows it) on every cell both were scored on, with a 95%
    interval over queries and seeds."""
    if base == other:
        raise UserError(f"compare two different methods or settings, got {base!r} twice")
    base_side, other_side = parse_side(base, "BASE"), parse_side(other, "OTHER")  # named base and other, as given
    if plot:
        from ucmfh.app.forest_plot import check_plot_path  # only where a figure is asked for
        from ucmfh.metrics.plots import require_matplotlib

        check_plot_path(plot, overwrite)
        require_matplotlib()  # a missing matplotlib is said before the work, in one line naming ucmfh[plot]
    if pool and len(set(dataset)) < 2:
        raise UserError("--pool: name the query draws to pool with -d, at least two (a results file may hold "
                        "unrelated datasets)")
    every = read_results(results, warn)
    found = filter_rows(every, task=("hashing",))
    if not found:  # no hashing row at all (a file of SEPS or fusion rows): no selection to blame
        raise UserError(f"{', '.join(results)}: no hashing rows to compare (there: {held_by(every)})")
    rows = latest(filter_rows(found, dataset=dataset, n_bits=n_bits, protocol=protocol, seed=seed, k=k))
    if not rows:  # the selection, not the methods, left nothing: say what the file holds
        raise UserError(f"{', '.join(results)}: no hashing rows match -d/-b/-k/--protocol/--seed (there: "
                        f"{held_by(found)})")
    if pool:
        missing = sorted(d for d in set(dataset) if not filter_rows(rows, dataset=(d,)))
        if missing:  # a one-draw 'pool', without a word
            raise UserError(f"--pool: no rows of {', '.join(missing)} (there: {held_by(found)})")
        check_draws(rows)
    sides = (base_side, other_side)
    for side in sides:
        check_side(rows, side)
    if base_side.variant == other_side.variant and any(variant_of(row) == base_side.variant for row in rows):
        check_apart(rows, base_side, other_side)  # (a method without rows is said below, with those there)
    shared = cells(rows, base_side, other_side, pool)
    if not shared:
        present = sorted({variant_of(r) for r in rows})
        scored = {s.name: sorted({f"{r.get('dataset')} {r.get('n_bits')} bits" for r in rows if s.holds(r)})
                  for s in sides if any(s.holds(r) for r in rows)}
        where = "; ".join(f"{m} on {', '.join(cells_of)}" for m, cells_of in scored.items())
        raise UserError(f"{', '.join(results)}: no cell has rows of both {base} and {other} (methods there: "
                        f"{', '.join(present) or 'none'}" + (f"; {where}" if len(scored) == 2 else "") + ")")
    note = pairs_note(shared, base, other)
    if note:
        click.echo(note, err=True)
    out, unpaired, load = [], [], loader()
    for cell in tqdm(sorted(shared, key=_cell_order), desc="compare", unit="cell", leave=False,
                     disable=None if len(shared) > 1 else True):  # a terminal's bar; none in a pipe
        found_cell = compare_cell(shared[cell], base, other, resamples, load)
        out += [(cell, r) for r in found_cell]
        if not found_cell:
            unpaired.append(cell)
    if not out:  # cells of both, but no seed of both in any (a traceback on an empty table)
        seeds = {s.name: sorted({str(r.get("seed")) for r in rows if s.holds(r)}) for s in sides}
        raise UserError(f"{', '.join(results)}: no cell has rows of {base} and {other} of one seed (seeds: "
                        + "; ".join(f"{m} {', '.join(found_seeds)}" for m, found_seeds in seeds.items()) + ")")

    def rows_of(cells_: Iterable[tuple], side: str) -> List[Dict[str, Any]]:
        return [row for cell in cells_ for by_seed in shared[cell][side].values() for row in by_seed.values()]

    if out and unpaired:  # a cell of both without a seed of both vanished from the table without a word
        click.echo(unpaired_line(unpaired, shared, out, base, other), err=True)
    if as_json:
        for (dataset_, n_bits_, protocol_, database, k, base_key, other_key), r in out:
            cell = (dataset_, n_bits_, protocol_, database, k, base_key, other_key)
            beyond = {f"{name}_beyond_defaults": beyond_defaults_of(rows_of([cell], side))
                      for name, side in (("base", base), ("other", other))}
            # each side's mean as base_value and other_value too (a script looked it up under the side as given,
            # 'cca-itq@hash.method_params.max_pca=64'), and the figure as the rows name it (field)
            click.echo(json.dumps({"dataset": dataset_, "n_bits": n_bits_, "protocol": protocol_,
                                   "database": database, "k": k, "base": base, "other": other,
                                   "base_settings": base_key, "other_settings": other_key, **beyond, **r,
                                   "field": FIELDS[r["figure"]], "base_value": r[base], "other_value": r[other]},
                                  sort_keys=True))
    else:
        click.echo(_format(out, base, other))
        compared = list(dict.fromkeys(cell for cell, _ in out))
        defaults = beyond_defaults_note({side: rows_of(compared, side) for side in (base, other)})
        if defaults:  # a run cut short, compared with a baseline's defaults: said
            click.echo(f"settings beyond each method's defaults: {defaults}")
    if plot:
        from ucmfh.app.forest_plot import draw_forest, forest_panels

        several, ks = several_settings(out), several_ks(out)
        forest = forest_panels([(cell_parts(cell, several, ks), {**r, "k": cell[4]}) for cell, r in out])
        draw_forest(forest, plot, f"{other} − {base}: paired difference, 95% interval over {over_what(out)}")
        click.echo(f"wrote {plot}", err=as_json)  # as every command's figure; under --json stdout is JSON alone
