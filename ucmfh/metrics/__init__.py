"""Retrieval metrics: exact, chunked, device-following (REFERENCE §6).

Ranking is by Hamming distance of ±1 codes (or packed uint8 bits), or by
cosine similarity with ``ranking="cosine"``; ties by retrieval index.
"""
from ucmfh.metrics.engine import native_kernels, relevant_counts, top_k
from ucmfh.metrics.report import codes_file_row, evaluate_codes, evaluate_codes_file, evaluate_direction
from ucmfh.metrics.radius import pr_curve_hamming, precision_within_radius
from ucmfh.metrics.ranking import (
    average_precision_at_k,
    map_at_all,
    map_at_k,
    map_at_k_cosine,
    precision_at_k,
    precision_recall_at_k,
    recall_at_k,
    recall_at_ranks,
)

__all__ = [
    "average_precision_at_k",
    "codes_file_row",
    "evaluate_codes",
    "evaluate_codes_file",
    "evaluate_direction",
    "map_at_all",
    "map_at_k",
    "map_at_k_cosine",
    "native_kernels",
    "pr_curve_hamming",
    "precision_at_k",
    "precision_recall_at_k",
    "precision_within_radius",
    "recall_at_k",
    "recall_at_ranks",
    "relevant_counts",
    "top_k",
]
