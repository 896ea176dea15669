"""Search a collection: an index of binary codes, exact Hamming top-K, shards, results pages (docs/search.md)."""
from typing import Any

from ucmfh.search.index import Index, as_words, hamming_search, merge_top_k

__all__ = ["Encoder", "Index", "as_words", "hamming_search", "merge_top_k"]


def __getattr__(name: str) -> Any:
    """``Encoder`` (features -> codes by a checkpoint) is imported on first use: it needs torch, a search does not."""
    if name == "Encoder":
        from ucmfh.search.build import Encoder

        return Encoder
    raise AttributeError(f"module 'ucmfh.search' has no attribute {name!r}")
