"""Seeded query / retrieval / train split of a whole-set release (docs/reference.md §1).

The field's standard split: draw ``query`` items at random, the rest (or a given
number) is ``retrieval``, and ``train`` is drawn from ``retrieval``. The rule
and seed are written into the file's ``split`` attribute so that a split can
be redrawn exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from ucmfh.config import SettingError
from ucmfh.data.format import DataError
from ucmfh.data.input_files import npz_member, open_npz

# UCMFH's seed; a split is reproducible from (sizes, seed, n_items)
DEFAULT_SEED = 2023
# The standard sizes of the public benchmarks; retrieval is "the rest".
STANDARD_SPLITS: Dict[str, "SplitSizes"] = {}


@dataclass(frozen=True)
class SplitSizes:
    """Numbers of items per split; ``retrieval=None`` means every item not in query."""

    query: int
    train: int
    retrieval: Optional[int] = None

    def __post_init__(self) -> None:
        if self.query <= 0 or self.train <= 0:
            raise ValueError(f"split sizes must be positive, got query={self.query}, train={self.train}")
        if self.retrieval is not None and self.retrieval <= 0:
            raise ValueError(f"split sizes must be positive, got retrieval={self.retrieval}")


STANDARD_SPLITS.update({
    "mirflickr": SplitSizes(query=2000, train=5000),
    "nuswide": SplitSizes(query=2100, train=10500),
    "nuswide-5000": SplitSizes(query=2100, train=5000),
    "coco": SplitSizes(query=5000, train=10000),
})


@dataclass
class SplitIndex:
    """Source row indices of each split, each sorted ascending.

    Shape: query [Nq], retrieval [Nr], train [Nt], all int64.
    """

    query: np.ndarray
    retrieval: np.ndarray
    train: np.ndarray
    rule: str

    def as_dict(self) -> Dict[str, np.ndarray]:
        return {"train": self.train, "query": self.query, "retrieval": self.retrieval}


def check_seed(seed: int) -> None:
    """A split's seed is a non-negative integer (what ``numpy.random.default_rng`` takes)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def resolve_sizes(standard_split: Optional[str] = None, query: Optional[int] = None, train: Optional[int] = None,
                  retrieval: Optional[int] = None) -> SplitSizes:
    """Sizes from a named standard split, each overridable; or fully custom sizes."""
    if standard_split is not None:
        if standard_split not in STANDARD_SPLITS:
            raise ValueError(f"unknown standard split {standard_split!r}; known: {sorted(STANDARD_SPLITS)}")
        base = STANDARD_SPLITS[standard_split]
        return SplitSizes(
            query=base.query if query is None else query,
            train=base.train if train is None else train,
            retrieval=base.retrieval if retrieval is None else retrieval,
        )
    if query is None or train is None:
        raise ValueError("give a standard split or both the query and train sizes")
    return SplitSizes(query=query, train=train, retrieval=retrieval)


def sample_split(
    n_items: int,
    sizes: SplitSizes,
    seed: int,
    ids: Optional[np.ndarray] = None,
    keep: Optional[np.ndarray] = None,
) -> SplitIndex:
    """Draw a random split of ``n_items`` source rows.

    One ``numpy.random.default_rng(seed).permutation`` of the units (rows, or
    distinct ``ids`` when given, so that all captions of an image land in the
    same split): the first ``query`` units are the query set, the next
    ``retrieval`` units (default: all the others) the retrieval set, and the
    first ``train`` units of the retrieval part the train set.

    Args:
        n_items: number of source rows.
        sizes: split sizes, counted in units (rows, or distinct ids).
        seed: the split's seed.
        ids: [n_items] optional item ids; rows with equal id stay together.
        keep: [n_items] optional bool mask; rows outside it are never drawn.

    Raises:
        SettingError: when the sizes ask for more units than there are (its ``settings``: the sizes at fault).
        ValueError: when there are no units.
    """
    check_seed(seed)
    rows = np.arange(n_items, dtype=np.int64)
    if keep is not None:
        rows = rows[np.asarray(keep, dtype=bool)]
    if ids is None:
        units, inverse = rows, np.arange(rows.size)
        unit_name = "rows"
    else:
        units, inverse = np.unique(np.asarray(ids)[rows], return_inverse=True)
        unit_name = "distinct ids"
    n_units = units.size
    if not n_units:
        raise ValueError("no rows to split (every row left out)")
    n_retrieval = n_units - sizes.query if sizes.retrieval is None else sizes.retrieval
    # a SettingError names the sizes at fault (said as their flags by a command: --query, --train, --retrieval)
    if n_retrieval <= 0:
        if sizes.retrieval is not None:
            raise SettingError("retrieval", f"split asks for retrieval {n_retrieval}: it must be positive")
        raise SettingError("query", f"split asks for query {sizes.query} of {n_units} {unit_name}: retrieval "
                                    "would be empty")
    if sizes.query + n_retrieval > n_units:
        raise SettingError(("query", "retrieval"), f"split asks for query {sizes.query} + retrieval {n_retrieval} "
                                                   f"of {n_units} {unit_name}")
    if sizes.train > n_retrieval:
        raise SettingError("train", f"split asks for train {sizes.train} drawn from the {n_retrieval} {unit_name} "
                                    "of retrieval")
    perm = np.random.default_rng(seed).permutation(n_units)
    query_units = perm[: sizes.query]
    retrieval_units = perm[sizes.query : sizes.query + n_retrieval]
    train_units = retrieval_units[: sizes.train]

    def rows_of(selected: np.ndarray) -> np.ndarray:
        mask = np.zeros(n_units, dtype=bool)
        mask[selected] = True
        return np.sort(rows[mask[inverse]])

    rule = (
        f"random: numpy.random.default_rng({seed}).permutation over {n_units} {unit_name}; "
        f"query = first {sizes.query}, retrieval = next {n_retrieval}"
        f"{' (all the rest)' if sizes.retrieval is None else ''}, "
        f"train = first {sizes.train} of retrieval; seed={seed}"
    )
    return SplitIndex(query=rows_of(query_units), retrieval=rows_of(retrieval_units),
                      train=rows_of(train_units), rule=rule)


def load_split_index(path: str) -> SplitIndex:
    """A given split from an ``.npz`` with integer arrays ``query``, ``retrieval``, ``train`` (source rows)."""
    parts = {}
    with open_npz(path) as f:
        missing = [k for k in ("query", "retrieval", "train") if k not in f.files]
        if missing:
            raise DataError(f"{path}: split index file lacks {missing} (has {f.files})")
        for k in ("query", "retrieval", "train"):
            rows = npz_member(f, path, k).ravel()
            if rows.dtype.kind not in "iu":  # a float row number would be truncated to another row
                raise DataError(f"{path}: {k}: row numbers must be integers, got {rows.dtype}")
            if rows.size and rows.max() >= 2**63:  # wrapped to a negative row
                raise DataError(f"{path}: {k}: row {rows.max()} is beyond any source")
            parts[k] = np.sort(rows.astype(np.int64))
    for k, v in parts.items():
        if v.size == 0:
            raise DataError(f"{path}: {k}: empty split")
        repeated = v[1:][v[1:] == v[:-1]]  # sorted: a repeat sits next to itself
        if repeated.size:
            raise DataError(f"{path}: {k}: row {repeated[0]} listed more than once")
    for other in ("retrieval", "train"):  # a query item trained on, or found as itself, inflates every score
        if np.intersect1d(parts["query"], parts[other]).size:
            raise DataError(f"{path}: query and {other} share rows; they must be disjoint")
    return SplitIndex(rule=f"given: source rows from {path}", **parts)
