"""A training step captured once as a CUDA graph and replayed (:class:`CapturedStep`), inside
:func:`capture_steps`: on a GPU a step of a few small matrix products is bound by the host launching its
kernels; one graph replay launches them all at once.

A plan may be captured where its step — one update of a loss, or a step of its own (DGCPN's three
updates) — keeps its tensors' shapes, waits for no value on the device and has its scalars (β) and its
learning rate as its only host-side values (:attr:`ucmfh.trainer.Plan.graphable`; no streamed rows, one
process, full precision). Its full batches are replayed: the batch's indices (its modality-dropout draws, the
plan's own draws made on the host: UCCH's negatives) are copied into the static buffers the graph reads, the
graph runs the forward pass, the backward pass and the optimizer's update, and its loss is read from the
graph's own tensor. The scalars the plan feeds it (``Plan.fed``: β, by epoch or by iteration) are filled into
0-dim tensors on the device before each replay; a graph holds the plan's other scalars and the learning rate
of the batch it was captured on, and where they change (UCCH's momentum after its warm-up epoch, a learning
rate lowered at a milestone) the step is captured again. The first :data:`WARMUP_STEPS` full batches run
eagerly on a side stream (the optimizer's state, cuBLAS's workspaces), on the graph's own static batch, as
PyTorch's whole-network capture asks (again where the step's operations change: UCCH's negatives drawn from its
second epoch on); a batch of another size (an epoch's short last batch) runs eagerly. A capture that PyTorch
refuses leaves the plan eager from that batch on, said to the capture block's listener.
Adam's update is made capturable (its step count on the device); SGD's has no count to capture. Dropout
draws from the device's generator, which a graph advances on every replay.

Everything else — the device, the batches, resume and save, validation — is :mod:`ucmfh.trainer`'s, unchanged.
Where a step cannot be captured the eager step runs, with the same results.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

import torch

from ucmfh.distributed import current_group
from ucmfh.optim import optimize
from ucmfh.run_draws import cuda_generator, drawing_separately, state_replaced
from ucmfh.streams import unshared_stream

WARMUP_STEPS = 3

# the innermost capture_steps block: whether it captures, and its listener, the reasons it heard and whether it
# hears every reason; the block's context (runs in threads side by side each have their own)
_Block = Tuple[bool, Optional[Callable[[str], None]], Set[str], bool]
_BLOCK: contextvars.ContextVar[_Block] = contextvars.ContextVar("ucmfh_capture_steps",
                                                                 default=(False, None, set(), True))


@contextlib.contextmanager
def capture_steps(enabled: bool = True, on_eager: Optional[Callable[[str], None]] = None,
                  every_reason: bool = True) -> Iterator[None]:
    """Inside the block, every plan that can be (:attr:`ucmfh.trainer.Plan.graphable`) trains on a CUDA
    device with its full batches replayed from one captured CUDA graph. ``on_eager(message)`` is told, once
    for each reason, that a plan trained inside runs eagerly although a capture was asked for, and why
    (:meth:`ucmfh.trainer._Run.eager_because`): a user who asked for graphs hears it before the epochs. With
    ``every_reason=False`` it hears only of a capture that PyTorch refused (a capture on by default is no
    news where a plan cannot have it: the CPU, bf16, several processes; a refused one is). The block is its
    context's (:mod:`contextvars`): a thread started inside hears it where it runs in a copy of that context."""
    token = _BLOCK.set((enabled, on_eager, set(), every_reason))
    try:
        yield
    finally:
        _BLOCK.reset(token)


def capturing() -> bool:
    """Whether :func:`capture_steps` is on."""
    return _BLOCK.get()[0]


def runs_eagerly(stage: str, reason: str, refused: bool = False) -> None:
    """Tell the innermost :func:`capture_steps` block's listener that ``stage`` runs eagerly because of ``reason``
    (each reason once a block; ``refused``: a capture PyTorch refused, which every listener hears)."""
    _, listener, said, every_reason = _BLOCK.get()
    if listener is not None and (every_reason or refused) and reason not in said:
        said.add(reason)
        listener(f"{stage} runs eagerly: {reason}")


class CudaGraphs:
    """The CUDA calls a capture makes (a test gives the CPU stand-in's own, ``tests/cuda_standin.py``).
    ``capture_error_mode``: PyTorch's (``torch.cuda.graph``). ``global``, a lone run's, refuses the unsafe CUDA
    calls of every thread of the process while a graph is captured; runs side by side in threads of one process
    (inside :func:`ucmfh.run_draws.separate_draws`) take ``thread_local``, which refuses the capturing thread's
    alone: another run's allocation or read of its loss meanwhile is its own business."""

    @property
    def capture_error_mode(self) -> str:
        return "thread_local" if drawing_separately() else "global"

    def side_stream(self, device: torch.device) -> Any:
        return unshared_stream(device)  # not another live run's, where runs are side by side

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        """Run the block's work on ``stream``, after the work queued before it, and queue later work after it."""
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield
        torch.cuda.current_stream().wait_stream(stream)

    def capture(self, body: Callable[[], torch.Tensor], before: Callable[[], None],
                stream: Any) -> Tuple[Callable[[], None], torch.Tensor, bool]:
        """``body`` captured as a graph on ``stream`` (``before()`` run first, outside it): the replay, the
        graph's output and whether capturing ran the body's work (a CUDA capture does not)."""
        graph = torch.cuda.CUDAGraph()
        before()
        current = torch.cuda.current_stream(stream.device)
        generator = cuda_generator(stream.device)  # the run's own state where runs are side by side
        kept = generator.clone_state()  # its draws as they stand: a refused capture leaves the state it held unusable
        pool = torch.cuda.graph_pool_handle()  # the graph's memory, known before the capture (pool() needs one done)
        try:
            with torch.cuda.device(stream.device), torch.cuda.graph(  # the device's generator
                    graph, pool=pool, stream=stream, capture_error_mode=self.capture_error_mode):
                out = body()
        except BaseException:  # a capture PyTorch ends in an error may leave its stream current: the run's again
            torch.cuda.set_stream(current)
            undo_refused_capture(generator, kept, pool)
            raise
        return graph.replay, out, False


def undo_refused_capture(generator: Any, kept: Any, pool: Any) -> None:
    """What a capture PyTorch refused leaves behind, undone, so that the steps after it run eagerly: a capture
    invalidated (an operation a graph cannot hold) ends before PyTorch's epilogue, so the generator state the
    graph registered stays marked as capturing (the next eager dropout: 'Offset increment outside graph capture
    encountered unexpectedly'), and the allocator may still route this thread's allocations to the graph's pool
    (every later capture's ``empty_cache``: 'captures_underway.empty()'). The generator gets ``kept`` back (a
    clone of its state before the capture: the eager step draws what the capture would have), and the pool's
    routing is ended where it is still on. Whatever of it fails leaves the capture's own error to be said."""
    try:
        generator.graphsafe_set_state(kept)
        state_replaced(kept)  # a run side by side: its own state, swapped in for its steps
    except Exception:  # noqa: BLE001 - the refusal itself is what the run says
        return
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is not None:
        try:
            end(generator.device.index, pool)
        except RuntimeError:  # ended already, by the capture's own end
            pass


def _like(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if tensor is None else torch.empty_like(tensor)


class CapturedStep:
    """A plan's step (:class:`ucmfh.trainer.Plan`, its ``loss`` and optimizer) captured as a CUDA graph on
    its first full batch after the warm-up, then replayed for every full batch; ``eager(batch)`` is the
    trainer's own step, which runs the warm-up and the batches of another size."""

    def __init__(self, plan: Any, batch_size: int, eager: Callable[[Any], torch.Tensor], device: torch.device,
                 graphs: Optional[CudaGraphs] = None) -> None:
        self.plan, self.batch_size, self.eager = plan, batch_size, eager
        self.graphs = graphs or CudaGraphs()
        self.stream = self.graphs.side_stream(device)
        self.warm = 0
        self.failed = False  # a capture PyTorch refused: every step of the plan runs eagerly from then on
        self.replay: Optional[Callable[[], None]] = None
        # the batch the warm-up and the graph read: each full batch's indices, draws and fed scalars copied in
        self.static: Any = None
        self.loss: Optional[torch.Tensor] = None
        self.held: Any = None  # what the graph holds of the host: the plan's scalars it does not feed, learning rate
        for group in plan.optimizer.param_groups:  # Adam's step count and bias corrections on the device
            if "capturable" in group:
                group["capturable"] = True
        # its warm-up and its short batches run uncaptured by design: PyTorch's warning that a capturable
        # optimizer steps outside a capture would be said to every run
        plan.optimizer._warned_capturable_if_run_uncaptured = True

    def __call__(self, batch: Any) -> torch.Tensor:
        if self.failed:
            return self.eager(batch)
        lr = self.plan.set_learning_rate(batch.epoch)
        if len(batch.index) != self.batch_size:  # an epoch's short last batch: its shapes are its own
            if self.replay is None or self.plan.step is not None:  # a step of its own runs as it is written
                return self.eager(batch)
            # eager, into the gradient tensors the graph writes (replacing them would leave the graph's freed)
            return optimize(self.plan.loss(batch), self.plan.optimizer, current_group(), self.plan.clip_norm,
                            keep_gradients=True)
        scalars = {} if self.plan.scalars is None else self.plan.scalars(batch.epoch, batch.iteration)
        fed = {name: scalars[name] for name in self.plan.fed}  # read by the graph from the device
        held = ({name: value for name, value in scalars.items() if name not in fed}, lr)
        if self.static is not None and (self.static.draws is None) != (batch.draws is None):
            # draws from now on (UCCH's after its warm-up epoch): a step of other operations, warmed up before its
            # capture as the first was (a graph without draws let go)
            self.warm, self.replay, self.loss, self.static = 0, None, None, None
        if self.static is None:
            self.static = type(batch)(torch.empty_like(batch.index), _like(batch.separate), batch.epoch,
                                      batch.iteration, _like(batch.draws),
                                      {name: batch.index.new_zeros((), dtype=torch.float32) for name in fed} or None)
        self._fill(batch, fed)
        if self.warm < WARMUP_STEPS:  # on the graph's own batch, as PyTorch's whole-network capture does: what a
            self.warm += 1  # capture reads is what the warm-up ran (a compiled loss is compiled for it)
            with self.graphs.on(self.stream):
                return self.eager(self.static)
        if self.replay is None or held != self.held:
            return self._capture(batch, held)
        self.replay()
        return self.loss

    def _fill(self, batch: Any, fed: Dict[str, float]) -> None:
        """The graph's batch made ``batch``: its indices and draws copied in, its fed scalars filled (a fill on the
        device, which waits for nothing), its epoch and iteration set (what a warm-up step reads of them)."""
        self.static.epoch, self.static.iteration = batch.epoch, batch.iteration
        self.static.index.copy_(batch.index)
        if self.static.separate is not None:
            self.static.separate.copy_(batch.separate)
        if self.static.draws is not None:
            self.static.draws.copy_(batch.draws)
        for name, value in fed.items():
            self.static.scalars[name].fill_(value)

    def _capture(self, batch: Any, held: Any) -> torch.Tensor:
        """The step captured on the graph's batch, which holds ``batch`` (and run, where capturing did not)."""
        plan = self.plan
        self.replay = self.loss = None  # a graph captured before (other scalars) is let go, its memory with it
        self.held = held

        def body() -> torch.Tensor:  # optimize() without its zero_grad: the graph writes each gradient anew
            if plan.step is not None:  # a step of its own, its updates and their gradients
                return plan.step(self.static)
            loss = plan.loss(self.static)
            loss.backward()
            if plan.clip_norm is not None:
                params = [p for g in plan.optimizer.param_groups for p in g["params"]]
                torch.nn.utils.clip_grad_norm_(params, plan.clip_norm)
            plan.optimizer.step()
            return loss.detach()

        def before() -> None:  # no gradient before the capture: backward allocates them in the graph's pool
            plan.optimizer.zero_grad(set_to_none=True)

        try:
            self.replay, self.loss, ran = self.graphs.capture(body, before, self.stream)
        except Exception as err:  # noqa: BLE001 - a capture refused (an operation a graph cannot hold): said, eager
            return self._eager_from_now(batch, err)
        if not ran:  # a capture records the batch's step without running it
            self.replay()
        return self.loss

    def _eager_from_now(self, batch: Any, err: Exception) -> torch.Tensor:
        """The plan's steps eager from ``batch`` on, after a capture that failed (it ran none of the batch's work;
        the gradients it made are let go), and the capture block's listener told why."""
        self.failed, self.replay, self.loss, self.static = True, None, None, None
        self.plan.optimizer.zero_grad(set_to_none=True)
        while err.__context__ is not None and isinstance(err.__context__, Exception):  # the operation refused, not
            err = err.__context__  # the "capture invalidated" that ending the capture raised over it
        first = (str(err).strip().splitlines() or [""])[0]
        runs_eagerly(self.plan.name, f"its capture as a CUDA graph failed ({type(err).__name__}: {first})",
                     refused=True)
        return self.eager(batch)
