"""Training as plain loops over in-memory tensors, resumable: the epoch loop every trained method
shares (:func:`run_epochs`), model selection on a validation split carved from the training split, and
the fusion stage (task 0, :func:`fit_fusion`). Each hashing method's fit is in :mod:`ucmfh.methods`.

A run given a :class:`StateFile` saves its whole training state (weights,
optimizer, random-number generators, position, loss history) atomically
every ``interval_s`` seconds at an epoch's end, at once when SIGINT or
SIGTERM arrives, and when it ends; the same call with ``resume=True`` continues
from it and ends with the same weights, codes and MAP as a run that was never
stopped (a finished state returns its result without training). The caller
removes the state (:func:`discard_state`) once it has saved the result.
"""
from __future__ import annotations

import contextlib
import glob
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ucmfh.config import FusionConfig, HashConfig, identity_dict
from ucmfh.data.h5 import Dataset, Split
from ucmfh.distributed import Group, current_group
from ucmfh.losses import build_loss
from ucmfh.models.fusion import FusionEncoder
from ucmfh.scoring import embed_split, encode_split, head_outputs_split, score_splits
from ucmfh.similarity import normalize, sign_codes
from ucmfh.files import atomic_file, temp_destination, torch_file_problem
from ucmfh.utils import resolve_device, seed_everything


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


def beta_at(cfg: HashConfig, iteration: int, epoch: int) -> float:
    """The tanh continuation scale β for a training step (docs/reference.md §5)."""
    if cfg.beta_schedule == "hashnet":
        return math.sqrt(1.0 + cfg.beta_gamma * (iteration // cfg.beta_step_iters) * cfg.beta_step_iters)
    if cfg.beta_schedule == "step":
        return math.sqrt(epoch // cfg.beta_step_epochs + 1)
    return 1.0


def relaxed_codes(logits: torch.Tensor, cfg: HashConfig, beta: float) -> torch.Tensor:
    """The codes a hashing loss sees, L2-normalised: ``tanh(β · logits)``, or with
    ``cfg.relaxation = 'sign'`` the ±1 codes themselves with tanh's gradient (straight-through), or
    with 'none' the logits themselves (a real-valued embedding)."""
    if cfg.relaxation == "none":
        return normalize(logits.float())
    relaxed = torch.tanh(beta * logits.float())
    if cfg.relaxation == "sign":
        relaxed = relaxed + (sign_codes(relaxed) - relaxed).detach()
    return normalize(relaxed)


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
    index = torch.cat(chunks).to(device).split(sizes)
    if p_separate <= 0:
        return [(i, None) for i in index]
    draws = torch.cat([torch.rand(k, generator=generator) for k in sizes])
    return list(zip(index, (draws < p_separate).to(device).split(sizes)))


def autocast(device: torch.device, amp: str) -> ContextManager:
    """The training forward pass's precision: ``bf16`` autocasts matmuls to bfloat16, ``none`` does nothing."""
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def adam(params: Iterable, **kwargs) -> torch.optim.Adam:
    """Adam with its fused kernel where this torch has one for the parameters' device (same update rule)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, **kwargs)


def check_supervision(data: Dataset, cfg: Any) -> None:
    if cfg.supervised and data.caption_set:
        raise ValueError(f"{data.path or 'the dataset'}: supervised training needs labels; this caption set has "
                         "none (its ids already make the captions of one image positives of each other)")


def batch_inputs(split: Split, index: torch.Tensor, separate: Optional[torch.Tensor], supervised: bool,
           group: Group) -> Tuple[Optional[torch.Tensor], ...]:
    """A step's inputs: the features (and modality-dropout draws) of this rank's part of the global
    batch ``index`` (all of it on one process), the ids and labels of the whole global batch."""
    ids = None if split.ids is None else split.ids[index]
    labels = split.labels[index] if supervised else None
    local = group.local(index)
    return split.img[local], split.txt[local], None if separate is None else group.local(separate), ids, labels


def optimize(loss: torch.Tensor, optimizer: torch.optim.Optimizer, group: Group) -> torch.Tensor:
    """One optimisation step on ``loss``, its gradients averaged over the ranks; returns the loss, detached."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    group.average_gradients(p for g in optimizer.param_groups for p in g["params"])
    optimizer.step()
    return loss.detach()


# ------------------------------------------------------------ model selection


class History(list):
    """The mean training loss of each epoch; with a validation split also ``validation``
    (``[epoch, score]`` after each epoch) and ``best_epoch``, whose weights the model keeps.
    A run that chose among candidate settings on validation (:func:`ucmfh.methods.choose`) also
    records ``chosen``, the one kept, and ``choice_scores``, each candidate's best validation score."""

    def __init__(self, losses: Iterable[float] = (), validation: Optional[List[List[float]]] = None,
                 best_epoch: Optional[int] = None) -> None:
        super().__init__(losses)
        self.validation = list(validation or [])
        self.best_epoch = best_epoch
        self.chosen: Optional[str] = None  # a run that chose on validation: the candidate kept
        self.choice_scores: Dict[str, float] = {}  # ... and each candidate's best validation score

    @property
    def best_score(self) -> float:
        """The validation score of the kept epoch (-inf without a validation split)."""
        return dict(self.validation).get(self.best_epoch, -math.inf)

    def as_dict(self) -> Dict[str, Any]:
        out = {"loss": list(self), "validation": self.validation, "best_epoch": self.best_epoch}
        if self.chosen is not None:
            out.update(chosen=self.chosen, choice_scores=self.choice_scores)
        return out


def validation_items(keys: np.ndarray, fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(rest, validation)`` item indices: a seeded share of the units (distinct ``keys``: the ids, or
    the items themselves) held out for model selection; items of one unit go to the same side."""
    units = np.unique(keys)
    n_val = max(1, int(round(fraction * len(units))))
    if len(units) - n_val < 2:
        raise ValueError(f"val_fraction {fraction} of {len(units)} training units leaves fewer than 2 to train on")
    held = np.random.default_rng(seed).choice(units, size=n_val, replace=False)
    member = np.isin(keys, held)
    return np.flatnonzero(~member), np.flatnonzero(member)


def validation_split(split: Split, fraction: float, seed: int) -> Tuple[Split, Optional[Split]]:
    """``(rest, validation)``: a seeded share of a training split held out for model selection
    (:func:`validation_items`; the captions of one image go to the same side). ``fraction = 0``
    returns the split whole and no validation part.
    """
    if fraction <= 0:
        return split, None
    keys = np.arange(len(split)) if split.ids is None else split.ids.numpy()  # the unit of each item
    rest, val = validation_items(keys, fraction, seed)
    return split.subset(torch.from_numpy(rest)), split.subset(torch.from_numpy(val))


# the most validation queries and database items scored after each epoch: evenly spaced ones
# beyond (a large training split would make validation cost as much as training)
VALIDATION_QUERIES, VALIDATION_DATABASE = 5_000, 50_000


def _spread(split: Split, most: int) -> Split:
    if len(split) <= most:
        return split
    return split.subset(torch.from_numpy(np.linspace(0, len(split) - 1, most).round().astype(np.int64)))


def _in_memory(split: Split) -> Split:
    return replace(split, img=split.img[:], txt=split.txt[:]) if split.streamed else split


def validation_view(cfg: HashConfig) -> Tuple[Callable, str]:
    """What a hashing stage's validation ranks: the codes by Hamming distance, or the head outputs
    by cosine with ``relaxation = 'none'`` (what that training learns)."""
    return (head_outputs_split, "cosine") if cfg.relaxation == "none" else (encode_split, "hamming")


def validator(encode: Callable, ranking: str, model: nn.Module, val: Optional[Split], rest: Split,
              device: torch.device) -> Optional[Callable[[], float]]:
    """The validation score of ``model``: mean of both directions' unimodal MAP@50 (by id on a
    caption set), the validation items against the rest of the training split (at most
    ``VALIDATION_QUERIES`` and ``VALIDATION_DATABASE`` of them, evenly spaced)."""
    if val is None:
        return None
    # read once, into memory (at most VALIDATION_QUERIES + VALIDATION_DATABASE items): a streamed
    # split's validation items are spread through the file, and would be read again every epoch
    val, rest = _in_memory(_spread(val, VALIDATION_QUERIES)), _in_memory(_spread(rest, VALIDATION_DATABASE))
    data = Dataset(train=rest, query=val, retrieval=rest)

    def validate() -> float:
        query, retrieval = encode(model, val, "unimodal", device), encode(model, rest, "unimodal", device)
        model.train()
        rows = score_splits(query, retrieval, data, 50, ranking)
        return sum(r["map_i2t"] + r["map_t2i"] for r in rows) / (2 * len(rows))

    return validate


# ------------------------------------------------------------ training state

STATE_FORMAT = "ucmfh-training-state"


@dataclass
class StateFile:
    """Where a training run keeps its state, how often, and whether to continue from it.

    ``interval_s``: seconds between periodic saves, each at an epoch's end
    (0: after every epoch). SIGINT and SIGTERM save at once, after the step
    in progress. ``resume``: continue from the state at ``path`` if there is
    one (a missing file starts from the beginning).
    """

    path: str
    interval_s: float = 120.0
    resume: bool = False

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {self.interval_s}")


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal; ``state_path`` holds its saved state (or None)."""

    def __init__(self, message: str, state_path: Optional[str]) -> None:
        super().__init__(message)
        self.state_path = state_path


def read_state(path: str, device: torch.device) -> Dict[str, Any]:
    """A saved training state, checked to be one."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # torch raises several types for a damaged file
        raise ValueError(f"{path}: not a readable training state ({torch_file_problem(path, err)})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: not a ucmfh training state")
    return state


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Dict[str, Optional[int]]]:
    """While training (or another long loop that commits its work step by step, as an index build does),
    SIGINT and SIGTERM set ``flag["signal"]`` instead of killing the step in progress; the loop stops at its
    next safe point. (A KeyboardInterrupt could land anywhere, even in a callback that swallows it.)"""
    flag: Dict[str, Optional[int]] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_epochs(
    stage: str,
    cfg: Any,
    modules: Dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    n: int,
    device: torch.device,
    step: Callable[[torch.Tensor, Optional[torch.Tensor], int, int], torch.Tensor],
    state: Optional[StateFile],
    progress: bool,
    postfix: Callable[[int, int], Dict[str, str]] = lambda epoch, iteration: {},
    validate: Optional[Callable[[], float]] = None,
    shuffle: Optional[Shuffle] = None,
) -> History:
    """The epoch loop both stages share; returns its :class:`History`.

    ``step(index, separate, epoch, iteration)`` does one optimisation step and
    returns its (detached) loss; ``validate()``, when given, scores the model
    after each epoch, and the best epoch's weights are loaded at the end;
    ``shuffle`` orders each epoch's items (:func:`batches`).
    Everything that decides what comes next — the modules and optimizer, the
    batch generator's state at the epoch's start, torch's own generators
    (dropout), the position, the running loss, the validation record and the
    best weights so far — is saved and restored, so a resumed run replays the
    rest of the run exactly.

    On several ranks (:mod:`ucmfh.distributed`) every rank runs this loop over the same global
    batches; rank 0 alone validates (its score is shared), writes the state and shows progress,
    and decisions (stop on a signal, save now) are taken by all ranks together.
    """
    group = current_group()
    group.broadcast_modules(modules.values())
    if group.rank:  # dropout masks of its own on each rank; rank 0 draws what one process would
        torch.manual_seed(cfg.seed + 7919 * group.rank)
    identity = identity_dict(cfg)
    history = History()
    best: Dict[str, Any] = {"score": -math.inf, "epoch": None, "weights": None}
    start_epoch, skip, iteration = 0, 0, 0
    total = torch.zeros((), device=device)
    resumed_gen = None
    if state is not None and state.resume and os.path.exists(state.path):
        saved = read_state(state.path, device)
        if saved["stage"] != stage or saved["config"] != identity:
            differ = sorted(k for k in set(saved["config"]) | set(identity)
                            if saved["config"].get(k) != identity.get(k))
            raise ValueError(f"{state.path}: saved by another {saved['stage']} run "
                             f"(settings that differ: {differ or 'stage'}); not resumed")
        if saved.get("world_size", 1) != group.world_size:
            raise ValueError(f"{state.path}: saved by a run on {saved.get('world_size', 1)} process(es), not "
                             f"{group.world_size}; resume it with the same number of processes")
        for name, module in modules.items():
            module.load_state_dict(saved["modules"][name])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch, skip, iteration = saved["epoch"], saved["step"], saved["iteration"]
        history = History(saved["history"], saved["validation"])
        best = saved["best"]
        total = saved["total"].to(device)
        resumed_gen = saved["generator"].cpu()
        rngs = saved["rng"]
        if isinstance(rngs, torch.Tensor):  # a state saved before runs had ranks
            rngs = [(rngs, saved.get("cuda_rng"))]
        rng, cuda_rng = rngs[group.rank]
        torch.set_rng_state(rng.cpu())
        restore_cuda_rng(cuda_rng, device)

    def save(epoch: int, done: int, epoch_start_gen: torch.Tensor, epoch_total: torch.Tensor) -> None:
        """Write the training state (rank 0; every rank calls it, for its random-number state)."""
        rngs = group.gather_objects(
            (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None))
        if group.is_main:
            payload = {
                "format": STATE_FORMAT, "stage": stage, "config": identity, "world_size": group.world_size,
                "epoch": epoch, "step": done, "iteration": iteration, "history": list(history),
                "validation": history.validation, "best": best, "total": epoch_total.detach(),
                "modules": {name: m.state_dict() for name, m in modules.items()},
                "optimizer": optimizer.state_dict(), "generator": epoch_start_gen, "rng": rngs,
            }
            with atomic_file(state.path) as tmp:
                torch.save(payload, tmp)
        group.barrier()  # no rank goes on (or exits) before the state is written

    last_save = time.monotonic()
    bar = tqdm(total=cfg.epochs, initial=start_epoch, desc=stage, unit="epoch",
               disable=not (progress and group.is_main))
    with stop_on_signals() as stop:
        for epoch in range(start_epoch, cfg.epochs):
            if resumed_gen is not None:  # replay the interrupted epoch's draws
                generator.set_state(resumed_gen)
                resumed_gen = None
            else:
                total = torch.zeros((), device=device)
            epoch_start_gen = generator.get_state()
            plan = epoch_plan(n, cfg.batch_size, getattr(cfg, "modality_dropout", 0.0), generator, device, shuffle)
            for done, (index, separate) in enumerate(plan, 1):
                if done <= skip:
                    continue
                total += step(index, separate, epoch, iteration) * len(index)
                iteration += 1
                # a stop is one decision of every rank: a collective (and a host sync) every STOP_EVERY steps
                shared = group.world_size == 1 or done % STOP_EVERY == 0 or done == len(plan)
                if shared and group.any(stop["signal"] is not None, device):
                    name = signal.Signals(stop["signal"]).name if stop["signal"] else "a signal to another rank"
                    where = f"{stage} interrupted by {name} at epoch {epoch + 1}/{cfg.epochs}, step {done}/{len(plan)}"
                    if state is None:
                        raise TrainingInterrupted(f"{where}; nothing saved", None)
                    save(epoch, done, epoch_start_gen, total)
                    raise TrainingInterrupted(f"{where}; training state saved to {state.path}", state.path)
            skip = 0
            history.append(total.item() / n)  # one sync per epoch
            shown = {"loss": f"{history[-1]:.4f}", **postfix(epoch, iteration)}
            if validate is not None:
                score = group.broadcast_float(validate() if group.is_main else 0.0, device)
                history.validation.append([epoch + 1, score])
                shown["val"] = f"{score:.4f}"
                if score > best["score"]:
                    weights = {name: {k: v.detach().clone() for k, v in m.state_dict().items()}
                               for name, m in modules.items()}
                    best = {"score": score, "epoch": epoch + 1, "weights": weights}
            bar.update(1)
            bar.set_postfix(**shown)
            if cfg.patience and best["epoch"] is not None and epoch + 1 - best["epoch"] >= cfg.patience:
                break  # early stop: `patience` epochs without a better validation score
            due = state is not None and time.monotonic() - last_save >= state.interval_s  # rank 0's clock decides
            if state is not None and epoch + 1 < cfg.epochs and group.any(due and group.is_main, device):
                save(epoch + 1, 0, generator.get_state(), torch.zeros((), device=device))
                last_save = time.monotonic()
    bar.close()
    if state is not None and start_epoch < cfg.epochs:  # finished: resuming returns the result at once
        save(cfg.epochs, 0, generator.get_state(), torch.zeros((), device=device))
    if best["weights"] is not None:  # keep the best validation epoch
        for name, module in modules.items():
            module.load_state_dict(best["weights"][name])
        history.best_epoch = best["epoch"]
    return history


# Under torchrun the ranks decide together whether to stop (a signal may reach one rank only), at
# every STOP_EVERY-th step and an epoch's last: one collective per step would stall a GPU every step.
STOP_EVERY = 16


def restore_cuda_rng(saved: Any, device: torch.device) -> None:
    """Restore the training device's CUDA generator (the one that drives dropout) from a saved state: a
    tensor, that device's; a list (states saved before 2026-11-26 held every visible GPU's) is indexed
    by the device, and an entry the list does not have (another number of GPUs) is left as it is."""
    if device.type != "cuda" or saved is None:
        return
    if isinstance(saved, (list, tuple)):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(saved):
            return
        saved = saved[index]
    torch.cuda.set_rng_state(saved.cpu(), device)


def candidate_path(path: str, candidate: str) -> str:
    """Where the candidate ``candidate`` of a run that chooses on validation
    (:meth:`ucmfh.methods.Method.choices`) keeps its training state: ``hash64.state.pt`` ->
    ``hash64.sign.state.pt``."""
    head, tail = os.path.split(path)
    stem, dot, rest = tail.partition(".")
    return os.path.join(head, f"{stem}.{candidate}{dot}{rest}")


def candidate_name(path: str, candidate_state: str) -> str:
    """The candidate whose state :func:`candidate_path` put at ``candidate_state``."""
    stem, dot, rest = os.path.basename(path).partition(".")
    return os.path.basename(candidate_state)[len(stem) + 1: -len(dot + rest)]


def state_paths(path: str) -> List[str]:
    """Every file a run with its state at ``path`` may have saved: its own and its candidates'."""
    head, tail = os.path.split(path)
    stem, dot, rest = tail.partition(".")
    name = f"{glob.escape(stem)}.*{glob.escape(dot + rest)}"
    found = set(glob.glob(os.path.join(glob.escape(head), name)))
    for temp in glob.glob(os.path.join(glob.escape(head), f".{name}.tmp*")):  # a candidate's first save, unfinished
        destination = temp_destination(temp)
        if destination is not None:
            found.add(os.path.join(head, destination))
    return [path, *sorted(found - {path})]


def discard_state(state: Optional[StateFile]) -> None:
    """Remove a finished run's training state, its candidates' too (call once its result is saved)."""
    if state is None:
        return
    for path in state_paths(state.path):
        if os.path.exists(path):
            os.remove(path)


# ------------------------------------------------------------------ the stages


def fit_fusion(
    data: Dataset,
    cfg: FusionConfig,
    fusion: Optional[FusionEncoder] = None,
    progress: bool = True,
    state: Optional[StateFile] = None,
) -> Tuple[FusionEncoder, History]:
    """Train the fusion encoder (task 0) on ``data.train``; returns it (on CPU) and its :class:`History`.

    With ``cfg.val_fraction`` > 0 a validation part of ``data.train`` is held out
    and the weights of the epoch with the best validation score are returned.

    With ``state``, the run saves and (``state.resume``) continues its training
    state; interrupted by SIGINT/SIGTERM it raises :class:`TrainingInterrupted`.
    """
    check_supervision(data, cfg)
    device = resolve_device(cfg.device)
    generator = seed_everything(cfg.seed)
    rest, val = validation_split(data.train, cfg.val_fraction, cfg.seed)
    if fusion is None:
        fusion = FusionEncoder(data.d_img, data.d_txt, cfg)
        fusion.fit_feature_stats(rest.img, rest.txt)
    fusion.to(device).train()
    loss_fn = build_loss(cfg.loss, **cfg.loss_params).to(device)
    optimizer = adam([*fusion.parameters(), *loss_fn.parameters()], lr=cfg.lr, betas=tuple(cfg.betas))
    train = rest.to(device)

    group = current_group()

    def step(index: torch.Tensor, separate: Optional[torch.Tensor], epoch: int, iteration: int) -> torch.Tensor:
        img, txt, separate, ids, labels = batch_inputs(train, index, separate, cfg.supervised, group)
        with autocast(device, cfg.amp):
            z_img, z_txt = fusion(img, txt, separate)
        z_img, z_txt = group.gather((z_img.float(), z_txt.float()), len(index))  # losses always in float32
        return optimize(loss_fn(z_img, z_txt, ids=ids, labels=labels), optimizer, group)

    modules = {"fusion": fusion, "loss": loss_fn}
    history = run_epochs("fusion", cfg, modules, optimizer, generator, len(train), device, step, state, progress,
                          validate=validator(embed_split, "cosine", fusion, val, rest, device), shuffle=train.shuffle)
    return fusion.cpu().eval(), history
