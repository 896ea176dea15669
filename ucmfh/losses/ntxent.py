"""UCMFH's ``ContrastiveLoss``: SimCLR's NT-Xent over both modalities (docs/reference.md §4 'original')."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ucmfh.losses.base import CrossModalLoss, check_temperature
from ucmfh.similarity import dot_similarity, normalize, positive_mask


class NTXentLoss(CrossModalLoss):
    """NT-Xent over the stacked [img; txt] batch, intra-modal negatives included.

    Chen et al., "A Simple Framework for Contrastive Learning of Visual
    Representations" (SimCLR), ICML 2020; used unchanged by UCMFH (Xia et al.,
    "When CLIP meets cross-modal hashing retrieval", Information Fusion 2023).

    With ``r = [z_img; z_txt]`` (2B × d, rows L2-normalised) and
    ``s = r rᵀ / τ``, the positive of row k is its partner k ± B and the loss is
    the mean over the 2B rows of ``−log(exp(s_k,partner) / Σ_{l≠k} exp(s_kl))``:
    2(B−1) negatives per row, from both modalities. With ``ids``, the other
    rows that share k's id (in either modality) are left out of the
    denominator, so items of one id are never pushed apart. ``labels`` are
    ignored (the loss is unsupervised).

    Args:
        temperature: τ > 0; UCMFH uses 0.5, SimCLR/SBERT practice 0.05–0.1.

    Shape:
        img: [B, d], B >= 2
        txt: [B, d]
        ids: [B] or None
        output: scalar

    Example:
        >>> loss_fn = NTXentLoss(temperature=0.5)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(self, temperature: float = 0.5) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        # made once a batch size and device: (size, device) -> each row's partner column, and the mask without ids
        self._partners: Dict[Tuple[int, torch.device], torch.Tensor] = {}
        self._masks: Dict[Tuple[int, torch.device], torch.Tensor] = {}

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        b = img.shape[0]
        z = normalize(torch.cat([img, txt]))  # [2B, d]
        s = dot_similarity(z, z) / self.temperature  # [2B, 2B]
        key = (b, img.device)
        if key not in self._partners:
            self._partners[key] = torch.arange(2 * b, device=img.device).roll(b)  # row k's partner column, k ± B
        partner = self._partners[key]
        masked = self._masks.get(key) if ids is None else None
        if masked is None:
            same = positive_mask(b, ids, device=img.device).repeat(2, 2)  # same item or same id, [2B, 2B]
            masked = same.scatter(1, partner[:, None], False)  # self, and the same-id items but the partner
            if ids is None:  # the same at every step of this batch size
                self._masks[key] = masked
        s = s.masked_fill(masked, float("-inf"))
        # a gather, not s[bool mask]: boolean indexing makes the host wait for the GPU
        return (torch.logsumexp(s, dim=1) - s.gather(1, partner[:, None]).squeeze(1)).mean()
