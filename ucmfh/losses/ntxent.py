"""UCMFH's ``ContrastiveLoss``: SimCLR's NT-Xent over both modalities (REFERENCE §4 'original')."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ucmfh.similarity import cosine_similarity, positive_mask


class NTXentLoss(nn.Module):
    """NT-Xent over the stacked [img; txt] batch, intra-modal negatives included.

    Chen et al., "A Simple Framework for Contrastive Learning of Visual
    Representations" (SimCLR), ICML 2020; used unchanged by UCMFH (Xia et al. 2023).

    For each of the 2B rows k of ``r = [z_img; z_txt]`` the positive is its
    partner (k ± B); the denominator runs over every l != k. With ``ids``,
    other items that share k's id are taken out of the denominator, so
    captions of one image are never pushed apart.

    Shape:
        img: [B, d]; txt: [B, d]; ids: [B] or None -> scalar.

    Example:
        >>> loss = NTXentLoss(temperature=0.5)
        >>> loss(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.5) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)

    def forward(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if img.shape != txt.shape or img.ndim != 2 or img.shape[0] < 2:
            raise ValueError(f"expected two [B, d] tensors with B >= 2, got {tuple(img.shape)} and {tuple(txt.shape)}")
        b = img.shape[0]
        r = torch.cat([img, txt]).float()
        s = cosine_similarity(r, r) / self.temperature  # [2B, 2B]
        same = positive_mask(b, ids, device=img.device).repeat(2, 2)  # same item or same id
        partner = torch.arange(2 * b, device=img.device).roll(b)  # row k's partner column, k ± B
        # self, and same-id items that are not the partner
        excluded = same.scatter(1, partner[:, None], False)
        s = s.masked_fill(excluded, float("-inf"))
        # a gather, not s[bool mask]: boolean indexing makes the host wait for the GPU
        return -(s.gather(1, partner[:, None]).squeeze(1) - torch.logsumexp(s, dim=1)).mean()
