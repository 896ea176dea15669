"""Method 'distill': two-tower whose InfoNCE targets are mixed with a fused teacher's neighbours."""
from __future__ import annotations

from typing import Optional, Tuple

from ucmfh.config import HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.methods.registry import register
from ucmfh.methods.two_tower import TwoTower, fit_feature_hasher
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import FeatureHasher
from ucmfh.epochs import StateFile
from ucmfh.selection import History


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
    params = {}  # the loss's temperature is fixed: no temperatures to choose among
    uses_fusion = True
    fusion_defaults = {"val_fraction": 0.1, "patience": 10}

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        if cfg.loss != "infonce":
            raise ValueError(f"method 'distill' mixes the teacher into InfoNCE's targets: loss must be 'infonce', "
                             f"got {cfg.loss!r}")

    def fit(self, data: Dataset, cfg: HashConfig, fusion: Optional[FusionEncoder] = None, progress: bool = True,
            state: Optional[StateFile] = None) -> Tuple[FeatureHasher, History]:
        return fit_feature_hasher(data, cfg, fusion, progress, state)
