"""What every cross-modal loss shares: argument checks and float32 (or float64) arithmetic."""
from __future__ import annotations

import numbers
from typing import ClassVar, Optional

import numpy as np
import torch
from torch import nn


def as_number(value: object, name: str) -> float:
    """``value`` as a float, or ValueError naming the hyper-parameter (a string or a bool is not a number; numpy's
    scalars are, float32's as float64's)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_temperature(temperature: float, name: str = "temperature") -> float:
    """``temperature`` as a float, or ValueError unless it is finite and > 0."""
    t = as_number(temperature, name)
    if not (t > 0 and t < float("inf")):
        raise ValueError(f"{name} must be a finite number > 0, got {temperature!r}")
    return t


def _upcast(x: torch.Tensor) -> torch.Tensor:
    # Half precision would overflow exp() at small temperatures; float64 is
    # kept so that gradcheck can run in double precision.
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


class CrossModalLoss(nn.Module):
    """Base class: ``forward(img, txt, ids=None, labels=None) -> Tensor`` for every loss.

    Subclasses implement :meth:`compute`, which receives checked inputs of
    dtype float32 or float64 (half and bfloat16 are upcast) with autocast
    switched off, so a loss computes the same in and out of mixed precision.
    ``ids`` and ``labels`` arrive on the device of ``img``.

    Shape:
        img: [B, d]; txt: [B, d] with B >= 2; ids: [B] or None; labels: [B, C] or None -> scalar.
    """

    uses_labels: ClassVar[bool] = False  # what supervised training (--supervised) gives it changes it

    def forward(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        for value, name in ((img, "img"), (txt, "txt"), (ids, "ids"), (labels, "labels")):
            if value is not None and not isinstance(value, torch.Tensor):  # numpy's failed deep inside
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__} "
                                "(torch.as_tensor(...) makes one)")
        if img.ndim != 2 or txt.shape != img.shape or img.shape[0] < 2:
            raise ValueError(
                f"expected img and txt of one shape [B, d] with B >= 2, got {tuple(img.shape)} and {tuple(txt.shape)}"
            )
        b = img.shape[0]
        if ids is not None:
            if ids.shape != (b,):
                raise ValueError(f"ids must have shape ({b},), got {tuple(ids.shape)}")
            ids = ids.to(img.device)
        if labels is not None:
            if labels.ndim != 2 or labels.shape[0] != b:
                raise ValueError(f"labels must have shape ({b}, C), got {tuple(labels.shape)}")
            labels = labels.to(img.device)
        img, txt = _upcast(img), _upcast(txt)
        if img.dtype != txt.dtype:  # float64 beside float32: one matmul refused the pair
            dtype = torch.promote_types(img.dtype, txt.dtype)
            img, txt = img.to(dtype), txt.to(dtype)
        with torch.autocast(device_type=img.device.type, enabled=False):
            return self.compute(img, txt, ids, labels)

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        raise NotImplementedError
