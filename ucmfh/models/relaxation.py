"""The relaxation a hashing loss trains through: the codes it sees (``tanh(β · logits)``, straight-through
``sign``, or the logits themselves) and the tanh continuation scale β (docs/reference.md §5)."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Union

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


def step_beta(cfg: HashConfig, batch: Any, label: str = "beta") -> Union[float, torch.Tensor]:
    """β for a training step (:class:`ucmfh.trainer.Batch`): :func:`beta_at`'s number, or in a step captured as a
    CUDA graph the 0-dim tensor on the device that the graph reads (``batch.scalars[label]``, refilled before each
    replay: a schedule of β needs one capture, not one for each value). A plan reading it gives
    ``scalars=beta_scalars(cfg, label), fed=(label,)``."""
    if batch.scalars is not None:
        return batch.scalars[label]
    return beta_at(cfg, batch.iteration, batch.epoch)


def relaxed_codes(logits: torch.Tensor, cfg: HashConfig, beta: Union[float, torch.Tensor]) -> torch.Tensor:
    """The codes a hashing loss sees, L2-normalised: ``tanh(β · logits)``, or with
    ``cfg.relaxation = 'sign'`` the ±1 codes themselves with tanh's gradient (straight-through), or
    with 'none' the logits themselves (a real-valued embedding)."""
    if cfg.relaxation == "none":
        return normalize(logits.float())
    relaxed = torch.tanh(beta * logits.float())
    if cfg.relaxation == "sign":
        relaxed = relaxed + (sign_codes(relaxed) - relaxed).detach()
    return normalize(relaxed)
