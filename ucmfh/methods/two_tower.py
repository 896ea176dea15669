"""Method 'two-tower': one hash head per modality on its own features, trained with a cross-modal loss."""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import torch

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.losses import build_loss, soft_infonce
from ucmfh.losses.distill import distill_targets, fused_embedding
from ucmfh.methods.base import Method
from ucmfh.methods.registry import METHODS, register
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import FeatureHasher
from ucmfh.evaluation import embed_split
from ucmfh.epochs import StateFile, run_epochs
from ucmfh.models.relaxation import beta_at, relaxed_codes
from ucmfh.selection import History, validation_view, validator
from ucmfh.step import batch_inputs, split_ahead
from ucmfh.amp import autocast
from ucmfh.optim import adam, optimize


@register
class TwoTower(Method):
    """One hash head per modality on its own (centred, L2-normalised) features, trained with ``cfg.loss``
    on the codes of each pair (:func:`ucmfh.models.relaxation.relaxed_codes`); ids (the captions of one image) are
    positives of each other in every loss. Its defaults were chosen on the validation split of the
    training data (docs/quality.md), never on a query split; InfoNCE's temperature is chosen per run on
    that split among ``temperatures`` (unless ``loss_params`` names one): a low temperature wins on
    caption sets (flickr8k), the higher one on small labelled sets (wiki, MIRFlickr)."""

    name = "two-tower"
    description = "one hash head per modality on its own features, trained with the loss on their relaxed codes"
    defaults = {"hidden": 4096, "loss": "infonce", "loss_params": {}, "relaxation": "sign",
                "val_fraction": 0.1, "patience": 10}
    params = {"temperatures": "0.3,0.1"}  # InfoNCE temperatures tried side by side, the best on validation kept
    takes_relaxation = True

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        self.temperatures(cfg)

    def temperatures(self, cfg: HashConfig) -> Tuple[float, ...]:
        """The ``temperatures`` parameter as numbers (a ``ValueError`` naming it if it is not); none for a
        subclass without the parameter."""
        if "temperatures" not in self.params:
            return ()
        text = self.method_params(cfg.method_params)["temperatures"]
        try:
            values = tuple(float(t) for t in text.split(","))
        except ValueError:
            values = ()
        if not values or not all(0 < v < math.inf for v in values):
            raise ValueError(f"method {self.name!r}: parameter 'temperatures' must be positive numbers separated "
                             f"by commas, like its default '0.3,0.1', got {text!r}")
        return values

    def choices(self, cfg: HashConfig) -> Dict[str, HashConfig]:
        """Relaxation 'auto''s candidates (if asked), each with every temperature of ``temperatures``
        where the loss is InfoNCE and ``loss_params`` names no temperature: ``t0.3``, ``sign-t0.1``."""
        temperatures = self.temperatures(cfg)
        if not temperatures or cfg.loss != "infonce" or "temperature" in cfg.loss_params:
            return super().choices(cfg)
        out = {}
        for t in temperatures:
            for name, c in (super().choices(cfg) or {"": cfg}).items():
                params = {**c.loss_params, "temperature": t}
                out["-".join(filter(None, (name, f"t{t:g}")))] = dataclasses.replace(c, loss_params=params)
        return out

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        return FeatureHasher(d_img, d_txt, cfg)

    def fit(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None, progress: bool = True,
            state: Optional[StateFile] = None) -> Tuple[FeatureHasher, History]:
        return fit_feature_hasher(data, cfg, None, progress, state)


def fit_feature_hasher(
    data: Dataset, cfg: HashConfig, teacher: Optional[FusionEncoder], progress: bool, state: Optional[StateFile],
) -> Tuple[FeatureHasher, History]:
    """Train a :class:`FeatureHasher` on ``cfg.loss``; with a ``teacher`` fusion encoder, on
    :func:`soft_infonce` against :func:`distill_targets` of its fused embeddings (method 'distill')."""
    device, generator, rest, val, model = METHODS[cfg.method].prepare(data, cfg)
    model.to(device).train()
    loss_fn = build_loss(cfg.loss, **cfg.loss_params).to(device)
    optimizer = adam([*model.parameters(), *loss_fn.parameters()], lr=cfg.lr_head, betas=tuple(cfg.betas))
    train = rest.to(device)
    fused = None  # the teacher's fused embedding of each training item, computed once (in memory)
    if teacher is not None and not train.streamed:
        fused = fused_embedding(*embed_split(teacher, rest, "fused", device))
    elif teacher is not None:  # streamed: each batch's, when it comes
        teacher.to(device).eval()
    group = current_group()

    def step(index: torch.Tensor, separate: Optional[torch.Tensor], epoch: int, iteration: int) -> torch.Tensor:
        beta = beta_at(cfg, iteration, epoch)
        img, txt, _, ids, labels = batch_inputs(train, index, None, cfg.supervised, group)
        with autocast(device, cfg.amp):
            h_img, h_txt = model.logits(img, txt)
        h_img, h_txt = group.gather((h_img.float(), h_txt.float()), len(index))
        codes_img, codes_txt = relaxed_codes(h_img, cfg, beta), relaxed_codes(h_txt, cfg, beta)
        if teacher is None:
            loss = loss_fn(codes_img, codes_txt, ids=ids, labels=labels)
        else:
            if fused is not None:
                t = fused[index]
            else:
                with torch.no_grad():
                    t = group.gather((fused_embedding(*teacher.embed(img, txt, "fused")),), len(index))[0]
            targets = distill_targets(t, ids, cfg.teacher_weight, cfg.teacher_temperature)
            loss = soft_infonce(codes_img, codes_txt, targets, float(loss_fn.temperature))
        return optimize(loss, optimizer, group)

    history = run_epochs(
        f"{cfg.method} {cfg.n_bits} bits", cfg, {"model": model, "loss": loss_fn}, optimizer, generator, len(train),
        device, step, state, progress, postfix=lambda epoch, iteration: {"beta": f"{beta_at(cfg, iteration, epoch):.2f}"},
        validate=validator(*validation_view(cfg), model, val, rest, device), shuffle=train.shuffle,
        ahead=split_ahead(train, group),
    )
    return model.cpu().eval(), history
