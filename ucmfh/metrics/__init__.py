"""Retrieval metrics: exact, chunked, device-following (docs/reference.md §6).

Ranking is by Hamming distance of ±1 codes (or packed uint8 bits), or by
cosine similarity with ``ranking="cosine"``; ties by retrieval index. Every
metric takes tensors or numpy arrays. :func:`set_backend` (or the context
manager :func:`backend`) chooses what computes Hamming metrics of CPU tensors:
the compiled kernels (:func:`native_kernels` names their build) or torch.

Modules: ``ranking`` (MAP@K, precision/recall@K, Recall@ranks), ``captions``
(caption sets: unique-image queries, both databases, R@K, MAP by id), ``radius``
(PR by Hamming radius), ``report`` (every metric of both directions), ``plots``;
their building blocks ``topk``, ``relevance``, ``ap``, ``histograms``,
``native`` (kernel bindings, backend) and ``arguments`` (checks, conversions).
"""
from ucmfh.metrics.captions import evaluate_caption_set
from ucmfh.metrics.native import backend, native_kernels, set_backend
from ucmfh.metrics.radius import pr_curve_hamming, precision_within_radius
from ucmfh.metrics.ranking import (
    average_precision_at_k,
    map_at_all,
    map_at_k,
    map_at_k_by_id,
    map_at_k_cosine,
    precision_at_k,
    precision_recall_at_k,
    recall_at_k,
    recall_at_ranks,
)
from ucmfh.metrics.relevance import relevant_counts
from ucmfh.metrics.report import codes_file_row, evaluate_codes, evaluate_codes_file, evaluate_direction
from ucmfh.metrics.topk import top_k

__all__ = [
    "average_precision_at_k",
    "backend",
    "codes_file_row",
    "evaluate_caption_set",
    "evaluate_codes",
    "evaluate_codes_file",
    "evaluate_direction",
    "map_at_all",
    "map_at_k",
    "map_at_k_by_id",
    "map_at_k_cosine",
    "native_kernels",
    "pr_curve_hamming",
    "precision_at_k",
    "precision_recall_at_k",
    "precision_within_radius",
    "recall_at_k",
    "recall_at_ranks",
    "relevant_counts",
    "set_backend",
    "top_k",
]
