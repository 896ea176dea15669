"""Hash heads and the full two-stage model."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from ucmfh.config import HashConfig
from ucmfh.models.fusion import FusionEncoder
from ucmfh.similarity import sign_codes


class HashHead(nn.Module):
    """``d -> hidden -> ReLU -> dropout -> n_bits``, one class for both modalities (UCMFH's ImageMlp/TextMlp).

    Shape: x [B, d] -> logits [B, n_bits]; codes are ``sign(logits)``, relaxed as ``tanh(beta * logits)``.
    """

    def __init__(self, d_in: int, n_bits: int, hidden: int = 4096, dropout: float = 0.3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(hidden, n_bits)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CrossModalHasher(nn.Module):
    """The fusion encoder plus one hash head per modality (UCMFH's task 1 model)."""

    def __init__(self, fusion: FusionEncoder, cfg: HashConfig = HashConfig()) -> None:
        super().__init__()
        cfg.validate()
        self.n_bits = cfg.n_bits
        self.fusion = fusion
        self.img_head = HashHead(fusion.d_out, cfg.n_bits, cfg.hidden, cfg.dropout)
        self.txt_head = HashHead(fusion.d_out, cfg.n_bits, cfg.hidden, cfg.dropout)

    def logits(self, img_emb: torch.Tensor, txt_emb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.img_head(img_emb), self.txt_head(txt_emb)

    @torch.no_grad()
    def codes(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """±1 image and text codes of items under an evaluation protocol. Shape: -> two [B, n_bits]."""
        img_logits, txt_logits = self.logits(*self.fusion.embed(img, txt, protocol))
        return sign_codes(img_logits), sign_codes(txt_logits)
