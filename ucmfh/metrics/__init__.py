"""Retrieval metrics."""
from ucmfh.metrics.ranking import map_at_k, map_at_k_cosine

__all__ = ["map_at_k", "map_at_k_cosine"]
