"""Hash heads and the full two-stage model."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from ucmfh.config import HashConfig
from ucmfh.data.stream import Features, column_stats
from ucmfh.models.fusion import FusionEncoder
from ucmfh.similarity import normalize, sign_codes


class HashHead(nn.Module):
    """``d -> hidden -> ReLU -> dropout -> n_bits``, one class for both modalities (UCMFH's ImageMlp/TextMlp);
    ``hidden = 0`` is one linear map ``d -> n_bits``.

    Shape: x [B, d] -> logits [B, n_bits]; codes are ``sign(logits)``, relaxed as ``tanh(beta * logits)``.
    """

    def __init__(self, d_in: int, n_bits: int, hidden: int = 4096, dropout: float = 0.3) -> None:
        super().__init__()
        if hidden:
            self.net = nn.Sequential(
                nn.Linear(d_in, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(hidden, n_bits)
            )
        else:
            self.net = nn.Sequential(nn.Linear(d_in, n_bits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CrossModalHasher(nn.Module):
    """The fusion encoder plus one hash head per modality (UCMFH's task 1 model)."""

    def __init__(self, fusion: FusionEncoder, n_bits: int, hidden: int = HashConfig.hidden,
                 dropout: float = HashConfig.dropout) -> None:
        super().__init__()
        self.n_bits = n_bits
        self.fusion = fusion
        self.img_head = HashHead(fusion.d_out, n_bits, hidden, dropout)
        self.txt_head = HashHead(fusion.d_out, n_bits, hidden, dropout)

    def logits(self, img_emb: torch.Tensor, txt_emb: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.img_head(img_emb), self.txt_head(txt_emb)

    @torch.no_grad()
    def modality_logits(self, x: torch.Tensor, modality: str) -> torch.Tensor:
        """Head outputs (pre-sign) of one modality from its own features alone (``unimodal``).

        Shape: x [B, d_img] or [B, d_txt] for modality 'img' or 'txt' -> [B, n_bits].
        """
        if modality == "img":
            return self.img_head(self.fusion.encode_img(x))
        return self.txt_head(self.fusion.encode_txt(x))

    @torch.no_grad()
    def head_outputs(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Real-valued (pre-sign) image and text head outputs under an evaluation protocol.

        Shape: -> two [B, n_bits]."""
        return self.logits(*self.fusion.embed(img, txt, protocol))

    @torch.no_grad()
    def codes(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """±1 image and text codes of items under an evaluation protocol: the signs of :meth:`head_outputs`."""
        img_logits, txt_logits = self.head_outputs(img, txt, protocol)
        return sign_codes(img_logits), sign_codes(txt_logits)


class FeatureHasher(nn.Module):
    """One hash head per modality on that modality's own features (every leak-free method's model).

    Each input is centred by its training mean and L2-normalised, then hashed by its
    own head: image codes never see a text, nor text codes an image, so every protocol
    gives the same codes (leak-free by construction).

    Shape: img [B, d_img], txt [B, d_txt] -> codes two [B, n_bits].
    """

    def __init__(self, d_img: int, d_txt: int, n_bits: int, hidden: int = HashConfig.hidden,
                 dropout: float = HashConfig.dropout, img_hidden: Optional[int] = None,
                 txt_hidden: Optional[int] = None) -> None:
        super().__init__()
        self.d_img, self.d_txt, self.n_bits = d_img, d_txt, n_bits
        self.register_buffer("img_mean", torch.zeros(d_img))
        self.register_buffer("txt_mean", torch.zeros(d_txt))
        # each head's hidden width: `hidden` unless a method gives the modalities different ones
        self.img_head = HashHead(d_img, n_bits, hidden if img_hidden is None else img_hidden, dropout)
        self.txt_head = HashHead(d_txt, n_bits, hidden if txt_hidden is None else txt_hidden, dropout)

    @torch.no_grad()
    def fit_feature_stats(self, img: Features, txt: Features) -> None:
        """Set the centring means from training features. Shape: [N, d_img], [N, d_txt]."""
        self.img_mean.copy_(column_stats(img)[0])  # in one pass over streamed features
        self.txt_mean.copy_(column_stats(txt)[0])

    def inputs(self, img: torch.Tensor, txt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The centred, L2-normalised features the heads see."""
        return normalize(img - self.img_mean), normalize(txt - self.txt_mean)

    def logits(self, img: torch.Tensor, txt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        img, txt = self.inputs(img, txt)
        return self.img_head(img), self.txt_head(txt)

    @torch.no_grad()
    def modality_logits(self, x: torch.Tensor, modality: str) -> torch.Tensor:
        """Head outputs (pre-sign) of one modality from its own features (as :meth:`logits`).

        Shape: x [B, d_img] or [B, d_txt] for modality 'img' or 'txt' -> [B, n_bits].
        """
        if modality == "img":
            return self.img_head(normalize(x - self.img_mean))
        return self.txt_head(normalize(x - self.txt_mean))

    @torch.no_grad()
    def head_outputs(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Real-valued (pre-sign) head outputs; the same under every protocol (``protocol`` is accepted
        for a common interface)."""
        return self.logits(img, txt)

    @torch.no_grad()
    def codes(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """±1 codes, the signs of :meth:`head_outputs`; the same under every protocol."""
        img_logits, txt_logits = self.head_outputs(img, txt, protocol)
        return sign_codes(img_logits), sign_codes(txt_logits)
