"""Options shared by the commands, and the configs they build (the CLI stays thin)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import click

from ucmfh import distributed
from ucmfh.app.environment import default_data_dir, default_epochs, torchrun_sizes
from ucmfh.app.identity import RunOptions
from ucmfh.config import AMP_MODES, PROTOCOLS, SEED, FusionConfig, HashConfig, check_setting, with_defaults
from ucmfh.data.h5 import DEFAULT_MAX_MEMORY
from ucmfh.losses import build_loss
from ucmfh.metrics.arguments import DEFAULT_K
from ucmfh.methods import build_method
from ucmfh.utils import resolve_device

STAGES = {"fusion": FusionConfig, "hash": HashConfig}
DEFAULT_RESULTS = "runs/results.jsonl"  # where every command appends its rows, and runs and compare read them


def parse_params(pairs: Tuple[str, ...], option: str) -> Dict[str, Any]:
    """``key=value`` pairs to a dict; values are read as JSON when they parse (numbers, true/false)."""
    params: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


# settings with an option of their own, which --set must not replace behind its back
OWN_OPTIONS = {"n_bits": "-b/--n-bits", "method": "--method", "seed": "--seed", "device": "--device"}


def parse_overrides(pairs: Tuple[str, ...], stages: Tuple[str, ...] = tuple(STAGES)) -> Dict[str, Dict[str, Any]]:
    """``--set fusion.d_model=256 --set hash.hidden=1024`` -> {"fusion": {...}, "hash": {...}}; ``stages``:
    those the command trains (train-fusion trains no hashing stage)."""
    out: Dict[str, Dict[str, Any]] = {stage: {} for stage in STAGES}
    for key, value in parse_params(pairs, "--set").items():
        stage, _, name = key.partition(".")
        if stage not in stages:
            trains = f"this command trains no {stage} stage; " if stage in STAGES else ""
            raise click.BadParameter(f"{key!r}: {trains}expected {' or '.join(f'{s}.FIELD' for s in stages)}",
                                     param_hint="--set")
        fields = [f.name for f in dataclasses.fields(STAGES[stage])]
        if name in OWN_OPTIONS:  # one way to say each: --set would silently replace the option
            raise click.BadParameter(f"{key!r}: use {OWN_OPTIONS[name]}", param_hint="--set")
        if name not in fields:
            raise click.BadParameter(f"{key!r}: {stage} settings are {', '.join(fields)}", param_hint="--set")
        try:
            check_setting(STAGES[stage], name, value)  # its type and its range, whatever the other settings
        except ValueError as err:
            raise click.BadParameter(f"{key!r}: {err}", param_hint="--set") from None
        out[stage][name] = value
    return out


def blame_overrides(build: Callable[[Dict[str, Any]], Any], stage: str, overrides: Dict[str, Any]) -> Any:
    """``build(overrides)``, where ``overrides`` are the ``--set`` settings of ``stage`` ('' for a command of one
    stage). A ``ValueError`` that ``build({})`` does not raise comes of the overrides (``--set fusion.d_model=30``
    with 4 heads, ``--set hash.refit=true`` without a validation split): it is refused as ``--set``, naming those
    of them that raise it alone (else all). One that ``build({})`` raises too is another option's, raised as is."""
    try:
        return build(overrides)
    except ValueError as err:
        if not overrides:
            raise
        error = err
    build({})
    alone = [name for name in overrides if _raises(build, {name: overrides[name]})]
    names = ", ".join(repr(f"{stage}.{name}" if stage else name) for name in alone or overrides)
    raise click.BadParameter(f"{names}: {error}", param_hint="--set")


def _raises(build: Callable[[Dict[str, Any]], Any], overrides: Dict[str, Any]) -> bool:
    try:
        build(overrides)
    except ValueError:
        return True
    return False


def check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        distributed.check_device(resolve_device(value), *torchrun_sizes())
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return value


def data_options(fn: Callable) -> Callable:
    for option in reversed([
        click.option("--dataset", "-d", default="synthetic", show_default=True,
                     help="Dataset name (DATA_DIR/NAME.h5) or path to an .h5 file; 'synthetic' is made on first use."),
        click.option("--data-dir", default=default_data_dir, show_default="$UCMFH_DATA_DIR or data",
                     help="Folder of NAME.h5 dataset files."),
        click.option("--protocol", type=click.Choice(["both", *PROTOCOLS]), default="both", show_default=True,
                     help="unimodal: codes from one modality (cross-modal); fused: UCMFH's protocol."),
        click.option("--k", default=DEFAULT_K, show_default=True, type=click.IntRange(min=1), help="MAP@k cut-off."),
        *output_options(),
    ]):
        fn = option(fn)
    return fn


def output_options() -> List[Callable]:
    """--results, --device and --quiet, as every scoring command has them."""
    return [
        click.option("--results", default=DEFAULT_RESULTS, show_default=True,
                     help="JSON-lines file the result rows are appended to."),
        click.option("--device", default="auto", show_default=True, callback=check_device,
                     help="auto (CUDA when present), cpu, cuda, cuda:1, ..."),
        click.option("--quiet", is_flag=True, help="No progress bars."),
    ]


# the results files a summary reads (`ucmfh runs`, `ucmfh compare`)
results_to_read = click.option(
    "--results", multiple=True, default=[DEFAULT_RESULTS], show_default=True,
    help="A results file to read (repeatable: the rows of all are read as one, e.g. of grids run side by side).")


class ByteSize(click.ParamType):
    """A size in bytes: ``500MB``, ``8GiB``, ``1e9`` (k, M, G, T: powers of 1000; Ki, Mi, Gi, Ti: of 1024)."""

    name = "size"
    UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("b")
        number = text.rstrip("kmgti")
        unit = text[len(number):]
        try:
            size = float(number) * self.UNITS[unit]
        except (ValueError, KeyError):
            self.fail(f"{value!r}: expected a size such as 500MB or 8GiB", param, ctx)
        if size <= 0:
            self.fail(f"{value!r}: must be positive", param, ctx)
        return int(size)


# the training commands' curves (train-fusion, train-hash, grid, train-seps)
tensorboard_option = click.option(
    "--tensorboard", metavar="DIR",
    help="Training curves: each epoch's loss, validation score, learning rate, beta and seconds, as TensorBoard "
         "event files in DIR, a folder per run and stage (needs the tensorboard extra).")

# what torch's generators take
seed_type = click.IntRange(SEED.low, SEED.high, max_open=SEED.high_open)


def train_options(command: str, without: Tuple[str, ...] = ()) -> Callable:
    """The training options of ``command`` ('train-fusion', 'train-hash' or 'grid'), each default said as
    that command has it; ``without``: options (by parameter name) the command has no use for."""
    defaults = FusionConfig()
    # train-hash and grid train a method, whose own defaults come first ('ucmfh methods')
    by_method = command != "train-fusion"
    unless = "; the method's if it has its own (see 'ucmfh methods')" if by_method else ""
    stage = "fusion.d_model=256" if not by_method else "fusion.d_model=256 or hash.hidden=1024"
    options = {
        "loss": click.option("--loss", default=None, help="Loss name (see 'ucmfh losses') [default: "
                             + ("the method's (see 'ucmfh methods'); original for ucmfh]." if by_method
                                else f"{defaults.loss}].")),
        "loss_params": click.option("--loss-param", "loss_params", multiple=True, metavar="KEY=VALUE",
                                    help="Loss hyper-parameter, e.g. temperature=0.1 (repeatable)."),
        "supervised": click.option("--supervised", is_flag=True,
                                   help="Pass the training labels to the loss (pairwise uses them)."),
        "epochs": click.option("--epochs", type=click.IntRange(min=1), default=None,
                               help="Epochs [default: 100, or the reference's for known datasets"
                                    + ("; the method's if it has its own]." if by_method else "].")),
        "batch_size": click.option("--batch-size", default=None, type=click.IntRange(min=2),
                                   help=f"Items per step [default: {defaults.batch_size}{unless}]."),
        "seed": click.option("--seed", default=defaults.seed, show_default=True, type=seed_type),
        "modality_dropout": click.option(
            "--modality-dropout", default=None, type=click.FloatRange(0, 1),
            help=f"Share of items trained with image and text kept apart (0 = UCMFH's fused-only training) "
                 f"[default: {defaults.modality_dropout}]."),
        "val_fraction": click.option(
            "--val-fraction", default=None, type=click.FloatRange(0, 1, max_open=True),
            help=f"Share of the training split held out to pick the best epoch (0: keep the last epoch) "
                 f"[default: {defaults.val_fraction:g}{unless}]."),
        "patience": click.option("--patience", default=None, type=click.IntRange(min=0),
                                 help=f"With --val-fraction: stop after this many epochs without a better validation "
                                      f"score [default: {defaults.patience}{unless}]."),
        "refit": click.option("--refit/--no-refit", default=None,
                              help="Once validation has chosen the epoch (and the candidate), train that setting "
                                   "again on the whole training split, validation items included, and keep that "
                                   f"model [default: off{unless}]."),
        "amp": click.option("--amp", type=click.Choice(AMP_MODES), default=defaults.amp, show_default=True,
                            help="Mixed-precision training: bf16 autocasts the forward pass (CPU with bf16 support, "
                                 "or GPU)."),
        "overrides": click.option("--set", "overrides", multiple=True, metavar="STAGE.FIELD=VALUE",
                                  help=f"Any other setting, e.g. {stage} (repeatable)."),
        "out": click.option("--out", default="runs", show_default=True, help="Root folder of runs (checkpoints)."),
        "resume": click.option("--resume", is_flag=True, help="Continue an interrupted run of the same settings "
                                                              "(finished stages are always reused)."),
        "save_interval": click.option("--save-interval", default=RunOptions.save_interval, show_default=True,
                                      type=click.FloatRange(min=0),
                                      help="Seconds between saves of the training state (0: every epoch)."),
        "tensorboard": tensorboard_option,
        "max_memory": click.option("--max-memory", default=DEFAULT_MAX_MEMORY, type=ByteSize(),
                                   help="Features held in memory at most; the largest splits beyond it are read from "
                                        "the file as training goes (streamed) [default: 8GiB]."),
    }

    def decorate(fn: Callable) -> Callable:
        for name, option in reversed(list(options.items())):
            if name not in without:
                fn = option(fn)
        return fn

    return decorate


def run_options(train: Dict[str, Any], quiet: bool) -> RunOptions:
    return RunOptions(out=train["out"], resume=train["resume"], save_interval=train["save_interval"],
                      progress=not quiet, tensorboard=train["tensorboard"])


def fusion_config(dataset: str, device: str, loss: Optional[str], loss_params: Tuple[str, ...], supervised: bool,
                  epochs: Optional[int], batch_size: int, seed: int, modality_dropout: Optional[float], amp: str,
                  val_fraction: Optional[float] = None, patience: Optional[int] = None,
                  overrides: Tuple[str, ...] = (), lr: Optional[float] = None, **_: Any) -> FusionConfig:
    """The fusion stage's config from the shared training options (None: the config's default)."""
    values = dict(loss=loss, loss_params=parse_params(loss_params, "--loss-param"), supervised=supervised,
                  epochs=default_epochs(dataset, epochs), batch_size=batch_size, seed=seed,
                  modality_dropout=modality_dropout, device=device, amp=amp, val_fraction=val_fraction,
                  patience=patience, lr=lr)
    values = {k: v for k, v in values.items() if v is not None}
    return blame_overrides(lambda extra: check_loss(FusionConfig(**{**values, **extra})), "fusion",
                           parse_overrides(overrides)["fusion"])


def method_fusion_config(method: str, dataset: str, device: str, train: Dict[str, Any],
                         fusion_epochs: Optional[int] = None) -> FusionConfig:
    """The fusion stage's config for a hashing method. A method that shares the fusion stage's options
    ('ucmfh') shares every training option with it. For another method ``--loss`` is the method's own;
    the fusion stage of a teacher ('distill') shares the validation options, else takes the method's
    ``fusion_defaults`` (``--set fusion.FIELD=...`` reaches it too)."""
    spec = build_method(method)
    settings = {**train, "epochs": fusion_epochs or train["epochs"]}
    if not spec.shares_fusion_options:
        # the student's validation options reach its teacher; a method without a fusion stage
        # passes none of its own (they may not suit a fusion config, which it never trains)
        given = {name: settings[name] for name in ("val_fraction", "patience")
                 if settings.get(name) is not None and spec.uses_fusion}
        settings.update(loss=None, loss_params=(), val_fraction=None, patience=None)
        settings.update(with_defaults(spec.fusion_defaults, given))
    return fusion_config(dataset, device, **settings)


def hash_epochs(method: str, dataset: str, epochs: Optional[int]) -> Optional[int]:
    """The hashing stage's epochs: a method that shares the fusion stage's options ('ucmfh') follows
    the reference's per dataset; another takes ``--epochs`` when given, else its own default (None)."""
    return default_epochs(dataset, epochs) if build_method(method).shares_fusion_options else epochs


# what a method that shares the fusion stage's options ('ucmfh') takes from its fusion stage's config
SHARED_WITH_FUSION = ("loss", "loss_params", "supervised", "batch_size", "seed", "modality_dropout", "device", "amp",
                      "val_fraction", "patience")


def hash_configs(fusion_cfg: FusionConfig, n_bits: Iterable[int], epochs: Optional[int],
                 overrides: Tuple[str, ...] = (), method: str = "ucmfh", train: Optional[Dict[str, Any]] = None,
                 **settings: Any) -> List[HashConfig]:
    """One hashing config per code length (each checked now).

    A method that shares the fusion stage's options ('ucmfh') takes its training settings from it.
    Another method starts from its own defaults (:meth:`ucmfh.methods.Method.config`) and takes only
    the settings given: the raw training options ``train``, where None means not given; seed, device
    and precision always come from ``fusion_cfg``. ``epochs`` None is the method's default.
    A loss given to a method that has its own is refused (``--loss``).
    """
    spec = build_method(method)
    if spec.shares_fusion_options:
        base = {name: getattr(fusion_cfg, name) for name in SHARED_WITH_FUSION}
    else:
        train = train or {}
        if not spec.takes_loss and (train.get("loss") is not None or train.get("loss_params")):
            raise click.BadParameter(f"method {method!r} has a loss of its own; --loss and --loss-param do not "
                                     "apply to it", param_hint="--loss")
        given = dict(loss=train.get("loss"), val_fraction=train.get("val_fraction"), patience=train.get("patience"),
                     refit=train.get("refit"), modality_dropout=train.get("modality_dropout"),
                     loss_params=parse_params(train.get("loss_params", ()), "--loss-param") or None)
        base = {k: v for k, v in given.items() if v is not None}
        base.update({name: getattr(fusion_cfg, name) for name in ("supervised", "seed", "device", "amp")})
        if train.get("batch_size") is not None:
            base["batch_size"] = train["batch_size"]
    if epochs is not None:
        base["epochs"] = epochs
    params = parse_params((train or {}).get("method_params", ()), "--method-param")

    def build(extra: Dict[str, Any]) -> List[HashConfig]:
        if params:
            extra = {**extra, "method_params": {**extra.get("method_params", {}), **params}}
        return [check_loss(spec.config(**{**base, **settings, "n_bits": bits, **extra}))
                for bits in dict.fromkeys(n_bits)]

    return blame_overrides(build, "hash", parse_overrides(overrides)["hash"])


# options a method without a fusion stage has no use for, and those a method fitted in closed form ignores
FUSION_OPTIONS = ("--fusion-epochs", "--lr-fusion", "--modality-dropout")
EPOCH_OPTIONS = ("--epochs", "--batch-size", "--val-fraction", "--patience", "--refit", "--amp", "--beta-schedule",
                 "--supervised")


def check_method_options(method: str, protocol: str, given: Dict[str, bool]) -> None:
    """Refuse what a method would ignore: ``--protocol fused`` for a leak-free method (it has no fused
    view), the options of a fusion stage (FUSION_OPTIONS, ``--set fusion.*``) for a method that trains
    none, the options of epochs (EPOCH_OPTIONS) for a method fitted in closed form. ``given``: option ->
    whether the command line gave it."""
    spec = build_method(method)
    if protocol == "fused" and spec.leak_free:
        raise click.BadParameter(f"method {method!r} is leak-free: its codes have no fused view (scored under "
                                 "unimodal only)", param_hint="--protocol")
    unused = unused_options(method, given)
    if unused:
        option, why = next(iter(unused.items()))
        raise click.BadParameter(f"method {method!r} {why}: it has no use for it", param_hint=option)


def unused_options(method: str, given: Dict[str, bool]) -> Dict[str, str]:
    """The options given (``given``: option -> whether the command line gave it) that ``method`` has no use
    for, each with why: those of a fusion stage (FUSION_OPTIONS, ``--set fusion.*``) for a method that trains
    none, those of epochs (EPOCH_OPTIONS) for a method fitted in closed form."""
    spec = build_method(method)
    unused = {}
    for option in (name for name, was_given in given.items() if was_given):
        if not spec.uses_fusion and (option in FUSION_OPTIONS or option.startswith("--set fusion.")):
            unused[option] = "trains no fusion stage"
        elif spec.closed_form and option in EPOCH_OPTIONS:
            unused[option] = "is fitted in closed form"
    return unused


def given_options(context: click.Context, overrides: Tuple[str, ...]) -> Dict[str, bool]:
    """Each option of the command -> whether the command line gave it; ``--set fusion.FIELD`` for each
    fusion setting given by ``--set`` (for :func:`check_method_options`)."""
    given = {"--" + p.name.replace("_", "-"): context.get_parameter_source(p.name).name == "COMMANDLINE"
             for p in context.command.params}
    given.update({f"--set fusion.{name}": True for name in parse_overrides(overrides)["fusion"]})
    return given


def check_loss(cfg: Any) -> Any:
    """``cfg``, after building its loss once (a method with a loss of its own has none to check): an unknown
    loss, parameter or value is refused before anything is read or trained (``ValueError`` naming it)."""
    if isinstance(cfg, HashConfig) and not build_method(cfg.method).takes_loss:
        return cfg
    build_loss(cfg.loss, **cfg.loss_params)
    return cfg
