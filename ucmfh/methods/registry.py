"""The registry of hashing methods: a name to its :class:`~ucmfh.methods.base.Method`."""
from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Dict, Optional, Tuple, Type, TypeVar, Union

import torch
from torch import nn

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.trainer import checked_training
from ucmfh.training_state import StateFile
from ucmfh.selection import History
from ucmfh.utils import check_argument, did_you_mean, evaluating, to_device

METHODS: Dict[str, Method] = {}
# the entry points of other packages' methods that failed to load, by name: why (ucmfh.methods.plugins)
PLUGIN_ERRORS: Dict[str, str] = {}
# The method of the front doors (`ucmfh train-hash`, the grid): the best leak-free one measured on the
# validation split (docs/quality.md). demo.py keeps 'ucmfh', the way to reproduce the paper.
DEFAULT_METHOD = "two-tower"

M = TypeVar("M", bound=Type[Method])
METHOD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class NameTaken(ValueError):
    """A method registered under a name another method holds (``name``)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"method name {name!r} is taken (by {type(METHODS[name]).__module__})")
        self.name = name


def register(cls: M) -> M:
    """Class decorator: register one instance of a :class:`Method` under its ``name``, once :func:`check_method`
    finds nothing wrong with it."""
    if not cls.name:
        raise ValueError(f"a method needs a name of its own, got {cls.name!r}")
    if cls.name in METHODS:
        raise NameTaken(cls.name)
    if not isinstance(cls.name, str) or not METHOD_NAME.fullmatch(cls.name):  # a run folder's name begins with it
        raise ValueError(f"method name {cls.name!r}: letters, digits, '-', '_' and '.' alone, beginning with a letter "
                         "or a digit (it names run folders, '../x' one outside --out, and is typed as --method)")
    check_method(cls)
    METHODS[cls.name] = cls()
    return cls


# what the lifecycle passes a method's own functions, positionally (docs/methods.md, "What a method is")
CALLED_WITH = {"build_model": ("d_img", "d_txt", "cfg", "fusion_cfg"), "plan": ("data", "cfg", "setup", "fusion"),
               "fit": ("data", "cfg", "fusion", "progress", "state")}


def check_method(cls: Type[Method]) -> None:
    """Refuse, when it is registered rather than once a run has trained, a method whose settings
    (``defaults``, ``fixed``) name no setting of :class:`HashConfig`, which has no ``build_model`` or neither
    ``plan`` nor ``fit``, or whose own functions cannot take what the lifecycle passes them
    (:data:`CALLED_WITH`): ``ValueError`` naming the method and the fault."""
    known = {field.name for field in dataclasses.fields(HashConfig)} - {"method", "method_params"}
    for attr in ("defaults", "fixed"):
        unknown = sorted(set(getattr(cls, attr)) - known)
        if unknown:
            raise ValueError(f"method {cls.name!r}: its {attr} name {', '.join(map(repr, unknown))}, not settings of "
                             "HashConfig (its own hyper-parameters go in params; the settings: "
                             f"{', '.join(sorted(known))})")
    if cls.build_model is Method.build_model:
        raise ValueError(f"method {cls.name!r} has no build_model (the untrained model a checkpoint is loaded into)")
    if cls.plan is Method.plan and cls.fit is Method.fit:
        raise ValueError(f"method {cls.name!r} has neither plan (what a run trains) nor a fit of its own")
    for attr, args in CALLED_WITH.items():
        own = getattr(cls, attr)
        if own is getattr(Method, attr):
            continue
        try:
            inspect.signature(own).bind(None, *args)
        except TypeError:
            raise ValueError(f"method {cls.name!r}: {attr}{inspect.signature(own)} cannot be called as "
                             f"{attr}(self, {', '.join(args)}), as ucmfh calls it (docs/methods.md)") from None
        except ValueError:  # a callable without a signature Python can read: taken as it is
            pass


def build_method(name: str) -> Method:
    """The method registered under ``name`` (``ValueError`` naming the known ones otherwise)."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        failed = f"; not loaded: {name} ({PLUGIN_ERRORS[name]})" if name in PLUGIN_ERRORS else ""
        raise ValueError(f"unknown method {name!r}{did_you_mean(name, METHODS)}; methods: {', '.join(METHODS)}"
                         f"{failed}") from None


def fit_hashing(data: Dataset, cfg: HashConfig, fusion: Union[FusionEncoder, FusionConfig, None] = None,
                progress: bool = True, state: Optional[StateFile] = None) -> Tuple[nn.Module, History]:
    """Train the hashing stage by ``cfg.method`` (:meth:`Method.train`); returns the model (on CPU) and
    its :class:`~ucmfh.selection.History`. ``fusion``: what the method takes of its fusion stage
    (:meth:`Method.takes_fusion`): the trained encoder (``fit_fusion``'s), or the stage's settings where the
    method trains an encoder of random weights (``ucmfh`` with ``fusion_start='random'``, as UCMFH's release)."""
    check_argument("fit_hashing", "data", data, Dataset, "ucmfh.load_dataset(path)")
    check_argument("fit_hashing", "cfg", cfg, HashConfig, "ucmfh.hash_config(method, ...)")
    check_argument("fit_hashing", "fusion", fusion, (FusionEncoder, FusionConfig), "ucmfh.fit_fusion, or the "
                   "FusionConfig of ucmfh.stage_configs", optional=True)
    method = build_method(cfg.method)
    method.check(cfg)  # its parameters, before what they ask for is read
    # trained without it, where the caller meant it to count (Method.train leaves it to its callers)
    if fusion is not None and method.takes_fusion(cfg) is None:
        raise ValueError(f"fit_hashing: method {cfg.method!r} learns from the features alone; it takes no fusion "
                         "encoder (fusion=None)")
    try:
        method.check_fusion(cfg, fusion)
    except ValueError as err:  # named by the entry point, as its other refusals are
        raise ValueError(f"fit_hashing: {err}") from None
    data = checked_training("fit_hashing", data, fusion if isinstance(fusion, FusionEncoder) else None)
    # the splits withheld here too: a method of another package may override train (Dataset.train_only)
    model, history = method.train(data.train_only(), cfg, fusion, progress, state)
    check_code_width(cfg, model, data.train)
    return model, history


def check_code_width(cfg: HashConfig, model: nn.Module, split: Split) -> None:
    """Refuse a trained model whose outputs are not ``cfg.n_bits`` wide, as each entry point reads them
    (``head_outputs``: scores; ``modality_logits``: an index, a search), on two training items (``ValueError``
    naming the method): a method of another package whose heads put out 33 columns for 32 bits was scored
    and recorded as 32-bit codes."""
    lacks = [name for name in ("head_outputs", "modality_logits") if not callable(getattr(model, name, None))]
    if lacks:
        raise ValueError(f"method {cfg.method!r}: its model has no {' and no '.join(lacks)} (scores read head_outputs, "
                         "an index and a search modality_logits; docs/methods.md); nothing was saved")
    img, txt = to_device(split.img[:2], "cpu"), to_device(split.txt[:2], "cpu")  # a streamed split's rows too
    with evaluating(model, torch.device("cpu")), torch.no_grad():
        outputs = {"head_outputs": model.head_outputs(img, txt, "unimodal"),
                   "modality_logits": (model.modality_logits(img, "img"), model.modality_logits(txt, "txt"))}
    for name, pair in outputs.items():
        for modality, x in zip(("image", "text"), pair):
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape != (len(img), cfg.n_bits):
                shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"method {cfg.method!r}: its model's {name} gave {modality} outputs of shape "
                                 f"{shape} for {len(img)} items, not [{len(img)}, {cfg.n_bits}] ({cfg.n_bits} bits "
                                 "asked for); nothing was saved")
