"""Relevance: by a shared label (multi-hot labels) or by an equal id (caption sets).

docs/reference.md §6 (labels) and §7 (ids). Also which queries count in a
mean: the ``empty`` option of every metric.
"""
from __future__ import annotations

from typing import Optional

import torch

from ucmfh.metrics.arguments import ArrayLike, as_tensors, check_choice, check_label_matrices


def gather_relevance(
    q_labels: torch.Tensor, retrieval_labels: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """Relevance (shared label) of ranked items. Shape: [q, C], [N, C], [q, k] -> [q, k] bool."""
    device = indices.device
    ql = q_labels.to(device).float()
    rl = retrieval_labels.to(device)
    q, k = indices.shape
    if k * ql.shape[1] <= retrieval_labels.shape[0]:
        ranked = rl[indices].float()  # [q, k, C]
        return torch.einsum("qc,qkc->qk", ql, ranked) > 0
    return (ql @ rl.float().T > 0).gather(1, indices)


def gather_id_match(q_ids: torch.Tensor, retrieval_ids: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """True matches (equal id) of ranked items. Shape: [q], [N], [q, k] -> [q, k] bool."""
    device = indices.device
    return retrieval_ids.to(device)[indices] == q_ids.to(device)[:, None]


COUNT_BLOCK = 2**22  # query–label-vector pairs of relevant_counts at once: ~60 MB


def relevant_counts(query_labels: ArrayLike, retrieval_labels: ArrayLike) -> torch.Tensor:
    """Number of retrieval items sharing a label with each query. Shape: [Q, C], [N, C] -> [Q] int64.

    Tensors or numpy arrays; the result is a tensor on the device of ``query_labels``.
    Counts over the distinct label vectors of the retrieval set, so the cost is
    Q * (distinct vectors), not Q * N; the queries a block at a time, of at most :data:`COUNT_BLOCK` query–vector
    pairs (the whole [Q, distinct vectors] at once took 2 GB for 1,000 queries and 250,000 distinct vectors).
    """
    query_labels, retrieval_labels = as_tensors(query_labels, retrieval_labels)
    check_label_matrices(query_labels, retrieval_labels)  # [N, C] of 0/1, one C: as map_at_k
    device = query_labels.device
    retrieval_labels = retrieval_labels.to(device) != 0
    if retrieval_labels.shape[1] <= 62:  # one integer per label vector: a 1-D unique is a fast sort
        weights = 2 ** torch.arange(retrieval_labels.shape[1], device=device, dtype=torch.int64)
        keys, counts = torch.unique((retrieval_labels.long() * weights).sum(dim=1), return_counts=True)
        patterns = (keys[:, None] & weights) != 0
    else:
        patterns, counts = torch.unique(retrieval_labels, dim=0, return_counts=True)
    patterns, counts = patterns.float().T, counts.double()
    out = torch.empty(query_labels.shape[0], dtype=torch.int64, device=device)
    step = max(1, COUNT_BLOCK // max(1, patterns.shape[1]))
    for start in range(0, query_labels.shape[0], step):
        hit = (query_labels[start : start + step].float() @ patterns) > 0
        out[start : start + step] = (hit.double() @ counts).round().long()
    return out


def id_match_counts(query_ids: torch.Tensor, retrieval_ids: torch.Tensor) -> torch.Tensor:
    """Number of retrieval items with each query's id. Shape: [Q], [N] -> [Q] int64, on the device of ``query_ids``."""
    device = query_ids.device
    values, counts = torch.unique(retrieval_ids.to(device), return_counts=True)
    pos = torch.searchsorted(values, query_ids).clamp(max=values.numel() - 1)
    return torch.where(values[pos] == query_ids, counts[pos], torch.zeros_like(counts[pos]))


def check_some_id_match(query_ids: torch.Tensor, retrieval_ids: torch.Tensor) -> None:
    """Refuse ids of which no query's occurs among the retrieval ids: relevance by id would make every score 0,
    a misuse rather than a result (a caption set's query and retrieval splits share no id by design)."""
    if query_ids.numel() and not bool((id_match_counts(query_ids, retrieval_ids) > 0).any()):
        raise ValueError("no query id occurs among the retrieval ids, so every score by id would be 0 (a caption "
                         "set's query and retrieval splits share none: ucmfh.evaluate_caption_set scores its "
                         "test and collection databases)")


def queries_to_keep(empty: str, query_labels: torch.Tensor, retrieval_labels: torch.Tensor) -> Optional[torch.Tensor]:
    """Which queries count in a mean under ``empty``: None (all) for ``"zero"``; for ``"skip"``,
    those with a relevant item in the retrieval set, at least one (``ValueError``: a mean of none, which read 0.0).
    Shape: -> [Q] bool or None."""
    check_choice("empty", empty, ("zero", "skip"))
    if empty == "zero":
        return None
    keep = relevant_counts(query_labels, retrieval_labels) > 0
    if keep.numel() and not bool(keep.any()):
        raise ValueError("empty='skip' leaves no query: none shares a label with a retrieval item, and a mean of "
                         "none is no score (empty='zero' scores each such query 0)")
    return keep
