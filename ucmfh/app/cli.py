"""The ``ucmfh`` command: thin click wrappers over the library and :mod:`ucmfh.app.experiment`."""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Dict, Optional, Tuple

import click

from ucmfh.app.errors import (
    UserError, outlive_reader, plain_warnings, reader_gone, terminate_as_interrupt, user_errors, warn,
)
from ucmfh.app.environment import (
    configure_from_env, dataset_paths, default_data_dir, join_process_group, protocols_of, resolve_dataset,
)
from ucmfh.app.identity import Run, dataset_identity, fingerprint
from ucmfh.app.stage import check_interrupted
from ucmfh.app.table import report
from ucmfh.app.outputs import check_figures, check_outputs
from ucmfh.app.options import (
    Count, FiniteRange, InputPath, check_device, check_precision, data_options, given_flags, given_twice, resolved,
    results_to_read, run_options, settings_of, train_options,
)
from ucmfh.config import BETA_SCHEDULES, CODE_LENGTHS, PROTOCOLS, FusionConfig, HashConfig, SettingError
from ucmfh.data.h5 import DEFAULT_MAX_MEMORY, load_dataset, validate_file
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.methods import DEFAULT_METHOD, METHODS, PLUGIN_ERRORS, PLUGINS
from ucmfh.methods.settings import captured_step, default_loss, fusion_config, refuse_unused, stage_configs
from ucmfh.utils import resolve_device

class UsageInOneLine(click.ClickException):
    """A mistake on the command line said in one line, exit code 2 (click's own says it under the command's
    usage, a hint and a blank line); the message names the flag, and click's guess where a flag is unknown."""

    exit_code = 2

    def __init__(self, err: click.UsageError) -> None:
        super().__init__(err.format_message() + _flag_for_extra_file(err))


# the flags that take a file of each kind, for a file given without its flag ('ucmfh runs results.jsonl')
_FILE_FLAGS = ((".jsonl", ("--results",)), (".h5", ("--dataset", "--codes", "--queries")),
               (".pt", ("--checkpoint",)))


def _flag_for_extra_file(err: click.UsageError) -> str:
    """For one unexpected argument that names a file by its kind, the flags of the command that take such a
    file ('; give it as --results r.jsonl'), or ''; never a flag the command has not."""
    match = re.fullmatch(r"Got unexpected extra argument \((.+)\)", err.message)
    if match is None or err.ctx is None:
        return ""
    given = match.group(1)
    flags = {opt for param in err.ctx.command.params for opt in getattr(param, "opts", ())}
    if "--data-dir" not in flags:  # a --dataset that filters rows by a dataset's name ('runs'), not one to read
        flags.discard("--dataset")
    for suffix, takers in _FILE_FLAGS:
        if given.endswith(suffix):
            own = [flag for flag in takers if flag in flags]
            return f"; give it as {' or '.join(f'{flag} {given}' for flag in own)}" if own else ""
    return ""


class Commands(click.Group):
    """The ``ucmfh`` group: a reader that closes the output early (``ucmfh runs | head -1``) ends every
    command quietly once its work is done, with the code that ends ``yes | head -1``
    (:func:`ucmfh.app.errors.outlive_reader`); a mistake on the command line is one line
    (:class:`UsageInOneLine`; ``ucmfh`` alone still prints its help)."""

    def make_context(self, *args, **kwargs) -> click.Context:  # where 'ucmfh --help' prints
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            reader_gone()
        except click.UsageError as err:
            raise _in_one_line(err) from None

    def invoke(self, ctx: click.Context):
        try:
            with outlive_reader():
                return super().invoke(ctx)
        except BrokenPipeError:
            reader_gone()
        except click.UsageError as err:
            raise _in_one_line(err) from None


def _in_one_line(err: click.UsageError) -> click.ClickException:
    """``err`` as :class:`UsageInOneLine`, but a bare ``ucmfh``'s request for help (click 8.2's NoArgsIsHelpError)."""
    return err if isinstance(err, getattr(click.exceptions, "NoArgsIsHelpError", ())) else UsageInOneLine(err)


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ucmfh")
@click.pass_context
def main(ctx: click.Context) -> None:
    """ucmfh: deep cross-modal hashing on precomputed features: UCMFH, the field's methods and a leak-free default."""
    try:
        configure_from_env()
    except ValueError as err:  # an environment variable of ours set to what it cannot be
        raise UserError(str(err)) from None
    plain_warnings()
    ctx.call_on_close(terminate_as_interrupt())
    for name, why in PLUGIN_ERRORS.items():  # another package's method, installed and broken (docs/methods.md)
        warn(f"method {name!r} of an installed package not loaded: {why}")
    if ctx.invoked_subcommand != "extract":  # extraction's ranks are independent shards, never a group
        join_process_group()


@main.command("make-synthetic")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--n-query", default=SyntheticSpec.n_query, show_default=True, help="Query items (the test split).")
@click.option("--n-retrieval", default=SyntheticSpec.n_retrieval, show_default=True,
              help="Retrieval items (the database).")
@click.option("--n-train", default=SyntheticSpec.n_train, show_default=True,
              help="Training items, drawn from the retrieval items.")
@click.option("--n-classes", default=SyntheticSpec.n_classes, show_default=True, help="Classes (multi-label).")
@click.option("--d-img", default=SyntheticSpec.d_img, show_default=True, help="Image feature dimensions.")
@click.option("--d-txt", default=SyntheticSpec.d_txt, show_default=True, help="Text feature dimensions.")
@click.option("--seed", default=SyntheticSpec.seed, show_default=True, type=click.IntRange(0, 2**32 - 1),
              help="The data's seed: the same seed and sizes give the same file on every machine.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@user_errors
def make_synthetic_cmd(out: str, overwrite: bool, **sizes: int) -> None:
    """Write a deterministic synthetic dataset (MIRFlickr-shaped by default) to OUT."""
    check_outputs({"OUT": out})
    try:
        spec = SyntheticSpec(**sizes)
    except SettingError as err:  # the settings refused, said as the flags that set them
        message = str(err)
        for name in (name for name in err.settings if name in sizes):  # the command's own options only
            message = re.sub(rf"\b{name}\b", "--" + name.replace("_", "-"), message)
        raise click.UsageError(message) from None
    path = make_synthetic(out, spec, overwrite=overwrite)
    click.echo(f"wrote {path}")


@main.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
@user_errors
def validate_cmd(path: str) -> None:
    """Check a dataset file against the ucmfh HDF5 format, or a search collection (docs/search.md)."""
    try:
        attrs = validate_file(path)
    except ValueError as err:
        if not os.path.isfile(path):  # nothing else to read it as (a pipe waits for ever)
            raise err from None
        described = _as_codes(path) or _as_collection(path)  # a file without /train: codes, or a collection to index
        if described is None:
            raise err from None
        click.echo(described)
        return
    import h5py

    with h5py.File(path, "r") as f:  # the shapes alone: the features were read once, by the check
        rows = {split: f[split]["image"].shape[0] for split in ("train", "query", "retrieval")}
        widths = f["train"]["image"].shape[1], f["train"]["text"].shape[1]
        classes = f["train"]["labels"].shape[1] if "labels" in f["train"] else None
        tokens, wordless = _tokens_of(f, rows)
    kind = "a caption set (relevance: same id)" if classes is None else f"{classes} classes"
    click.echo(f"{path}: valid ({attrs.get('name', '?')}: d_img {widths[0]}, d_txt {widths[1]}, {kind}; "
               + ", ".join(f"{split} {n}" for split, n in rows.items()) + f"; {tokens})")
    for split, n in wordless.items():  # valid, but SEPS scores such texts by nothing
        warn(f"{path}: /{split}: {n} of {rows[split]} texts have no word tokens" + (" (none has one)" if n ==
                                                                                      rows[split] else ""))


def _tokens_of(f, rows: Dict[str, int]) -> Tuple[str, Dict[str, int]]:
    """What ``validate`` says of a file's token features (SEPS, rerank): their shapes or their absence, and per
    split the texts without a word token."""
    import numpy as np

    if "image_tokens" not in f["train"] and "text_tokens" not in f["train"]:
        return "no token features", {}
    said = []
    if "image_tokens" in f["train"]:
        said.append("image {} x {}".format(*f["train"]["image_tokens"].shape[1:]))
    if "text_tokens" in f["train"]:
        said.append(f"text {f['train']['text_tokens'].shape[1]}-d word tokens")
    wordless = {split: int((np.diff(f[split]["text_offsets"][()]) == 0).sum()) for split in rows
                if "text_offsets" in f[split]}
    return "tokens: " + ", ".join(said), {split: n for split, n in wordless.items() if n}


def _codes_differ(what: str, a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two codes files' attributes differ in ``what`` (dataset or protocol): a dataset by its name, and by
    its fingerprint where both files hold one (files written before it have none)."""
    prints = a.get("dataset_fingerprint"), b.get("dataset_fingerprint")
    return a.get(what) != b.get(what) or (what == "dataset" and None not in prints and prints[0] != prints[1])


def _codes_of(what: str, attrs: Dict[str, Any]) -> str:
    """A codes file's ``what`` (dataset or protocol) as a refusal names it: a dataset with its fingerprint's first
    characters where the file holds one."""
    fingerprint = attrs.get("dataset_fingerprint") if what == "dataset" else None
    return f"{attrs.get(what)!r}" + (f" [{str(fingerprint)[:8]}]" if fingerprint else "")


def _as_codes(path: str) -> Optional[str]:
    """What ``validate`` says of a codes file (``ucmfh encode``), checked as ``evaluate --codes`` reads it: None when
    the file is not one."""
    import h5py

    from ucmfh.codes import FORMAT, load_codes

    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                return None
    except OSError:
        return None
    codes = load_codes(path)  # its own problem, said in one line
    rows = ", ".join(f"{group} {codes.packed[(group, 'img')].shape[0]}" for group in ("query", "retrieval"))
    relevance = "a caption set (relevance: same id)" if codes.caption_set else "labelled"
    return (f"{path}: a valid codes file of 'ucmfh encode' (not a training dataset): {codes.n_bits} bits, {relevance}; "
            f"{rows}; 'ucmfh evaluate --codes {path}' scores it")


def _as_collection(path: str) -> Optional[str]:
    """What ``validate`` says of a search collection (no training splits): None when the file is not one."""
    import h5py

    from ucmfh.search.collection import open_collection

    try:
        with h5py.File(path, "r") as f:
            if "train" in f:
                return None  # a dataset: its own error stands
            flat = "image" in f or "text" in f  # features at the root: a collection, whatever else is wrong
    except OSError:
        return None
    try:
        coll = open_collection(path)
    except ValueError:
        if flat:
            raise  # the collection's own problem (rows, shapes, ids), not a dataset's missing /train
        return None
    for name in ("image", "text"):  # every feature finite, as 'ucmfh index' will want them (a DataError names one)
        for start in range(0, len(coll) if coll.has(name) else 0, 1 << 16):
            coll.read(name, start, min(start + (1 << 16), len(coll)))
    widths = ", ".join(f"{name} {coll.columns[name]}-d" for name in ("image", "text") if coll.has(name))
    extra = [name for name in ("ids", "labels", "text_raw", "paths") if coll.has(name)]
    return (f"{path}: a valid search collection for 'ucmfh index' (not a training dataset: no /train): "
            f"{len(coll)} rows in {', '.join(coll.groups)}; {widths}" + (f"; {', '.join(extra)}" if extra else ""))


@main.command("methods")
def methods_cmd() -> None:
    """List the hashing methods, their parameters (--method-param) and their defaults; those of other
    packages too (docs/methods.md)."""
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
        click.echo(f"{'':<{width}} defaults: " + (", ".join(f"{k}={v}" for k, v in own.items()) + " (else as ucmfh)"
                                                  if own else "HashConfig's: UCMFH's reference code's, but a "
                                                  f"modality dropout of {HashConfig.modality_dropout} (UCMFH trains "
                                                  "its fused view alone: 0)")
                   + ("" if default_loss(name) is not None else "; a loss of its own"))
        if spec.fixed:
            click.echo(f"{'':<{width}} fixed whatever is asked: {', '.join(spec.fixed)}")
        captured = captured_step(name)
        if captured is not None:
            click.echo(f"{'':<{width}} on a GPU: {captured}")


@main.command("losses")
def losses_cmd() -> None:
    """List the losses, each with its parameters and their defaults (--loss-param NAME=VALUE)."""
    from ucmfh.losses import LOSSES, loss_params

    for name, cls in LOSSES.items():
        click.echo(f"{name:<10} {(cls.__doc__ or '').strip().splitlines()[0]}")
        params = ", ".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                           for key, value in loss_params(name).items())
        click.echo(f"{'':<10} parameters: {params or 'none'}")


def _load(dataset: str, data_dir: str, max_memory: Optional[int] = DEFAULT_MAX_MEMORY):
    path = resolve_dataset(dataset, data_dir)
    data = load_dataset(path, max_memory_bytes=max_memory)
    streamed = [name for name in ("train", "query", "retrieval") if getattr(data, name).streamed]
    click.echo(f"dataset: {path}" + (f" (streamed from the file: {', '.join(streamed)})" if streamed else ""))
    return data


@main.command("train-fusion")
@data_options
@train_options("train-fusion", without=("refit", "candidates_side_by_side"))  # the fusion stage: no refit, no candidates
@click.option("--lr", default=FusionConfig.lr, show_default=True, type=FiniteRange(min=0, min_open=True))
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
    rows = train_fusion_stage(data, cfg, opts, protocols_of(protocol), k, log=click.echo)
    report(rows, results, click.echo)
    if rows:
        click.echo(f"checkpoint: {rows[0]['checkpoint']}")


@main.command("train-hash")
@data_options
@train_options("train-hash")
@click.option("--method", type=click.Choice(list(METHODS)), default=DEFAULT_METHOD, show_default=True,
              help="How codes are learnt (see 'ucmfh methods').")
@click.option("--method-param", "method_params", multiple=True, metavar="KEY=VALUE",
              help="A hyper-parameter of the method, e.g. alpha=1.5 (repeatable; see 'ucmfh methods').")
@click.option("--n-bits", "-b", multiple=True, type=click.IntRange(*CODE_LENGTHS), default=(HashConfig.n_bits,), show_default=True,
              help="Code length (repeatable: -b 16 -b 32 ...).")
@click.option("--beta-schedule", type=click.Choice(BETA_SCHEDULES), default=None,
              help=f"Tanh continuation: none is UCMFH's plain tanh [default: {HashConfig.beta_schedule}].")
@click.option("--fusion-epochs", type=Count(min=1), default=None,
              help="Epochs of the fusion stage [default: as --epochs].")
@click.option("--lr-fusion", type=FiniteRange(min=0), default=None,
              help=f"Learning rate of the fusion encoder while the heads train (UCMFH's; 0 keeps it as trained) "
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
    check_outputs({"--results": results}, {"--out": train["out"], "--tensorboard": train["tensorboard"]})
    data = _load(dataset, data_dir, train["max_memory"])
    opts = run_options(train, quiet)
    check_interrupted([Run(opts.out, dataset_identity(data), fcfg, hcfg) for hcfg in hcfgs], opts)
    for hcfg in hcfgs:
        rows = train_hash_stage(data, fcfg, hcfg, opts, protocols_of(protocol), k, log=click.echo)
        report(rows, results, click.echo)
        if rows:
            click.echo(f"checkpoint: {rows[0]['checkpoint']}")


@main.command("evaluate")
@data_options
@click.option("--checkpoint", "-c", type=InputPath(dir_okay=False),
              help="A fusion.pt or hashN.pt checkpoint, scored on the dataset it was trained on unless -d names one.")
@click.option("--codes", type=InputPath(dir_okay=False), multiple=True,
              help="A codes file (ucmfh encode): every metric, both directions; no dataset needed. Repeatable: "
                   "with --plot, the runs' curves on one figure (methods at one length).")
@click.option("--database", type=click.Choice(["test", "collection"]), default=None,
              help="With --codes of a caption set: the database to score (test: the query split, the default; "
                   "collection: query and retrieval together).")
@click.option("--metrics-out", type=click.Path(dir_okay=False),
              help="With one --codes: write all metrics as JSON here.")
@click.option("--plot", metavar="PREFIX",
              help="With --codes: draw PREFIX_pr.png and PREFIX_pk.png, a line per codes file and direction "
                   "(needs matplotlib).")
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
        from ucmfh.app.table import append_results
        from ucmfh.files import write_json_atomic
        from ucmfh.metrics import codes_file_row, evaluate_codes_file

        if plot:
            from ucmfh.codes import load_codes
            from ucmfh.metrics.plots import pyplot

            pyplot()  # a missing matplotlib is said before anything is scored
            attrs = {path: load_codes(path).attrs for path in codes}
            # one figure, one dataset file (two of one name told apart by fingerprint) and one protocol: its
            # title names them
            for what in ("dataset", "protocol"):
                first = codes[0]
                other = next((p for p in codes if _codes_differ(what, attrs[p], attrs[first])), None)
                if other is not None:
                    raise click.UsageError(f"--codes {other}: codes of {what} {_codes_of(what, attrs[other])}, but "
                                           f"{first}'s are of {_codes_of(what, attrs[first])}; the curves of one "
                                           f"figure share a {what}")
        runs = []
        for path in codes:
            metrics = evaluate_codes_file(path, k=k, device=resolve_device(device), database=database)
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
            if results:
                append_results(results, [row])
                click.echo(f"results appended to {results}")
            runs.append((path, metrics))
        if plot:
            from ucmfh.metrics.plots import curve_labels, plot_curves

            for figure in plot_curves(curve_labels(runs) if len(runs) > 1 else runs[0][1], plot):
                click.echo(f"wrote {figure}")
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
    rows = evaluate_checkpoint(data, checkpoint, protocols_of(protocol), k, device, progress=not quiet, log=click.echo,
                               keep_per_query=bool(results))  # --results '': no row, so no file of its scores
    report(rows, results, click.echo)


@main.command("encode")
@click.option("--dataset", "-d", default=None,
              help="Dataset name or path to an .h5 file [default: the file the checkpoint was trained on].")
@click.option("--data-dir", default=default_data_dir, show_default="$UCMFH_DATA_DIR or data")
@click.option("--checkpoint", "-c", required=True, type=InputPath(dir_okay=False), help="A hashN.pt checkpoint.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default="unimodal", show_default=True)
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Codes file to write (HDF5, packed bits).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--device", default="auto", show_default=True, callback=check_device)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@user_errors
def encode_cmd(dataset, data_dir, checkpoint, protocol, out, overwrite, device, quiet) -> None:
    """Write the query and retrieval codes of a hashing checkpoint to OUT (for 'evaluate --codes')."""
    from ucmfh.app.experiment import encode_checkpoint
    from ucmfh.checkpoint import load_model

    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out}: exists; not replaced")
    inputs = {"--checkpoint": checkpoint, "--dataset": [] if dataset is None else dataset_paths(dataset, data_dir)}
    check_outputs({"--out": out}, inputs=inputs)
    _, _, hash_cfg, meta = load_model(checkpoint, "hash")  # a damaged or fusion checkpoint is named before the dataset
    if dataset is None:
        dataset = _trained_on(checkpoint, meta, "encode")
        check_outputs({"--out": out}, inputs={**inputs, "--dataset": dataset})
    resolved(refuse_unused, hash_cfg.method, protocol=protocol)  # a leak-free method's codes have no fused view
    data = _load(dataset, data_dir)
    path = encode_checkpoint(data, checkpoint, out, protocol, device, not quiet, overwrite, log=click.echo)
    click.echo(f"wrote {path} ({protocol} protocol)")


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


@main.command("runs")
@results_to_read
@click.option("--dataset", "-d", multiple=True, help="Only these datasets (repeatable).")
@click.option("--method", multiple=True,
              help="Only these methods (repeatable); METHOD@KEY: its runs of one settings key, as this command "
                   "shows them (or METHOD@STAGE.NAME=VALUE, as 'ucmfh compare' takes them).")
@click.option("--loss", multiple=True, help="Only these losses (repeatable).")
@click.option("--n-bits", "-b", multiple=True, type=int, help="Only these code lengths (repeatable).")
@click.option("--seed", multiple=True, type=int, help="Only these seeds (repeatable).")
@click.option("--task", multiple=True, type=click.Choice(["fusion", "hashing", "seps", "rerank", "codes"]),
              help="Only rows of these tasks (repeatable).")
@click.option("--protocol", type=click.Choice(PROTOCOLS), help="Only this protocol.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON lines.")
@click.option("--checkpoint", "checkpoint", is_flag=True,
              help="Print only the checkpoint of the one run that matches (for 'index -c', 'evaluate -c', ...); "
                   "an error when several match.")
@click.option("--plot", metavar="PREFIX",
              help="Draw each dataset's scores against code length, one line per method: "
                   "PREFIX_<dataset>_<score>.png and .svg (needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace a --plot file that is not a figure ucmfh wrote.")
@click.option("--history", metavar="RUN",
              help="Print a finished run's epoch history (loss, validation score, the epoch kept, the candidate "
                   "chosen, the refit) from its checkpoint: RUN is a checkpoint file or a run key (a prefix will do); "
                   "with --plot, draw it: PREFIX_history.png and .svg.")
@user_errors
def runs_cmd(results, dataset, method, loss, n_bits, seed, task, protocol, as_json, checkpoint, plot,
             overwrite, history) -> None:
    """Summarise past runs from results files: mean ± std over seeds, one line per setting."""
    from ucmfh.app.compare import parse_side
    from ucmfh.app.runs import (filter_rows, format_summary, held_by, method_of, read_results, settings_key,
                                summarize, the_checkpoint, variant_of)

    if plot is not None and (as_json or checkpoint):
        raise click.UsageError(f"--plot does not go with {'--json' if as_json else '--checkpoint'}")
    if history is not None and checkpoint:
        raise click.UsageError("--history does not go with --checkpoint")
    if history == "":  # a prefix of every run key
        raise click.BadParameter("an empty run key; give a checkpoint file or a run key", param_hint="--history")
    if as_json and checkpoint:  # --checkpoint prints a path alone (for $(...)); --json was ignored
        raise click.UsageError("--json does not go with --checkpoint")
    if plot is not None:
        from ucmfh.metrics.plots import pyplot

        pyplot()  # a missing matplotlib is said before anything is read
        if not plot:
            raise click.BadParameter("an empty prefix; give the figures' path prefix (PREFIX_*.png)",
                                     param_hint="--plot")
        check_outputs(folders={"--plot": os.path.dirname(os.path.abspath(plot))})
    missing = [path for path in results if not os.path.exists(path)]
    if history is not None and not os.path.isfile(history) and missing:
        raise click.BadParameter(f"{history}: no such checkpoint file, and no results file {missing[0]} to find a run "
                                 "key in", param_hint="--history")
    found = read_results(results, warn) if history is None or not os.path.isfile(history) else []
    sides = [parse_side(name, "--method") for name in method if "@" in name]  # a method's settings, as compare's
    plain = tuple(name for name in method if "@" not in name)
    rows = filter_rows(found, dataset=dataset, method=() if sides else plain, loss=loss, n_bits=n_bits,
                       protocol=protocol, seed=seed, task=task)
    if sides:
        rows = [row for row in rows if method_of(row) in plain or any(side.holds(row) for side in sides)]
    if history is not None:
        from ucmfh.app.history import draw_history, format_history, history_figure, history_of, history_paths, history_rows

        try:
            path, epochs = history_of(history, rows, ", ".join(results))
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--history") from None
        if not history_rows(epochs):  # a method fitted in closed form (cca-itq) trains no epoch
            raise click.BadParameter(f"{path}: no epoch was trained (a method fitted in closed form has no history)",
                                     param_hint="--history")
        if plot is not None:
            check_figures("--plot", history_paths(plot), overwrite)
            for drawn in draw_history(history_figure(path, epochs), plot):
                click.echo(f"wrote {drawn}")
        elif as_json:
            for row in history_rows(epochs):
                click.echo(json.dumps(row, sort_keys=True))
        else:
            click.echo(format_history(path, epochs))
        return
    if checkpoint:
        try:
            click.echo(the_checkpoint(rows, ", ".join(results)))
        except ValueError as err:  # the filters are the remedy
            held = f" ({', '.join(results)} holds: {held_by(found)})" if not rows and found else ""
            keys = sorted({f"{variant_of(row)}@{settings_key(row)[:6]}" for row in rows if row.get("checkpoint")})
            if len(keys) > 1:  # runs of several settings: a settings key names one, as 'ucmfh runs' shows them
                raise UserError(f"{err}, of settings {', '.join(keys)}; name one with --method {keys[0]} (and -d, "
                                "-b, --seed)") from None
            raise UserError(f"{err}{held}; name one run with -d, --task, --method, --loss, -b and --seed") from None
        return
    groups = summarize(rows)
    if plot is not None:
        from ucmfh.app.length_plot import check_figure_paths, draw_length_figures, length_figures

        figures = length_figures(groups)
        if not figures:
            raise UserError("--plot: no run with a code length and a score matches; nothing drawn")
        check_figure_paths(plot, figures, overwrite)
        for path in draw_length_figures(figures, plot):
            click.echo(f"wrote {path}")
        return
    if as_json:
        for g in groups:
            click.echo(json.dumps(g, sort_keys=True))
    elif not groups and found:  # the selection left nothing: what would match
        click.echo(f"no runs match the selection; {', '.join(results)} holds: {held_by(found)}")
    else:
        click.echo(format_summary(groups))


def _add_commands() -> None:
    from ucmfh.app.compare import compare
    from ucmfh.app.data_cli import convert, extract
    from ucmfh.app.grid import grid
    from ucmfh.app.search_cli import index_cmd, search_cmd
    from ucmfh.app.seps_cli import rerank, train_seps

    main.add_command(convert)
    main.add_command(extract)
    main.add_command(grid)
    main.add_command(compare)
    main.add_command(train_seps)
    main.add_command(rerank)
    main.add_command(index_cmd)
    main.add_command(search_cmd)


_add_commands()

if __name__ == "__main__":
    sys.exit(main())
