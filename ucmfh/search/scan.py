"""Exact Hamming top-k of packed codes by a linear scan: the compiled kernels on the CPU, torch on a GPU,
and the merge of per-part lists (shards, blocks) by (distance, position)."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ucmfh.bits import packed_bytes
from ucmfh.search.kernels import cpu_kernels, over_query_ranges


# The torch path's memory: its top-k holds about 8 candidates of 32 bytes per query and result
# (depth 10,000 × 2,100 queries at once would reach ~43 GB); queries are searched in
# chunks of at most QUERY_CHUNK_BYTES of such candidates.
CANDIDATE_BYTES = 8 * 32
QUERY_CHUNK_BYTES = 1 << 30


def check_k(k: Any) -> int:
    """``k``, the hits a query asks for: a whole number >= 1 (``TypeError`` for another type: 2.5 ran as 2;
    ``ValueError`` below 1: -1 was numpy's 'negative dimensions', 0 lists of nothing)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be a whole number, got {type(k).__name__} {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return int(k)


def hamming_search(
    qw: np.ndarray, rw: np.ndarray, n_bits: int, k: int, device: Any = "cpu", threads: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact top-k of query words [Q, W] among item words [N, W] by (distance, position).

    Shape: -> (distances, positions) [Q, min(k, N)] int64. CPU: the compiled kernels
    (those of :func:`ucmfh.metrics.native.native_top_k`) on ``threads`` threads over
    queries, else the torch path; a GPU device: the torch path, reading the items in blocks. Words are
    :func:`ucmfh.search.as_words`'s (uint64; ±1 codes or bytes are refused).
    """
    k = check_k(k)
    for words, what in ((qw, "query"), (rw, "item")):
        if not isinstance(words, np.ndarray) or words.dtype != np.uint64 or words.ndim != 2:
            raise ValueError(f"{what} words: expected uint64 [N, W] (ucmfh.search.as_words(codes, n_bits)), got "
                             f"{getattr(words, 'dtype', type(words).__name__)} {tuple(getattr(words, 'shape', ()))}")
    n = rw.shape[0]
    k = min(k, n)
    nq = qw.shape[0]
    if k == 0 or nq == 0:
        return np.zeros((nq, k), dtype=np.int64), np.zeros((nq, k), dtype=np.int64)
    kernels = cpu_kernels(device)
    if kernels is not None:
        qw = np.ascontiguousarray(qw)
        dist = np.empty((nq, k), dtype=np.int64)
        pos = np.empty((nq, k), dtype=np.int64)

        def work(a: int, b: int) -> None:
            kernels.top_k(qw[a:b], rw, b - a, n, qw.shape[1], n_bits, k, pos[a:b], dist[a:b])

        over_query_ranges(nq, threads, work)
        return dist, pos
    import torch

    from ucmfh.codes import unpack_codes
    from ucmfh.metrics.topk import hamming_top_k_torch
    from ucmfh.utils import resolve_device

    device = resolve_device(device) if isinstance(device, str) else device
    # packed items count their padding bits, which are clear in both sets and add no distance
    n_bytes = -(-n_bits // 8)
    block = 1 << 22
    # the top-k's candidate keys take about CANDIDATE_BYTES per query and k: queries go in chunks
    chunk = max(1, QUERY_CHUNK_BYTES // (CANDIDATE_BYTES * k))
    out_d, out_p = np.empty((nq, k), dtype=np.int64), np.empty((nq, k), dtype=np.int64)
    for a in range(0, nq, chunk):
        q = unpack_codes(torch.from_numpy(packed_bytes(qw[a : a + chunk], n_bits).copy()), 8 * n_bytes).to(device)
        dists, positions = [], []
        for start in range(0, n, block):
            # packed bytes of one block of items (a copy: a mapped file is read-only); unpacked on the device
            r = torch.from_numpy(np.array(packed_bytes(rw[start : start + block], n_bits)))
            d, p = hamming_top_k_torch(q, r, min(k, r.shape[0]), 65536)
            dists.append(d.cpu())
            positions.append(p.cpu() + start)
        out_d[a : a + chunk], out_p[a : a + chunk] = merge_top_k([x.numpy() for x in dists],
                                                                 [x.numpy() for x in positions], k)
    return out_d, out_p


def merge_top_k(dists: List[np.ndarray], positions: List[np.ndarray], k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Merge per-part top-k lists (global positions) into one, by (distance, position).

    Shape: lists of [Q, k_i] -> [Q, min(k, sum k_i)] int64.
    """
    if len(dists) == 1:
        return dists[0][:, :k], positions[0][:, :k]
    d = np.concatenate(dists, axis=1)
    p = np.concatenate(positions, axis=1)
    span = int(p.max()) + 1 if p.size else 1
    key = d * span + p  # unique: distances <= 65535, positions < 2**40
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(p, order, axis=1)
