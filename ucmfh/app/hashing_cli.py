"""The hashing commands: ``ucmfh train-fusion``, ``train-hash``, ``evaluate``, ``encode``, ``methods`` and
``losses``: thin click wrappers over the library and :mod:`ucmfh.app.experiment`. The ``ucmfh`` group
(:mod:`ucmfh.app.cli`) imports this module when one of them runs."""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Dict, Optional, Sequence

import click

from ucmfh.app.errors import say, user_errors
from ucmfh.app.environment import dataset_paths, protocols_of, resolve_dataset
from ucmfh.app.identity import Run, dataset_identity
from ucmfh.app.stage import check_interrupted
from ucmfh.app.table import report
from ucmfh.app.outputs import check_outputs
from ucmfh.app.options import (
    TRAINED_ON_HELP, CodeLength, Count, FiniteRange, InputPath, candidates_problem, check_precision, closed_form_notes,
    complete_datasets, complete_files, data_dir_option, data_options, device_option, given_flags, given_twice, resolved,
    run_options, settings_of, train_options,
)
from ucmfh.config import BETA_SCHEDULES, CODE_LENGTHS, PROTOCOLS, FusionConfig, HashConfig, default_epochs
from ucmfh.files import fingerprint
from ucmfh.metrics.captions import DATABASES
from ucmfh.data.h5 import DEFAULT_MAX_MEMORY, load_dataset
from ucmfh.methods import DEFAULT_METHOD, METHODS, PLUGINS
from ucmfh.methods.settings import (
    captured_step, default_loss, fusion_config, hash_config, refuse_unused, stage_configs,
)
from ucmfh.utils import did_you_mean, resolve_device


@click.command("methods")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per method: its name, description, package, "
                                                      "version, parameters, defaults, fixed settings and loss.")
def methods_cmd(as_json: bool) -> None:
    """List the hashing methods, their parameters (train-hash --method-param) and their defaults; those of other
    packages too (docs/methods.md)."""
    if as_json:  # a script's list of the methods, where the table alone was printed (an audit's)
        for name, spec in METHODS.items():
            click.echo(json.dumps({"name": name, "description": spec.description, "package": PLUGINS.get(name),
                                   "version": spec.version or None, "params": spec.params, "defaults": spec.defaults,
                                   "fixed": spec.fixed, "loss": default_loss(name)}, default=str))
        return
    base = vars(HashConfig())  # what a method's own values depart from: a fixed one equal to it is no news
    width = max(10, *(len(name) for name in METHODS))  # another package's method may have a longer name
    for name, spec in METHODS.items():
        click.echo(f"{name:<{width}} {spec.description}")
        if name in PLUGINS:
            click.echo(f"{'':<{width}} from another package: {PLUGINS[name]}"
                       + (f", version {spec.version}" if spec.version else ""))
        if spec.params:
            click.echo(f"{'':<{width}} parameters: " + ", ".join(f"{k}={v}" for k, v in spec.params.items()))
        own = {**spec.defaults, **{k: v for k, v in spec.fixed.items() if base.get(k) != v}}
        if "epochs" not in own and hash_config(name, dataset="mscoco").epochs != default_epochs("mscoco"):
            # ucmfh trains the reference's epochs of a dataset it knows (500 on MS-COCO); this method does not
            own["epochs"] = f"{hash_config(name).epochs} on every dataset"
        click.echo(f"{'':<{width}} defaults: " + (", ".join(f"{k}={v}" for k, v in own.items()) + " (else as ucmfh)"
                                                  if own else "HashConfig's: UCMFH's reference code's, but a "
                                                  f"modality dropout of {HashConfig.modality_dropout} (UCMFH trains "
                                                  "its fused view alone: 0)")
                   + ("" if default_loss(name) is not None else "; a loss of its own"))
        if spec.fixed:
            click.echo(f"{'':<{width}} fixed (another value asked for is refused): {', '.join(spec.fixed)}")
        captured = captured_step(name)
        if captured is not None:
            click.echo(f"{'':<{width}} on a GPU: {captured}")


@click.command("losses")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per loss: its name, description and "
                                                      "parameters.")
def losses_cmd(as_json: bool) -> None:
    """List the losses, each with its parameters and their defaults (train-*: --loss-param KEY=VALUE; grid:
    --loss-params LOSS:KEY=VALUE)."""
    from ucmfh.losses import LOSSES, loss_params

    for name, cls in LOSSES.items():
        description = (cls.__doc__ or "").strip().splitlines()[0]
        if as_json:
            click.echo(json.dumps({"name": name, "description": description, "params": loss_params(name)},
                                  default=str))
            continue
        click.echo(f"{name:<10} {description}")
        params = ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                           for key, value in loss_params(name).items())
        click.echo(f"{'':<10} parameters: {params or 'none'}")


def _load(dataset: str, data_dir: str, max_memory: Optional[int] = DEFAULT_MAX_MEMORY):
    path = resolve_dataset(dataset, data_dir)
    data = load_dataset(path, max_memory_bytes=max_memory)
    streamed = [name for name in ("train", "query", "retrieval") if getattr(data, name).streamed]
    click.echo(f"dataset: {path}" + (f" (streamed from the file: {', '.join(streamed)})" if streamed else ""))
    from ucmfh.app.experiment import say_relevance

    say_relevance(data, lambda line: click.echo(line, err=True))
    return data


@click.command("train-fusion")
@data_options
@train_options("train-fusion", without=("refit", "candidates_side_by_side"))  # the fusion stage: no refit, no candidates
@click.option("--lr", default=FusionConfig.lr, show_default=True, type=FiniteRange(min=0, min_open=True),
              help="The fusion encoder's learning rate (Adam).")
@user_errors
def train_fusion_cmd(dataset, data_dir, protocol, k, results, device, quiet, lr, **train) -> None:
    """Task 0: train the fusion encoder and score its embeddings (cosine ranking)."""
    from ucmfh.app.experiment import train_fusion_stage

    cfg = resolved(fusion_config, dataset=dataset, **settings_of({**train, "lr": lr, "device": device}))
    check_precision(cfg)
    check_outputs({"--results": results}, {"--out": train["out"], "--tensorboard": train["tensorboard"]})
    data = _load(dataset, data_dir, train["max_memory"])
    opts = run_options(train, quiet)
    check_interrupted([Run(opts.out, dataset_identity(data), cfg)], opts)
    rows = train_fusion_stage(data, cfg, opts, protocols_of(protocol), k, log=say)
    report(rows, results, click.echo)
    if rows:
        click.echo(f"checkpoint: {rows[0]['checkpoint']}")


class MethodChoice(click.Choice):
    """``--method``: one of the methods registered when the command runs, not when this module was imported (one
    registered after, in a notebook or a test, was refused as unknown)."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple:
        return tuple(METHODS)

    @choices.setter
    def choices(self, value: tuple) -> None:  # click's __init__ sets it: read from the registry instead
        pass

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as refused:  # click's list alone: the name a mistyped one was meant to be too
            meant = did_you_mean(value, METHODS)
            refused.message = refused.message.rstrip(".") + meant if meant else refused.message
            raise


@click.command("train-hash")
@data_options
@train_options("train-hash")
@click.option("--method", type=MethodChoice(), default=DEFAULT_METHOD, show_default=True,
              help="How codes are learnt (see 'ucmfh methods').")
@click.option("--method-param", "method_params", multiple=True, metavar="KEY=VALUE",
              help="A hyper-parameter of the method, e.g. alpha=1.5 (repeatable; see 'ucmfh methods').")
@click.option("--n-bits", "-b", multiple=True, type=CodeLength(*CODE_LENGTHS), default=(HashConfig.n_bits,), show_default=True,
              help="Code length (repeatable: -b 16 -b 32 ...).")
@click.option("--beta-schedule", type=click.Choice(BETA_SCHEDULES), default=None,
              help=f"Tanh continuation: none is UCMFH's plain tanh [default: {HashConfig.beta_schedule}; a "
                   "method may have its own, or fix it (see 'ucmfh methods')].")
@click.option("--fusion-epochs", type=Count(min=1), default=None,
              help="Methods with a fusion stage (ucmfh, distill): its epochs [default: --epochs if given, else "
                   "the reference's for known datasets, else 100].")
@click.option("--lr-fusion", type=FiniteRange(min=0), default=None,
              help=f"Method ucmfh: learning rate of the fusion encoder while the heads train (0 keeps it as trained) "
                   f"[default: {HashConfig.lr_fusion:g}].")
@user_errors
def train_hash_cmd(dataset, data_dir, protocol, k, results, device, quiet, method, n_bits, beta_schedule,
                   fusion_epochs, lr_fusion, **train) -> None:
    """Task 1: learn codes by --method and score them (method ucmfh trains its fusion stage first if needed).

    Each code length's results are appended as soon as it is done. Methods other than ucmfh
    are leak-free by construction and are scored under the unimodal protocol only.
    """
    from ucmfh.app.experiment import train_hash_stage

    # every code length is checked before anything trains
    fcfg, hcfgs = resolved(stage_configs, method, dataset=dataset, **settings_of({
        **train, "protocol": protocol, "device": device, "n_bits": n_bits, "beta_schedule": beta_schedule,
        "fusion_epochs": fusion_epochs, "lr_fusion": lr_fusion}))
    check_precision(fcfg, *hcfgs)
    problem = candidates_problem(hcfgs[0]) if train.get("candidates_side_by_side") else None
    if problem:  # refused where it does nothing, as an option no method uses is
        raise click.BadParameter(problem, param_hint="--candidates-side-by-side")
    check_outputs({"--results": results}, {"--out": train["out"], "--tensorboard": train["tensorboard"]})
    closed_form_notes([method])  # one method: none, or refused (--tensorboard for cca-itq)
    data = _load(dataset, data_dir, train["max_memory"])
    opts = run_options(train, quiet)
    check_interrupted([Run(opts.out, dataset_identity(data), fcfg, hcfg) for hcfg in hcfgs], opts)
    for hcfg in hcfgs:
        rows = train_hash_stage(data, fcfg, hcfg, opts, protocols_of(protocol), k, log=say)
        report(rows, results, click.echo)
        if rows:
            click.echo(f"checkpoint: {rows[0]['checkpoint']}")


@click.command("evaluate")
@functools.partial(data_options, trained_on=True)
@click.option("--checkpoint", "-c", type=InputPath(dir_okay=False),
              help="A fusion.pt or hashN.pt checkpoint, scored on the dataset it was trained on unless -d names one.")
@click.option("--codes", type=InputPath(dir_okay=False), multiple=True,
              help="A codes file (ucmfh encode): every metric, both directions; no dataset needed. Repeatable: "
                   "with --plot, the runs' curves on one figure (methods at one length).")
@click.option("--database", type=click.Choice(DATABASES), default=None,
              help="With --codes of a caption set: the database to score (test: the query split, the default; "
                   "collection: query and retrieval together).")
@click.option("--metrics-out", type=click.Path(dir_okay=False),
              help="With one --codes: write all metrics as JSON here.")
@click.option("--plot", metavar="PREFIX", shell_complete=complete_files,
              help="With --codes: draw PREFIX_pr and PREFIX_pk (.png and .svg; a folder: FOLDER/pr.png ...), a "
                   "line per codes file and direction (needs matplotlib).")
@click.option("--overwrite", is_flag=True,
              help="Replace a --metrics-out or --plot file that is not a metrics file or figure ucmfh wrote.")
@user_errors
def evaluate_cmd(dataset, data_dir, protocol, k, results, device, quiet, checkpoint, codes, database, metrics_out,
                 plot, overwrite) -> None:
    """Tasks 2/3: reload a checkpoint and score it on a dataset; or score a saved codes file."""
    if (checkpoint is None) == (not codes):
        raise click.UsageError("give exactly one of --checkpoint and --codes")
    if not codes and (metrics_out or plot or database):
        flag = "--metrics-out" if metrics_out else "--plot" if plot else "--database"
        raise click.UsageError(f"{flag} goes with --codes" + (" (a checkpoint is scored on both databases)"
                                                               if flag == "--database" else ""))
    if metrics_out and len(codes) > 1:
        raise click.UsageError("--metrics-out goes with one --codes file")
    real = [os.path.realpath(path) for path in codes]
    again = given_twice(real)
    if again is not None:  # its rows would be appended twice, and read as two runs
        raise click.UsageError(f"--codes {codes[real.index(again)]}: given twice")
    if codes:  # a codes file holds its dataset's codes, under its protocol: these would be ignored
        given = given_flags({"dataset": "--dataset", "data_dir": "--data-dir", "protocol": "--protocol"})
        if given:
            raise click.UsageError(f"{given[0]} goes with --checkpoint: a codes file holds the codes of its dataset, "
                                   "under its protocol")
    check_outputs({"--results": results, "--metrics-out": metrics_out, "--plot": plot}, overwrite=overwrite,
                  inputs={"--codes": codes, "--checkpoint": checkpoint, "--dataset": dataset_paths(dataset, data_dir)})
    if codes:
        _score_codes_files(codes, k, device, database, metrics_out, plot, results, progress=not quiet)
        return
    from ucmfh.app.experiment import evaluate_checkpoint
    from ucmfh.checkpoint import read_checkpoint

    saved = read_checkpoint(checkpoint)  # a damaged file is named before the dataset is read
    if saved["kind"] == "hash":
        resolved(refuse_unused, (saved["hash_config"] or {}).get("method", "ucmfh"), **settings_of({"protocol": protocol}))
    if not given_flags({"dataset": "--dataset"}):  # the file it was trained on, not a synthetic one made for it
        dataset = _trained_on(checkpoint, saved["meta"], "score")
        check_outputs({"--results": results}, inputs={"--checkpoint": checkpoint, "--dataset": dataset})
    data = _load(dataset, data_dir)
    rows = evaluate_checkpoint(data, checkpoint, protocols_of(protocol), k, device, progress=not quiet, log=say,
                               keep_per_query=bool(results))  # --results '': no row, so no file of its scores
    report(rows, results, click.echo)


def _score_codes_files(codes: Sequence[str], k: int, device: str, database: Optional[str],
                       metrics_out: Optional[str], plot: Optional[str], results: str, progress: bool) -> None:
    """evaluate --codes: each codes file scored, said and appended; with --plot, their curves on one figure (one
    dataset file and one protocol), checked before anything is scored."""
    from ucmfh.metrics.collapse import collapse_warning
    from ucmfh.app.table import append_results
    from ucmfh.files import write_json_atomic
    from ucmfh.metrics import codes_file_row, evaluate_codes_file

    if plot:
        from ucmfh.codes import load_codes
        from ucmfh.metrics.plots import require_matplotlib

        require_matplotlib()  # a missing matplotlib is said before anything is scored
        attrs = {path: load_codes(path).attrs for path in codes}
        # one figure, one dataset file (two of one name told apart by fingerprint) and one protocol: its
        # title names them
        for what in ("dataset", "protocol"):
            first = codes[0]
            other = next((p for p in codes if _codes_differ(what, attrs[p], attrs[first])), None)
            if other is not None:
                raise click.UsageError(f"--codes {other}: codes of {what} {_codes_file_field(what, attrs[other])}, "
                                       f"but {first}'s are of {_codes_file_field(what, attrs[first])}; the curves "
                                       f"of one figure share a {what}")
    runs = []
    for path in codes:
        metrics = evaluate_codes_file(path, k=k, device=resolve_device(device), database=database, progress=progress)
        if metrics_out:
            write_json_atomic(metrics_out, {"generator": "ucmfh evaluate", **metrics})  # its mark (files.MARKS)
            click.echo(f"metrics written to {metrics_out}")
        row = codes_file_row(metrics)
        where = f"protocol {row['protocol']}" + (f", database {row['database']}" if "database" in row else "")
        recall = (f"R@1 I->T {row['recall_i2t_expected']['1']:.1f}, T->I {row['recall_t2i_expected']['1']:.1f} "
                  f"(rSum {row['rsum_expected']:.1f}), " if "recall_i2t_expected" in row else "")
        click.echo(f"{path}: {row['n_bits']} bits, {where}: {recall}"
                   f"MAP@{k} I->T {row['map_i2t_expected']:.4f}, T->I {row['map_t2i_expected']:.4f} (mean over "
                   f"every order of tied items; ties by index: {row['map_i2t']:.4f}, {row['map_t2i']:.4f})")
        warning = collapse_warning(row.get("distinct_codes") or {}, row["protocol"])
        if warning:
            click.echo(warning, err=True)
        if results:
            append_results(results, [row])
            click.echo(f"results appended to {results}")
        runs.append((path, metrics))
    if plot:
        from ucmfh.metrics.plots import curve_labels, plot_curves

        for figure in plot_curves(curve_labels(runs) if len(runs) > 1 else runs[0][1], plot):
            click.echo(f"wrote {figure}")


@click.command("encode")
@click.option("--dataset", "-d", default=None, shell_complete=complete_datasets, help=TRAINED_ON_HELP)
@data_dir_option()
@click.option("--checkpoint", "-c", required=True, type=InputPath(dir_okay=False), help="A hashN.pt checkpoint.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default="unimodal", show_default=True)
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Codes file to write (HDF5, packed bits).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@device_option()
@click.option("--quiet", is_flag=True, help="No progress bars.")
@user_errors
def encode_cmd(dataset, data_dir, checkpoint, protocol, out, overwrite, device, quiet) -> None:
    """Write the query and retrieval codes of a hashing checkpoint to OUT (for 'evaluate --codes')."""
    from ucmfh.app.experiment import encode_checkpoint
    from ucmfh.checkpoint import load_model

    inputs = {"--checkpoint": checkpoint, "--dataset": [] if dataset is None else dataset_paths(dataset, data_dir)}
    check_outputs({"--out": out}, inputs=inputs, overwrite=overwrite, new=("--out",))
    _, _, hash_cfg, meta = load_model(checkpoint, "hash")  # a damaged or fusion checkpoint is named before the dataset
    if dataset is None:
        dataset = _trained_on(checkpoint, meta, "encode")
        check_outputs({"--out": out}, inputs={**inputs, "--dataset": dataset}, overwrite=overwrite, new=("--out",))
    resolved(refuse_unused, hash_cfg.method, protocol=protocol)  # a leak-free method's codes have no fused view
    data = _load(dataset, data_dir)
    path = encode_checkpoint(data, checkpoint, out, protocol, device, not quiet, overwrite, log=say)
    click.echo(f"wrote {path} ({protocol} protocol)")


def _codes_differ(what: str, a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two codes files' attributes differ in ``what`` (dataset or protocol): a dataset by its name, and by
    its fingerprint where both files hold one (files written before it have none)."""
    prints = a.get("dataset_fingerprint"), b.get("dataset_fingerprint")
    return a.get(what) != b.get(what) or (what == "dataset" and None not in prints and prints[0] != prints[1])


def _codes_file_field(what: str, attrs: Dict[str, Any]) -> str:
    """A codes file's ``what`` (dataset or protocol) as a refusal names it: a dataset with its fingerprint's first
    characters where the file holds one."""
    fingerprint = attrs.get("dataset_fingerprint") if what == "dataset" else None
    return f"{attrs.get(what)!r}" + (f" [{str(fingerprint)[:8]}]" if fingerprint else "")


def _trained_on(checkpoint: str, meta: Dict[str, Any], doing: str) -> str:
    """The dataset file a checkpoint was trained on, as it records it: a command's default for -d, where the
    default dataset, 'synthetic', made a 103-MB file before the checkpoint refused its widths. A file gone or
    changed since is refused (``doing``: what -d would be given for)."""
    recorded = meta.get("dataset") if isinstance(meta.get("dataset"), dict) else {}  # a library caller's meta
    dataset = recorded.get("path")
    if not dataset or not os.path.isfile(dataset):
        raise click.UsageError(f"{checkpoint}: the dataset it was trained on, {dataset or 'not recorded'}, is not "
                               "there: give one with -d")
    if recorded.get("fingerprint") and fingerprint(dataset) != recorded["fingerprint"]:  # another file there now
        raise click.UsageError(f"{checkpoint}: {dataset}, the dataset it was trained on, has changed since (its "
                               f"content is not the one trained on): give the one to {doing} with -d")
    return dataset
