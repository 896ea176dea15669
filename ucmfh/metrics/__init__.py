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
from importlib import import_module

# loaded on first use, as ucmfh's own names: the package's light modules (intervals, plots: numpy and the
# standard library) are imported without torch, which the ranking modules import
_HOMES = {
    "evaluate_caption_set": "captions",
    "backend": "native", "native_kernels": "native", "set_backend": "native",
    "pr_curve_hamming": "radius", "precision_within_radius": "radius",
    **{name: "ranking" for name in (
        "average_precision_at_k", "map_at_all", "map_at_k", "map_at_k_by_id", "map_at_k_cosine", "precision_at_k",
        "precision_recall_at_k", "recall_at_k", "recall_at_ranks")},
    "relevant_counts": "relevance",
    "codes_file_row": "report", "evaluate_codes": "report", "evaluate_codes_file": "report",
    "evaluate_direction": "report",
    "top_k": "topk",
}

__all__ = sorted(_HOMES)


def __getattr__(name):
    if name in _HOMES:
        return getattr(import_module(f"ucmfh.metrics.{_HOMES[name]}"), name)
    try:  # a module of the package (ucmfh.metrics.ranking), as it was when the package imported them all
        return import_module(f"ucmfh.metrics.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"ucmfh.metrics.{name}":  # a module of ours that needs one not installed
            raise
    raise AttributeError(f"module 'ucmfh.metrics' has no attribute {name!r}")


def __dir__():  # the names loaded on first use too
    return sorted({*globals(), *_HOMES})
