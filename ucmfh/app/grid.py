"""``ucmfh grid``: datasets × losses × code lengths × seeds, resumable, one table.

Each cell is one hashing run (:func:`ucmfh.app.experiment.train_hash_stage`),
so cells share a fusion encoder exactly when its identity is the same. A cell
whose rows (same run identity, same k, every protocol asked) are already in
the results file is skipped: an interrupted grid resumes where it stopped, and
a cell whose settings changed runs again. The table (mean ± sample std over
seeds; the MAP of random codes as the floor; each loss against the first,
paired by seed, code length and direction) is written as Markdown and CSV.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import statistics
from itertools import product
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from ucmfh.app.errors import user_errors
from ucmfh.app.experiment import (
    Run, RunOptions, append_results, dataset_identity, default_epochs, key_of, resolve_dataset, train_hash_stage,
)
from ucmfh.app.options import check_device, fusion_config, hash_configs, parse_params, train_options
from ucmfh.app.runs import DIRECTIONS, summarize
from ucmfh.config import PROTOCOLS
from ucmfh.data.h5 import load_dataset
from ucmfh.files import read_jsonl, write_text_atomic
from ucmfh.losses import LOSSES

ARROWS = {"map_i2t": "I→T", "map_t2i": "T→I"}


def _list(kind: type) -> Any:
    def parse(ctx: click.Context, param: click.Parameter, text: str) -> List[Any]:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {text!r}") from None

    return parse


def loss_params_by_name(items: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``NAME:key=value,key=value`` -> {NAME: {key: value}}."""
    out: Dict[str, Dict[str, Any]] = {}
    for item in items:
        name, _, rest = item.partition(":")
        if name not in LOSSES:
            raise click.BadParameter(f"unknown loss {name!r} (losses: {', '.join(LOSSES)})", param_hint="--loss-params")
        out.setdefault(name, {}).update(parse_params(tuple(filter(None, rest.split(","))), "--loss-params"))
    return out


def finished(rows: List[Dict[str, Any]], run_key: str, protocols: Sequence[str], k: int) -> List[Dict[str, Any]]:
    """A cell's rows, one per protocol, or [] when any protocol is missing."""
    mine = {r["protocol"]: r for r in rows if r.get("run") == run_key and r.get("k") == k}
    return [mine[p] for p in protocols] if all(p in mine for p in protocols) else []


def paired_deltas(rows: List[Dict[str, Any]], base: str, loss: str, dataset: str, protocol: str,
                  database: Optional[str] = None) -> List[float]:
    """``loss`` − ``base`` MAP, paired by (seed, n_bits, direction)."""
    def index(name: str) -> Dict[tuple, float]:
        return {(r["seed"], r["n_bits"], d): r[d] for r in rows for d in DIRECTIONS
                if (r["loss"], r["dataset"], r["protocol"], r.get("database")) == (name, dataset, protocol, database)}

    mine, ref = index(loss), index(base)
    return [mine[key] - ref[key] for key in mine if key in ref]


def markdown(rows: List[Dict[str, Any]], losses: Sequence[str], bits: Sequence[int]) -> str:
    """One table per dataset and protocol (loss × code length), then each loss against the first."""
    summary = summarize(rows)
    cell = {(s["dataset"], s["protocol"], s["database"], s["loss"], s["n_bits"]): s for s in summary}
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    databases = list(dict.fromkeys(r.get("database") for r in rows))  # [None] unless a caption set
    k = rows[0]["k"] if rows else 50
    md: List[str] = []
    for dataset, protocol, database in product(datasets, protocols, databases):
        if not any((s["dataset"], s["protocol"], s["database"]) == (dataset, protocol, database) for s in summary):
            continue
        where = f", database `{database}`, MAP by id" if database else ""
        md += [f"### {dataset}, protocol `{protocol}`{where}: MAP@{k} I→T / T→I (mean ± std over seeds)", "",
               "| loss | " + " | ".join(f"{n} bits" for n in bits) + " | seeds | hashing s |",
               "|---|" + "---|" * (len(bits) + 2)]
        for loss in [*losses, "random codes"]:
            line, seeds, times = [f"`{loss}`" if loss in losses else loss], set(), []
            for n in bits:
                s = cell.get((dataset, protocol, database, losses[0] if loss == "random codes" else loss, n))
                prefix = "random_" if loss == "random codes" else ""
                if s is None or f"{prefix}map_i2t_mean" not in s:
                    line.append("–")
                    continue
                line.append(" / ".join(f"{s[f'{prefix}{d}_mean']:.3f} ± {s[f'{prefix}{d}_std']:.3f}"
                                       for d in DIRECTIONS))
                seeds |= set(s["seeds"])
                if s["train_time_s_mean"]:
                    times.append(s["train_time_s_mean"])
            line += [str(len(seeds)), f"{statistics.fmean(times):.1f}" if times and loss in losses else "–"]
            md.append("| " + " | ".join(line) + " |")
        md.append("")
    if len(losses) > 1:
        md += [f"### Each loss against `{losses[0]}`: Δ MAP@{k} paired by (seed, code length, direction), "
               "mean ± std over the pairs; wins = pairs where the loss is higher", "",
               "| dataset | protocol | database | loss | Δ | wins |", "|---|---|---|---|---|---|"]
        for dataset, protocol, database, loss in product(datasets, protocols, databases, losses[1:]):
            deltas = paired_deltas(rows, losses[0], loss, dataset, protocol, database)
            if deltas:
                std = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
                md.append(f"| {dataset} | {protocol} | {database or '-'} | `{loss}` | {statistics.fmean(deltas):+.3f} "
                          f"± {std:.3f} | {sum(d > 0 for d in deltas)}/{len(deltas)} |")
        md.append("")
    return "\n".join(md)


def write_tables(rows: List[Dict[str, Any]], losses: Sequence[str], bits: Sequence[int], prefix: str) -> Tuple[str, str]:
    """``PREFIX.md`` (the tables above) and ``PREFIX.csv`` (one line per group of :func:`summarize`)."""
    columns = ["dataset", "method", "loss", "n_bits", "protocol", "database", "k", "n_seeds",
               *(f"{p}{d}_{s}" for p in ("", "random_") for d in DIRECTIONS for s in ("mean", "std")),
               "train_time_s_mean", "settings_key"]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(summarize(rows))
    return (write_text_atomic(prefix + ".md", markdown(rows, losses, bits) + "\n"),
            write_text_atomic(prefix + ".csv", text.getvalue()))


@click.command("grid")
@click.option("--dataset", "-d", "datasets", multiple=True, required=True,
              help="Dataset name or .h5 path (repeatable).")
@click.option("--data-dir", default=None, help="Folder of NAME.h5 files [default: $UCMFH_DATA_DIR or data].")
@click.option("--losses", default="original", show_default=True, callback=_list(str), help="Comma-separated losses.")
@click.option("--loss-params", "per_loss", multiple=True, metavar="NAME:KEY=VALUE,...",
              help="Hyper-parameters of one loss, e.g. infonce:temperature=0.5 (repeatable).")
@click.option("--n-bits", "-b", multiple=True, type=int, default=(16, 32, 64, 128), show_default=True,
              help="Code length (repeatable).")
@click.option("--seeds", default="2023", show_default=True, callback=_list(int), help="Comma-separated seeds.")
@click.option("--fusion-epochs", type=click.IntRange(min=1), default=None,
              help="Epochs of the fusion stage [default: as --epochs].")
@click.option("--protocol", type=click.Choice(["both", *PROTOCOLS]), default="both", show_default=True)
@click.option("--k", default=50, show_default=True, type=click.IntRange(min=1), help="MAP@k cut-off.")
@click.option("--results", default="runs/grid.jsonl", show_default=True,
              help="JSON-lines file of result rows (read to skip finished cells).")
@click.option("--table", default="runs/grid", show_default=True, help="Table path without extension (.md, .csv).")
@click.option("--device", default="auto", show_default=True, callback=check_device)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@train_options
@user_errors
def grid(datasets, data_dir, losses, per_loss, n_bits, seeds, fusion_epochs, protocol, k, results, table, device,
         quiet, **train) -> None:
    """Train and score datasets × losses × code lengths × seeds; skip finished cells; write one table."""
    from ucmfh.app.experiment import default_data_dir, protocols_of

    unknown = [name for name in losses if name not in LOSSES]
    if unknown:
        raise click.BadParameter(f"unknown losses {unknown} (losses: {', '.join(LOSSES)})", param_hint="--losses")
    if train["loss"] != "original" or train["loss_params"]:
        raise click.UsageError("the grid takes its losses from --losses and --loss-params NAME:KEY=VALUE")
    params = loss_params_by_name(per_loss)
    protocols = protocols_of(protocol)
    opts = RunOptions(out=train["out"], resume=True, save_interval=train["save_interval"], progress=not quiet)
    bits = list(dict.fromkeys(n_bits))
    # every cell's settings are checked before anything trains
    cells = []
    for dataset, loss, seed in product(datasets, losses, seeds):
        settings = {**train, "loss": loss, "loss_params": (), "seed": seed,
                    "epochs": fusion_epochs or train["epochs"]}
        fcfg = dataclasses.replace(fusion_config(dataset, device, **settings), loss_params=params.get(loss, {}))
        for hcfg in hash_configs(fcfg, bits, default_epochs(dataset, train["epochs"]), train["overrides"]):
            cells.append((dataset, fcfg, hcfg))
    grid_rows: List[Dict[str, Any]] = []
    recorded = read_jsonl(results)  # the rows of earlier runs, and of the cells run below
    loaded: Dict[str, Any] = {}
    for dataset, fcfg, hcfg in cells:
        if dataset not in loaded:
            loaded[dataset] = load_dataset(resolve_dataset(dataset, data_dir or default_data_dir()))
        data = loaded[dataset]
        run_key = key_of(Run(opts.out, dataset_identity(data), fcfg, hcfg).hash_identity)
        name = f"{dataset} {fcfg.loss} seed {fcfg.seed} {hcfg.n_bits} bits"
        done = finished(recorded, run_key, protocols, k)
        if done:
            click.echo(f"skip {name}: finished (run {run_key})")
            grid_rows += done
            continue
        click.echo(f"run  {name}")
        rows = train_hash_stage(data, fcfg, hcfg, opts, protocols, k, log=click.echo)
        append_results(results, rows)
        recorded += rows
        grid_rows += rows
    for path in write_tables(grid_rows, losses, bits, table):
        click.echo(f"wrote {path}")
