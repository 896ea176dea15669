"""Cross-modal losses for the fusion and hashing stages; pick one by name with :func:`build_loss`.

Every loss is an ``nn.Module`` called as ``loss(img, txt, ids=None, labels=None)``
on two [B, d] batches (docs/reference.md §4).
"""
from __future__ import annotations

import inspect
from typing import Dict, Type

from ucmfh.losses.balanced import BalancedContrastiveLoss
from ucmfh.losses.base import CrossModalLoss
from ucmfh.losses.infonce import InfoNCELoss, soft_infonce
from ucmfh.losses.ntxent import NTXentLoss
from ucmfh.losses.pairwise import WeightedPairwiseLoss
from ucmfh.losses.triplet import TripletLoss
from ucmfh.utils import did_you_mean

LOSSES: Dict[str, Type[CrossModalLoss]] = {
    "original": NTXentLoss,
    "balanced": BalancedContrastiveLoss,
    "pairwise": WeightedPairwiseLoss,
    "infonce": InfoNCELoss,
    "triplet": TripletLoss,
}


def loss_params(name: str) -> Dict[str, object]:
    """A registered loss's parameters and their defaults (``--loss-param NAME=VALUE``), in its signature's order."""
    return {p.name: p.default for p in inspect.signature(LOSSES[name]).parameters.values()
            if p.name != "self" and p.default is not inspect.Parameter.empty}


def build_loss(name: str, **hparams: object) -> CrossModalLoss:
    """The loss registered under ``name``, built with its hyper-parameters.

    Raises ValueError for an unknown name or a bad hyper-parameter (an unknown
    keyword included).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}{did_you_mean(name, LOSSES)}; choose one of {sorted(LOSSES)}")
    known = [p for p in inspect.signature(LOSSES[name]).parameters if p != "self"]
    unknown = sorted(set(hparams) - set(known))
    if unknown:
        raise ValueError(f"loss {name!r} has no parameter {', '.join(map(repr, unknown))} "
                         f"(its parameters: {', '.join(known) or 'none'})")
    try:
        return LOSSES[name](**hparams)
    except ValueError as err:  # a value the loss refuses, named by the loss
        raise ValueError(f"loss {name!r}: {err}") from None


__all__ = [
    "LOSSES",
    "build_loss",
    "loss_params",
    "CrossModalLoss",
    "NTXentLoss",
    "BalancedContrastiveLoss",
    "WeightedPairwiseLoss",
    "InfoNCELoss",
    "TripletLoss",
    "soft_infonce",
]
