"""Search a collection: an index of binary codes, exact Hamming top-K, shards, results pages (docs/search.md)."""
from ucmfh.search.index import Index, as_words, hamming_search, merge_top_k

__all__ = ["Index", "as_words", "hamming_search", "merge_top_k"]
