"""``ucmfh grid``: datasets × methods × losses × code lengths × seeds, resumable, one table.

Each cell is one hashing run (:func:`ucmfh.app.experiment.train_hash_stage`),
so cells share a fusion encoder exactly when its identity is the same. A cell
whose rows (same run identity, same k, every protocol asked) are already in
the results file is skipped: an interrupted grid resumes where it stopped, and
a cell whose settings changed runs again. The table (mean ± sample std over
seeds; the MAP of random codes as the floor; each variant — a method with a
loss — against the first, paired by seed, code length and direction) is
written as Markdown and CSV.
"""
from __future__ import annotations

import csv
import html
import io
import json
import os
import re
import statistics
import time
from itertools import product
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import click

from ucmfh.app.errors import interrupted, say, user_errors, warn
from ucmfh.app.environment import resolve_dataset
from ucmfh.app.experiment import say_relevance, train_hash_stage
from ucmfh.app.identity import Run, RunOptions, dataset_identity, key_of
from ucmfh.app.jobs import SideBySide, jobs_option
from ucmfh.app.stage import RunInProgress
from ucmfh.app.table import append_cell_rows
from ucmfh.app.options import (
    DEFAULT_RESULTS, FLAGS, CodeLength, Count, candidates_problem, check_precision, closed_form_notes,
    complete_datasets, complete_files, data_dir_option, default_method_note, device_option, flag_of, given_twice,
    parse_params, resolved, scoring_options, seed_type, settings_of, train_options,
)
from ucmfh.app.outputs import check_outputs
from ucmfh.app.runs import (
    COLLAPSE_MARK, COLLAPSE_NOTE, DIRECTIONS, REAL, RECALL_AT_K, THREADS_NOTE, UNCHECKED_NOTE, beyond_defaults_note,
    dataset_labels, headline, sample_std, scores_line, summarize, variant_of,
)
from ucmfh.config import CODE_LENGTHS, EXPECTED
from ucmfh.data.h5 import load_dataset
from ucmfh.files import MARKS, read_jsonl, write_text_atomic
from ucmfh.losses import LOSSES
from ucmfh.metrics.arguments import DEFAULT_K
from ucmfh.methods import DEFAULT_METHOD, METHODS, build_method
from ucmfh.methods.settings import (
    default_loss, fusion_takes_the_loss, scored_protocols, stage_configs, unused_settings,
)
from ucmfh.utils import did_you_mean

def _list(kind: Any, empty: bool = False) -> Any:
    """A click callback: a comma-separated list of ``kind`` (a type, or a click type that checks each value);
    an empty one is refused unless ``empty``."""
    def parse(ctx: click.Context, param: click.Parameter, text: str) -> List[Any]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items and not empty:
            raise click.BadParameter(f"expected a comma-separated list, got {text!r}: give at least one")
        if items and len(items) != len(text.split(",")):  # '1,,2' or 'two-tower,': a value left out, or a typo
            raise click.BadParameter(f"an empty item in {text!r}")
        if isinstance(kind, click.IntRange) and not all(x.lstrip("+-").isdigit() for x in items):
            # click's own word: "'x' is not a valid integer range"
            raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}")
        if isinstance(kind, click.ParamType):
            values = [kind.convert(x, param, ctx) for x in items]
        else:
            try:
                values = [kind(x) for x in items]
            except ValueError:
                raise click.BadParameter(f"expected a comma-separated list, got {text!r}") from None
        again = given_twice(values)
        if again is not None:  # the cell would be asked for twice
            raise click.BadParameter(f"{again} is given twice in {text!r}")
        return values

    return parse


def loss_params_by_name(items: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``NAME:key=value,key=value`` -> {NAME: {key: value}}."""
    out: Dict[str, Dict[str, Any]] = {}
    for item in items:
        name, colon, rest = item.partition(":")
        if not colon and "=" in name:  # 'temperature=0.5' was 'unknown loss 'temperature=0.5''
            raise click.BadParameter(f"expected NAME:KEY=VALUE,..., the loss first, got {item!r} (e.g. "
                                     f"infonce:{item})", param_hint="--loss-params")
        if name not in LOSSES:
            raise click.BadParameter(f"unknown loss {name!r}{did_you_mean(name, LOSSES)}; losses: {', '.join(LOSSES)}",
                                     param_hint="--loss-params")
        pairs = tuple(pair for pair in rest.split(",") if pair.strip())
        if not colon or not pairs:  # 'infonce' or 'infonce:': parameters of nothing
            raise click.BadParameter(f"expected NAME:KEY=VALUE,..., got {item!r}", param_hint="--loss-params")
        out.setdefault(name, {}).update(parse_params(pairs, "--loss-params"))
    return out


# seconds between looks at a cell another process trains, once the grid's other cells are done
BUSY_POLL_S = 5.0


def rows_in(results: str, run_key: str, method: str, protocols: Sequence[str], k: int) -> List[Dict[str, Any]]:
    """The rows of the run ``run_key`` (of ``method``) in the results file, where every protocol asked was
    scored; [] where they are not all there."""
    recorded = by_run(read_jsonl(results, on_skip=warn, containing=[json.dumps(run_key)]))
    return finished(recorded, run_key, scored_protocols(method, protocols), k)


def _once_the_other_process_is_done(name: str, data: Any, fcfg: Any, hcfg: Any, run_key: str, opts: RunOptions,
                                    protocols: Sequence[str], k: int, results: str) -> List[Dict[str, Any]]:
    """The rows of a cell another process was training when the grid came to it (a second grid on the same runs
    folder died there, its other cells not run): its rows in the results file once that process has written them,
    else the cell trained here once the run is free (its checkpoint reused where the other process saved it)."""
    said = False
    while True:
        done = rows_in(results, run_key, hcfg.method, protocols, k)
        if done:
            click.echo(f"skip {name}: finished by the other process (run {run_key})")
            return done
        try:
            return _run_cell(name, data, fcfg, hcfg, opts, protocols, k, results)
        except RunInProgress as err:
            if not said:
                click.echo(f"wait {name}: {err.fact}; looking again every {BUSY_POLL_S:g} s (Ctrl-C stops the grid)",
                           err=True)
                said = True
            try:
                time.sleep(BUSY_POLL_S)
            except KeyboardInterrupt as stop:
                interrupted(stop, always_resumes=True)


def _run_cell(name: str, data: Any, fcfg: Any, hcfg: Any, opts: RunOptions, protocols: Sequence[str], k: int,
              results: str) -> List[Dict[str, Any]]:
    """One cell trained here (or its saved run reused) and scored, its rows appended to the results file and
    returned; :class:`RunInProgress` where another process trains its run."""
    click.echo(f"run  {name}")
    try:
        rows = train_hash_stage(data, fcfg, hcfg, opts, protocols, k, log=say)
    except KeyboardInterrupt as err:  # a grid has no --resume: it resumes what it finds
        interrupted(err, always_resumes=True)
    append_cell_rows(results, rows, click.echo)
    click.echo(f"      {scores_line(rows)}")
    return rows


def by_run(rows: Iterable[Dict[str, Any]], into: Optional[Dict[Any, List[Dict[str, Any]]]] = None,
           ) -> Dict[Any, List[Dict[str, Any]]]:
    """``rows`` by their run (``into``: an index to add them to, in order): a grid looks a cell up once, not
    through every row of a lab's results file."""
    index: Dict[Any, List[Dict[str, Any]]] = {} if into is None else into
    for row in rows:
        run = row.get("run")
        index.setdefault(run if isinstance(run, str) else None, []).append(row)
    return index


def finished(recorded: Dict[Any, List[Dict[str, Any]]], run_key: str, protocols: Sequence[str],
             k: int) -> List[Dict[str, Any]]:
    """A cell's rows (``recorded``: rows :func:`by_run`), one per protocol (and database of a caption set), or []
    when any protocol is missing."""
    mine = {(r["protocol"], r.get("database")): r for r in recorded.get(run_key, ()) if r.get("k") == k}
    if not all(any(protocol == p for protocol, _ in mine) for p in protocols):
        return []
    return [row for p in protocols for (protocol, _), row in mine.items() if protocol == p]


def paired_deltas(rows: List[Dict[str, Any]], base: str, variant: str, dataset: str, protocol: str,
                  database: Optional[str], labels: Dict[Tuple[Any, Any], str]) -> List[float]:
    """``variant`` − ``base`` MAP, paired by (seed, n_bits, direction), or of a caption set (a ``database``) rSum,
    paired by (seed, n_bits): tie-aware where both rows have it. ``dataset``: the file's label among ``rows``, as
    ``labels`` has it (:func:`ucmfh.app.runs.dataset_labels`)."""
    scores = ("rsum",) if database else DIRECTIONS

    def index(name: str) -> Dict[tuple, tuple]:
        return {(r["seed"], r["n_bits"], d): (r.get(d + EXPECTED), r[d]) for r in rows for d in scores
                if (variant_of(r), labels[r["dataset"], r.get("dataset_fingerprint")], r["protocol"],
                    r.get("database")) == (name, dataset, protocol, database)}

    mine, ref = index(variant), index(base)
    return [mine[key][0] - ref[key][0] if None not in (mine[key][0], ref[key][0]) else mine[key][1] - ref[key][1]
            for key in mine if key in ref]


def markdown(rows: List[Dict[str, Any]], variants: Sequence[str], bits: Sequence[int]) -> str:
    """One table per dataset and protocol (method × code length), then each method against the first.

    ``variants``: the methods (:func:`variant_of`) in the order of the table.
    """
    summary = summarize(rows)
    labels = dataset_labels(rows)  # two files of one name apart ('syn [058e9011]'): keyed by the name, one was lost
    cell = {(labels[s["dataset"], s["dataset_fingerprint"]], s["protocol"], s["database"], variant_of(s),
             s["n_bits"]): s for s in summary}
    datasets = list(dict.fromkeys(labels[r["dataset"], r.get("dataset_fingerprint")] for r in rows))
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    databases = list(dict.fromkeys(r.get("database") for r in rows))  # [None] unless a caption set
    k = rows[0]["k"] if rows else DEFAULT_K
    defaults = beyond_defaults_note({variant: [r for r in rows if variant_of(r) == variant] for variant in variants})
    md: List[str] = [f"Settings beyond each method's defaults, which the figures below are of: {defaults}.", ""] \
        if defaults else []
    for dataset, protocol, database in product(datasets, protocols, databases):
        if not any((labels[s["dataset"], s["dataset_fingerprint"]], s["protocol"], s["database"]) ==
                   (dataset, protocol, database) for s in summary):
            continue
        # a caption set leads with the field's figure, R@1 (rSum), as 'ucmfh runs' and the figures do; MAP by id
        # follows it
        lead = f"R@1 I→T / T→I in % (rSum), database `{database}`" if database else f"MAP@{k} I→T / T→I"
        md += [f"### {_md(dataset)}, protocol `{protocol}`: {lead} (mean ± std over seeds; tie-aware: the mean over "
               "every order of tied items)", ""]
        where = (dataset, protocol, database)
        md += _main_table(cell, variants, bits, where, recall=bool(database))
        md.append("")
        if any(s["collapsed_seeds"] for key, s in cell.items() if key[:3] == where):
            md += [COLLAPSE_NOTE + ".", ""]
        if any(s["unchecked_seeds"] for key, s in cell.items() if key[:3] == where):
            md += [UNCHECKED_NOTE + ".", ""]
        if any(s.get("mixed_threads") for key, s in cell.items() if key[:3] == where):
            md += [THREADS_NOTE + ".", ""]
        md += _fusion_seconds(cell, variants, bits, where)
        if database:  # a caption set: MAP too, each caption's relevant items those of its image's id
            md += _means_table(cell, variants, bits, where, "", f"MAP@{k} by id I→T / T→I, database `{database}`, "
                               "tie-aware, mean ± std over seeds:", False, spread=True, random=True)
        md += _means_table(cell, variants, bits, where, "", f"Ties broken by database index (the field's code), "
                           f"{lead}, mean over seeds:", bool(database), index_order=True)
        md += _means_table(cell, variants, bits, where, REAL, "Real-valued head outputs ranked by cosine (before the "
                           f"sign), {lead}, mean over seeds:", bool(database))
    if len(variants) > 1:
        md += [f"### Each method against `{variants[0]}`: Δ MAP@{k} paired by (seed, code length, direction); of a "
               "caption set, Δ rSum in % paired by (seed, code length); mean ± std over the pairs (tie-aware where "
               "both rows are); wins = pairs where the method is higher", "",
               "| dataset | protocol | database | method | Δ | wins |", "|---|---|---|---|---|---|"]
        for dataset, protocol, database, variant in product(datasets, protocols, databases, variants[1:]):
            deltas = paired_deltas(rows, variants[0], variant, dataset, protocol, database, labels)
            if deltas:
                digits = 1 if database else 3  # rSum in %, MAP
                spread = f" ± {sample_std(deltas):.{digits}f}" if len(deltas) > 1 else ""  # one pair: no spread
                wins = f"{sum(d > 0 for d in deltas)}/{len(deltas)}"
                md.append(f"| {_md(dataset)} | {protocol} | {database or '-'} | `{variant}` | "
                          f"{statistics.fmean(deltas):+.{digits}f}{spread} | {wins} |")
        md.append("")
    return "\n".join(md)


def _main_table(cell: Dict[tuple, Dict[str, Any]], variants: Sequence[str], bits: Sequence[int], where: tuple,
                recall: bool) -> List[str]:
    """The table a dataset and protocol lead with, method × code length, then the random codes: MAP I→T / T→I, or
    with ``recall`` (a caption set) R@1 I→T / T→I in % (rSum); each mean ± std over seeds where there are
    several, tie-aware where the rows are, a collapse marked; the seeds and the hashing seconds of each method.
    The random codes' row has the figures the rows keep of them (a caption set's rows of before 2026-12-03: the
    rSum alone)."""
    fields, digits = (("r1_i2t", "r1_t2i", "rsum"), 1) if recall else (DIRECTIONS, 3)
    lines = ["| method | " + " | ".join(f"{n} bits" for n in bits) + " | seeds | hashing s |",
             "|---|" + "---|" * (len(bits) + 2)]
    for variant in [*variants, "random codes"]:
        random = variant not in variants
        line, seeds, times = [variant if random else f"`{variant}`"], set(), []
        for n in bits:
            s = cell.get((*where, variants[0] if random else variant, n))
            names = [f"random_{f}" if random else headline(s, f) for f in fields] if s else []
            if not any(f"{name}_mean" in s for name in names):
                line.append("–")
                continue
            spread = len(s["seeds"]) > 1  # one seed has no spread to show (not ± 0.000)
            values = [f"{s[f'{name}_mean']:.{digits}f}" + (f" ± {s[f'{name}_std']:.{digits}f}" if spread else "")
                      if f"{name}_mean" in s else "–" for name in names]
            text = f"{values[0]} / {values[1]} ({values[2]})" if recall else " / ".join(values)
            line.append(text + COLLAPSE_MARK * bool(not random and s["collapsed_seeds"]))
            seeds |= set(s["seeds"])
            if s["train_time_s_mean"]:
                times.append(s["train_time_s_mean"])
        line += [str(len(seeds)), f"{statistics.fmean(times):.1f}" if times and not random else "–"]
        lines.append("| " + " | ".join(line) + " |")
    return lines


def _fusion_seconds(cell: Dict[tuple, Dict[str, Any]], variants: Sequence[str], bits: Sequence[int],
                    where: tuple) -> List[str]:
    """A line under the scores' table for the methods that stand on a fusion stage: its training seconds (mean
    over the cells' seeds), which the table's hashing seconds leave out; one stage serves all the code lengths of a
    seed, so it is said once, not added to each cell. Nothing where no row says them (rows of before 2026-11-30)."""
    said = []
    for variant in variants:
        times = [s["fusion_train_time_s_mean"] for n in bits if (s := cell.get((*where, variant, n)))
                 and s.get("fusion_train_time_s_mean")]
        if times:
            said.append(f"`{variant}` {statistics.fmean(times):.1f} s")
    if not said:
        return []
    return [f"Hashing s leaves out the fusion stage a method stands on, trained once for all its code lengths: "
            f"{', '.join(said)} more (mean over seeds).", ""]


def _means_table(cell: Dict[tuple, Dict[str, Any]], variants: Sequence[str], bits: Sequence[int],
                where: tuple, prefix: str, title: str, recall: bool, index_order: bool = False,
                spread: bool = False, random: bool = False) -> List[str]:
    """A table of means over seeds, method × code length: R@1 I→T / T→I (rSum) with ``recall``, else
    MAP; with ``spread``, each mean's std over seeds beside it where there are several. Tie-aware where
    the rows have it, or with ``index_order`` the figures with ties by index (only for groups that have
    both). ``prefix`` ``real_``: the real-valued head outputs (rows' ``real_valued``), what the codes lose
    to their sign; with ``random``, the random codes' MAP under the methods. Nothing when no group has the
    figures."""
    fields = ("r1_i2t", "r1_t2i", "rsum") if recall else DIRECTIONS

    def figure(s: Optional[Dict[str, Any]]) -> Optional[str]:
        if s is None or f"{prefix}{fields[0]}_mean" not in s:
            return None
        if index_order and headline(s, fields[0]) == fields[0]:
            return None
        names = [prefix + (f if index_order else headline(s, prefix + f)[len(prefix):]) for f in fields]
        digits = 1 if recall else 3
        values = [f"{s[f'{name}_mean']:.{digits}f}" + (f" ± {s[f'{name}_std']:.{digits}f}"
                                                       if spread and len(s["seeds"]) > 1 else "") for name in names]
        return f"{values[0]} / {values[1]} ({values[2]})" if recall else " / ".join(values)

    lines = []
    for variant in variants:
        figures = [figure(cell.get((*where, variant, n))) for n in bits]
        if any(figures):
            lines.append("| " + " | ".join([f"`{variant}`", *(f or "–" for f in figures)]) + " |")
    if not lines:
        return []
    if random:  # a caption set's MAP by id: the random codes' too, as the table of a labelled set has them
        groups = [cell.get((*where, variants[0], n)) for n in bits]
        lines.append("| random codes | " + " | ".join(
            " / ".join(f"{s[f'random_{d}_mean']:.3f}" for d in DIRECTIONS)
            if s and "random_map_i2t_mean" in s else "–" for s in groups) + " |")
    return [title, "", "| method | " + " | ".join(f"{n} bits" for n in bits) + " |", "|---|" + "---|" * len(bits),
            *lines, ""]


def _md(name: str) -> str:
    """A name of the user's (a dataset file's) as Markdown text: a '|' split a table's cells, '<img …>' was markup,
    '*z*' or '_z_' italics, '~~z~~' struck, '`c`' code, '[a](b)' a link and '$x$' mathematics; each as it is
    written (a backslash before it; a bracket alone, as in a dataset's label 'syn [24f11305]', makes no link and
    is left as it is)."""
    return re.sub(r"([\\`*_~$|])", r"\\\1", html.escape(name, quote=False)).replace("](", "]\\(")


def _cell_text(value: Any) -> Any:
    """A CSV cell as a spreadsheet reads it: text beginning with '=', '+', '-' or '@' (a dataset named
    '=cmd|calc') is a formula there, so it is kept as text by a leading apostrophe; numbers as they are."""
    return "'" + value if isinstance(value, str) and value.startswith(("=", "+", "-", "@", "\t", "\r")) else value


def write_tables(rows: List[Dict[str, Any]], variants: Sequence[str], bits: Sequence[int], prefix: str) -> Tuple[str, str]:
    """``PREFIX.md`` (the tables above) and ``PREFIX.csv`` (one line per group of :func:`summarize`)."""
    # every grid's columns, whatever its datasets: a caption set's R@K (in %) and rSum beside a labelled set's MAP,
    # each blank where a group has none (they were left out: a caption set's file held no figure but MAP); the
    # seeds whose codes collapsed (the tables' mark) and those an older ucmfh scored without counting them
    scores = (*DIRECTIONS, "rsum", *RECALL_AT_K)
    columns = ["dataset", "method", "loss", "n_bits", "protocol", "database", "k", "n_seeds", "collapsed_seeds",
               "unchecked_seeds",
               *(f"{p}{d}{t}_{s}" for p in ("", "random_", REAL) for d in scores for t in ("", EXPECTED)
                 for s in ("mean", "std") if not (p == "random_" and t)),
               "train_time_s_mean", "fusion_train_time_s_mean", "settings_key",
               "dataset_fingerprint"]  # two files of one name apart (the header's start is the file's mark)
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore")
    writer.writeheader()
    # one seed has no spread: a blank, not a 0.0 that reads as one measured
    writer.writerows({name: None if name.endswith("_std") and entry["n_seeds"] < 2 else _cell_text(value)
                      for name, value in entry.items()} for entry in summarize(rows))
    return (write_text_atomic(prefix + ".md", MARKS["table"].decode() + "\n" + markdown(rows, variants, bits) + "\n"),
            write_text_atomic(prefix + ".csv", text.getvalue()))


def grid_cells(datasets: Sequence[str], methods: Sequence[str], losses: Sequence[str],
               params: Dict[str, Dict[str, Any]], bits: Sequence[int], seeds: Sequence[int], settings: Dict[str, Any],
               candidates_side_by_side: bool) -> List[Tuple[str, Any, Any]]:
    """The grid's cells, ``(dataset, fusion config or None, hash config)`` in the order they run, every one's
    settings checked before anything trains: unknown methods and losses, a setting no method uses, loss
    parameters no cell applies and candidates no cell trains are refused, naming the flag; a setting some
    methods have no use for is said in a note."""
    unknown = [name for name in methods if name not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown methods {unknown}{did_you_mean(unknown[0], METHODS)}; methods: "
                                 f"{', '.join(METHODS)}", param_hint="--methods")
    unknown = [name for name in losses if name not in LOSSES]
    if unknown:
        raise click.BadParameter(f"unknown losses {unknown}{did_you_mean(unknown[0], LOSSES)}; losses: "
                                 f"{', '.join(LOSSES)}", param_hint="--losses")
    # one set of settings serves every method: one a method has no use for applies to the others only
    flags = {**FLAGS, "loss": "--losses", "loss_params": "--loss-params", "seed": "--seeds"}
    # a method with a loss of its own: one cell per seed, whatever --losses lists (said; refused where every method
    # has one: the cells were run without a word)
    own_loss = [m for m in methods if not default_loss(m)]
    if losses and own_loss:
        named, its = ", ".join(f"method {m!r}" for m in own_loss), "its" if len(own_loss) == 1 else "their"
        if len(own_loss) == len(methods):
            raise click.BadParameter(f"no method of the grid takes a loss: {named}: a loss of {its} own",
                                     param_hint="--losses")
        click.echo(f"{named}: --losses not applied (a loss of {its} own); the other methods apply it", err=True)
    variants_asked = [(m, loss) for m in methods for loss in (losses or [None] if default_loss(m) else [None])]
    # what each method, with each loss of the grid, has no use for (--supervised: only a loss that uses labels)
    unused = {(m, loss): resolved(unused_settings, m, {**settings, "loss": loss}, flags=flags)
              for m, loss in variants_asked}
    first = next(iter(unused.values()))
    for setting in (s for s in first if all(s in u for u in unused.values())):  # no method uses it
        reasons = ", ".join(dict.fromkeys(f"{m!r} {u[setting]}" for (m, _), u in unused.items()))
        raise click.BadParameter(f"no method of the grid has a use for it: {reasons}"
                                 + default_method_note(setting, "methods"), param_hint=flag_of(setting, flags))
    notes = [f"method {m!r}{f' with loss {loss!r}' if loss else ''}: "
             + "; ".join(f"{', '.join(flag_of(s, flags) for s in u if u[s] == why)} not applied (it {why})"
                         for why in dict.fromkeys(u.values()))
             + "; the other methods apply them" for (m, loss), u in unused.items() if u]
    for note in notes + closed_form_notes(methods):  # diagnostics: on stderr, beside the warnings
        click.echo(note, err=True)
    # every cell's settings are checked before anything trains
    cells = []
    for dataset, (method, loss), seed in product(datasets, variants_asked, seeds):
        cell = {**settings, "loss": loss, "seed": seed}
        fcfg, hcfgs = resolved(stage_configs, method, dataset=dataset, n_bits=bits, drop_unused=True, flags=flags,
                               **cell)
        # --loss-params NAME:...: the parameters of loss NAME, wherever a stage trains with it
        named: Dict[str, Any] = {}
        if default_loss(method) is not None and hcfgs[0].loss in params:
            named["loss_params"] = params[hcfgs[0].loss]
        if fcfg is not None and fcfg.loss in params and not fusion_takes_the_loss(method):  # shared: given above
            overrides = cell.get("overrides") or {}
            named["overrides"] = {**overrides, "fusion": {**overrides.get("fusion", {}),
                                                          "loss_params": params[fcfg.loss]}}
        if named:
            fcfg, hcfgs = resolved(stage_configs, method, dataset=dataset, n_bits=bits, drop_unused=True,
                                   flags=flags, **{**cell, **named})
        check_precision(fcfg, *hcfgs)
        cells += [(dataset, fcfg, hcfg) for hcfg in hcfgs]
    trained = {c.loss for _, fcfg, hcfg in cells for c in (fcfg, hcfg)  # a closed-form method trains no loss
               if c is not None and (c is fcfg or default_loss(hcfg.method) is not None)}
    unused_losses = [name for name in params if name not in trained]
    if unused_losses:  # never checked against the loss's parameters, never applied
        theirs = f"the grid's: {', '.join(sorted(trained))}" if trained else \
            "its methods have losses of their own, or are fitted in closed form"
        raise click.BadParameter(f"{unused_losses[0]}: no cell of the grid trains with this loss ({theirs})",
                                 param_hint="--loss-params")
    if candidates_side_by_side:  # refused where no cell trains candidates, noted for the methods that train none
        problems = {hcfg.method: candidates_problem(hcfg) for _, _, hcfg in cells}
        if all(problems.values()):
            raise click.BadParameter(f"no cell of the grid trains candidates to choose between: "
                                     f"{'; '.join(dict.fromkeys(problems.values()))}",
                                     param_hint="--candidates-side-by-side")
        for method, problem in problems.items():
            if problem:
                click.echo(f"note: --candidates-side-by-side not applied: {problem}", err=True)  # as the others
    return cells


@click.command("grid")
@click.option("--dataset", "-d", "datasets", multiple=True, required=True, shell_complete=complete_datasets,
              help="Dataset name or .h5 path (repeatable).")
@data_dir_option()
@click.option("--methods", default=DEFAULT_METHOD, show_default=True, callback=_list(str),
              help=f"Comma-separated methods ({', '.join(METHODS)}). The other options serve every method: one a "
                   "method has no use for (those of epochs for a method fitted in closed form, those of a fusion "
                   "stage for a method that trains none) applies to the other methods only, said in one line; one "
                   "that no method uses is refused.")
@click.option("--losses", default="", callback=_list(str, empty=True),
              help="Comma-separated losses, each run with every method [default: each method's own].")
@click.option("--loss-params", "per_loss", multiple=True, metavar="NAME:KEY=VALUE,...",
              help="Hyper-parameters of one loss, e.g. infonce:temperature=0.5 (repeatable).")
@click.option("--n-bits", "-b", multiple=True, type=CodeLength(*CODE_LENGTHS), default=(16, 32, 64, 128),
              show_default=True,
              help="Code length (repeatable).")
@click.option("--seeds", default="2023", show_default=True, callback=_list(seed_type), help="Comma-separated seeds.")
@click.option("--fusion-epochs", type=Count(min=1), default=None,
              help="Methods with a fusion stage (ucmfh, distill): its epochs [default: --epochs if given, else "
                   "the reference's for known datasets, else 100].")
@scoring_options
@click.option("--results", default=DEFAULT_RESULTS, show_default=True, shell_complete=complete_files,
              help="JSON-lines file of result rows (read to skip finished cells; 'ucmfh runs' reads it too).")
@click.option("--table", default=None, shell_complete=complete_files,
              help="Table path: PATH.md and PATH.csv (a .md or .csv given is dropped); a grid table there is written anew "
                   "[default: --results's path without its extension, runs/results].")
@click.option("--plot", metavar="PREFIX", shell_complete=complete_files,
              help="Also draw each dataset's scores against code length, one line per method, from the grid's rows: "
                   "PREFIX_<dataset>_<score>.png and .svg (needs matplotlib; named as 'ucmfh runs --plot' names them).")
@click.option("--overwrite", is_flag=True,
              help="Replace --table or --plot files that are not a grid table or figure ucmfh wrote.")
@device_option()
@click.option("--quiet", is_flag=True, help="No progress bars.")
@jobs_option
@train_options("grid", without=("loss", "loss_params", "seed", "resume"))  # --losses, --loss-params, --seeds; always resumes
@user_errors
def grid(datasets, data_dir, methods, losses, per_loss, n_bits, seeds, fusion_epochs, protocol, k, results, table,
         plot, overwrite, device, quiet, jobs, workers, **train) -> None:
    """Train and score datasets × methods × losses × code lengths × seeds; skip finished cells; write one table."""
    from ucmfh.app.environment import protocols_of

    if not results:  # its rows are how a grid resumes: '' (no file, as train-hash takes it) failed after a cell
        raise click.BadParameter("a grid keeps its rows, the cells it skips when run again: give a file",
                                 param_hint="--results")
    if workers == "threads" and jobs == 1:
        raise click.BadParameter("threads run the cells of --jobs N at once; with --jobs 1 they run one after "
                                 "another in this process: give --jobs N", param_hint="--workers")
    protocols = protocols_of(protocol)
    opts = RunOptions(out=train["out"], resume=True, save_interval=train["save_interval"], progress=not quiet,
                      tensorboard=train["tensorboard"], cuda_graph=train["cuda_graph"],
                      candidates_side_by_side=train["candidates_side_by_side"], always_resumes=True)
    bits = list(dict.fromkeys(n_bits))
    settings = settings_of({**train, "fusion_epochs": fusion_epochs, "protocol": protocol, "device": device})
    cells = grid_cells(datasets, methods, losses, loss_params_by_name(per_loss), bits, seeds, settings,
                       train["candidates_side_by_side"])
    if table is None:  # beside the rows it is made of, named after them (runs/grid whatever --results said, once)
        table = os.path.splitext(results)[0]
    stem, extension = os.path.splitext(table)
    if extension.lower() in (".md", ".csv") and os.path.basename(stem):  # the path given with an extension of its own
        table = stem
    check_outputs({"--results": results, "--table": table}, {"--out": train["out"], "--tensorboard": train["tensorboard"]},
                  overwrite=overwrite)
    if plot is not None:  # matplotlib there, and no file of the user's where a figure may go, before any cell
        from ucmfh.app.length_plot import check_prefix
        from ucmfh.metrics.plots import figure_prefix, require_matplotlib

        plot = figure_prefix(plot)
        require_matplotlib()
        check_prefix(plot, overwrite)
    paths = {dataset: resolve_dataset(dataset, data_dir) for dataset in datasets}
    variants = list(dict.fromkeys(variant_of({"method": h.method, "loss": h.loss}) for _, _, h in cells))
    grid_rows: List[List[Dict[str, Any]]] = []  # each cell's rows, in the grid's order
    older = os.path.join(os.path.dirname(DEFAULT_RESULTS), "grid.jsonl")
    if results == DEFAULT_RESULTS and os.path.isfile(older):  # grid's own default until 2026-11-27
        warn(f"{older}: rows of grids run before 2026-11-27, its default results file then, are not read: a cell "
             f"whose row is there alone runs again into {results}; give --results {older} to go on with those rows")
    # a cell's identity is its dataset file's fingerprint, not the dataset: a finished grid reads none (it took
    # 5 s and 0.8 GB on full Flickr8k to print a table, now 2 s and 0.3 GB)
    identities = {dataset: dataset_identity(paths[dataset]) for dataset in datasets}
    runs = [Run(opts.out, identities[dataset], fcfg, hcfg) for dataset, fcfg, hcfg in cells]
    # the rows of earlier runs of the grid's cells, and of the cells run below: the lines that name them alone are
    # read (a lab's file of 100,000 rows held whole took 1.3 GB)
    recorded = by_run(read_jsonl(results, on_skip=warn, containing=[json.dumps(key_of(run.hash_identity))
                                                                    for run in runs]))
    recorded_rows = [finished(recorded, key_of(run.hash_identity), scored_protocols(hcfg.method, protocols), k)
                     for (_, _, hcfg), run in zip(cells, runs)]
    # every dataset with a cell to run read and checked before the first cell: a bad file is said now, not hours in
    loaded = {dataset: load_dataset(paths[dataset], max_memory_bytes=train["max_memory"]) for dataset in datasets
              if any(not rows for (name, _, _), rows in zip(cells, recorded_rows) if name == dataset)}
    for data in loaded.values():  # labels under which some scores say nothing of the codes, said once a file
        say_relevance(data, lambda line: click.echo(line, err=True))
    for (dataset, _, hcfg), rows in zip(cells, recorded_rows):
        if not rows:  # a method that needs the split in memory, refused hours in at its first cell
            build_method(hcfg.method).check_split(loaded[dataset])
    method_of = {key_of(run.hash_identity): hcfg.method for (_, _, hcfg), run in zip(cells, runs)}
    side = SideBySide(jobs, device, results, opts, protocols, k, train["max_memory"], workers,
                      finished_rows=lambda key: rows_in(results, key, method_of[key], protocols, k)) \
        if jobs > 1 else None
    busy: List[Tuple[int, str, Any, Any, Any, str]] = []  # cells another process was training: run last
    for (dataset, fcfg, hcfg), run in zip(cells, runs):
        run_key = key_of(run.hash_identity)
        name = f"{dataset} {variant_of({'method': hcfg.method, 'loss': hcfg.loss})} seed {hcfg.seed} {hcfg.n_bits} bits"
        # asked again: a cell named twice (a seed or dataset twice) is finished once its first has run
        done = finished(recorded, run_key, scored_protocols(hcfg.method, protocols), k)
        if done:
            click.echo(f"skip {name}: finished (run {run_key})")
            grid_rows.append(done)
            continue
        if side is not None:  # run below by a worker, its rows in this place
            grid_rows.append(side.add(name, run, paths[dataset], loaded[dataset], fcfg))
            continue
        try:
            rows = _run_cell(name, loaded[dataset], fcfg, hcfg, opts, protocols, k, results)
        except RunInProgress as err:  # another process trains it (or the fusion stage it builds on): the others first
            click.echo(f"busy {name}: {err.fact}; it is run after the other cells", err=True)
            busy.append((len(grid_rows), name, loaded[dataset], fcfg, hcfg, run_key))
            grid_rows.append([])
            continue
        by_run(rows, into=recorded)
        grid_rows.append(rows)
    for place, name, data, fcfg, hcfg, run_key in busy:
        grid_rows[place] = _once_the_other_process_is_done(name, data, fcfg, hcfg, run_key, opts, protocols, k,
                                                           results)
    if side is not None:
        side.run()
    every_row = [row for rows in grid_rows for row in rows]
    for path in write_tables(every_row, variants, bits, table):
        click.echo(f"wrote {path}")
    if plot is not None:
        from ucmfh.app.length_plot import check_figure_paths, draw_length_figures, length_figures

        figures = length_figures(summarize(every_row))
        check_figure_paths(plot, figures, overwrite)
        for path in draw_length_figures(figures, plot):
            click.echo(f"wrote {path}")
