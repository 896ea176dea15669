"""Binary codes as packed bits, and the HDF5 file that holds a model's codes for evaluation.

Bit convention: a ±1 code is packed with ``numpy.packbits`` order (bit 0 of a
code is the most significant bit of its first byte); +1 is a set bit, -1 (and
sign(0) = +1, REFERENCE §5) a clear one; the last byte is padded with zeros.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Union

import numpy as np
import torch

ArrayLike = Union[np.ndarray, torch.Tensor]

_BIT_WEIGHTS = (1 << np.arange(7, -1, -1)).astype(np.uint8)  # packbits order: MSB first


def pack_codes(codes: ArrayLike) -> np.ndarray:
    """Pack ±1 codes into bits. Shape: [N, n_bits] -> [N, ceil(n_bits / 8)] uint8.

    Values >= 0 become set bits, so real-valued head outputs pack as their sign.
    """
    if isinstance(codes, torch.Tensor):
        codes = codes.detach().cpu().numpy()
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be 2-D [N, n_bits], got shape {codes.shape}")
    return np.packbits(codes >= 0, axis=1)


def unpack_codes(packed: ArrayLike, n_bits: int) -> torch.Tensor:
    """Unpack bits into ±1 float32 codes, on the device of ``packed`` when it is a tensor.

    Shape: [N, ceil(n_bits / 8)] uint8 -> [N, n_bits] float32.
    """
    if not isinstance(packed, torch.Tensor):
        packed = torch.from_numpy(np.ascontiguousarray(packed))
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        raise ValueError(f"packed codes must be 2-D uint8, got {packed.dtype} {tuple(packed.shape)}")
    if not 0 < n_bits <= 8 * packed.shape[1]:
        raise ValueError(f"n_bits={n_bits} does not fit {packed.shape[1]} bytes per code")
    weights = torch.from_numpy(_BIT_WEIGHTS).to(packed.device)
    bits = (packed[:, :, None] & weights) != 0  # [N, bytes, 8]
    bits = bits.reshape(packed.shape[0], -1)[:, :n_bits]
    return torch.where(bits, 1.0, -1.0)
