"""The one home of similarities and distances, shared by every loss and the evaluation."""
from __future__ import annotations

from typing import Optional, Tuple

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


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2 ** exponent as float64, built from its bits: exact on every device (``pow`` need not be)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def exact_rows(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row scaled by a power of two and rounded to integers of at most ``S`` bits, and their
    norms: the parts of :func:`cosine_similarity_float64`. Shape: [N, d] -> ([N, d], [N]) float64.

    ``S = (53 - ceil(log2 d)) // 2`` (23 bits at 64 dims, 22 at 512, 20 at 4096: a float32 carries
    24), so every dot product of two such rows, and every partial sum of it, is an integer below
    2**53: exact in float64 whatever the order of summation. Scaling by a power of two and rounding
    are exact too, so the parts are the same bits on every device.
    """
    x = x.double()
    bits = (53 - max(x.shape[1] - 1, 1).bit_length()) // 2
    _, exponent = torch.frexp(x.abs().amax(dim=1))  # largest |x| of the row in [2**(e-1), 2**e)
    rows = torch.round(x * _power_of_two(bits - exponent)[:, None])
    return rows, (rows * rows).sum(dim=1).sqrt()


def cosine_similarity_float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity for ranking, the same float64 on every device and block shape.
    Shape: [N, d], [M, d] -> [N, M] float64.

    Computed from :func:`exact_rows`: the dot products are exact integers, and the norms' square
    root, their product and the division are each rounded once, as IEEE 754 prescribes on every
    device. So two items with the same cosine tie exactly and the ranking's tie rule (retrieval
    index) decides them, whichever device, chunk size or BLAS computes it; a plain float64 matmul
    sums in an order that the device and the block shape choose, and can order such a tie by its
    last bit. The rounding moves a cosine by about 2**-S (``S`` as in :func:`exact_rows`), below a
    float32 input's own precision. A zero row scores 0.
    """
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"rows of {a.shape[1]} and {b.shape[1]} dimensions")
    return exact_cosine(exact_rows(a), exact_rows(b))


def exact_cosine(a: Tuple[torch.Tensor, torch.Tensor], b: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """:func:`cosine_similarity_float64` from both sides' :func:`exact_rows`, for a side scored against many
    others (made once). Shape: ([N, d], [N]), ([M, d], [M]) -> [N, M] float64."""
    (rows_a, norm_a), (rows_b, norm_b) = a, b
    return (rows_a @ rows_b.T) / (norm_a.clamp(min=1.0)[:, None] * norm_b.clamp(min=1.0)[None, :])
