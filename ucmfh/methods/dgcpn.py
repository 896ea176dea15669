"""Method 'dgcpn': Deep Graph-neighbor Coherence Preserving Network (Yu, Zhou, Zhan & Tao, AAAI 2021,
"Deep Graph-neighbor Coherence Preserving Network for Unsupervised Cross-modal Hashing"; arXiv 2012.13538).

Transcribed from the authors' released code, github.com/Atmegal/DGCPN (commit 9f62c56): ``train_div.py``
(``Session.cal_similarity``, ``Session.loss_cal``, ``Session.train``), ``models.py`` (``ImgNet``,
``TxtNet``) and ``train.py`` (the flags and their defaults). The paper's own text was not reachable
here (only its abstract), so every formula below is the code's; where the code's comments relate its
flags to the paper's symbols, that is said.

**The graph (once, before training; ``cal_similarity``).** With ``f_I``, ``f_T`` the L2-normalised
training features, ``S_pair = a1 · f_T f_Tᵀ + (1 − a1) · f_I f_Iᵀ`` (``a1 = 0.01``: one similarity
of both modalities, mostly the image's). Each item keeps its ``K − 1`` most similar other items
under ``S_pair`` (the released code sorts each row, zeroes its ``knn_number`` smallest entries and
its largest, the item itself; its comment: the paper's ``K = N − knn_number``, 2,000 on MIRFlickr
and NUS-WIDE at N = 5,000). The kept entries, divided by their row's sum, are ``P`` (each item's
neighbours as a distribution), and the graph-neighbour coherence of two items is
``scale · P Pᵀ``: how much their neighbourhoods agree. The target similarity is
``S = 2 · ((1 − a2) · S_pair + a2 · scale · P Pᵀ) − 1`` with ``a2 = 0.3``, ``scale = 4000``.

**The loss (``loss_cal``)** on the rows of a batch (:func:`dgcpn_loss`): ``B_I``, ``B_T`` the
L2-normalised relaxed codes ``tanh(logits)`` (the released ``alpha`` schedule is commented out, so
β = 1 throughout), ``I`` the identity::

    loss = mse(diag(B_I B_Tᵀ), K_pair)                                          # K_pair = 1.5 (flag --K)
         + dw · [mse(B_T B_Tᵀ ∘ (1−I), S ∘ (1−I)) + mse(B_I B_Tᵀ ∘ (1−I), S ∘ (1−I))
                 + mse(B_I B_Iᵀ ∘ (1−I), S ∘ (1−I))]                            # dw = 1
         + cw · [mse(B_I B_Tᵀ, B_I B_Iᵀ) + mse(B_I B_Tᵀ, B_T B_Tᵀ) + mse(B_I B_Iᵀ, B_T B_Tᵀ)
                 + mse(B_I B_Tᵀ, (B_I B_Tᵀ)ᵀ)]                                 # cw = 1

each ``mse`` the mean over all entries (the masked diagonal's zeros included, as ``F.mse_loss`` does).

**The half-real, half-binary steps (``Session.train``)**, three per batch: the loss on both relaxed
codes, both networks stepped; then a fresh forward pass, and the loss on the relaxed image codes
against the detached signs of the text codes, the image network stepped; then the loss on the
detached signs of the image codes (that same forward pass) against the relaxed text codes, the text
network stepped. Two SGD optimisers in the release (lr 0.005, momentum 0.9, weight decay 5e-4); here
one SGD over both heads, which is the same update: a step whose loss leaves one head without a
gradient leaves that head, and its momentum, untouched (:func:`ucmfh.optim.optimize` clears the
gradients to None).

**The model (``models.py``).** ``ImgNet``: Linear(4096, 4096) → ReLU → Dropout(0.5) → Linear(4096,
bits) → tanh; ``TxtNet`` the same from the text width, its last layer's weights drawn from
N(0, 0.3²). Here a :class:`~ucmfh.models.hashing.FeatureHasher` with ``hidden = 4096``,
``dropout = 0.5`` and that initialisation of the text head's last layer.

Departures, each named:

- Precomputed features in (this package's premise): the release also starts from fixed VGG-19 fc7
  features and tag bags of words, so only the feature extractor differs. The heads see the features
  centred by their training mean and L2-normalised (every FeatureHasher); the release feeds the raw
  features. The graph is built as in the release, from the raw features L2-normalised, uncentred.
- The graph is built on the training items that remain after the validation split (the validation
  items are not in it), and never as an N × N matrix: each item's ``K − 1`` neighbours and weights
  are kept ([N, K − 1], found by a search in chunks of rows) and a batch's ``P Pᵀ`` is formed from
  them (:class:`NeighbourGraph`); its values equal the release's full matrix's (tested). The item
  itself is left out by its index; the release drops each row's largest entry, which is the item
  itself unless another has exactly its similarity.
- ``knn`` is the paper's ``K`` (neighbours counting the item itself), not the release's
  ``knn_number = N − K``, so that it means the same at any training size; the default is the
  published 2,000. Where the training split has fewer than ``K`` items, every other item is a
  neighbour. ``scale`` is given relative to ``K`` (``scale_ratio``: the release's 4000 at K = 2000
  is 2.0), because the coherence ``P Pᵀ`` of a K-neighbour graph is of the order of 1/K: the target
  keeps its range where K is clamped (tiny splits) or changed.
- Neighbour weights are clamped at zero before the row normalisation: the release's features are
  non-negative (VGG after ReLU, tag counts), so its similarities are too; text embeddings here can
  have negative cosines (never among an item's 2,000 nearest on flickr8k, whose image features are
  non-negative and weigh 0.99).
- Model selection: the release evaluates MAP over the whole ranking (``calculate_map``, I→T plus T→I)
  on its validation items against its database after every epoch, keeps the best epoch and stops after
  11 epochs without a better one; here the same rule, ``patience = 11``, with this package's validator:
  unimodal MAP@50 (not over the whole ranking) of both directions on a validation tenth of the training
  split against the rest (:func:`ucmfh.selection.validator`).
- The codes are ``sign`` with sign(0) = +1 (this package's codes); the release's ``torch.sign`` gives
  0 at 0. Inside the loss the half-binary steps use ``torch.sign`` as the release does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.distributed import Group, current_group
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.models.hashing import FeatureHasher
from ucmfh.similarity import normalize
from ucmfh.selection import validation_view, validator
from ucmfh.trainer import Batch, Plan, Setup
from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.optim import optimize, sgd

# rows of the training split whose similarities to all the others are held at once while the
# neighbours are found ([KNN_CHUNK, N] floats: 128 MiB at N = 32,000)
KNN_CHUNK = 1024


def dgcpn_loss(img: torch.Tensor, txt: torch.Tensor, target: torch.Tensor, pair_target: float = 1.5,
               preserve_weight: float = 1.0, consistency_weight: float = 1.0) -> torch.Tensor:
    """DGCPN's loss of one batch (``loss_cal`` of the released ``train_div.py``).

    ``img``, ``txt``: relaxed codes (``tanh`` of the logits) or detached signs, L2-normalised here;
    ``target``: the batch's target similarities ``S`` (:meth:`NeighbourGraph.similarity`).
    The pair term pulls each pair's cosine towards ``pair_target``; the preserving terms fit the
    off-diagonal cosines text–text, image–text and image–image to ``S``; the consistency terms make
    the three cosine matrices (and the image–text one's transpose) agree.

    Shape: img [B, n_bits], txt [B, n_bits], target [B, B] -> scalar.
    """
    b_img, b_txt = normalize(img), normalize(txt)
    ii, tt, it = b_img @ b_img.T, b_txt @ b_txt.T, b_img @ b_txt.T
    off = 1.0 - torch.eye(len(img), device=img.device, dtype=ii.dtype)
    pair = F.mse_loss(it.diagonal(), torch.full_like(it.diagonal(), pair_target))
    kept = target * off
    preserve = F.mse_loss(tt * off, kept) + F.mse_loss(it * off, kept) + F.mse_loss(ii * off, kept)
    consistency = F.mse_loss(it, ii) + F.mse_loss(it, tt) + F.mse_loss(ii, tt) + F.mse_loss(it, it.T)
    return pair + preserve_weight * preserve + consistency_weight * consistency


@dataclass
class NeighbourGraph:
    """The training items' graph: what DGCPN's target similarity of any two of them needs.

    ``features`` [N, d_img + d_txt]: each item's L2-normalised image and text features, scaled so that
    ``features @ features.T = a1 · S_T + (1 − a1) · S_I`` (``S_pair``); ``index`` [N, K − 1] (int32):
    each item's nearest other items under ``S_pair``; ``weights`` [N, K − 1]: their similarities, clamped
    at zero, divided by the row's sum (the rows of ``P``).
    """

    features: torch.Tensor
    index: torch.Tensor
    weights: torch.Tensor

    @classmethod
    def build(cls, img: torch.Tensor, txt: torch.Tensor, knn: int, text_weight: float,
              chunk: int = KNN_CHUNK, done: Optional[Callable[[int], Any]] = None) -> "NeighbourGraph":
        """Each item's ``min(knn, N) − 1`` nearest others, found ``chunk`` rows at a time (``done(rows)`` told
        of each chunk: a progress bar's ``update``).

        Shape: img [N, d_img], txt [N, d_txt] (raw features; normalised here)."""
        n = len(img)
        features = torch.cat([math.sqrt(1.0 - text_weight) * normalize(img.float()),
                              math.sqrt(text_weight) * normalize(txt.float())], 1)
        k = min(knn, n) - 1
        index = torch.empty(n, k, dtype=torch.int32, device=img.device)
        weights = torch.empty(n, k, device=img.device)
        for start in range(0, n, chunk):
            rows = torch.arange(start, min(start + chunk, n), device=img.device)
            sims = features[rows] @ features.T
            sims[torch.arange(len(rows), device=img.device), rows] = -math.inf  # not its own neighbour
            top = sims.topk(k, dim=1)
            kept = top.values.clamp_min(0.0)
            weights[rows] = kept / kept.sum(1, keepdim=True).clamp_min(1e-12)
            index[rows] = top.indices.to(torch.int32)
            if done is not None:
                done(len(rows))
        return cls(features, index, weights)

    def similarity(self, batch: torch.Tensor, coherence_weight: float, scale: float) -> torch.Tensor:
        """The target ``S = 2 · ((1 − a2) · S_pair + a2 · scale · P Pᵀ) − 1`` of the items ``batch``.

        Shape: batch [B] (indices into the graph's items) -> [B, B]."""
        f = self.features[batch]
        p = torch.zeros(len(batch), len(self.features), device=f.device)
        p.scatter_(1, self.index[batch].long(), self.weights[batch])
        s = (1.0 - coherence_weight) * (f @ f.T) + coherence_weight * scale * (p @ p.T)
        return 2.0 * s - 1.0


def dgcpn_step(model: FeatureHasher, optimizer: torch.optim.Optimizer, img: torch.Tensor, txt: torch.Tensor,
               target: torch.Tensor, loss_of: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
               group: Group, n: int, device: torch.device, amp: str = "none") -> torch.Tensor:
    """One batch of DGCPN's training (``Session.train``): three optimisation steps; returns the first's loss.

    1. ``loss_of(tanh(h_img), tanh(h_txt), target)``, both heads stepped;
    2. a fresh forward pass; ``loss_of(tanh(h_img), sign(tanh(h_txt)))``, the text side detached: the
       image head alone has gradients, and alone is stepped;
    3. ``loss_of(sign(tanh(h_img)), tanh(h_txt))`` on that same forward pass: the text head alone.

    ``optimizer`` holds both heads; :func:`ucmfh.optim.optimize` sets every gradient to None first,
    so SGD leaves a head without a gradient (and its momentum) as it is: two optimisers, as released.
    Shape: img [b, d_img], txt [b, d_txt] (this rank's part of the batch of ``n``), target [n, n].
    """
    with autocast(device, amp):
        h_img, h_txt = model.logits(img, txt)
    h_img, h_txt = group.gather((h_img.float(), h_txt.float()), n)
    loss = optimize(loss_of(torch.tanh(h_img), torch.tanh(h_txt), target), optimizer, group)
    with autocast(device, amp):
        h_img, h_txt = model.logits(img, txt)
    # gathered apart, so that each of the two backward passes has a graph of its own
    (r_img,), (r_txt,) = group.gather((h_img.float(),), n), group.gather((h_txt.float(),), n)
    r_img, r_txt = torch.tanh(r_img), torch.tanh(r_txt)
    optimize(loss_of(r_img, torch.sign(r_txt).detach(), target), optimizer, group)
    optimize(loss_of(torch.sign(r_img).detach(), r_txt, target), optimizer, group)
    return loss


@register
class Dgcpn(Method):
    """DGCPN (Yu et al., AAAI 2021), from its released code: a fixed target similarity of each pair of
    training items, their features' similarity and the agreement of their neighbourhoods in a kNN
    graph; hash heads fitted to it with half-real, half-binary SGD steps. See the module's docstring
    for the formulas, their sources and every departure."""

    name = "dgcpn"
    in_memory = 'builds its neighbour graph from the whole training split'
    description = ("DGCPN (AAAI 2021): codes fitted to feature similarity plus kNN-graph neighbour coherence, "
                   "half-real half-binary steps")
    # the release's train.py: batch 32, lr 0.005, 100 epochs, stop after 11 without a better validation MAP;
    # models.py: 4096 hidden units, dropout 0.5
    defaults = {"hidden": 4096, "dropout": 0.5, "lr_head": 0.005, "batch_size": 32, "epochs": 100,
                "val_fraction": 0.1, "patience": 11}
    # its relaxation is its own (plain tanh), whatever is asked
    fixed = {"relaxation": "tanh", "beta_schedule": "none"}
    graphable = True  # its three updates a batch in one graph
    params = {
        "knn": 2000,  # the paper's K (train.py's comment: K = N - knn_number, 5000 - 3000 on MIRFlickr)
        "scale_ratio": 2.0,  # the coherence scale over K: --scale 4000 at K = 2000
        "text_weight": 0.01,  # --a1: the text's share of S_pair
        "coherence_weight": 0.3,  # --a2: the neighbour coherence's share of S
        "pair_target": 1.5,  # --K: the target of a pair's image-text cosine
        "preserve_weight": 1.0,  # --dw
        "consistency_weight": 1.0,  # --cw
        "momentum": 0.9,  # --momentum
        "weight_decay": 0.0005,  # --weight_decay
        "txt_init_std": 0.3,  # TxtNet.fc_encode's initial weights ~ N(0, 0.3^2)
    }
    takes_loss = False

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        p = self.method_params(cfg.method_params)
        if p["knn"] < 2:
            raise ValueError(f"method 'dgcpn': knn must be >= 2 (the item and a neighbour), got {p['knn']}")
        if not 0.0 <= p["text_weight"] <= 1.0 or not 0.0 <= p["coherence_weight"] <= 1.0:
            raise ValueError("method 'dgcpn': text_weight and coherence_weight must be in [0, 1], got "
                             f"{p['text_weight']} and {p['coherence_weight']}")
        if min(p["scale_ratio"], p["preserve_weight"], p["consistency_weight"], p["weight_decay"],
               p["txt_init_std"]) < 0 or not 0.0 <= p["momentum"] < 1.0:
            raise ValueError("method 'dgcpn': scale_ratio, preserve_weight, consistency_weight, weight_decay and "
                             f"txt_init_std must be >= 0 and momentum in [0, 1), got {p}")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        return FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        p = self.method_params(cfg.method_params)
        device = setup.device
        model = self.initial_model(data, cfg, setup, fusion)
        nn.init.normal_(model.txt_head.net[-1].weight, 0.0, p["txt_init_std"])
        model.to(device).train()
        train = setup.rest.to(device)
        with setup.bar(len(train), "DGCPN: each training item's nearest neighbours") as bar:
            graph = NeighbourGraph.build(train.img, train.txt, p["knn"], p["text_weight"], done=bar.update)
        scale = p["scale_ratio"] * min(p["knn"], len(train))
        optimizer = sgd(model.parameters(), lr=cfg.lr_head, momentum=p["momentum"], weight_decay=p["weight_decay"])
        group = current_group()

        def loss_of(img: torch.Tensor, txt: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return dgcpn_loss(img, txt, target, p["pair_target"], p["preserve_weight"], p["consistency_weight"])

        def step(batch: Batch) -> torch.Tensor:  # three updates a batch: a step of its own
            img, txt, _, _, _ = batch_inputs(train, batch.index, None, False, group)
            target = graph.similarity(batch.index, p["coherence_weight"], scale)
            return dgcpn_step(model, optimizer, img, txt, target, loss_of, group, len(batch.index), device, cfg.amp)

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model}, optimizer, train, step=step,
                    validate=validator(*validation_view(cfg), model, setup.val, setup.rest, device),
                    graphable=self.graphable)
