"""Average precision in fixed point, and means over queries.

AP (docs/reference.md §6) of a ranked list: ``(1/r) Σ_i i / p_i`` over the r
relevant items at positions p_1 < … < p_r; 0 when r = 0. The terms are summed
in fixed point (int64, 2**-52 to 2**-40 resolution by list length): integer
sums do not depend on summation order, so chunking, threads, SIMD width and
GPU reductions cannot change a result. Means over queries use ``math.fsum``.
"""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from ucmfh.metrics.histograms import iter_distance_blocks, iter_hamming_histograms
from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    as_pm1,
    check_pair,
    n_bits_of,
)
from ucmfh.metrics.native import code_words, label_words, native_ap_sums


def fixed_scale(n: int) -> float:
    """Fixed-point scale for AP sums of lists of ``n`` items: n terms of at most 1 each must fit in int64."""
    return float(2 ** min(52, 62 - max(1, math.ceil(math.log2(n + 1)))))


def _from_fixed(total: torch.Tensor, found: torch.Tensor, scale: float) -> torch.Tensor:
    """AP from fixed-point sums [Q] int64 and relevant counts [Q]: -> [Q] float64, 0 where none is relevant."""
    return (total.double() / scale) / found.clamp(min=1).double()


def average_precision_ranked(rel: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """AP of each row of a ranked relevance matrix, normalised by the relevant items it holds.

    ``(1/r) Σ_i i / p_i`` over the relevant positions ``p_1 < … < p_r``; a row with
    r = 0 scores 0. Shape: [Q, K] bool -> [Q] float64.
    """
    if scale is None:
        scale = fixed_scale(rel.shape[1])
    hits = rel.long().cumsum(dim=1)
    positions = torch.arange(1, rel.shape[1] + 1, device=rel.device, dtype=torch.float64)
    terms = torch.where(rel, torch.round(hits.double() / positions * scale), 0.0).long()
    return _from_fixed(terms.sum(dim=1), rel.sum(dim=1), scale)


def average_precision_native(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: Optional[int],
) -> torch.Tensor:
    """AP@K (``k=None``: over the whole ranking) of every query by the compiled kernels, in one
    threaded pass. Shape: -> [Q] float64 (CPU).

    The AP terms are the fixed-point terms of :func:`average_precision_ranked` and
    :func:`average_precision_all_hamming`, so the results are bit-identical to theirs.
    """
    check_pair(query, retrieval, "hamming")
    n = retrieval.shape[0]
    k = n if k is None else min(k, n)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scale = fixed_scale(k)
    total, found = native_ap_sums(
        code_words(query), code_words(retrieval), label_words(query_labels), label_words(retrieval_labels),
        n_bits_of(retrieval), k, scale,
    )
    return _from_fixed(total, found, scale)


def _stable_argsort(dist: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Order of each row by distance, ties by position. Shape: [q, m] int64 -> [q, m] int64.

    On the CPU, numpy's stable argsort of uint8 is a radix sort, about 20x faster
    than torch's comparison sort.
    """
    if dist.device.type == "cpu" and n_bits < 256:
        order = np.argsort(dist.to(torch.uint8).numpy(), axis=1, kind="stable")
        return torch.from_numpy(order).long()
    return dist.sort(dim=1, stable=True).indices


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Sums of the entries before each one, along dim 1. Shape: [q, m] -> [q, m]."""
    return x.cumsum(dim=1) - x


def average_precision_all_hamming(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> torch.Tensor:
    """AP over the whole ranking (MAP@all) of every query by counting, on the torch path. Shape: -> [Q] float64.

    The position of a relevant item j at distance d is ``#items nearer than d``
    plus ``#items at distance d with index <= j``; its rank among the relevant
    items likewise. Pass 1 counts per distance (histograms); pass 2 walks the
    retrieval blocks in index order, carrying per-distance counts, and sorts
    each block stably by distance. Memory: chunk_size * retrieval_chunk_size.
    """
    device = query.device
    n_bits = n_bits_of(retrieval)
    scale = fixed_scale(retrieval.shape[0])
    out = []
    hists = iter_hamming_histograms(query, retrieval, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size)
    for start, h_all, h_rel in hists:
        q = as_pm1(query[start : start + chunk_size], device)
        nearer_all = exclusive_cumsum(h_all)  # items strictly nearer than d
        nearer_rel = exclusive_cumsum(h_rel)
        seen_all = torch.zeros_like(h_all)  # items at distance d in earlier blocks
        seen_rel = torch.zeros_like(h_rel)
        total = torch.zeros(q.shape[0], dtype=torch.int64, device=device)
        blocks = iter_distance_blocks(
            q, query_labels[start : start + chunk_size], retrieval, retrieval_labels, retrieval_chunk_size
        )
        for dist, rel in blocks:
            b_all = torch.zeros_like(h_all).scatter_add_(1, dist, torch.ones_like(dist))
            b_rel = torch.zeros_like(h_rel).scatter_add_(1, dist, rel.long())
            order = _stable_argsort(dist, n_bits)
            rel_sorted = rel.gather(1, order)
            # only the relevant items add to AP: their (row, place in the block's order)
            row, place = rel_sorted.nonzero(as_tuple=True)
            d = dist[row, order[row, place]]
            per_row = rel_sorted.sum(dim=1)
            first = per_row.cumsum(0) - per_row  # index in row/place of each row's first relevant item
            rank_in_block = torch.arange(1, row.numel() + 1, device=device) - first[row]
            # 1-based position in the whole ranking and rank among the relevant items
            position = (nearer_all + seen_all - exclusive_cumsum(b_all))[row, d] + place + 1
            rank = (nearer_rel + seen_rel - exclusive_cumsum(b_rel))[row, d] + rank_in_block
            terms = torch.round(rank.double() / position.double() * scale).long()
            total.index_add_(0, row, terms)
            seen_all += b_all
            seen_rel += b_rel
        out.append(_from_fixed(total, h_rel.sum(dim=1), scale))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=device)


def mean(values: torch.Tensor, keep: Optional[torch.Tensor] = None) -> float:
    """Correctly rounded mean (``math.fsum``) of the kept values; 0.0 when none is kept."""
    if keep is not None:
        values = values[keep.to(values.device)]
    if values.numel() == 0:
        return 0.0
    return math.fsum(values.double().cpu().tolist()) / values.numel()


def mean_columns(values: torch.Tensor, keep: Optional[torch.Tensor] = None, scale: float = 1.0) -> List[float]:
    """Column-wise :func:`mean` of a [Q, T] tensor, times ``scale``, -> list of T floats. Scaled before the
    division: 55 hits of 100 queries are 55.0 %, not 100 × 0.55 = 55.00000000000001."""
    if keep is not None:
        values = values[keep.to(values.device)]
    if values.shape[0] == 0:
        return [0.0] * values.shape[1]
    rows = values.double().cpu().T.tolist()
    return [math.fsum(r) * scale / len(r) for r in rows]
