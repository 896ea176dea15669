"""CUDA streams of their own (:func:`unshared_stream`) for work side by side in one process.

PyTorch's ``torch.cuda.Stream()`` hands out the streams of a pool, 32 a device and priority, round-robin: the
33rd stream a process asks for is the first again. Runs side by side in threads (a grid's cells, a run's
candidates) each ask for one, and a captured step for another: after a few cells two live runs could share one,
and one run's work (its validation, a read of its loss) would be recorded into the other's graph while it
captures, or invalidate it. A stream drawn here is none that another live one drawn here is.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Optional

import torch

_LIVE: Dict[Any, int] = {}  # (device, stream handle) -> the live streams drawn here that are it
_LOCK = threading.Lock()
POOL_DRAWS = 64  # draws to find a stream no live one is: the pool's 32, twice


def unshared_stream(device: Optional[Any] = None, make: Optional[Callable[..., Any]] = None) -> Any:
    """A CUDA stream on ``device`` (the current GPU where None) that no other live stream drawn here is, while
    fewer than the pool's streams are live (then one of them: PyTorch's pool has no more). ``make``: what makes
    one (``torch.cuda.Stream``; tests give their own)."""
    make = make or torch.cuda.Stream
    with _LOCK:
        for _ in range(POOL_DRAWS):
            stream = make(device=device)
            key = (str(stream.device), stream.cuda_stream)
            if key not in _LIVE:
                break
        _LIVE[key] = _LIVE.get(key, 0) + 1
    weakref.finalize(stream, _release, key)
    return stream


def _release(key: Any) -> None:
    with _LOCK:
        _LIVE[key] -= 1
        if not _LIVE[key]:
            del _LIVE[key]
