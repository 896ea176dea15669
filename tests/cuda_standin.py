"""A CPU stand-in for CUDA (docs/benchmarks.md, "The GPU path"): tensors that say they are on ``cuda:0``, so
that code written for a GPU runs its CUDA branches on a machine without one, and fails where a real GPU
would.

``FakeCuda`` wraps a CPU tensor and reports ``device == cuda:0`` (``.device`` goes through
``__torch_dispatch__``; its dispatch keys stay the CPU's, so the CPU kernels compute). An operation that
combines one with a CPU tensor of one or more dimensions raises ``device mixing`` (CUDA allows 0-d CPU
scalars only); ``.numpy()`` raises, as on a GPU; ``.cpu()`` / ``.to("cpu")`` give a plain tensor back.
``cuda_standin(monkeypatch)`` turns ``.to("cuda")``, ``.cuda()``, ``module.to("cuda")`` and factories with
``device="cuda"`` into ``FakeCuda``, and makes ``torch.cuda`` say one device is there (``is_available``,
``synchronize``, the generator's state, peak memory: stubs). It counts host syncs (``.item()``,
``.tolist()``) in ``stats["syncs"]``.

What it cannot cover: autograd. Recording a graph (and running it backward) asks for a CUDA device guard,
which a CPU build of torch does not have, and aborts the process; so the block runs under
``torch.no_grad()`` and covers inference only (encoding, evaluation, search, re-ranking, SEPS scoring),
not training.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
_SYNCS = {torch.ops.aten._local_scalar_dense.default}


class FakeCuda(torch.Tensor):
    """A CPU tensor that says it is on ``cuda:0``."""

    stats: Dict[str, int] = {"syncs": 0}

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "FakeCuda":
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device, requires_grad=elem.requires_grad,
                                                storage_offset=elem.storage_offset(), dispatch_device=True)
        r.elem = elem
        return r

    def __repr__(self) -> str:
        return f"FakeCuda({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return CUDA
        fake, host = [], []

        def unwrap(x: Any) -> Any:
            if isinstance(x, FakeCuda):
                fake.append(x)
                return x.elem
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                host.append(x)
            return x

        a, k = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        if fake and host:
            raise RuntimeError(f"device mixing in {func}: a tensor on cuda:0 and one on the CPU "
                               f"(shapes {[tuple(h.shape) for h in host]})")
        if func in _SYNCS:
            cls.stats["syncs"] += 1
        leaving = func is torch.ops.aten._to_copy.default and "device" in kwargs and \
            torch.device(kwargs["device"]).type == "cpu"
        if "device" in k:
            k["device"] = torch.device("cpu")
        out = func(*a, **k)
        if leaving:
            return out
        return tree_map(lambda x: FakeCuda(x) if type(x) is torch.Tensor else x, out)


def _to_cuda(tensor: torch.Tensor, dtype: Any) -> torch.Tensor:
    with torch._C.DisableTorchFunction():
        inner = tensor.elem if isinstance(tensor, FakeCuda) else tensor
        moved = inner if dtype is None else inner.to(dtype)
        if isinstance(tensor, FakeCuda) and moved is inner:
            return tensor
        return FakeCuda(moved.clone() if moved is inner else moved)


def _is_cuda(device: Any) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


def _wrap(out: Any) -> Any:
    return tree_map(lambda x: FakeCuda(x) if type(x) is torch.Tensor else x, out)


# operations that take tensors of both devices on a GPU too: an index (or values) on the CPU, a copy
_MIXING_ALLOWED = {"__getitem__", "__setitem__", "copy_", "index_select", "index_put_"}
# torch's own bookkeeping of tensors (module.to): on the wrappers as they are
_AS_IS = {"_has_compatible_shallow_copy_type", "_is_param", "__set__", "requires_grad_", "__get__"}


class _CudaMode(TorchFunctionMode):
    """Every operation on a ``FakeCuda`` runs on its CPU tensor, checked first as CUDA would check it; moves
    to ``cuda`` and factories on ``cuda`` give ``FakeCuda``. (Done here rather than at the dispatcher: torch's
    C++ makes tensors "on the input's device" below it, which a CPU build cannot.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        leaves = tree_flatten((args, kwargs))[0]
        fakes = [x for x in leaves if isinstance(x, FakeCuda)]
        attribute = getattr(getattr(func, "__self__", None), "__name__", None) if name == "__get__" else None
        if fakes and attribute == "device":
            return CUDA
        if fakes and attribute == "is_cuda":
            return True
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            target = {"cuda": CUDA, "cpu": torch.device("cpu")}.get(name, kwargs.get("device"))
            dtype = kwargs.get("dtype")
            for x in args[1:]:
                if isinstance(x, torch.dtype):
                    dtype = x
                elif isinstance(x, (str, torch.device)):
                    target = x
                elif isinstance(x, torch.Tensor):
                    target, dtype = x.device, x.dtype
            if _is_cuda(target):
                return _to_cuda(args[0], dtype)
            if target is not None and isinstance(args[0], FakeCuda):  # back to the host
                inner = args[0].elem
                with torch._C.DisableTorchFunction():
                    return inner if dtype is None else inner.to(dtype)
        if name in _AS_IS:
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if fakes and name == "numpy":
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        if fakes and name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            FakeCuda.stats["syncs"] += 1
        if fakes:
            host = [x for x in leaves if isinstance(x, torch.Tensor) and not isinstance(x, FakeCuda) and x.dim() > 0]
            if host and name not in _MIXING_ALLOWED:
                raise RuntimeError(f"device mixing in {name or func}: a tensor on cuda:0 and one on the CPU "
                                   f"(shapes {[tuple(h.shape) for h in host]})")
            a, k = tree_map(lambda x: x.elem if isinstance(x, FakeCuda) else x, (args, kwargs))
            if _is_cuda(k.get("device")):
                k["device"] = torch.device("cpu")
            with torch._C.DisableTorchFunction():
                out = func(*a, **k)
            return _wrap(out)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
            return _wrap(func(*args, **kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_standin(monkeypatch) -> Iterator[Dict[str, int]]:
    """Within the block, ``cuda`` is a device of this machine (see the module's docstring); yields the
    counters (``syncs``)."""
    stubs = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
             "synchronize": lambda *a, **k: None, "empty_cache": lambda: None, "set_device": lambda *a, **k: None,
             "max_memory_allocated": lambda *a, **k: 0, "reset_peak_memory_stats": lambda *a, **k: None,
             "get_rng_state": lambda *a, **k: torch.get_rng_state(), "set_rng_state": lambda *a, **k: None,
             "manual_seed": lambda *a, **k: None, "manual_seed_all": lambda *a, **k: None}
    for name, stub in stubs.items():
        monkeypatch.setattr(torch.cuda, name, stub)
    FakeCuda.stats = {"syncs": 0}
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # module.to("cuda") keeps the subclass
    try:
        with torch.no_grad(), _CudaMode():  # no graph: see the module's docstring
            yield FakeCuda.stats
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
