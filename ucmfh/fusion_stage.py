"""The fusion stage (UCMFH's task 0, docs/reference.md §3): the fusion encoder trained on ``data.train``
by a contrastive loss, through the shared epoch loop (:func:`ucmfh.epochs.run_epochs`)."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ucmfh.config import FusionConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.epochs import StateFile, run_epochs
from ucmfh.losses import build_loss
from ucmfh.models.fusion import FusionEncoder
from ucmfh.evaluation import embed_split
from ucmfh.selection import History, validation_split, validator
from ucmfh.step import batch_inputs, split_ahead
from ucmfh.amp import autocast
from ucmfh.optim import adam, optimize
from ucmfh.utils import resolve_device, seed_everything


def check_supervision(data: Dataset, cfg: Any) -> None:
    if cfg.supervised and data.caption_set:
        raise ValueError(f"{data.path or 'the dataset'}: supervised training needs labels; this caption set has "
                         "none (its ids already make the captions of one image positives of each other)")


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
                          validate=validator(embed_split, "cosine", fusion, val, rest, device), shuffle=train.shuffle,
                          ahead=split_ahead(train, group))
    return fusion.cpu().eval(), history
