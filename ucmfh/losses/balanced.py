"""UCMFH's ``ContrastiveLossBalanced``: image→text InfoNCE with HashNet's S/S1, S/S0 weights.

docs/reference.md §4 'balanced'.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ucmfh.losses.base import CrossModalLoss, check_temperature
from ucmfh.similarity import cosine_similarity, positive_mask


class BalancedContrastiveLoss(CrossModalLoss):
    """Cross-modal InfoNCE whose positives and negatives are re-weighted as in HashNet.

    The weighting is HashNet's (Cao et al., "HashNet: Deep Learning to Hash by
    Continuation", ICCV 2017), applied to the contrastive loss of UCMFH (Xia et
    al., Information Fusion 2023) as in the ``ContrastiveLossBalanced`` variant.

    With ``s = z_img z_txtᵀ / τ`` (B × B), P the positive pairs (the diagonal,
    and equal ids where given), S1 = |P|, S0 = B² − S1, S = B², ``w_pos = S/S1``
    and ``w_neg = S/S0``::

        ℓ_i  = −log( e^{s_ii} / (e^{s_ii} + w_neg · Σ_{j ∉ P_i} e^{s_ij}) )
        loss = mean_i (w_pos · ℓ_i)

    computed as a log-sum-exp with ``log w_neg`` added to the negative logits.
    Other positives of row i (same id, j ≠ i) are neither numerator nor
    denominator, so they are never pushed apart. Without ids and B = 128:
    w_pos = 128, w_neg ≈ 1.008, so the loss is about B times an unweighted
    InfoNCE. With ``symmetric=True`` the same loss over the columns
    (text→image) is added and the two directions are averaged, so the scale
    does not change. ``labels`` are ignored (the loss is unsupervised).

    Args:
        temperature: τ > 0 (UCMFH: 0.5).
        symmetric: also the text→image direction (mean of both).

    Shape:
        img: [B, d], B >= 2
        txt: [B, d]
        ids: [B] or None
        output: scalar

    Example:
        >>> loss_fn = BalancedContrastiveLoss(temperature=0.5, symmetric=True)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.5, symmetric: bool = False) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        if not isinstance(symmetric, bool):
            raise ValueError(f"symmetric must be a bool, got {symmetric!r}")
        self.symmetric = symmetric

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, symmetric={self.symmetric}"

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        b = img.shape[0]
        s = cosine_similarity(img, txt) / self.temperature  # [B, B]
        pos = positive_mask(b, ids, device=img.device)  # [B, B], symmetric
        # counts stay tensors: no host-device sync per step
        n_pos = pos.sum().to(s.dtype)  # S1 >= B: every diagonal pair is positive
        n_neg = b * b - n_pos  # S0
        w_pos = b * b / n_pos
        # With no negative pair every row's loss is 0 whatever w_neg is.
        log_w_neg = torch.where(n_neg > 0, math.log(b * b) - n_neg.clamp(min=1).log(), 0.0)
        diag = torch.eye(b, dtype=torch.bool, device=img.device)
        # the numerator's own pair, and the negatives shifted by log w_neg; other positives dropped
        logits = torch.where(diag, s, s + log_w_neg).masked_fill(pos & ~diag, float("-inf"))
        rows = torch.logsumexp(logits, dim=1) - s.diagonal()  # [B]
        if not self.symmetric:
            return w_pos * rows.mean()
        cols = torch.logsumexp(logits, dim=0) - s.diagonal()  # [B]
        return w_pos * 0.5 * (rows.mean() + cols.mean())
