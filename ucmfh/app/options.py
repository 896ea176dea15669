"""Options shared by the commands, and the settings they give: a flag maps onto a setting of the library
(:mod:`ucmfh.methods.settings` resolves them into configs), and a setting refused is refused as its flag."""
from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import click
import click.shell_completion

from ucmfh.app.environment import default_data_dir, torchrun_sizes
from ucmfh.config import AMP_MODES, CODE_LENGTHS, COUNT_MAX, PROTOCOLS, SEED, FusionConfig, HashConfig, SettingError

# The library's modules that import torch are imported where they are used: a command that reads results alone
# ('ucmfh runs') takes these options without importing torch, which takes seconds.
if TYPE_CHECKING:
    from ucmfh.app.identity import RunOptions

T = TypeVar("T")
DEFAULT_RESULTS = "runs/results.jsonl"  # where every command appends its rows, and runs and compare read them


def json_or_text(value: str) -> Any:
    """A value given on the command line: read as JSON where it parses (numbers, true/false, lists), else the text;
    True and False, as Python (and 'ucmfh methods') writes them, are the booleans too."""
    if value in ("True", "False"):
        return value == "True"
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def parse_params(pairs: Tuple[str, ...], option: str) -> Dict[str, Any]:
    """``key=value`` pairs to a dict; values are read as JSON when they parse (numbers, true/false). A key given
    twice is refused (one of the two would be dropped without a word)."""
    params: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        if key in params:
            raise click.BadParameter(f"{key} given twice ({key}={json.dumps(params[key])} and {pair}); give it once",
                                     param_hint=option)
        params[key] = json_or_text(value)
    return params


def parse_overrides(pairs: Tuple[str, ...]) -> Dict[str, Dict[str, Any]]:
    """``--set fusion.d_model=256 --set hash.hidden=1024`` -> {"fusion": {"d_model": 256}, "hash": {...}}, as
    :func:`ucmfh.methods.settings.stage_configs` takes its overrides (and checks them). One parameter of the loss
    or the method as ``compare`` and ``runs`` name it, ``hash.loss_params.temperature=0.1``, is that key of the
    setting's dict (it was refused: 'hash settings are ...'; a grid had no other way to a method's parameter)."""
    out: Dict[str, Dict[str, Any]] = {}
    for key, value in parse_params(pairs, "--set").items():
        stage, _, name = key.partition(".")
        field, dot, param = name.partition(".")
        if dot and param and field in ("loss_params", "method_params"):
            held = out.setdefault(stage, {}).setdefault(field, {})
            if not isinstance(held, dict) or param in held:
                raise click.BadParameter(f"{key}: given twice (also as {stage}.{field}); give it once",
                                         param_hint="--set")
            held[param] = value
        else:
            if isinstance(out.get(stage, {}).get(name), dict):  # 'hash.loss_params={...}' after one of its keys
                raise click.BadParameter(f"{key}: given twice (also as {key}.KEY); give it once", param_hint="--set")
            out.setdefault(stage, {})[name] = value
    return out


# The flag that gives each setting of ucmfh.methods.settings (a command's parameter of the same name): a
# setting refused is refused as its flag. A key of a dict setting (loss_params.temperature) is its flag's;
# an override (fusion.d_model) is --set's. In the order settings are blamed in (settings_of): the one whose addition
# makes a value refused, so a loss before its parameters, patience and refit before the validation split they need.
FLAGS = {"protocol": "--protocol", "loss": "--loss", "loss_params": "--loss-param", "supervised": "--supervised",
         "epochs": "--epochs", "fusion_epochs": "--fusion-epochs", "batch_size": "--batch-size", "seed": "--seed",
         "modality_dropout": "--modality-dropout", "patience": "--patience", "refit": "--refit",
         "val_fraction": "--val-fraction", "amp": "--amp", "device": "--device", "method_params": "--method-param",
         "beta_schedule": "--beta-schedule", "lr_fusion": "--lr-fusion", "lr": "--lr", "n_bits": "-b/--n-bits",
         "method": "--method", "overrides": "--set"}


def settings_of(params: Dict[str, Any]) -> Dict[str, Any]:
    """The settings a command's parameters give (each parameter named as its setting, FLAGS): ``KEY=VALUE``
    pairs as dicts, ``--set`` as overrides; an absent flag, none of the pairs and ``--protocol both`` are
    not given (left out). In FLAGS' order, whatever the command's: a value refused is blamed on the first
    setting whose addition makes it refused (:func:`ucmfh.methods.settings.stage_configs`), and a loss parameter
    the loss lacks is then ``--loss-param``'s in every command, not ``--loss``'s in some."""
    settings = {}
    for name in (name for name in FLAGS if name in params):
        value = params[name]
        if name in ("loss_params", "method_params"):
            value = parse_params(value, FLAGS[name]) or None
        elif name == "overrides":
            value = parse_overrides(value) or None
        elif (name, value) in (("protocol", "both"), ("supervised", False)):
            value = None
        if value is not None:
            settings[name] = value
    return settings


def flag_of(setting: str, flags: Dict[str, str] = FLAGS) -> str:
    """The flag that gives ``setting`` (``--loss-param`` for ``loss_params.temperature``, ``--set
    fusion.d_model`` for an override); ``flags``: a command's own where they differ (the grid's
    ``--losses``)."""
    name = setting.split(".")[0]
    return flags[name] if name in flags else f"--set {setting}"


def resolved(resolve: Callable[..., T], *args: Any, flags: Dict[str, str] = FLAGS, **kwargs: Any) -> T:
    """``resolve(*args, **kwargs)``, a function of :mod:`ucmfh.methods.settings`; a setting it refuses
    (:class:`SettingError`) is refused as the flag that gave it (exit 2)."""
    try:
        return resolve(*args, **kwargs)
    except SettingError as err:
        if err.instead is not None:  # an override repeating a setting with a flag of its own
            raise click.BadParameter(f"{err.setting!r}: use {flags[err.instead]}", param_hint="--set") from None
        flag = flag_of(err.setting, flags)
        raise click.BadParameter(str(err) + default_method_note(err.setting),
                                 param_hint="--set" if flag.startswith("--set ") else flag) from None


def default_method_note(setting: str, param: str = "method") -> str:
    """Words to add to the refusal of ``setting``, a fusion stage's, where the command's ``param`` (``--method``,
    the grid's ``--methods``) was left at its default, which trains no fusion stage: UCMFH's two stages are
    ``--method ucmfh`` (UCMFH was the default until 2026-11-23; its users' commands lack the flag); else ''."""
    from ucmfh.methods.settings import FUSION_ONLY

    context = click.get_current_context(silent=True)
    if context is None or param not in context.params or not (setting in FUSION_ONLY or setting.startswith("fusion.")):
        return ""
    if context.get_parameter_source(param) != click.core.ParameterSource.DEFAULT:
        return ""
    default = context.params[param]
    return f" ({', '.join(default) if isinstance(default, (list, tuple)) else default}: the default of --{param}; " \
           f"UCMFH's two stages: --{param} ucmfh)"


def check_precision(*cfgs: Any) -> None:
    """``--amp tf32`` refused before any work where a run of ``cfgs`` (None: no such stage) would train on the
    CPU (:func:`ucmfh.amp.check_amp`; its :class:`SettingError` is said as the flag)."""
    from ucmfh.amp import check_amp
    from ucmfh.utils import resolve_device

    for cfg in cfgs:
        if cfg is not None:
            check_amp(cfg.amp, resolve_device(cfg.device))


def given_flags(flags: Dict[str, str]) -> List[str]:
    """The flags of ``flags`` (a parameter's name -> its flag) that the command running was given on its command
    line, in that order: not those left at their defaults (a refusal names what the user typed)."""
    source = click.get_current_context().get_parameter_source
    return [flag for name, flag in flags.items() if source(name) == click.core.ParameterSource.COMMANDLINE]


def closed_form_notes(methods: Sequence[str]) -> List[str]:
    """A note for each method of ``methods`` fitted in closed form, where the command running was given options of
    training by epochs (curves, saves of the training state, a captured step) that it has no use for: they were
    taken without a word (--tensorboard made no folder). Refused, naming the flag, where no method of
    ``methods`` trains by epochs, as a setting no method uses is."""
    from ucmfh.methods.settings import trains_by_epochs

    graph = "--cuda-graph" if click.get_current_context().params.get("cuda_graph") else "--no-cuda-graph"
    flags = given_flags({"tensorboard": "--tensorboard", "save_interval": "--save-interval", "cuda_graph": graph})
    fitted = [name for name in methods if not trains_by_epochs(name)]
    if not flags or not fitted:
        return []
    if len(fitted) == len(set(methods)):
        raise click.BadParameter(f"{', '.join(map(repr, fitted))} {'is' if len(fitted) == 1 else 'are'} fitted in "
                                 "closed form: no epochs to draw, save or capture", param_hint=flags[0])
    them = "them" if len(flags) > 1 else "it"
    return [f"method {name!r}: {', '.join(flags)} not applied (it is fitted in closed form: no epochs); the other "
            f"methods apply {them}" for name in fitted]


def given_twice(values: Sequence[Any]) -> Any:
    """The first value of a list given on the command line that repeats an earlier one, else None: a typo as
    often as not ('1,1' for '1,11'), whose work would be asked for twice."""
    seen: set = set()
    return next((value for value in values if value in seen or seen.add(value)), None)


def _check_side_by_side(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value and torchrun_sizes()[0] > 1:  # two threads' collectives on one process group would interleave
        raise click.BadParameter("candidates side by side and torchrun's ranks do not mix: use one or the other")
    return value


def complete_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of an option that names a file (or a prefix of files' names): the shell's file names."""
    return [click.shell_completion.CompletionItem(incomplete, type="file")]


def complete_folders(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of an option that names a folder: the shell's folder names."""
    return [click.shell_completion.CompletionItem(incomplete, type="dir")]


def complete_datasets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list:
    """Shell completion of -d: the dataset names that --data-dir holds (its NAME.h5 files) and 'synthetic' where
    one begins so, else the shell's file names (a path to an .h5 file)."""
    folder = ctx.params.get("data_dir") or default_data_dir()
    try:
        files = os.listdir(folder)
    except OSError:  # no such folder (yet): only 'synthetic' is a name
        files = []
    names = {name[:-3] for name in files if name.endswith(".h5")} | {"synthetic"}
    return [*complete_files(ctx, param, incomplete),  # bash offers files only where no name matches
            *(click.shell_completion.CompletionItem(name) for name in sorted(names) if name.startswith(incomplete))]


def data_dir_option() -> Callable:
    """--data-dir, said alike by every command that reads datasets by name."""
    return click.option("--data-dir", default=default_data_dir, show_default="$UCMFH_DATA_DIR or data",
                        shell_complete=complete_folders, help="Folder of NAME.h5 dataset files.")


# what --device takes, said alike by every command that has it
DEVICE_HELP = "auto (CUDA when present), cpu, cuda, cuda:1, ..."


def device_option(default: str = "auto", help: str = DEVICE_HELP) -> Callable:
    """--device, checked as it is parsed (:func:`check_device`)."""
    return click.option("--device", default=default, show_default=True, callback=check_device, help=help)


def check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from ucmfh import distributed
    from ucmfh.utils import resolve_device

    try:
        distributed.check_device(resolve_device(value), *torchrun_sizes())
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return value


def known_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A device name torch knows and this machine has (:func:`ucmfh.utils.resolve_device`), as it is parsed: a
    command whose processes are shards of their own (extract), not one group's ranks (:func:`check_device`)."""
    from ucmfh.utils import resolve_device

    try:
        resolve_device(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    return value


# -d of a command that scores a checkpoint (evaluate, encode): no synthetic set is made for it
TRAINED_ON_HELP = "Dataset name or path to an .h5 file [default: the file the checkpoint was trained on]."


def data_options(fn: Callable, trained_on: bool = False) -> Callable:
    """-d, --data-dir, --protocol, --k and the outputs; ``trained_on``: -d's default is the file a checkpoint was
    trained on (evaluate -c), not the synthetic set."""
    for option in reversed([
        click.option("--dataset", "-d", default="synthetic", show_default=not trained_on,
                     shell_complete=complete_datasets,
                     help=TRAINED_ON_HELP if trained_on else
                     "Dataset name (DATA_DIR/NAME.h5) or path to an .h5 file; 'synthetic' is made on first use."),
        data_dir_option(),
        *scoring_options(),
        *output_options(),
    ]):
        fn = option(fn)
    return fn


def scoring_options(fn: Optional[Callable] = None) -> Any:
    """The protocols scored and MAP's cut-off, as every command that trains or scores takes them: a list of the
    two options, or, given a command's function, the function with both."""
    from ucmfh.metrics.arguments import DEFAULT_K

    if fn is not None:
        for option in reversed(scoring_options()):
            fn = option(fn)
        return fn
    return [click.option("--protocol", type=click.Choice(["both", *PROTOCOLS]), default="both", show_default=True,
                         help="unimodal: codes (or a fusion stage's embeddings) from one modality (cross-modal); "
                              "fused: UCMFH's protocol."),
            click.option("--k", "-k", default=DEFAULT_K, show_default=True, type=Count(min=1), help="MAP@k cut-off.")]


def output_options() -> List[Callable]:
    """--results, --device and --quiet, as every scoring command has them."""
    return [
        click.option("--results", default=DEFAULT_RESULTS, show_default=True, shell_complete=complete_files,
                     help="JSON-lines file the result rows are appended to ('': none kept)."),
        device_option(),
        click.option("--quiet", is_flag=True, help="No progress bars."),
    ]


# the results files a summary reads (`ucmfh runs`, `ucmfh compare`)
results_to_read = click.option(
    "--results", multiple=True, default=[DEFAULT_RESULTS], show_default=True, shell_complete=complete_files,
    help="A results file to read (repeatable: the rows of all are read as one, e.g. of grids run side by side).")


def row_filters(fn: Callable) -> Callable:
    """The filters of the rows a summary reads ('ucmfh runs', 'ucmfh compare'), declared once: -d, -b, --seed, -k
    and --protocol, each repeatable (:func:`ucmfh.app.runs.filter_rows` takes them as they are)."""
    for option in reversed([
        click.option("--dataset", "-d", multiple=True, help="Only these datasets (repeatable)."),
        click.option("--n-bits", "-b", multiple=True, type=CodeLength(*CODE_LENGTHS),
                     help="Only these code lengths (repeatable)."),
        click.option("--seed", multiple=True, type=int, help="Only these seeds (repeatable)."),
        click.option("-k", "--k", "k", multiple=True, type=Count(min=1),
                     help="Only rows scored at these MAP@k cut-offs (repeatable), as the training commands' -k."),
        click.option("--protocol", multiple=True, type=click.Choice(PROTOCOLS),
                     help="Only rows of this protocol (repeatable)."),
    ]):
        fn = option(fn)
    return fn


class FiniteRange(click.FloatRange):
    """click's FloatRange, refusing NaN and infinities (which pass its bounds: NaN compares false to both)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def candidates_problem(cfg: HashConfig) -> Optional[str]:
    """Why ``--candidates-side-by-side`` (the candidates a run chooses between on validation, trained at once)
    does nothing for a run of ``cfg``, or None where it trains candidates."""
    from ucmfh.methods import build_method

    if len(build_method(cfg.method).choices(cfg)) < 2:
        return f"method {cfg.method!r} trains one model here: it has no candidates to choose between on validation"
    if cfg.val_fraction <= 0:
        return f"without a validation split (--val-fraction 0) method {cfg.method!r} trains its first candidate alone"
    return None


class Count(click.IntRange):
    """click's IntRange, and at most :data:`ucmfh.config.COUNT_MAX`: a count beyond it (a batch of 10^20 items) is
    refused here, not after training has started, in a message naming no flag. Not a number: "'abc' is not a valid
    integer", where click's range said "is not a valid integer range"."""

    name = "integer"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if number > COUNT_MAX:
            self.fail(f"{value} is beyond any count here (at most {COUNT_MAX})", param, ctx)
        return number


class CodeLength(click.IntRange):
    """A code length (``-b``, repeatable), in click's range: '8,16' is said to be two lengths to give one a ``-b``,
    where click's message was "'8,16' is not a valid integer range"."""

    name = "integer"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and "," in value:
            lengths = [part.strip() for part in value.split(",") if part.strip()]
            self.fail(f"{value!r}: one code length a -b: " + " ".join(f"-b {n}" for n in lengths), param, ctx)
        return super().convert(value, param, ctx)


class InputPath(click.Path):
    """click's Path for a file or folder a command reads, refusing an empty value, which names none: ``-c ''``
    said ``: no such checkpoint``, and ``search ''`` searched the current folder."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value:
            self.fail(f"an empty path; give the {'file' if self.file_okay else 'folder'} to read", param, ctx)
        return super().convert(value, param, ctx)


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
        if not math.isfinite(size):
            self.fail(f"{value!r}: expected a finite size such as 500MB or 8GiB", param, ctx)
        if size <= 0:
            self.fail(f"{value!r}: must be positive", param, ctx)
        return int(size)


# the training commands' curves (train-fusion, train-hash, grid, train-seps)
tensorboard_option = click.option(
    "--tensorboard", metavar="DIR", shell_complete=complete_folders,
    help="Training curves: each epoch's loss, validation score, learning rate, beta (hashing) and seconds, as "
         "TensorBoard event files in DIR, a folder per run and stage (needs the tensorboard extra).")

# the training commands' captured steps (train-fusion, train-hash, grid, and demo.py's --cuda_graph)
cuda_graph_option = click.option(
    "--cuda-graph/--no-cuda-graph", default=None,
    help="On a GPU a training step is captured as a CUDA graph and replayed for each full batch, unless "
         "--no-cuda-graph (the fusion stage and every method trained by epochs, as 'ucmfh methods' says; in memory, "
         "one process, --amp none; other steps run eagerly; a captured step trains the eager step's model within "
         "float rounding). --cuda-graph asks for it: a note says before the epochs where a step runs eagerly and "
         "why [default: on a GPU].")

# what torch's generators take
seed_type = click.IntRange(SEED.low, SEED.high, max_open=SEED.high_open)


def train_options(command: str, without: Tuple[str, ...] = ()) -> Callable:
    """The training options of ``command`` ('train-fusion', 'train-hash' or 'grid'), each default said as
    that command has it; ``without``: options (by parameter name) the command has no use for."""
    from ucmfh.app.identity import RunOptions
    from ucmfh.data.h5 import DEFAULT_MAX_MEMORY

    defaults = FusionConfig()
    # train-hash and grid train a method, whose own defaults come first ('ucmfh methods')
    by_method = command != "train-fusion"
    unless = "; the method's if it has its own (see 'ucmfh methods')" if by_method else ""

    def methods_default(setting: str) -> str:
        """A default as the methods have it: the default method's and ucmfh's, the rest in 'ucmfh methods'
        (the help said FusionConfig's, 0 for --val-fraction, where the default method holds out a tenth)."""
        if not by_method:
            return f"{getattr(defaults, setting):g}"
        from ucmfh.methods import DEFAULT_METHOD
        from ucmfh.methods.settings import stage_configs

        said = {method: getattr(stage_configs(method).hashes[0], setting) for method in (DEFAULT_METHOD, "ucmfh")}
        if setting == "epochs":  # ucmfh's follow the dataset
            return (f"the method's (see 'ucmfh methods'): {said[DEFAULT_METHOD]} for {DEFAULT_METHOD}; ucmfh's and "
                    "a teacher's fusion stage: the reference's for known datasets, else 100")
        return "the method's (see 'ucmfh methods'): " + ", ".join(f"{value:g} for {method}"
                                                                  for method, value in said.items())
    stage = "fusion.d_model=256" if not by_method else "fusion.d_model=256 or hash.hidden=1024"
    options = {
        "loss": click.option("--loss", default=None, help="Loss name (see 'ucmfh losses') [default: "
                             + ("the method's (see 'ucmfh methods'); original for ucmfh]." if by_method
                                else f"{defaults.loss}].")),
        "loss_params": click.option("--loss-param", "loss_params", multiple=True, metavar="KEY=VALUE",
                                    help="Loss hyper-parameter, e.g. temperature=0.1 (repeatable)."),
        "supervised": click.option("--supervised", is_flag=True,
                                   help="Pass the training labels to the loss (pairwise uses them)."),
        "epochs": click.option("--epochs", type=Count(min=1), default=None,
                               help="Epochs [default: " + (methods_default("epochs") if by_method else
                                                           "the reference's for known datasets, else 100") + "]."),
        "batch_size": click.option("--batch-size", default=None, type=Count(min=2),
                                   help=f"Items per step [default: {defaults.batch_size}{unless}]."),
        "seed": click.option("--seed", default=defaults.seed, show_default=True, type=seed_type),
        "modality_dropout": click.option(
            "--modality-dropout", default=None, type=FiniteRange(0, 1),
            help=("Methods with a fusion stage (ucmfh, distill): " if by_method else "")
            + f"Share of items trained with image and text kept apart (0 = UCMFH's fused-only training) "
              f"[default: {defaults.modality_dropout}]."),
        "val_fraction": click.option(
            "--val-fraction", default=None, type=FiniteRange(0, 1, max_open=True),
            help=f"Share of the training split held out to pick the best epoch (0: keep the last epoch) "
                 f"[default: {methods_default('val_fraction')}]."),
        "patience": click.option("--patience", default=None, type=Count(min=0),
                                 help=f"With a validation split: stop after this many epochs without a better "
                                      f"validation score (0: never) [default: {methods_default('patience')}]."),
        "refit": click.option("--refit/--no-refit", default=None,
                              help="Once validation has chosen the epoch (and the candidate), train that setting "
                                   "again on the whole training split, validation items included, and keep that "
                                   f"model [default: off{unless}]."),
        "amp": click.option("--amp", type=click.Choice(AMP_MODES), default=None,
                            help="Mixed-precision training: bf16 autocasts the forward pass (CPU with bf16 support, "
                                 "or GPU); tf32 runs float32 matmuls on a GPU's tensor cores (CUDA, NVIDIA Ampere "
                                 f"or later) [default: {defaults.amp}]."),
        "overrides": click.option("--set", "overrides", multiple=True, metavar="STAGE.FIELD=VALUE",
                                  help=f"Any other setting, e.g. {stage}, or one parameter of "
                                       + ("the method or the loss, e.g. hash.method_params.temperatures=0.2"
                                          if by_method else "the loss, e.g. fusion.loss_params.temperature=0.5")
                                       + " (repeatable)."),
        "out": click.option("--out", default=RunOptions.out, show_default=True, shell_complete=complete_folders,
                            help="Root folder of runs (checkpoints)."),
        "resume": click.option("--resume", is_flag=True, help="Continue an interrupted run of the same settings "
                                                              "(finished stages are always reused)."),
        "save_interval": click.option("--save-interval", default=RunOptions.save_interval, show_default=True,
                                      type=FiniteRange(min=0),
                                      help="Seconds between saves of the training state (0: every epoch)."),
        "tensorboard": tensorboard_option,
        "cuda_graph": cuda_graph_option,
        "candidates_side_by_side": click.option(
            "--candidates-side-by-side", is_flag=True, callback=_check_side_by_side,
            help="Train the candidates a run chooses between on validation (two-tower's temperatures, relaxation "
                 "'auto') at once, each in a thread of this process on a CUDA stream of its own: on a GPU their "
                 "steps may run at once; the same models as one after another."),
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
    from ucmfh.app.identity import RunOptions

    return RunOptions(out=train["out"], resume=train["resume"], save_interval=train["save_interval"],
                      progress=not quiet, tensorboard=train["tensorboard"], cuda_graph=train["cuda_graph"],
                      candidates_side_by_side=train.get("candidates_side_by_side", False))
