"""The optimizer of a training step: Adam and SGD (fused where this torch has it) and one update with
gradients averaged over the ranks (:mod:`ucmfh.distributed`)."""
from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from ucmfh.distributed import Group


def adam(params: Iterable, **kwargs) -> torch.optim.Adam:
    """Adam with its fused kernel where this torch has one for the parameters' device (same update rule)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, **kwargs)


def sgd(params: Iterable, **kwargs) -> torch.optim.SGD:
    """SGD with its fused kernel where this torch has one for the parameters' device: one pass over each
    parameter for the weight decay, the momentum and the update, which the per-tensor loop makes three.
    The same update to the bit on the CPU (``tests/test_optim.py``)."""
    params = list(params)
    try:
        return torch.optim.SGD(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.SGD(params, **kwargs)


def optimize(loss: torch.Tensor, optimizer: torch.optim.Optimizer, group: Group,
             clip_norm: Optional[float] = None, keep_gradients: bool = False) -> torch.Tensor:
    """One optimisation step on ``loss``, its gradients averaged over the ranks (then clipped to a total norm
    of ``clip_norm`` when given); returns the loss, detached. ``keep_gradients``: the gradient tensors are
    zeroed and written again, not replaced (a captured CUDA graph writes into them)."""
    optimizer.zero_grad(set_to_none=not keep_gradients)
    loss.backward()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    group.average_gradients(params)
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()
    return loss.detach()
