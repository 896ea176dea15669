"""The two training stages as plain loops over in-memory tensors."""
from __future__ import annotations

import math
from typing import Iterator, List, Optional, Tuple

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


def _separate(n: int, p: float, generator: torch.Generator, device: torch.device) -> Optional[torch.Tensor]:
    """Which items of a batch train with their modalities kept apart (modality dropout)."""
    if p <= 0:
        return None
    return (torch.rand(n, generator=generator) < p).to(device)


def _batch(split: Split, index: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    index = index.to(split.img.device)
    ids = None if split.ids is None else split.ids[index]
    return split.img[index], split.txt[index], ids


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
    optimizer = torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas))
    train = data.train.to(device)
    history: List[float] = []
    bar = tqdm(range(cfg.epochs), desc="fusion", unit="epoch", disable=not progress)
    for _ in bar:
        total = torch.zeros((), device=device)
        for index in batches(len(train), cfg.batch_size, generator):
            img, txt, ids = _batch(train, index)
            z_img, z_txt = fusion(img, txt, _separate(len(index), cfg.modality_dropout, generator, device))
            loss = loss_fn(z_img, z_txt, ids=ids)
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
    """Train hash heads and fine-tune the fusion encoder (task 1).

    Loss = loss(fused img, fused txt) + code_weight · loss(img codes, txt codes),
    codes relaxed as L2-normalised ``tanh(β · logits)``.
    """
    cfg.validate()
    device = resolve_device(cfg.device)
    generator = seed_everything(cfg.seed)
    model = CrossModalHasher(fusion, cfg).to(device).train()
    fusion_loss = build_loss(cfg.loss, **cfg.loss_params).to(device)
    code_loss = build_loss(cfg.loss, **cfg.loss_params).to(device)
    head_params = [*model.img_head.parameters(), *model.txt_head.parameters(),
                   *fusion_loss.parameters(), *code_loss.parameters()]
    optimizer = torch.optim.Adam(
        [{"params": model.fusion.parameters(), "lr": cfg.lr_fusion}, {"params": head_params, "lr": cfg.lr_head}],
        betas=tuple(cfg.betas),
    )
    train = data.train.to(device)
    history: List[float] = []
    iteration = 0
    bar = tqdm(range(cfg.epochs), desc=f"hashing {cfg.n_bits} bits", unit="epoch", disable=not progress)
    for epoch in bar:
        total = torch.zeros((), device=device)
        for index in batches(len(train), cfg.batch_size, generator):
            beta = beta_at(cfg, iteration, epoch)
            img, txt, ids = _batch(train, index)
            z_img, z_txt = model.fusion(img, txt, _separate(len(index), cfg.modality_dropout, generator, device))
            h_img, h_txt = model.logits(z_img, z_txt)
            codes_img, codes_txt = normalize(torch.tanh(beta * h_img)), normalize(torch.tanh(beta * h_txt))
            loss = fusion_loss(z_img, z_txt, ids=ids) + cfg.code_weight * code_loss(codes_img, codes_txt, ids=ids)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(index)
            iteration += 1
        history.append(total.item() / len(train))
        bar.set_postfix(loss=f"{history[-1]:.4f}", beta=f"{beta:.2f}")
    return model.cpu().eval(), history
