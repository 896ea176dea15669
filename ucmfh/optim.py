"""The optimizer of a training step: Adam (fused where this torch has it) and one update with gradients
averaged over the ranks (:mod:`ucmfh.distributed`)."""
from __future__ import annotations

from typing import Iterable

import torch

from ucmfh.distributed import Group


def adam(params: Iterable, **kwargs) -> torch.optim.Adam:
    """Adam with its fused kernel where this torch has one for the parameters' device (same update rule)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, **kwargs)


def optimize(loss: torch.Tensor, optimizer: torch.optim.Optimizer, group: Group) -> torch.Tensor:
    """One optimisation step on ``loss``, its gradients averaged over the ranks; returns the loss, detached."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    group.average_gradients(p for g in optimizer.param_groups for p in g["params"])
    optimizer.step()
    return loss.detach()
