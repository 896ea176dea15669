"""Contrastive losses for the fusion and hashing stages; pick one by name with :func:`build_loss`."""
from __future__ import annotations

from typing import Dict, Type

from torch import nn

from ucmfh.losses.ntxent import NTXentLoss

LOSSES: Dict[str, Type[nn.Module]] = {
    "original": NTXentLoss,
}


def build_loss(name: str, **hparams: object) -> nn.Module:
    """The loss registered under ``name``, built with its hyper-parameters."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
    return LOSSES[name](**hparams)


__all__ = ["LOSSES", "build_loss", "NTXentLoss"]
