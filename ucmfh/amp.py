"""The training forward pass's number format, ``--amp``: bfloat16 autocast or full precision."""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch


def autocast(device: torch.device, amp: str) -> ContextManager:
    """The training forward pass's precision: ``bf16`` autocasts matmuls to bfloat16, ``none`` does nothing."""
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
