"""Multi-index hashing: the exact k nearest codes without scanning them all.

Norouzi, Punjani & Fleet, "Fast Search in Hamming Space with Multi-Index Hashing", CVPR 2012
(TPAMI 2014). Each b-bit code is cut into m disjoint substrings; one table per substring groups
the items by the value of that substring. Two codes at Hamming distance d differ in some
substring by at most ⌊d / m⌋ (pigeonhole), so probing every substring's buckets within a
growing radius finds every item, nearest first: once radius r has been probed in substrings
0..j (and r − 1 in the rest), every item not yet found is at distance m·r + j + 1 or more. The
search stops when k found items lie below that bound, so the result is the exact top k by
(distance, position) — the linear scan's, ties and all.

The tables are, per substring, the positions sorted by substring value, the offsets of each
value's bucket (2^width + 1 entries), and beside each position its item's sketch: the low bits of
the next substring, 16 of them, and 24 where positions fit in 24 bits (up to 2^24 items: the top byte
of each position holds the 8 more). An item kept where it is first met, in a bucket at radius r, is at distance r
there, at the pigeonhole's least in the other substrings, and in the next one at least as far as its
sketch is from the query's: the kernel passes over an entry whose least distance exceeds the k-th
smallest found so far without reading its code, a read at random. Memory: 6 bytes per item and substring, plus 4 bytes
per substring value. The search runs in the compiled kernels (``mih_search`` of ``_hamming.c``, threads
over queries) where they are built, else in numpy, one query at a time (slow: a reference).
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ucmfh.files import atomic_path
from ucmfh.search.kernels import kernels_module, over_query_ranges

MAX_WIDTH = 24  # bits per substring: its bucket offsets take 4 · 2^width bytes
SMALL = 1 << 24  # up to this many items a position takes 24 bits, its top byte 8 more sketch bits
POSITION_BITS = 0xFFFFFF
# Probing pays when a query costs less than the scan, which reads every word of every item: measured on one core
# (scripts/bench_mih.py, 10M trained codes, 64 and 128 bits), the scan takes about 0.2-0.3 ns per 64-bit word and
# probing about 20 ns per unit of the kernel's count: a code read at random (asked for ahead of its read), a bucket
# four of them (its offsets and first entries, at random too), an entry passed over by its sketch an eighth. The
# budget, in those units, is one per 160 words of the items: about 60 % of the scan's time. (At 128 bits one per
# 160 items left probing, 1.3x the scan at k = 100, to the scan.)
BUDGET_PER_WORD = 1 / 160
PILOT = 8  # queries probed first within the budget: when most of them give up, the scan serves the rest
MIN_ITEMS = 64_000  # a collection smaller than this is scanned: no probing pays there
_BYTE_COUNTS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def popcount(words: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 (numpy >= 2 counts them itself; older numpy by a byte table)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words)
    return _BYTE_COUNTS[words.view(np.uint8)].reshape(*words.shape, 8).sum(axis=-1)


def default_substrings(n_bits: int, n_items: int) -> int:
    """m ≈ b / log2 N (the paper's choice), with every substring at most MAX_WIDTH bits, none wider
    than its 64-bit word: where a word's share of that m leaves a substring wider (65 bits in 3: 64 bits in
    two), the next m that cuts every word finely enough."""
    width = min(MAX_WIDTH, max(4, round(math.log2(max(n_items, 2)))))
    m = max(-(-n_bits // width), -(-n_bits // 64))
    while m < n_bits and max(w for _, _, w in _layout(n_bits, m, check=False)) > MAX_WIDTH:
        m += 1
    return m


def _shares(n_bits: int, m: int) -> List[int]:
    """How many of the m substrings cut each 64-bit word of the codes: one each, then each next one to the word
    whose substrings are widest (of equals, the one cut in fewer, then the first), so that a last word of a few
    bits takes few. Words of 64 bits alike take m in turn, the first ones one more."""
    bits = [min(64, n_bits - 64 * w) for w in range(-(-n_bits // 64))]
    parts = [1] * len(bits)
    for _ in range(m - len(bits)):
        w = max(range(len(bits)), key=lambda w: (-(-bits[w] // parts[w]), -parts[w], -w))
        parts[w] += 1
    return parts


def check_substrings(n_bits: int, m: int) -> None:
    """Refuse ``m`` substrings that cannot cut ``n_bits``-bit codes (``ValueError`` saying why), before any table
    is built."""
    _layout(n_bits, m)


def _layout(n_bits: int, m: int, check: bool = True) -> List[Tuple[int, int, int]]:
    """(word, bit offset, width) of each of m substrings: the bits of every word cut into nearly equal
    parts, none crossing a word (the padding bits beyond n_bits are clear everywhere: harmless). ``check``:
    substrings wider than MAX_WIDTH are refused."""
    n_words = -(-n_bits // 64)
    if m > n_bits:
        raise ValueError(f"{m} substrings for {n_bits}-bit codes: at most {n_bits} (a bit each)")
    if m < n_words:
        raise ValueError(f"{m} substrings for {n_bits}-bit codes: need at least {n_words} (one per 64-bit word)")
    out = []
    for w, parts in enumerate(_shares(n_bits, m)):
        bits = min(64, n_bits - 64 * w)
        widths = [bits // parts + (i < bits % parts) for i in range(parts)]
        if check and max(widths) > MAX_WIDTH:
            raise ValueError(f"{m} substrings for {n_bits}-bit codes make {max(widths)}-bit substrings; at most "
                             f"{MAX_WIDTH} (use more substrings)")
        offset = 0
        for width in widths:
            out.append((w, offset, width))
            offset += width
    return out


def _masks(width: int, radius: int) -> np.ndarray:
    """Every width-bit value with exactly ``radius`` bits set. Shape: [C(width, radius)] uint64."""
    if radius == 0:
        return np.zeros(1, dtype=np.uint64)
    bits = np.uint64(1) << np.arange(width, dtype=np.uint64)
    combos = np.array(list(itertools.combinations(range(width), radius)), dtype=np.int64)
    return np.bitwise_or.reduce(bits[combos], axis=1)


class MultiIndex:
    """The substring tables of a set of codes (packed uint64 words [N, W], as :func:`ucmfh.bits.as_words`
    makes them). :meth:`search` returns what :func:`ucmfh.search.scan.hamming_search` does.

    Example:
        >>> mih = MultiIndex(words, 64)
        >>> distances, positions = mih.search(query_words, k=10)
    """

    def __init__(self, words: np.ndarray, n_bits: int, m: Optional[int] = None, build: bool = True) -> None:
        self.words = np.ascontiguousarray(words, dtype=np.uint64)
        self.n_bits = n_bits
        n = self.words.shape[0]
        if n >= 2**32:
            raise ValueError(f"{n} items: positions are kept as uint32, at most 2^32 - 1 items")
        self.m = default_substrings(n_bits, n) if m is None else m
        self.layout = _layout(n_bits, self.m)
        # substring j: item positions by substring value (stable), positions[j * N : (j + 1) * N], and where
        # each value's bucket starts, offsets[starts[j] : starts[j] + 2^width + 1]
        widths = [width for _, _, width in self.layout]
        self.starts = np.concatenate([[0], np.cumsum([(1 << w) + 1 for w in widths])]).astype(np.int64)
        if not build:
            return
        self.positions = np.empty(self.m * n, dtype=np.uint32)
        self.offsets = np.empty(int(self.starts[-1]), dtype=np.uint32)
        self.sketches = np.empty(self.m * n, dtype=np.uint16)
        for j, width in enumerate(widths):
            values = self._values(self.words, j)
            order = np.argsort(values, kind="stable")
            counts = np.bincount(values.astype(np.int64), minlength=1 << width)
            self.offsets[self.starts[j]] = 0
            np.cumsum(counts, out=self.offsets[self.starts[j] + 1 : self.starts[j + 1]])
            sketch = self._sketch(j)[order]
            self.sketches[j * n : (j + 1) * n] = sketch & 0xFFFF
            self.positions[j * n : (j + 1) * n] = order | ((sketch >> 16) << 24 if self.small else 0)

    @classmethod
    def from_tables(cls, words: np.ndarray, n_bits: int, m: int, positions: np.ndarray,
                    offsets: np.ndarray, sketches: np.ndarray) -> "MultiIndex":
        """Tables saved before (e.g. memory-mapped), checked against the codes' count and the layout."""
        tables = cls(words, n_bits, m, build=False)
        n = tables.words.shape[0]
        if positions.shape != (m * n,) or positions.dtype != np.uint32 or offsets.dtype != np.uint32 \
                or offsets.shape != (int(tables.starts[-1]),) or offsets[tables.starts[1:] - 1].tolist() != [n] * m \
                or sketches.shape != (m * n,) or sketches.dtype != np.uint16:
            raise ValueError(f"multi-index tables for {m} substrings of {n} items do not fit these codes")
        tables.positions, tables.offsets, tables.sketches = positions, offsets, sketches
        return tables

    def _values(self, words: np.ndarray, j: int) -> np.ndarray:
        w, offset, width = self.layout[j]
        return (words[:, w] >> np.uint64(offset)) & np.uint64((1 << width) - 1)

    @property
    def small(self) -> bool:
        """Whether positions take 24 bits, their top byte holding 8 more sketch bits (up to ``SMALL`` items)."""
        return self.words.shape[0] <= SMALL

    def _sketch(self, j: int) -> np.ndarray:
        """Substring j's sketch of each item: the low bits of substring (j + 1) mod m, at most 24 where
        :attr:`small` and 16 above; none where m is 1 (the kernel's ``sk_width``). Shape: [N] uint32."""
        if self.m == 1:
            return np.zeros(self.words.shape[0], dtype=np.uint32)
        w, offset, width = self.layout[(j + 1) % self.m]
        bits = min(width, 24 if self.small else 16)
        return ((self.words[:, w] >> np.uint64(offset)) & np.uint64((1 << bits) - 1)).astype(np.uint32)

    @property
    def nbytes(self) -> int:
        """Bytes of the tables (not counting the codes)."""
        return self.positions.nbytes + self.offsets.nbytes + self.sketches.nbytes

    def _bucket(self, j: int, buckets: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        offsets = self.offsets[self.starts[j] : self.starts[j + 1]]
        return offsets[buckets].astype(np.int64), offsets[buckets + 1].astype(np.int64)

    def _distances(self, q: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return popcount(self.words[positions] ^ q).sum(axis=1, dtype=np.int64)

    def search_one(self, q: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray, int]:
        """The top k of one query word row [W] by (distance, position), and the items whose distance
        was computed. Shape: -> (distances, positions) [min(k, N)] int64, candidates."""
        n = self.words.shape[0]
        k = min(k, n)
        if k == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0
        seen = np.zeros(0, dtype=np.int64)
        found_d = np.zeros(0, dtype=np.int64)
        values = [int(self._values(q[None, :], j)[0]) for j in range(self.m)]
        widest = max(width for _, _, width in self.layout)
        for radius in range(widest + 1):
            for j, (_, _, width) in enumerate(self.layout):
                if radius <= width:
                    buckets = (np.uint64(values[j]) ^ _masks(width, radius)).astype(np.int64)
                    starts, stops = self._bucket(j, buckets)
                    sizes = stops - starts
                    if sizes.sum():
                        take = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum()) + j * n
                        found = self.positions[take].astype(np.int64)
                        if self.small:  # the top byte is sketch
                            found &= POSITION_BITS
                        new = np.setdiff1d(found, seen, assume_unique=False)
                        if new.size:
                            seen = np.concatenate([seen, new])
                            found_d = np.concatenate([found_d, self._distances(q, new)])
                # every item not found yet is at this distance or more
                bound = self.m * radius + j + 1
                if found_d.size >= k and np.partition(found_d, k - 1)[k - 1] < bound:
                    return (*self._top(found_d, seen, k), seen.size)
                if seen.size == n:
                    return (*self._top(found_d, seen, k), seen.size)
        return (*self._top(found_d, seen, k), seen.size)

    @staticmethod
    def _top(d: np.ndarray, p: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        order = np.lexsort((p, d))[:k]
        return d[order], p[order]

    def search(self, queries: np.ndarray, k: int, threads: Optional[int] = None, compiled: bool = True,
               scan: Optional[Callable[[np.ndarray, int], Tuple[np.ndarray, np.ndarray]]] = None,
               stats: Optional[Dict[str, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Exact top k of each query by (distance, position). Shape: words [Q, W] -> (distances, positions)
        [Q, min(k, N)] int64. ``compiled=False``: the numpy reference, one query at a time.

        With ``scan`` (the linear scan: words, k -> distances, positions) the planner runs: the first
        ``PILOT`` queries are probed within a budget of ``BUDGET_PER_WORD`` code reads per word of the items, those
        that reach it are scanned, and when most of them do the scan serves every other query too; the
        rest are probed within four times the budget (outliers are scanned). ``stats`` gets ``mih`` and
        ``scan``, how many queries each served, and ``scanned``, which (indices, int64)."""
        queries = np.ascontiguousarray(queries, dtype=np.uint64)
        n, nq = self.words.shape[0], queries.shape[0]
        k = min(k, n)
        dist = np.empty((nq, k), dtype=np.int64)
        pos = np.empty((nq, k), dtype=np.int64)
        if k == 0 or nq == 0:
            return dist, pos
        stats = {} if stats is None else stats
        stats.update(mih=nq, scan=0, scanned=np.zeros(0, dtype=np.int64))
        kernels = kernels_module() if compiled else None
        if kernels is None or not hasattr(kernels, "mih_search"):
            for i, q in enumerate(queries):
                dist[i], pos[i], _ = self.search_one(q, k)
            return dist, pos
        layout = np.array([[w, offset, width, start] for (w, offset, width), start in zip(self.layout, self.starts)],
                          dtype=np.int32)
        budget = int(n * self.words.shape[1] * BUDGET_PER_WORD) if scan is not None else 2**60
        if scan is not None and n < MIN_ITEMS:  # a small collection: the scan is faster than any probing
            dist[:], pos[:] = scan(queries, k)
            stats.update(mih=0, scan=nq, scanned=np.arange(nq))
            return dist, pos

        def work(a: int, b: int, most: int) -> None:
            kernels.mih_search(queries[a:b], b - a, self.words, n, self.words.shape[1], self.n_bits, k, layout,
                               self.m, self.positions, self.offsets, self.offsets.size, self.sketches,
                               self.small, most, dist[a:b], pos[a:b])

        pilot = min(PILOT, nq) if scan is not None else 0
        over_query_ranges(pilot, threads, lambda a, b: work(a, b, budget))
        if pilot and (pos[:pilot, 0] < 0).sum() * 2 > pilot:  # probing costs more than the scan here
            pos[pilot:] = -1
        else:
            over_query_ranges(nq - pilot, threads, lambda a, b: work(pilot + a, pilot + b, 4 * budget))
        left = np.flatnonzero(pos[:, 0] < 0)
        stats.update(mih=nq - int(left.size), scan=int(left.size), scanned=left)
        if left.size:
            dist[left], pos[left] = scan(queries[left], k)
        return dist, pos


def compiled() -> bool:
    """Whether the compiled probe (``mih_search``, ucmfh's C kernels) is built here: without it the numpy probe, a
    reference one query at a time, is slower than the scan at any size."""
    kernels = kernels_module()
    return kernels is not None and hasattr(kernels, "mih_search")


CACHE = "mih"  # the cache folder inside an index folder


# the tables' format: 24-bit sketches up to SMALL items (positions' top byte), 16 above; 'w': a last word of few
# bits takes few substrings (_shares; its tables before were cut otherwise, and are built again)
FORMAT = "s24w"


def cache_name(modality: str, m: int, count: int) -> str:
    """The file names' stem of one modality's tables: the substrings, the items they were built for and
    the format (tables of another are built again, not misread)."""
    return f"{modality}.m{m}.n{count}.{FORMAT}"


def multi_index(index: Any, modality: str, substrings: Optional[int] = None) -> Tuple["MultiIndex", str]:
    """The multi-index tables of one modality of ``index`` (an :class:`~ucmfh.search.index.Index`): read
    (memory-mapped) from the index folder's cache, else built and cached (:meth:`Index.derived`); tables
    for another number of items (the index grew) or substrings are replaced. Returns them and how they
    were got: ``in memory``, ``cached`` or ``built``."""
    words = index.codes(modality)
    m = default_substrings(index.n_bits, words.shape[0]) if substrings is None else substrings
    parts = ("positions", "offsets", "sketches")

    def read(stem: str) -> Optional[MultiIndex]:
        if not all(os.path.exists(f"{stem}.{part}.npy") for part in parts):
            return None
        try:
            return MultiIndex.from_tables(words, index.n_bits, m, *(np.load(f"{stem}.{part}.npy", mmap_mode="r")
                                                                    for part in parts))
        except ValueError:  # tables of another format or a damaged file: built again
            return None

    def write(tables: MultiIndex, stem: str) -> None:
        for part in parts:
            tmp = atomic_path(f"{stem}.{part}.npy")
            with open(tmp, "wb") as f:
                np.save(f, getattr(tables, part))
            os.replace(tmp, f"{stem}.{part}.npy")

    return index.derived(CACHE, cache_name(modality, m, words.shape[0]), lambda: MultiIndex(words, index.n_bits, m),
                         read, write, f"{modality}.m*.n*.*")
