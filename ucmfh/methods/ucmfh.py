"""Method 'ucmfh': UCMFH's hashing stage (docs/reference.md §2), hash heads on its fusion encoder."""
from __future__ import annotations

import copy
from typing import Optional, Tuple

import torch

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.losses import build_loss
from ucmfh.methods.base import Method
from ucmfh.methods.registry import register
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.epochs import StateFile, run_epochs
from ucmfh.models.relaxation import beta_at, relaxed_codes
from ucmfh.selection import History, validation_split, validation_view, validator
from ucmfh.step import batch_inputs, split_ahead
from ucmfh.amp import autocast
from ucmfh.optim import adam, optimize
from ucmfh.utils import resolve_device, seed_everything


@register
class UCMFH(Method):
    """Hash heads on the fusion encoder, which is fine-tuned (``cfg.lr_fusion = 0`` keeps it).

    Loss = loss(fused img, fused txt) + code_weight · loss(img codes, txt codes), codes relaxed by
    :func:`ucmfh.models.relaxation.relaxed_codes` (UCMFH's ``tanh(β · logits)`` by default). Its defaults are
    :class:`HashConfig`'s, UCMFH's reference code's; its hashing stage shares the fusion stage's
    training options. The only method with a 'fused' view (defect 2 of docs/reference.md §3).
    """

    name = "ucmfh"
    description = "UCMFH: hash heads on the fusion encoder, which is trained first (the only method with a 'fused' view)"
    uses_fusion = True
    shares_fusion_options = True
    leak_free = False
    takes_relaxation = True

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> CrossModalHasher:
        if fusion_cfg is None:
            raise ValueError("method 'ucmfh' needs its fusion encoder's settings to build its model")
        return CrossModalHasher(FusionEncoder(d_img, d_txt, fusion_cfg), cfg)

    def fit(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None, progress: bool = True,
            state: Optional[StateFile] = None) -> Tuple[CrossModalHasher, History]:
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
        rest, val = validation_split(data.train, cfg.val_fraction, cfg.seed)
        train = rest.to(device)
        group = current_group()

        def step(index: torch.Tensor, separate: Optional[torch.Tensor], epoch: int, iteration: int) -> torch.Tensor:
            beta = beta_at(cfg, iteration, epoch)
            img, txt, separate, ids, labels = batch_inputs(train, index, separate, cfg.supervised, group)
            with autocast(device, cfg.amp):
                z_img, z_txt = model.fusion(img, txt, separate)
                h_img, h_txt = model.logits(z_img, z_txt)
            # codes and losses always in float32: bf16's 8-bit mantissa would blur tanh near ±1
            z_img, z_txt, h_img, h_txt = group.gather(
                (z_img.float(), z_txt.float(), h_img.float(), h_txt.float()), len(index))
            codes_img, codes_txt = relaxed_codes(h_img, cfg, beta), relaxed_codes(h_txt, cfg, beta)
            loss = (fusion_loss(z_img, z_txt, ids=ids, labels=labels)
                    + cfg.code_weight * code_loss(codes_img, codes_txt, ids=ids, labels=labels))
            return optimize(loss, optimizer, group)

        modules = {"model": model, "fusion_loss": fusion_loss, "code_loss": code_loss}
        history = run_epochs(
            f"hashing {cfg.n_bits} bits", cfg, modules, optimizer, generator, len(train), device, step, state, progress,
            postfix=lambda epoch, iteration: {"beta": f"{beta_at(cfg, iteration, epoch):.2f}"},
            validate=validator(*validation_view(cfg), model, val, rest, device), shuffle=train.shuffle,
            ahead=split_ahead(train, group),
        )
        return model.cpu().eval(), history
