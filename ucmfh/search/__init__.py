"""Search a collection: an index of binary codes, exact Hamming top-K, shards, results pages (docs/search.md)."""
from typing import Any

from ucmfh.bits import as_words
from ucmfh.search.index import Index
from ucmfh.search.scan import hamming_search, merge_top_k

__all__ = ["Encoder", "Index", "as_words", "build_index", "hamming_search", "merge_top_k"]


def __getattr__(name: str) -> Any:
    """``Encoder`` (features -> codes by a checkpoint) and ``build_index`` (a collection file encoded into an
    index folder) are imported on first use: they need torch, a search does not."""
    if name in ("Encoder", "build_index"):
        from ucmfh.search import build

        return getattr(build, name)
    raise AttributeError(f"module 'ucmfh.search' has no attribute {name!r}")
