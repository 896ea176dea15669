"""Hamming-radius metrics: precision–recall by radius, precision within radius 2.

Retrieval by radius returns every item with Hamming distance <= r (no ranking,
so no tie rule is needed). For each query: precision(r) = relevant returned /
returned, 0 when nothing is returned (the usual convention, e.g. KSH, DPSH);
recall(r) = relevant returned / relevant in the set. Both are averaged over
queries; ``empty`` treats queries with no relevant item as in ranking.py.
Codes and labels are tensors or numpy arrays.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from ucmfh.metrics.ap import mean_columns
from ucmfh.metrics.histograms import iter_hamming_histograms
from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ArrayLike,
    Empty,
    as_tensors,
    check_count,
    check_labels,
)
from ucmfh.metrics.relevance import queries_to_keep


def _radius_counts(
    query_codes, retrieval_codes, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Items and relevant items within radius r, for every r. Shape: [Q, n_bits + 1] int64 each."""
    check_labels(query_codes, retrieval_codes, query_labels, retrieval_labels)
    returned, relevant = [], []
    for _, h_all, h_rel in iter_hamming_histograms(
        query_codes, retrieval_codes, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size
    ):
        returned.append(h_all.cumsum(dim=1))
        relevant.append(h_rel.cumsum(dim=1))
    return torch.cat(returned), torch.cat(relevant)


def _precision_recall(returned: torch.Tensor, relevant: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    precision = relevant.double() / returned.clamp(min=1).double()
    recall = relevant.double() / relevant[:, -1:].clamp(min=1).double()
    return precision, recall


def pr_curve_hamming(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Dict[str, List[float]]:
    """Mean precision and recall of retrieval within Hamming radius r = 0 … n_bits.

    Returns ``{"radius": [0..n_bits], "precision": [...], "recall": [...]}``. Packed codes do not say their length:
    their radii run to 8 bits a byte (codes of 9 bits: to 16, its last radii all of the items), ±1 codes' to theirs.
    """
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    keep = queries_to_keep(empty, query_labels, retrieval_labels)
    returned, relevant = _radius_counts(
        query_codes, retrieval_codes, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size
    )
    precision, recall = _precision_recall(returned, relevant)
    return {
        "radius": list(range(returned.shape[1])),
        "precision": mean_columns(precision, keep),
        "recall": mean_columns(recall, keep),
    }


def precision_within_radius(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    radius: int = 2,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> float:
    """Mean precision of the items within Hamming radius ``radius`` (0 for a query that gets none)."""
    check_count("radius", radius, least=0)
    curve = pr_curve_hamming(
        query_codes, retrieval_codes, query_labels, retrieval_labels, chunk_size,
        empty=empty, retrieval_chunk_size=retrieval_chunk_size,
    )
    return curve["precision"][min(radius, len(curve["radius"]) - 1)]
