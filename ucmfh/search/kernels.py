"""The compiled Hamming kernels for search, loaded without torch, and queries spread over threads."""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Any, Callable, Optional

from ucmfh.parallel import default_threads, over_ranges


def kernels_module() -> Any:
    """The compiled kernels (``ucmfh.metrics._hamming``), loaded without importing ``ucmfh.metrics``
    (which imports torch: 200 MB of memory that a CPU search does not need); None when not built."""
    name = "ucmfh.metrics._hamming"
    if name in sys.modules:
        return sys.modules[name]
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "metrics")
    for path in sorted(glob.glob(os.path.join(here, "_hamming*.so")) + glob.glob(os.path.join(here, "_hamming*.pyd"))):
        spec = importlib.util.spec_from_file_location(name, path)
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except ImportError:
            continue
        sys.modules[name] = module
        return module
    return None


def search_device(device: Any) -> Any:
    """``device`` as a search runs on it: ``auto`` is the GPU where torch sees one, else ``"cpu"`` (torch is
    imported for ``auto`` alone: a search on ``"cpu"`` never imports it)."""
    if str(device) != "auto":
        return device
    from ucmfh.utils import resolve_device

    resolved = resolve_device("auto")
    return "cpu" if resolved.type == "cpu" else resolved


def cpu_kernels(device: Any) -> Any:
    """The kernels when they serve this search: a CPU device, built, and the backend not set to torch."""
    if str(device) != "cpu":
        return None
    native = sys.modules.get("ucmfh.metrics.native")  # never imported: nobody chose torch
    if native is not None and native.chosen_backend() == "torch":
        return None
    return kernels_module()


def over_query_ranges(n_queries: int, threads: Optional[int], work: Callable[[int, int], None]) -> None:
    """Call ``work(a, b)`` on contiguous query ranges, one per thread (``threads``, default: every
    CPU this process may use); the kernels release the GIL, so the ranges run in parallel."""
    over_ranges(n_queries, min(threads or default_threads(), n_queries), work)
