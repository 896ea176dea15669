"""Method 'ucmfh': UCMFH's hashing stage (docs/reference.md §2), hash heads on its fusion encoder."""
from __future__ import annotations

import copy
from typing import Optional, Union

import torch

from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.losses import build_loss
from ucmfh.methods.base import Method
from ucmfh.methods.registry import register
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.models.relaxation import beta_scalars, relaxed_codes, step_beta
from ucmfh.optim import adam
from ucmfh.selection import validation_view, validator
from ucmfh.trainer import Batch, Plan, Setup


FUSION_STARTS = ("trained", "random")


@register
class UCMFH(Method):
    """Hash heads on the fusion encoder, which is fine-tuned (``cfg.lr_fusion = 0`` keeps it).

    Loss = loss(fused img, fused txt) + code_weight · loss(img codes, txt codes), codes relaxed by
    :func:`ucmfh.models.relaxation.relaxed_codes` (UCMFH's ``tanh(β · logits)`` by default). Its defaults are
    :class:`HashConfig`'s, UCMFH's reference code's; its hashing stage shares the fusion stage's
    training options. The only method with a 'fused' view (defect 2 of docs/reference.md §3).

    Where the heads start (``fusion_start``): ``'trained'`` (the default), on a copy of the trained fusion
    stage (task 0's); ``'random'``, as UCMFH's release does (its task 1), on a fusion encoder of random weights
    trained with them, no fusion stage trained first (docs/reference.md §2, "Departures").
    """

    name = "ucmfh"
    graphable = True
    description = ("UCMFH: hash heads on the fusion encoder, which is trained first (fusion_start=random: of random "
                   "weights, trained with the heads, as UCMFH's release); the only method with a 'fused' view")
    uses_fusion = True
    shares_fusion_options = True
    leak_free = False
    takes_relaxation = True
    # code_weight: the codes' loss's weight beside the fused embeddings' (the reference's); fusion_start: where the
    # heads start, on the trained fusion stage or, as UCMFH's release, on an encoder of random weights
    params = {"code_weight": 0.5, "fusion_start": "trained"}

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        params = self.method_params(cfg.method_params)
        if params["code_weight"] < 0:
            raise ValueError(f"method 'ucmfh': parameter 'code_weight' must be >= 0, got {params['code_weight']}")
        if params["fusion_start"] not in FUSION_STARTS:
            raise ValueError(f"method 'ucmfh': parameter 'fusion_start' must be one of {', '.join(FUSION_STARTS)}, "
                             f"got {params['fusion_start']!r}")

    def takes_fusion(self, cfg: HashConfig) -> Optional[str]:
        return "config" if self.method_params(cfg.method_params)["fusion_start"] == "random" else "encoder"

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> CrossModalHasher:
        if fusion_cfg is None:
            raise ValueError("method 'ucmfh' needs its fusion encoder's settings to build its model")
        fusion = FusionEncoder.from_config(d_img, d_txt, fusion_cfg)
        return CrossModalHasher(fusion, cfg.n_bits, cfg.hidden, cfg.dropout)

    def initial_model(self, data: Dataset, cfg: HashConfig, setup: Setup,
                      fusion: Union[FusionEncoder, FusionConfig, None] = None) -> CrossModalHasher:
        """Hash heads on a copy of the trained fusion encoder (the caller's stays as it was, e.g. one fusion
        stage serving several n_bits), which has its feature statistics already; given the stage's settings
        (``fusion_start='random'``), on an encoder of random weights, its statistics fitted here."""
        if isinstance(fusion, FusionConfig):
            model = self.build_model(data.d_img, data.d_txt, cfg, fusion)
            model.fusion.fit_feature_stats(setup.rest.img, setup.rest.txt)
            return model
        return CrossModalHasher(copy.deepcopy(fusion), cfg.n_bits, cfg.hidden, cfg.dropout)

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup,
             fusion: Union[FusionEncoder, FusionConfig, None] = None) -> Plan:
        device = setup.device
        model = self.initial_model(data, cfg, setup, fusion).to(device).train()
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
        train = setup.rest.to(device)
        group = current_group()
        code_weight = self.method_params(cfg.method_params)["code_weight"]

        def loss(batch: Batch) -> torch.Tensor:
            beta = step_beta(cfg, batch)
            img, txt, separate, ids, labels = batch_inputs(train, batch.index, batch.separate, cfg.supervised, group)
            with autocast(device, cfg.amp):
                z_img, z_txt = model.fusion(img, txt, separate)
                h_img, h_txt = model.logits(z_img, z_txt)
            # codes and losses always in float32: bf16's 8-bit mantissa would blur tanh near ±1
            z_img, z_txt, h_img, h_txt = group.gather(
                (z_img.float(), z_txt.float(), h_img.float(), h_txt.float()), len(batch.index))
            codes_img, codes_txt = relaxed_codes(h_img, cfg, beta), relaxed_codes(h_txt, cfg, beta)
            return (fusion_loss(z_img, z_txt, ids=ids, labels=labels)
                    + code_weight * code_loss(codes_img, codes_txt, ids=ids, labels=labels))

        modules = {"model": model, "fusion_loss": fusion_loss, "code_loss": code_loss}
        return Plan(f"hashing {cfg.n_bits} bits", model, modules, optimizer, train, loss=loss,
                    scalars=beta_scalars(cfg), fed=("beta",), graphable=self.graphable,
                    validate=validator(*validation_view(cfg), model, setup.val, setup.rest, device))
