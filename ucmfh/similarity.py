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
    """Binary codes as ±1 float tensor, with sign(0) = +1 (docs/reference.md §5)."""
    return torch.where(x >= 0, 1.0, -1.0).to(torch.float32)


def cosine_similarity_float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity in float64, for ranking. Shape: [N, d], [M, d] -> [N, M] float64.

    Products of float32 inputs are exact in float64, so rounding is ~1e-16; for
    small-integer inputs every similarity is computed exactly alike, so equal
    cosines tie exactly and the ranking's tie rule (retrieval index) decides
    them. A zero row scores 0.
    """
    a = a.double()
    b = b.double()
    inv_a = 1.0 / a.norm(dim=1).clamp(min=1e-300)
    inv_b = 1.0 / b.norm(dim=1).clamp(min=1e-300)
    return (a @ b.T) * inv_a[:, None] * inv_b[None, :]
