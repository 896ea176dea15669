"""The two training stages as plain loops over in-memory tensors."""
from __future__ import annotations

import contextlib
import copy
import math
from typing import ContextManager, Iterable, Iterator, List, Optional, Tuple

import torch
from tqdm.auto import tqdm

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.losses import build_loss
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.similarity import normalize
from ucmfh.utils import resolve_device, seed_everything


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """A shuffled pass over ``range(n)`` in batches; every item is used once.

    The last partial batch is kept (UCMFH's defect 3); a last batch of one
    item, which has no negative, joins the batch before it.
    """
    if n < 2:
        raise ValueError(f"training needs at least 2 items, got {n}")
    chunks = list(torch.randperm(n, generator=generator).split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) == 1:
        last = chunks.pop()
        chunks[-1] = torch.cat([chunks[-1], last])
    return iter(chunks)


def beta_at(cfg: HashConfig, iteration: int, epoch: int) -> float:
    """The tanh continuation scale β for a training step (REFERENCE §5)."""
    if cfg.beta_schedule == "hashnet":
        return math.sqrt(1.0 + cfg.beta_gamma * (iteration // cfg.beta_step_iters) * cfg.beta_step_iters)
    if cfg.beta_schedule == "step":
        return math.sqrt(epoch // cfg.beta_step_epochs + 1)
    return 1.0


def epoch_plan(
    n: int, batch_size: int, p_separate: float, generator: torch.Generator, device: torch.device
) -> List[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """One epoch's batches (item indices) and modality-dropout draws, already on ``device``.

    Drawn from the CPU generator in the order a per-step loop would draw them
    (the shuffle, then one ``rand`` per batch), so the run is the same; but
    each goes to the device in one copy per epoch instead of two per step,
    each of which would make the host wait for the GPU.
    """
    chunks = list(batches(n, batch_size, generator))
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


def _batch(split: Split, index: torch.Tensor, supervised: bool) -> Tuple[torch.Tensor, ...]:
    ids = None if split.ids is None else split.ids[index]
    labels = split.labels[index] if supervised else None
    return split.img[index], split.txt[index], ids, labels


def fit_fusion(
    data: Dataset,
    cfg: FusionConfig,
    fusion: Optional[FusionEncoder] = None,
    progress: bool = True,
) -> Tuple[FusionEncoder, List[float]]:
    """Train the fusion encoder (task 0) on ``data.train``; returns it (on CPU) and the mean loss per epoch."""
    cfg.validate()
    device = resolve_device(cfg.device)
    generator = seed_everything(cfg.seed)
    if fusion is None:
        fusion = FusionEncoder(data.d_img, data.d_txt, cfg)
        fusion.fit_feature_stats(data.train.img, data.train.txt)
    fusion.to(device).train()
    loss_fn = build_loss(cfg.loss, **cfg.loss_params).to(device)
    params = list(fusion.parameters()) + list(loss_fn.parameters())
    optimizer = adam(params, lr=cfg.lr, betas=tuple(cfg.betas))
    train = data.train.to(device)
    history: List[float] = []
    bar = tqdm(range(cfg.epochs), desc="fusion", unit="epoch", disable=not progress)
    for _ in bar:
        total = torch.zeros((), device=device)
        for index, separate in epoch_plan(len(train), cfg.batch_size, cfg.modality_dropout, generator, device):
            img, txt, ids, labels = _batch(train, index, cfg.supervised)
            with autocast(device, cfg.amp):
                z_img, z_txt = fusion(img, txt, separate)
            loss = loss_fn(z_img.float(), z_txt.float(), ids=ids, labels=labels)  # losses always in float32
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(index)
        history.append(total.item() / len(train))  # one sync per epoch
        bar.set_postfix(loss=f"{history[-1]:.4f}")
    return fusion.cpu().eval(), history


def fit_hashing(
    data: Dataset,
    cfg: HashConfig,
    fusion: FusionEncoder,
    progress: bool = True,
) -> Tuple[CrossModalHasher, List[float]]:
    """Train hash heads and fine-tune the fusion encoder (task 1; ``cfg.lr_fusion = 0`` keeps it fixed).

    Loss = loss(fused img, fused txt) + code_weight · loss(img codes, txt codes),
    codes relaxed as L2-normalised ``tanh(β · logits)``.
    """
    cfg.validate()
    device = resolve_device(cfg.device)
    generator = seed_everything(cfg.seed)
    # a copy: the caller's encoder stays as it was (e.g. one fusion stage serving several n_bits)
    model = CrossModalHasher(copy.deepcopy(fusion), cfg).to(device).train()
    fusion_loss = build_loss(cfg.loss, **cfg.loss_params).to(device)
    code_loss = build_loss(cfg.loss, **cfg.loss_params).to(device)
    head_params = [*model.img_head.parameters(), *model.txt_head.parameters(),
                   *fusion_loss.parameters(), *code_loss.parameters()]
    groups = [{"params": head_params, "lr": cfg.lr_head}]
    if cfg.lr_fusion > 0:
        groups.insert(0, {"params": list(model.fusion.parameters()), "lr": cfg.lr_fusion})
    else:  # lr_fusion = 0 keeps the encoder as trained: no gradients through it
        model.fusion.requires_grad_(False)
    optimizer = adam(groups, betas=tuple(cfg.betas))
    train = data.train.to(device)
    history: List[float] = []
    iteration = 0
    bar = tqdm(range(cfg.epochs), desc=f"hashing {cfg.n_bits} bits", unit="epoch", disable=not progress)
    for epoch in bar:
        total = torch.zeros((), device=device)
        for index, separate in epoch_plan(len(train), cfg.batch_size, cfg.modality_dropout, generator, device):
            beta = beta_at(cfg, iteration, epoch)
            img, txt, ids, labels = _batch(train, index, cfg.supervised)
            with autocast(device, cfg.amp):
                z_img, z_txt = model.fusion(img, txt, separate)
                h_img, h_txt = model.logits(z_img, z_txt)
            # codes and losses always in float32: bf16's 8-bit mantissa would blur tanh near ±1
            z_img, z_txt, h_img, h_txt = z_img.float(), z_txt.float(), h_img.float(), h_txt.float()
            codes_img, codes_txt = normalize(torch.tanh(beta * h_img)), normalize(torch.tanh(beta * h_txt))
            loss = (fusion_loss(z_img, z_txt, ids=ids, labels=labels)
                    + cfg.code_weight * code_loss(codes_img, codes_txt, ids=ids, labels=labels))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(index)
            iteration += 1
        history.append(total.item() / len(train))
        bar.set_postfix(loss=f"{history[-1]:.4f}", beta=f"{beta:.2f}")
    return model.cpu().eval(), history
