"""Exact, chunked ranking: the building blocks every retrieval metric uses.

Ranking (REFERENCE §6): Hamming distance ascending, or cosine similarity
descending, ties by retrieval index ascending. Results are exact and the same
for every chunk size and device:

* On the CPU, Hamming ranking runs in the C kernels of ``_hamming.c`` (built
  at install; see :func:`native_kernels`): popcount distances, a top-K that
  keeps per distance the first K items met in index order, and counting
  sorts; the query chunks are spread over ``torch.get_num_threads()`` threads.
* Elsewhere (GPU, or no compiled kernels) Hamming distances come from a ±1
  matmul: integers, exact in float16/bfloat16/float32. Top-K selects on the
  unique integer key ``dist * N + index``, after an exact pre-selection by
  group maxima (see :func:`_hamming_top_k_chunk`), without sorting the
  retrieval set. Both paths give identical results.
* AP terms are summed in fixed point (int64, 2**-52 to 2**-40 resolution by list length): integer sums
  do not depend on summation order, so chunking, SIMD width and GPU reductions
  cannot change a result. Means over queries use ``math.fsum``.

Memory is bounded by ``chunk_size * retrieval_chunk_size`` whatever the set
sizes; a query chunk's top-K lists add ``chunk_size * K``.

Codes are ±1 tensors [N, n_bits], or packed bits [N, n_bytes] uint8 (see
:mod:`ucmfh.codes`); all computation happens on the device of the query tensor.
"""
from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Literal, Optional, Tuple

import numpy as np
import torch

from ucmfh.codes import unpack_codes
from ucmfh.similarity import cosine_similarity_float64

try:  # the compiled CPU kernels; optional at install (setup.py)
    from ucmfh.metrics import _hamming
except ImportError:  # pragma: no cover - exercised only where the build failed
    _hamming = None

Ranking = Literal["hamming", "cosine"]
Empty = Literal["zero", "skip"]

DEFAULT_CHUNK_SIZE = 256
DEFAULT_RETRIEVAL_CHUNK_SIZE = 65536
_GROUP = 32  # items per group in the top-K pre-selection


def _check_choice(name: str, value: str, choices: Tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_chunks(chunk_size: int, retrieval_chunk_size: int) -> None:
    if chunk_size < 1 or retrieval_chunk_size < 1:
        raise ValueError(f"chunk sizes must be >= 1, got {chunk_size} and {retrieval_chunk_size}")


def check_pair(query: torch.Tensor, retrieval: torch.Tensor, ranking: str) -> None:
    """Validate a query/retrieval pair of codes or embeddings."""
    _check_choice("ranking", ranking, ("hamming", "cosine"))
    if query.ndim != 2 or retrieval.ndim != 2:
        raise ValueError(f"query and retrieval must be 2-D, got {tuple(query.shape)} and {tuple(retrieval.shape)}")
    if query.shape[1] != retrieval.shape[1]:
        raise ValueError(f"query and retrieval differ in width: {query.shape[1]} and {retrieval.shape[1]}")
    if (query.dtype == torch.uint8) != (retrieval.dtype == torch.uint8):
        raise ValueError("query and retrieval must both be packed (uint8) or both ±1 codes")
    if ranking == "cosine" and query.dtype == torch.uint8:
        raise ValueError("cosine ranking needs real-valued embeddings, got packed codes")
    if retrieval.shape[0] == 0:
        raise ValueError("the retrieval set is empty")


def n_bits_of(codes: torch.Tensor) -> int:
    """Code length as ranked: packed codes count their padding bits, which add no distance."""
    return 8 * codes.shape[1] if codes.dtype == torch.uint8 else codes.shape[1]


def as_pm1(codes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """±1 float32 codes on ``device`` from ±1 or packed codes."""
    codes = codes.to(device)
    if codes.dtype == torch.uint8:
        return unpack_codes(codes, 8 * codes.shape[1])
    return codes.float()


def _labels_f(labels: torch.Tensor, device: torch.device) -> torch.Tensor:
    return labels.to(device).float()


# ------------------------------------------------------------ native CPU kernels

# None: use the compiled kernels for CPU tensors when they are built, unless the
# environment sets UCMFH_NATIVE=0; tests set True/False to exercise both paths.
FORCE_NATIVE: Optional[bool] = None
_MIN_QUERIES_PER_THREAD = 16


def native_kernels() -> Optional[str]:
    """The build of the compiled Hamming kernels chosen for this CPU (e.g. ``"avx512vpopcntdq"``),
    or None when they are not built (then the torch path serves the CPU too)."""
    return None if _hamming is None else _hamming.kernel_name()


def _use_native(device: torch.device) -> bool:
    if FORCE_NATIVE is not None:
        if FORCE_NATIVE and _hamming is None:
            raise RuntimeError("the compiled Hamming kernels (ucmfh.metrics._hamming) are not built")
        return FORCE_NATIVE and device.type == "cpu"
    return _hamming is not None and device.type == "cpu" and os.environ.get("UCMFH_NATIVE", "1") != "0"


def _words(bits: np.ndarray) -> np.ndarray:
    """Packed bits [N, bytes] uint8 -> [N, ceil(bytes / 8)] uint64, zero-padded."""
    n, n_bytes = bits.shape
    out = np.zeros((n, -(-n_bytes // 8) * 8), dtype=np.uint8)
    out[:, :n_bytes] = bits
    return out.view(np.uint64)


def _code_words(codes: torch.Tensor) -> np.ndarray:
    """±1 (sign >= 0 is a set bit, as in ucmfh.codes) or packed codes -> uint64 words [N, W]."""
    codes = codes.detach().cpu()
    if codes.dtype == torch.uint8:
        return _words(codes.numpy())
    return _words(np.packbits(codes.numpy() >= 0, axis=1))


def _label_words(labels: torch.Tensor) -> np.ndarray:
    """Multi-hot labels [N, C] -> uint64 words [N, ceil(C / 64)], a set bit per label."""
    return _words(np.packbits(labels.detach().cpu().numpy() != 0, axis=1))


def _split_queries(n: int, work: Callable[[int, int], None]) -> None:
    """Run ``work(start, stop)`` over query ranges on ``torch.get_num_threads()`` threads
    (the kernels release the GIL); each range is written to its own rows."""
    parts = max(1, min(torch.get_num_threads(), n // _MIN_QUERIES_PER_THREAD))
    bounds = [n * i // parts for i in range(parts + 1)]
    if parts == 1:
        work(0, n)
        return
    with ThreadPoolExecutor(parts) as pool:
        for f in [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:])]:
            f.result()


def _native_top_k(qw: np.ndarray, rw: np.ndarray, n_bits: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by (distance, index) of packed query rows. Shape: -> (distances, indices) [q, k] int64."""
    nq, words = qw.shape
    idx = np.empty((nq, k), dtype=np.int64)
    dist = np.empty((nq, k), dtype=np.int64)

    def work(a: int, b: int) -> None:
        _hamming.top_k(qw[a:b], rw, b - a, rw.shape[0], words, n_bits, k, idx[a:b], dist[a:b])

    _split_queries(nq, work)
    return torch.from_numpy(dist), torch.from_numpy(idx)


def _native_histograms(qw, rw, qlw, rlw, n_bits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    nq = qw.shape[0]
    h_all = np.empty((nq, n_bits + 1), dtype=np.int64)
    h_rel = np.empty_like(h_all)

    def work(a: int, b: int) -> None:
        _hamming.histograms(qw[a:b], rw, b - a, rw.shape[0], qw.shape[1], n_bits,
                            qlw[a:b], rlw, qlw.shape[1], h_all[a:b], h_rel[a:b])

    _split_queries(nq, work)
    return torch.from_numpy(h_all), torch.from_numpy(h_rel)


def native_average_precision(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: Optional[int],
) -> torch.Tensor:
    """AP@K (``k=None``: over the whole ranking) of every query by the compiled kernels, in one
    threaded pass with no torch work between kernel calls. Shape: -> [Q] float64 (CPU).

    The AP terms are the fixed-point terms of :func:`average_precision_ranked` and
    :func:`average_precision_all_hamming`, so the results are bit-identical to theirs.
    """
    check_pair(query, retrieval, "hamming")
    n = retrieval.shape[0]
    k = n if k is None else min(k, n)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n_bits = n_bits_of(retrieval)
    qw, rw = _code_words(query), _code_words(retrieval)
    qlw, rlw = _label_words(query_labels), _label_words(retrieval_labels)
    scale = _fixed_scale(k)
    total = np.empty(qw.shape[0], dtype=np.int64)
    found = np.empty(qw.shape[0], dtype=np.int64)

    def work(a: int, b: int) -> None:
        _hamming.average_precision(qw[a:b], rw, b - a, n, qw.shape[1], n_bits, k, qlw[a:b], rlw, qlw.shape[1],
                                   scale, total[a:b], found[a:b])

    _split_queries(qw.shape[0], work)
    return (torch.from_numpy(total).double() / scale) / torch.from_numpy(found).clamp(min=1).double()


# ---------------------------------------------------------------------------- top-K


_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
# None: choose per device (see _score_dtype); tests set a dtype to exercise every path
FORCE_SCORE_DTYPE: Optional[torch.dtype] = None


@functools.lru_cache(maxsize=1)
def _cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated and slow."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def _score_dtype(device: torch.device, n_bits: int) -> torch.dtype:
    """Matmul dtype in which every score (dot product + n_bits, an integer in [0, 2 n_bits]) and
    every partial sum is exact: float16 holds integers to 2048, bfloat16 to 256, float32 to 2**24."""
    if FORCE_SCORE_DTYPE is not None:
        return FORCE_SCORE_DTYPE
    if device.type == "cuda" and n_bits <= 1024:
        return torch.float16
    if device.type == "cpu" and n_bits <= 128 and _cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32


def _hamming_top_k_chunk(
    q: torch.Tensor, retrieval: torch.Tensor, k: int, block: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of one query chunk: (distances, indices) [q, k] int64, ordered by (distance, index).

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
    dtype = _score_dtype(device, n_bits)
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


def _cosine_top_k_chunk(
    q: torch.Tensor, retrieval: torch.Tensor, k: int, block: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k of one query chunk: (similarities float64, indices int64) [q, k], (similarity desc, index asc)."""
    device = q.device
    best_s: Optional[torch.Tensor] = None
    best_i: Optional[torch.Tensor] = None
    for start in range(0, retrieval.shape[0], block):
        sim = cosine_similarity_float64(q, retrieval[start : start + block].to(device))
        sim, order = sim.sort(dim=1, descending=True, stable=True)
        sim, order = sim[:, :k], order[:, :k] + start
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
    """Yield ``(first query index, scores, indices)`` per chunk of queries.

    scores are Hamming distances (int64) or cosine similarities (float64);
    both [q, min(k, N)], in ranking order.
    """
    check_pair(query, retrieval, ranking)
    _check_chunks(chunk_size, retrieval_chunk_size)
    k = min(k, retrieval.shape[0])
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    device = query.device
    native = ranking == "hamming" and _use_native(device)
    if native:
        rw, n_bits = _code_words(retrieval), n_bits_of(retrieval)
    for start in range(0, query.shape[0], chunk_size):
        q = query[start : start + chunk_size]
        if native:
            yield (start, *_native_top_k(_code_words(q), rw, n_bits, k))
        elif ranking == "hamming":
            yield (start, *_hamming_top_k_chunk(as_pm1(q, device), retrieval, k, retrieval_chunk_size))
        else:
            yield (start, *_cosine_top_k_chunk(q, retrieval, k, retrieval_chunk_size))


def top_k(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    k: int,
    ranking: Ranking = "hamming",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first ``k`` retrieval items of every query, in ranking order.

    Shape: query [Q, d], retrieval [N, d] -> (scores, indices) [Q, min(k, N)];
    scores are Hamming distances (int64) or cosine similarities (float64).
    """
    parts = list(iter_top_k(query, retrieval, k, ranking, chunk_size, retrieval_chunk_size))
    return torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])


# ---------------------------------------------------------------------- relevance


def gather_relevance(
    q_labels: torch.Tensor, retrieval_labels: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """Relevance (shared label) of ranked items. Shape: [q, C], [N, C], [q, k] -> [q, k] bool."""
    device = indices.device
    ql = _labels_f(q_labels, device)
    rl = retrieval_labels.to(device)
    q, k = indices.shape
    if k * ql.shape[1] <= retrieval_labels.shape[0]:
        ranked = rl[indices].float()  # [q, k, C]
        return torch.einsum("qc,qkc->qk", ql, ranked) > 0
    return (ql @ rl.float().T > 0).gather(1, indices)


def gather_id_match(q_ids: torch.Tensor, retrieval_ids: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """True matches (equal id) of ranked items. Shape: [q], [N], [q, k] -> [q, k] bool."""
    device = indices.device
    return retrieval_ids.to(device)[indices] == q_ids.to(device)[:, None]


def relevant_counts(query_labels: torch.Tensor, retrieval_labels: torch.Tensor) -> torch.Tensor:
    """Number of retrieval items sharing a label with each query. Shape: [Q, C], [N, C] -> [Q] int64.

    Counts over the distinct label vectors of the retrieval set, so the cost is
    Q * (distinct vectors), not Q * N.
    """
    device = query_labels.device
    retrieval_labels = retrieval_labels.to(device) != 0
    if retrieval_labels.shape[1] <= 62:  # one integer per label vector: a 1-D unique is a fast sort
        weights = 2 ** torch.arange(retrieval_labels.shape[1], device=device, dtype=torch.int64)
        keys, counts = torch.unique((retrieval_labels.long() * weights).sum(dim=1), return_counts=True)
        patterns = (keys[:, None] & weights) != 0
    else:
        patterns, counts = torch.unique(retrieval_labels, dim=0, return_counts=True)
    hit = (query_labels.float() @ patterns.float().T) > 0
    return (hit.double() @ counts.double()).round().long()


def id_match_counts(query_ids: torch.Tensor, retrieval_ids: torch.Tensor) -> torch.Tensor:
    """Number of retrieval items with each query's id. Shape: [Q], [N] -> [Q] int64."""
    device = query_ids.device
    values, counts = torch.unique(retrieval_ids.to(device), return_counts=True)
    pos = torch.searchsorted(values, query_ids).clamp(max=values.numel() - 1)
    return torch.where(values[pos] == query_ids, counts[pos], torch.zeros_like(counts[pos]))


# ----------------------------------------------------------------------------- AP


def _fixed_scale(n: int) -> float:
    """Fixed-point scale for AP sums: n terms of at most 1 each must fit in int64."""
    return float(2 ** min(52, 62 - max(1, math.ceil(math.log2(n + 1)))))


def average_precision_ranked(rel: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """AP of each row of a ranked relevance matrix, normalised by the relevant items it holds.

    ``(1/r) Σ_i i / p_i`` over the relevant positions ``p_1 < … < p_r``; a row with
    r = 0 scores 0. Shape: [Q, K] bool -> [Q] float64.
    """
    if scale is None:
        scale = _fixed_scale(rel.shape[1])
    hits = rel.long().cumsum(dim=1)
    positions = torch.arange(1, rel.shape[1] + 1, device=rel.device, dtype=torch.float64)
    terms = torch.where(rel, torch.round(hits.double() / positions * scale), 0.0).long()
    found = rel.sum(dim=1)
    return (terms.sum(dim=1).double() / scale) / found.clamp(min=1).double()


def mean(values: torch.Tensor, keep: Optional[torch.Tensor] = None) -> float:
    """Correctly rounded mean (``math.fsum``) of the kept values; 0.0 when none is kept."""
    if keep is not None:
        values = values[keep.to(values.device)]
    if values.numel() == 0:
        return 0.0
    return math.fsum(values.double().cpu().tolist()) / values.numel()


def mean_columns(values: torch.Tensor, keep: Optional[torch.Tensor] = None) -> list:
    """Column-wise :func:`mean` of a [Q, T] tensor -> list of T floats."""
    if keep is not None:
        values = values[keep.to(values.device)]
    if values.shape[0] == 0:
        return [0.0] * values.shape[1]
    rows = values.double().cpu().T.tolist()
    return [math.fsum(r) / len(r) for r in rows]


# ------------------------------------------------------------ Hamming histograms


def _block_distances(q: torch.Tensor, r: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Exact integer Hamming distances of ±1 float blocks. Shape: [q, m] int64.

    One matmul gives them directly: [-q/2, n_bits/2] · [r, 1] = (n_bits - q·r) / 2,
    all terms multiples of 1/2, so the float32 result is exact.
    """
    qa = torch.cat([q * -0.5, q.new_full((q.shape[0], 1), n_bits * 0.5)], dim=1)
    ra = torch.cat([r, r.new_ones(r.shape[0], 1)], dim=1)
    return (qa @ ra.T).long()


def iter_hamming_histograms(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> Iterator[Tuple[int, torch.Tensor, torch.Tensor]]:
    """Yield ``(first query index, all, relevant)`` per query chunk.

    ``all[i, d]`` counts retrieval items at Hamming distance d from query i,
    ``relevant[i, d]`` those of them sharing a label. Shape: [q, n_bits + 1] int64.
    """
    check_pair(query, retrieval, "hamming")
    _check_chunks(chunk_size, retrieval_chunk_size)
    device = query.device
    n_bits = n_bits_of(retrieval)
    if _use_native(device):
        rw, rlw = _code_words(retrieval), _label_words(retrieval_labels)
        for start in range(0, query.shape[0], chunk_size):
            stop = start + chunk_size
            qw, qlw = _code_words(query[start:stop]), _label_words(query_labels[start:stop])
            yield (start, *_native_histograms(qw, rw, qlw, rlw, n_bits))
        return
    for start in range(0, query.shape[0], chunk_size):
        q = as_pm1(query[start : start + chunk_size], device)
        ql = _labels_f(query_labels[start : start + chunk_size], device)
        h_all = torch.zeros(q.shape[0], n_bits + 1, dtype=torch.int64, device=device)
        h_rel = torch.zeros_like(h_all)
        for r_start in range(0, retrieval.shape[0], retrieval_chunk_size):
            r = as_pm1(retrieval[r_start : r_start + retrieval_chunk_size], device)
            rl = _labels_f(retrieval_labels[r_start : r_start + retrieval_chunk_size], device)
            dist = _block_distances(q, r, n_bits)
            rel = (ql @ rl.T) > 0
            h_all.scatter_add_(1, dist, torch.ones_like(dist))
            h_rel.scatter_add_(1, dist, rel.long())
        yield start, h_all, h_rel


def _stable_argsort(dist: torch.Tensor, n_bits: int) -> torch.Tensor:
    """Order of each row by distance, ties by position. Shape: [q, m] int64 -> [q, m] int64.

    On the CPU, numpy's stable argsort of uint8 is a radix sort, about 20x faster
    than torch's comparison sort.
    """
    if dist.device.type == "cpu" and n_bits < 256:
        order = np.argsort(dist.to(torch.uint8).numpy(), axis=1, kind="stable")
        return torch.from_numpy(order).long()
    return dist.sort(dim=1, stable=True).indices


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=1) - x


def average_precision_all_hamming(
    query: torch.Tensor,
    retrieval: torch.Tensor,
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
) -> torch.Tensor:
    """AP over the whole ranking (MAP@all) of every query by counting. Shape: -> [Q] float64.

    The position of a relevant item j at distance d is ``#items nearer than d``
    plus ``#items at distance d with index <= j``; its rank among the relevant
    items likewise. Pass 1 counts per distance (histograms); pass 2 walks the
    retrieval blocks in index order, carrying per-distance counts, and sorts
    each block stably by distance. Memory: chunk_size * retrieval_chunk_size.
    """
    device = query.device
    n = retrieval.shape[0]
    n_bits = n_bits_of(retrieval)
    scale = _fixed_scale(n)
    out = []
    hists = iter_hamming_histograms(query, retrieval, query_labels, retrieval_labels, chunk_size, retrieval_chunk_size)
    for start, h_all, h_rel in hists:
        q = as_pm1(query[start : start + chunk_size], device)
        ql = _labels_f(query_labels[start : start + chunk_size], device)
        nearer_all = _exclusive_cumsum(h_all)  # items strictly nearer than d
        nearer_rel = _exclusive_cumsum(h_rel)
        seen_all = torch.zeros_like(h_all)  # items at distance d in earlier blocks
        seen_rel = torch.zeros_like(h_rel)
        total = torch.zeros(q.shape[0], dtype=torch.int64, device=device)
        for r_start in range(0, n, retrieval_chunk_size):
            r = as_pm1(retrieval[r_start : r_start + retrieval_chunk_size], device)
            rl = _labels_f(retrieval_labels[r_start : r_start + retrieval_chunk_size], device)
            dist = _block_distances(q, r, n_bits)
            rel = (ql @ rl.T) > 0
            b_all = torch.zeros_like(h_all).scatter_add_(1, dist, torch.ones_like(dist))
            b_rel = torch.zeros_like(h_rel).scatter_add_(1, dist, rel.long())
            order = _stable_argsort(dist, n_bits)
            rel_sorted = rel.gather(1, order)
            # only the relevant items add to AP: their (row, place in the block's order)
            row, place = rel_sorted.nonzero(as_tuple=True)
            d = dist[row, order[row, place]]
            per_row = rel_sorted.sum(dim=1)
            first = per_row.cumsum(0) - per_row  # index in row/place of each row's first relevant item
            rank_in_block = torch.arange(1, row.numel() + 1, device=device) - first[row]
            # 1-based position in the whole ranking and rank among the relevant items
            position = (nearer_all + seen_all - _exclusive_cumsum(b_all))[row, d] + place + 1
            rank = (nearer_rel + seen_rel - _exclusive_cumsum(b_rel))[row, d] + rank_in_block
            terms = torch.round(rank.double() / position.double() * scale).long()
            total.index_add_(0, row, terms)
            seen_all += b_all
            seen_rel += b_rel
        found = h_rel.sum(dim=1)
        out.append((total.double() / scale) / found.clamp(min=1).double())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=device)
