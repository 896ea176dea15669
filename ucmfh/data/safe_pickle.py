"""Read a pickle someone else wrote without running its code: only arrays, tensors and plain containers.

``pickle.load`` calls whatever function the file names (a ``train.pkl`` from a file-sharing link can
reduce to ``os.system``). :class:`DataUnpickler` resolves only the globals that data needs:

* numpy arrays, dtypes and scalars, as numpy 1 (``numpy.core``) and numpy 2 (``numpy._core``) pickle them;
* torch tensors: ``_rebuild_tensor_v2`` and the storage's bytes, which are read by
  ``torch.load(weights_only=True)`` (plain ``pickle`` would hand them to an unrestricted ``torch.load``);
* a ``torch.save`` archive (a zip, torch's format since 1.6) is read by ``torch.load(weights_only=True)``;
* the builtin containers (dict, list and tuple need no global; set, frozenset, bytes, bytearray,
  ``collections.OrderedDict``) and ``_codecs.encode``, which protocols 0–2 use to write bytes.

Any other global is refused before it is imported or called: :class:`RefusedGlobal`, which
:func:`load_pickle` reports as a ``DataError`` naming the file and the global.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import re
import zipfile
from typing import Any, Callable

from ucmfh.data.format import DataError
from ucmfh.files import PathLike

REFUSAL = "only arrays, tensors and plain containers are read from a pickle"

_NUMPY = {("numpy", "ndarray"), ("numpy", "dtype")} | {
    (f"numpy.{core}.{module}", name)
    for core in ("core", "_core")
    for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer"))
}
_CONTAINERS = {(module, name) for module in ("builtins", "__builtin__")  # Python 2's name, protocols 0-2
               for name in ("set", "frozenset", "bytes", "bytearray")}
_TORCH = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}
ALLOWED = _NUMPY | _CONTAINERS | _TORCH | {("_codecs", "encode")}
_TORCH_STORAGE = ("torch.storage", "_load_from_bytes")


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle asked for a global outside the allow-list; ``name`` is ``module.name``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"refuses to load {name!r}: {REFUSAL}")
        self.name = name


def _storage_from_bytes(data: bytes) -> Any:
    """A tensor's storage as ``torch.storage._load_from_bytes`` reads it, but with ``weights_only``."""
    import torch

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only refused a global; its message names it
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        raise RefusedGlobal(found.group(1) if found else "an object inside a tensor's storage") from None


class DataUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that resolves only the globals of :data:`ALLOWED` (module docstring)."""

    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        if (module, name) == _TORCH_STORAGE:
            return _storage_from_bytes
        if (module, name) not in ALLOWED:
            raise RefusedGlobal(f"{module}.{name}")
        if module.startswith("numpy._core.") and importlib.util.find_spec("numpy._core") is None:
            module = "numpy.core." + module[len("numpy._core."):]  # numpy 2's pickle read by numpy < 1.26.1
        return super().find_class(module, name)


def _load_torch_archive(path: str) -> Any:
    """What ``torch.save`` wrote to ``path``, read by ``torch.load(weights_only=True)``: tensors, numbers and
    containers, no code run (torch's own allow-list)."""
    import numpy as np
    import torch

    try:
        with zipfile.ZipFile(path) as archive:
            torch_made = any(name.endswith("/data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):  # cut short: torch says how, below
        torch_made = True
    if not torch_made:
        raise DataError(f"{path}: a zip archive, not a pickle or a torch.save archive (an .npz? 'ucmfh convert npz' "
                        "reads those)")
    core = getattr(np, "_core", None) or np.core  # numpy 2's name, numpy 1's
    arrays = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype] + [
        type(np.dtype(code)) for code in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]]
    allowing = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5; before it, tensors alone
    try:
        with allowing(arrays) if allowing else contextlib.nullcontext():  # numpy's numeric arrays, as a pickle's
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # weights_only refused a global; its message names it
        found = re.search(r"GLOBAL ([\w.]+)|got <class '([^']+)'>", str(err))  # torch's two wordings
        what = found.group(found.lastindex) if found else "an object in it"
        raise DataError(f"{path}: a torch.save archive: refuses to load {what}: {REFUSAL}") from None
    except Exception as err:  # a damaged archive fails with almost any type
        said = str(err).split(". ")[0]  # torch's first sentence; the rest is advice on checkpoints
        raise DataError(f"{path}: a torch.save archive, not readable ({type(err).__name__}: {said})") from None


def load_pickle(path: PathLike) -> Any:
    """The object the pickle file ``path`` holds, read by :class:`DataUnpickler` (a ``torch.save`` archive by
    ``torch.load(weights_only=True)``).

    ``DataError`` naming ``path``: the global it refused, or why the file is unreadable.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            archive = f.read(4) == b"PK\x03\x04"  # a zip: torch.save's archive (its format since torch 1.6)
    except OSError as err:
        raise DataError(f"{path}: not readable ({err.strerror or err})") from None
    if archive:
        return _load_torch_archive(path)
    try:
        with open(path, "rb") as f:
            return DataUnpickler(f).load()
    except RefusedGlobal as err:
        raise DataError(f"{path}: {err}") from None
    except Exception as err:  # a damaged pickle fails with almost any type
        raise DataError(f"{path}: not a readable pickle, truncated or damaged ({type(err).__name__}: {err})") from None
