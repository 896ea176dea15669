"""Data-parallel training on ``torch.distributed``: every rank's items are negatives in every loss.

One process per rank, started by ``torchrun`` (the app layer joins the process group:
:func:`ucmfh.app.environment.join_process_group`). The training loop of :mod:`ucmfh.trainer` runs the
same code on one process and on many; :func:`current_group` is what they ask.

The scheme, exact for every loss (``tests/test_distributed.py`` compares the gradients):

* every rank draws the same global batch (same seed, same generator) and encodes only its
  own part of it (:meth:`Group.local`: contiguous parts whose sizes differ by at most one;
  there is no sampler padding, so no item appears twice in a global batch);
* the parts' embeddings are gathered in rank order *with* gradient (:meth:`Group.gather`),
  so every rank holds the global batch in the order one process would hold it and computes
  the same loss on it, its positive masks built from the global batch's ids and labels
  (two captions of one image on different ranks are still positives);
* the gather's backward sums the gradient of every rank's copy (all-reduce), so a rank's
  encoder receives ``world_size`` times its share of the gradient, and averaging parameter
  gradients over the ranks (:meth:`Group.average_gradients`) gives exactly the gradient of
  one process on the whole batch. Gathering without gradient would leave each rank only its
  own part's gradient: the whole gradient divided by the world size.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ucmfh.utils import keep_host_copy, known_host_copy


class Group:
    """The ranks of a run; one process alone is a group of one, where every method is the identity."""

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints, training states and results, and shows progress."""
        return self.rank == 0

    def sizes(self, n: int) -> List[int]:
        """The parts of a global batch of ``n`` items, one per rank (as ``torch.tensor_split``)."""
        return [n // self.world_size + (r < n % self.world_size) for r in range(self.world_size)]

    def local(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch (its first dimension)."""
        if self.world_size == 1:
            return batch
        part = batch.tensor_split(self.world_size)[self.rank]
        host = known_host_copy(batch)
        if host is not None:  # a training plan's batch: its part is known on the host too
            keep_host_copy(part, host.tensor_split(self.world_size)[self.rank])
        return part

    def gather(self, parts: Sequence[torch.Tensor], n: int) -> Tuple[torch.Tensor, ...]:
        """The global batch of each of ``parts`` (this rank's [n_r, d_j] rows of a global batch of
        ``n`` items, :meth:`local`): ``[n, d_j]`` each, with gradient, in one collective."""
        if self.world_size == 1:
            return tuple(parts)
        widths = [p.shape[1] for p in parts]
        return _Gather.apply(torch.cat(parts, 1), self.sizes(n), self.rank).split(widths, 1)

    def average_gradients(self, params: Iterable[nn.Parameter]) -> None:
        """Replace each gradient by its mean over the ranks (one all-reduce for all of them)."""
        if self.world_size == 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))

    def broadcast_modules(self, modules: Iterable[nn.Module]) -> None:
        """Give every rank rank 0's parameters and buffers."""
        if self.world_size == 1:
            return
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, 0)

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when ``flag`` is true on any (a decision all ranks must share)."""
        if self.world_size == 1:
            return flag
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def max(self, values: Sequence[int], device: torch.device) -> List[int]:
        """Each of ``values``' largest value over the ranks, on every rank (one collective)."""
        if self.world_size == 1 or not values:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def broadcast_float(self, value: float, device: torch.device) -> float:
        """Rank 0's ``value`` on every rank."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.broadcast(t, 0)
        return float(t.item())

    def gather_objects(self, obj: Any) -> List[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank is here (e.g. until rank 0 has written a file the others read)."""
        if self.world_size > 1:
            dist.barrier()


class _Gather(torch.autograd.Function):
    """All-gather of parts of unequal sizes; backward: the summed gradient of this rank's part."""

    @staticmethod
    def forward(ctx, part: torch.Tensor, sizes: List[int], rank: int) -> torch.Tensor:  # noqa: D102
        ctx.sizes, ctx.rank = sizes, rank
        padded = part.new_zeros((max(sizes), *part.shape[1:]))  # all_gather needs equal shapes
        padded[: len(part)] = part
        pieces = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(pieces, padded)
        return torch.cat([p[:n] for p, n in zip(pieces, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # every rank's loss depends on this rank's part
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None, None


def current_group() -> Group:
    """The process group this process belongs to (after ``dist.init_process_group``), else a group of one."""
    if dist.is_available() and dist.is_initialized():
        return Group(dist.get_rank(), dist.get_world_size())
    return Group()


def use_local_gpu(local_rank: int) -> None:
    """On a machine with GPUs: make GPU ``local_rank`` (modulo the GPUs) this process's current device, so
    that ``cuda`` means one GPU per rank under torchrun. More ranks than GPUs are left to
    :func:`check_device`, which refuses them on CUDA; on the CPU they are fine."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def check_device(device: torch.device, world_size: int, local_world_size: int) -> None:
    """A run of ``world_size`` processes, ``local_world_size`` of them on this machine, on ``device``: on
    CUDA each process needs its own GPU (NCCL refuses two ranks on one): a ``ValueError`` that says what
    to do otherwise."""
    if device.type != "cuda" or world_size <= 1:
        return
    if device.index is not None and local_world_size > 1:
        raise ValueError(f"device '{device}' under torchrun would put all {local_world_size} processes of this "
                         f"machine on one GPU: use --device cuda (each process takes GPU LOCAL_RANK)")
    gpus = torch.cuda.device_count()
    if local_world_size > gpus:
        raise ValueError(f"torchrun started {local_world_size} processes on this machine, which has {gpus} GPU(s): "
                         f"NCCL needs one GPU per process; use --nproc-per-node {gpus}, or --device cpu")
