"""Approximate search over an index's codes with FAISS (``faiss-cpu``, the optional extra ``faiss``).

Never the default: ``exact`` is (:func:`ucmfh.search.scan.hamming_search`). ``faiss-ivf``
(``IndexBinaryIVF``: the codes clustered into ``nlist`` lists, ``nprobe`` of them scanned per query)
and ``faiss-hnsw`` (``IndexBinaryHNSW``: a graph walked with a candidate list of ``ef_search``) are
for collections where the exact scan is too slow (10⁸+ items); :func:`recall` says what they miss.

The FAISS index is built from the index's packed codes on first use and cached in the index folder
(``faiss/<modality>.<kind>.faiss``, written to a temporary name and renamed; the build under a lock, so
two searches do not build it twice). It lives inside the folder so that it goes wherever the folder goes
and disappears with it: a folder replaced by ``Index.save(overwrite=True)`` can never meet the cache of
the old one. The cache is rebuilt when the index has grown (its ``ntotal`` differs from the count) or
was built with other settings (they are in its name). An index in memory, or a folder that cannot be
written, gets its FAISS index built in memory (kept on the :class:`~ucmfh.search.index.Index`).
Positions are the index's own (FAISS's sequential ids); a position of -1 means FAISS found fewer than
k items for that query (IVF with few lists probed).
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from ucmfh.bits import packed_bytes
from ucmfh.config import BackendConfig
from ucmfh.files import atomic_path

EXTRA = "faiss"  # the extra of setup.py that installs faiss-cpu
CACHE = "faiss"  # the cache folder inside an index folder
_ADD_BLOCK = 1 << 20  # codes handed to FAISS at a time (bounded copies of the mapped codes)


def import_faiss() -> Any:
    """The ``faiss`` module, or an ImportError saying how to install it."""
    try:
        import faiss
    except ImportError:
        raise ImportError(f"the FAISS backends need faiss-cpu: pip install 'ucmfh[{EXTRA}]'") from None
    return faiss


def cache_name(modality: str, cfg: BackendConfig, count: int) -> str:
    """The file name of a FAISS index, with every setting built into it."""
    if cfg.backend == "faiss-ivf":
        return f"{modality}.ivf-nlist{n_lists(cfg, count)}.faiss"
    return f"{modality}.hnsw-m{cfg.hnsw_m}-efc{cfg.ef_construction}.faiss"


def n_lists(cfg: BackendConfig, count: int) -> int:
    """IVF lists: ``cfg.nlist``, else round(sqrt(items)); never more than the items."""
    wanted = cfg.nlist if cfg.nlist is not None else round(math.sqrt(count))
    return max(1, min(int(wanted), count))


def _packed(words: np.ndarray, n_bits: int) -> np.ndarray:
    """Words [N, W] uint64 -> FAISS's packed bytes [N, n_bits / 8] uint8, contiguous."""
    return np.ascontiguousarray(packed_bytes(words, n_bits))


@contextlib.contextmanager
def _threads(faiss: Any, threads: Optional[int]) -> Iterator[None]:
    """FAISS's OpenMP threads set to ``threads`` (None: as they are) while inside, and back as they were after:
    set for one search, they stayed for the whole process (a library user's later FAISS work too)."""
    if not threads:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(int(threads))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def build(words: np.ndarray, n_bits: int, cfg: BackendConfig, threads: Optional[int] = None) -> Any:
    """A FAISS binary index of ``words`` [N, W] uint64 (the index's codes, in position order)."""
    faiss = import_faiss()
    with _threads(faiss, threads):
        return _build(faiss, words, n_bits, cfg)


def _build(faiss: Any, words: np.ndarray, n_bits: int, cfg: BackendConfig) -> Any:
    n = words.shape[0]
    if cfg.backend == "faiss-ivf":
        nlist = n_lists(cfg, n)
        quantizer = faiss.IndexBinaryFlat(n_bits)
        index = faiss.IndexBinaryIVF(quantizer, n_bits, nlist)
        index.own_fields = True  # the quantizer is freed with the index (read back from a file, it is anyway)
        quantizer.this.disown()
        n_train = min(n, nlist * cfg.train_per_list)
        rows = np.linspace(0, n - 1, n_train).astype(np.int64) if n_train < n else np.arange(n)
        index.train(_packed(np.asarray(words[rows]), n_bits))
    elif cfg.backend == "faiss-hnsw":
        index = faiss.IndexBinaryHNSW(n_bits, cfg.hnsw_m)
        index.hnsw.efConstruction = cfg.ef_construction
    else:
        raise ValueError(f"not a FAISS backend: {cfg.backend!r}")
    for start in range(0, n, _ADD_BLOCK):
        index.add(_packed(np.asarray(words[start : start + _ADD_BLOCK]), n_bits))
    return index


def faiss_index(index: Any, modality: str, cfg: BackendConfig, threads: Optional[int] = None) -> Tuple[Any, str]:
    """The FAISS index of one modality of ``index`` (an :class:`~ucmfh.search.index.Index`): read from the
    cache, else built (and cached where the folder can be written; :meth:`Index.derived`). Returns it and
    how it was got: ``cached``, ``built`` (and cached) or ``in memory``."""
    faiss = import_faiss()
    if index.n_bits % 8:
        raise ValueError(f"{index.path or 'index'}: FAISS's binary indexes take whole bytes; "
                         f"these codes have {index.n_bits} bits")
    count = index.count(modality)
    name = cache_name(modality, cfg, count)

    def read(path: str) -> Any:
        if not os.path.exists(path):
            return None
        cached = faiss.read_index_binary(path)
        return cached if cached.ntotal == count and cached.d == index.n_bits else None

    def write(built: Any, path: str) -> None:
        tmp = atomic_path(path)
        faiss.write_index_binary(built, tmp)
        os.replace(tmp, path)

    kind = name.split(".")[1].split("-")[0]  # the same kind built with other settings, or for fewer items, is stale
    return index.derived(CACHE, name, lambda: build(index.codes(modality), index.n_bits, cfg, threads), read, write,
                         f"{modality}.{kind}-*")


def search(index: Any, queries: np.ndarray, k: int, modality: str, cfg: BackendConfig,
           threads: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Approximate top-k of packed query words [Q, W] among the items of ``modality``.

    Shape: -> (distances, positions) [Q, min(k, count)] int64; positions -1 (distance ``n_bits + 1``)
    where FAISS found fewer than k items.
    """
    faiss = import_faiss()
    found, _ = faiss_index(index, modality, cfg, threads)
    k = min(int(k), index.count(modality))
    if cfg.backend == "faiss-ivf":
        found.nprobe = min(cfg.nprobe, found.nlist)
    else:
        found.hnsw.efSearch = max(cfg.ef_search, k)
    if k == 0 or queries.shape[0] == 0:
        empty = np.zeros((queries.shape[0], k), dtype=np.int64)
        return empty, empty.copy()
    with _threads(faiss, threads):
        d, p = found.search(_packed(queries, index.n_bits), k)
    d, p = d.astype(np.int64), p.astype(np.int64)
    d[p < 0] = index.n_bits + 1
    return d, p


def recall(approx: Tuple[np.ndarray, np.ndarray], exact: Tuple[np.ndarray, np.ndarray]) -> Dict[str, float]:
    """How much of the exact top-k an approximate search found, averaged over queries.

    ``ids``: the share of the exact list's items in the approximate list (the usual recall@k; with
    ties at the k-th distance the exact list is one of several equally good ones). ``distances``: the
    share of ranks r whose approximate r-th distance equals the exact r-th (ties do not count against it).
    Shape: (distances, positions) [Q, k] each.
    """
    (ad, ap), (ed, ep) = approx, exact
    if ep.size == 0:
        return {"ids": 1.0, "distances": 1.0}
    hits = (ap[:, :, None] == ep[:, None, :]).any(axis=1)  # [Q, k]: each exact item found
    return {"ids": float(hits.mean()), "distances": float((ad == ed).mean())}
