"""The one training lifecycle: a method says what a run trains (:class:`Plan`), :func:`train` runs it.

Every trained stage — the fusion stage, each method's hashing stage, SEPS — is a :class:`Plan`: its modules,
its optimizer, one step's loss, how it validates, its items. :func:`train` owns everything around the step:
the epochs and their batches, the update, resuming and saving the training state
(:mod:`ucmfh.training_state`), stopping on a signal, validation with the best epoch kept and early
stopping, progress, the epochs' records (:mod:`ucmfh.training_log`), and the ranks of a distributed run. A
training feature written here reaches every stage.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import nn
from tqdm.auto import tqdm

from ucmfh.amp import check_amp, matmul_precision
from ucmfh.batches import Shuffle, StepAhead, epoch_plan, split_ahead
from ucmfh.captured_step import CapturedStep, capturing, runs_eagerly
from ucmfh.config import identity_dict
from ucmfh.data.h5 import Dataset, Split
from ucmfh.distributed import Group, current_group
from ucmfh.optim import optimize
from ucmfh.parallel import default_threads
from ucmfh.run_draws import RunDraws, run_under_way, setting_up
from ucmfh.selection import History, validation_split
from ucmfh.signals import TrainingInterrupted, stop_on_signals
from ucmfh.training_log import EpochRecord, current_logs, current_part, shown_part
from ucmfh.training_state import StateFile, read_state, restore_cuda_rng, write_state
from ucmfh.utils import resolve_device, seed_everything, to_device

# Under torchrun the ranks decide together whether to stop (a signal may reach one rank only), at
# every STOP_EVERY-th step and an epoch's last: one collective per step would stall a GPU every step.
STOP_EVERY = 16
# an epoch longer than STEP_SHOWN_AFTER_S shows its step on the bar, looked at every STEP_SHOWN_EVERY steps (a 1-epoch
# run at 100,000 items showed 0/1 for minutes)
STEP_SHOWN_EVERY, STEP_SHOWN_AFTER_S = 16, 5.0
DRAWS_AHEAD = 8  # steps whose own draws a GPU's run makes ahead at most, each on a thread (_Run.steps_ahead)


@dataclass
class Batch:
    """One training step's batch: the item indices of the global batch (on the training device), the
    modality-dropout draws (None without modality dropout), the epoch (from 0), the step's number in
    the run (from 0), the plan's own draws for the step (``Plan.draws``, on the device; else None) and, in a
    step captured as a CUDA graph, the plan's ``fed`` scalars as 0-dim tensors on the device, which the graph
    reads and :mod:`ucmfh.captured_step` refills before each replay (else None: the step computes them)."""

    index: torch.Tensor
    separate: Optional[torch.Tensor]
    epoch: int
    iteration: int
    draws: Optional[torch.Tensor] = None
    scalars: Optional[Dict[str, torch.Tensor]] = None


@dataclass
class Plan:
    """What one training run trains, as its method or stage says it; :func:`train` runs it.

    ``name``: the progress bar's label and the stage a saved state belongs to. ``model``: what the run
    returns. ``modules``: every module whose state the run changes (the model, a loss with learned
    parameters, a memory bank), by name: saved, restored, broadcast to the ranks, the best epoch's kept.
    ``items``: the training split (its length, order and reads ahead are taken from it) or the number
    of items. ``loss(batch)``: one step's loss, which :func:`train` minimises by one update
    (:func:`ucmfh.optim.optimize`), its gradients clipped to ``clip_norm`` when given, the learning rate of
    every parameter group set to ``learning_rate(epoch)`` first when given; a method whose step makes
    updates of its own gives ``step(batch)`` instead, returning the batch's (detached) loss.
    ``validate()``: the validation score after each epoch (higher is better); the best epoch's weights
    are kept. ``ahead(index)``: what a step will read from a file, read on a worker thread while the step
    before it runs (for ``items`` given as a number; a split's are its own). ``scalars(epoch, iteration)``:
    the plan's own figures after an epoch (β), shown beside the loss and recorded (:mod:`ucmfh.training_log`).
    ``draws(batch)``: the step's random draws made on the host (a generator of its own, e.g. UCCH's negatives),
    a tensor of one shape for every full batch or None, moved to the device as ``batch.draws`` before the step;
    made on a worker thread while the step before runs, so a function of the batch alone that touches no device.
    ``graphable``: ``loss`` (or ``step``) may be captured as a CUDA graph and replayed (:mod:`ucmfh.captured_step`): its
    tensors keep their shapes from batch to batch, it waits for no value on the device, and its host-side
    values are its ``scalars`` and its learning rate alone (a graph is captured again where they change); what
    it draws on the host comes as ``batch.draws``, copied into the graph's batch before each replay.
    ``fed``: the names of the ``scalars`` the step reads from ``batch.scalars`` where it is given (a captured
    step: the graph reads them from the device, refilled before each replay, and is not captured again where
    they change), else computes itself (:func:`ucmfh.models.relaxation.step_beta`).
    """

    name: str
    model: nn.Module
    modules: Dict[str, nn.Module]
    optimizer: torch.optim.Optimizer
    items: Union[Split, int]
    loss: Optional[Callable[[Batch], torch.Tensor]] = None
    step: Optional[Callable[[Batch], torch.Tensor]] = None
    validate: Optional[Callable[[], float]] = None
    ahead: Optional[Callable[[torch.Tensor], None]] = None
    scalars: Optional[Callable[[int, int], Dict[str, float]]] = None
    clip_norm: Optional[float] = None
    learning_rate: Optional[Callable[[int], float]] = None
    draws: Optional[Callable[[Batch], Optional[torch.Tensor]]] = None
    graphable: bool = False
    fed: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.loss is None) == (self.step is None):
            raise ValueError(f"{self.name}: a plan has a loss or a step of its own, one of the two")
        missing = set(self.fed) - set({} if self.scalars is None else self.scalars(0, 0))
        if missing:
            raise ValueError(f"{self.name}: a plan feeds its step scalars {sorted(missing)} that it does not have")

    def set_learning_rate(self, epoch: int) -> Optional[float]:
        """Every parameter group's learning rate set to ``learning_rate(epoch)``; it, or None without a schedule."""
        if self.learning_rate is None:
            return None
        lr = self.learning_rate(epoch)
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        return lr

    def order(self, group: Group) -> Tuple[int, Optional[Shuffle], Optional[Callable[[torch.Tensor], None]]]:
        """The number of training items, their shuffle (None: a uniform permutation) and the reads ahead."""
        if isinstance(self.items, Split):
            return len(self.items), self.items.shuffle, split_ahead(self.items, group)
        return self.items, None, self.ahead


@dataclass
class Setup:
    """What a plan is made from: the training device, the training part of the training split and its
    validation part (None without validation, :func:`ucmfh.selection.validation_split`), and whether a pass
    it makes before the first epoch shows its progress (:meth:`bar`)."""

    device: torch.device
    rest: Split
    val: Optional[Split]
    progress: bool = False

    def bar(self, total: int, desc: str) -> Any:
        """A progress bar of a plan's pass over the training items before the first epoch (DAEH's distances
        of every pair, CIRH's thresholds, DGCPN's neighbours: minutes at 100,000 items, where nothing was
        said): shown once it has taken 2 s, gone when done. ``update(rows)`` as the rows are done. A bar of its
        own, not the epochs' (``trainer.tqdm``, which tests replace to stop a run at an epoch)."""
        from tqdm.auto import tqdm as rows_bar

        return rows_bar(total=total, desc=desc, unit="rows", disable=not self.progress, delay=2, leave=False)


def restore_optimizer(optimizer: torch.optim.Optimizer, saved: Dict[str, Any]) -> None:
    """``optimizer.load_state_dict(saved)``, an SGD keeping its own kernel (``fused``, ``foreach``): a state
    saved by an older ucmfh, whose SGD looped over its tensors, resumes with today's fused kernel, which makes
    the same update (its state, the momentum buffers, is the same for every kernel). Any optimizer keeps its own
    ``capturable``: a state saved by a captured run (:mod:`ucmfh.captured_step` sets it) resumed eagerly is not
    a capturable Adam run uncaptured, which PyTorch warns of."""
    kernels = [{key: group.get(key) for key in ("fused", "foreach") if isinstance(optimizer, torch.optim.SGD)}
               for group in optimizer.param_groups]
    for group, kernel in zip(optimizer.param_groups, kernels):
        if "capturable" in group:
            kernel["capturable"] = group["capturable"]
    optimizer.load_state_dict(saved)
    for group, kernel in zip(optimizer.param_groups, kernels):
        group.update(kernel)


def checked_training(where: str, data: Dataset, fusion: Optional[nn.Module] = None) -> Dataset:
    """``data`` as a fit of a public entry point (``where``) takes it: its training split checked
    (:meth:`~ucmfh.data.h5.Split.checked`: NaN or infinity among the features trained a model of NaN without a
    word), and a ``fusion`` encoder given made for its feature widths (``ValueError``); a modality whose features
    are the same for every training item is refused (every item of it would get one code), as the file check
    cannot (a valid file may hold it; streamed rows are not read for it)."""
    data = replace(data, train=data.train.checked(where, "data.train"))
    for modality, x in (("image", data.train.img), ("text", data.train.txt)):
        # each column's least value its largest (finite: checked above), without an [N, d] comparison
        if isinstance(x, torch.Tensor) and len(x) > 1 and bool((x.amax(0) == x.amin(0)).all()):
            raise ValueError(f"{data.path or data.name}: every training item has the same {modality} features: a "
                             f"model trained on them gives every {modality} one code")
    widths = getattr(fusion, "d_img", None), getattr(fusion, "d_txt", None)
    if fusion is not None and widths != (data.d_img, data.d_txt):
        raise ValueError(f"{where}: the fusion encoder takes {widths[0]}-d image and {widths[1]}-d text features, "
                         f"data.train has {data.d_img}-d and {data.d_txt}-d (an encoder of another dataset?)")
    return data


def _described(value: Any) -> str:
    """What a value is, said in a few words (a tensor by its shape and gradient)."""
    if not isinstance(value, torch.Tensor):
        return f"a {type(value).__name__}"
    grad = "" if value.requires_grad else " with no gradient (computed under no_grad, or detached)"
    return f"a tensor of shape {list(value.shape)}{grad}"


def check_supervision(data: Dataset, cfg: Any) -> None:
    """Refuse supervised training (``cfg.supervised``) on a caption set, which has no labels."""
    if cfg.supervised and data.caption_set:
        raise ValueError(f"{data.path or data.name}: supervised training needs labels; this caption set has "
                         "none (its ids already make the captions of one image positives of each other)")


def start(cfg: Any) -> Tuple[torch.device, torch.Generator]:
    """What every run starts with, in this order (the seeded draws depend on it): its device, and the
    seeded batch generator (:func:`ucmfh.utils.seed_everything`); ``cfg.amp`` checked against the device."""
    device = resolve_device(cfg.device)
    check_amp(getattr(cfg, "amp", "none"), device)
    return device, seed_everything(cfg.seed)


def _what(cfg) -> str:
    """What a run trains, in a message: its method, or the fusion stage (a FusionConfig has no method)."""
    return f"method {cfg.method!r}" if hasattr(cfg, "method") else "the fusion stage"


def fit(make_plan: Callable[[Setup], Plan], split: Split, cfg: Any, state: Optional[StateFile] = None,
        progress: bool = True) -> Tuple[nn.Module, History]:
    """A run's whole life on a training ``split``: its start (:func:`start`), a validation part held out
    (``cfg.val_fraction``), the plan made (``make_plan``) and trained (:func:`train`); returns the plan's
    model on the CPU in eval mode (the best validation epoch's weights) and the run's :class:`History`. The
    caller's global generators are left as they were (:func:`ucmfh.run_draws.run_under_way`)."""
    # gradients on whatever the caller's block (a fit inside torch.no_grad() ended in 'element 0 of tensors does
    # not require grad', one inside torch.inference_mode() blamed its method's loss)
    with run_under_way(resolve_device(cfg.device)), torch.inference_mode(False), torch.enable_grad():
        with setting_up():  # its seeds and its plan in one piece where runs are side by side (ucmfh.run_draws)
            device, generator = start(cfg)
            rest, val = validation_split(split, cfg.val_fraction, cfg.seed)
            if len(rest) < 2:  # said by its method before a plan is built on it (validation_split says its own)
                raise ValueError(f"{_what(cfg)}: {len(rest)} training item"
                                 f"{'s' if len(rest) != 1 else ''}; training needs at least 2")
            plan = make_plan(Setup(device, rest, val, progress and current_group().is_main))
            draws = RunDraws(device)
        if not isinstance(plan, Plan):  # a method of another package (docs/methods.md): said here, not in train
            raise ValueError(f"{_what(cfg)}: its plan() gave {type(plan).__name__}, not a ucmfh.trainer.Plan")
        history = train(plan, cfg, device, generator, state, progress, draws)
        return plan.model.cpu().eval(), history


class BestEpoch:
    """The validation record of a run: the best score so far, its epoch and its modules' weights."""

    def __init__(self, saved: Optional[Dict[str, Any]] = None) -> None:
        saved = saved or {"score": -math.inf, "epoch": None, "weights": None}
        self.score, self.epoch, self.weights = saved["score"], saved["epoch"], saved["weights"]

    def offer(self, epoch: int, score: float, modules: Dict[str, nn.Module]) -> None:
        """Keep the weights of ``epoch`` (counted from 1) if ``score`` is better than the best so far."""
        if score > self.score:
            self.score, self.epoch = score, epoch
            self.weights = {name: {k: v.detach().clone() for k, v in m.state_dict().items()}
                            for name, m in modules.items()}

    def patience_spent(self, epoch: int, patience: int) -> bool:
        """Early stopping: ``patience`` epochs (0: never) since the best one, ``epoch`` counted from 1."""
        return bool(patience) and self.epoch is not None and epoch - self.epoch >= patience

    def restore(self, modules: Dict[str, nn.Module], history: History) -> None:
        """Load the best epoch's weights into ``modules`` and record it in ``history`` (if there was one)."""
        if self.weights is not None:
            for name, module in modules.items():
                module.load_state_dict(self.weights[name])
            history.best_epoch = self.epoch

    def as_dict(self) -> Dict[str, Any]:
        return {"score": self.score, "epoch": self.epoch, "weights": self.weights}


class Position:
    """Where a run stands: the epoch and step to go on from, the step count, the running loss of the
    epoch in progress, the generator's state at its start, and the seconds trained before this process."""

    def __init__(self, device: torch.device) -> None:
        self.epoch, self.skip, self.iteration = 0, 0, 0
        self.total = torch.zeros((), device=device)
        self.epoch_generator: Optional[torch.Tensor] = None  # a resumed epoch's draws, replayed
        self.elapsed = 0.0


def train(plan: Plan, cfg: Any, device: torch.device, generator: torch.Generator, state: Optional[StateFile],
          progress: bool, draws: Optional[RunDraws] = None) -> History:
    """Run ``plan`` for ``cfg.epochs`` epochs of ``cfg.batch_size`` items (``cfg.modality_dropout`` drawn per
    item where the config has it), stopping early after ``cfg.patience`` epochs without a better validation
    score; returns the run's :class:`History`, the best validation epoch's weights loaded into the modules.

    Everything that decides what comes next — the modules and optimizer, the batch generator's state at
    the epoch's start, torch's own generators (dropout), the position, the running loss, the validation
    record and the best weights so far — is saved to ``state`` (every ``state.interval_s`` seconds at an
    epoch's end, at once on SIGINT/SIGTERM, which then raise :class:`TrainingInterrupted`, and at the end)
    and restored with ``state.resume``, so a resumed run replays the rest of the run exactly; a finished
    state returns its result without training.

    On several ranks (:mod:`ucmfh.distributed`) every rank runs this loop over the same global batches;
    rank 0 alone validates (its score is shared), writes the state and shows progress, and decisions
    (stop on a signal, save now) are taken by all ranks together.
    """
    group = current_group()
    group.broadcast_modules(plan.modules.values())
    if group.rank:  # dropout masks of its own on each rank; rank 0 draws what one process would
        torch.manual_seed(cfg.seed + 7919 * group.rank)
        draws = RunDraws(device)  # (where its draws are kept to itself: from the rank's seed)
    run = _Run(plan, cfg, device, generator, state, group, draws or RunDraws(device))
    if state is not None and state.resume and os.path.exists(state.path):
        with run.draws.active():  # the saved generators' states are the run's own
            run.resume()
    with matmul_precision(getattr(cfg, "amp", "none")):  # tf32: the whole of training, validation too
        return run.epochs(progress)


class _Run:
    """One call of :func:`train`: its pieces (resume, save, the step, the epoch's end) over shared state."""

    def __init__(self, plan: Plan, cfg: Any, device: torch.device, generator: torch.Generator,
                 state: Optional[StateFile], group: Group, draws: RunDraws) -> None:
        self.plan, self.cfg, self.device, self.generator, self.state, self.group = (
            plan, cfg, device, generator, state, group)
        self.draws = draws  # its dropout's generator state, where runs are side by side (ucmfh.run_draws)
        self.n, self.shuffle, self.ahead = plan.order(group)
        self.identity = identity_dict(cfg)
        self.history = History()
        self.best = BestEpoch()
        self.at = Position(device)
        self.clock = time.monotonic()
        self.captured: Optional[CapturedStep] = None  # made at the first step (after a resume's optimizer state)
        self.capture = False  # whether full batches are replayed from a CUDA graph: decided once, in epochs()

    def resume(self) -> None:
        """Continue from the saved state: refused if another run's (its stage or settings differ)."""
        state, group = self.state, self.group
        saved = read_state(state.path, self.device)
        if saved["stage"] != self.plan.name or saved["config"] != self.identity:
            differ = sorted(k for k in set(saved["config"]) | set(self.identity)
                            if saved["config"].get(k) != self.identity.get(k))
            raise ValueError(f"{state.path}: saved by another {saved['stage']} run "
                             f"(settings that differ: {differ or 'stage'}); not resumed")
        if saved.get("world_size", 1) != group.world_size:
            raise ValueError(f"{state.path}: saved by a run on {saved.get('world_size', 1)} process(es), not "
                             f"{group.world_size}; resume it with the same number of processes")
        for name, module in self.plan.modules.items():
            module.load_state_dict(saved["modules"][name])
        restore_optimizer(self.plan.optimizer, saved["optimizer"])
        at = self.at
        at.epoch, at.skip, at.iteration = saved["epoch"], saved["step"], saved["iteration"]
        self.history = History(saved["history"], saved["validation"])
        self.best = BestEpoch(saved["best"])
        at.total = saved["total"].to(self.device)
        at.epoch_generator = saved["generator"].cpu()
        at.elapsed = saved.get("elapsed", 0.0)  # older states did not record their seconds: count them as 0
        rngs = saved["rng"]
        if isinstance(rngs, torch.Tensor):  # a state saved before runs had ranks
            rngs = [(rngs, saved.get("cuda_rng"))]
        rng, cuda_rng = rngs[group.rank]
        torch.set_rng_state(rng.cpu())
        restore_cuda_rng(cuda_rng, self.device)

    def save(self, epoch: int, done: int, epoch_generator: torch.Tensor, epoch_total: torch.Tensor) -> None:
        """Write the training state (rank 0; every rank calls it, for its random-number state)."""
        group, device = self.group, self.device
        with self.draws.active():  # the run's own states, where runs are side by side
            rng = (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
        rngs = group.gather_objects(rng)
        if group.is_main:
            write_state(self.state.path, {
                "stage": self.plan.name, "config": self.identity, "world_size": group.world_size,
                "epoch": epoch, "step": done, "iteration": self.at.iteration, "history": list(self.history),
                "validation": self.history.validation, "best": self.best.as_dict(), "total": epoch_total.detach(),
                "modules": {name: m.state_dict() for name, m in self.plan.modules.items()},
                "optimizer": self.plan.optimizer.state_dict(), "generator": epoch_generator, "rng": rngs,
                "elapsed": self.at.elapsed + time.monotonic() - self.clock,
                "threads": torch.get_num_threads(),  # on a CPU another count trains another model: said on resume
            })
        group.barrier()  # no rank goes on (or exits) before the state is written

    def step(self, batch: Batch) -> torch.Tensor:
        """One training step; its loss, detached: replayed from a CUDA graph where the plan is captured
        (:func:`ucmfh.captured_step.capture_steps`), else run eagerly."""
        if self.captured is None and self.capture:
            self.captured = CapturedStep(self.plan, self.cfg.batch_size, self.eager_step, self.device)
        return self.eager_step(batch) if self.captured is None else self.captured(batch)

    def eager_because(self) -> Optional[str]:
        """Why this run's step would run eagerly under :func:`ucmfh.captured_step.capture_steps`, or None: a
        capture needs a CUDA device, one process, a plan that can be (no rows streamed from a file) and full
        precision or TF32 (autocast's cache of cast weights would outlive a capture)."""
        plan, amp = self.plan, getattr(self.cfg, "amp", "none")
        if self.device.type != "cuda":
            return f"CUDA graphs need a CUDA device, and it trains on {self.device.type}"
        if not plan.graphable:
            return "its step is not one a graph can replay ('ucmfh methods' says why)"
        if self.ahead is not None:
            return "its rows are streamed from the file"
        if self.group.world_size > 1:
            return f"it runs in {self.group.world_size} processes"
        if amp == "bf16":
            return "it trains under bf16 autocast"
        return None

    def host_work(self, batch: Batch) -> Optional[torch.Tensor]:
        """A step's work on the host, done on :class:`ucmfh.batches.StepAhead`'s worker thread while the step
        before it runs: what it reads of a streamed split (``Plan.ahead``), and the plan's own draws, returned."""
        if self.ahead is not None:
            self.ahead(batch.index)
        return None if self.plan.draws is None else self.plan.draws(batch)

    def steps_ahead(self) -> int:
        """How many steps ahead the host works (:class:`ucmfh.batches.StepAhead`): one, but for a plan's own draws
        on a GPU (UCCH's negatives, a million a step), which bind a replayed step to the host: each step's are
        drawn by a generator of its own (``Plan.draws``), so several steps' on as many threads give the same
        numbers, :data:`DRAWS_AHEAD` at most and half the CPUs this process may use. A streamed split's reads
        stay one step ahead (its block cache holds what is read for the next step)."""
        if self.plan.draws is None or self.ahead is not None or self.device.type != "cuda":
            return 1
        return max(1, min(DRAWS_AHEAD, default_threads() // 2))

    def eager_step(self, batch: Batch) -> torch.Tensor:
        plan = self.plan
        if plan.step is not None:
            return plan.step(batch)
        plan.set_learning_rate(batch.epoch)
        loss = plan.loss(batch)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise ValueError(f"method {getattr(self.cfg, 'method', 'fusion')!r}: its plan's loss(batch) returns the "
                             "step's loss, a tensor of one number that gradients flow back from; it returned "
                             f"{_described(loss)}")
        return optimize(loss, plan.optimizer, self.group, plan.clip_norm)

    def stop(self, signum: Optional[int], epoch: int, done: int, steps: int, epoch_generator: torch.Tensor) -> None:
        """Save the state (if the run has one) and raise :class:`TrainingInterrupted`."""
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        where = f"{self.plan.name} interrupted by {name} at epoch {epoch + 1}/{self.cfg.epochs}, step {done}/{steps}"
        if self.state is None:
            raise TrainingInterrupted(f"{where}; nothing saved", None, signum)
        self.save(epoch, done, epoch_generator, self.at.total)
        raise TrainingInterrupted(f"{where}; training state saved to {self.state.path}", self.state.path, signum)

    def end_epoch(self, epoch: int, began: float) -> Dict[str, str]:
        """The epoch's mean loss and validation score recorded, the best epoch kept, the epoch reported to the
        logs listening (rank 0), with its training's seconds since ``began`` (``time.monotonic()``) counted to the
        read of its loss, which waits for the device's work (a GPU's steps run behind the host's); what the bar
        shows."""
        at, history, group, plan = self.at, self.history, self.group, self.plan
        history.append(at.total.item() / self.n)  # one sync per epoch
        if not math.isfinite(history[-1]):  # its weights are no longer numbers: every epoch after would be NaN
            raise ValueError(f"{plan.name}: the training loss is {history[-1]} at epoch {epoch + 1}: the training "
                             "diverged (its weights are no longer finite); a lower learning rate may help")
        seconds = time.monotonic() - began
        scalars = plan.scalars(epoch, at.iteration) if plan.scalars is not None else {}
        shown = {"loss": f"{history[-1]:.4f}", **{name: f"{value:.2f}" for name, value in scalars.items()}}
        score = None
        if plan.validate is not None:
            score = group.broadcast_float(plan.validate() if group.is_main else 0.0, self.device)
            history.validation.append([epoch + 1, score])
            shown["val"] = f"{score:.4f}"
            self.best.offer(epoch + 1, score, plan.modules)
        if group.is_main:
            record = EpochRecord(plan.name, current_part(), epoch + 1, history[-1], score,
                                 [g["lr"] for g in plan.optimizer.param_groups], scalars, seconds)
            for log in current_logs():
                log.record(record)
        return shown

    def epochs(self, progress: bool) -> History:
        """The epochs from where the run stands to its end (or its early stop)."""
        cfg, at, group, state, device = self.cfg, self.at, self.group, self.state, self.device
        start_epoch, last_save = at.epoch, time.monotonic()
        # captured where asked for (ucmfh.captured_step.capture_steps) and nothing is against it; what it
        # depends on (device, plan, precision, processes) is the run's own, so once, not at every step
        reason = self.eager_because() if capturing() else None
        self.capture = capturing() and reason is None
        if reason is not None and group.is_main:
            runs_eagerly(self.plan.name, reason)
        within = shown_part()  # a candidate's name and number, or refit: which of a run's fits this bar is
        bar = tqdm(total=cfg.epochs, initial=start_epoch, desc=self.plan.name + (f" ({within})" if within else ""),
                   unit="epoch", disable=not (progress and group.is_main))
        any_host_work = self.ahead is not None or self.plan.draws is not None
        # the bar closed before an interrupt is said, whose line would be glued to it
        shown: Dict[str, Any] = {}  # the last epoch's figures on the bar
        with contextlib.closing(bar), stop_on_signals() as stop, StepAhead(self.steps_ahead()) as ahead:
            for epoch in range(start_epoch, cfg.epochs):
                if at.epoch_generator is not None:  # replay the interrupted epoch's draws
                    self.generator.set_state(at.epoch_generator)
                    at.epoch_generator = None
                else:
                    at.total = torch.zeros((), device=device)
                epoch_generator, began = self.generator.get_state(), time.monotonic()
                batches = epoch_plan(self.n, cfg.batch_size, getattr(cfg, "modality_dropout", 0.0), self.generator,
                                     device, self.shuffle)
                for done, (index, separate) in enumerate(batches, 1):
                    if done <= at.skip:
                        continue
                    batch = Batch(index, separate, epoch, at.iteration)
                    if any_host_work:  # this step's, done while the steps before ran (else now); the next ones' begun
                        ready, drawn = ahead.take(batch.iteration)
                        for later in range(done, min(done + ahead.depth, len(batches))):
                            iteration = at.iteration + 1 + later - done
                            if not ahead.begun(iteration):  # after an epoch's first step, the farthest one alone
                                ahead.start(self.host_work, Batch(*batches[later], epoch, iteration))
                        drawn = drawn if ready else self.host_work(batch)
                        batch.draws = None if drawn is None else to_device(drawn, device)
                    with self.draws.active():  # its dropout from its own state, where runs are side by side
                        loss = self.step(batch)
                    at.total += loss * len(index)
                    at.iteration += 1
                    # a stop is one decision of every rank: a collective (and a host sync) every STOP_EVERY steps
                    shared = group.world_size == 1 or done % STOP_EVERY == 0 or done == len(batches)
                    if shared and group.any(stop["signal"] is not None, device):
                        self.stop(stop["signal"], epoch, done, len(batches), epoch_generator)
                    if done % STEP_SHOWN_EVERY == 0 and time.monotonic() - began > STEP_SHOWN_AFTER_S:
                        bar.set_postfix(**shown, step=f"{done}/{len(batches)}")  # a long epoch's steps: not 0/1 alone
                at.skip = 0
                ahead.wait()
                shown = self.end_epoch(epoch, began)
                bar.update(1)
                bar.set_postfix(**shown)
                if self.best.patience_spent(epoch + 1, cfg.patience):
                    break  # early stop: `patience` epochs without a better validation score
                due = state is not None and time.monotonic() - last_save >= state.interval_s  # rank 0's clock decides
                if state is not None and epoch + 1 < cfg.epochs and group.any(due and group.is_main, device):
                    self.save(epoch + 1, 0, self.generator.get_state(), torch.zeros((), device=device))
                    last_save = time.monotonic()
        self.captured = None  # its graph and the graph's memory let go now (it and this run refer to each other)
        if state is not None and start_epoch < cfg.epochs:  # finished: resuming returns the result at once
            self.save(cfg.epochs, 0, self.generator.get_state(), torch.zeros((), device=device))
        if group.any(stop["signal"] is not None, device):  # heard after the last step's look (validation, the save)
            name = signal.Signals(stop["signal"]).name if stop["signal"] else "a signal to another rank"
            saved = f"its training state saved to {state.path}" if state is not None else "nothing saved"
            raise TrainingInterrupted(f"{self.plan.name} interrupted by {name} as its training ended; {saved}",
                                      None if state is None else state.path, stop["signal"])
        self.best.restore(self.plan.modules, self.history)
        return self.history
