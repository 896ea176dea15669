"""Ranking metrics: MAP@K, MAP@all, precision@K, recall@K, Recall@ranks (docs/reference.md §6).

Every function ranks by Hamming distance of ±1 (or packed) codes by default, or
by cosine similarity of real-valued embeddings with ``ranking="cosine"``;
ties by retrieval index ascending. ``empty`` decides what happens to a query
with no relevant item in the whole retrieval set: ``"zero"`` (default, the
field's standard for MAP) scores it 0 and keeps it in the mean, ``"skip"``
leaves it out of the mean. Results are identical for every chunk size.

Codes, labels and ids are tensors or numpy arrays (shared, not copied, where
numpy allows); results are floats, lists of floats, or for
:func:`average_precision_at_k` a tensor on the device of the query codes.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from ucmfh.metrics.ap import (
    average_precision_all_hamming,
    average_precision_native,
    average_precision_ranked,
    mean,
    mean_columns,
)
from ucmfh.metrics.inputs import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ArrayLike,
    Empty,
    Ranking,
    as_tensors,
    check_choice,
    check_ids,
    check_labels,
)
from ucmfh.metrics.native import use_native
from ucmfh.metrics.relevance import (
    gather_id_match,
    gather_relevance,
    id_match_counts,
    queries_to_keep,
    relevant_counts,
)
from ucmfh.metrics.topk import iter_top_k


def average_precision_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    k: Optional[int] = 50,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> torch.Tensor:
    """AP@K of every query (``k=None``: over the whole ranking). Shape: -> [Q] float64.

    AP@K = (1/r) Σ_i i / p_i over the r relevant items among the first K, at
    positions p_1 < … < p_r; 0 when r = 0. K larger than N means N.
    """
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    check_labels(query_codes, retrieval_codes, query_labels, retrieval_labels)
    n = retrieval_codes.shape[0]
    if ranking == "hamming" and use_native(query_codes.device):
        return average_precision_native(query_codes, retrieval_codes, query_labels, retrieval_labels, k)
    if k is None and ranking == "hamming":
        return average_precision_all_hamming(
            query_codes, retrieval_codes, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size
        )
    k = n if k is None else k
    out = []
    for start, _, idx in iter_top_k(
        query_codes, retrieval_codes, k, ranking, chunk_size, retrieval_chunk_size
    ):
        rel = gather_relevance(query_labels[start : start + chunk_size], retrieval_labels, idx)
        out.append(average_precision_ranked(rel))
    return torch.cat(out)


def map_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    k: Optional[int] = 50,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> float:
    """MAP@K with Hamming ranking of ±1 (or packed uint8) codes; ``k=None`` gives MAP@all.

    Shape:
        query_codes: [Q, n_bits]; retrieval_codes: [N, n_bits];
        query_labels: [Q, C]; retrieval_labels: [N, C] (multi-hot).

    Example:
        >>> map_at_k(img_codes, txt_codes, query_labels, retrieval_labels, k=50)  # I→T
    """
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    keep = queries_to_keep(empty, query_labels, retrieval_labels)
    ap = average_precision_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, k, chunk_size,
        ranking=ranking, retrieval_chunk_size=retrieval_chunk_size,
    )
    return mean(ap, keep)


def map_at_all(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> float:
    """MAP over the whole ranking: ``map_at_k(..., k=None)``."""
    return map_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, None, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size,
    )


def map_at_k_cosine(
    query: ArrayLike,
    retrieval: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    k: Optional[int] = 50,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> float:
    """MAP@K with cosine ranking of real-valued embeddings (descending, ties by retrieval index).

    ``k=None`` ranks everything: memory then grows with chunk_size * N.
    """
    return map_at_k(
        query, retrieval, query_labels, retrieval_labels, k, chunk_size,
        empty=empty, ranking="cosine", retrieval_chunk_size=retrieval_chunk_size,
    )


def _hits_at(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    ks: Sequence[int],
    match,
    ranking: str,
    chunk_size: int,
    retrieval_chunk_size: int,
) -> torch.Tensor:
    """Relevant items among the first k, for each k of ``ks``. Shape: -> [Q, len(ks)] int64."""
    ks = list(ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be a non-empty list of positive integers, got {ks}")
    n = retrieval.shape[0]
    cols = torch.tensor([min(k, n) - 1 for k in ks], device=query.device)
    out = []
    for start, _, idx in iter_top_k(query, retrieval, max(ks), ranking, chunk_size, retrieval_chunk_size):
        hits = match(start, idx).long().cumsum(dim=1)
        out.append(hits[:, cols])
    return torch.cat(out)


def precision_recall_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    ks: Sequence[int] = (1, 5, 10, 50, 100, 500, 1000),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Tuple[List[float], List[float]]:
    """(precision@K curve, recall@K curve) from one ranking pass; see the two functions below."""
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    check_labels(query_codes, retrieval_codes, query_labels, retrieval_labels)
    keep = queries_to_keep(empty, query_labels, retrieval_labels)
    n = retrieval_codes.shape[0]
    hits = _hits_at(
        query_codes, retrieval_codes, ks,
        lambda s, idx: gather_relevance(query_labels[s : s + chunk_size], retrieval_labels, idx),
        ranking, chunk_size, retrieval_chunk_size,
    ).double()
    denom = torch.tensor([min(k, n) for k in ks], dtype=torch.float64, device=hits.device)
    total = relevant_counts(query_labels.to(query_codes.device), retrieval_labels)
    recall = hits / total.clamp(min=1).double().to(hits.device)[:, None]
    return mean_columns(hits / denom, keep), mean_columns(recall, keep)


def precision_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    ks: Sequence[int] = (1, 5, 10, 50, 100, 500, 1000),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> List[float]:
    """Precision@K curve: mean over queries of (relevant among the first K) / K, one value per K.

    K larger than the retrieval set N counts as N (the whole list is returned).
    """
    return precision_recall_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, ks, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size,
    )[0]


def recall_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    ks: Sequence[int] = (1, 5, 10, 50, 100, 500, 1000),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> List[float]:
    """Recall@K curve: mean over queries of (relevant among the first K) / (relevant in the set)."""
    return precision_recall_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, ks, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size,
    )[1]


def recall_at_ranks(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_ids: ArrayLike,
    retrieval_ids: ArrayLike,
    ranks: Sequence[int] = (1, 5, 10),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> List[float]:
    """Recall@1/5/10 of caption retrieval: the fraction of queries with a true match among the first R.

    A query's true matches are the retrieval items with its id (e.g. the 5
    captions of one COCO image). Shape: query_ids [Q], retrieval_ids [N] int64.
    ``empty="skip"`` leaves out queries whose id occurs nowhere in the retrieval set.
    """
    query_codes, retrieval_codes, query_ids, retrieval_ids = as_tensors(
        query_codes, retrieval_codes, query_ids, retrieval_ids
    )
    check_ids(query_codes, retrieval_codes, query_ids, retrieval_ids)
    check_choice("empty", empty, ("zero", "skip"))
    device = query_codes.device
    query_ids = query_ids.to(device).long()
    retrieval_ids = retrieval_ids.long()
    keep = None if empty == "zero" else id_match_counts(query_ids, retrieval_ids.to(device)) > 0
    hits = _hits_at(
        query_codes, retrieval_codes, ranks,
        lambda s, idx: gather_id_match(query_ids[s : s + chunk_size], retrieval_ids, idx),
        ranking, chunk_size, retrieval_chunk_size,
    )
    return mean_columns((hits > 0).double(), keep)


def map_at_k_by_id(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_ids: ArrayLike,
    retrieval_ids: ArrayLike,
    k: int = 50,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> float:
    """MAP@K with relevance "same id" (caption sets, docs/reference.md §7): AP@K as in §6, 0 for a
    query with no match among its first K, averaged over all queries.

    Shape: codes [Q, d], [N, d]; query_ids [Q], retrieval_ids [N] int64.
    """
    query_codes, retrieval_codes, query_ids, retrieval_ids = as_tensors(
        query_codes, retrieval_codes, query_ids, retrieval_ids
    )
    check_ids(query_codes, retrieval_codes, query_ids, retrieval_ids)
    query_ids = query_ids.to(query_codes.device).long()
    retrieval_ids = retrieval_ids.long()
    ap = [average_precision_ranked(gather_id_match(query_ids[start : start + chunk_size], retrieval_ids, idx))
          for start, _, idx in iter_top_k(query_codes, retrieval_codes, k, ranking, chunk_size, retrieval_chunk_size)]
    return mean(torch.cat(ap))
