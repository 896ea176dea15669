"""Checkpoints that carry their full config, written atomically and checked on load."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ucmfh.config import FusionConfig, HashConfig, SepsConfig, from_dict, to_dict
from ucmfh.files import PathLike, atomic_binary, check_a_file, checked_path, torch_file_problem, write_text_atomic
from ucmfh.methods import METHODS, PLUGIN_ERRORS, build_method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.run_draws import building_to_replace
from ucmfh.seps.model import SEPS
from ucmfh.utils import check_argument

FORMAT = "ucmfh-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint is unreadable or was made for other settings."""


class MissingCheckpoint(CheckpointError, FileNotFoundError):
    """No checkpoint file is there: a :class:`CheckpointError` and a ``FileNotFoundError`` (as
    :class:`ucmfh.data.format.MissingFile`)."""


def save_checkpoint(
    path: PathLike,
    model: nn.Module,
    fusion_cfg: Optional[FusionConfig],
    hash_cfg: Optional[HashConfig] = None,
    meta: Optional[Dict[str, Any]] = None,
) -> str:
    """Save weights, configs and dims; the file appears only once fully written.

    ``fusion_cfg`` is None for a hashing method trained without a fusion encoder (``uses_fusion``). A
    checkpoint :func:`load_model` would refuse (a hashing model without its ``hash_cfg``, weights that do not
    fit the configs) is refused before anything is written (:class:`CheckpointError`, saying why).
    """
    path = checked_path("save_checkpoint", path)
    if not path:
        raise ValueError("save_checkpoint: an empty path; give the checkpoint file to write")
    check_argument("save_checkpoint", "model", model, nn.Module)
    check_argument("save_checkpoint", "fusion_cfg", fusion_cfg, FusionConfig, optional=True)
    check_argument("save_checkpoint", "hash_cfg", hash_cfg, HashConfig, optional=True)
    dims = getattr(model, "fusion", model)  # a model on a fusion encoder has the encoder's dims
    if not hasattr(dims, "d_img"):
        raise CheckpointError(f"{path}: not saved: {type(model).__name__} is not a model of ucmfh's (it has no "
                              "d_img and d_txt)")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "fusion" if isinstance(model, FusionEncoder) else "hash",
        "d_img": dims.d_img,
        "d_txt": dims.d_txt,
        "fusion_config": None if fusion_cfg is None else to_dict(fusion_cfg),
        "hash_config": None if hash_cfg is None else to_dict(hash_cfg),
        "meta": plain_meta(path, meta),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    try:
        _rebuild(payload)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: not saved, as load_model would refuse it: {err}") from None
    check_checkpoint_path(path)
    return _write(path, payload)


def plain_meta(path: str, meta: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``meta`` as the checkpoint keeps it, checked to be JSON (the settings file beside writes it) before any file
    is written (:class:`CheckpointError`): a NumPy number or a tensor there left a checkpoint without its settings
    file, which load_model refused (torch's ``weights_only``) and a second save would not replace."""
    if meta is not None and not isinstance(meta, dict):
        raise CheckpointError(f"{path}: not saved: meta must be a dict of JSON values, got {type(meta).__name__}")
    try:
        json.dumps(meta or {})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: not saved: its meta holds what JSON cannot write ({err}; give plain "
                              "numbers: float(x), int(x))") from None
    return dict(meta or {})


def check_checkpoint_path(path: PathLike) -> None:
    """Refuse (``FileExistsError``) to write a checkpoint over a file that is not one, or its settings
    (:func:`settings_path`) over a JSON file that is not a checkpoint's: a copy of a dataset, or a user's
    notes.json beside model.pt, were replaced without a word. A checkpoint saved again replaces itself.
    Asked again before a stage trains (:func:`ucmfh.app.stage.reuse_or_fit`), so that a refusal comes first."""
    path = os.fspath(path)
    if settings_path(path) == path:
        raise ValueError(f"{path}: a checkpoint named .json would be written over by its settings (PATH.json); "
                         "name it .pt")
    if os.path.exists(path):
        try:
            read_checkpoint(path)
        except CheckpointError:
            raise FileExistsError(f"{path}: exists and is not a ucmfh checkpoint; not replaced") from None
    settings = settings_path(path)
    if os.path.exists(settings):
        try:
            with open(settings, encoding="utf-8") as f:
                mine = {"kind", "d_img", "d_txt", "meta"} <= set(json.load(f))
        except (OSError, ValueError, TypeError):
            mine = False
        if not mine:
            raise FileExistsError(f"{settings}: exists and is not a checkpoint's settings file, which {path} would "
                                  "write there; not replaced")


def _write(path: str, payload: Dict[str, Any]) -> str:
    """Write a checkpoint atomically, and its settings (everything but the weights) as JSON beside it."""
    # the settings, readable without torch, beside the weights: made first, so that a value JSON cannot hold
    # leaves no checkpoint behind, one its next save would refuse to replace
    settings = {k: v for k, v in payload.items() if k not in ("format", "version", "state_dict")}
    try:
        text = json.dumps(settings, indent=2)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: not saved: its settings hold what JSON cannot write ({err})") from None
    with atomic_binary(path) as f:
        torch.save(payload, f)
    write_text_atomic(settings_path(path), text)
    return path


def settings_path(checkpoint: PathLike) -> str:
    """The JSON file of a checkpoint's settings (everything but its weights), written beside it."""
    return os.path.splitext(os.fspath(checkpoint))[0] + ".json"


def saved_number(checkpoint: PathLike, name: str) -> Optional[float]:
    """A number a saved stage's meta holds, as its settings file (:func:`settings_path`) says, without loading
    the weights: ``seconds`` (its training's), ``threads`` (the CPU threads it trained with); None where there is
    no such file, or it does not say."""
    try:
        with open(settings_path(checkpoint), encoding="utf-8") as f:
            return float(json.load(f)["meta"][name])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_seps(path: PathLike, model: SEPS, meta: Optional[Dict[str, Any]] = None) -> str:
    """Save a SEPS matcher: weights, its :class:`SepsConfig` and the token shapes it was built for."""
    payload = {
        "format": FORMAT, "version": VERSION, "kind": "seps",
        "d_img": model.img_proj.in_features, "d_txt": model.txt_proj.in_features,
        "n_image_tokens": model.n_patches + int(model.image_cls), "image_cls": model.image_cls,
        "dense": model.dense, "seps_config": to_dict(model.cfg), "meta": plain_meta(os.fspath(path), meta),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    check_checkpoint_path(path)
    return _write(os.fspath(path), payload)


def load_seps(path: PathLike, d_img: Optional[int] = None, d_txt: Optional[int] = None,
              n_image_tokens: Optional[int] = None) -> Tuple[SEPS, SepsConfig, Dict[str, Any]]:
    """Rebuild a SEPS matcher, refusing one made for other token shapes. Returns ``(model, cfg, meta)``."""
    path = os.fspath(path)
    payload = read_checkpoint(path)
    _expect(path, payload, "kind", payload["kind"], "seps")
    for name, wanted in (("d_img", d_img), ("d_txt", d_txt), ("n_image_tokens", n_image_tokens)):
        _expect(path, payload, name, payload[name], wanted)
    cfg = from_dict(SepsConfig, payload["seps_config"], source=path)
    model = SEPS(payload["d_img"], payload["d_txt"], payload["n_image_tokens"], cfg, image_cls=payload["image_cls"],
                 dense=payload["dense"])
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:
        raise CheckpointError(f"{path}: weights do not fit the saved config ({err})") from None
    return model.eval(), cfg, payload["meta"]


def read_checkpoint(path: PathLike) -> Dict[str, Any]:
    """The raw checkpoint dict, after checking it is one of ours."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingCheckpoint(f"{path}: no such checkpoint")
    check_a_file(path, "a checkpoint", CheckpointError)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise CheckpointError(f"{path}: not a readable checkpoint ({torch_file_problem(path, err)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a ucmfh checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')}, this ucmfh reads {VERSION}")
    problem = _payload_problem(payload)
    if problem:
        raise CheckpointError(f"{path}: a damaged checkpoint ({problem})")
    method = (payload.get("hash_config") or {}).get("method")
    if method is not None and method not in METHODS:
        failed = f"; not loaded: {method} ({PLUGIN_ERRORS[method]})" if method in PLUGIN_ERRORS else ""
        raise CheckpointError(f"{path}: a checkpoint of method {method!r}, which is not one of this ucmfh's "
                              f"({', '.join(METHODS)}){failed}; a method of another package is read where that "
                              "package is installed (docs/methods.md)")
    return payload


def _payload_problem(payload: Dict[str, Any]) -> Optional[str]:
    """What in a checkpoint's payload no ucmfh writes, or None: a kind other than fusion, hash and seps, widths
    that are not positive whole numbers, configs or meta that are not mappings, weights that are not tensors by
    name."""
    if payload.get("kind") not in ("fusion", "hash", "seps"):
        return f"kind {payload.get('kind')!r}, not fusion, hash or seps"
    needed = ("seps_config", "meta") if payload["kind"] == "seps" else ("fusion_config", "hash_config", "meta")
    missing = [name for name in (*needed, "d_img", "d_txt", "state_dict") if name not in payload]
    if missing:
        return f"no {', '.join(missing)}"
    for name in ("d_img", "d_txt"):
        if not isinstance(payload.get(name), int) or isinstance(payload.get(name), bool) or payload[name] < 1:
            return f"{name} {payload.get(name)!r}"
    for name in ("fusion_config", "hash_config", "seps_config", "meta"):
        if payload.get(name) is not None and not isinstance(payload[name], dict):
            return f"{name} is a {type(payload[name]).__name__}, not a mapping"
    weights = payload.get("state_dict")
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        return "its weights are not tensors by name"
    return None


def _check_version(path: str, payload: Dict[str, Any], method: str) -> None:
    """Refuse a checkpoint made by another version of its method (:attr:`ucmfh.methods.Method.version`, a method
    of another package) than the one installed: the installed code would rebuild and score another model. A
    checkpoint that records no run identity (saved by a library caller) is not checked."""
    identity = (payload.get("meta") or {}).get("identity")
    if not isinstance(identity, dict) or not isinstance(identity.get("hash"), dict):
        return
    made, installed = identity["hash"].get("method_version", ""), build_method(method).version
    if made != installed:
        raise CheckpointError(f"{path}: made by version {made or 'none'} of method {method!r}, but version "
                              f"{installed or 'none'} is installed; read it where that version is")


# what a checkpoint of each kind is, in a refusal: the file a user gave is named by what it holds
KIND_NAMES = {"fusion": "a fusion stage's checkpoint (fusion.pt)", "hash": "a hashing checkpoint (hashN.pt)",
              "seps": "a SEPS checkpoint (seps.pt)"}


def _expect(path: str, payload: Dict[str, Any], name: str, actual: Any, wanted: Optional[Any]) -> None:
    if wanted is None or actual == wanted:
        return
    if name == "kind":
        raise CheckpointError(f"{path}: is {KIND_NAMES.get(actual, f'a checkpoint of kind {actual!r}')}; "
                              f"{KIND_NAMES.get(wanted, wanted)} is needed here")
    raise CheckpointError(f"{path}: made for {name}={actual}, but {name}={wanted} was asked for")


def load_model(
    path: PathLike,
    kind: str,
    d_img: Optional[int] = None,
    d_txt: Optional[int] = None,
    n_bits: Optional[int] = None,
) -> Tuple[nn.Module, Optional[FusionConfig], Optional[HashConfig], Dict[str, Any]]:
    """Rebuild a model from a checkpoint, refusing one made for other settings.

    Returns ``(model, fusion_cfg, hash_cfg, meta)``; ``kind`` is 'fusion' or 'hash'; ``fusion_cfg``
    is None for a hashing method trained without a fusion encoder.
    """
    path = checked_path("load_model", path)
    if kind not in ("fusion", "hash"):  # 'foo is needed here', and None took either
        raise ValueError(f"load_model: kind must be 'fusion' or 'hash' (a SEPS matcher: load_seps), got {kind!r}")
    payload = read_checkpoint(path)
    _expect(path, payload, "kind", payload["kind"], kind)
    _expect(path, payload, "image feature dim", payload["d_img"], d_img)
    _expect(path, payload, "text feature dim", payload["d_txt"], d_txt)
    if payload["hash_config"] is not None:
        _expect(path, payload, "n_bits", payload["hash_config"].get("n_bits"), n_bits)
        _check_version(path, payload, payload["hash_config"].get("method", HashConfig.method))
    try:
        model, fusion_cfg, hash_cfg = _rebuild(payload)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    return model.eval(), fusion_cfg, hash_cfg, payload["meta"]


def _rebuild(payload: Dict[str, Any]) -> Tuple[nn.Module, Optional[FusionConfig], Optional[HashConfig]]:
    """The model, fusion config and hashing config a checkpoint's payload holds, its weights loaded;
    :class:`CheckpointError` saying why not (the caller names the file)."""
    try:
        hash_cfg = None if payload["hash_config"] is None else from_dict(HashConfig, payload["hash_config"])
        fusion_cfg = None if payload["fusion_config"] is None else from_dict(FusionConfig, payload["fusion_config"])
    except ValueError as err:  # a seed of 2**32 an older ucmfh took: it said only '…, got 4294967296'
        raise CheckpointError(f"its settings are refused by this ucmfh ({err}): a checkpoint of an older ucmfh that "
                              "took them, or an edited one; train it again") from None
    if payload["kind"] == "hash" and hash_cfg is None:
        raise CheckpointError("a hashing checkpoint without its hashing settings")
    broken = next((name for name, w in payload["state_dict"].items()
                   if w.is_floating_point() and not torch.isfinite(w).all()), None)
    if broken is not None:  # its codes would be every bit set, scored at chance's level without a word
        raise CheckpointError(f"weights that are NaN or infinite ({broken}): a model whose training diverged, or a "
                              "damaged file")
    with building_to_replace():  # loading or saving a checkpoint leaves a caller's draws as they were
        model = _empty_model(payload, fusion_cfg, hash_cfg)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:  # torch's message: a line a tensor, under a heading; the first problem said
        lines = [line.strip().rstrip(".") for line in str(err).splitlines()[1:] if line.strip()]
        more = f"; {len(lines) - 1} more" if len(lines) > 1 else ""
        raise CheckpointError(f"weights do not fit the saved config ({lines[0] if lines else err}{more})") from None
    return model, fusion_cfg, hash_cfg


def _empty_model(payload: Dict[str, Any], fusion_cfg: Optional[FusionConfig],
                 hash_cfg: Optional[HashConfig]) -> nn.Module:
    """The model a checkpoint's weights are loaded into, as its payload describes it."""
    if payload["kind"] == "fusion":
        if fusion_cfg is None:
            raise CheckpointError("a fusion checkpoint without its fusion settings")
        return FusionEncoder.from_config(payload["d_img"], payload["d_txt"], fusion_cfg)
    try:  # the method's own model ('distill' records its teacher's settings too, but has no encoder)
        return build_method(hash_cfg.method).build_model(payload["d_img"], payload["d_txt"], hash_cfg, fusion_cfg)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
