"""Method 'daeh': Deep Adaptively-Enhanced Hashing with Discriminative Similarity Guidance (Shi, Zhao, Liu, Zheng,
Ou, You & Peng, IEEE TCSVT 2022), transcribed from its released code (reresearcher/DAEH, commit 97b8ff1, its
code as of 76dfdc5: the head when an audit compared them line by line, 2026-12-02; ``daeh.py`` functions
``process``, ``distance_fusion``, ``generate_similarity_matrix``, ``tri_loss``, ``cross_loss``;
``model_loader.py`` classes ``ModelWrapper``, ``myImgNet``, ``myTxtNet`` and functions ``guassianMatrix``,
``mutual_information``; ``run.py`` and ``test.sh`` for the defaults).

What the released code does:

1. **Similarity** (``distance_fusion``, once, over the training items). On the image features, the cosine
   distances ``D`` of every pair (``pdist``, the diagonal 0) are split by ``generate_similarity_matrix``: the
   mode ``m`` is the lower edge of the fullest of 100 bins ``(k/100, (k+1)/100)``; the distances ``≤ m``,
   mirrored about ``m``, and those ``> m``, mirrored, are each fitted by a Gaussian (mean ``m``, standard
   deviations ``σ_l``, ``σ_r``); ``S_img = 1`` where ``D < m - α σ_l``, ``-1`` where ``D > m + β σ_r``, else 0.
   Text: ``S_txt = 1`` where the euclidean distance of the raw tag vectors is ``≤ 1``, ``-1`` where ``≥ 5``.
   ``S = 1`` where both are 1, ``-1`` where either is -1, else 0; where ``S = 0`` it is filled with
   ``2 · (a1 · cos_T + (1 - a1) · cos_I) - 1`` (cosines of the L2-normalised features). A batch uses
   ``S[idx][:, idx]``.
2. **Three code sets** per batch: the teacher's ``c_tea`` (``ModelWrapper``: an ImageNet ViT-B/16 fine-tuned on
   the pixels, then ReLU, Linear, tanh), the image student's ``f`` (``myImgNet``: Linear(4096, 4096), ReLU,
   Dropout(0.5), Linear(4096, bits), tanh, on VGG features) and the text student's ``g`` (``myTxtNet``: the same
   on the tag vector, last layer's weights N(0, 0.3)). The teacher also maps its code to a fake 1000-d attribute
   (Linear 256, 512, 1000, ReLUs) and back to a code (Linear 512, 256, bits, tanh).
3. **Loss** (``process``): with unit-normalised codes, ``I`` the identity of the batch and mse a mean,
   ``tri_loss(f, g, c_tea)``: ``w_tri · P(f, g) + w_teacher · (P(f, c_tea) + P(g, c_tea))``, each ``P(a, b) =
   mse(diag(a bᵀ), 1.5) + mse(a bᵀ ∘ (1 - I), S ∘ (1 - I)) + mse(a aᵀ, b bᵀ)`` (in ``tri_loss`` the pair, the
   off-diagonal and the consistency terms are summed group by group, the same sum); plus ``γ · (Σ(code' -
   c_tea)² + Σ(att' - att)²) / B`` (``att`` the frozen ViT's ImageNet logits of the image); plus ``w_cross ·
   P(...)``, the **adaptive enhancement**: the matrix-based Rényi mutual information (α = 2, σ = 1) of ``S``'s
   rows with ``f`` and with ``g`` is compared; the student of the higher one leaves the other to be pulled to
   the teacher: ``P(c_tea, g)`` when ``MI(S, f) > MI(S, g)``, else ``P(f, c_tea)`` (``cross_loss``).
   ``guassianMatrix`` is transcribed as released: ``K_ij = exp((G_ij - G_jj) / σ²)``, ``G = X Xᵀ`` (not the
   symmetric Gaussian kernel), its eigenvalues taken by ``torch.eig`` (real and imaginary parts, each
   ``|.|^α`` summed).
4. SGD (lr 1e-3, momentum 0.9, weight decay 5e-4) on the three networks, one step on the summed loss.
5. **Codes** (``evaluate``, ``generate_code(..., 'stu')``): ``sign(myImgNet(image features))`` from the image
   alone, ``sign(myTxtNet(text))`` from the text alone. The teacher sees only images and encodes nothing:
   **leak-free**.

Departures, each on purpose:

* Precomputed features only. The networks see them centred by their training mean and L2-normalised
  (:class:`~ucmfh.models.hashing.FeatureHasher`; the released students see raw VGG features and tag vectors);
  the similarity is computed as released, from the features themselves (cosines of the uncentred features).
  The teacher's ViT, fine-tuned on pixels, is not available: the teacher is its ``ModelWrapper`` heads (ReLU,
  Linear, tanh; the attribute MLPs) on the same image features the image student sees.
* The attribute target (a frozen ImageNet classifier's 1000 logits of each image) is not available: its term
  is dropped; the teacher's code reconstruction through the fake attribute (``code_loss``) stays, at ``γ / B``.
* The text rule ``≤ 1`` / ``≥ 5`` is a rule of raw tag counts (a squared euclidean distance of binary tags is a
  count of differing tags) with no counterpart for dense text embeddings: the text side gets the image side's
  rule (``generate_similarity_matrix`` on text cosine distances, the same α and β).
* The histogram and the two Gaussian fits are computed in one pass over the rows in chunks, and every batch's
  ``S`` from its features, never N x N at once (the released code builds N x N numpy matrices, on its 10,000
  training items).
* All training items are used (the released code draws 10,000 of the database).
* The mutual information's entropies (order α = 2) in closed form, ``-log Σ_ij K_ij K_ji``, not from
  ``torch.eig``'s eigenvalues: the same figure to rounding (the kernel's eigenvalues are real, and their squares
  sum to the trace of ``K²``; :func:`mutual_informations` says why), with no overflow where the released
  kernel's entries overflow (there ``guassianMatrix``'s NaN and inf were set to 0), and no host sync on a GPU,
  so the step may be captured as a CUDA graph.
* Model selection: the best epoch on the validation split carved from the training split (``val_fraction``,
  with ``patience``), not the best query-set MAP every 2 epochs of ``process``.
* The codes are ``sign`` with sign(0) = +1 (this package's codes); the release's ``torch.sign`` gives 0 at 0
  (a code with zeros).
* The captions of one image (ids of a caption set) are not used (DAEH is unsupervised; they share the image's
  features). On several processes each rank computes the whole global batch (the mutual information and the
  batch's ``S`` need it); the gradients are the same on every rank.

Defaults are ``run.py``'s (``test.sh`` runs MIRFlickr-25K): α = β = 2, γ = 10⁻³ (``--gamma -3``, an
exponent), w_tri = 4 (``--ceshi-tri``), w_teacher = 1 (``--ceshi-tea``), w_cross = 0.1 (``--ceshi-cross``),
a1 = 0.3, batch 18, 30 epochs, SGD as above.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.methods.base import Method
from ucmfh.models.fusion import FusionEncoder
from ucmfh.methods.registry import register
from ucmfh.models.hashing import FeatureHasher
from ucmfh.evaluation import codes_of
from ucmfh.similarity import cosine_similarity, normalize
from ucmfh.trainer import Batch, Plan, Setup
from ucmfh.selection import validator
from ucmfh.amp import autocast
from ucmfh.optim import sgd

N_BINS = 100  # generate_similarity_matrix: bins of width 1/100 from 0
PAIR_TARGET = 1.5  # tri_loss, cross_loss: the target of a pair's cosine
MI_SIGMA = 1.0  # process: mutual_information(targets, codes, 1.0, 1.0, 2.0): both σ 1, order α 2
ATTRIBUTE_WIDTHS = (256, 512, 1000)  # ModelWrapper.fake_attribute


# ------------------------------------------------------------ similarity


def bin_edges(device: Optional[torch.device] = None) -> torch.Tensor:
    """The histogram's edges as ``generate_similarity_matrix`` accumulates them (``cur += 1/100``). Shape: [101]."""
    edges, cur = [], 0.0
    for _ in range(N_BINS + 1):
        edges.append(cur)
        cur += 1.0 / N_BINS
    return torch.tensor(edges, dtype=torch.float64, device=device)


def cosine_distances(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``1 - cos``, as ``pdist(..., 'cosine')``. Shape: [N, d], [M, d] -> [N, M]."""
    return 1.0 - cosine_similarity(x, y)


@torch.no_grad()
def distance_split(x: torch.Tensor, chunk: int = 256, done: Optional[Callable[[int], Any]] = None,
                   ) -> Tuple[float, float, float]:
    """``(m, σ_l, σ_r)`` of ``generate_similarity_matrix`` over the cosine distances of every pair of rows of ``x``
    (the diagonal 0, as ``squareform``): ``m`` the lower edge of the fullest bin ``(e_k, e_{k+1})`` (the first of
    equals), ``σ_l`` and ``σ_r`` the standard deviations (``norm.fit``) of the distances ``≤ m`` and ``> m``, each
    mirrored about ``m`` (so their means are ``m``). One pass over the rows in chunks: each distance's bucket
    ``e_{k-1} < d ≤ e_k`` gets its count, sum and sum of squares, so that any ``m`` (an edge) splits them.
    ``done(rows)`` is told of each chunk of rows done (a progress bar's ``update``).

    Shape: x [N, d] -> three floats."""
    edges = bin_edges(x.device)
    n_buckets = N_BINS + 2  # k = 0 (d <= 0) .. N_BINS + 1 (d > the last edge)
    counts = torch.zeros(n_buckets, dtype=torch.int64, device=x.device)  # the open bins' counts, by k
    stats = torch.zeros(3, n_buckets, dtype=torch.float64, device=x.device)  # per bucket: count, Σd, Σd²
    for start in range(0, x.shape[0], chunk):
        d = _chunk_distances(x, start, chunk).flatten()
        k = torch.bucketize(d, edges)  # edges[k-1] < d <= edges[k]
        inside = (k >= 1) & (k <= N_BINS) & (d < edges[k.clamp(max=N_BINS)])  # open bins: d = an edge is in none
        counts += torch.bincount(k[inside], minlength=n_buckets)
        weights = (torch.ones_like(d), d, d * d)
        stats += torch.stack([torch.bincount(k, weights=w, minlength=n_buckets) for w in weights])
        if done is not None:
            done(min(chunk, x.shape[0] - start))
    j = int(counts[1:N_BINS + 1].argmax())  # bin (edges[j], edges[j+1]): m = edges[j]; buckets <= j hold d <= m
    m = float(edges[j])

    def sigma(part: torch.Tensor) -> float:  # sqrt(mean((d - m)²)) from count, Σd, Σd²
        n, s1, s2 = part.sum(dim=1).tolist()
        return math.sqrt(max(s2 - 2 * m * s1 + m * m * n, 0.0) / n) if n else 0.0

    return m, sigma(stats[:, :j + 1]), sigma(stats[:, j + 1:])


def _chunk_distances(x: torch.Tensor, start: int, chunk: int) -> torch.Tensor:
    """Cosine distances of rows ``start:start+chunk`` to all rows, in float64, the diagonal exactly 0."""
    d = cosine_distances(x[start:start + chunk], x).double()
    rows = torch.arange(d.shape[0], device=x.device)
    d[rows, rows + start] = 0.0
    return d


def split_similarity(d: torch.Tensor, split: Tuple[float, float, float], alpha: float, beta: float) -> torch.Tensor:
    """``generate_similarity_matrix``'s decision: 1 below ``m - α σ_l``, -1 above ``m + β σ_r``, else 0.

    Shape: d [B, B] -> [B, B]."""
    m, sigma_l, sigma_r = split
    return (d < m - alpha * sigma_l).to(d.dtype) - (d > m + beta * sigma_r).to(d.dtype)


def batch_similarity(img: torch.Tensor, txt: torch.Tensor, img_split: Tuple[float, float, float],
                     txt_split: Tuple[float, float, float], alpha: float, beta: float, a1: float) -> torch.Tensor:
    """The batch's block of ``distance_fusion``'s ``conS``: ±1 where the two modalities' decisions agree on near
    (both 1) or either says far (-1), else ``2 · (a1 cos_T + (1 - a1) cos_I) - 1``.

    Shape: img [B, d_img], txt [B, d_txt] -> S [B, B]."""
    s_img = split_similarity(cosine_distances(img, img), img_split, alpha, beta)
    s_txt = split_similarity(cosine_distances(txt, txt), txt_split, alpha, beta)
    s = (s_img + s_txt == 2).to(img.dtype) - ((s_img == -1) | (s_txt == -1)).to(img.dtype)
    pair = 2.0 * (a1 * cosine_similarity(txt, txt) + (1.0 - a1) * cosine_similarity(img, img)) - 1.0
    return torch.where(s != 0, s, pair)


# ------------------------------------------------------------ mutual information (the enhancement's choice)


def _pair_exponents(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """``log(K_ij K_ji)`` of the released kernel ``K`` (``guassianMatrix``: ``K_ij = exp((G_ij - G_jj) / σ²)``,
    ``G = X Xᵀ``): ``(2 G_ij - G_ii - G_jj) / σ²``, that is ``-|x_i - x_j|² / σ²``, never above 0.

    Shape: [B, d] -> [B, B]."""
    g = x @ x.T
    d = g.diagonal()
    return (2.0 * g - d[:, None] - d[None, :]) / sigma ** 2


@torch.no_grad()
def mutual_informations(x: torch.Tensor, ys: Sequence[torch.Tensor], sigma_x: float = MI_SIGMA,
                        sigma_y: float = MI_SIGMA) -> torch.Tensor:
    """``model_loader.mutual_information`` of ``x`` with each of ``ys``: the matrix-based Rényi entropies of order
    α = 2 of the kernels of ``x`` and ``y`` (each divided by B) and of their Hadamard product (times B),
    ``H_x + H_y - H_xy``, in closed form, with no eigen-solve.

    Why it is the released figure: an entropy is ``-log Σ_k (|Re λ_k|² + |Im λ_k|²)`` over the kernel's
    eigenvalues ``λ``. ``K = A D`` (``A = exp(G / σ²)`` elementwise, symmetric; ``D = diag(exp(-G_jj / σ²))``,
    positive) is similar to the symmetric ``D^½ A D^½``: its eigenvalues are real, and their squares sum to
    ``tr(K²) = Σ_ij K_ij K_ji``, each term ``exp(-|x_i - x_j|² / σ²)`` (:func:`_pair_exponents`); the Hadamard
    product of two such kernels is one again. So ``H = 2 log B - log Σ_ij exp(e_ij)`` with ``e`` the pair
    exponents (of ``x``, of ``y``, their sum for the product), and ``MI = 2 log B - L_x - L_y + L_xy``, each
    ``L`` a log-sum-exp. It is ``torch.eig``'s figure to rounding where the released kernel is finite (the
    test checks it against the eigenvalues); it never overflows, where the released kernel (entries up to
    ``exp(|x|² / 4σ²)``) can, and it waits for no host: on a GPU the eigen-solve runs on the host each step.

    Shape: x [B, d_x], each y [B, d_y] -> [len(ys)]."""
    n = x.shape[0]
    e_x = _pair_exponents(x, sigma_x)
    e_ys = torch.stack([_pair_exponents(y, sigma_y) for y in ys])
    l_x = torch.logsumexp(e_x.flatten(), 0)
    l_ys = torch.logsumexp(e_ys.flatten(1), 1)
    l_xys = torch.logsumexp((e_ys + e_x).flatten(1), 1)
    return 2.0 * math.log(n) - l_x - l_ys + l_xys


def mutual_information(x: torch.Tensor, y: torch.Tensor, sigma_x: float = MI_SIGMA,
                       sigma_y: float = MI_SIGMA) -> torch.Tensor:
    """:func:`mutual_informations` of ``x`` with ``y`` alone. Shape: x [B, d_x], y [B, d_y] -> scalar."""
    return mutual_informations(x, [y], sigma_x, sigma_y)[0]


# ------------------------------------------------------------ losses


def pair_loss(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``cross_loss(a, b)``: each pair's cosine to 1.5, the other pairs' cosines to ``S``, and the two code sets'
    own cosine matrices to each other.

    Shape: a, b [B, n_bits]; s [B, B] -> scalar."""
    a, b = normalize(a), normalize(b)
    ab = a @ b.T
    off = 1.0 - torch.eye(len(s), device=s.device, dtype=s.dtype)
    return (F.mse_loss(ab.diagonal(), torch.full_like(ab.diagonal(), PAIR_TARGET)) + F.mse_loss(ab * off, s * off)
            + F.mse_loss(b @ b.T, a @ a.T))


def daeh_loss(f: torch.Tensor, g: torch.Tensor, teacher: torch.Tensor, code: torch.Tensor, s: torch.Tensor,
              w_tri: float, w_teacher: float, w_cross: float, gamma: float) -> torch.Tensor:
    """``process``'s loss without the attribute term: ``tri_loss + γ · code_loss / B + w_cross · cross_loss``, the
    enhanced pair chosen by mutual information with ``S`` (:func:`mutual_information`).

    Shape: f, g, teacher, code [B, n_bits] (``code`` the teacher's code reconstructed through the fake attribute);
    s [B, B] -> scalar."""
    tri = w_tri * pair_loss(f, g, s) + w_teacher * (pair_loss(f, teacher, s) + pair_loss(g, teacher, s))
    reconstruction = ((code - teacher) ** 2).sum() / len(s)
    # both candidates computed and one kept on the device: an ``if`` on the comparison would make the host
    # wait for the device every step; the gradient is the kept one's alone, as with the branch
    mi_f, mi_g = mutual_informations(s, [f, g])
    enhance = torch.where(mi_f > mi_g, pair_loss(teacher, g, s), pair_loss(f, teacher, s))
    return tri + gamma * reconstruction + w_cross * enhance


# ------------------------------------------------------------ the teacher (training only)


class DaehTeacher(nn.Module):
    """``ModelWrapper``'s heads on image features (its ViT backbone replaced by the precomputed features):
    ReLU, Linear, tanh gives the teacher's code; an MLP to a fake 1000-d attribute and one back to a code.

    Shape: img [B, d_img] -> code [B, n_bits], reconstructed code [B, n_bits]."""

    def __init__(self, d_img: int, n_bits: int) -> None:
        super().__init__()
        w1, w2, w3 = ATTRIBUTE_WIDTHS
        self.hash_layer = nn.Sequential(nn.ReLU(), nn.Linear(d_img, n_bits), nn.Tanh())
        self.fake_attribute = nn.Sequential(nn.Linear(n_bits, w1), nn.ReLU(), nn.Linear(w1, w2), nn.ReLU(),
                                            nn.Linear(w2, w3), nn.ReLU())
        self.attribute_code = nn.Sequential(nn.Linear(w3, w2), nn.ReLU(), nn.Linear(w2, w1), nn.ReLU(),
                                            nn.Linear(w1, n_bits), nn.Tanh())

    def forward(self, img: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        code = self.hash_layer(img)
        return code, self.attribute_code(self.fake_attribute(code))


# ------------------------------------------------------------ the method


@register
class Daeh(Method):
    """DAEH (TCSVT 2022): an image teacher and two students learn from a similarity split by Gaussian fits,
    the student the similarity explains less pulled to the teacher each batch. The transcription, its sources
    and every departure are in this module's docstring."""

    name = "daeh"
    in_memory = 'fits its similarity to the distances of every pair of training items'
    description = ("DAEH (Shi et al., TCSVT 2022): image teacher and per-modality students on a discriminative "
                   "similarity, adaptively enhanced by mutual information (released code reresearcher/DAEH)")
    defaults = {"hidden": 4096, "dropout": 0.5, "lr_head": 1e-3, "batch_size": 18, "epochs": 30,
                "val_fraction": 0.1, "patience": 10}
    params = {"alpha": 2.0, "beta": 2.0, "gamma": 1e-3, "w_tri": 4.0, "w_teacher": 1.0, "w_cross": 0.1, "a1": 0.3,
              "momentum": 0.9, "weight_decay": 5e-4}
    takes_loss = False
    graphable = True

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        p = self.method_params(cfg.method_params)
        if not 0.0 <= p["a1"] <= 1.0 or min(p["gamma"], p["w_tri"], p["w_teacher"], p["w_cross"]) < 0:
            raise ValueError(f"method 'daeh': a1 must be in [0, 1] and gamma and the weights >= 0, got {p}")
        if min(p["alpha"], p["beta"]) < 0:  # how many sigmas below / above the mode a pair is similar / dissimilar
            raise ValueError(f"method 'daeh': alpha and beta must be >= 0, got alpha={p['alpha']}, beta={p['beta']}")
        if not 0.0 <= p["momentum"] < 1.0 or p["weight_decay"] < 0:
            raise ValueError(f"method 'daeh': momentum must be in [0, 1) and weight_decay >= 0, got {p}")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        # myImgNet, myTxtNet: hidden 4096, dropout 0.5
        model = FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)
        with torch.no_grad():
            model.txt_head.net[-1].weight.normal_(0.0, 0.3)  # myTxtNet: fc_encode ~ N(0, 0.3)
        return model

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        p = self.method_params(cfg.method_params)
        device, rest = setup.device, setup.rest
        model = self.initial_model(data, cfg, setup, fusion)
        teacher = DaehTeacher(data.d_img, cfg.n_bits)
        model.to(device).train()
        teacher.to(device).train()
        optimizer = sgd([*model.parameters(), *teacher.parameters()], lr=cfg.lr_head, momentum=p["momentum"],
                        weight_decay=p["weight_decay"])
        with torch.no_grad():  # once: the networks' inputs (centred), the similarity's (not centred, as released)
            img_all, txt_all = model.inputs(rest.img.to(device), rest.txt.to(device))
            sim_img, sim_txt = normalize(rest.img.to(device)), normalize(rest.txt.to(device))
        with setup.bar(2 * len(rest), "DAEH: distances of every pair of training items") as bar:
            img_split, txt_split = distance_split(sim_img, done=bar.update), distance_split(sim_txt, done=bar.update)

        def loss(batch: Batch) -> torch.Tensor:
            index = batch.index
            img, txt = img_all[index], txt_all[index]  # the whole global batch on every rank
            s = batch_similarity(sim_img[index], sim_txt[index], img_split, txt_split, p["alpha"], p["beta"], p["a1"])
            with autocast(device, cfg.amp):
                logits = model.img_head(img), model.txt_head(txt)
                out = teacher(img)
            f, g = (torch.tanh(x.float()) for x in logits)
            code_teacher, code = (x.float() for x in out)
            return daeh_loss(f, g, code_teacher, code, s, p["w_tri"], p["w_teacher"], p["w_cross"], p["gamma"])

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model, "teacher": teacher}, optimizer, rest,
                    loss=loss, validate=validator(codes_of, "hamming", model, setup.val, rest, device),
                    graphable=self.graphable)
