"""Method 'ucch': UCCH, "Unsupervised Contrastive Cross-modal Hashing" (Hu, Zhu, Lin, Peng, Zhao, Peng,
IEEE TPAMI 45(3), 2023), transcribed from its released code (github.com/penghu-cs/UCCH, commit 0c20e62:
the repository's head when an audit compared them line by line, 2026-12-02).

What the released code computes (file and function named), on a batch of B pairs ``i`` (training
items, indices ``y`` into the training split):

- Networks (``nets/ImageNet.py``, ``nets/TextNet.py``): ``h = normalize(tanh(fc(x)))`` with ``fc`` an
  MLP of ``num_hiden_layers`` Linear layers (3 for images, 2 for texts; ReLU between, no dropout,
  ``mid_num1 = mid_num2 = 8192``). Codes are ``sign(h)`` = ``sign(fc(x))`` (``UCCH.py: eval``).
- Memory bank (``NCE/NCEAverage.py: NCEAverage``): one row ``v_i`` per training item, initialised to
  ``normalize(sign(2 s z - s))``, ``z ~ N(0, 1)``, ``s = 1 / sqrt(n_bits / 3)``. Keys are ``sign(v)``:
  the binary dictionary (paper Eq. 4-5). For each item the positive key is ``sign(v_y)``, the K
  negatives ``sign(v_r)`` with ``r`` drawn uniformly with replacement from the whole bank (the
  item itself may be drawn). During the warm-up epochs (``epoch < warmup_epoch``, momentum 0) the
  keys are instead ``sign((h_img + h_txt) / 2)`` of the batch itself: positive its own, negatives
  the B - 1 others. Keys carry no gradient.
- Binarisation: the only sign while training is the keys' (no gradient through it); the networks'
  outputs stay continuous in both losses (no sign, no straight-through estimator, no tanh
  schedule). Codes are ``sign`` of the outputs at encoding time alone.
- Contrastive hashing loss L_c (``NCEAverage.forward`` + ``NCE/NCECriterion.py: NCESoftmaxLoss``):
  scores ``<key, h> / (T sqrt(n_bits))`` (keys are ±1, so this is the paper's ``<h, k> / t`` with
  ``k`` L2-normalised and ``t = T``), ``L_c = mean_i -log softmax_0(scores of h_img_i)
  + mean_i -log softmax_0(scores of h_txt_i)``.
- Bank update, after the scores (``NCEAverage.forward``, paper Eq. 5, without gradient):
  ``v_y <- normalize(d v_y + (1 - d) normalize((h_img + h_txt) / 2))``, ``d = momentum`` (0 in
  warm-up: the row is overwritten).
- Cross-modal ranking loss L_r (``src/utils.py: ContrastiveLoss.forward``, paper Eq. 8 and 14):
  ``M = h_img h_txt^T``; image->text ``S_ij = M_ij`` where ``M_ij >= M_ii - margin`` else
  ``M_ij - shift``; text->image the same with ``M_jj`` (columns). ``L_r = mean_i(-S_ii + tau
  log sum_j exp(S_ij / tau) + margin) + mean_j(-S'_jj + tau log sum_i exp(S'_ij / tau) + margin)``,
  tau = 1 (its default; UCCH.py never sets it). The masks carry no gradient.
- Objective (``UCCH.py: train``): ``alpha L_c + (1 - alpha) L_r``; Adam (betas (0.9, 0.999),
  weight decay 1e-6), gradient norm clipped to 1 over both networks; learning rate ``MultiStepLR``
  milestones 30, 60, 90, 120, gamma 0.1, stepped with the epoch (``ls='linear'``, the default).

Defaults are the README's MIRFlickr-25K feature command (``--alpha 0.7 --num_hiden_layers 3 2
--margin 0.2 --max_epochs 20 --train_batch_size 256 --shift 0.1 --lr 0.0001 --optimizer Adam``) and
``utils/config.py`` for the rest (K 4096, T 0.9, momentum 0.4, wd 1e-6, warmup_epoch 1); the paper
(Sec. 4.2) fixes d = 0.4, t = 0.9, K = 4096, m = 0.2, lr 1e-4 for all datasets.

Departures, each deliberate:

- Hidden width 1024 instead of the released 8192 (``hidden``): at 8192 one epoch on flickr8k's 35,455
  pairs takes about 6 CPU-minutes (20 epochs: about 2 CPU-hours per run), at 1024 under one; the
  published width is ``--set hash.hidden=8192``. Its effect on quality was not measured here.

- Inputs are our precomputed features, centred by their training mean and L2-normalised (as every
  method here); the released code feeds its raw VGG/BoW features.
- Model selection: the epoch kept is the best on our validation split (``val_fraction`` of the
  training units, held out from training, so the networks and the bank see the other 90%; mean
  unimodal MAP@50 of both directions), over all 20 epochs (patience 0). The released code (``UCCH.py: test(is_eval=True)``) keeps the epoch with the
  best MAP@all on the first 2000 items of its retrieval set, which is its training set, as both
  queries and database; it then reports the query set.
- The last partial batch of an epoch is trained on (``batches``); the released loader drops it.
- Negatives are drawn from a generator seeded by (seed, iteration), so a resumed or multi-process
  run draws the same ones; the released code draws from torch's global generator (AliasMethod).
- Codes are ``sign`` with ``sign(0) = +1`` (ours everywhere); the released ``sign_`` gives 0 there.
- The captions of one image (a caption set's ids) are distinct instances, negatives of each other,
  as every pair is in the released code (instance-level contrast); labels are never used.
- Seed: ours (``cfg.seed``); the released code fixes 123.

The memory bank is training state (:class:`MemoryBank`, one of the plan's modules, so resume is
exact); it is not part of the model, which encodes each modality from its own features alone.
"""
from __future__ import annotations

import bisect
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.data.stream import Features, column_stats
from ucmfh.distributed import current_group
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.evaluation import codes_of
from ucmfh.similarity import normalize, sign_codes
from ucmfh.selection import validator
from ucmfh.trainer import Batch, Plan, Setup
from ucmfh.amp import autocast
from ucmfh.batches import batch_inputs
from ucmfh.optim import adam

# UCCH.py: MultiStepLR(optimizer, [30, 60, 90, 120], gamma=0.1), stepped with the epoch
LR_MILESTONES = (30, 60, 90, 120)
LR_GAMMA = 0.1


def ucch_mlp(d_in: int, hidden: int, n_bits: int, layers: int) -> nn.Sequential:
    """UCCH's ImageNet/TextNet ``fc``: ``layers`` Linear layers with ReLU between, every hidden width
    ``hidden``; one layer (or ``hidden = 0``) is a linear map. Shape: [B, d_in] -> [B, n_bits]."""
    if layers <= 1 or hidden == 0:
        return nn.Sequential(nn.Linear(d_in, n_bits))
    modules = [nn.Linear(d_in, hidden), nn.ReLU(inplace=True)]
    for _ in range(layers - 2):
        modules += [nn.Linear(hidden, hidden), nn.ReLU(inplace=True)]
    return nn.Sequential(*modules, nn.Linear(hidden, n_bits))


class UcchHasher(nn.Module):
    """UCCH's two hash networks on (centred, L2-normalised) features: the interface of
    :class:`~ucmfh.models.hashing.FeatureHasher`, with UCCH's MLPs as heads.

    ``logits`` are the MLP outputs before UCCH's ``tanh`` and L2 norm (:func:`hash_outputs`),
    which change no sign. Shape: img [B, d_img], txt [B, d_txt] -> codes two [B, n_bits].
    """

    def __init__(self, d_img: int, d_txt: int, n_bits: int, hidden: int, img_layers: int = 3,
                 txt_layers: int = 2) -> None:
        super().__init__()
        self.d_img, self.d_txt, self.n_bits = d_img, d_txt, n_bits
        self.register_buffer("img_mean", torch.zeros(d_img))
        self.register_buffer("txt_mean", torch.zeros(d_txt))
        self.img_head = ucch_mlp(d_img, hidden, n_bits, img_layers)
        self.txt_head = ucch_mlp(d_txt, hidden, n_bits, txt_layers)

    @torch.no_grad()
    def fit_feature_stats(self, img: Features, txt: Features) -> None:
        """Set the centring means from training features. Shape: [N, d_img], [N, d_txt]."""
        self.img_mean.copy_(column_stats(img)[0])
        self.txt_mean.copy_(column_stats(txt)[0])

    def logits(self, img: torch.Tensor, txt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.img_head(normalize(img - self.img_mean)), self.txt_head(normalize(txt - self.txt_mean))

    @torch.no_grad()
    def modality_logits(self, x: torch.Tensor, modality: str) -> torch.Tensor:
        """Pre-sign outputs of one modality from its own features. Shape: [B, d] -> [B, n_bits]."""
        if modality == "img":
            return self.img_head(normalize(x - self.img_mean))
        return self.txt_head(normalize(x - self.txt_mean))

    @torch.no_grad()
    def head_outputs(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Pre-sign outputs; the same under every protocol (``protocol`` is accepted for a common interface)."""
        return self.logits(img, txt)

    @torch.no_grad()
    def codes(self, img: torch.Tensor, txt: torch.Tensor, protocol: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """±1 codes, the signs of :meth:`head_outputs`; the same under every protocol."""
        img_logits, txt_logits = self.head_outputs(img, txt, protocol)
        return sign_codes(img_logits), sign_codes(txt_logits)


def hash_outputs(logits: torch.Tensor) -> torch.Tensor:
    """What UCCH's networks return and its losses see: ``normalize(tanh(logits))``. Shape: [B, n_bits]."""
    return normalize(torch.tanh(logits))


class MemoryBank(nn.Module):
    """UCCH's hashing memory bank (``NCE/NCEAverage.py``): one continuous row ``v_i`` per training item,
    whose sign is the item's binary key. Training state only; never part of the model.

    Shape: ``memory`` [n, n_bits], L2-normalised rows.
    """

    def __init__(self, n: int, n_bits: int, seed: int = 0) -> None:
        super().__init__()
        std = 1.0 / math.sqrt(n_bits / 3)
        z = torch.randn(n, n_bits, generator=torch.Generator().manual_seed(seed))
        # as released: randn (not rand), so each bit is +1 with probability P(z > 1/2) ~ 0.31
        self.register_buffer("memory", normalize(torch.sign(z * (2 * std) - std)))

    def draw(self, b: int, n_negatives: int, generator: torch.Generator) -> torch.Tensor:
        """The rows of ``n_negatives`` negatives of each of ``b`` items, drawn uniformly with replacement on the
        host by ``generator`` (:func:`negatives_generator`). Shape: -> [b, n_negatives] int32, on the CPU (the
        int64 draw's numbers, in half the time and half the copy to the device)."""
        return torch.randint(len(self.memory), (b, n_negatives), generator=generator, dtype=torch.int32)

    def keys(self, index: torch.Tensor, h_img: torch.Tensor, h_txt: torch.Tensor,
             negatives: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each item's ±1 keys, its positive first, as ``(codes, rows)``: item i's keys are
        ``codes[rows[i]]``. With ``negatives`` (rows of the bank, :meth:`draw`, after the warm-up) ``codes =
        sign(v)`` of the whole bank and ``rows[i]`` its own row, then its negatives; else (warm-up)
        ``codes = sign((h_img + h_txt) / 2)`` of the batch and ``rows[i]`` = i, then the others in
        batch order. No gradient, and nothing read from the host (a graph may replay it). (Rows, not gathered
        keys: the scores are then one matmul and a gather, instead of a [B, 1 + K, n_bits] copy of the bank.)

        Shape: index [B], h_img/h_txt [B, n_bits], negatives [B, K] -> codes [n or B, n_bits], rows [B, 1 + K]
        (warm-up: [B, B]).
        """
        with torch.no_grad():
            if negatives is None:
                b = len(index)
                own, other = torch.arange(b, device=h_img.device), torch.arange(b - 1, device=h_img.device)
                others = other[None, :] + (other[None, :] >= own[:, None])  # row i: 0 .. b-1 without i
                return torch.sign((h_img + h_txt) / 2), torch.cat([own[:, None], others], 1)
            return torch.sign(self.memory), torch.cat([index[:, None], negatives], 1)

    @torch.no_grad()
    def update(self, index: torch.Tensor, h_img: torch.Tensor, h_txt: torch.Tensor, momentum: float) -> None:
        """``v_i <- normalize(d v_i + (1 - d) normalize((h_img + h_txt) / 2))`` for the batch's items
        (paper Eq. 5). Shape: index [B] (distinct), h_img/h_txt [B, n_bits]."""
        mean = normalize((h_img.detach() + h_txt.detach()) / 2)
        self.memory[index] = normalize(self.memory[index] * momentum + mean * (1 - momentum))


def nce_softmax_loss(scores: torch.Tensor) -> torch.Tensor:
    """``NCESoftmaxLoss``: mean over items of ``-log softmax(scores)[positive]``, the positive first.
    Shape: [B, 1 + K] -> scalar."""
    return -F.log_softmax(scores, dim=1)[:, 0].mean()


def contrastive_hashing_loss(h_img: torch.Tensor, h_txt: torch.Tensor, codes: torch.Tensor, rows: torch.Tensor,
                             temperature: float) -> torch.Tensor:
    """L_c (paper Eq. 3-4): each modality's outputs classified against its ±1 keys ``codes[rows[i]]``
    (:meth:`MemoryBank.keys`, the positive first), scores ``<key, h> / (temperature sqrt(n_bits))``;
    the image and text losses summed.

    Shape: h_img, h_txt [B, n_bits] (L2-normalised), codes [M, n_bits] ±1, rows [B, 1 + K] -> scalar.
    """
    scale = temperature * math.sqrt(codes.shape[-1])
    scores = (torch.cat([h_img, h_txt]) @ codes.T / scale).view(2, len(rows), -1)  # [2, B, M]
    return (nce_softmax_loss(scores[0].gather(1, rows)) + nce_softmax_loss(scores[1].gather(1, rows)))


def cross_modal_ranking_loss(h_img: torch.Tensor, h_txt: torch.Tensor, margin: float, shift: float,
                             tau: float = 1.0) -> torch.Tensor:
    """L_r (paper Eq. 8, 14; ``src/utils.py: ContrastiveLoss.forward``): a negative within ``margin`` of
    its positive keeps its similarity, one beyond loses ``shift``; then a log-sum-exp over each row
    (image queries) and each column (text queries), minus the positive, plus ``margin``.

    Shape: h_img, h_txt [B, n_bits] -> scalar.
    """
    scores = h_img @ h_txt.T
    diagonal = scores.diag()
    near_row = (scores >= diagonal[:, None] - margin).detach()  # image i against texts j
    near_col = (scores >= diagonal[None, :] - margin).detach()  # text j against images i
    cost_i2t = torch.where(near_row, scores, scores - shift)
    cost_t2i = torch.where(near_col, scores, scores - shift)
    i2t = (-cost_i2t.diag() + tau * torch.logsumexp(cost_i2t / tau, dim=1) + margin).mean()
    t2i = (-cost_t2i.diag() + tau * torch.logsumexp(cost_t2i / tau, dim=0) + margin).mean()
    return i2t + t2i


def ucch_loss(h_img: torch.Tensor, h_txt: torch.Tensor, codes: torch.Tensor, rows: torch.Tensor, alpha: float,
              temperature: float, margin: float, shift: float) -> torch.Tensor:
    """UCCH's objective (paper Eq. 15, ``UCCH.py: train``): ``alpha L_c + (1 - alpha) L_r``."""
    lc = contrastive_hashing_loss(h_img, h_txt, codes, rows, temperature)
    lr = cross_modal_ranking_loss(h_img, h_txt, margin, shift)
    return alpha * lc + (1 - alpha) * lr


def learning_rate(base: float, epoch: int) -> float:
    """The learning rate of (0-based) ``epoch`` under the released ``lr_schedu.step(epoch)`` after each
    epoch: ``base * 0.1 ** (milestones <= epoch - 1)``, first lowered in epoch 31."""
    return base * LR_GAMMA ** bisect.bisect_right(LR_MILESTONES, epoch - 1)


def negatives_generator(seed: int, iteration: int) -> torch.Generator:
    """The CPU generator of one step's negative draws: a function of (seed, iteration) alone, so a
    resumed run, or every rank of a multi-process one, draws the same rows."""
    return torch.Generator().manual_seed(seed * 1_000_003 + iteration)


@register
class Ucch(Method):
    """UCCH: contrastive hashing against a momentum memory bank of binary keys, plus cross-modal ranking
    learning, on each modality's own features (leak-free). See the module docstring for the released
    code's formulas and every departure."""

    name = "ucch"
    description = ("UCCH (Hu et al., TPAMI 2023): contrast against a momentum memory bank of binary keys "
                   "plus cross-modal ranking learning")
    defaults = {"hidden": 1024, "epochs": 20, "batch_size": 256, "lr_head": 1e-4, "betas": (0.9, 0.999),
                "val_fraction": 0.1, "patience": 0}
    params = {"alpha": 0.7, "n_negatives": 4096, "temperature": 0.9, "momentum": 0.4, "margin": 0.2,
              "shift": 0.1, "warmup_epochs": 1, "img_layers": 3, "txt_layers": 2, "weight_decay": 1e-6,
              "clip_norm": 1.0}
    fixed = {"dropout": 0.0}  # the released networks have none
    takes_loss = False
    graphable = True  # its negatives drawn on the host before the step (Plan.draws), its learning rate a schedule

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        p = self.method_params(cfg.method_params)
        problems = [
            (not 0.0 <= p["alpha"] <= 1.0, "alpha must be in [0, 1]"),
            (p["n_negatives"] < 1, "n_negatives must be >= 1"),
            (p["temperature"] <= 0, "temperature must be > 0"),
            (not p["momentum"] < 1.0, "momentum must be < 1 (<= 0: in-batch keys throughout)"),
            (p["margin"] < 0 or p["shift"] < 0, "margin and shift must be >= 0"),
            (p["warmup_epochs"] < 0, "warmup_epochs must be >= 0"),
            (p["img_layers"] < 1 or p["txt_layers"] < 1, "img_layers and txt_layers must be >= 1"),
            (p["weight_decay"] < 0 or p["clip_norm"] <= 0, "weight_decay must be >= 0 and clip_norm > 0"),
            (cfg.supervised, "it is unsupervised (supervised=True asked)"),
        ]
        for bad, message in problems:
            if bad:
                raise ValueError(f"method 'ucch': {message}; got {p}")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> UcchHasher:
        p = self.method_params(cfg.method_params)
        return UcchHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, p["img_layers"], p["txt_layers"])

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        """UCCH's networks and memory bank; Adam at the released step schedule (:func:`learning_rate`), the
        gradients clipped to ``clip_norm``; the bank is updated with each batch's codes before the update."""
        p = self.method_params(cfg.method_params)
        device, rest = setup.device, setup.rest
        model = self.initial_model(data, cfg, setup, fusion).to(device).train()
        bank = MemoryBank(len(rest), cfg.n_bits, cfg.seed).to(device)
        optimizer = adam(model.parameters(), lr=cfg.lr_head, betas=tuple(cfg.betas), weight_decay=p["weight_decay"])
        train = rest.to(device)
        group = current_group()

        def momentum(epoch: int) -> float:
            return p["momentum"] if epoch >= p["warmup_epochs"] else 0.0  # NCEAverage: epoch - warmup < 0

        def negatives(batch: Batch) -> Optional[torch.Tensor]:  # after the warm-up, drawn on the host
            if momentum(batch.epoch) <= 0:
                return None
            return bank.draw(len(batch.index), p["n_negatives"], negatives_generator(cfg.seed, batch.iteration))

        def loss(batch: Batch) -> torch.Tensor:
            index = batch.index
            img, txt, _, _, _ = batch_inputs(train, index, None, False, group)
            with autocast(device, cfg.amp):
                z_img, z_txt = model.logits(img, txt)
            z_img, z_txt = group.gather((z_img.float(), z_txt.float()), len(index))
            h_img, h_txt = hash_outputs(z_img), hash_outputs(z_txt)
            codes, rows = bank.keys(index, h_img, h_txt, batch.draws)
            out = ucch_loss(h_img, h_txt, codes, rows, p["alpha"], p["temperature"], p["margin"], p["shift"])
            bank.update(index, h_img, h_txt, momentum(batch.epoch))
            return out

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model, "bank": bank}, optimizer, train,
                    loss=loss, clip_norm=p["clip_norm"], learning_rate=lambda epoch: learning_rate(cfg.lr_head, epoch),
                    draws=negatives, scalars=lambda epoch, iteration: {"momentum": momentum(epoch)},
                    validate=validator(codes_of, "hamming", model, setup.val, rest, device),
                    graphable=self.graphable)
