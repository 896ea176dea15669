"""HashNet's weighted pairwise loss (``pairwise_loss_updated``; docs/reference.md §4 'pairwise')."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ucmfh.losses.base import CrossModalLoss, as_number
from ucmfh.similarity import cosine_similarity, dot_similarity, label_relevance, positive_mask


class WeightedPairwiseLoss(CrossModalLoss):
    """Weighted maximum-likelihood pairwise loss between image and text codes.

    Cao et al., "HashNet: Deep Learning to Hash by Continuation", ICCV 2017.

    Pairs (i, j) of the B × B cross-modal batch are similar, ``sim_ij = 1``, when
    ``labels_i · labels_j > 0`` (supervised), or they share an id, or i = j;
    with neither labels nor ids only the diagonal is similar. Then::

        dp_ij = α · u_i · v_jᵀ          (u, v = img, txt, L2-normalised unless normalize=False)
        ℓ_ij  = log(1 + e^{−|dp_ij|}) + max(dp_ij, 0) − sim_ij · dp_ij      (= log(1 + e^{dp}) − sim·dp)
        loss  = Σ_ij w_ij ℓ_ij / S,     w = S/S1 on similar pairs, S/S0 on dissimilar ones

    with S1, S0 the numbers of similar and dissimilar pairs and S = B². This is
    the mean ℓ over similar pairs plus the mean ℓ over dissimilar pairs; when a
    batch has only one kind, the other term is absent (no NaN).

    HashNet's code uses α = 10 / n_bits on raw tanh codes, so that α·u·v lies
    in [−10, 10]; on L2-normalised codes (``normalize=True``, the default) the
    same range is α = 10.

    Args:
        alpha: scale α > 0 of the inner products.
        normalize: L2-normalise img and txt rows before the inner product.

    Shape:
        img: [B, d], B >= 2
        txt: [B, d]
        ids: [B] or None
        labels: [B, C] multi-hot or None
        output: scalar

    Example:
        >>> loss_fn = WeightedPairwiseLoss(alpha=10.0)
        >>> labels = torch.randint(0, 2, (8, 5))
        >>> loss = loss_fn(torch.randn(8, 32), torch.randn(8, 32), labels=labels)
    """

    uses_labels = True

    def __init__(self, alpha: float = 10.0, normalize: bool = True) -> None:
        super().__init__()
        alpha = as_number(alpha, "alpha")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be a bool, got {normalize!r}")
        self.alpha = alpha
        self.normalize = normalize

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, normalize={self.normalize}"

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        b = img.shape[0]
        sim = positive_mask(b, ids, device=img.device)  # [B, B] bool
        if labels is not None:
            sim = sim | label_relevance(labels, labels)
        inner = cosine_similarity(img, txt) if self.normalize else dot_similarity(img, txt)
        dp = self.alpha * inner  # [B, B]
        loss = torch.log1p(torch.exp(-dp.abs())) + dp.clamp(min=0) - sim.to(dp.dtype) * dp  # [B, B]
        # mean over similar pairs + mean over dissimilar pairs; an absent kind adds 0
        # (counts stay tensors: no host-device sync per step)
        sim_f = sim.to(dp.dtype)
        n_sim = sim_f.sum()
        n_dis = b * b - n_sim
        return (loss * sim_f).sum() / n_sim.clamp(min=1) + (loss * (1 - sim_f)).sum() / n_dis.clamp(min=1)
