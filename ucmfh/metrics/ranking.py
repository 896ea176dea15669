"""Ranking metrics: MAP@K, MAP@all, precision@K, recall@K, Recall@ranks (docs/reference.md §6).

Every function ranks by Hamming distance of ±1 (or packed) codes by default, or
by cosine similarity of real-valued embeddings with ``ranking="cosine"``;
ties by retrieval index ascending, or with ``ties="expected"`` the exact mean
over every order of tied items (:mod:`ucmfh.metrics.ties`). ``empty`` decides what happens to a query
with no relevant item in the whole retrieval set: ``"zero"`` (default, the
field's standard for MAP) scores it 0 and keeps it in the mean, ``"skip"``
leaves it out of the mean. Results are identical for every chunk size.

Codes, labels and ids are tensors or numpy arrays (shared, not copied, where
numpy allows); results are floats, lists of floats, or for
:func:`average_precision_at_k` a tensor on the device of the query codes.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ucmfh.metrics.ap import (
    average_precision_all_hamming,
    average_precision_native,
    average_precision_ranked,
    mean,
    mean_columns,
)
from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_K,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ArrayLike,
    Empty,
    TIES,
    Ranking,
    Ties,
    as_tensors,
    check_choice,
    check_count,
    check_ids,
    check_chunks,
    check_labels,
    check_pair,
)
from ucmfh.metrics.native import use_native
from ucmfh.metrics.relevance import (
    check_some_id_match,
    gather_id_match,
    gather_relevance,
    id_match_counts,
    queries_to_keep,
    relevant_counts,
)
from ucmfh.metrics.ties import (
    expected_average_precision,
    hit_probability,
    iter_cosine_lists,
    iter_hamming_groups,
    on_host,
    tie_aware_average_precision,
    tie_aware_hits,
)
from ucmfh.metrics.topk import iter_top_k


def average_precision_at_k(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    k: Optional[int] = DEFAULT_K,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
) -> torch.Tensor:
    """AP@K of every query (``k=None``: over the whole ranking). Shape: -> [Q] float64.

    AP@K = (1/r) Σ_i i / p_i over the r relevant items among the first K, at
    positions p_1 < … < p_r; 0 when r = 0. K larger than N means N.
    ``ties="expected"``: its mean over every order of tied items.
    """
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    check_labels(query_codes, retrieval_codes, query_labels, retrieval_labels)
    check_choice("ties", ties, TIES)
    if k is not None:
        check_count("k", k)
    check_chunks(chunk_size, retrieval_chunk_size)  # every path's, the compiled kernels' too
    n = retrieval_codes.shape[0]
    if ties == "expected":
        check_pair(query_codes, retrieval_codes, ranking)
        return tie_aware_average_precision(
            query_codes, retrieval_codes, query_labels, retrieval_labels, by_id=False, k=k, ranking=ranking,
            chunk_size=chunk_size, retrieval_chunk_size=retrieval_chunk_size,
        )
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
    k: Optional[int] = DEFAULT_K,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
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
        ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties=ties,
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
    ties: Ties = "index",
) -> float:
    """MAP over the whole ranking: ``map_at_k(..., k=None)``."""
    return map_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, None, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties=ties,
    )


def map_at_k_cosine(
    query: ArrayLike,
    retrieval: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    k: Optional[int] = DEFAULT_K,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
) -> float:
    """MAP@K with cosine ranking of real-valued embeddings (descending, ties by retrieval index).

    ``k=None`` ranks everything: memory then grows with chunk_size * N.
    """
    return map_at_k(
        query, retrieval, query_labels, retrieval_labels, k, chunk_size,
        empty=empty, ranking="cosine", retrieval_chunk_size=retrieval_chunk_size, ties=ties,
    )


def _check_ks(given: Sequence[int], what: str) -> List[int]:
    """Cut-offs ``ks`` as a list, each a positive integer; ``what``: the caller's name for them, in a refusal."""
    ks = [] if isinstance(given, (int, np.integer)) else list(given)  # 5 said "'int' object is not iterable"
    if not ks:
        raise ValueError(f"{what} must be a non-empty list of positive integers, got {given!r}")
    for k in ks:
        check_count(what, k)
    return ks


def _hits_at(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_side: torch.Tensor,
    retrieval_side: torch.Tensor,
    ks: Sequence[int],
    *,
    by_id: bool,
    any_hit: bool,
    ranking: str,
    ties: str,
    chunk_size: int,
    retrieval_chunk_size: int,
    what: str = "ks",
) -> torch.Tensor:
    """Relevant items among the first k (``any_hit``: whether there is one), for each k of ``ks`` (``what``: the
    caller's name for them, in a refusal),
    relevance by label or (``by_id``) by id; with ``ties="expected"`` their mean over every order
    of tied items. Shape: -> [Q, len(ks)] float64."""
    ks = _check_ks(ks, what)
    check_choice("ties", ties, TIES)
    check_chunks(chunk_size, retrieval_chunk_size)
    if ties == "expected":
        check_pair(query, retrieval, ranking)
        return tie_aware_hits(query, retrieval, query_side, retrieval_side, ks, by_id=by_id, any_hit=any_hit,
                              ranking=ranking, chunk_size=chunk_size, retrieval_chunk_size=retrieval_chunk_size)
    n = retrieval.shape[0]
    cols = torch.tensor([min(k, n) - 1 for k in ks], device=query.device)
    out = []
    for start, _, idx in iter_top_k(query, retrieval, max(ks), ranking, chunk_size, retrieval_chunk_size):
        q_side = query_side[start : start + chunk_size]
        match = gather_id_match(q_side, retrieval_side, idx) if by_id else gather_relevance(q_side, retrieval_side, idx)
        hits = match.long().cumsum(dim=1)[:, cols]
        out.append((hits > 0) if any_hit else hits)
    return torch.cat(out).double()


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
    ties: Ties = "index",
) -> Tuple[List[float], List[float]]:
    """(precision@K curve, recall@K curve) from one ranking pass; see the two functions below."""
    query_codes, retrieval_codes, query_labels, retrieval_labels = as_tensors(
        query_codes, retrieval_codes, query_labels, retrieval_labels
    )
    check_labels(query_codes, retrieval_codes, query_labels, retrieval_labels)
    keep = queries_to_keep(empty, query_labels, retrieval_labels)
    n = retrieval_codes.shape[0]
    hits = _hits_at(
        query_codes, retrieval_codes, query_labels, retrieval_labels, ks, by_id=False, any_hit=False,
        ranking=ranking, ties=ties, chunk_size=chunk_size, retrieval_chunk_size=retrieval_chunk_size,
    )
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
    ties: Ties = "index",
) -> List[float]:
    """Precision@K curve: mean over queries of (relevant among the first K) / K, one value per K.

    K larger than the retrieval set N counts as N (the whole list is returned).
    """
    return precision_recall_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, ks, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties=ties,
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
    ties: Ties = "index",
) -> List[float]:
    """Recall@K curve: mean over queries of (relevant among the first K) / (relevant in the set)."""
    return precision_recall_at_k(
        query_codes, retrieval_codes, query_labels, retrieval_labels, ks, chunk_size,
        empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties=ties,
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
    ties: Ties = "index",
) -> List[float]:
    """Recall@1/5/10 of caption retrieval: the fraction of queries with a true match among the first R.

    A query's true matches are the retrieval items with its id (e.g. the 5
    captions of one COCO image). Shape: query_ids [Q], retrieval_ids [N] int64.
    ``empty="skip"`` leaves out queries whose id occurs nowhere in the retrieval set.
    """
    check_choice("empty", empty, ("zero", "skip"))
    hits = hits_at_ranks(query_codes, retrieval_codes, query_ids, retrieval_ids, ranks, chunk_size, ranking=ranking,
                         retrieval_chunk_size=retrieval_chunk_size, ties=ties)
    query_ids, retrieval_ids = as_tensors(query_ids, retrieval_ids)
    keep = None if empty == "zero" else id_match_counts(query_ids.long(), retrieval_ids.long().to(query_ids.device)) > 0
    return mean_columns(hits, keep)


def hits_at_ranks(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_ids: ArrayLike,
    retrieval_ids: ArrayLike,
    ranks: Sequence[int] = (1, 5, 10),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
) -> torch.Tensor:
    """Per query, whether a true match (same id) is among its first R, for each R: 1.0 or 0.0, or with
    ``ties="expected"`` the probability over every order of tied items. :func:`recall_at_ranks` is
    their mean. Shape: -> [Q, len(ranks)] float64."""
    query_codes, retrieval_codes, query_ids, retrieval_ids = as_tensors(
        query_codes, retrieval_codes, query_ids, retrieval_ids
    )
    check_ids(query_codes, retrieval_codes, query_ids, retrieval_ids)
    check_some_id_match(query_ids.long(), retrieval_ids.long().to(query_ids.device))
    return _hits_at(
        query_codes, retrieval_codes, query_ids.to(query_codes.device).long(), retrieval_ids.long(), ranks,
        by_id=True, any_hit=True, ranking=ranking, ties=ties, chunk_size=chunk_size,
        retrieval_chunk_size=retrieval_chunk_size, what="ranks",
    )


def map_at_k_by_id(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_ids: ArrayLike,
    retrieval_ids: ArrayLike,
    k: int = DEFAULT_K,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
) -> float:
    """MAP@K with relevance "same id" (caption sets, docs/reference.md §7): AP@K as in §6, 0 for a
    query with no match among its first K, averaged over all queries; ``empty="skip"`` leaves out queries
    whose id occurs nowhere in the retrieval set (as :func:`recall_at_ranks`).

    Shape: codes [Q, d], [N, d]; query_ids [Q], retrieval_ids [N] int64.
    """
    check_choice("empty", empty, ("zero", "skip"))
    ap = average_precision_by_id(query_codes, retrieval_codes, query_ids, retrieval_ids, k, chunk_size,
                                 ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties=ties)
    if empty == "zero":
        return mean(ap)
    query_ids, retrieval_ids = as_tensors(query_ids, retrieval_ids)
    return mean(ap, id_match_counts(query_ids.long(), retrieval_ids.long().to(query_ids.device)) > 0)


def average_precision_by_id(
    query_codes: ArrayLike,
    retrieval_codes: ArrayLike,
    query_ids: ArrayLike,
    retrieval_ids: ArrayLike,
    k: int = DEFAULT_K,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    ranking: Ranking = "hamming",
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ties: Ties = "index",
) -> torch.Tensor:
    """AP@K of every query with relevance "same id" (:func:`map_at_k_by_id` is their mean). Shape: -> [Q] float64."""
    query_codes, retrieval_codes, query_ids, retrieval_ids = as_tensors(
        query_codes, retrieval_codes, query_ids, retrieval_ids
    )
    check_ids(query_codes, retrieval_codes, query_ids, retrieval_ids)
    check_some_id_match(query_ids.long(), retrieval_ids.long().to(query_ids.device))
    query_ids = query_ids.to(query_codes.device).long()
    retrieval_ids = retrieval_ids.long()
    check_choice("ties", ties, TIES)
    check_count("k", k)  # k=0 scored 0.0 tie-aware, where ties by index refused it
    check_chunks(chunk_size, retrieval_chunk_size)
    if ties == "expected":
        check_pair(query_codes, retrieval_codes, ranking)
        return tie_aware_average_precision(
            query_codes, retrieval_codes, query_ids, retrieval_ids, by_id=True, k=k, ranking=ranking,
            chunk_size=chunk_size, retrieval_chunk_size=retrieval_chunk_size,
        )
    ap = [average_precision_ranked(gather_id_match(query_ids[start : start + chunk_size], retrieval_ids, idx))
          for start, _, idx in iter_top_k(query_codes, retrieval_codes, k, ranking, chunk_size, retrieval_chunk_size)]
    return torch.cat(ap)


def scores_by_rule(
    query: ArrayLike,
    retrieval: ArrayLike,
    query_side: ArrayLike,
    retrieval_side: ArrayLike,
    *,
    by_id: bool,
    k: int = DEFAULT_K,
    ranks: Sequence[int] = (),
    ranking: Ranking = "hamming",
    rules: Sequence[Ties] = ("index",),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    on_queries: Optional[Callable[[int], None]] = None,
) -> Dict[str, Dict[str, torch.Tensor]]:
    """AP@k of every query (``"ap"`` [Q]) and, with ``ranks``, whether a relevant item is among its first R
    (``"hits"`` [Q, len(ranks)]: 0/1, or its probability tie-aware), float64, under each tie rule of ``rules``:
    ``{rule: {"ap": …, "hits": …}}``. Relevance by a shared label (multi-hot sides), or with ``by_id`` an equal
    id (``ranks`` need it). The figures of :func:`average_precision_at_k` (:func:`average_precision_by_id`) and
    :func:`hits_at_ranks`, where each of those ranks again: a cosine ranking is found once for all of them (its
    lists and its runs of ties), a Hamming ranking's groups of tied items once for the tie-aware figures (its
    lists by index are the compiled kernels', cheap). ``on_queries`` is told how many queries were ranked as each
    chunk of them is done (a progress bar's steps: a cosine ranking of 5,000 queries against 100,000 items takes
    half a minute)."""
    query, retrieval, query_side, retrieval_side = as_tensors(query, retrieval, query_side, retrieval_side)
    rules = list(dict.fromkeys(rules))
    if not rules:
        raise ValueError(f"rules must name one tie rule at least, of {TIES}")
    for rule in rules:
        check_choice("ties", rule, TIES)
    ks = [] if isinstance(ranks, (list, tuple)) and not ranks else _check_ks(ranks, "ranks")
    if ks and not by_id:
        raise ValueError("ranks (a hit among the first R) are scored by id: by_id=True")
    if by_id:
        check_ids(query, retrieval, query_side, retrieval_side)
        check_some_id_match(query_side.long(), retrieval_side.long().to(query_side.device))
        query_side, retrieval_side = query_side.to(query.device).long(), retrieval_side.long()
    else:
        check_labels(query, retrieval, query_side, retrieval_side)
    check_count("k", k)
    check_chunks(chunk_size, retrieval_chunk_size)
    check_pair(query, retrieval, ranking)
    n = retrieval.shape[0]
    depth = min(max([k, *ks]), n)  # every figure's cut-off
    cols = torch.tensor([min(r, n) - 1 for r in ks], dtype=torch.long, device=query.device)
    empty = {"ap": torch.zeros(0, dtype=torch.float64, device=query.device),
             "hits": torch.zeros(0, len(ks), dtype=torch.float64, device=query.device)}
    parts: Dict[str, Dict[str, List[torch.Tensor]]] = {rule: {"ap": [], **({"hits": []} if ks else {})}
                                                       for rule in rules}
    expected = "expected" in rules
    if ranking == "cosine":
        passes = iter_cosine_lists(query, retrieval, query_side, retrieval_side, by_id, depth, chunk_size,
                                   retrieval_chunk_size, groups=expected)
    else:
        groups = iter_hamming_groups(query, retrieval, query_side, retrieval_side, by_id, depth, chunk_size,
                                     retrieval_chunk_size) if expected else ()
        passes = ((start, None, items, relevant) for start, items, relevant in groups)
        if "index" in rules:
            ap = average_precision_by_id if by_id else average_precision_at_k
            kw = dict(ranking=ranking, retrieval_chunk_size=retrieval_chunk_size, ties="index")
            parts["index"]["ap"].append(ap(query, retrieval, query_side, retrieval_side, k, chunk_size, **kw))
            if ks:
                parts["index"]["hits"].append(hits_at_ranks(query, retrieval, query_side, retrieval_side, ks,
                                                            chunk_size, **kw))
    ranked = 0
    for _, listed, items, relevant in passes:
        if listed is not None and "index" in rules:
            parts["index"]["ap"].append(average_precision_ranked(listed[:, :k]))
            if ks:
                parts["index"]["hits"].append((listed.long().cumsum(dim=1)[:, cols] > 0).double())
        if expected:
            items, relevant = on_host(items, relevant)
            parts["expected"]["ap"].append(expected_average_precision(items, relevant, k).to(query.device))
            if ks:
                cut = [min(r, n) for r in ks]
                parts["expected"]["hits"].append(hit_probability(items, relevant, cut).to(query.device))
        if on_queries is not None:
            chunk = len(listed if listed is not None else items)
            on_queries(chunk)
            ranked += chunk
    if on_queries is not None and ranked < query.shape[0]:  # a Hamming ranking by index alone: the kernels' one step
        on_queries(query.shape[0] - ranked)
    return {rule: {name: torch.cat(values) if values else empty[name] for name, values in found.items()}
            for rule, found in parts.items()}
