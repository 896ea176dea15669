"""A count of the aten operations that run while it is active (``scripts/bench_dispatch.py``): a torch
dispatch mode, below autograd, so the forward pass, the backward pass and the optimizer's update all reach it,
each composite operation as the operations it is made of (``linear`` as ``t`` and ``addmm``).

On a GPU nearly every operation on device tensors is a kernel launch, and launches are what a small training
step spends its host time on; the count follows them where no GPU is. It works under the CUDA stand-in
(``tests/cuda_standin.py``), a torch *function* mode above it, so the CUDA branches of the code are the ones
counted (fused Adam where the device has it, foreach updates); ``on_device=on_cuda, running_on_device=lambda
kwargs: running_on_cuda()`` tell it the stand-in's operations. Each operation is counted in one tally:

- ``device``: on a device tensor, or making one: a kernel on a GPU;
- ``host``: on host tensors only: no kernel, and not replayed by a captured CUDA graph;
- ``free``: views, allocations and the profiler's marks, which launch no kernel anywhere.

Modes are per thread: other threads' operations (the step-ahead worker's host reads and draws) are not counted; the
backward pass, which runs on the caller's thread for these tensors, is.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Dict, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# operations that make a tensor without computing one: memory taken, or its description changed
_ALLOCATIONS = {"aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty", "aten.new_empty_strided",
                "aten._unsafe_view", "aten.lift_fresh", "aten.resize_", "aten.set_"}
TALLIES = ("device", "host", "free")


def op_name(func: Any) -> str:
    """An aten operation's name without its overload: ``aten.mm``."""
    return str(func.overloadpacket)


def is_free(func: Any) -> bool:
    """Whether an operation launches no kernel on any device: a view (its result aliases its input), an
    allocation, or a mark of the profiler (the optimizer's step is a ``record_function``)."""
    return bool(getattr(func, "is_view", False)) or op_name(func) in _ALLOCATIONS or \
        getattr(func, "namespace", "") == "profiler"


def _not_on_the_cpu(tensor: torch.Tensor) -> bool:
    return tensor.device.type != "cpu"


def _device_asked(kwargs: Mapping[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type != "cpu"


class DispatchCounter(TorchDispatchMode):
    """Counts the aten operations dispatched inside ``with DispatchCounter() as counter:`` by name, in three
    tallies (module docstring): ``counter.device["aten.mm"]``, ``counter.host``, ``counter.free``.

    An operation is on the device if ``on_device(tensor)`` holds for one of its tensors or
    ``running_on_device(kwargs)`` for the operation itself; by default a tensor's own ``device`` and the
    ``device`` a factory asks for.
    """

    def __init__(self, on_device: Callable[[torch.Tensor], bool] = _not_on_the_cpu,
                 running_on_device: Callable[[Mapping[str, Any]], bool] = _device_asked) -> None:
        super().__init__()
        self.on_device, self.running_on_device = on_device, running_on_device
        self.device: Counter = Counter()
        self.host: Counter = Counter()
        self.free: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_free(func):
            tally = self.free
        elif self.running_on_device(kwargs) or any(self.on_device(x) for x in tree_flatten((args, kwargs))[0]
                                                   if isinstance(x, torch.Tensor)):
            tally = self.device
        else:
            tally = self.host
        tally[op_name(func)] += 1
        return func(*args, **kwargs)

    @property
    def kernels(self) -> int:
        """Operations on the device, views and allocations apart: the kernels a GPU would launch."""
        return sum(self.device.values())

    def tallies(self) -> Dict[str, Dict[str, int]]:
        """The counts so far, copied: ``{"device": {name: count}, "host": …, "free": …}``."""
        return {name: dict(getattr(self, name)) for name in TALLIES}
