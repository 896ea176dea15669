"""Seeds and devices: the one place each is decided; the type of an argument at a public entry point, and what a
mistyped name was meant to be."""
from __future__ import annotations

import contextlib
import difflib
import itertools
import random
from typing import Any, Iterable, Iterator, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator for the run's own draws.

    Shuffles and masks are drawn from the returned CPU generator, so a seed
    gives the same batches on every device.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return torch.Generator().manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else the CPU.

    An unknown device name, or CUDA on a machine where torch sees none, is a
    ``ValueError`` that says so (never a silent fall-back to the CPU).
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r}: unknown; use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ValueError(f"device {device!r}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
                             f"{build}); choose cpu or auto")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif resolved.type != "cpu":
        raise ValueError(f"device {device!r}: ucmfh runs on cpu or cuda")
    return resolved


# Each batch of a plan on the device, and the same indices on the host: what a step reads from a file
# needs them on the host, and asking the device for them would wait for every step queued before.
_HOST_TWIN = WeakIdKeyDictionary()


def keep_host_copy(on_device: torch.Tensor, on_host: torch.Tensor) -> None:
    """Remember that ``on_host`` holds the values of ``on_device`` (for as long as ``on_device`` lives)."""
    _HOST_TWIN[on_device] = on_host


def known_host_copy(index: torch.Tensor) -> Optional[torch.Tensor]:
    """The host copy :func:`keep_host_copy` remembered for ``index``, or None."""
    return _HOST_TWIN.get(index)


def host_index(index: torch.Tensor) -> torch.Tensor:
    """``index`` on the host: the copy a training plan kept of its batches (:func:`keep_host_copy`),
    without asking the device (which would wait for the steps queued before); else a copy."""
    twin = _HOST_TWIN.get(index)
    return twin if twin is not None else index.cpu()


def to_device(x: torch.Tensor, device: torch.device, keep_host: bool = False) -> torch.Tensor:
    """Rows onto ``device``: from the host to a GPU through pinned memory, without waiting for the device
    (a copy from pageable memory waits for every kernel queued before it); ``.to(device)`` otherwise.
    ``keep_host``: remember ``x`` as the copy's host twin (:func:`known_host_copy`)."""
    device = torch.device(device)
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    out = x.pin_memory().to(device, non_blocking=True)
    if keep_host:
        keep_host_copy(out, x)
    return out


@contextlib.contextmanager
def evaluating(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """``model`` on ``device`` in eval mode for the block, then as it was: each module's mode (a model scored
    mid-training, a frozen part in eval mode) and the device of its weights (a caller's model is scored on a GPU
    and stays where it was)."""
    modes = [(module, module.training) for module in model.modules()]
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    where = None if first is None else first.device  # before the move: a parameter's data is replaced by it
    model.to(device).eval()
    try:
        yield model
    finally:
        if where is not None:
            model.to(where)
        for module, training in modes:
            module.training = training


def check_argument(where: str, name: str, value: Any, kind: Union[type, Tuple[type, ...]], make: str = "",
                   optional: bool = False) -> None:
    """Refuse an argument of another type at a public entry point, before it fails deep inside
    (``TypeError``: ``fit_hashing: data must be a Dataset (ucmfh.load_dataset(path)), got str 'wiki.h5'``).
    ``make``: how to get one; ``optional``: None is accepted too."""
    if isinstance(value, kind) or (optional and value is None):
        return
    kinds = kind if isinstance(kind, tuple) else (kind,)
    wanted = " or ".join(f"{'an' if k.__name__[0] in 'aeiouAEIOU' else 'a'} {k.__name__}" for k in kinds)
    raise wrong_argument(where, name, value, wanted + (" or None" if optional else ""), make)


def wrong_argument(where: str, name: str, value: Any, what: str, make: str = "") -> TypeError:
    """The error of :func:`check_argument`: ``WHERE: NAME must be WHAT (MAKE), got TYPE 'value'``."""
    shown = f" {value!r}"[:80] if isinstance(value, (str, bytes, int, float)) or hasattr(value, "__fspath__") else ""
    return TypeError(f"{where}: {name} must be {what}{f' ({make})' if make else ''}, got {type(value).__name__}{shown}")


def did_you_mean(name: Any, names: Iterable[str]) -> str:
    """`` (did you mean 'two-tower'?)`` where ``name``, unknown, is close to one of ``names``; '' otherwise (a
    method or loss name mistyped was refused with the whole list alone, click's options with a suggestion)."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.7) if isinstance(name, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""
