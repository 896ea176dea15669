"""Settings of each stage: the one home of defaults.

The values follow UCMFH's reference code (docs/reference.md §2) except where
that code is defective; every departure is named in a comment. A config checks
itself when it is made (``ValueError`` naming the setting), so an invalid one
never exists; change one with :func:`dataclasses.replace`, which checks again.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Union

PROTOCOLS = ("unimodal", "fused")
EXPECTED = "_expected"  # the suffix of a result's field whose tie-aware twin it is
BETA_SCHEDULES = ("none", "hashnet", "step")
AMP_MODES = ("none", "bf16", "tf32")
CODE_LENGTHS = (8, 256)  # the shortest and the longest code, in bits
# How training relaxes the codes: 'tanh' trains on tanh(beta * logits) (UCMFH); 'sign' trains on
# sign(tanh(logits)) itself, with tanh's gradient passed straight through the sign (Greedy Hash, Su et
# al., NeurIPS 2018), so the loss sees the codes that are searched; 'auto' trains one run with each of
# RELAXATION_CANDIDATES and keeps the one with the better validation score (without a validation split,
# val_fraction = 0, it trains the first candidate alone); 'none' trains no codes: the loss sees the
# L2-normalised head outputs, a real-valued embedding that validation ranks by cosine, and the codes are
# their signs, which training never saw (a row's `real_valued` figures measure that embedding).
RELAXATION_CANDIDATES = ("sign", "tanh")
RELAXATIONS = (*RELAXATION_CANDIDATES, "auto", "none")

# Epochs of the reference code per dataset: the default epochs of a run on a dataset of that name
# (default_epochs); the trainer never looks at a dataset's name.
REFERENCE_EPOCHS = {"mirflickr": 100, "nuswide": 150, "mscoco": 500, "coco": 500}  # by name, its letters alone


class SettingError(ValueError):
    """A setting refused. The message says why; ``settings`` names the settings refused (``loss``,
    ``loss_params.temperature``, ``fusion.d_model``: an override of a stage's setting), several when they
    are refused together; ``instead``, the setting to give in place of an override that repeats one
    (``hash.seed`` is ``seed``)."""

    def __init__(self, settings: Union[str, Sequence[str]], message: str, instead: Optional[str] = None) -> None:
        super().__init__(message)
        self.settings = (settings,) if isinstance(settings, str) else tuple(settings)
        self.instead = instead

    @property
    def setting(self) -> str:
        """The (first) setting refused."""
        return self.settings[0]


@dataclass
class FusionConfig:
    """Fusion stage (task 0): the two-token Transformer and its training."""

    # architecture
    d_model: int = 512  # per-modality token width; UCMFH's 1024-d token is two 512-d halves
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 1024  # UCMFH: 1024-d token, 2048-d feed-forward; the same 2:1 ratio per token
    dropout: float = 0.1
    # Share of training items whose two tokens may not attend to each other,
    # so the encoder learns to embed one modality alone (the unimodal
    # protocol). 0 trains only UCMFH's fused view.
    modality_dropout: float = 0.5
    # training
    loss: str = "original"
    loss_params: Dict[str, Any] = field(default_factory=dict)
    # pass the training labels to the loss (only 'pairwise' uses them): supervised hashing
    supervised: bool = False
    epochs: int = 100
    batch_size: int = 128
    lr: float = 1e-4
    betas: tuple = (0.5, 0.999)
    seed: int = 2023
    device: str = "auto"
    # mixed precision of the training forward pass: 'bf16' runs matmuls under
    # torch.autocast in bfloat16 (weights, optimizer and losses stay float32)
    amp: str = "none"
    # model selection on a validation split carved from the training split (seeded by `seed`; the
    # items of one id stay together): after each epoch, unimodal MAP@50 of the validation items
    # against the rest; the best epoch's weights are kept. 0 trains on every item, keeps the last epoch.
    val_fraction: float = 0.0
    patience: int = 0  # with a validation split: stop after this many epochs without improvement (0: never)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "FusionConfig":
        """Check every setting and what one asks of another (``ValueError`` naming it); returns the config."""
        _check_settings(self)
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads must divide d_model (each head attends over d_model / n_heads dimensions), "
                             f"got n_heads={self.n_heads} and d_model={self.d_model}")
        _check_training(self)
        return self


@dataclass
class HashConfig:
    """Hashing stage (task 1): how codes are learnt (``method``) and its settings.

    The defaults are UCMFH's (docs/reference.md §2). A method (:mod:`ucmfh.methods`) starts from its own
    departures from them (``ucmfh.methods.hash_config``) and checks what it cannot train; its own
    hyper-parameters are ``method_params`` (UCMFH's ``code_weight``, distill's ``teacher_weight``...). A field a
    method has no use for is kept but does nothing (``lr_fusion`` and ``modality_dropout`` are UCMFH's).
    """

    method: str = "ucmfh"  # a name of ucmfh.methods.METHODS
    method_params: Dict[str, Any] = field(default_factory=dict)  # the method's own (ucmfh.methods.Method.params)
    n_bits: int = 64
    hidden: int = 4096  # 0: a linear head
    dropout: float = 0.3
    modality_dropout: float = 0.5  # as in FusionConfig, for the fusion encoder trained on in this stage
    # tanh continuation (docs/reference.md §5): 'none' is UCMFH's plain tanh (beta = 1),
    # 'hashnet' beta = (1 + gamma * iter) ** 0.5 recomputed every `beta_step_iters` iterations,
    # 'step' beta = (epoch // beta_step_epochs + 1) ** 0.5 (DeepHash-pytorch).
    relaxation: str = "tanh"  # one of RELAXATIONS; the beta schedule applies to 'tanh'
    beta_schedule: str = "none"
    beta_gamma: float = 0.005
    beta_step_iters: int = 200
    beta_step_epochs: int = 20
    loss: str = "original"
    loss_params: Dict[str, Any] = field(default_factory=dict)
    supervised: bool = False  # as in FusionConfig
    epochs: int = 100
    batch_size: int = 128
    lr_fusion: float = 1e-4
    lr_head: float = 1e-3
    betas: tuple = (0.5, 0.999)
    seed: int = 2023
    device: str = "auto"
    amp: str = "none"  # as in FusionConfig
    val_fraction: float = 0.0  # as in FusionConfig (codes ranked by Hamming distance)
    patience: int = 0  # as in FusionConfig
    # once validation has chosen the epoch (and the candidate, where the method chooses one), train that
    # setting again on the whole training split, validation items included, for as many epochs; the
    # model kept is that one (needs a validation split; a method fitted in closed form has nothing to refit)
    refit: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "HashConfig":
        """Check every setting and what one asks of another (``ValueError`` naming it); returns the config."""
        _check_settings(self)
        _check_training(self)
        if self.refit and not self.val_fraction:
            raise ValueError("refit needs a validation split to choose the epoch (val_fraction > 0), got "
                             f"refit={self.refit}, val_fraction={self.val_fraction}")
        return self


# the stages a run trains, by the name their settings take in overrides ('fusion.lr', 'hash.lr_head')
STAGES = {"fusion": FusionConfig, "hash": HashConfig}


# SEPS (docs/reference.md §8, docs/seps.md): which form of the model, how the patch selection learns,
# where a dense description of an image may come from.
SEPS_VERSIONS = ("code", "paper")
# what a pair's aggregated and extra tokens weigh: the L2-normalised projected patches (ucmfh's reading of §8), or
# the raw projected ones, normalised after aggregation, with no global token added where the image has no
# [CLS] (the released CrossSparseAggrNet_v2's); docs/seps.md, departures 6 and 7
SEPS_AGGREGATES = ("normalised", "raw")
SEPS_SELECTIONS = {
    "frozen": "the released code: scores under no_grad, a hard top-K; nothing in the selection learns (defect 2)",
    "learned": "hard top-K forward; backward through a sigmoid of each score's margin to the K-th (straight "
               "through), and the masked aggregation passes gradient to every kept or dropped patch",
    "gumbel": "the paper's option: straight-through Gumbel-softmax over the patches (noise while training)",
}
DENSE_TEXT = {
    "none": "no dense text",
    "image": "the description of the candidate image being scored (leak-free)",
    "leak": "the description of the caption's own image, for every candidate (the released code; leaks the answer)",
}


@dataclass
class SepsConfig:
    """The SEPS matcher (docs/reference.md §8) and its training on frozen tokens.

    ``version`` 'code' is the released code (score = s_im + s_st, HRPA with LeakyReLU(0.1), with dense
    text two branches whose similarities add); 'paper' the paper (predictor MLP and β, plain cosine
    HRPA with top-K MLPs, one joint aggregation). Training follows the released code (AdamW, 30
    epochs, batch 128) but for the learning rate, 1e-3 (chosen on validation, docs/seps.md), and
    keeps the best epoch on a validation tenth of the training split (R@1+R@5+R@10 of both
    directions), never on the query split.
    """

    version: str = "code"
    selection: str = "learned"  # one of SEPS_SELECTIONS; 'frozen' reproduces defect 2
    dense_text: str = "none"  # one of DENSE_TEXT; used only when the file has dense_text_tokens
    embed_dim: int = 512  # the linear projection of each side's tokens
    keep_ratio: float = 0.5  # ρ: K = ceil(N ρ) patches kept
    aggr_ratio: float = 0.4  # N_c = int(N ρ aggr_ratio) aggregated tokens
    aggr_hidden_ratio: float = 0.2  # TokenAggregation's hidden width, × embed_dim
    beta: float = 0.25  # paper: weight of the attention scores against the predictor
    select_temperature: float = 0.1  # 'learned': sigmoid slope; 'gumbel': softmax temperature
    hrpa_top_k: int = 5  # paper: top-K row / column maxima into an MLP
    margin: float = 0.2  # VSE++ hinge
    max_violation_from: int = 1  # the epoch (0-based) from which only the hardest negative counts
    ratio_weight: float = 2.0  # 'learned': (mean(soft mask) − ρ)², the one form with a gradient
    aggregate: str = "normalised"  # one of SEPS_AGGREGATES; 'raw' is the released code's
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3  # departure: the released code's 2e-4 fine-tunes backbones; chosen on validation (docs/seps.md)
    weight_decay: float = 1e-4
    val_fraction: float = 0.1
    patience: int = 5
    pair_chunk: int = 8192  # image–text pairs scored at a time when scoring a database
    seed: int = 2023
    device: str = "auto"
    amp: str = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "SepsConfig":
        """Check every setting and what one asks of another (``ValueError`` naming it); returns the config."""
        _check_settings(self)
        _check_training(self)
        return self


SEARCH_BACKENDS = ("exact", "mih", "faiss-ivf", "faiss-hnsw")
INDEX_CHUNK_SIZE = 16384  # items an index build encodes and commits at a time (a killed build resumes there)
APPROXIMATE_BACKENDS = ("faiss-ivf", "faiss-hnsw")  # the others return the exact top k


@dataclass
class BackendConfig:
    """How a search ranks the items (docs/search.md): ``exact`` Hamming top-k by a scan of every code (the
    default); ``mih``, the same top k by multi-index hashing (:mod:`ucmfh.search.mih`: the substring tables
    built on first use and cached in the index folder; the scan where probing would cost more); or a FAISS
    approximate index over the same packed codes (``faiss-ivf``: ``IndexBinaryIVF``; ``faiss-hnsw``:
    ``IndexBinaryHNSW``), built on first use and cached in the index folder.

    ``nlist`` and ``hnsw_m`` are built into the cached index; ``nprobe`` and ``ef_search`` are per search.
    """

    backend: str = "exact"
    nlist: Optional[int] = None  # IVF lists; None: round(sqrt(items))
    nprobe: int = 16  # IVF lists visited per query
    train_per_list: int = 40  # IVF training codes per list (evenly spaced over the items); FAISS asks >= 39
    hnsw_m: int = 32  # HNSW neighbours per node
    ef_construction: int = 40  # HNSW candidate list while adding
    ef_search: int = 64  # HNSW candidate list per query (raised to k when smaller)
    substrings: Optional[int] = None  # mih: substrings per code; None: about n_bits / log2(items)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "BackendConfig":
        """Check every setting and what one asks of another (``ValueError`` naming it); returns the config."""
        _check_types(self)
        if self.backend not in SEARCH_BACKENDS:
            raise ValueError(f"backend must be one of {SEARCH_BACKENDS}, got {self.backend!r}")
        for name in ("nprobe", "train_per_list", "hnsw_m", "ef_construction", "ef_search"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.nlist is not None and self.nlist < 1:
            raise ValueError(f"nlist must be >= 1, got {self.nlist}")
        if self.substrings is not None and self.substrings < 1:
            raise ValueError(f"substrings must be >= 1, got {self.substrings}")
        return self


# the backends each setting of BackendConfig serves (``check_recall``: a search's, the approximate ones')
BACKEND_SETTINGS = {"nlist": ("faiss-ivf",), "nprobe": ("faiss-ivf",), "train_per_list": ("faiss-ivf",),
                    "hnsw_m": ("faiss-hnsw",), "ef_construction": ("faiss-hnsw",), "ef_search": ("faiss-hnsw",),
                    "substrings": ("mih",), "check_recall": APPROXIMATE_BACKENDS}


def backend_config(backend: Any, **settings: Any) -> BackendConfig:
    """A search's backend from what a caller gives: None (``exact``), a name as the CLI's ``--backend`` takes
    (``"mih"``, as one writes it coming from FAISS) or a :class:`BackendConfig` (for its other settings);
    anything else is a TypeError, an unknown name a ValueError. With a name, ``settings`` (None: not given)
    are its other settings; one the backend has no use for is refused (:class:`SettingError` naming it)."""
    if backend is None and not any(v is not None for v in settings.values()):
        return BackendConfig()
    if backend is None or isinstance(backend, str):
        name = backend or BackendConfig.backend
        given = {k: v for k, v in settings.items() if v is not None and v is not False}
        for key in given:
            if key not in BACKEND_SETTINGS:
                raise SettingError(key, f"unknown search setting {key!r}; settings are {', '.join(BACKEND_SETTINGS)}")
            if name not in BACKEND_SETTINGS[key]:
                raise SettingError(key, f"{key} does not apply to backend {name!r} (it is "
                                        f"{' and '.join(map(repr, BACKEND_SETTINGS[key]))}'s)")
        given.pop("check_recall", None)
        return BackendConfig(backend=name, **given)
    if isinstance(backend, BackendConfig):
        return backend
    raise TypeError(f"backend must be a name ({', '.join(SEARCH_BACKENDS)}) or a BackendConfig, "
                    f"got {type(backend).__name__}")


# what a setting's default's type accepts (an int where a float is expected; a JSON list for a tuple)
_ACCEPTS = {bool: (bool,), int: (numbers.Integral,), float: (numbers.Real,), str: (str,), tuple: (tuple, list),
            dict: (dict,)}
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list",
          dict: "a dict"}


def check_type(cls: type, name: str, value: Any) -> None:
    """Refuse a value of another type than the setting's default (``ValueError`` naming both), e.g.
    ``hidden='abc'``; a setting whose default is None takes anything its own check allows."""
    default = _default(cls, name)
    kind = type(default)
    if default is None or kind not in _ACCEPTS:
        return
    if isinstance(value, bool) and kind is not bool or not isinstance(value, _ACCEPTS[kind]):
        raise ValueError(f"{name} must be {_NAMES[kind]}, got {value!r}")


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _check_types(cfg: Any) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        check_type(type(cfg), f.name, value)
        default = _default(type(cfg), f.name)
        if isinstance(value, list) and isinstance(default, tuple):
            setattr(cfg, f.name, tuple(value))  # as a checkpoint's JSON gives it back
        if isinstance(default, float) and isinstance(value, numbers.Real) and not isinstance(value, (bool, float)):
            setattr(cfg, f.name, float(value))  # --set x=0 and --x 0 are one setting, one run (not 0 and 0.0)
        elif isinstance(default, int) and isinstance(value, numbers.Integral) and type(value) not in (bool, int):
            # numpy's integers: a checkpoint's settings are JSON (its n_bits of numpy.arange failed at the save)
            setattr(cfg, f.name, int(value))


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: finite, from ``low`` to ``high`` (None: unbounded), each end
    included unless it is open; ``why`` says what the bound is for."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False  # NaN compares False with everything: it would pass a check written as `value < low`
        return ((self.low is None or (self.low < value if self.low_open else self.low <= value))
                and (self.high is None or (value < self.high if self.high_open else value <= self.high)))

    def broken_by(self, value: Any) -> str:
        """The range as a refusal of ``value`` states it: whole, or where its upper end is only :data:`COUNT_MAX`
        (a count's sanity bound) and the value is below it, its lower end alone (``>= 1``, not ``in [1,
        2147483647]``)."""
        if self.high == COUNT_MAX and isinstance(value, numbers.Real) and value <= self.high:
            return str(dataclasses.replace(self, high=None, high_open=False))
        return str(self)

    def __str__(self) -> str:
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {self.low}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
        return text + (f" ({self.why})" if self.why else "")


POSITIVE, NON_NEGATIVE = Range(0, low_open=True), Range(0)
# the largest count a setting may be (epochs, items a batch, a layer's width): beyond it torch's int64 sizes
# overflow mid-run
COUNT_MAX = 2**31 - 1
COUNT = Range(1, COUNT_MAX)
SHARE, SHARE_BELOW_ONE = Range(0, 1), Range(0, 1, high_open=True)
SEED = Range(0, 2**32, high_open=True, why="what torch's, numpy's and scikit-learn's generators all take")


def _betas(name: str, value: Any) -> None:
    """Adam's betas: two decay rates, each in [0, 1) (torch refuses others only once the optimizer is made)."""
    if (len(value) != 2 or any(isinstance(b, bool) or not isinstance(b, numbers.Real) for b in value)
            or not all(b in SHARE_BELOW_ONE for b in value)):
        raise ValueError(f"{name} must be two numbers, each in [0, 1) (Adam's decay rates), got {list(value)!r}")


def _name(name: str, value: Any) -> None:
    if not value:
        raise ValueError(f"{name} must be a method's name, got {value!r}")


def _device(name: str, value: Any) -> None:
    """A device's spelling; whether this machine has it is decided where it is used (ucmfh.utils.resolve_device)."""
    if value != "auto" and not re.fullmatch(r"(cpu|cuda)(:[0-9]+)?", value):  # as torch.device spells them
        raise ValueError(f"{name} must be auto, cpu, cuda or cuda:N, got {value!r}")


# Each setting's own range: a Range, the tuple of its choices, or a function that raises ValueError. What a
# setting asks of another (n_heads must divide d_model) is its config's validate()'s. Settings not listed take
# every value of their type: the booleans,
# `loss` and `loss_params` (checked by building the loss: ucmfh.losses.build_loss), `method_params` (checked by
# the method: ucmfh.methods.Method.check).
_TRAINING = {"epochs": COUNT, "batch_size": Range(2, COUNT_MAX, why="contrastive losses need negatives"),
             "seed": SEED, "amp": AMP_MODES, "val_fraction": SHARE_BELOW_ONE, "patience": NON_NEGATIVE,
             "device": _device}
SETTINGS: Dict[type, Dict[str, Any]] = {
    FusionConfig: {
        "d_model": COUNT, "n_layers": COUNT, "n_heads": COUNT, "d_ff": COUNT,
        "dropout": SHARE_BELOW_ONE, "modality_dropout": SHARE, "lr": POSITIVE, "betas": _betas, **_TRAINING},
    HashConfig: {
        "method": _name, "n_bits": Range(*CODE_LENGTHS), "hidden": Range(0, COUNT_MAX, why="0: a linear head"),
        "dropout": SHARE_BELOW_ONE, "modality_dropout": SHARE,
        "relaxation": RELAXATIONS, "beta_schedule": BETA_SCHEDULES, "beta_gamma": NON_NEGATIVE,
        "beta_step_iters": COUNT, "beta_step_epochs": COUNT,
        "lr_fusion": Range(0, why="0 keeps the fusion encoder as trained"),
        "lr_head": POSITIVE, "betas": _betas, **_TRAINING},
    SepsConfig: {
        "version": SEPS_VERSIONS, "selection": tuple(SEPS_SELECTIONS), "dense_text": tuple(DENSE_TEXT),
        "aggregate": SEPS_AGGREGATES,
        "embed_dim": COUNT, "keep_ratio": Range(0, 1, low_open=True), "aggr_ratio": Range(0, 1, low_open=True),
        "aggr_hidden_ratio": POSITIVE, "beta": Range(0, 0.5, why="the predictor's weight is 1 − 2β"),
        "select_temperature": POSITIVE, "hrpa_top_k": COUNT, "margin": NON_NEGATIVE,
        "max_violation_from": NON_NEGATIVE, "ratio_weight": NON_NEGATIVE, "lr": POSITIVE,
        "weight_decay": NON_NEGATIVE, "pair_chunk": COUNT, **_TRAINING},
}


def raises(build: Callable[..., Any], *args: Any) -> bool:
    """Whether ``build(*args)`` refuses what it is given (raises a ``ValueError``)."""
    try:
        build(*args)
    except ValueError:
        return True
    return False


def blame_overrides(build: Callable[[Dict[str, Any]], Any], overrides: Dict[str, Any]) -> Any:
    """``build(overrides)``. A ``ValueError`` that ``build({})`` does not raise comes of the overrides (``d_model``
    that ``n_heads`` does not divide): a :class:`SettingError` naming those of them that raise it alone, else all.
    One that ``build({})`` raises too is another setting's, raised as it is."""
    try:
        return build(overrides)
    except ValueError as err:
        if not overrides:
            raise
        error = err
    build({})
    names = [name for name in overrides if raises(build, {name: overrides[name]})] or list(overrides)
    raise SettingError(names, f"{', '.join(map(repr, names))}: {error}") from None


def seps_config(settings: Dict[str, Any], overrides: Dict[str, Any]) -> SepsConfig:
    """The :class:`SepsConfig` of ``settings`` (those a command gives by options of their own) and
    ``overrides`` (any other field, ``train-seps --set``): each override checked alone first
    (:func:`check_override`), then together, the overrides to blame named (:func:`blame_overrides`).
    :class:`SettingError`."""
    for name, value in overrides.items():
        check_override(SepsConfig, name, name, value, own=settings, what="SEPS")
    # None: not given; no validation split (val_fraction 0) turns the default patience off, as for the other stages
    settings = {name: value for name, value in settings.items() if value is not None}
    if not settings.get("val_fraction", SepsConfig.val_fraction) and "patience" not in {*settings, *overrides}:
        settings["patience"] = 0
    return blame_overrides(lambda given: SepsConfig(**{**settings, **given}), overrides)


def check_override(cls: type, key: str, name: str, value: Any, own: Iterable[str], what: str) -> None:
    """Refuse override ``key`` (field ``name`` of config class ``cls`` = ``value``) on its own: a setting given
    by an option of its own (``own``: one way to say each; ``instead`` names it), not a field of ``cls``
    (``what``: whose settings they are, listed), or a value its setting can never take
    (:func:`check_setting`). :class:`SettingError` naming ``key``."""
    if name in own:  # the override would replace that setting silently
        raise SettingError(key, f"{key!r}: {name} is a setting of its own, not an override", instead=name)
    fields = [f.name for f in dataclasses.fields(cls)]
    if name not in fields:
        raise SettingError(key, f"{key!r}: {what} settings are {', '.join(fields)}")
    try:
        check_setting(cls, name, value)  # its type and its range, whatever the other settings
    except ValueError as err:
        raise SettingError(key, f"{key!r}: {err}") from None


def check_setting(cls: type, name: str, value: Any) -> None:
    """Refuse a value that setting ``name`` of config class ``cls`` can never take, whatever the other settings
    are (``ValueError`` naming the setting, what it may be and the value): its type (:func:`check_type`),
    then its range or its choices (``SETTINGS``)."""
    check_type(cls, name, value)
    rule = SETTINGS.get(cls, {}).get(name)
    if isinstance(rule, Range) and value not in rule:
        finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
        raise ValueError(f"{name} must be {finite}{rule.broken_by(value)}, got {value!r}")
    if isinstance(rule, tuple) and value not in rule:
        raise ValueError(f"{name} must be one of {rule}, got {value!r}")
    if callable(rule):
        rule(name, value)


def _check_settings(cfg: Any) -> None:
    _check_types(cfg)
    for f in dataclasses.fields(cfg):
        check_setting(type(cfg), f.name, getattr(cfg, f.name))


def default_epochs(dataset: Optional[str]) -> int:
    """The epochs of a run on ``dataset`` (a name, or the path of a file named after it) when none are given:
    the reference code's for a dataset it trained on (REFERENCE_EPOCHS), else FusionConfig's."""
    name = os.path.splitext(os.path.basename(dataset))[0] if dataset else ""
    # 'NUS-WIDE', 'NUSWIDE' and 'nus_wide' are one dataset (its reference's 150 epochs, where two spellings had 100)
    return REFERENCE_EPOCHS.get(re.sub(r"[^a-z0-9]", "", name.lower()), FusionConfig.epochs)


def with_defaults(defaults: Dict[str, Any], settings: Dict[str, Any]) -> Dict[str, Any]:
    """``defaults`` overridden by ``settings``; turning validation off (``val_fraction=0``) also
    turns off a default patience and a default refit, which need a validation split."""
    values = {**defaults, **settings}
    if not values.get("val_fraction"):
        values.update({name: off for name, off in (("patience", 0), ("refit", False)) if name not in settings})
    return values


def _check_training(cfg: Any) -> None:
    """What the settings of training ask of each other (each one's own range is checked by check_setting)."""
    if cfg.patience and not cfg.val_fraction:
        raise ValueError(f"patience needs a validation split (val_fraction > 0), "
                         f"got patience={cfg.patience}, val_fraction={cfg.val_fraction}")


def to_dict(cfg: Any) -> Dict[str, Any]:
    """A JSON-able dict of a config."""
    out = dataclasses.asdict(cfg)
    if "betas" in out:
        out["betas"] = list(out["betas"])
    return out


# Settings that choose where a run computes, not what it computes: left out of its identity.
NOT_IDENTITY = ("device",)
# Settings added after runs were recorded, with the value every earlier run had: at that value they are
# left out of a run's identity, so the runs, states and results rows recorded before them keep theirs.
ADDED_LATER = {"refit": False, "aggregate": "normalised"}
# Hashing settings that were HashConfig fields before they became one method's parameters (``method_params``):
# the method, and the value every other method's runs had. A run's identity shows each where it was, so the
# runs, states and results rows recorded before keep theirs; an old config's field is read as the parameter.
MOVED_TO_PARAMS = {"code_weight": ("ucmfh", 0.5), "teacher_weight": ("distill", 0.8),
                   "teacher_temperature": ("distill", 0.2)}
# A method's parameters added after runs of it were recorded, by method, at the value those runs had: left out of a
# run's identity at that value, as ADDED_LATER's settings are.
PARAMS_ADDED_LATER = {"ucmfh": {"fusion_start": "trained"}}


def identity_dict(cfg: Any) -> Dict[str, Any]:
    """The settings of a config that change a run's result (all but the device, ADDED_LATER's settings at
    their earlier value, MOVED_TO_PARAMS's where they were), JSON-able."""
    out = {k: v for k, v in to_dict(cfg).items()
           if k not in NOT_IDENTITY and not (k in ADDED_LATER and v == ADDED_LATER[k])}
    if isinstance(cfg, HashConfig):
        params = dict(out["method_params"])
        for name, (owner, before) in MOVED_TO_PARAMS.items():
            out[name] = params.pop(name) if cfg.method == owner and name in params else before
        for name, before in PARAMS_ADDED_LATER.get(cfg.method, {}).items():
            if params.get(name) == before:
                del params[name]
        out["method_params"] = params
    if isinstance(cfg, SepsConfig) and cfg.selection == "gumbel":
        # since 2026-11-30 gumbel keeps the noisy scores' top K (it kept the scores' own): a run of before trained
        # another model under the same settings, which was reused, and averaged with new runs as one setting
        out["gumbel_keeps"] = "noisy top-k"
    return out


def from_dict(cls: type, values: Dict[str, Any], source: Optional[str] = None) -> Any:
    """Rebuild a config, refusing keys this version does not know."""
    known = {f.name for f in dataclasses.fields(cls)} | (set(MOVED_TO_PARAMS) if cls is HashConfig else set())
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{source or cls.__name__}: unknown settings {unknown}")
    values = dict(values)
    if cls is HashConfig:  # a config saved when these were fields: its method's parameter, else nothing
        params = dict(values.get("method_params") or {})
        for name, (owner, _) in MOVED_TO_PARAMS.items():
            if name in values and values.get("method", HashConfig.method) == owner:
                params.setdefault(name, values[name])
            values.pop(name, None)
        if params:  # a method's parameters as resolved then: those added since, at the value its runs had
            params = {**PARAMS_ADDED_LATER.get(values.get("method", HashConfig.method), {}), **params}
        values["method_params"] = params
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"{source}: {err}" if source else str(err)) from None
