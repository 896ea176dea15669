"""A method's settings resolved: the configs of its stages from its name, the dataset and the settings given.

``stage_configs('distill', dataset='mirflickr', n_bits=[16, 64], epochs=20)`` is what ``ucmfh train-hash
--method distill -d mirflickr -b 16 -b 64 --epochs 20`` trains, as open_clip's factory resolves a model from
its name and the caller's overrides: every rule lives here (a method's own defaults, the reference's epochs
of a known dataset, what a fusion stage shares with the hashing stage, the settings a method has no use
for); a front door only maps its flags onto the settings. A setting is refused with a
:class:`~ucmfh.config.SettingError` naming it.

The settings (None, or absent: not given):

- the run's: ``seed``, ``device``, ``amp``, ``supervised`` (the same in both stages);
- the training's: ``loss``, ``loss_params``, ``epochs``, ``batch_size``, ``val_fraction``, ``patience``,
  ``refit``, ``modality_dropout``;
- the hashing stage's: ``method_params`` (:attr:`Method.params`), ``beta_schedule``, ``lr_fusion``;
- ``protocol``: the one protocol the codes will be scored under ('unimodal' or 'fused'; None: both);
- ``overrides``: ``{"fusion": {...}, "hash": {...}}``, any other field of FusionConfig or HashConfig.
"""
from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from ucmfh.config import (
    MOVED_TO_PARAMS, PROTOCOLS, STAGES, FusionConfig, HashConfig, SettingError, blame_overrides, check_override,
    check_setting, default_epochs, raises, with_defaults,
)
from ucmfh.losses import LOSSES, build_loss
from ucmfh.methods.base import Method
from ucmfh.methods.registry import DEFAULT_METHOD, build_method

# the settings of stage_configs, in the order a refusal looks at them
SETTINGS = ("protocol", "loss", "loss_params", "supervised", "epochs", "fusion_epochs", "batch_size", "seed",
            "modality_dropout", "val_fraction", "patience", "refit", "amp", "device", "method_params",
            "beta_schedule", "lr_fusion")
# those of fusion_config (the fusion stage alone)
FUSION_SETTINGS = ("loss", "loss_params", "supervised", "epochs", "batch_size", "seed", "modality_dropout",
                   "val_fraction", "patience", "amp", "device", "lr")
# settings given as arguments of their own, which an override must not replace behind their back
OWN_SETTINGS = ("n_bits", "method", "seed", "device")
# what a method that shares the fusion stage's options ('ucmfh') takes from its fusion stage's config
SHARED_WITH_FUSION = ("loss", "loss_params", "supervised", "batch_size", "seed", "modality_dropout", "device", "amp",
                      "val_fraction", "patience")
# the run's settings: one value for both stages
RUN_SETTINGS = ("supervised", "seed", "device", "amp")
# what another method takes from the settings given (its own defaults otherwise)
HASH_SETTINGS = ("loss", "val_fraction", "patience", "refit", "modality_dropout", "loss_params", "batch_size",
                 "beta_schedule", "lr_fusion")
# settings a method without a fusion stage has no use for (and every fusion.* override), and those a method
# fitted in closed form has none for
FUSION_ONLY = ("fusion_epochs", "lr_fusion", "modality_dropout")
EPOCH_SETTINGS = ("epochs", "batch_size", "val_fraction", "patience", "refit", "amp", "beta_schedule", "supervised")
# how the codes are relaxed in training: what a method that relaxes them its own way (not ``takes_relaxation``)
# has no use for
RELAXATION_SETTINGS = ("relaxation", "beta_schedule", "beta_gamma", "beta_step_iters", "beta_step_epochs")


class StageConfigs(NamedTuple):
    """The configs of a method's run: its fusion stage's (None where it trains none), one hashing config
    per code length."""

    fusion: Optional[FusionConfig]
    hashes: List[HashConfig]


def stage_configs(method: str, *, dataset: Optional[str] = None,
                  n_bits: Union[int, Iterable[int]] = (HashConfig.n_bits,),
                  overrides: Optional[Mapping[str, Mapping[str, Any]]] = None, drop_unused: bool = False,
                  **settings: Any) -> StageConfigs:
    """The configs a run of ``method`` trains, one hashing config per code length of ``n_bits`` (one length, or
    several; each checked now); ``dataset``'s name sets the default epochs (:func:`ucmfh.config.default_epochs`).

    A method that shares the fusion stage's options ('ucmfh') shares every training setting with it, and
    follows the reference's epochs. Another method starts from its own defaults (:meth:`Method.config`)
    and takes only the settings given; a fusion stage it trains (a teacher, 'distill') takes its
    validation settings, else the method's ``fusion_defaults``, and ``fusion_epochs`` (else ``epochs``).
    Refused (:class:`SettingError` naming the setting): an unknown setting or override, a setting the method
    has no use for (:func:`unused_settings`; with ``drop_unused`` they are left out instead: one set of
    settings serving several methods), a loss for a method with a loss of its own, and any value a config
    refuses.
    """
    spec = _method(method)
    _check_names(settings, SETTINGS)
    given = {name: value for name, value in settings.items() if value is not None}
    if given.get("protocol", PROTOCOLS[0]) not in PROTOCOLS:  # a typo ('fuse') was dropped with the rest
        raise SettingError("protocol", f"protocol must be one of {', '.join(PROTOCOLS)}, got {given['protocol']!r}")
    stage_overrides = check_overrides(overrides, tuple(STAGES))
    _refuse_twice(spec, given, stage_overrides)
    unused = unused_settings(method, {**given, "overrides": stage_overrides})
    if drop_unused:
        given = {name: value for name, value in given.items() if name not in unused}
        stage_overrides = {stage: {name: value for name, value in values.items() if f"{stage}.{name}" not in unused}
                           for stage, values in stage_overrides.items()}
    elif unused:
        _refuse(method, unused)
    if default_loss(method) is None and ("loss" in given or "loss_params" in given):
        raise SettingError("loss" if "loss" in given else "loss_params",
                           f"method {method!r} has a loss of its own; no loss or loss parameters apply to it")
    given.pop("protocol", None)
    bits = list(dict.fromkeys(_code_lengths(n_bits)))
    return _blamed(lambda plain, extra: _resolve(spec, dataset, bits, plain, extra), given, stage_overrides)


def _code_lengths(n_bits: Any) -> List[int]:
    """``n_bits`` as a list of code lengths (one length alone is one: numpy's integers too), each checked
    (:class:`SettingError`), as ints."""
    one = isinstance(n_bits, (numbers.Number, str)) or not isinstance(n_bits, Iterable)
    bits = [n_bits] if one else list(n_bits)
    if not bits:
        raise SettingError("n_bits", "n_bits: no code length given")
    for length in bits:
        try:
            check_setting(HashConfig, "n_bits", length)
        except ValueError as err:
            raise SettingError("n_bits", str(err)) from None
    return [int(length) for length in bits]


def hash_config(method: str = DEFAULT_METHOD, *, dataset: Optional[str] = None, drop_unused: bool = False,
                **settings: Any) -> HashConfig:
    """The hashing config of ``method`` (the front doors' default, 'two-tower', unless given) at one code length,
    by the rules of :func:`stage_configs` (the front doors'): ``hash_config(n_bits=64)`` is what ``ucmfh
    train-hash -b 64`` trains, and ``hash_config("ucmfh", dataset="nuswide")`` has the reference's 150 epochs.
    ``settings``: ``n_bits``, the settings of :func:`stage_configs`, and any other field of :class:`HashConfig`
    (``hidden=512``, as the override ``hash.hidden``). A setting the method has no use for is refused
    (``hash_config("cca-itq", hidden=512)``: it fixes ``hidden``), or with ``drop_unused`` left out (one set of
    settings serving several methods); :class:`SettingError` names it."""
    n_bits = settings.pop("n_bits", HashConfig.n_bits)
    if not isinstance(n_bits, numbers.Integral) or isinstance(n_bits, bool):
        raise SettingError("n_bits", f"n_bits must be one code length, an int (several: stage_configs(method, "
                                     f"n_bits=[16, 64])), got {n_bits!r}")
    if dataset is not None and not isinstance(dataset, (str, os.PathLike)):
        raise SettingError("dataset", f"dataset must be a dataset's name or file, got {type(dataset).__name__}")
    fields = {field.name for field in dataclasses.fields(HashConfig)}
    unknown = [name for name in settings if name not in SETTINGS and name not in fields]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting {unknown[0]!r}{_closest(unknown[0], [*SETTINGS, *fields])}; "
                                       f"settings are n_bits, {', '.join(SETTINGS)} and the fields of HashConfig")
    if settings.get("fusion_epochs") is not None and _method(method).uses_fusion:  # a method without: refused below
        if drop_unused:  # of no use to the hashing config
            settings.pop("fusion_epochs")
        else:  # the fusion stage's config is not what this returns
            raise SettingError("fusion_epochs", f"fusion_epochs sets the fusion stage, whose config hash_config "
                                                f"does not return: stage_configs({method!r}, fusion_epochs=...) "
                                                "returns both")
    named = {name: value for name, value in settings.items() if name in SETTINGS}
    overrides = {name: value for name, value in settings.items() if name not in SETTINGS}
    try:
        return stage_configs(method, dataset=dataset, n_bits=[n_bits], overrides={"hash": overrides},
                             drop_unused=drop_unused, **named).hashes[0]
    except SettingError as err:  # named as given here: 'hidden', not the override 'hash.hidden'
        names = [name[len("hash."):] if name.startswith("hash.") else name for name in err.settings]
        raise SettingError(names, str(err).replace("hash.", ""), err.instead) from None


def fusion_config(*, dataset: Optional[str] = None, overrides: Optional[Mapping[str, Mapping[str, Any]]] = None,
                  **settings: Any) -> FusionConfig:
    """The config of a fusion stage trained alone (task 0) from the settings given (FUSION_SETTINGS; None:
    FusionConfig's default; ``epochs``: the dataset's default), any other field of :class:`FusionConfig`
    (``d_model=256``, as :func:`hash_config` takes HashConfig's) and ``overrides={"fusion": {...}}``; a
    :class:`SettingError` names a setting refused."""
    fields = {field.name for field in dataclasses.fields(FusionConfig)} - set(FUSION_SETTINGS)
    unknown = [name for name in settings if name not in FUSION_SETTINGS and name not in fields]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting {unknown[0]!r}"
                                       f"{_closest(unknown[0], [*FUSION_SETTINGS, *fields])}; settings are "
                                       f"{', '.join(FUSION_SETTINGS)} and the fields of FusionConfig")
    as_fields = {name: settings.pop(name) for name in list(settings) if name in fields}
    if as_fields:  # as an override of the stage ('fusion.d_model'), given twice if it is one too
        _refuse_given_twice([(f"fusion.{name}", name) for name in (overrides or {}).get("fusion", {})
                             if name in as_fields])
        try:
            return fusion_config(dataset=dataset, overrides={**(overrides or {}), "fusion": {
                **(overrides or {}).get("fusion", {}), **as_fields}}, **settings)
        except SettingError as err:  # named as given here: 'd_model', not the override 'fusion.d_model'
            names = [name[len("fusion."):] if name[len("fusion."):] in as_fields else name for name in err.settings]
            raise SettingError(names, str(err).replace("'fusion.", "'"), err.instead) from None
    given = {name: value for name, value in settings.items() if value is not None}
    stage_overrides = check_overrides(overrides, ("fusion",))
    _refuse_given_twice([(f"fusion.{name}", name) for name in stage_overrides.get("fusion", {}) if name in given])
    cfg = _blamed(lambda plain, extra: _fusion(dataset, plain, extra["fusion"]), given, stage_overrides)
    if cfg.supervised and not LOSSES[cfg.loss].uses_labels:  # the same model, under a new name
        raise SettingError("supervised", f"the fusion stage {_without_labels([cfg.loss])}: it has no use for supervised")
    return cfg


def _refuse_twice(spec: Method, given: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse an override of a setting also given as itself (``epochs`` and ``hash.epochs``): one would win
    silently. The fusion stage's: ``fusion_epochs`` as ``fusion.epochs``, and where the method shares the
    fusion stage's options ('ucmfh'), those it shares."""
    twice = [(f"hash.{name}", name) for name in overrides.get("hash", {}) if name in given]
    for name in overrides.get("fusion", {}):
        if name == "epochs" and "fusion_epochs" in given:
            twice.append(("fusion.epochs", "fusion_epochs"))
        elif spec.shares_fusion_options and name in SHARED_WITH_FUSION and name in given:
            twice.append((f"fusion.{name}", name))
    _refuse_given_twice(twice)


def _refuse_given_twice(twice: Sequence[Tuple[str, str]]) -> None:
    """Refuse the first of ``twice``, (override, setting) pairs that give one setting twice: one would win
    silently (:class:`SettingError` naming the override, ``instead`` the setting)."""
    if twice:
        key, name = twice[0]
        raise SettingError(key, f"{key!r}: given twice, as {name} and as an override", instead=name)


def unused_settings(method: str, settings: Mapping[str, Any]) -> Dict[str, str]:
    """The settings given (``settings``: name -> value, None: not given; ``overrides`` as in
    :func:`stage_configs`) that ``method`` has no use for, each with why: 'fused' as the one ``protocol``
    for a leak-free method (its codes have no fused view), those of a fusion stage (``fusion_epochs``,
    ``lr_fusion``, ``modality_dropout``, every ``fusion.*`` override) for a method that trains none, those of
    epochs for a method fitted in closed form, a loss override (``hash.loss``, ``hash.loss_params``) for a method
    with a loss of its own, a relaxation setting (``hash.relaxation``, ``beta_schedule``, ...) for a method that
    relaxes its codes its own way, a setting the method fixes (:attr:`Method.fixed`), as an override or by its
    flag."""
    spec = _method(method)
    names = [name for name, value in settings.items() if value is not None and name != "overrides"]
    names += [f"{stage}.{name}" for stage in ("fusion", "hash")
              for name in (settings.get("overrides") or {}).get(stage) or {}]
    unused = {}
    if settings.get("protocol") == "fused" and spec.leak_free:
        unused["protocol"] = "is leak-free, its codes having no fused view (scored under unimodal only)"
    for name in names:
        if not spec.uses_fusion and (name in FUSION_ONLY or name.startswith("fusion.")):
            unused[name] = "trains no fusion stage"
        elif spec.closed_form and name in EPOCH_SETTINGS:
            unused[name] = "is fitted in closed form"
        elif name.startswith("hash.") and name[len("hash."):] in spec.fixed:
            unused[name] = f"fixes {name[len('hash.'):]}, whatever is asked"
        elif name in HASH_SETTINGS and name in spec.fixed and name not in ("loss", "loss_params"):
            unused[name] = f"fixes {name}, whatever is asked"  # its flag, e.g. --beta-schedule for DJSRH
        elif not spec.takes_loss and name in ("hash.loss", "hash.loss_params"):
            unused[name] = "has a loss of its own"
        elif not spec.takes_relaxation and (name[len("hash."):] if name.startswith("hash.") else name) in \
                RELAXATION_SETTINGS:
            unused[name] = "relaxes its codes its own way"
    if settings.get("supervised") and not spec.closed_form:
        losses = _losses(spec, settings)
        if not any(loss is not None and LOSSES[loss].uses_labels for loss in losses):  # the same model, under a new name
            unused["supervised"] = _without_labels(losses)
    return unused


def _without_labels(losses: Sequence[Optional[str]]) -> str:
    """Why supervised training changes nothing with these losses (None: a method's own)."""
    named = list(dict.fromkeys("a loss of its own" if loss is None else repr(loss) for loss in losses))
    return f"trains with {' and '.join(named)}, which use{'s' if len(named) == 1 else ''} no labels (pairwise does)"


def _losses(spec: Method, settings: Mapping[str, Any]) -> List[Optional[str]]:
    """The losses a run of ``spec`` trains with, given ``settings`` (None: the method's own)."""
    overrides = settings.get("overrides") or {}
    hashing = (overrides.get("hash") or {}).get("loss") or settings.get("loss") or default_loss(spec.name)
    if not spec.uses_fusion:
        return [hashing]
    fusion = (overrides.get("fusion") or {}).get("loss") or (
        settings.get("loss") if spec.shares_fusion_options else spec.fusion_defaults.get("loss")) or FusionConfig.loss
    return [fusion, hashing]


def refuse_unused(method: str, **settings: Any) -> None:
    """Refuse the first setting given that ``method`` has no use for (:func:`unused_settings`), e.g. the
    protocol 'fused' for a checkpoint of a leak-free method."""
    unused = unused_settings(method, settings)
    if unused:
        _refuse(method, unused)


def trains_fusion(method: str) -> bool:
    """Whether a run of ``method`` trains a fusion stage first (and passes its encoder to the method)."""
    return _method(method).uses_fusion


def trains_by_epochs(method: str) -> bool:
    """Whether a run of ``method`` trains by epochs, which curves, saves of the training state and a captured step
    serve: not one fitted in closed form."""
    return not _method(method).closed_form


def fusion_takes_the_loss(method: str) -> bool:
    """Whether a run of ``method`` trains its fusion stage with the hashing stage's loss and its parameters (UCMFH:
    one set of options, two stages), so that a loss's parameters given once reach both."""
    return _method(method).shares_fusion_options


def scored_protocols(method: str, protocols: Sequence[str] = PROTOCOLS) -> Tuple[str, ...]:
    """The protocols codes of ``method`` are scored under when ``protocols`` are asked: a leak-free
    method's are scored under 'unimodal' whatever is asked ('fused' would repeat it)."""
    return ("unimodal",) if _method(method).leak_free else tuple(protocols)


def captured_step(method: str) -> Optional[str]:
    """What a GPU does with a step of ``method`` (captured as a CUDA graph by default), in words: ``"its step
    captured"`` or ``"eager (why)"``; None where it has no steps (fitted in closed form)."""
    spec = _method(method)
    if spec.closed_form:
        return None
    if spec.graphable:
        return "its step captured"
    return f"eager ({spec.eager_because})" if spec.eager_because else "eager (graphable not set)"


def default_loss(method: str) -> Optional[str]:
    """The loss ``method`` trains with unless given another; None where its loss is its own (a ``loss``
    given is refused)."""
    spec = _method(method)
    return spec.defaults.get("loss", HashConfig.loss) if spec.takes_loss else None


def check_overrides(overrides: Optional[Mapping[str, Mapping[str, Any]]],
                    stages: Tuple[str, ...]) -> Dict[str, Dict[str, Any]]:
    """``overrides`` ({stage: {field: value}}) checked field by field: a known stage of ``stages``, not a
    method's parameter of old, then :func:`ucmfh.config.check_override` (a field, not one given by a setting
    of its own, OWN_SETTINGS, a value of its type and range). Returns them with every stage of STAGES present."""
    out: Dict[str, Dict[str, Any]] = {stage: {} for stage in STAGES}
    for stage, values in (overrides or {}).items():
        for name, value in values.items():
            key = f"{stage}.{name}" if name else stage  # 'foo=1': no field named
            if stage not in stages:
                trains = f"no {stage} stage is trained here; " if stage in STAGES else ""
                raise SettingError(key, f"{key!r}: {trains}expected {' or '.join(f'{s}.FIELD' for s in stages)}")
            if stage == "hash" and name in MOVED_TO_PARAMS:  # a hashing setting once, a method's parameter now
                raise SettingError(key, f"{key!r}: a parameter of method {MOVED_TO_PARAMS[name][0]!r} "
                                        f"(method_params), not a hashing setting", instead="method_params")
            check_override(STAGES[stage], key, name, value, own=OWN_SETTINGS, what=stage)
            out[stage][name] = value
    return out


def check_loss(cfg: Any) -> Any:
    """``cfg``, after building its loss once (a method with a loss of its own has none to check): an unknown
    loss, parameter or value is refused before anything is read or trained (``ValueError`` naming it)."""
    if isinstance(cfg, HashConfig) and default_loss(cfg.method) is None:
        return cfg
    build_loss(cfg.loss, **cfg.loss_params)
    return cfg


def _refuse(method: str, unused: Dict[str, str]) -> None:
    setting, why = next(iter(unused.items()))
    what = "protocol 'fused'" if setting == "protocol" else setting
    raise SettingError(setting, f"method {method!r} {why}: it has no use for {what}")


def _method(name: str) -> Method:
    try:
        return build_method(name)
    except ValueError as err:
        raise SettingError("method", str(err)) from None


def _check_names(settings: Mapping[str, Any], known: Sequence[str], stage: str = "hash") -> None:
    unknown = [name for name in settings if name not in known]
    if unknown:
        raise SettingError(unknown[0], f"unknown setting {unknown[0]!r}{_closest(unknown[0], known)}; settings are "
                                       f"{', '.join(known)} (any other as an override: overrides={{'{stage}': {{...}}}})")


def _closest(name: str, known: Sequence[str]) -> str:
    """'; did you mean ...' for a misspelt setting (hiden) or one of a family (lr: lr_head, lr_fusion), else ''."""
    close = [k for k in known if k.startswith(name + "_")] or difflib.get_close_matches(name, list(known), n=2)
    return f" (did you mean {' or '.join(map(repr, sorted(set(close))))}?)" if close else ""


def _fusion(dataset: Optional[str], settings: Dict[str, Any], overrides: Dict[str, Any]) -> FusionConfig:
    values = {"epochs": default_epochs(dataset), **settings, **overrides}
    return check_loss(FusionConfig(**values))


def _resolve(spec: Method, dataset: Optional[str], n_bits: List[int], settings: Dict[str, Any],
             overrides: Dict[str, Dict[str, Any]]) -> StageConfigs:
    """:func:`stage_configs` of settings already checked (``settings``: those given, None left out)."""
    epochs = settings.get("epochs")
    if spec.shares_fusion_options:
        fusion = {name: settings[name] for name in FUSION_SETTINGS if name in settings}
    else:
        # a teacher's fusion stage takes the student's validation settings (else the method's fusion_defaults):
        # it never sees the items that pick the student's epoch; its loss is its own
        fusion = {name: settings[name] for name in ("supervised", "batch_size", "seed", "modality_dropout", "amp",
                                                    "device") if name in settings}
        given = {name: settings[name] for name in ("val_fraction", "patience") if name in settings and spec.uses_fusion}
        fusion.update({name: value for name, value in with_defaults(spec.fusion_defaults, given).items()
                       if name in FUSION_SETTINGS})  # a fusion stage has nothing to refit
    fusion["epochs"] = settings.get("fusion_epochs", epochs)
    if fusion["epochs"] is None:
        del fusion["epochs"]
    fusion_cfg = _fusion(dataset, fusion, overrides["fusion"])
    if spec.shares_fusion_options:
        base = {name: getattr(fusion_cfg, name) for name in SHARED_WITH_FUSION}
        base["epochs"] = epochs if epochs is not None else default_epochs(dataset)
        # the hashing stage's own: its relaxation schedule, the encoder's learning rate, and a refit (the fusion
        # stage has nothing to refit)
        base.update({name: settings[name] for name in ("beta_schedule", "lr_fusion", "refit") if name in settings})
    else:
        base = {name: settings[name] for name in HASH_SETTINGS if name in settings}
        # the run's settings, as its fusion stage has them (an override of them reaches both stages)
        base.update({name: getattr(fusion_cfg, name) for name in RUN_SETTINGS})
        if epochs is not None:
            base["epochs"] = epochs
    extra = dict(overrides["hash"])
    if settings.get("method_params"):
        extra["method_params"] = {**extra.get("method_params", {}), **settings["method_params"]}
    hashes = [check_loss(spec.config(**{**base, "n_bits": bits, **extra})) for bits in n_bits]
    if fusion_cfg.supervised and not LOSSES[fusion_cfg.loss].uses_labels:  # its loss ignores them: the unsupervised
        fusion_cfg = dataclasses.replace(fusion_cfg, supervised=False)  # stage, reused as such, not one more run key
    return StageConfigs(fusion_cfg if spec.uses_fusion else None, hashes)


def _atoms(settings: Dict[str, Any]) -> List[Tuple[str, str, Any]]:
    """The settings given one by one, as a refusal names them: (name, key, value); the parameters of the loss
    and of the method each on its own (``loss_params.temperature``)."""
    atoms = []
    for name, value in settings.items():
        if name in ("loss_params", "method_params") and isinstance(value, dict) and value:
            atoms += [(f"{name}.{key}", name, {key: item}) for key, item in value.items()]
        else:
            atoms.append((name, name, value))
    return atoms


def _prefix(atoms: List[Tuple[str, str, Any]]) -> Dict[str, Any]:
    settings: Dict[str, Any] = {}
    for _, name, value in atoms:
        settings[name] = {**settings[name], **value} if name in settings and isinstance(value, dict) else value
    return settings


def _blamed(build: Callable[[Dict[str, Any], Dict[str, Dict[str, Any]]], Any], settings: Dict[str, Any],
            overrides: Dict[str, Dict[str, Any]]) -> Any:
    """``build(settings, overrides)``; a ``ValueError`` it raises is a :class:`SettingError` naming the setting
    to blame. When the settings alone raise it: the first setting (in the order given) whose addition raises it.
    Else it comes of the overrides (``fusion.d_model=30`` with 4 heads): those of them that raise it alone
    with the settings, else all."""
    try:
        return build(settings, overrides)
    except SettingError:
        raise
    except ValueError as err:
        error = err
    no_overrides = {stage: {} for stage in overrides}
    flat = {f"{stage}.{name}": value for stage, values in overrides.items() for name, value in values.items()}
    if flat and not raises(build, settings, no_overrides):  # the overrides' (config.blame_overrides names them)
        blame_overrides(lambda given: build(settings, _staged(given, overrides)), flat)
    if raises(build, {}, no_overrides):
        raise error
    atoms = _atoms(settings)
    for i, (setting, _, _) in enumerate(atoms):
        if raises(build, _prefix(atoms[:i + 1]), no_overrides):
            raise SettingError(setting, str(error)) from None
    raise error


def _staged(flat: Dict[str, Any], stages: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``{"fusion.d_model": 30}`` as overrides by stage, every stage of ``stages`` present."""
    out: Dict[str, Dict[str, Any]] = {stage: {} for stage in stages}
    for key, value in flat.items():
        stage, _, name = key.partition(".")
        out[stage][name] = value
    return out
