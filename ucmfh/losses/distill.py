"""The targets of method 'distill': a fused teacher's neighbours mixed into InfoNCE's pairs."""
from __future__ import annotations

from typing import Optional

import torch

from ucmfh.similarity import normalize, positive_mask


def fused_embedding(z_img: torch.Tensor, z_txt: torch.Tensor) -> torch.Tensor:
    """The teacher's view of a pair: ``normalize(normalize(z_img) + normalize(z_txt))``. Shape: two [B, d] -> [B, d]."""
    return normalize(normalize(z_img) + normalize(z_txt))


def distill_targets(teacher: torch.Tensor, ids: Optional[torch.Tensor], weight: float,
                    temperature: float) -> torch.Tensor:
    """The soft targets of a batch: ``(1 - weight) · P + weight · softmax(t tᵀ / τ_t)``, P the pair itself
    (shared among the items of an id), rows summing to one; used with :func:`ucmfh.losses.soft_infonce`.

    Shape: t [B, d] -> [B, B]."""
    pairs = positive_mask(len(teacher), ids, device=teacher.device).float()
    return (1 - weight) * pairs / pairs.sum(1, keepdim=True) + weight * torch.softmax(
        teacher @ teacher.T / temperature, dim=1)
