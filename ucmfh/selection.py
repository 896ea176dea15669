"""Model selection on a validation split carved from the training split, never the query split: the
held-out items, the score after each epoch, and the :class:`History` that records it."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ucmfh.config import HashConfig, SettingError
from ucmfh.data.h5 import Dataset, Split
from ucmfh.evaluation import codes_of, outputs_of, score_splits


class History(list):
    """The mean training loss of each epoch; with a validation split also ``validation``
    (``[epoch, score]`` after each epoch) and ``best_epoch``, whose weights the model keeps.
    A run that chose among candidate settings on validation (:func:`ucmfh.methods.choose`) also
    records ``chosen``, the one kept, and ``choice_scores``, each candidate's best validation score; a run
    trained again on the whole training split (``HashConfig.refit``) ``refit_epochs`` and ``refit_loss``; a method
    whose codes carry fewer bits than asked (CCA-ITQ: no more than its features' directions) ``filled_bits``."""

    def __init__(self, losses: Iterable[float] = (), validation: Optional[List[List[float]]] = None,
                 best_epoch: Optional[int] = None) -> None:
        super().__init__(losses)
        self.validation = list(validation or [])
        self.best_epoch = best_epoch
        self.chosen: Optional[str] = None  # a run that chose on validation: the candidate kept
        self.choice_scores: Dict[str, float] = {}  # ... and each candidate's best validation score
        self.refit_epochs: Optional[int] = None  # a refit run (HashConfig.refit): the epochs it trained again
        self.refit_loss: List[float] = []  # ... on the whole training split, and their mean losses
        self.filled_bits: Optional[int] = None  # a method that fills fewer bits than asked (CCA-ITQ): how many

    def __repr__(self) -> str:  # what a run kept, not only the list of losses a list's repr prints
        parts = [f"{len(self)} epoch{'s' if len(self) != 1 else ''}"]
        if len(self):
            parts.append(f"loss {self[0]:.4g} -> {self[-1]:.4g}")
        if self.best_epoch is not None and self.validation:
            parts.append(f"kept epoch {self.best_epoch}, validation {self.best_score:.4f}")
        if self.chosen is not None and self.choice_scores:
            parts.append(f"chosen {self.chosen!r} of {len(self.choice_scores)}")
        elif self.chosen is not None:  # no validation split: the first candidate, no choice made
            parts.append(f"{self.chosen!r}, the first candidate (no validation split to choose on)")
        if self.refit_epochs is not None:
            parts.append(f"refit {self.refit_epochs} epochs on the whole training split")
        if self.filled_bits is not None:
            parts.append(f"{self.filled_bits} bits filled")
        return f"History({', '.join(parts)})"

    @property
    def best_score(self) -> float:
        """The validation score of the kept epoch (-inf without a validation split)."""
        return dict(self.validation).get(self.best_epoch, -math.inf)

    def as_dict(self) -> Dict[str, Any]:
        """The history as a JSON-ready dict: each epoch's loss, the validation scores, the epoch kept, any choice."""
        out = {"loss": list(self), "validation": self.validation, "best_epoch": self.best_epoch}
        if self.chosen is not None:
            out.update(chosen=self.chosen, choice_scores=self.choice_scores)
        if self.refit_epochs is not None:
            out.update(refit_epochs=self.refit_epochs, refit_loss=self.refit_loss)
        if self.filled_bits is not None:
            out.update(filled_bits=self.filled_bits)
        return out


def validation_items(keys: np.ndarray, fraction: float, seed: int,
                     units_are: str = "images") -> Tuple[np.ndarray, np.ndarray]:
    """``(rest, validation)`` item indices: a seeded share of the units (distinct ``keys``: the ids, or
    the items themselves; ``units_are``: what they are, for the message) held out for model selection; items
    of one unit go to the same side."""
    units = np.unique(keys)
    n_val = max(1, int(round(fraction * len(units))))
    if len(units) - n_val < 2:
        raise SettingError("val_fraction", f"val_fraction {fraction} holds out {n_val} of the {len(units)} training "
                                           f"{units_are}, leaving {len(units) - n_val}: training needs at least 2; "
                                           "val_fraction 0 trains on them all, without a validation split")
    held = np.random.default_rng(seed).choice(units, size=n_val, replace=False)
    member = np.isin(keys, held)
    return np.flatnonzero(~member), np.flatnonzero(member)


def validation_split(split: Split, fraction: float, seed: int) -> Tuple[Split, Optional[Split]]:
    """``(rest, validation)``: a seeded share of a training split held out for model selection
    (:func:`validation_items`; the captions of one image go to the same side). ``fraction = 0``
    returns the split whole and no validation part.
    """
    if fraction <= 0:
        return split, None
    keys = np.arange(len(split)) if split.ids is None else split.ids.numpy()  # the unit of each item
    rest, val = validation_items(keys, fraction, seed, "items" if split.ids is None else "images")
    return split.subset(torch.from_numpy(rest)), split.subset(torch.from_numpy(val))


# the most validation queries and database items scored after each epoch: evenly spaced ones
# beyond (a large training split would make validation cost as much as training)
VALIDATION_QUERIES, VALIDATION_DATABASE = 5_000, 50_000
VALIDATION_K = 50  # the MAP@k every validation scores


def _spread(split: Split, most: int) -> Split:
    if len(split) <= most:
        return split
    return split.subset(torch.from_numpy(np.linspace(0, len(split) - 1, most).round().astype(np.int64)))


def _in_memory(split: Split) -> Split:
    return replace(split, img=split.img[:], txt=split.txt[:]) if split.streamed else split


def validation_view(cfg: HashConfig) -> Tuple[Callable, str]:
    """What a hashing stage's validation ranks: the codes by Hamming distance, or the head outputs
    by cosine with ``relaxation = 'none'`` (what that training learns)."""
    return (outputs_of, "cosine") if cfg.relaxation == "none" else (codes_of, "hamming")


def validator(encode: Callable, ranking: str, model: nn.Module, val: Optional[Split], rest: Split,
              device: torch.device) -> Optional[Callable[[], float]]:
    """The validation score of ``model``: mean of both directions' unimodal MAP@50 (by id on a
    caption set), the validation items against the rest of the training split (at most
    ``VALIDATION_QUERIES`` and ``VALIDATION_DATABASE`` of them, evenly spaced)."""
    if val is None:
        return None
    # read once, into memory (at most VALIDATION_QUERIES + VALIDATION_DATABASE items): a streamed
    # split's validation items are spread through the file, and would be read again every epoch
    val, rest = _in_memory(_spread(val, VALIDATION_QUERIES)), _in_memory(_spread(rest, VALIDATION_DATABASE))
    data = Dataset(train=rest, query=val, retrieval=rest)

    def validate() -> float:
        query, retrieval = encode(model, val, "unimodal", device), encode(model, rest, "unimodal", device)
        model.train()
        rows = score_splits(query, retrieval, data, VALIDATION_K, ranking, recall=False)  # MAP alone: no recall
        return sum(r["map_i2t"] + r["map_t2i"] for r in rows) / (2 * len(rows))

    return validate
