"""Exact, chunked top-K ranking: the first K retrieval items of every query.

Ranking (docs/reference.md §6): Hamming distance ascending, or cosine similarity
descending, ties by retrieval index ascending. Hamming results are exact and the
same for every chunk size, device and backend, and so are cosine results: the
similarities are computed from rows rounded to integers, whose dot products are
exact in any summation order (:func:`ucmfh.similarity.cosine_similarity_float64`; the
retrieval items' rounded rows are made once a ranking, :class:`ExactBlocks`):

* On the CPU, Hamming top-K runs in the compiled kernels when they serve the
  CPU (:mod:`ucmfh.metrics.native`).
* Elsewhere (GPU, or the torch backend) Hamming distances come from a ±1
  matmul: integers, exact in float16/bfloat16/float32. Top-K selects on the
  unique integer key ``dist * N + index``, after an exact pre-selection by
  group maxima (see :func:`hamming_top_k_torch`), without sorting the
  retrieval set.
* Cosine: float64 similarities, the same on every device, stable sorts per block,
  stable merges.

Memory is bounded by ``chunk_size * retrieval_chunk_size`` whatever the set
sizes; a query chunk's top-K lists add ``chunk_size * K``.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ArrayLike,
    Ranking,
    as_pm1,
    as_tensors,
    check_chunks,
    check_count,
    check_pair,
    n_bits_of,
)
from ucmfh.metrics.native import code_words, native_top_k, use_native
from ucmfh.similarity import exact_cosine, exact_rows

_GROUP = 32  # items per group in the top-K pre-selection
# queries whose Hamming top-K one call finds on a GPU (iter_top_k), where a call of a chunk's few hundred is
# bound by its kernel launches (the H200's validation of Flickr8k: 4.7 s in 4,216 calls); its scores of a block
# of retrieval items take 2 bytes each: 268 MB at 2,048 × 65,536
GPU_QUERIES = 2048
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@functools.lru_cache(maxsize=1)
def _cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slow."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def score_dtype(device: torch.device, n_bits: int) -> torch.dtype:
    """The fastest matmul dtype on ``device`` in which every score (dot product + n_bits, an integer
    in [0, 2 n_bits]) and every partial sum is exact: float16 holds integers to 2048, bfloat16 to
    256, float32 to 2**24."""
    if device.type == "cuda" and n_bits <= 1024:
        return torch.float16
    if device.type == "cpu" and n_bits <= 128 and _cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def hamming_top_k_torch(
    q: torch.Tensor, retrieval: torch.Tensor, k: int, block: int, dtype: Optional[torch.dtype] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of one query chunk on the torch path: (distances, indices) [q, k] int64, ordered by
    (distance, index).

    Shape: q [q, n_bits] ±1 float on the computing device; retrieval [N, ·] ±1 or packed,
    read in blocks of ``block`` items. ``dtype``: the matmul dtype, one of float16, bfloat16,
    float32, exact only for n_bits up to 1024, 128, any (see :func:`score_dtype`, the default).

    Scores are ``dots + n_bits`` (>= 0, so their bit patterns order like
    integers), from one matmul with an extra column. Per block of retrieval
    items they are reduced to maxima over groups of ``_GROUP`` consecutive
    items; the k best groups, ranked by (maximum desc, group index asc), hold
    the block's exact top-k even with ties: a group ranked before the group of
    a selected item holds a better item, or an equal one with a smaller index,
    which is selected too. Only those k * _GROUP candidates get exact integer
    keys ``distance * N + index``. The block's rows are permuted so that a
    group lies along a middle axis, where the max reduction is vectorised.
    """
    device = q.device
    n = retrieval.shape[0]
    n_bits = n_bits_of(retrieval)
    rows = q.shape[0]
    dtype = score_dtype(device, n_bits) if dtype is None else dtype
    ints = _INT_VIEW[dtype]
    block = max(_GROUP, block // _GROUP * _GROUP)
    offsets = torch.arange(_GROUP, device=device)
    qa = torch.cat([q, q.new_full((rows, 1), float(n_bits))], dim=1).to(dtype)
    found = []  # per block: [q, <=k * _GROUP] int64 keys dist * n + index
    for start in range(0, n, block):
        r = as_pm1(retrieval[start : start + block], device)
        m = r.shape[0]
        ra = torch.cat([r, r.new_ones(m, 1)], dim=1)
        n_groups = -(-m // _GROUP)
        if n_groups > k:
            pad = n_groups * _GROUP - m
            if pad:  # padding items score -n_bits, below every real item
                filler = torch.cat([r.new_zeros(pad, n_bits), r.new_full((pad, 1), -1.0)], dim=1)
                ra = torch.cat([ra, filler])
            # column s * n_groups + t holds item t * _GROUP + s
            ra = ra.view(n_groups, _GROUP, n_bits + 1).transpose(0, 1).reshape(n_groups * _GROUP, n_bits + 1)
            scores = (qa @ ra.to(dtype).T).view(ints)  # [q, _GROUP * n_groups]
            group_max = scores.view(rows, _GROUP, n_groups).amax(dim=1).view(dtype).long()
            group_key = group_max * n_groups - torch.arange(n_groups, device=device)
            groups = group_key.topk(k, dim=1).indices  # [q, k]
            columns = (offsets[None, :, None] * n_groups + groups[:, None, :]).flatten(1)
            candidates = scores.gather(1, columns).view(dtype).float()
            local = (groups[:, None, :] * _GROUP + offsets[None, :, None]).flatten(1)
        else:
            candidates = (qa @ ra.to(dtype).T).float()
            local = torch.arange(m, device=device).expand(rows, m)
        dist = ((2 * n_bits - candidates) * 0.5).long()  # candidates = dots + n_bits
        keys = dist * n + (start + local)
        found.append(keys)
        if sum(f.shape[1] for f in found) > 8 * k * _GROUP:  # bound memory when blocks are many
            merged = torch.cat(found, dim=1)
            found = [merged.topk(k, dim=1, largest=False).values]
    # one selection over the blocks' candidates: a top-K call costs a lot per row
    best = torch.cat(found, dim=1)
    best = best.topk(min(k, best.shape[1]), dim=1, largest=False).values
    best = best.sort(dim=1).values
    return best // n, best % n


def first_k(scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` columns of each row by score, descending, ties by column: a stable descending sort's first
    ``k``, without sorting the row. ``topk`` finds the ``k``-th score and every column above it; the places left
    go to the columns tied at it, leftmost first (a second ``topk``, of ``m - column`` where tied); the ``2k``
    candidates, those not taken scored -inf, are ordered by score, then column.
    Shape: [q, m] -> (scores, columns) [q, min(k, m)]."""
    rows, m = scores.shape
    k = min(k, m)
    values, columns = scores.topk(k, dim=1)
    kth = values[:, -1:]
    above = values > kth  # every column of the row above the k-th score is among the k
    left = k - above.sum(dim=1, keepdim=True)  # places for the tied columns: at most as many as are tied
    width = torch.arange(m, 0, -1, device=scores.device)  # m - column
    tied = m - torch.where(scores == kth, width, 0).topk(k, dim=1).values  # tied columns, leftmost first
    taken = torch.arange(k, device=scores.device) < left
    none = torch.tensor(-math.inf, dtype=scores.dtype, device=scores.device)
    candidates = torch.cat([columns, tied.clamp(max=m - 1)], dim=1)
    scored = torch.cat([torch.where(above, values, none), torch.where(taken, kth, none)], dim=1)
    candidates, by_column = candidates.sort(dim=1)
    picked, order = scored.gather(1, by_column).sort(dim=1, descending=True, stable=True)
    return picked[:, :k], candidates.gather(1, order[:, :k])


# bytes of float64 rows that ExactBlocks keeps between query chunks (a ranking of 40,000 items of 512 dims: 164 MB)
KEEP_BYTES = 512 * 2**20


# retrieval items a query chunk is ranked by cosine against at a time on the CPU, at most: a chunk's [q, block]
# similarities then stay in its caches (5,000 queries × 100,000 items, both directions, 2 cores: 21.1 s in blocks
# of 65,536, 13.6 s in blocks of 8,192 at 64 dims; 36.8 and 29.8 s at 512 dims; the same figures)
CPU_COSINE_BLOCK = 8192


class ExactBlocks:
    """The retrieval items' :func:`~ucmfh.similarity.exact_rows`, ``block`` items at a time (on the CPU at most
    :data:`CPU_COSINE_BLOCK`), on ``device``: made at the first query chunk and kept for the others where they fit
    :data:`KEEP_BYTES`, else made again for each (every query chunk reads them all; making them took a quarter of
    a caption set's cosine scoring)."""

    def __init__(self, retrieval: torch.Tensor, block: int, device: torch.device) -> None:
        block = min(block, CPU_COSINE_BLOCK) if torch.device(device).type == "cpu" else block
        self.retrieval, self.block, self.device = retrieval, block, device
        n, d = retrieval.shape
        self._kept: Optional[Dict[int, Tuple[torch.Tensor, torch.Tensor]]] = {} if n * d * 8 <= KEEP_BYTES else None

    def __iter__(self) -> Iterator[Tuple[int, Tuple[torch.Tensor, torch.Tensor]]]:
        for start in range(0, self.retrieval.shape[0], self.block):
            parts = None if self._kept is None else self._kept.get(start)
            if parts is None:
                parts = exact_rows(self.retrieval[start : start + self.block].to(self.device))
                if self._kept is not None:
                    self._kept[start] = parts
            yield start, parts


def cosine_top_k_chunk(
    q: torch.Tensor, blocks: ExactBlocks, k: int,
    on_block: Optional[Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of one query chunk against the retrieval items of ``blocks``: (similarities float64, indices int64)
    [q, k], (similarity desc, index asc).

    ``on_block(first, sim, block_sim, block_idx)`` sees each block of retrieval items as it is ranked: its
    first item's index, the chunk's similarities to it [q, m] and the block's own first ``min(k, m)``
    (similarities, indices within the block), so that a caller can count what the merged lists leave out
    without computing the similarities again."""
    q_parts = exact_rows(q)
    best_s: Optional[torch.Tensor] = None
    best_i: Optional[torch.Tensor] = None
    for start, parts in blocks:
        scores = exact_cosine(q_parts, parts)
        sim, order = first_k(scores, k)
        if on_block is not None:
            on_block(start, scores, sim, order)
        order = order + start
        if best_s is None:
            best_s, best_i = sim, order
            continue
        # earlier blocks first: a stable sort keeps ties in index order
        cat_s = torch.cat([best_s, sim], dim=1)
        cat_i = torch.cat([best_i, order], dim=1)
        cat_s, pick = cat_s.sort(dim=1, descending=True, stable=True)
        best_s, best_i = cat_s[:, :k], cat_i.gather(1, pick[:, :k])
    return best_s, best_i


def iter_top_k(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    k: int,
    ranking: Ranking = "hamming",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Iterator[Tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query index, scores, indices)`` per chunk of queries (tensors only).

    scores are Hamming distances (int64) or cosine similarities (float64);
    both [q, min(k, N)], in ranking order, on the device of ``query``. On a GPU the Hamming lists of
    :data:`GPU_QUERIES` queries are found in one call and yielded a chunk at a time (the same lists: each
    query's is its own).
    """
    check_pair(query, retrieval, ranking)
    check_chunks(chunk_size, retrieval_chunk_size)
    check_count("k", k)
    k = min(k, retrieval.shape[0])
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    device = query.device
    native = ranking == "hamming" and use_native(device)
    if native:
        rw, n_bits = code_words(retrieval), n_bits_of(retrieval)
    if ranking == "hamming" and not native and device.type == "cuda":
        step = max(chunk_size, GPU_QUERIES // chunk_size * chunk_size)  # whole chunks
        for first in range(0, query.shape[0], step):
            q = query[first : first + step]
            distances, indices = hamming_top_k_torch(as_pm1(q, device), retrieval, k, retrieval_chunk_size)
            for start in range(0, q.shape[0], chunk_size):
                yield first + start, distances[start : start + chunk_size], indices[start : start + chunk_size]
        return
    blocks = ExactBlocks(retrieval, retrieval_chunk_size, device) if ranking == "cosine" else None
    for start in range(0, query.shape[0], chunk_size):
        q = query[start : start + chunk_size]
        if native:
            yield (start, *native_top_k(code_words(q), rw, n_bits, k))
        elif ranking == "hamming":
            yield (start, *hamming_top_k_torch(as_pm1(q, device), retrieval, k, retrieval_chunk_size))
        else:
            yield (start, *cosine_top_k_chunk(q, blocks, k))


def top_k(
    query: ArrayLike,
    retrieval: ArrayLike,
    k: int,
    ranking: Ranking = "hamming",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` retrieval items of every query, in ranking order.

    Shape: query [Q, d], retrieval [N, d] (tensors or numpy arrays) -> (scores, indices)
    [Q, min(k, N)], always tensors, on the device of ``query`` (the CPU for numpy input);
    scores are Hamming distances (int64) or cosine similarities (float64).
    """
    query, retrieval = as_tensors(query, retrieval)
    parts = list(iter_top_k(query, retrieval, k, ranking, chunk_size, retrieval_chunk_size))
    return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
