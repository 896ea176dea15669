"""CLIP's symmetric cross-modal InfoNCE, with a fixed or learnable temperature (docs/losses.md 'infonce')."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ucmfh.losses.base import CrossModalLoss, check_temperature
from ucmfh.similarity import cosine_similarity, positive_mask


class InfoNCELoss(CrossModalLoss):
    """Symmetric image→text and text→image InfoNCE over the B × B cross-modal logits.

    Radford et al., "Learning Transferable Visual Models From Natural Language
    Supervision" (CLIP), ICML 2021; van den Oord et al., "Representation
    Learning with Contrastive Predictive Coding", 2018.

    With ``s = z_img z_txtᵀ / τ``, the loss is the mean of the image→text
    cross-entropy (rows, target i) and the text→image one (columns). Unlike
    'original' there are no intra-modal negatives. With ``ids``, the other
    pairs that share an id are left out of each softmax, so they are never
    pushed apart. ``labels`` are ignored (the loss is unsupervised).

    With ``learnable=True``, τ is ``exp(log_temperature)`` for an
    ``nn.Parameter`` ``log_temperature``, clamped to
    [min_temperature, max_temperature] as CLIP clamps its logit scale at 100.
    Give the loss's parameters to the optimiser in that case.

    Args:
        temperature: τ > 0, or its initial value when learnable (CLIP: 0.07).
        learnable: learn log τ.
        min_temperature: lower clamp of a learnable τ (CLIP: 0.01).
        max_temperature: upper clamp of a learnable τ.

    Shape:
        img: [B, d], B >= 2
        txt: [B, d]
        ids: [B] or None
        output: scalar

    Example:
        >>> loss_fn = InfoNCELoss(temperature=0.07, learnable=True)
        >>> loss = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
    """

    def __init__(
        self,
        temperature: float = 0.07,
        learnable: bool = False,
        min_temperature: float = 0.01,
        max_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        temperature = check_temperature(temperature)
        min_temperature = check_temperature(min_temperature, "min_temperature")
        max_temperature = check_temperature(max_temperature, "max_temperature")
        if not isinstance(learnable, bool):
            raise ValueError(f"learnable must be a bool, got {learnable!r}")
        if min_temperature > max_temperature:
            raise ValueError(f"min_temperature {min_temperature} is above max_temperature {max_temperature}")
        if learnable and not min_temperature <= temperature <= max_temperature:
            raise ValueError(
                f"temperature {temperature} must lie in [min_temperature, max_temperature] = "
                f"[{min_temperature}, {max_temperature}]"
            )
        self.learnable = learnable
        self.min_temperature = min_temperature
        self.max_temperature = max_temperature
        self._fixed_temperature = temperature
        self.log_temperature: Optional[nn.Parameter] = (
            nn.Parameter(torch.tensor(math.log(temperature))) if learnable else None
        )

    @property
    def temperature(self) -> torch.Tensor:
        """The current τ (clamped when learnable) as a 0-d float32 tensor."""
        if self.log_temperature is None:
            return torch.tensor(self._fixed_temperature)
        return self.log_temperature.clamp(math.log(self.min_temperature), math.log(self.max_temperature)).exp()

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.4g}, learnable={self.learnable}"

    def compute(
        self,
        img: torch.Tensor,
        txt: torch.Tensor,
        ids: Optional[torch.Tensor],
        labels: Optional[torch.Tensor],
    ) -> torch.Tensor:
        b = img.shape[0]
        # a learnable τ stays in the graph; a fixed one is a plain number
        tau = self._fixed_temperature if self.log_temperature is None else self.temperature.to(img.dtype)
        s = cosine_similarity(img, txt) / tau  # [B, B]
        diag = torch.eye(b, dtype=torch.bool, device=img.device)
        others = positive_mask(b, ids, device=img.device) & ~diag  # same id, not the pair itself
        logits = s.masked_fill(others, float("-inf"))
        i2t = torch.logsumexp(logits, dim=1) - s.diagonal()
        t2i = torch.logsumexp(logits, dim=0) - s.diagonal()
        return 0.5 * (i2t.mean() + t2i.mean())


def soft_infonce(img: torch.Tensor, txt: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric cross-modal InfoNCE against soft targets (knowledge distillation; method 'distill').

    With ``s = cos(img, txt) / τ``, the mean of the image→text cross-entropy ``-Σ_j T_ij log
    softmax(s_i)_j`` and the text→image one, ``T`` a row-stochastic [B, B] target matrix; the
    identity gives plain :class:`InfoNCELoss` (without ids).

    Shape: img [B, d], txt [B, d], targets [B, B] -> scalar (ValueError for other shapes; the rows' sums are
    not checked, which would wait for a GPU at every step).
    """
    check_temperature(temperature)
    if img.ndim != 2 or txt.shape != img.shape or targets.shape != (img.shape[0], img.shape[0]):
        raise ValueError(f"expected img and txt of one shape [B, d] and targets [B, B], got {tuple(img.shape)}, "
                         f"{tuple(txt.shape)} and {tuple(targets.shape)}")
    logits = cosine_similarity(img, txt) / temperature
    return -0.5 * ((targets * logits.log_softmax(1)).sum(1).mean() + (targets * logits.T.log_softmax(1)).sum(1).mean())
