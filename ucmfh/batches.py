"""A training run's batches: each epoch's shuffled pass and modality-dropout draws (:func:`epoch_plan`), a
step's inputs (:func:`batch_inputs`), and a step's work on the host (a streamed split's reads, a plan's own draws)
done ahead of the step that needs it (:class:`StepAhead`)."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ucmfh.data.h5 import Split
from ucmfh.distributed import Group
from ucmfh.utils import keep_host_copy, to_device

Shuffle = Callable[[torch.Generator], torch.Tensor]


def batches(n: int, batch_size: int, generator: torch.Generator,
            shuffle: Optional[Shuffle] = None) -> Iterator[torch.Tensor]:
    """A shuffled pass over ``range(n)`` in batches; every item is used once.

    The order is ``shuffle(generator)`` (a streamed split's, :meth:`Split.shuffle`), by default
    a uniform permutation. The last partial batch is kept (UCMFH's defect 3); a last batch of one
    item, which has no negative, joins the batch before it.
    """
    if n < 2:
        raise ValueError(f"training needs at least 2 items, got {n}")
    order = torch.randperm(n, generator=generator) if shuffle is None else shuffle(generator)
    chunks = list(order.split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) == 1:
        last = chunks.pop()
        chunks[-1] = torch.cat([chunks[-1], last])
    return iter(chunks)


def epoch_plan(
    n: int, batch_size: int, p_separate: float, generator: torch.Generator, device: torch.device,
    shuffle: Optional[Shuffle] = None,
) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """One epoch's batches (item indices) and modality-dropout draws, already on ``device``.

    Drawn from the CPU generator in the order a per-step loop would draw them
    (the shuffle, then one ``rand`` per batch), so the run is the same; but
    each goes to the device in one copy per epoch instead of two per step,
    each of which would make the host wait for the GPU.
    """
    chunks = list(batches(n, batch_size, generator, shuffle))
    sizes = [len(c) for c in chunks]
    index = to_device(torch.cat(chunks), device).split(sizes)
    for on_device, on_host in zip(index, chunks):
        keep_host_copy(on_device, on_host)
    if p_separate <= 0:
        return [(i, None) for i in index]
    draws = torch.cat([torch.rand(k, generator=generator) for k in sizes])
    return list(zip(index, to_device(draws < p_separate, device).split(sizes)))


class StepAhead:
    """Worker threads that do a step's work on the host (``work(batch)``: its reads from a file, the plan's own
    draws) while the steps before it run: up to ``depth`` steps ahead, each on a thread of its own. :meth:`take`
    returns the work's result to the step it was done for; an error in it is raised there."""

    def __init__(self, depth: int = 1) -> None:
        self.depth = depth
        self.pool: Optional[ThreadPoolExecutor] = None
        self.pending: Dict[int, Future] = {}  # by the step the work is for

    def begun(self, iteration: int) -> bool:
        """Whether the work for step ``iteration`` is begun and not yet taken."""
        return iteration in self.pending

    def start(self, work: Callable[[Any], Any], batch: Any) -> None:
        """``work(batch)`` begun on a worker thread, for the step numbered ``batch.iteration``."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.depth, thread_name_prefix="ucmfh-step-ahead")
        self.pending[batch.iteration] = self.pool.submit(work, batch)

    def take(self, iteration: int) -> Tuple[bool, Any]:
        """``(True, result)`` of the work begun for step ``iteration``; ``(False, None)`` where none was (its
        epoch's first step, the first after a resume): the step does its own."""
        pending = self.pending.pop(iteration, None)
        return (False, None) if pending is None else (True, pending.result())

    def wait(self) -> None:
        """Every pending work finished (an error in it raised), its result let go."""
        pending, self.pending = self.pending, {}
        for future in pending.values():
            future.result()

    def __enter__(self) -> "StepAhead":
        return self

    def __exit__(self, kind, value, trace) -> None:
        try:
            if kind is None:
                self.wait()
        finally:
            if self.pool is not None:  # a run that stops lets the work not yet begun go
                self.pool.shutdown(wait=True, cancel_futures=kind is not None)


class BatchReads:
    """A step's reads from files (``read(index)``, the step's batch -> what the step takes), done ahead
    on :class:`StepAhead`'s thread (:meth:`ahead`, ``Plan.ahead``) or when the step
    asks (:meth:`__call__`) for a batch that was not."""

    def __init__(self, read: Callable[[torch.Tensor], Any]) -> None:
        self.read = read
        self.done = WeakIdKeyDictionary()

    def ahead(self, index: torch.Tensor) -> None:
        self.done[index] = self.read(index)

    def __call__(self, index: torch.Tensor) -> Any:
        found = self.done.pop(index, None)
        return self.read(index) if found is None else found


def split_ahead(split: Split, group: Group) -> Optional[Callable[[torch.Tensor], None]]:
    """What :func:`batch_inputs` will read of a streamed split for a batch, read into its cache ahead of
    the step (``Plan.ahead``); None for a split in memory."""
    if not split.streamed:
        return None
    return lambda index: split.read_ahead(group.local(index))


def batch_inputs(split: Split, index: torch.Tensor, separate: Optional[torch.Tensor], supervised: bool,
           group: Group) -> Tuple[Optional[torch.Tensor], ...]:
    """A step's inputs: the features (and modality-dropout draws) of this rank's part of the global
    batch ``index`` (all of it on one process), the ids and labels of the whole global batch."""
    ids = None if split.ids is None else split.ids[index]
    labels = split.labels[index] if supervised else None
    local = group.local(index)
    return split.img[local], split.txt[local], None if separate is None else group.local(separate), ids, labels
