"""ucmfh: deep cross-modal hashing on precomputed image and text features.

The retrieval metrics are also importable from here (``from ucmfh import map_at_k``);
they load on first use, so ``import ucmfh`` stays light.
"""
__version__ = "0.1.0"

_METRICS = (
    "average_precision_at_k", "evaluate_caption_set", "evaluate_codes", "evaluate_codes_file", "evaluate_direction", "map_at_all",
    "map_at_k", "map_at_k_by_id", "map_at_k_cosine", "native_kernels", "pr_curve_hamming", "precision_at_k",
    "precision_recall_at_k", "precision_within_radius", "recall_at_k", "recall_at_ranks", "set_backend", "top_k",
)
__all__ = ["__version__", *_METRICS]


def __getattr__(name):
    if name in _METRICS:
        from ucmfh import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'ucmfh' has no attribute {name!r}")
