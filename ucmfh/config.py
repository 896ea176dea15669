"""Settings of each stage: the one home of defaults.

The values follow UCMFH's reference code (docs/reference.md §2) except where
that code is defective; every departure is named in a comment. A config checks
itself when it is made (``ValueError`` naming the setting), so an invalid one
never exists; change one with :func:`dataclasses.replace`, which checks again.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

PROTOCOLS = ("unimodal", "fused")
BETA_SCHEDULES = ("none", "hashnet", "step")
AMP_MODES = ("none", "bf16")
CODE_LENGTHS = (8, 256)  # the shortest and the longest code, in bits
# How training relaxes the codes: 'tanh' trains on tanh(beta * logits) (UCMFH); 'sign' trains on
# sign(tanh(logits)) itself, with tanh's gradient passed straight through the sign (Greedy Hash, Su et
# al., NeurIPS 2018), so the loss sees the codes that are searched; 'auto' trains one run with each of
# RELAXATION_CANDIDATES and keeps the one with the better validation score (without a validation split,
# val_fraction = 0, it trains the first candidate alone); 'none' trains no codes: the loss sees the
# L2-normalised head outputs, a real-valued embedding that validation ranks by cosine, and the codes are
# their signs, which training never saw (a row's `real_valued` figures are its measure; docs/history.md).
RELAXATION_CANDIDATES = ("sign", "tanh")
RELAXATIONS = (*RELAXATION_CANDIDATES, "auto", "none")

# Epochs of the reference code per dataset; a front door may use them as
# defaults, the trainer never looks at a dataset's name.
REFERENCE_EPOCHS = {"mirflickr": 100, "nuswide": 150, "nus-wide": 150, "mscoco": 500, "coco": 500}


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
        _check_types(self)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.modality_dropout <= 1.0:
            raise ValueError(f"modality_dropout must be in [0, 1], got {self.modality_dropout}")
        _check_training(self)
        return self


@dataclass
class HashConfig:
    """Hashing stage (task 1): how codes are learnt (``method``) and its settings.

    The defaults are UCMFH's (docs/reference.md §2). A method (:mod:`ucmfh.methods`) starts from its own
    departures from them (``ucmfh.methods.hash_config``) and checks what it cannot train; its own
    hyper-parameters are ``method_params``. A field a method has no use for is kept but does nothing
    (``code_weight``, ``lr_fusion`` and ``modality_dropout`` are UCMFH's, ``teacher_*`` are distill's).
    """

    method: str = "ucmfh"  # a name of ucmfh.methods.METHODS
    method_params: Dict[str, Any] = field(default_factory=dict)  # the method's own (ucmfh.methods.Method.params)
    n_bits: int = 64
    hidden: int = 4096  # 0: a linear head
    dropout: float = 0.3
    # loss = loss(fused img, fused txt) + code_weight * loss(img codes, txt codes)
    code_weight: float = 0.5
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
    # method 'distill': the share of the targets taken from the teacher (softmax of the fused
    # embeddings' cosine similarities at teacher_temperature); the rest is the pair itself
    teacher_weight: float = 0.8
    teacher_temperature: float = 0.2
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
        _check_types(self)
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a method's name, got {self.method!r}")
        if not isinstance(self.method_params, dict):
            raise ValueError(f"method_params must be a dict of the method's parameters, got {self.method_params!r}")
        if not CODE_LENGTHS[0] <= self.n_bits <= CODE_LENGTHS[1]:
            raise ValueError(f"n_bits must be between {CODE_LENGTHS[0]} and {CODE_LENGTHS[1]}, got {self.n_bits}")
        if self.hidden < 0:
            raise ValueError(f"hidden must be >= 0 (0: a linear head), got {self.hidden}")
        if not 0.0 <= self.teacher_weight <= 1.0 or self.teacher_temperature <= 0:
            raise ValueError(f"teacher_weight must be in [0, 1] and teacher_temperature > 0, got "
                             f"{self.teacher_weight} and {self.teacher_temperature}")
        if self.relaxation not in RELAXATIONS:
            raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {self.relaxation!r}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not 0.0 <= self.modality_dropout <= 1.0:
            raise ValueError(f"modality_dropout must be in [0, 1], got {self.modality_dropout}")
        if self.beta_step_iters < 1 or self.beta_step_epochs < 1:
            raise ValueError("beta_step_iters and beta_step_epochs must be >= 1")
        if self.lr_fusion < 0 or self.lr_head <= 0:
            raise ValueError(f"lr_fusion must be >= 0 and lr_head > 0, got {self.lr_fusion} and {self.lr_head}")
        _check_training(self)
        if self.refit and not self.val_fraction:
            raise ValueError("refit needs a validation split to choose the epoch (val_fraction > 0), got "
                             f"val_fraction={self.val_fraction}")
        return self


# SEPS (docs/reference.md §8, docs/seps.md): which form of the model, how the patch selection learns,
# where a dense description of an image may come from.
SEPS_VERSIONS = ("code", "paper")
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
        _check_types(self)
        for name, allowed in (("version", SEPS_VERSIONS), ("selection", tuple(SEPS_SELECTIONS)),
                              ("dense_text", tuple(DENSE_TEXT))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0.0 < self.keep_ratio <= 1.0 or not 0.0 < self.aggr_ratio <= 1.0:
            raise ValueError(f"keep_ratio and aggr_ratio must be in (0, 1], got {self.keep_ratio}, {self.aggr_ratio}")
        if self.embed_dim < 1 or self.aggr_hidden_ratio <= 0 or self.hrpa_top_k < 1 or self.pair_chunk < 1:
            raise ValueError("embed_dim, aggr_hidden_ratio, hrpa_top_k and pair_chunk must be positive")
        if not 0.0 <= self.beta <= 0.5:
            raise ValueError(f"beta must be in [0, 0.5] (the predictor's weight is 1 − 2β), got {self.beta}")
        if self.select_temperature <= 0 or self.margin < 0 or self.ratio_weight < 0 or self.lr <= 0:
            raise ValueError("select_temperature and lr must be > 0, margin and ratio_weight >= 0")
        if self.max_violation_from < 0:
            raise ValueError(f"max_violation_from must be >= 0, got {self.max_violation_from}")
        _check_training(self)
        return self


SEARCH_BACKENDS = ("exact", "mih", "faiss-ivf", "faiss-hnsw")
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


def backend_config(backend: Any) -> BackendConfig:
    """A search's backend from what a caller gives: None (``exact``), a name as the CLI's ``--backend`` takes
    (``"mih"``, as one writes it coming from FAISS) or a :class:`BackendConfig` (for its other settings);
    anything else is a TypeError, an unknown name a ValueError."""
    if backend is None:
        return BackendConfig()
    if isinstance(backend, str):
        return BackendConfig(backend=backend)
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
        if isinstance(value, list) and isinstance(_default(type(cfg), f.name), tuple):
            setattr(cfg, f.name, tuple(value))  # as a checkpoint's JSON gives it back


def with_defaults(defaults: Dict[str, Any], settings: Dict[str, Any]) -> Dict[str, Any]:
    """``defaults`` overridden by ``settings``; turning validation off (``val_fraction=0``) also
    turns off a default patience and a default refit, which need a validation split."""
    values = {**defaults, **settings}
    if not values.get("val_fraction"):
        values.update({name: off for name, off in (("patience", 0), ("refit", False)) if name not in settings})
    return values


def _check_training(cfg: Any) -> None:
    if cfg.epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {cfg.epochs}")
    if cfg.batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (contrastive losses need negatives), got {cfg.batch_size}")
    if cfg.amp not in AMP_MODES:
        raise ValueError(f"amp must be one of {AMP_MODES}, got {cfg.amp!r}")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {cfg.val_fraction}")
    if cfg.patience < 0 or (cfg.patience and not cfg.val_fraction):
        raise ValueError(f"patience must be >= 0 and needs a validation split (val_fraction > 0), "
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
ADDED_LATER = {"refit": False}


def identity_dict(cfg: Any) -> Dict[str, Any]:
    """The settings of a config that change a run's result (all but the device, and ADDED_LATER's settings
    at their earlier value), JSON-able."""
    return {k: v for k, v in to_dict(cfg).items()
            if k not in NOT_IDENTITY and not (k in ADDED_LATER and v == ADDED_LATER[k])}


def from_dict(cls: type, values: Dict[str, Any], source: Optional[str] = None) -> Any:
    """Rebuild a config, refusing keys this version does not know."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{source or cls.__name__}: unknown settings {unknown}")
    values = dict(values)
    if "betas" in values:
        values["betas"] = tuple(values["betas"])
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"{source}: {err}" if source else str(err)) from None
