"""Method 'distill': two-tower whose InfoNCE targets are mixed with a fused teacher's neighbours."""
from __future__ import annotations

import copy
from typing import Callable, Optional

import torch
from torch import nn

from ucmfh.config import HashConfig
from ucmfh.data.h5 import Split
from ucmfh.distributed import current_group
from ucmfh.evaluation import embeddings_of
from ucmfh.losses import soft_infonce
from ucmfh.losses.distill import distill_targets, fused_embedding
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.trainer import Setup
from ucmfh.methods.two_tower import CodeBatch, TwoTower


@register
class Distill(TwoTower):
    """Two-tower, with InfoNCE's targets mixed with a teacher's.

    The teacher is the fused view of the fusion encoder, which sees each training pair's image and
    text together (docs/reference.md §3): its embedding ``t_i = normalize(normalize(z_img) +
    normalize(z_txt))`` (:func:`ucmfh.losses.distill.fused_embedding`). The targets of a batch are
    ``(1 - w) · P + w · softmax(t tᵀ / τ_t)``, P the pair itself (and the items of its id), ``w =
    teacher_weight``, ``τ_t = teacher_temperature``, for the student's InfoNCE logits at the loss's
    temperature, both directions. The teacher only trains: codes come from each modality alone. The
    teacher's fusion stage is trained on the student's validation split, so it never sees the items
    that pick its epoch.
    """

    name = "distill"
    description = ("two-tower whose InfoNCE targets are mixed with the neighbours of each pair under the fused "
                   "UCMFH encoder, trained first: a leaky teacher, an honest student")
    defaults = {"hidden": 1024, "loss": "infonce", "loss_params": {"temperature": 0.3}, "relaxation": "sign",
                "val_fraction": 0.1, "patience": 10}
    # the share of the targets taken from the teacher, and its softmax's temperature (the loss's own is fixed:
    # no temperatures to choose among)
    params = {"teacher_weight": 0.8, "teacher_temperature": 0.2}
    uses_fusion = True
    fusion_defaults = {"val_fraction": 0.1, "patience": 10}
    # the teacher is trained first and frozen: no learning rate of the fusion encoder while the heads train
    # (--lr-fusion was taken, changed nothing and split the run's identity)
    fixed = {**TwoTower.fixed, "lr_fusion": HashConfig.lr_fusion}

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        p = self.method_params(cfg.method_params)
        if not 0 <= p["teacher_weight"] <= 1 or p["teacher_temperature"] <= 0:
            raise ValueError(f"method 'distill': teacher_weight must be in [0, 1] and teacher_temperature > 0, got "
                             f"{p['teacher_weight']} and {p['teacher_temperature']}")
        if cfg.loss != "infonce":
            raise ValueError(f"method 'distill' mixes the teacher into InfoNCE's targets: loss must be 'infonce', "
                             f"got {cfg.loss!r}")
        if cfg.loss_params.get("learnable"):  # its soft InfoNCE takes τ as a number: a learnt τ would stay put
            raise ValueError("method 'distill' trains with a fixed InfoNCE temperature: learnable must be false")

    def code_loss(self, cfg: HashConfig, loss_fn: nn.Module, train: Split, setup: Setup,
                  fusion: Optional[FusionEncoder]) -> Callable[[torch.Tensor, torch.Tensor, CodeBatch], torch.Tensor]:
        """:func:`soft_infonce` of the codes against :func:`distill_targets` of the teacher's fused embeddings
        (computed once for a split in memory, per batch for a streamed one)."""
        teacher, group, p = fusion, current_group(), self.method_params(cfg.method_params)
        fused = None  # the teacher's fused embedding of each training item, computed once (in memory)
        if not train.streamed:
            fused = fused_embedding(*embeddings_of(teacher, setup.rest, "fused", setup.device))
        else:  # streamed: each batch's, when it comes, by a copy on the device (the caller's stays as it was)
            teacher = copy.deepcopy(fusion).to(setup.device).eval()

        def loss(codes_img: torch.Tensor, codes_txt: torch.Tensor, batch: CodeBatch) -> torch.Tensor:
            if fused is not None:
                t = fused[batch.index]
            else:
                with torch.no_grad():
                    t = group.gather((fused_embedding(*teacher.embed(batch.img, batch.txt, "fused")),),
                                     len(batch.index))[0]
            targets = distill_targets(t, batch.ids, p["teacher_weight"], p["teacher_temperature"])
            return soft_infonce(codes_img, codes_txt, targets, float(loss_fn.temperature))

        return loss
