"""UCMFH's fusion Transformer, reshaped so that it can also encode one modality alone."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ucmfh.config import FusionConfig
from ucmfh.data.stream import Features, column_stats
from ucmfh.similarity import normalize


class FusionEncoder(nn.Module):
    """Encodes each item on its own as a sequence of two tokens, [image, text].

    UCMFH feeds one ``concat(img, txt)`` token per pair; here the two halves
    are two tokens of one short sequence, so that attention between them can
    be switched off per item. With it on (the ``fused`` protocol) each output
    sees both modalities, as in UCMFH; with it off, or with the other token
    absent, the image embedding depends on the image alone (``unimodal``).
    Items never attend to other items of the batch (UCMFH's defect 1).

    Shape:
        img: [B, d_img]; txt: [B, d_txt] -> two [B, d_model] L2-normalised embeddings.
    """

    def __init__(self, d_img: int, d_txt: int, d_model: int = FusionConfig.d_model, n_heads: int = FusionConfig.n_heads,
                 d_ff: int = FusionConfig.d_ff, n_layers: int = FusionConfig.n_layers,
                 dropout: float = FusionConfig.dropout) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads must divide d_model (each head attends over d_model / n_heads dimensions), "
                             f"got n_heads={n_heads} and d_model={d_model}")
        self.d_img, self.d_txt, self.n_heads = d_img, d_txt, n_heads
        # Per-dimension standardisation of the input features, fitted on the
        # training split (fit_feature_stats): raw features come at any scale
        # (Wiki's rows sum to 1, CLIP's are unit-norm).
        for name, d in (("img", d_img), ("txt", d_txt)):
            self.register_buffer(f"{name}_mean", torch.zeros(d))
            self.register_buffer(f"{name}_std", torch.ones(d))
        self.proj_img = nn.Linear(d_img, d_model)
        self.proj_txt = nn.Linear(d_txt, d_model)
        self.modality = nn.Parameter(0.02 * torch.randn(2, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        # not state: made again on each device and type; (device, dtype) -> the [1, n_heads, 2, 2] additive
        # masks of an item whose tokens may not attend to each other, and of one whose tokens may
        self._masks: Dict[Tuple[torch.device, torch.dtype], Tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def from_config(cls, d_img: int, d_txt: int, cfg: FusionConfig) -> "FusionEncoder":
        """The encoder a fusion stage of ``cfg`` trains (its model settings; the rest is training's)."""
        return cls(d_img, d_txt, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.dropout)

    @torch.no_grad()
    def fit_feature_stats(self, img: Features, txt: Features) -> None:
        """Set the input standardisation from training features. Shape: [N, d_img], [N, d_txt]."""
        for name, x in (("img", img), ("txt", txt)):
            mean, std = column_stats(x)  # in one pass over streamed features
            getattr(self, f"{name}_mean").copy_(mean)
            getattr(self, f"{name}_std").copy_(torch.where(std > 0, std, torch.ones_like(std)))

    def _img_token(self, img: torch.Tensor) -> torch.Tensor:
        return self._img_proj(img) + self.modality[0]

    def _txt_token(self, txt: torch.Tensor) -> torch.Tensor:
        return self._txt_proj(txt) + self.modality[1]

    def _img_proj(self, img: torch.Tensor) -> torch.Tensor:
        return self.proj_img((img - self.img_mean) / self.img_std)

    def _txt_proj(self, txt: torch.Tensor) -> torch.Tensor:
        return self.proj_txt((txt - self.txt_mean) / self.txt_std)

    @property
    def d_out(self) -> int:
        return self.modality.shape[1]

    def forward(
        self, img: torch.Tensor, txt: torch.Tensor, separate: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Both embeddings of each pair; ``separate`` [B] bool marks items whose tokens may not attend to each other."""
        tokens = torch.stack([self._img_proj(img), self._txt_proj(txt)], dim=1) + self.modality  # one add, both
        mask = None
        if separate is not None:  # per item and head a [2, 2] additive mask, -inf across modalities if separated
            blocked, open_ = self._item_masks(img.device, tokens.dtype)
            mask = torch.where(separate.to(img.device)[:, None, None, None], blocked, open_).flatten(0, 1)
        # is_causal=False: what torch would find by building a causal mask to compare with, every step
        out = self.encoder(tokens, mask=mask, is_causal=False)
        img, txt = normalize(out).unbind(dim=1)  # both tokens at once: one normalisation, one gradient copy
        return img, txt

    def _item_masks(self, device: torch.device, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """An item's additive attention masks, one for each head: its tokens kept apart (-inf across the
        modalities) and not (zeros); made once a device and type, so that a step makes its batch's in one
        operation. Shape: ([1, n_heads, 2, 2], [1, n_heads, 2, 2])."""
        key = (device, dtype)
        if key not in self._masks:
            open_ = torch.zeros(1, self.n_heads, 2, 2, device=device, dtype=dtype)
            across = ~torch.eye(2, dtype=torch.bool, device=device)  # the pairs of tokens across modalities
            self._masks[key] = open_.masked_fill(across, float("-inf")), open_
        return self._masks[key]

    def encode_img(self, img: torch.Tensor) -> torch.Tensor:
        """Image embeddings from images alone. Shape: [B, d_img] -> [B, d_model]."""
        return normalize(self.encoder(self._img_token(img)[:, None])[:, 0])

    def encode_txt(self, txt: torch.Tensor) -> torch.Tensor:
        """Text embeddings from texts alone. Shape: [B, d_txt] -> [B, d_model]."""
        return normalize(self.encoder(self._txt_token(txt)[:, None])[:, 0])

    def embed(
        self, img: torch.Tensor, txt: torch.Tensor, protocol: str
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Image and text embeddings of items under an evaluation protocol (docs/reference.md §3)."""
        if protocol == "fused":
            return self(img, txt)
        if protocol == "unimodal":
            return self.encode_img(img), self.encode_txt(txt)
        raise ValueError(f"unknown protocol {protocol!r}; choose 'unimodal' or 'fused'")

