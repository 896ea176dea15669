"""A CPU stand-in for CUDA (docs/benchmarks.md, "The GPU path"): tensors that say they are on ``cuda:0``, so
that code written for a GPU runs its CUDA branches, training included, on a machine without one, and fails
where a real GPU would.

The tensors are plain CPU tensors, remembered as being on the device (by identity, :func:`on_cuda`): inside
``cuda_standin(monkeypatch)``, ``.to("cuda")``, ``.cuda()``, ``module.to("cuda")`` and factories with
``device="cuda"`` give such tensors, every result of an operation on one is one too, and ``.device`` says
``cuda:0``. An operation that combines one with a CPU tensor of one or more dimensions raises ``device
mixing`` (CUDA allows 0-d CPU scalars only); ``.numpy()`` of one raises, as on a GPU; ``.cpu()`` /
``.to("cpu")`` give a host tensor back. Autograd computes on the CPU tensors as it would anywhere (its
backward runs below the stand-in, and a parameter's ``.grad`` is on the parameter's device), so training
runs on it. ``torch.cuda`` says one device is there (``is_available``, ``synchronize``, the generator's
state, peak memory: stubs), ``torch.load(map_location="cuda")`` loads onto it, and the step-ahead
worker's threads run under it too.

It counts host syncs (``.item()``, ``.tolist()``, ``bool()``, a copy to the host: ``.cpu()``,
``.to("cpu")``, the operations whose result's shape depends on the values, which a GPU computes before
the host can allocate it: ``nonzero``, a boolean mask as an index, ``unique``, ..., and the linear algebra
PyTorch documents as synchronizing: ``linalg.eigvals``, ``linalg.svd``, ``linalg.inv``, ...; :func:`peek`
reads a value for a test without counting) in ``stats["syncs"]``, copies to the device
from pinned host memory (``pin_memory()``: a copy, remembered) in ``stats["pinned"]``, and from pageable
memory (which wait for the device) in ``stats["pageable"]``. :func:`running_on_cuda` says whether the
operation running now is one on the device, for a count of operations below the stand-in
(``tests/dispatch_counter.py``).
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

import ucmfh.batches

CUDA = torch.device("cuda", 0)

_ON_CUDA = WeakIdKeyDictionary()  # the tensors on the stand-in's device
_PINNED = WeakIdKeyDictionary()  # host tensors made by pin_memory()
STATS: Dict[str, int] = {"syncs": 0, "pinned": 0, "pageable": 0}
_RUNNING = threading.local()  # on while an operation on cuda runs (on the CPU)

# operations that take tensors of both devices on a GPU too: an index (or values) on the CPU, a copy
_MIXING_ALLOWED = {"__getitem__", "__setitem__", "copy_", "index_select", "index_put_"}
# torch's own bookkeeping of tensors (module.to): on the tensors as they are
_AS_IS = {"_has_compatible_shallow_copy_type", "_is_param"}
_SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "allclose", "is_nonzero"}
# operations whose result's shape depends on the values: on a GPU the host waits to learn it (and a CUDA graph
# cannot capture them); a boolean index, torch.where(condition) and repeat_interleave by a tensor of counts
# are too (_data_dependent)
_SHAPE_FROM_VALUES = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "equal"}
# the linear algebra PyTorch documents as synchronizing a CUDA device with the CPU (MAGMA's eigensolvers run on
# the host; the others check their results there), which a CUDA graph cannot capture either
_LINALG_SYNCS = {"linalg_eig", "linalg_eigvals", "linalg_eigh", "linalg_eigvalsh", "linalg_svd", "linalg_svdvals", "svd",
                 "linalg_inv", "inverse", "linalg_cholesky", "cholesky", "linalg_solve", "linalg_pinv", "pinverse",
                 "linalg_matrix_rank"}
# tensor attributes that are tensors of their owner's device
_SAME_DEVICE = {"grad", "data", "T", "mT", "H", "mH", "real", "imag"}


def on_cuda(x: Any) -> bool:
    """Whether ``x`` is a tensor on the stand-in's ``cuda``."""
    return isinstance(x, torch.Tensor) and x in _ON_CUDA


def running_on_cuda() -> bool:
    """Whether the operation running now is one on the stand-in's ``cuda``: its tensors are there, or its result
    was asked there. For ``tests/dispatch_counter.py``, which sees what it dispatches below the stand-in, where
    each tensor is on the CPU (a factory inside it too: autograd's, a composite operation's)."""
    return getattr(_RUNNING, "on", False)


@contextlib.contextmanager
def _running(on: bool) -> Iterator[None]:
    _RUNNING.on = on
    try:
        yield
    finally:
        _RUNNING.on = False


def _mark(out: Any) -> Any:
    for x in tree_flatten(out)[0]:
        if isinstance(x, torch.Tensor):
            _ON_CUDA[x] = True
    return out


def _is_cuda(device: Any) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


def _move(args: tuple, kwargs: dict, name: str) -> Any:
    """``tensor.to(...)``, ``.cuda()``, ``.cpu()``: a copy marked or not, or the tensor itself where it is."""
    tensor = args[0]
    target = {"cuda": CUDA, "cpu": torch.device("cpu")}.get(name, kwargs.get("device"))
    dtype = kwargs.get("dtype")
    for x in args[1:]:
        if isinstance(x, torch.dtype):
            dtype = x
        elif isinstance(x, (str, torch.device)):
            target = x
        elif isinstance(x, torch.Tensor):
            target, dtype = (CUDA if on_cuda(x) else x.device), x.dtype
    if dtype is not None and dtype != tensor.dtype:
        with _running(_is_cuda(target)):
            moved = tensor.to(dtype)
    elif target is None or _is_cuda(target) == on_cuda(tensor):
        return tensor  # already there, as torch's .to returns
    else:
        # a copy on the other device, as a move makes: still in the graph; to the host, the operation a GPU's
        # is (tests/dispatch_counter.py counts it by name), and to the device, an operation on it
        if on_cuda(tensor):
            moved = tensor.to("cpu", copy=True)
        else:
            with _running(True):
                moved = tensor.clone()
    if target is None:
        return _mark(moved) if on_cuda(tensor) else moved
    if _is_cuda(target):
        if not on_cuda(tensor) and tensor not in _PINNED:
            STATS["pageable"] += 1  # a copy that waits for the device's queue
        return _mark(moved)
    if on_cuda(tensor):
        STATS["syncs"] += 1  # a copy to the host waits for the device's queue
    return moved


class _CudaMode(TorchFunctionMode):
    """Every operation runs on the CPU tensors, checked first as CUDA would check it; results of operations on
    the stand-in's device are on it. (Done at the Python level: a tensor whose dispatcher says CUDA makes
    autograd ask for a CUDA device guard, which a CPU build of torch does not have.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in ("__get__", "__set__"):
            attribute = getattr(getattr(func, "__self__", None), "__name__", None)
            owner = args[0] if args else None
            out = func(*args, **kwargs)
            if name == "__set__":
                if attribute == "data" and on_cuda(args[1]):
                    _mark(owner)
                elif attribute == "data" and owner in _ON_CUDA:
                    del _ON_CUDA[owner]
                return out
            if on_cuda(owner):
                if attribute == "device":
                    return CUDA
                if attribute in ("is_cuda",):
                    return True
                if attribute in ("is_cpu",):
                    return False
                if attribute in _SAME_DEVICE and isinstance(out, torch.Tensor):
                    _mark(out)
            return out
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            return _move(args, kwargs, name)
        if name in _AS_IS:
            return func(*args, **kwargs)
        leaves = tree_flatten((args, kwargs))[0]
        marked = any(on_cuda(x) for x in leaves)
        if name == "pin_memory" and args:  # page-locked host memory: a copy, remembered as pinned
            if marked:
                raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
            pinned = args[0].clone()
            _PINNED[pinned] = True
            STATS["pinned"] += 1
            return pinned
        if marked and name == "numpy":
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if marked and (name in _SYNCS or _data_dependent(name, args, kwargs)):
            STATS["syncs"] += 1
        if marked and name not in _MIXING_ALLOWED:
            host = [x for x in leaves if isinstance(x, torch.Tensor) and not on_cuda(x) and x.dim() > 0]
            if host:
                raise RuntimeError(f"device mixing in {name or func}: a tensor on cuda:0 and one on the CPU "
                                   f"(shapes {[tuple(h.shape) for h in host]})")
        asked = kwargs.get("device")
        to_device = _is_cuda(asked)
        if to_device:
            kwargs["device"] = torch.device("cpu")
        with _running(to_device or (marked and asked is None)):  # unless it asked for the host
            out = func(*args, **kwargs)
        if (marked or to_device) and name not in _SYNCS:
            _mark(out)
        return out


def _data_dependent(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the operation's result's shape comes from its values (:data:`_SHAPE_FROM_VALUES`)."""
    if name in _SHAPE_FROM_VALUES or name in _LINALG_SYNCS:
        return True
    if name == "where":  # torch.where(condition): nonzero
        return len(args) + len(kwargs) == 1
    if name == "repeat_interleave":  # by a tensor of counts, its sum unknown (output_size not given)
        counts = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
        return (isinstance(counts, torch.Tensor) and counts.dim() > 0 and kwargs.get("output_size") is None
                and (len(args) < 4 or args[3] is None))
    if name in ("__getitem__", "__setitem__", "index_put_", "index_put", "index"):
        index = args[1] if len(args) > 1 else kwargs.get("indices")
        return any(isinstance(x, torch.Tensor) and x.dtype == torch.bool for x in tree_flatten(index)[0])
    return False


@contextlib.contextmanager
def cuda_standin(monkeypatch) -> Iterator[Dict[str, int]]:
    """Within the block, ``cuda`` is a device of this machine (see the module's docstring); yields the
    counters (``syncs``, ``pinned``, ``pageable``)."""
    stubs = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
             "synchronize": lambda *a, **k: None, "empty_cache": lambda: None, "set_device": lambda *a, **k: None,
             "max_memory_allocated": lambda *a, **k: 0, "reset_peak_memory_stats": lambda *a, **k: None,
             "get_rng_state": lambda *a, **k: torch.get_rng_state(), "set_rng_state": lambda *a, **k: None,
             "manual_seed": lambda *a, **k: None, "manual_seed_all": lambda *a, **k: None}
    for name, stub in stubs.items():
        monkeypatch.setattr(torch.cuda, name, stub)
    # no accelerator, as a CPU build of torch answers: under a CUDA build without a GPU the optimizers' check of a
    # graph capture asked the driver there is not ('Found no NVIDIA driver on your system', 30 tests)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)
    monkeypatch.setattr(ucmfh.batches, "ThreadPoolExecutor", _ThreadsUnderTheStandin)
    monkeypatch.setattr(torch, "load", _loader(torch.load))
    monkeypatch.setattr(torch.nn.utils.clip_grad, "_group_tensors_by_device_and_dtype",
                        _grouped_on_the_device(torch.nn.utils.clip_grad._group_tensors_by_device_and_dtype))
    STATS.update(syncs=0, pinned=0, pageable=0)
    with _CudaMode():
        yield STATS


def peek(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values on the host, for a test's own checks: not counted as a sync."""
    with torch._C.DisableTorchFunction():
        return x.detach().clone()


def _grouped_on_the_device(group: Callable) -> Callable:
    """torch's grouping of tensors by device (``clip_grad_norm_``'s), which reads the CPU tensors' own device:
    the stand-in's tensors grouped under ``cuda``, as a GPU's would be, so that the norm is not copied to the
    host for them."""

    def grouped(tensorlistlist: Any, with_indices: bool = False) -> Dict:
        out = {}
        for (device, dtype), value in group(tensorlistlist, with_indices).items():
            lists = value[0]
            on = any(on_cuda(t) for t in lists[0] if isinstance(t, torch.Tensor))
            out[(CUDA if on else device, dtype)] = value
        return out

    return grouped


def _loader(load: Callable) -> Callable:
    """``torch.load`` whose ``map_location`` may be ``cuda``: read on the CPU, the tensors then on the device."""

    def load_on(*args: Any, map_location: Any = None, **kwargs: Any) -> Any:
        if not _is_cuda(map_location):
            return load(*args, map_location=map_location, **kwargs)
        return _mark(load(*args, map_location="cpu", **kwargs))

    return load_on


class _ThreadsUnderTheStandin(ThreadPoolExecutor):
    """The step-ahead worker's threads (:class:`ucmfh.batches.StepAhead`), under the stand-in too: a torch
    function mode holds for the thread that enters it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, initializer=lambda: _CudaMode().__enter__(), **kwargs)
