"""The compiled CPU Hamming kernels (``_hamming.c``) and the choice of backend.

The kernels are built at install (setup.py; optional: without a C compiler the
install succeeds and the torch path serves the CPU too). On CPU tensors they
compute popcount distances, a top-K that keeps per distance the first K items
met in index order, histograms by distance, and AP by lists or by counting;
query ranges are spread over ``torch.get_num_threads()`` threads (the kernels
release the GIL). Results are identical to the torch path's.

Which path serves CPU tensors is a library setting, :func:`set_backend` (or the
context manager :func:`backend`): ``"auto"`` (default: the kernels when built),
``"native"`` or ``"torch"``. GPU tensors always take the torch path. The
library reads no environment variable; the ``ucmfh`` command maps
``UCMFH_NATIVE=0`` to ``set_backend("torch")``.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Iterator, Literal, Optional, Tuple

import numpy as np
import torch

from ucmfh import bits
from ucmfh.parallel import over_ranges

try:  # the compiled CPU kernels; optional at install (setup.py)
    from ucmfh.metrics import _hamming
except ImportError:  # pragma: no cover - exercised only where the build failed
    _hamming = None

Backend = Literal["auto", "native", "torch"]
BACKENDS: Tuple[str, ...] = ("auto", "native", "torch")

_backend: str = "auto"  # process-wide, changed only through set_backend
_MIN_QUERIES_PER_THREAD = 16
_SAID = [False]  # the kernels' absence said (use_native), once a process


def native_kernels() -> Optional[str]:
    """The build of the compiled Hamming kernels chosen for this CPU (e.g. ``"avx512vpopcntdq"``),
    or None when they are not built (then the torch path serves the CPU too)."""
    return None if _hamming is None else _hamming.kernel_name()


def set_backend(name: Backend) -> Backend:
    """Choose which path computes Hamming metrics of CPU tensors, for the whole process; return
    the previous choice.

    ``"auto"`` (default): the compiled kernels when they are built, else torch.
    ``"native"``: the compiled kernels; raises RuntimeError when they are not built.
    ``"torch"``: the matmul path that serves GPUs. Results are identical on every path;
    only speed differs. Tensors on a GPU always take the torch path.

    Example:
        >>> previous = set_backend("torch")
        >>> set_backend(previous)
        'torch'
    """
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "native" and _hamming is None:
        raise RuntimeError(
            "the compiled Hamming kernels (ucmfh.metrics._hamming) are not built: reinstall ucmfh "
            "with a C compiler available, or use the 'torch' or 'auto' backend"
        )
    previous, _backend = _backend, name
    return previous


def chosen_backend() -> str:
    """The choice :func:`set_backend` last made for this process (``"auto"`` until then)."""
    return _backend


@contextlib.contextmanager
def backend(name: Backend) -> Iterator[None]:
    """:func:`set_backend` for the ``with`` block; the previous choice comes back after it.

    Example:
        >>> with backend("torch"):
        ...     ap = average_precision_at_k(q, r, ql, rl)  # the torch path on the CPU
    """
    previous = set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def use_native(device: torch.device) -> bool:
    """Whether Hamming metrics of tensors on ``device`` run in the compiled kernels (see :func:`set_backend`).
    The first time the CPU would have run them but they are not built (no C compiler at install), a
    ``RuntimeWarning`` says so, once a process: the same figures, 7-13x slower, where nothing said why."""
    if device.type != "cpu" or _backend == "torch":
        return False
    if _hamming is None and not _SAID[0]:
        _SAID[0] = True
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ucmfh imported: maybe a checkout
        warnings.warn(f"ucmfh's compiled evaluation kernels are not built beside the ucmfh imported here ({here}): "
                      "scoring runs on torch, the same figures 7-13x slower; build them with a C compiler on the "
                      "PATH (a checkout: pip install -e . in it; an installed copy: install it again)",
                      RuntimeWarning, stacklevel=2)
    return _hamming is not None


def code_words(codes: torch.Tensor) -> np.ndarray:
    """The kernels' form of codes: ±1 (sign >= 0 is a set bit, :mod:`ucmfh.bits`) or packed codes
    [N, ·] -> uint64 words [N, W]."""
    codes = codes.detach().cpu()
    if codes.dtype == torch.uint8:
        return bits.words(codes.numpy())
    return bits.words(bits.pack(codes))


def label_words(labels: torch.Tensor) -> np.ndarray:
    """The kernels' form of labels: multi-hot [N, C] -> uint64 words [N, ceil(C / 64)], a set bit per label."""
    return bits.words(bits.pack_labels(labels))


def _split_queries(n: int, work: Callable[[int, int], None]) -> None:
    """Run ``work(start, stop)`` over query ranges on ``torch.get_num_threads()`` threads
    (the kernels release the GIL); each range is written to its own rows."""
    over_ranges(n, min(torch.get_num_threads(), n // _MIN_QUERIES_PER_THREAD), work)


def native_top_k(qw: np.ndarray, rw: np.ndarray, n_bits: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by (distance, index) of query words [q, W] among retrieval words [N, W].

    Shape: -> (distances, indices) [q, k] int64.
    """
    nq, words = qw.shape
    idx = np.empty((nq, k), dtype=np.int64)
    dist = np.empty((nq, k), dtype=np.int64)

    def work(a: int, b: int) -> None:
        _hamming.top_k(qw[a:b], rw, b - a, rw.shape[0], words, n_bits, k, idx[a:b], dist[a:b])

    _split_queries(nq, work)
    return torch.from_numpy(dist), torch.from_numpy(idx)


def native_histograms(
    qw: np.ndarray, rw: np.ndarray, qlw: np.ndarray, rlw: np.ndarray, n_bits: int, k: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per query, items (all, and sharing a label) at each Hamming distance, from code and label words.

    With ``k``, only the counts up to the distance of the k-th item are exact (the cut group
    included); the rest are partial, and items beyond are skipped, which costs a fraction of
    the full count. Shape: -> (all, relevant) [q, n_bits + 1] int64.
    """
    nq = qw.shape[0]
    h_all = np.empty((nq, n_bits + 1), dtype=np.int64)
    h_rel = np.empty_like(h_all)

    def work(a: int, b: int) -> None:
        _hamming.histograms(qw[a:b], rw, b - a, rw.shape[0], qw.shape[1], n_bits,
                            qlw[a:b], rlw, qlw.shape[1], h_all[a:b], h_rel[a:b], k or 0)

    _split_queries(nq, work)
    return torch.from_numpy(h_all), torch.from_numpy(h_rel)


def native_ap_sums(
    qw: np.ndarray, rw: np.ndarray, qlw: np.ndarray, rlw: np.ndarray, n_bits: int, k: int, scale: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fixed-point AP@k sums and relevant counts of every query, in one threaded kernel pass with
    no torch work between kernel calls (lists for k < N, counting for the whole ranking).

    Each term ``i / p_i`` is ``round(i / p_i * scale)`` as in :mod:`ucmfh.metrics.ap`.
    Shape: -> (sums, relevant among the first k) [Q] int64.
    """
    n = rw.shape[0]
    total = np.empty(qw.shape[0], dtype=np.int64)
    found = np.empty(qw.shape[0], dtype=np.int64)

    def work(a: int, b: int) -> None:
        _hamming.average_precision(qw[a:b], rw, b - a, n, qw.shape[1], n_bits, k, qlw[a:b], rlw, qlw.shape[1],
                                   scale, total[a:b], found[a:b])

    _split_queries(qw.shape[0], work)
    return torch.from_numpy(total), torch.from_numpy(found)
