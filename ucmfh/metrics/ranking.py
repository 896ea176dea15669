"""MAP@K by Hamming ranking of ±1 codes, and by cosine ranking of real-valued embeddings (REFERENCE §6)."""
from __future__ import annotations

from typing import Optional

import torch

from ucmfh.similarity import cosine_similarity, hamming_distance, label_relevance


def _average_precision(rel: torch.Tensor) -> torch.Tensor:
    """AP of each row of a ranked relevance matrix; rows with no relevant item score 0. Shape: [Q, K] -> [Q]."""
    rel = rel.float()
    hits = rel.cumsum(dim=1)
    positions = torch.arange(1, rel.shape[1] + 1, device=rel.device, dtype=rel.dtype)
    found = rel.sum(dim=1)
    return (hits / positions * rel).sum(dim=1) / found.clamp(min=1)


def _top_k_hamming(query_codes: torch.Tensor, retrieval_codes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k nearest by Hamming distance, ties by retrieval index. Shape: [Q, k]."""
    n = retrieval_codes.shape[0]
    dist = hamming_distance(query_codes, retrieval_codes)
    key = dist * n + torch.arange(n, device=dist.device)  # unique, so the order is total
    return key.topk(k, dim=1, largest=False, sorted=True).indices


def _top_k_cosine(query: torch.Tensor, retrieval: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k most similar by cosine, ties by retrieval index. Shape: [Q, k]."""
    sim = cosine_similarity(query.float(), retrieval.float())
    return torch.sort(-sim, dim=1, stable=True).indices[:, :k]


def _map(
    top_k,
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: Optional[int],
    chunk_size: int,
) -> float:
    n = retrieval.shape[0]
    k = n if k is None else min(k, n)
    device = retrieval.device
    query_labels = query_labels.to(device)
    retrieval_labels = retrieval_labels.to(device)
    total = 0.0
    for start in range(0, query.shape[0], chunk_size):
        q = query[start : start + chunk_size].to(device)
        ql = query_labels[start : start + chunk_size]
        idx = top_k(q, retrieval, k)
        rel = label_relevance(ql, retrieval_labels)
        total += _average_precision(rel.gather(1, idx)).sum().item()
    return total / query.shape[0]


def map_at_k(
    query_codes: torch.Tensor,
    retrieval_codes: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: Optional[int] = 50,
    chunk_size: int = 1024,
) -> float:
    """MAP@K with Hamming ranking of ±1 codes; ``k=None`` gives MAP@all.

    Shape:
        query_codes: [Q, n_bits]; retrieval_codes: [N, n_bits];
        query_labels: [Q, C]; retrieval_labels: [N, C].
    """
    return _map(_top_k_hamming, query_codes, retrieval_codes, query_labels, retrieval_labels, k, chunk_size)


def map_at_k_cosine(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: Optional[int] = 50,
    chunk_size: int = 1024,
) -> float:
    """MAP@K with cosine ranking of real-valued embeddings (ties by retrieval index)."""
    return _map(_top_k_cosine, query, retrieval, query_labels, retrieval_labels, k, chunk_size)
