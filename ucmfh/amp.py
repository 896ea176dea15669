"""The training's number format, ``--amp``: bfloat16 autocast, TF32 matmuls, or full precision.

- ``none``: float32 throughout (torch's own matmul setting left as it is);
- ``bf16``: the forward pass autocast to bfloat16 (:func:`autocast`); losses, weights and optimizer in float32;
- ``tf32``: float32 tensors whose matmuls, forward and backward, run on a GPU's tensor cores in TF32 (NVIDIA
  Ampere or later: a 10-bit mantissa, float32's range) for the whole of training (:func:`matmul_precision`);
  a CUDA device only. Evaluation after training stays in float32.
"""
from __future__ import annotations

import contextlib
import threading
from typing import ContextManager, Iterator

import torch

from ucmfh.config import SettingError


def autocast(device: torch.device, amp: str) -> ContextManager:
    """The training forward pass's precision: ``bf16`` autocasts matmuls to bfloat16, ``none`` and ``tf32``
    (set for the whole of training by :func:`matmul_precision`) do nothing."""
    if amp != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse ``tf32`` off a CUDA device: the CPU would train in float32 under a run that says TF32."""
    if amp == "tf32" and device.type != "cuda":
        raise SettingError("amp", f"amp 'tf32' runs a GPU's float32 matmuls in TF32 and needs a CUDA device; "
                                  f"this run trains on {device.type} (use amp 'none' or 'bf16')")


_HELD = threading.Lock()
_IN_TF32 = [0, None]  # the blocks in TF32 now (every thread's), and the setting before the first of them


@contextlib.contextmanager
def matmul_precision(amp: str) -> Iterator[None]:
    """Inside the block, CUDA's float32 matmuls run in TF32 if ``amp`` is ``tf32`` (torch's
    ``backends.cuda.matmul.fp32_precision``); the setting before the first such block is restored after the
    last one ends, so runs side by side in threads of one process (``ucmfh grid --jobs N --workers threads``,
    one ``--amp`` for every cell) keep TF32 until the last ends. Other modes change nothing. A CUDA graph
    captured inside keeps the kernels chosen at its capture."""
    if amp != "tf32":
        yield
        return
    matmul = torch.backends.cuda.matmul
    # torch 2.9's setting, or before it allow_tf32 (the two may not be mixed in one process)
    name, tf32 = ("fp32_precision", "tf32") if hasattr(torch.backends, "fp32_precision") else ("allow_tf32", True)
    with _HELD:
        if _IN_TF32[0] == 0:
            _IN_TF32[1] = getattr(matmul, name)
            setattr(matmul, name, tf32)
        _IN_TF32[0] += 1
    try:
        yield
    finally:
        with _HELD:
            _IN_TF32[0] -= 1
            if _IN_TF32[0] == 0:
                setattr(matmul, name, _IN_TF32[1])
