"""What a hashing method is: its name, its defaults, the model it produces and how it is fitted.

A method is a small class registered under its name (:func:`ucmfh.methods.register`); everything that
``--method NAME`` means is read from it: the front doors' defaults, whether a fusion stage trains
first, which protocols it is scored under, the model a checkpoint of it rebuilds, and ``fit``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

from torch import nn

from ucmfh.config import RELAXATION_CANDIDATES, FusionConfig, HashConfig, with_defaults
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.models.fusion import FusionEncoder
from ucmfh import trainer
from ucmfh.selection import History
from ucmfh.side_by_side import candidates_asked, side_by_side
from ucmfh.trainer import Plan, Setup
from ucmfh.training_log import part
from ucmfh.training_state import StateFile, candidate_path
from ucmfh.utils import resolve_device


class Method:
    """A hashing method. Subclasses set the class attributes and implement :meth:`build_model` and
    :meth:`fit`; :meth:`check` refuses a config the method cannot train.

    ``defaults``: the method's departures from :class:`HashConfig`'s defaults (which are UCMFH's), the one
    home of them. ``params``: the method's own hyper-parameters (``HashConfig.method_params``), each
    with its default; a given value must have its default's type. ``fixed``: settings the method
    always has whatever is asked (a closed-form method has one epoch), so no ignored setting tells two
    identical runs apart.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    defaults: ClassVar[Dict[str, Any]] = {}
    params: ClassVar[Dict[str, Any]] = {}
    fixed: ClassVar[Dict[str, Any]] = {}
    # a fusion encoder is trained first (task 0) and passed to fit; `fusion_defaults` are the fusion
    # stage's departures from FusionConfig's defaults when it serves this method
    uses_fusion: ClassVar[bool] = False
    fusion_defaults: ClassVar[Dict[str, Any]] = {}
    # the hashing stage shares the fusion stage's training options (UCMFH: one set of options, two stages)
    shares_fusion_options: ClassVar[bool] = False
    # image codes from the image alone, text codes from the text alone: scored under 'unimodal' only
    leak_free: ClassVar[bool] = True
    # cfg.loss and cfg.loss_params choose the loss it trains with (else its loss is its own)
    takes_loss: ClassVar[bool] = True
    # cfg.relaxation chooses how the codes are relaxed, 'auto' included (else the method relaxes its own way)
    takes_relaxation: ClassVar[bool] = False
    # fitted in closed form: no epochs, nothing to select on a validation split
    closed_form: ClassVar[bool] = False
    # why the method needs the whole training split in memory ('' when it trains on a streamed one too);
    # a streamed split is refused before anything trains
    in_memory: ClassVar[str] = ""
    # its step may be captured as a CUDA graph (--cuda-graph, ucmfh.captured_step; Plan.graphable), or why it runs
    # eagerly ('' for a method fitted in closed form, which has no steps)
    graphable: ClassVar[bool] = False
    eager_because: ClassVar[str] = ""
    # part of a run's identity where set: a method of another package (docs/methods.md) changes it when it
    # computes something else, so that the runs of its earlier code are not reused as its own (ucmfh's
    # methods keep '': scripts/model_fingerprints.py holds them to the models they trained)
    version: ClassVar[str] = ""

    def config(self, **settings: Any) -> HashConfig:
        """A hashing config of this method: its ``defaults``, then ``settings``, then ``fixed``;
        ``method_params`` are the method's ``params`` updated by those given. Checked (:meth:`check`).

        Turning validation off (``val_fraction=0``) also turns off a default patience and a default refit.
        """
        settings = dict(settings)
        given = settings.pop("method_params", None) or {}
        values = {**with_defaults(self.defaults, settings), **self.fixed}
        cfg = HashConfig(**values, method=self.name, method_params=self.method_params(given))
        self.check(cfg)
        return cfg

    def method_params(self, given: Dict[str, Any]) -> Dict[str, Any]:
        """``params`` updated by ``given``; an unknown name or a value of another type than the default's
        is refused (``ValueError`` naming it)."""
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise ValueError(f"method {self.name!r} has no parameter {', '.join(map(repr, unknown))} "
                             f"(its parameters: {known})")
        out = dict(self.params)
        for key, value in given.items():
            out[key] = _typed(self.name, key, value, self.params[key])
        return out

    def check(self, cfg: HashConfig) -> None:
        """Refuse a config this method cannot train (``ValueError`` naming the setting)."""
        if cfg.method != self.name:
            raise ValueError(f"a config of method {cfg.method!r} given to method {self.name!r}")
        self.method_params(cfg.method_params)

    def takes_fusion(self, cfg: HashConfig) -> Optional[str]:
        """What a run of ``cfg`` is given of its fusion stage: ``'encoder'``, the trained encoder
        (``uses_fusion``); ``'config'``, the stage's settings alone (the method builds an encoder of random
        weights from them and trains it); None: nothing, the method learns from the features alone."""
        return "encoder" if self.uses_fusion else None

    def check_fusion(self, cfg: HashConfig, fusion: Any) -> None:
        """Refuse a ``fusion`` that is not what a run of ``cfg`` takes (:meth:`takes_fusion`) where it takes one
        (``ValueError`` saying what to give): a trained encoder's weights would be set aside unsaid."""
        takes = self.takes_fusion(cfg)
        if takes == "encoder" and fusion is None:
            raise ValueError(f"method {self.name!r} learns from a fusion encoder: train one first (fit_fusion)")
        if takes == "encoder" and not isinstance(fusion, FusionEncoder):
            raise ValueError(f"method {self.name!r} learns from a trained fusion encoder: give ucmfh.fit_fusion's, "
                             f"not {'its FusionConfig' if isinstance(fusion, FusionConfig) else type(fusion).__name__}")
        if takes == "config" and not isinstance(fusion, FusionConfig):
            given = "none" if fusion is None else "a trained encoder" if isinstance(fusion, FusionEncoder) else \
                type(fusion).__name__
            raise ValueError(f"method {self.name!r} with these settings trains a fusion encoder of random weights, as "
                             f"UCMFH's release does: give its FusionConfig (given: {given}; method_params "
                             "fusion_start='trained' starts from a trained encoder)")

    def check_split(self, data: Dataset) -> None:
        """Refuse ``data``'s training split where it is streamed from its file and the method needs it in memory
        (``in_memory``: ``ValueError`` saying why); a grid asks before its first cell."""
        if self.in_memory and data.train.streamed:
            raise ValueError(f"{data.path or data.name}: method {self.name!r} {self.in_memory}; this training split is "
                             "streamed (larger than the memory threshold), too large for it")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> nn.Module:
        """The (untrained) model this method produces for features of these widths: what a checkpoint
        of it is loaded into. It has ``modality_logits``, ``head_outputs`` and ``codes``."""
        raise NotImplementedError

    def fit(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None,
            progress: bool = True, state: Optional[StateFile] = None) -> Tuple[nn.Module, History]:
        """Train on ``data.train`` less a validation part of it (``cfg.val_fraction``,
        :func:`ucmfh.selection.validation_split`); returns the model on the CPU in eval mode and its
        :class:`History`. ``fusion``: what :meth:`takes_fusion` asks for. ``state``: the resumable
        training state (:func:`ucmfh.trainer.train`). A trained method says what it trains (:meth:`plan`);
        a method fitted in closed form replaces this."""
        return trainer.fit(lambda setup: self.plan(data, cfg, setup, fusion), data.train, cfg, state, progress)

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        """What a run of ``cfg`` trains (:class:`ucmfh.trainer.Plan`), on ``setup.rest`` (the training part of
        ``data.train``), validated on ``setup.val``; its model starts as :meth:`initial_model`."""
        raise NotImplementedError

    def initial_model(self, data: Dataset, cfg: HashConfig, setup: Setup,
                      fusion: Optional[FusionEncoder] = None) -> nn.Module:
        """The untrained model (:meth:`build_model`) with its feature statistics fitted on the training
        part, on the CPU."""
        model = self.build_model(data.d_img, data.d_txt, cfg)
        model.fit_feature_stats(setup.rest.img, setup.rest.txt)
        return model

    def train(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None,
              progress: bool = True, state: Optional[StateFile] = None) -> Tuple[nn.Module, History]:
        """:meth:`fit`, after checking ``cfg`` and the data; where ``cfg`` leaves a choice to validation
        (:meth:`choices`), one fit per candidate, the best on validation kept (:func:`choose`); with
        ``cfg.refit``, the kept setting trained again on the whole training split (:func:`refit`). The method
        sees ``data``'s training split alone (:meth:`~ucmfh.data.h5.Dataset.train_only`)."""
        data = data.train_only()
        self.check(cfg)
        trainer.check_supervision(data, cfg)
        self.check_fusion(cfg, fusion)
        self.check_split(data)
        candidates = self.choices(cfg)
        if len(candidates) == 1:  # nothing to choose: the one candidate is the run
            model, history = self.fit(data, next(iter(candidates.values())), fusion, progress, state)
        elif candidates:
            model, history = choose(self.fit, data, cfg, candidates, fusion, progress, state)
        else:
            model, history = self.fit(data, cfg, fusion, progress, state)
        if not cfg.refit or self.closed_form:
            return model, history
        chosen = candidates[history.chosen] if history.chosen else next(iter(candidates.values()), cfg)
        return refit(self.fit, data, chosen, history, fusion, progress, state)

    def choices(self, cfg: HashConfig) -> Dict[str, HashConfig]:
        """The settings a run of ``cfg`` tries, by name, where ``cfg`` leaves a choice to the validation
        split (:func:`choose`); empty where it trains ``cfg`` as given. Here: ``relaxation = 'auto'``
        (a method that ``takes_relaxation``) is one candidate per relaxation of RELAXATION_CANDIDATES;
        a method may add its own (two-tower: InfoNCE's temperature)."""
        if self.takes_relaxation and cfg.relaxation == "auto":
            return {name: dataclasses.replace(cfg, relaxation=name) for name in RELAXATION_CANDIDATES}
        return {}


def choose(fit: Callable, data: Dataset, cfg: HashConfig, candidates: Dict[str, HashConfig],
           fusion: Optional[FusionEncoder], progress: bool, state: Optional[StateFile]) -> Tuple[nn.Module, History]:
    """One run of ``fit`` per candidate config (:meth:`Method.choices`), each on the same validation split
    and seed (the same run as asking for it by its settings); the model whose best epoch scores higher
    on validation is kept, the first candidate on a tie; without a validation split (``val_fraction =
    0``) the first candidate is trained alone. Each candidate keeps its own training state
    (:func:`ucmfh.training_state.candidate_path`), so an interrupted choice resumes where it stopped. Inside
    :func:`ucmfh.side_by_side.candidates_side_by_side` the candidates train at once, in threads, with the same
    results (in one process: on several ranks one after another)."""
    names = list(candidates) if cfg.val_fraction > 0 else list(candidates)[:1]

    def run(name: str) -> Tuple[nn.Module, History]:
        sub = None if state is None else dataclasses.replace(state, path=candidate_path(state.path, name))
        shown = f"{name}, candidate {names.index(name) + 1} of {len(names)}" if len(names) > 1 else name
        with part(name, shown):  # its own curves (ucmfh.training_log); its bar says which of how many
            return fit(data, candidates[name], fusion, progress, sub)

    # the same runs, side by side (ucmfh.side_by_side); on several ranks one after another, as two threads'
    # collectives on one process group would interleave
    if len(names) > 1 and candidates_asked() and current_group().world_size == 1:
        fitted = side_by_side([functools.partial(run, name) for name in names], resolve_device(cfg.device))
    else:
        fitted = [run(name) for name in names]
    runs: Dict[str, Tuple[nn.Module, History]] = dict(zip(names, fitted))
    chosen = max(runs, key=lambda name: runs[name][1].best_score)  # the first of equals
    model, history = runs[chosen]
    history.chosen = chosen
    history.choice_scores = {name: h.best_score for name, (_, h) in runs.items()} if cfg.val_fraction > 0 else {}
    return model, history


def refit(fit: Callable, data: Dataset, chosen: HashConfig, history: History, fusion: Optional[FusionEncoder],
          progress: bool, state: Optional[StateFile]) -> Tuple[nn.Module, History]:
    """``cfg.refit``: the ``chosen`` setting trained again, the same seed, on the whole training split (the
    validation items too) for as many epochs as validation kept (``history.best_epoch``); returns that model
    and ``history`` with ``refit_epochs`` and ``refit_loss`` added. Its training state is the candidate
    'refit''s (:func:`ucmfh.training_state.candidate_path`), so an interrupted refit resumes where it stopped."""
    if history.best_epoch is None:
        raise ValueError("refit: validation chose no epoch (every validation score was -inf or NaN)")
    whole = dataclasses.replace(chosen, val_fraction=0.0, patience=0, epochs=history.best_epoch, refit=False)
    sub = None if state is None else dataclasses.replace(state, path=candidate_path(state.path, "refit"))
    with part("refit"):
        model, again = fit(data, whole, fusion, progress, sub)
    history.refit_epochs, history.refit_loss = history.best_epoch, list(again)
    return model, history


def _typed(method: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (an int is accepted where a float is expected)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, str):  # a number given where text is expected (temperatures=0.2) is its text, and a
        # list of them the text of its items separated by commas (temperatures=[0.3, 0.1]: '0.3,0.1', as typed)
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
            value = ",".join(str(v) for v in value)
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        value = value if isinstance(value, str) or not ok else str(value)
    else:
        ok = True
    if not ok:
        kind = {"int": "an integer", "float": "a number", "str": "text"}.get(type(default).__name__,
                                                                         f"a {type(default).__name__}")
        raise ValueError(f"method {method!r}: parameter {key!r} must be {kind} like its default {default!r}, "
                         f"got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # NaN would pass every check written as `x < 0`
        raise ValueError(f"method {method!r}: parameter {key!r} must be a finite number, got {value!r}")
    return value

