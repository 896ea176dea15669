"""The relaxation a hashing loss trains through: the codes it sees (``tanh(β · logits)``, straight-through
``sign``, or the logits themselves) and the tanh continuation scale β (docs/reference.md §5)."""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch

from ucmfh.config import HashConfig
from ucmfh.similarity import normalize, sign_codes


def beta_at(cfg: HashConfig, iteration: int, epoch: int) -> float:
    """The tanh continuation scale β for a training step (docs/reference.md §5)."""
    if cfg.beta_schedule == "hashnet":
        return math.sqrt(1.0 + cfg.beta_gamma * (iteration // cfg.beta_step_iters) * cfg.beta_step_iters)
    if cfg.beta_schedule == "step":
        return math.sqrt(epoch // cfg.beta_step_epochs + 1)
    return 1.0


def beta_scalars(cfg: HashConfig, label: str = "beta") -> Callable[[int, int], Dict[str, float]]:
    """β after each epoch, as a run shows and records it (:attr:`ucmfh.trainer.Plan.scalars`)."""
    return lambda epoch, iteration: {label: beta_at(cfg, iteration, epoch)}


def relaxed_codes(logits: torch.Tensor, cfg: HashConfig, beta: float) -> torch.Tensor:
    """The codes a hashing loss sees, L2-normalised: ``tanh(β · logits)``, or with
    ``cfg.relaxation = 'sign'`` the ±1 codes themselves with tanh's gradient (straight-through), or
    with 'none' the logits themselves (a real-valued embedding)."""
    if cfg.relaxation == "none":
        return normalize(logits.float())
    relaxed = torch.tanh(beta * logits.float())
    if cfg.relaxation == "sign":
        relaxed = relaxed + (sign_codes(relaxed) - relaxed).detach()
    return normalize(relaxed)
