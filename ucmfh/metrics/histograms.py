"""Hamming histograms: per query, how many items (and relevant items) lie at each distance.

They serve the PR curve by radius (:mod:`ucmfh.metrics.radius`) and MAP@all by
counting (:mod:`ucmfh.metrics.ap`). On the CPU the compiled kernels count
(:mod:`ucmfh.metrics.native`); elsewhere blocks of exact matmul distances are
scattered into counters. Memory: ``chunk_size * retrieval_chunk_size``.
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    as_pm1,
    check_chunks,
    check_pair,
    n_bits_of,
)
from ucmfh.metrics.native import code_words, label_words, native_histograms, use_native
from ucmfh.similarity import label_relevance


def _block_distances(q: torch.Tensor, r: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Exact integer Hamming distances of ±1 float blocks. Shape: [q, n_bits], [m, n_bits] -> [q, m] int64.

    One matmul gives them directly: [-q/2, n_bits/2] · [r, 1] = (n_bits - q·r) / 2,
    all terms multiples of 1/2, so the float32 result is exact.
    """
    qa = torch.cat([q * -0.5, q.new_full((q.shape[0], 1), n_bits * 0.5)], dim=1)
    ra = torch.cat([r, r.new_ones(r.shape[0], 1)], dim=1)
    return (qa @ ra.T).long()


def iter_distance_blocks(
    q: torch.Tensor,
    q_labels: torch.Tensor,
    retrieval: torch.Tensor,
    retrieval_labels: torch.Tensor,
    retrieval_chunk_size: int,
) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(distances, relevance)`` of ±1 queries against each retrieval block, in index order.

    Shape: q [q, n_bits] float on the computing device, q_labels [q, C] ->
    per block of m items: distances [q, m] int64 (exact), relevance [q, m] bool.
    """
    device = q.device
    n_bits = n_bits_of(retrieval)
    ql = q_labels.to(device).float()
    for start in range(0, retrieval.shape[0], retrieval_chunk_size):
        r = as_pm1(retrieval[start : start + retrieval_chunk_size], device)
        rl = retrieval_labels[start : start + retrieval_chunk_size].to(device).float()
        yield _block_distances(q, r, n_bits), label_relevance(ql, rl)


def iter_hamming_histograms(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    k: Optional[int] = None,
) -> Iterator[Tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query index, all, relevant)`` per query chunk.

    ``all[i, d]`` counts retrieval items at Hamming distance d from query i,
    ``relevant[i, d]`` those of them sharing a label. Shape: [q, n_bits + 1] int64.
    With ``k``, only the counts up to the distance of the k-th item need be exact
    (those a top k depends on): the compiled kernels then skip the items beyond.
    """
    check_pair(query, retrieval, "hamming")
    check_chunks(chunk_size, retrieval_chunk_size)
    device = query.device
    n_bits = n_bits_of(retrieval)
    if use_native(device):
        rw, rlw = code_words(retrieval), label_words(retrieval_labels)
        for start in range(0, query.shape[0], chunk_size):
            stop = start + chunk_size
            qw, qlw = code_words(query[start:stop]), label_words(query_labels[start:stop])
            yield (start, *native_histograms(qw, rw, qlw, rlw, n_bits, k))
        return
    for start in range(0, query.shape[0], chunk_size):
        q = as_pm1(query[start : start + chunk_size], device)
        h_all = torch.zeros(q.shape[0], n_bits + 1, dtype=torch.int64, device=device)
        h_rel = torch.zeros_like(h_all)
        q_labels = query_labels[start : start + chunk_size]
        for dist, rel in iter_distance_blocks(q, q_labels, retrieval, retrieval_labels, retrieval_chunk_size):
            h_all.scatter_add_(1, dist, torch.ones_like(dist))
            h_rel.scatter_add_(1, dist, rel.long())
        yield start, h_all, h_rel
