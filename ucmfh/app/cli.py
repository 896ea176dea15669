"""The ``ucmfh`` command: thin click wrappers over the library."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import click

from ucmfh.app.errors import user_errors
from ucmfh.config import AMP_MODES, PROTOCOLS, REFERENCE_EPOCHS, FusionConfig, HashConfig
from ucmfh.data.h5 import DataError, load_dataset, validate_file
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic


def default_data_dir() -> str:
    """Where dataset names resolve to ``NAME.h5``: ``$UCMFH_DATA_DIR``, else ``data``."""
    return os.environ.get("UCMFH_DATA_DIR", "data")


def parse_loss_params(pairs: Tuple[str, ...]) -> Dict[str, Any]:
    """``key=value`` pairs to a dict; values are read as JSON when they parse (numbers, true/false)."""
    params: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--loss-param")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def protocols_of(protocol: str) -> Tuple[str, ...]:
    return PROTOCOLS if protocol == "both" else (protocol,)


def data_options(fn: Callable) -> Callable:
    for option in reversed([
        click.option("--dataset", "-d", default="synthetic", show_default=True,
                     help="Dataset name (DATA_DIR/NAME.h5) or path to an .h5 file; 'synthetic' is made on first use."),
        click.option("--data-dir", default=default_data_dir, show_default="$UCMFH_DATA_DIR or data",
                     help="Folder of NAME.h5 dataset files."),
        click.option("--protocol", type=click.Choice(["both", *PROTOCOLS]), default="both", show_default=True,
                     help="unimodal: codes from one modality (cross-modal); fused: UCMFH's protocol."),
        click.option("--k", default=50, show_default=True, help="MAP@k cut-off."),
        click.option("--results", default="runs/results.jsonl", show_default=True,
                     help="JSON-lines file the result rows are appended to."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, ..."),
        click.option("--quiet", is_flag=True, help="No progress bars."),
    ]):
        fn = option(fn)
    return fn


def train_options(fn: Callable) -> Callable:
    defaults = FusionConfig()
    for option in reversed([
        click.option("--loss", default=defaults.loss, show_default=True, help="Loss name (see 'ucmfh losses')."),
        click.option("--loss-param", "loss_params", multiple=True, metavar="KEY=VALUE",
                     help="Loss hyper-parameter, e.g. temperature=0.1 (repeatable)."),
        click.option("--supervised", is_flag=True, help="Pass the training labels to the loss (pairwise uses them)."),
        click.option("--epochs", type=int, default=None, help="Epochs [default: 100, or the reference's for known datasets]."),
        click.option("--batch-size", default=defaults.batch_size, show_default=True),
        click.option("--seed", default=defaults.seed, show_default=True),
        click.option("--modality-dropout", default=defaults.modality_dropout, show_default=True,
                     help="Share of items trained with image and text kept apart (0 = UCMFH's fused-only training)."),
        click.option("--out", default="runs", show_default=True, help="Root folder of checkpoints."),
        click.option("--amp", type=click.Choice(AMP_MODES), default=defaults.amp, show_default=True,
                     help="Mixed-precision training: bf16 autocasts the forward pass (CPU with bf16 support, or GPU)."),
    ]):
        fn = option(fn)
    return fn


def default_epochs(dataset: str, epochs: Optional[int]) -> int:
    """``epochs``, else the reference code's for a known dataset name, else 100."""
    return epochs if epochs is not None else REFERENCE_EPOCHS.get(os.path.splitext(os.path.basename(dataset))[0], 100)


def report(rows: List[Dict[str, Any]], results: str) -> None:
    from ucmfh.app.experiment import append_results, format_table

    click.echo(format_table(rows))
    if results:
        os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
        append_results(results, rows)
        click.echo(f"results appended to {results}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ucmfh")
def main() -> None:
    """ucmfh: deep cross-modal hashing (UCMFH and its loss variants) on precomputed features."""


@main.command("make-synthetic")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--n-query", default=SyntheticSpec.n_query, show_default=True)
@click.option("--n-retrieval", default=SyntheticSpec.n_retrieval, show_default=True)
@click.option("--n-train", default=SyntheticSpec.n_train, show_default=True)
@click.option("--n-classes", default=SyntheticSpec.n_classes, show_default=True)
@click.option("--d-img", default=SyntheticSpec.d_img, show_default=True)
@click.option("--d-txt", default=SyntheticSpec.d_txt, show_default=True)
@click.option("--seed", default=SyntheticSpec.seed, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@user_errors
def make_synthetic_cmd(out: str, overwrite: bool, **sizes: int) -> None:
    """Write a deterministic synthetic dataset (MIRFlickr-shaped by default) to OUT."""
    path = make_synthetic(out, SyntheticSpec(**sizes), overwrite=overwrite)
    click.echo(f"wrote {path}")


@main.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
@user_errors
def validate_cmd(path: str) -> None:
    """Check a dataset file against the ucmfh HDF5 format."""
    attrs = validate_file(path)
    data = load_dataset(path, validate=False)
    click.echo(f"{path}: valid ({attrs.get('name', '?')}: d_img {data.d_img}, d_txt {data.d_txt}, "
               f"{data.n_classes} classes; train {len(data.train)}, query {len(data.query)}, "
               f"retrieval {len(data.retrieval)})")


@main.command("losses")
def losses_cmd() -> None:
    """List the loss names."""
    from ucmfh.losses import LOSSES

    for name, cls in LOSSES.items():
        click.echo(f"{name:<10} {(cls.__doc__ or '').strip().splitlines()[0]}")


def _load(dataset: str, data_dir: str):
    from ucmfh.app.experiment import resolve_dataset

    path = resolve_dataset(dataset, data_dir)
    click.echo(f"dataset: {path}")
    return load_dataset(path)


def fusion_config(dataset: str, device: str, loss: str, loss_params: Tuple[str, ...], supervised: bool,
                  epochs: Optional[int], batch_size: int, seed: int, modality_dropout: float, amp: str,
                  **_: Any) -> FusionConfig:
    """The fusion stage's config from the shared training options."""
    return FusionConfig(loss=loss, loss_params=parse_loss_params(loss_params), supervised=supervised,
                        epochs=default_epochs(dataset, epochs), batch_size=batch_size, seed=seed,
                        modality_dropout=modality_dropout, device=device, amp=amp).validate()


@main.command("train-fusion")
@data_options
@train_options
@click.option("--lr", default=FusionConfig.lr, show_default=True)
@user_errors
def train_fusion_cmd(dataset, data_dir, protocol, k, results, device, quiet, lr, **train) -> None:
    """Task 0: train the fusion encoder and score its embeddings (cosine ranking)."""
    from ucmfh.app.experiment import run_dir, train_fusion_stage

    data = _load(dataset, data_dir)
    cfg = fusion_config(dataset, device, **train)
    cfg.lr = lr
    out = run_dir(train["out"], data.name, cfg.loss, cfg.seed)
    report(train_fusion_stage(data, cfg, out, protocols_of(protocol), k, not quiet), results)


@main.command("train-hash")
@data_options
@train_options
@click.option("--n-bits", "-b", multiple=True, type=int, default=(64,), show_default=True,
              help="Code length (repeatable: -b 16 -b 32 ...).")
@click.option("--beta-schedule", type=click.Choice(["none", "hashnet", "step"]), default="none", show_default=True,
              help="Tanh continuation: none is UCMFH's plain tanh.")
@click.option("--fusion-epochs", type=int, default=None, help="Epochs of the fusion stage when it must be trained first.")
@click.option("--lr-fusion", type=float, default=HashConfig.lr_fusion, show_default=True,
              help="Learning rate of the fusion encoder while the heads train (UCMFH's; 0 keeps it as trained).")
@user_errors
def train_hash_cmd(dataset, data_dir, protocol, k, results, device, quiet, n_bits, beta_schedule, fusion_epochs,
                   lr_fusion, **train) -> None:
    """Task 1: train hash heads (training the fusion stage first if needed) and score the codes."""
    from ucmfh.app.experiment import run_dir, train_hash_stage

    data = _load(dataset, data_dir)
    fcfg = fusion_config(dataset, device, **{**train, "epochs": fusion_epochs if fusion_epochs is not None else train["epochs"]})
    out = run_dir(train["out"], data.name, fcfg.loss, fcfg.seed)
    rows = []
    for bits in n_bits:
        hcfg = HashConfig(n_bits=bits, loss=fcfg.loss, loss_params=fcfg.loss_params, supervised=fcfg.supervised,
                          epochs=default_epochs(dataset, train["epochs"]), batch_size=fcfg.batch_size,
                          seed=fcfg.seed, modality_dropout=fcfg.modality_dropout, beta_schedule=beta_schedule,
                          lr_fusion=lr_fusion, device=device, amp=fcfg.amp).validate()
        rows += train_hash_stage(data, fcfg, hcfg, out, protocols_of(protocol), k, not quiet, log=click.echo)
    report(rows, results)


@main.command("evaluate")
@data_options
@click.option("--checkpoint", "-c", type=click.Path(dir_okay=False),
              help="A fusion.pt or hashN.pt checkpoint.")
@click.option("--codes", type=click.Path(dir_okay=False),
              help="A codes file (ucmfh.codes.save_codes): every metric, both directions; no dataset needed.")
@click.option("--metrics-out", type=click.Path(dir_okay=False),
              help="With --codes: write all metrics as JSON here.")
@click.option("--plot", metavar="PREFIX", help="With --codes: draw PREFIX_pr.png and PREFIX_pk.png (needs matplotlib).")
@user_errors
def evaluate_cmd(dataset, data_dir, protocol, k, results, device, quiet, checkpoint, codes, metrics_out, plot) -> None:
    """Tasks 2/3: reload a checkpoint and score it on a dataset; or score a saved codes file."""
    if (checkpoint is None) == (codes is None):
        raise click.UsageError("give exactly one of --checkpoint and --codes")
    if codes is not None:
        from ucmfh.metrics import codes_file_row, evaluate_codes_file
        from ucmfh.utils import resolve_device

        metrics = evaluate_codes_file(codes, k=k, device=resolve_device(device))
        if metrics_out:
            os.makedirs(os.path.dirname(os.path.abspath(metrics_out)), exist_ok=True)
            with open(metrics_out, "w", encoding="utf-8") as f:
                json.dump(metrics, f, indent=1)
            click.echo(f"metrics written to {metrics_out}")
        row = codes_file_row(metrics)
        click.echo(f"{codes}: {row['n_bits']} bits, protocol {row['protocol']}: "
                   f"MAP@{k} I->T {row['map_i2t']:.4f}, T->I {row['map_t2i']:.4f}")
        if results:
            from ucmfh.app.experiment import append_results

            os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
            append_results(results, [row])
        if plot:
            from ucmfh.metrics.plots import plot_curves

            for path in plot_curves(metrics, plot):
                click.echo(f"wrote {path}")
        return
    from ucmfh.app.experiment import evaluate_checkpoint

    data = _load(dataset, data_dir)
    report(evaluate_checkpoint(data, checkpoint, protocols_of(protocol), k, device, progress=not quiet), results)


@main.command("encode")
@click.option("--dataset", "-d", default="synthetic", show_default=True, help="Dataset name or path to an .h5 file.")
@click.option("--data-dir", default=default_data_dir, show_default="$UCMFH_DATA_DIR or data")
@click.option("--checkpoint", "-c", required=True, type=click.Path(dir_okay=False), help="A hashN.pt checkpoint.")
@click.option("--protocol", type=click.Choice(PROTOCOLS), default="unimodal", show_default=True)
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False), help="Codes file to write (HDF5, packed bits).")
@click.option("--device", default="auto", show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bars.")
@user_errors
def encode_cmd(dataset, data_dir, checkpoint, protocol, out, device, quiet) -> None:
    """Write the query and retrieval codes of a hashing checkpoint to OUT (for 'evaluate --codes')."""
    from ucmfh.app.experiment import encode_checkpoint

    data = _load(dataset, data_dir)
    click.echo(f"wrote {encode_checkpoint(data, checkpoint, out, protocol, device, not quiet)} ({protocol} protocol)")


def _add_data_commands() -> None:
    from ucmfh.app.data_cli import convert, extract

    main.add_command(convert)
    main.add_command(extract)


_add_data_commands()

if __name__ == "__main__":
    sys.exit(main())
