"""VSE++ hinge triplet loss with SEPS's multi-positive mask (docs/reference.md §4 'triplet')."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ucmfh.losses.base import CrossModalLoss, as_number
from ucmfh.similarity import cosine_similarity, dot_similarity, positive_mask


class TripletLoss(CrossModalLoss):
    """Bidirectional hinge ranking loss, summed, optionally over the hardest negatives only.

    Faghri et al., "VSE++: Improving Visual-Semantic Embeddings with Hard
    Negatives", BMVC 2018; the multi-positive mask (every pair with the query's id
    is a positive) is SEPS's fix (docs/reference.md §8).

    With ``s = img txtᵀ`` (B × B; cosine when ``normalize=True``), P the
    positives (the diagonal, and equal ids where given) and the anchor of row
    i the mean of its positive scores, ``a_i = mean_{j ∈ P_i} s_ij``::

        cost_i2t[i, j] = [m + s_ij − a_i]_+        (image i retrieves texts)
        cost_t2i[i, j] = [m + s_ij − a_j]_+        (text j retrieves images)

    both zeroed on P. The loss is the sum of both; with ``max_violation`` only
    the hardest negative of each row (i2t) and each column (t2i) counts.
    Following docs/reference.md §4, the t2i anchor of column j is the row anchor a_j;
    without ids it is s_jj either way. ``labels`` are ignored.

    Args:
        margin: m >= 0 (VSE++: 0.2).
        max_violation: keep only the hardest negative per row / column.
        normalize: L2-normalise img and txt rows first, so the margin is on
            the cosine scale (UCMFH's embeddings and heads are normalised).

    Shape:
        img: [B, d], B >= 2
        txt: [B, d]
        ids: [B] or None
        output: scalar

    Example:
        >>> loss_fn = TripletLoss(margin=0.2, max_violation=True)
        >>> ids = torch.tensor([0, 0, 1, 2, 3, 3, 4, 5])
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16), ids=ids)
    """

    def __init__(self, margin: float = 0.2, max_violation: bool = False, normalize: bool = True) -> None:
        super().__init__()
        margin = as_number(margin, "margin")
        if not (margin >= 0 and math.isfinite(margin)):
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        for name, flag in (("max_violation", max_violation), ("normalize", normalize)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        self.margin = margin
        self.max_violation = max_violation
        self.normalize = normalize

    def extra_repr(self) -> str:
        return f"margin={self.margin}, max_violation={self.max_violation}, normalize={self.normalize}"

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        s = cosine_similarity(img, txt) if self.normalize else dot_similarity(img, txt)  # [B, B]
        return vse_hinge(s, positive_mask(img.shape[0], ids, device=img.device), self.margin, self.max_violation)


def vse_hinge(s: torch.Tensor, pos: torch.Tensor, margin: float, max_violation: bool) -> torch.Tensor:
    """The multi-positive VSE++ hinge of :class:`TripletLoss` on a similarity matrix (also SEPS's loss).

    Shape: s [B, B] (image i, text j), pos [B, B] bool, symmetric, true on the diagonal -> scalar.
    """
    pos_f = pos.to(s.dtype)
    anchor = (s * pos_f).sum(dim=1) / pos_f.sum(dim=1)  # [B], each row has its own pair
    cost_i2t = (margin + s - anchor[:, None]).clamp(min=0).masked_fill(pos, 0.0)
    cost_t2i = (margin + s - anchor[None, :]).clamp(min=0).masked_fill(pos, 0.0)
    if max_violation:
        return cost_i2t.max(dim=1).values.sum() + cost_t2i.max(dim=0).values.sum()
    return cost_i2t.sum() + cost_t2i.sum()
