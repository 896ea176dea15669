"""The one home of similarities and distances, shared by every loss and the evaluation."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """L2-normalise rows; a zero row stays zero (no NaN). Shape: [N, d] -> [N, d]."""
    return F.normalize(x, dim=-1, eps=eps)


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``a`` with every row of ``b``. Shape: [N, d], [M, d] -> [N, M]."""
    return normalize(a) @ normalize(b).T


def dot_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Inner products. Shape: [N, d], [M, d] -> [N, M]."""
    return a @ b.T


def hamming_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamming distances between ±1 codes by one matmul. Shape: [N, n_bits], [M, n_bits] -> [N, M] int64.

    Exact for any n_bits: float32 represents the integer dot products exactly
    (|a·b| <= n_bits << 2**24).
    """
    n_bits = a.shape[1]
    dots = a.float() @ b.float().T
    return ((n_bits - dots) / 2).round().long()


def label_relevance(labels_a: torch.Tensor, labels_b: torch.Tensor) -> torch.Tensor:
    """Relevance by shared labels: ``labels_a[i] · labels_b[j] > 0``. Shape: [N, C], [M, C] -> [N, M] bool."""
    return (labels_a.float() @ labels_b.float().T) > 0


def positive_mask(
    n: int,
    ids: Optional[torch.Tensor] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Which (i, j) of a batch are positives: the diagonal, and equal ids where given. Shape: [n, n] bool."""
    if ids is None:
        return torch.eye(n, dtype=torch.bool, device=device)
    if ids.shape != (n,):
        raise ValueError(f"ids must have shape ({n},), got {tuple(ids.shape)}")
    return ids[:, None] == ids[None, :]


def sign_codes(x: torch.Tensor) -> torch.Tensor:
    """Binary codes as ±1 float tensor, with sign(0) = +1 (REFERENCE §5)."""
    return torch.where(x >= 0, 1.0, -1.0).to(torch.float32)
