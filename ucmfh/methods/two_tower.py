"""Method 'two-tower': one hash head per modality on its own features, trained with a cross-modal loss."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import torch
from torch import nn

from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.distributed import current_group
from ucmfh.losses import build_loss
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.models.hashing import FeatureHasher
from ucmfh.models.relaxation import beta_scalars, relaxed_codes, step_beta
from ucmfh.optim import adam
from ucmfh.selection import validation_view, validator
from ucmfh.trainer import Batch, Plan, Setup


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
    graphable = True

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        self.temperatures(cfg)
        if "temperatures" in self.params and (cfg.loss != "infonce" or "temperature" in cfg.loss_params):
            given = self.method_params(cfg.method_params)["temperatures"]
            if given != self.params["temperatures"]:  # asked for, and it would be dropped without a word
                raise ValueError(f"method {self.name!r}: parameter 'temperatures' ({given!r}) is tried with the loss "
                                 "infonce and no temperature of the loss given; here the loss is "
                                 + (f"{cfg.loss!r}" if cfg.loss != "infonce" else
                                    f"infonce at temperature {cfg.loss_params['temperature']!r}"))

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
        return FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        device = setup.device
        model = self.initial_model(data, cfg, setup, fusion).to(device).train()
        loss_fn = build_loss(cfg.loss, **cfg.loss_params).to(device)
        optimizer = adam([*model.parameters(), *loss_fn.parameters()], lr=cfg.lr_head, betas=tuple(cfg.betas))
        train = setup.rest.to(device)
        code_loss = self.code_loss(cfg, loss_fn, train, setup, fusion)
        group = current_group()

        def loss(batch: Batch) -> torch.Tensor:
            beta = step_beta(cfg, batch)
            img, txt, _, ids, labels = batch_inputs(train, batch.index, None, cfg.supervised, group)
            with autocast(device, cfg.amp):
                h_img, h_txt = model.logits(img, txt)
            h_img, h_txt = group.gather((h_img.float(), h_txt.float()), len(batch.index))
            codes_img, codes_txt = relaxed_codes(h_img, cfg, beta), relaxed_codes(h_txt, cfg, beta)
            return code_loss(codes_img, codes_txt, CodeBatch(batch.index, img, txt, ids, labels))

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model, "loss": loss_fn}, optimizer, train,
                    loss=loss, scalars=beta_scalars(cfg), fed=("beta",), graphable=self.graphable,
                    validate=validator(*validation_view(cfg), model, setup.val, setup.rest, device))

    def code_loss(self, cfg: HashConfig, loss_fn: nn.Module, train: Split, setup: Setup,
                  fusion: Optional[FusionEncoder]) -> Callable[[torch.Tensor, torch.Tensor, "CodeBatch"], torch.Tensor]:
        """The loss of a batch's relaxed codes: ``cfg.loss`` of each pair, the captions of one id positives."""
        return lambda codes_img, codes_txt, batch: loss_fn(codes_img, codes_txt, ids=batch.ids, labels=batch.labels)


class CodeBatch(NamedTuple):
    """What a batch's code loss may need besides the codes: the global batch's item indices, this rank's
    features, the ids and labels of the global batch (None where absent or unsupervised)."""

    index: torch.Tensor
    img: torch.Tensor
    txt: torch.Tensor
    ids: Optional[torch.Tensor]
    labels: Optional[torch.Tensor]
