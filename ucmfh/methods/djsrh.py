"""Method 'djsrh': Deep Joint-Semantics Reconstructing Hashing (Su, Zhong & Zhang, ICCV 2019).

Transcribed from the released code, zs-zhong/DJSRH (commit 6041c2d): ``train.py`` (``Session.train``),
``models.py`` (``ImgNet``, ``TxtNet``) and ``settings.py`` (the MIRFlickr settings).

What the released code does, per batch of ``m`` pairs (``Session.train``):

- ``S_I = 2 cos(F_I) - 1`` and ``S_T = 2 cos(F_T) - 1``: cosine similarities of the batch's image
  features (``FeatNet_I``, a pretrained AlexNet's fc7 output, never trained) and of its bag-of-words
  texts, mapped from [0, 1] (both are non-negative) to [-1, 1];
- the joint-semantics matrix ``S~ = β S_I + (1 - β) S_T``, then
  ``S = μ ((1 - η) S~ + η S~ S~ / m)`` (``settings.BATCH_SIZE`` is ``m``: ``drop_last=True``);
- ``B_I, B_T``: the rows of ``tanh(α · hid)`` L2-normalised, ``α = sqrt(epoch + 1)`` (``set_alpha``);
- loss ``λ1 ‖B_I B_Iᵀ - S‖² + ‖B_I B_Tᵀ - S‖² + λ2 ‖B_T B_Tᵀ - S‖²``, each a ``F.mse_loss`` (mean
  over the m² entries);
- two SGD optimisers (momentum 0.9, weight decay 5e-4), ``LR_IMG`` for the image network, ``LR_TXT``
  for the text network; codes at test time are ``sign`` of the outputs (``metric.compress``).

Kept, on precomputed features: the image network's last layer, ``fc_encode`` (one linear map from the
feature to the bits: the precomputed image feature stands where AlexNet's fc7 output was), and the whole
text network, ``TxtNet`` (``d_txt -> hidden -> ReLU -> n_bits``, no dropout). The loss, the similarity
construction, the α schedule (``beta_schedule='step'`` with ``beta_step_epochs=1``), the optimiser and
its settings are theirs; the defaults are ``settings.py``'s MIRFlickr values (their image learning rate
is for a fine-tuned CNN, not for one linear layer: it stays theirs, named ``lr_img``).

Departures, each named:

1. Precomputed features instead of a fine-tuned AlexNet (MIRFlickr trains all of ``CodeNet_I``) and a
   bag of words: here the 1280-d image and 384-d sentence features of the file.
2. The heads see the features centred by their training mean and L2-normalised
   (:class:`~ucmfh.models.hashing.FeatureHasher`); theirs see raw fc7 features and raw BoW.
3. ``S`` is built from the *raw* features, L2-normalised (``sim_inputs='raw'``), as theirs: fc7 and
   BoW are non-negative, so their cosines lie in [0, 1] and ``2 cos - 1`` in [-1, 1]; the pooled
   EfficientNet image features are non-negative too. A sentence embedding's cosines are not: ``2 cos - 1``
   of its texts reaches down to -3 (a scale the release's BoW never gave ``S_T``). ``sim_inputs='centred'``
   builds ``S`` from the heads' centred inputs instead (cosines in [-1, 1]).
4. ``S~ S~ / m`` divides by the batch's own size (theirs: the constant batch size, the same number
   since they drop the last partial batch; here the last partial batch is kept).
5. One SGD optimiser with two parameter groups (``lr_img``, ``lr_head``) instead of two optimisers:
   the same update.
6. Model selection: the epoch whose codes score best on a validation part of the training split
   (``val_fraction``, ``patience``), never the query split; theirs trains a fixed 80 epochs and
   reports the test MAP of the last (or logs every ``EVAL_INTERVAL`` epochs on the query set).
7. No ids are used: the method is unsupervised, its only supervision is ``S``.
8. The codes are ``sign`` with sign(0) = +1 (this package's codes); the release's ``torch.sign`` gives 0 at 0
   (a code with zeros).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import current_group
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.models.hashing import FeatureHasher
from ucmfh.models.relaxation import beta_scalars, relaxed_codes, step_beta
from ucmfh.optim import sgd
from ucmfh.selection import validation_view, validator
from ucmfh.similarity import normalize
from ucmfh.trainer import Batch, Plan, Setup

SIM_INPUTS = ("raw", "centred")


def scaled_cosines(x: torch.Tensor) -> torch.Tensor:
    """``2 cos(x_i, x_j) - 1`` for every pair of rows (DJSRH ``train.py`` and JDSH
    ``cal_similarity_matrix``: ``F.normalize(F).mm(F.t()) * 2 - 1``). Shape: [m, d] -> [m, m]."""
    x = normalize(x.float())
    return x @ x.T * 2 - 1


def joint_semantics(img: torch.Tensor, txt: torch.Tensor, beta: float = 0.9, eta: float = 0.4,
                    mu: float = 1.5) -> torch.Tensor:
    """DJSRH's target: ``S = μ ((1 - η) S~ + η S~ S~ / m)`` with ``S~ = β S_I + (1 - β) S_T``.

    Shape: img [m, d_img], txt [m, d_txt] (features, any scale) -> S [m, m], symmetric.
    """
    s = beta * scaled_cosines(img) + (1 - beta) * scaled_cosines(txt)
    return mu * ((1 - eta) * s + eta * (s @ s) / s.shape[0])


def djsrh_loss(codes_img: torch.Tensor, codes_txt: torch.Tensor, target: torch.Tensor,
               lambda1: float = 0.1, lambda2: float = 0.1) -> torch.Tensor:
    """``λ1 mse(B_I B_Iᵀ, S) + mse(B_I B_Tᵀ, S) + λ2 mse(B_T B_Tᵀ, S)``, ``B`` the rows L2-normalised.

    Shape: codes_img, codes_txt [m, n_bits] (relaxed codes), target [m, m] -> scalar.
    """
    b_img, b_txt = normalize(codes_img), normalize(codes_txt)
    return (lambda1 * F.mse_loss(b_img @ b_img.T, target) + F.mse_loss(b_img @ b_txt.T, target)
            + lambda2 * F.mse_loss(b_txt @ b_txt.T, target))


def similarity_inputs(model: FeatureHasher, img: torch.Tensor, txt: torch.Tensor,
                      which: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The features a batch's similarity matrix is built from: raw (L2-normalised where it is used)
    or the model's centred, L2-normalised inputs."""
    if which == "centred":
        return model.inputs(img.float(), txt.float())
    return img.float(), txt.float()


def check_sgd_params(name: str, params: dict) -> None:
    """Refuse SGD settings no run can use (``ValueError`` naming them)."""
    if params["lr_img"] <= 0 or not 0 <= params["momentum"] < 1 or params["weight_decay"] < 0:
        raise ValueError(f"method {name!r}: lr_img must be > 0, momentum in [0, 1) and weight_decay >= 0, got "
                         f"{params['lr_img']}, {params['momentum']} and {params['weight_decay']}")
    if params["sim_inputs"] not in SIM_INPUTS:
        raise ValueError(f"method {name!r}: sim_inputs must be one of {SIM_INPUTS}, got {params['sim_inputs']!r}")


def sgd_by_modality(model: FeatureHasher, lr_img: float, lr_txt: float, momentum: float,
                    weight_decay: float) -> torch.optim.SGD:
    """Their two SGD optimisers as one with a parameter group per modality (the same update)."""
    return sgd([{"params": model.img_head.parameters(), "lr": lr_img},
                {"params": model.txt_head.parameters(), "lr": lr_txt}],
               lr=lr_txt, momentum=momentum, weight_decay=weight_decay)


# what both DJSRH and JDSH fix: no dropout in TxtNet, codes tanh(sqrt(epoch + 1) * logits) (set_alpha)
TANH_SCHEDULE = {"dropout": 0.0, "relaxation": "tanh", "beta_schedule": "step", "beta_step_epochs": 1}


class SimilarityHasher(Method):
    """DJSRH's training, which JDSH keeps: :meth:`build_model`'s heads trained by SGD on
    ``loss(codes_img, codes_txt, target(img, txt))``, the target built from each (global) batch's features
    (:meth:`target` and :meth:`loss`, from the method's parameters); the codes are ``tanh(sqrt(epoch + 1) h)``.
    The best validation epoch is kept."""

    fixed = TANH_SCHEDULE
    takes_loss = False
    graphable = True  # captured once: α = sqrt(epoch + 1) read from the device (Plan.fed)

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        check_sgd_params(self.name, self.method_params(cfg.method_params))

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        """The image side is one linear layer (their hashing layer on the CNN feature), the text side an
        MLP with ``cfg.hidden`` units (their ``TxtNet``)."""
        return FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout, img_hidden=0)

    def target(self, p: Dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The batch's target similarity [m, m] from its features img [m, d_img] and txt [m, d_txt]."""
        raise NotImplementedError

    def loss(self, p: Dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The loss of the relaxed codes [m, n_bits] of each modality against the target [m, m]."""
        raise NotImplementedError

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        p = self.method_params(cfg.method_params)
        target_fn, loss_fn, device = self.target(p), self.loss(p), setup.device
        model = self.initial_model(data, cfg, setup, fusion).to(device).train()
        optimizer = sgd_by_modality(model, p["lr_img"], cfg.lr_head, p["momentum"], p["weight_decay"])
        train = setup.rest.to(device)
        group = current_group()

        def loss(batch: Batch) -> torch.Tensor:
            img, txt, _, _, _ = batch_inputs(train, batch.index, None, False, group)
            with torch.no_grad():
                target = target_fn(*group.gather(similarity_inputs(model, img, txt, p["sim_inputs"]), len(batch.index)))
            with autocast(device, cfg.amp):
                h_img, h_txt = model.logits(img, txt)
            h_img, h_txt = group.gather((h_img.float(), h_txt.float()), len(batch.index))
            alpha = step_beta(cfg, batch, "alpha")
            return loss_fn(relaxed_codes(h_img, cfg, alpha), relaxed_codes(h_txt, cfg, alpha), target)

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model}, optimizer, train, loss=loss,
                    scalars=beta_scalars(cfg, "alpha"), fed=("alpha",), graphable=self.graphable,
                    validate=validator(*validation_view(cfg), model, setup.val, setup.rest, device))


@register
class Djsrh(SimilarityHasher):
    """DJSRH on precomputed features: a linear image hashing layer and a text MLP, trained to reconstruct
    the batch's joint-semantics matrix (:func:`joint_semantics`) with the codes' cosines
    (:func:`djsrh_loss`). Module docstring: what was transcribed, and every departure.

    Parameters (``settings.py``, MIRFlickr): ``beta`` (BETA, weight of the image similarity), ``eta``
    (ETA), ``mu`` (MU), ``lambda1``/``lambda2`` (LAMBDA1/LAMBDA2), ``lr_img`` (LR_IMG; LR_TXT is
    ``lr_head``), ``momentum``, ``weight_decay``; ``sim_inputs``: the features ``S`` is built from.
    """

    name = "djsrh"
    description = "DJSRH (ICCV 2019): codes' cosines reconstruct a joint-semantics matrix of both modalities' features"
    defaults = {"hidden": 4096, "epochs": 80, "batch_size": 32, "lr_head": 0.01, "val_fraction": 0.1, "patience": 10}
    params = {"beta": 0.9, "eta": 0.4, "mu": 1.5, "lambda1": 0.1, "lambda2": 0.1, "lr_img": 0.001, "momentum": 0.9,
              "weight_decay": 5e-4, "sim_inputs": "raw"}

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        params = self.method_params(cfg.method_params)
        if not (0 <= params["beta"] <= 1 and 0 <= params["eta"] <= 1 and params["mu"] > 0
                and params["lambda1"] >= 0 and params["lambda2"] >= 0):
            raise ValueError(f"method 'djsrh': beta and eta must be in [0, 1], mu > 0, lambda1 and lambda2 >= 0, "
                             f"got {params}")

    def target(self, p: Dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda img, txt: joint_semantics(img, txt, p["beta"], p["eta"], p["mu"])

    def loss(self, p: Dict[str, Any]) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        return lambda codes_img, codes_txt, s: djsrh_loss(codes_img, codes_txt, s, p["lambda1"], p["lambda2"])
