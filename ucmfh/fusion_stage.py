"""The fusion stage (UCMFH's task 0, docs/reference.md §3): the fusion encoder trained on ``data.train``
by a contrastive loss, a :class:`~ucmfh.trainer.Plan` run by :func:`ucmfh.trainer.fit`."""
from __future__ import annotations

import copy
from typing import Optional, Tuple

import torch

from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.config import FusionConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.evaluation import embeddings_of
from ucmfh.losses import build_loss
from ucmfh.models.fusion import FusionEncoder
from ucmfh.optim import adam
from ucmfh.selection import History, validator
from ucmfh.trainer import Batch, Plan, Setup, check_supervision, checked_training, fit
from ucmfh.training_state import StateFile
from ucmfh.utils import check_argument


def fit_fusion(
    data: Dataset,
    cfg: FusionConfig,
    fusion: Optional[FusionEncoder] = None,
    progress: bool = True,
    state: Optional[StateFile] = None,
) -> Tuple[FusionEncoder, History]:
    """Train the fusion encoder (task 0) on ``data.train``; returns it (on CPU) and its :class:`History`.

    With ``cfg.val_fraction`` > 0 a validation part of ``data.train`` is held out
    and the weights of the epoch with the best validation score are returned. ``fusion``: an encoder to go on
    training (a copy of it: the one given is left as it was, as :func:`ucmfh.fit_hashing` leaves its own).

    With ``state``, the run saves and (``state.resume``) continues its training
    state; interrupted by SIGINT/SIGTERM it raises :class:`TrainingInterrupted`.
    """
    check_argument("fit_fusion", "data", data, Dataset, "ucmfh.load_dataset(path)")
    check_argument("fit_fusion", "cfg", cfg, FusionConfig, "ucmfh.fusion_config(...)")
    check_argument("fit_fusion", "fusion", fusion, FusionEncoder, optional=True)
    data = checked_training("fit_fusion", data, fusion)
    check_supervision(data, cfg)

    def plan(setup: Setup) -> Plan:
        model = copy.deepcopy(fusion)  # it was trained in place, and returned as the model trained
        if model is None:
            model = FusionEncoder.from_config(data.d_img, data.d_txt, cfg)
            model.fit_feature_stats(setup.rest.img, setup.rest.txt)
        device = setup.device
        model.to(device).train()
        loss_fn = build_loss(cfg.loss, **cfg.loss_params).to(device)
        optimizer = adam([*model.parameters(), *loss_fn.parameters()], lr=cfg.lr, betas=tuple(cfg.betas))
        train = setup.rest.to(device)
        group = current_group()

        def loss(batch: Batch) -> torch.Tensor:
            img, txt, separate, ids, labels = batch_inputs(train, batch.index, batch.separate, cfg.supervised, group)
            with autocast(device, cfg.amp):
                z_img, z_txt = model(img, txt, separate)
            z_img, z_txt = group.gather((z_img.float(), z_txt.float()), len(batch.index))  # losses always in float32
            return loss_fn(z_img, z_txt, ids=ids, labels=labels)

        return Plan("fusion", model, {"fusion": model, "loss": loss_fn}, optimizer, train, loss=loss, graphable=True,
                    validate=validator(embeddings_of, "cosine", model, setup.val, setup.rest, device))

    return fit(plan, data.train, cfg, state, progress)
