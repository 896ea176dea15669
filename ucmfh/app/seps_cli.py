"""Click commands of the token-level stage: ``ucmfh train-seps`` and ``ucmfh rerank``.

Registered on the main group by :mod:`ucmfh.app.cli`; the work is in :mod:`ucmfh.app.seps_runs`.
"""
from __future__ import annotations

import click

from ucmfh.app.errors import say, user_errors
from ucmfh.app.environment import resolve_dataset
from ucmfh.app.identity import RunOptions
from ucmfh.app.seps_runs import format_stages, rerank_rows, train_seps_stage
from ucmfh.app.options import (
    Count, FiniteRange, InputPath, check_precision, complete_datasets, complete_folders, data_dir_option,
    output_options, parse_params, resolved, seed_type, tensorboard_option,
)
from ucmfh.app.outputs import check_outputs
from ucmfh.config import DENSE_TEXT, SEPS_SELECTIONS, SEPS_VERSIONS, SepsConfig, seps_config
from ucmfh.data.h5 import load_dataset
from ucmfh.files import append_jsonl
from ucmfh.metrics.captions import DATABASES, RANKS

_DEFAULTS = SepsConfig()


def _common(database: str):
    """The options both commands take; ``database``: the command's default of --database."""
    return lambda fn: _with_options(fn, database)


def _with_options(fn, database: str):
    for option in reversed([
        click.option("--dataset", "-d", required=True, shell_complete=complete_datasets,
                     help="Dataset name (DATA_DIR/NAME.h5) or path to an .h5 file with token features."),
        data_dir_option(),
        click.option("--database", type=click.Choice(["both", *DATABASES]), default=database, show_default=True,
                     help="Which database of the caption protocol to score (test: the query split; collection: "
                          "query and retrieval together)."),
        *output_options(),
    ]):
        fn = option(fn)
    return fn


def _databases(choice: str):
    return DATABASES if choice == "both" else (choice,)


def _report(rows, results) -> None:
    click.echo(format_stages(rows))
    if results:
        append_jsonl(results, rows)
        click.echo(f"results appended to {results}")


@click.command("train-seps")
@_common(database="test")
@click.option("--version", "version", type=click.Choice(SEPS_VERSIONS), default=_DEFAULTS.version, show_default=True,
              help="code: the released code's SEPS; paper: the paper's (predictor MLP and β, top-K MLPs in HRPA).")
@click.option("--selection", type=click.Choice(list(SEPS_SELECTIONS)), default=_DEFAULTS.selection, show_default=True,
              help="How the patch selection learns: " + "; ".join(f"{k}: {v}" for k, v in SEPS_SELECTIONS.items()) + ".")
@click.option("--dense-text", type=click.Choice(list(DENSE_TEXT)), default=_DEFAULTS.dense_text, show_default=True,
              help="Dense descriptions (files with dense_text_tokens): " + "; ".join(
                  f"{k}: {v}" for k, v in DENSE_TEXT.items()) + ".")
@click.option("--epochs", type=Count(min=1), default=_DEFAULTS.epochs, show_default=True,
              help="Most epochs (the best on the validation split is kept).")
@click.option("--batch-size", type=Count(min=2), default=_DEFAULTS.batch_size, show_default=True,
              help="Image–caption pairs a step.")
@click.option("--lr", type=FiniteRange(min=0, min_open=True), default=_DEFAULTS.lr, show_default=True,
              help="Learning rate (AdamW).")
@click.option("--seed", default=_DEFAULTS.seed, show_default=True, type=seed_type)
@click.option("--val-fraction", type=FiniteRange(0, 1, max_open=True), default=_DEFAULTS.val_fraction,
              show_default=True, help="Share of the training images held out to pick the best epoch (0: keep the last).")
@click.option("--patience", type=Count(min=0), default=None,
              help=f"Stop after this many epochs without a better validation rSum (0: never) [default: "
                   f"{_DEFAULTS.patience}, 0 with --val-fraction 0].")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="Any other SEPS setting, e.g. keep_ratio=0.8 or embed_dim=256 (repeatable).")
@click.option("--out", default=RunOptions.out, show_default=True, shell_complete=complete_folders,
              help="Root folder of runs (checkpoints).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run of the same settings.")
@click.option("--save-interval", default=RunOptions.save_interval, show_default=True, type=FiniteRange(min=0),
              help="Seconds between saves of the training state (0: every epoch).")
@tensorboard_option
@user_errors
def train_seps(dataset, data_dir, database, results, device, quiet, overrides, out, resume, save_interval,
               tensorboard, **settings) -> None:
    """Train SEPS on a file's token features and score every pair of its --database (R@K, docs/reference.md §7).

    The model is saved in OUT/DATASET-FP/seps-seedS-KEY/seps.pt; an existing run of the same
    settings is reused. Re-rank a hashing model's candidates with it by 'ucmfh rerank'.
    """
    own = {**settings, "device": device}  # each given by its option, named as its setting
    cfg = resolved(seps_config, own, parse_params(overrides, "--set"),
                   flags={name: "--" + name.replace("_", "-") for name in own})
    check_precision(cfg)
    check_outputs({"--results": results}, {"--out": out, "--tensorboard": tensorboard})
    path = resolve_dataset(dataset, data_dir)
    click.echo(f"dataset: {path}")
    data = load_dataset(path)
    opts = RunOptions(out=out, resume=resume, save_interval=save_interval, progress=not quiet, tensorboard=tensorboard)
    _report(train_seps_stage(data, cfg, opts, _databases(database), log=say), results)


@click.command("rerank")
@_common(database="both")
@click.option("--checkpoint", "-c", required=True, type=InputPath(dir_okay=False),
              help="Hashing checkpoint of a leak-free method (the first stage: Hamming top-M).")
@click.option("--seps", "seps_checkpoint", type=InputPath(dir_okay=False), default=None,
              help="SEPS checkpoint ('ucmfh train-seps') that re-ranks the candidates.")
@click.option("--candidates", "-m", multiple=True, type=Count(min=1), default=(100,), show_default=True,
              help="M, the Hamming candidates re-ranked, 10 or more: R@10 is read from the list (repeatable).")
@click.option("--full", is_flag=True, help="Also score every pair of each database by SEPS (no first stage).")
@user_errors
def rerank(dataset, data_dir, database, results, device, quiet, checkpoint, seps_checkpoint, candidates, full) -> None:
    """Two-stage search: Hamming top-M, then re-ranked by cosine of the pooled embeddings and (--seps) by SEPS.

    Every query runs alone; the rows give R@1/5/10 of both directions, the first stage's ceiling
    R@M and per-query latency (search / fetch / score, p50 and p95), on the --database of docs/reference.md §7.
    """
    if full and not seps_checkpoint:
        raise click.UsageError("--full scores every pair by SEPS: it goes with --seps SEPS.pt")
    short = [m for m in candidates if m < max(RANKS)]
    if short:  # R@10 of a list of 5 was read as R@5
        raise click.BadParameter(f"{short[0]}: a list of {short[0]} candidates has no R@{max(RANKS)}; give "
                                 f"{max(RANKS)} or more", param_hint="'-m' / '--candidates'")
    check_outputs({"--results": results})
    path = resolve_dataset(dataset, data_dir)
    click.echo(f"dataset: {path}")
    data = load_dataset(path)
    distinct = list(dict.fromkeys(candidates))  # -m 5 -m 5: measured once
    # each database's rows appended once scored: an interrupt during the next keeps them
    rows = rerank_rows(data, checkpoint, seps_checkpoint, distinct, _databases(database), full, device,
                       progress=not quiet, log=click.echo, done=(lambda done: append_jsonl(results, done)) if results
                       else None)
    click.echo(format_stages(rows))
    if results:
        click.echo(f"results appended to {results}")
