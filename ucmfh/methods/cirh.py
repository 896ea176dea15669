"""Method 'cirh': Correlation-Identity Reconstruction Hashing (Zhu, Wu, Li, Zhang, Guan & Shen, "Work
Together: Correlation-Identity Reconstruction Hashing for Unsupervised Cross-modal Retrieval", IEEE TKDE 2022),
transcribed from its released code (XizeWu/CIRH, commit 0f6439d, its code as of b6d16f3: the head when an audit
compared them line by line, 2026-12-02; ``my_opt.py`` class ``PCIRH``, ``models.py`` classes
``MyNet``, ``Img_Net``, ``Txt_Net``, ``main_mir.py`` for the defaults).

What the released code does, each epoch, on batches of the shuffled training split:

1. **Similarity** (``PCIRH.cal_similarity``, once, over the whole training split of N items, on L2-normalised
   features): ``S1 = a1 · Î Îᵀ + (1 - a1) · T̂ T̂ᵀ``; in each row the ``K`` smallest entries are set to 0;
   ``S2 = 2 / (1 + exp(-S1)) - 1 + I`` (that is ``tanh(S1 / 2) + I``), made symmetric ``(S2 + S2ᵀ) / 2``;
   ``S = a2 · S1 + (1 - a2) · S2`` (not symmetric: the zeroing is per row). A batch uses ``S[idx][:, idx]``.
2. **Neighbour mixing** (``train_method``, ``NN_select``): each item's features become ``0.7 x + 0.2 x₃ +
   0.1 x₄``, x₃ and x₄ its third and fourth largest entries of the batch's ``S`` row (the largest is the item
   itself; the released slice ``[-4:-1]`` skips the second), the same neighbours for both modalities.
3. **The collaborative network** (``MyNet``, sees both modalities, training only): per modality a 512-d
   encoder (Linear, BN, ReLU, then L2-normalised rows ``V``) and a graph layer ``ReLU(BN(S · Linear(V)))``;
   a joint graph layer over both modalities' ``V`` stacked, with ``[[S, I], [I, S]]``, its BN over the 2B
   rows, the two halves summed, ReLU: ``V_J``; ``H_I = BN(Linear([G_I, V_J]))``, ``H_T = BN(Linear([V_J,
   G_T]))``, ``H_J = BN(Linear(V_J))``, ``H = tanh(BN(Linear([H_I, H_J, H_T])))``, ``B = sign(H)``; decoders
   (Linear to 512, BN, ReLU, Linear to d, BN) of ``H + tanh(H_I)`` and ``H + tanh(H_T)``.
   Its loss: ``λ1 · (mse(dec_I, x̃_I) + mse(dec_T, x̃_T)) + λ2 · (mse(S, cos(H_I)) + mse(S, cos(H_T)) +
   mse(S, cos(H))) + mse(H, B)`` (``train_method``, ``loss_method``; x̃ the mixed features, mse a mean over
   elements, cos(X) the batch's cosine matrix of X with itself).
4. **Hash functions** (``Img_Net``, ``Txt_Net``, ``train_Hashfunc``): image ``Linear(d_img, 4096), ReLU,
   Dropout(0.3), Linear(4096, bits), tanh``; text the same with a hidden width of ``d_txt``; the last layer's
   weights drawn from N(0, 1). On the same batches, with the ``B`` of step 3 as targets (no gradient):
   ``mse(u_I, B) + mse(u_T, B) + mse(u_I, u_T) + β · (mse(cos(u_I, u_T), S) + mse(cos(u_I), S) +
   mse(cos(u_T), S))``.
5. **Codes** (``utils.compress``): ``sign(Img_Net(image))`` from the image alone, ``sign(Txt_Net(text))`` from
   the text alone. The collaborative network is never used to encode: **leak-free**.

The two optimisers of step 3 (Adam, lr ``lr_net``) and step 4 (Adam, lr ``lr_head`` for each head) become one
Adam with a parameter group each: the same updates. The released code runs every step-3 batch of an epoch,
then every step-4 batch on the same batches (the collected ``B`` in visiting order); here each batch's
step 3 and step 4 run together. The step-4 updates of a batch depend only on its ``B``, which is computed
before the network's update on that batch either way, so the result is the same.

Departures, each on purpose:

* Inputs are the dataset's precomputed features (the released ones: image features and tag vectors of
  ``.mat`` files, ``load_data.py``, not in the repository). The network
  and the heads see them centred by their training mean and L2-normalised
  (:class:`~ucmfh.models.hashing.FeatureHasher`); the released heads see them L2-normalised, not centred, and
  the released network raw (its reconstruction targets, the mixed features, are raw too). The similarity is
  computed as released, from the L2-normalised features, not centred; ``centred_similarity = True`` (not
  released) computes it from the networks' centred inputs.
* ``K`` is a share of the training split, ``k_fraction`` (K / N), not a count: the released K = 3000 with
  MIRFlickr's N = 5000 training items (the field's usual split; the ``.mat`` files are not released with the
  code) is 0.6. The similarity is never stored whole: the K-th smallest of each
  row is found once (rows in chunks; the threshold midway to the next) and each batch's ``S`` rebuilt from its
  features, zeroing the entries below their row's threshold: exactly ``S[idx][:, idx]`` but for ties.
* The released ``train_Hashfunc`` takes ``S_cmm[k·bs:(k+1)·bs, k·bs:(k+1)·bs]``, a block by *position* in the
  training split, where its batch holds the shuffled items of ``record_index`` (a defect: the heads' ``β``
  term pairs each batch with an unrelated block). Here the heads see the batch's own ``S``, as step 3 does.
* A batch under 4 items (never at the defaults) takes its last-ranked items where x₃ or x₄ is missing.
* Model selection: the best epoch on the validation split carved from the training split (``val_fraction``,
  with ``patience``), scored after every epoch, not the query-set MAP every 10 epochs of ``main_mir.py``.
* The codes are ``sign`` with sign(0) = +1 (this package's codes); the release's ``torch.sign`` gives 0 at 0
  (a code with zeros).
* The captions of one image (ids of a caption set) are not used: CIRH is unsupervised; they share their
  image's features, so ``S`` already ties them. On several processes each rank computes the whole global
  batch (its batch-norm and graph layers need it); the gradients are the same on every rank.

Defaults are ``main_mir.py``'s (MIRFlickr, the README's demo): λ1 = 10, λ2 = 1, β = 0.01, a1 = a2 = 0.6,
K = 3000 of 5000, lr 1e-3 for the network and 1e-4 for the heads, Adam's default betas, batch 512,
60 epochs. (``main_nus.py``: lr_net 1e-4, K 3300, a1 = a2 = 0.5, 120 epochs; ``main_coco.py``: lr_head
5e-4, a1 = 0.1, a2 = 0.3, 100 epochs.)
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

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
from ucmfh.optim import adam

# an item, its third and fourth most similar item of the batch (my_opt.PCIRH.train_method)
MIX_WEIGHTS = (0.7, 0.2, 0.1)


# ------------------------------------------------------------ similarity


def fused_similarity(img: torch.Tensor, txt: torch.Tensor, img_b: torch.Tensor, txt_b: torch.Tensor,
                     a1: float) -> torch.Tensor:
    """``S1`` before zeroing: ``a1 · cos(img, img_b) + (1 - a1) · cos(txt, txt_b)``.

    Shape: img [N, d_img], txt [N, d_txt], img_b [M, d_img], txt_b [M, d_txt] -> [N, M]."""
    return a1 * cosine_similarity(img, img_b) + (1.0 - a1) * cosine_similarity(txt, txt_b)


@torch.no_grad()
def row_thresholds(img: torch.Tensor, txt: torch.Tensor, a1: float, n_low: int, chunk: int = 1024,
                   done: Optional[Callable[[int], Any]] = None) -> torch.Tensor:
    """Each row's threshold of ``S1`` over the whole split: midway between its ``n_low``-th and ``n_low + 1``-th
    smallest entries (``-inf`` for ``n_low = 0``), so the entries below it are the ``n_low`` that
    ``cal_similarity`` sets to zero, whatever the rounding of a batch's own product. Rows in chunks, never
    N x N at once; ``done(rows)`` is told of each chunk done (a progress bar's ``update``).

    Shape: img [N, d_img], txt [N, d_txt] -> [N]."""
    n = img.shape[0]
    if not 0 <= n_low < n:
        raise ValueError(f"n_low must be in [0, {n}), got {n_low}")
    if n_low == 0:
        return torch.full((n,), -torch.inf, device=img.device, dtype=img.dtype)
    out = torch.empty(n, device=img.device, dtype=img.dtype)
    for start in range(0, n, chunk):
        rows = slice(start, start + chunk)
        s1 = fused_similarity(img[rows], txt[rows], img, txt, a1)
        kth = s1.kthvalue(n_low, dim=1, keepdim=True).values
        out[rows] = ((kth + _next_smallest(s1, kth, n_low)) / 2).squeeze(1)
        if done is not None:
            done(min(chunk, n - start))
    return out


def _next_smallest(s: torch.Tensor, kth: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's ``k + 1``-th smallest entry, given its ``k``-th, without a second selection: the ``k``-th
    itself where more than ``k`` entries are at most it (a tie), else the smallest entry above it.

    Shape: s [B, N], kth [B, 1] -> [B, 1]."""
    above = torch.where(s > kth, s, torch.full_like(s, torch.inf)).amin(dim=1, keepdim=True)
    return torch.where((s <= kth).sum(dim=1, keepdim=True) > k, kth, above)


def batch_similarity(img: torch.Tensor, txt: torch.Tensor, thresholds: torch.Tensor, a1: float,
                     a2: float) -> torch.Tensor:
    """The batch's block of CIRH's similarity ``S`` (``cal_similarity``), given each row's threshold
    (:func:`row_thresholds`).

    Shape: img [B, d_img], txt [B, d_txt] (L2-normalised rows), thresholds [B] -> S [B, B]."""
    s1 = fused_similarity(img, txt, img, txt, a1)
    s1 = torch.where(s1 < thresholds[:, None], torch.zeros_like(s1), s1)
    s2 = torch.tanh(s1 / 2)  # = 2 / (1 + exp(-S1)) - 1
    s2 = (s2 + s2.T) / 2 + torch.eye(len(s1), device=s1.device, dtype=s1.dtype)
    return a2 * s1 + (1.0 - a2) * s2


def neighbour_mix(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``0.7 x + 0.2 x₃ + 0.1 x₄``: x₃, x₄ the items of each row's third and fourth largest ``s`` (``NN_select``).

    Shape: x [B, d], s [B, B] -> [B, d]."""
    order = s.topk(min(4, len(s)), dim=1).indices  # descending; column 0 is the item itself
    third, fourth = order[:, min(2, order.shape[1] - 1)], order[:, min(3, order.shape[1] - 1)]
    w0, w3, w4 = MIX_WEIGHTS
    return w0 * x + w3 * x[third] + w4 * x[fourth]


# ------------------------------------------------------------ the collaborative network (training only)


def _dense(d_in: int, d_out: int, relu: bool = True) -> nn.Sequential:
    layers = [nn.Linear(d_in, d_out), nn.BatchNorm1d(d_out)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True)) if relu else nn.Sequential(*layers)


class CirhNet(nn.Module):
    """CIRH's correlation-identity network (``models.MyNet``): intra- and cross-modal graph layers over the
    batch's similarity, a joint code ``H`` and one decoder per modality. It sees both modalities, so it only
    trains; it encodes nothing.

    Shape: img [B, d_img], txt [B, d_txt], s [B, B] -> h_img, h_txt, h [B, n_bits], dec_img [B, d_img],
    dec_txt [B, d_txt].
    """

    def __init__(self, d_img: int, d_txt: int, n_bits: int, width: int = 512) -> None:
        super().__init__()
        self.enc_img, self.enc_txt = _dense(d_img, width), _dense(d_txt, width)
        self.gcn_img, self.gcn_txt, self.gcn_joint = (nn.Linear(width, width) for _ in range(3))
        self.bn_img, self.bn_txt, self.bn_joint = (nn.BatchNorm1d(width) for _ in range(3))
        self.head_joint = nn.Linear(width, n_bits)
        self.head_img, self.head_txt = nn.Linear(2 * width, n_bits), nn.Linear(2 * width, n_bits)
        self.head_all = nn.Linear(3 * n_bits, n_bits)
        self.bn_h_img, self.bn_h_txt, self.bn_h_joint, self.bn_h = (nn.BatchNorm1d(n_bits) for _ in range(4))
        self.dec_img = nn.Sequential(_dense(n_bits, width), _dense(width, d_img, relu=False))
        self.dec_txt = nn.Sequential(_dense(n_bits, width), _dense(width, d_txt, relu=False))

    def forward(self, img: torch.Tensor, txt: torch.Tensor,
                s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b = img.shape[0]
        v_img, v_txt = F.normalize(self.enc_img(img), dim=1), F.normalize(self.enc_txt(txt), dim=1)
        g_img = F.relu(self.bn_img(s @ self.gcn_img(v_img)))
        g_txt = F.relu(self.bn_txt(s @ self.gcn_txt(v_txt)))
        eye = torch.eye(b, device=s.device, dtype=s.dtype)
        s_joint = torch.cat([torch.cat([s, eye], 1), torch.cat([eye, s], 1)], 0)  # [2B, 2B]
        joint = self.bn_joint(s_joint @ self.gcn_joint(torch.cat([v_img, v_txt], 0)))
        v_joint = F.relu(joint[:b] + joint[b:])
        h_joint = self.bn_h_joint(self.head_joint(v_joint))
        h_img = self.bn_h_img(self.head_img(torch.cat([g_img, v_joint], 1)))
        h_txt = self.bn_h_txt(self.head_txt(torch.cat([v_joint, g_txt], 1)))
        h = torch.tanh(self.bn_h(self.head_all(torch.cat([h_img, h_joint, h_txt], 1))))
        return h_img, h_txt, h, self.dec_img(h + torch.tanh(h_img)), self.dec_txt(h + torch.tanh(h_txt))


# ------------------------------------------------------------ losses


def _self_cosine(x: torch.Tensor) -> torch.Tensor:
    return cosine_similarity(x, x)


def net_loss(h_img: torch.Tensor, h_txt: torch.Tensor, h: torch.Tensor, dec_img: torch.Tensor,
             dec_txt: torch.Tensor, img_mix: torch.Tensor, txt_mix: torch.Tensor, s: torch.Tensor,
             lambda1: float, lambda2: float) -> torch.Tensor:
    """The network's loss (``train_method``: ``loss_CCR + loss_method``): reconstruction of the mixed features,
    each code's cosine matrix to ``S``, and ``H`` to its sign.

    Shape: h_img, h_txt, h [B, n_bits]; dec_img, img_mix [B, d_img]; dec_txt, txt_mix [B, d_txt]; s [B, B]
    -> scalar."""
    reconstruction = lambda1 * (F.mse_loss(dec_img, img_mix) + F.mse_loss(dec_txt, txt_mix))
    correlation = lambda2 * sum(F.mse_loss(s, _self_cosine(x)) for x in (h_img, h_txt, h))
    return reconstruction + correlation + F.mse_loss(h, torch.sign(h).detach())


def head_loss(u_img: torch.Tensor, u_txt: torch.Tensor, codes: torch.Tensor, s: torch.Tensor,
              beta: float) -> torch.Tensor:
    """The hash functions' loss (``train_Hashfunc``): each head's tanh output to the network's codes and to the
    other's, and ``β`` times their cosine matrices (across and within modalities) to ``S``.

    Shape: u_img, u_txt, codes [B, n_bits] (codes ±1, no gradient); s [B, B] -> scalar."""
    codes = codes.detach()
    to_codes = F.mse_loss(u_img, codes) + F.mse_loss(u_txt, codes) + F.mse_loss(u_img, u_txt)
    similarity = (F.mse_loss(cosine_similarity(u_img, u_txt), s) + F.mse_loss(_self_cosine(u_img), s)
                  + F.mse_loss(_self_cosine(u_txt), s))
    return to_codes + beta * similarity


# ------------------------------------------------------------ the method


@register
class Cirh(Method):
    """CIRH (TKDE 2022): a collaborative network over both modalities and the batch's similarity graph
    learns codes ``B``; one hash function per modality learns to give ``B`` from its own features alone.
    The transcription, its sources and every departure are in this module's docstring."""

    name = "cirh"
    in_memory = "ranks every training item against all the others (its similarity's zeroing is per row)"
    description = ("CIRH (Zhu et al., TKDE 2022): a graph network over both modalities learns codes, per-modality "
                   "hash functions learn them (released code XizeWu/CIRH)")
    defaults = {"hidden": 4096, "dropout": 0.3, "lr_head": 1e-4, "betas": (0.9, 0.999), "batch_size": 512,
                "epochs": 60, "val_fraction": 0.1, "patience": 10}
    params = {"lambda1": 10.0, "lambda2": 1.0, "beta": 0.01, "a1": 0.6, "a2": 0.6, "k_fraction": 0.6,
              "lr_net": 1e-3, "width": 512, "centred_similarity": False}
    takes_loss = False
    graphable = True

    def check(self, cfg: HashConfig) -> None:
        super().check(cfg)
        p = self.method_params(cfg.method_params)
        if not (0.0 <= p["a1"] <= 1.0 and 0.0 <= p["a2"] <= 1.0 and 0.0 <= p["k_fraction"] < 1.0):
            raise ValueError(f"method 'cirh': a1 and a2 must be in [0, 1] and k_fraction in [0, 1), got {p}")
        if min(p["lambda1"], p["lambda2"], p["beta"]) < 0 or p["lr_net"] <= 0 or p["width"] < 1:
            raise ValueError(f"method 'cirh': lambda1, lambda2 and beta must be >= 0, lr_net > 0 and width >= 1, "
                             f"got {p}")

    def build_model(self, d_img: int, d_txt: int, cfg: HashConfig,
                    fusion_cfg: Optional[FusionConfig] = None) -> FeatureHasher:
        # Img_Net: hidden 4096 (cfg.hidden); Txt_Net: hidden d_txt
        model = FeatureHasher(d_img, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout, txt_hidden=d_txt)
        with torch.no_grad():
            for head in (model.img_head, model.txt_head):
                head.net[-1].weight.normal_(0.0, 1.0)  # models.Img_Net / Txt_Net: tohash ~ N(0, 1)
        return model

    def plan(self, data: Dataset, cfg: HashConfig, setup: Setup, fusion: Optional[FusionEncoder] = None) -> Plan:
        p = self.method_params(cfg.method_params)
        device, rest = setup.device, setup.rest
        model = self.initial_model(data, cfg, setup, fusion)
        net = CirhNet(data.d_img, data.d_txt, cfg.n_bits, p["width"])
        model.to(device).train()
        net.to(device).train()
        optimizer = adam([{"params": list(net.parameters()), "lr": p["lr_net"]},
                          {"params": list(model.parameters()), "lr": cfg.lr_head}], betas=tuple(cfg.betas))
        with torch.no_grad():  # once: the networks' inputs (centred), the similarity's (not centred, as released)
            img_all, txt_all = model.inputs(rest.img.to(device), rest.txt.to(device))
            sim_img, sim_txt = ((img_all, txt_all) if p["centred_similarity"]
                                else (normalize(rest.img.to(device)), normalize(rest.txt.to(device))))
        with setup.bar(len(rest), "CIRH: each training item's threshold over every other") as bar:
            thresholds = row_thresholds(sim_img, sim_txt, p["a1"], int(round(p["k_fraction"] * len(rest))),
                                        done=bar.update)

        def loss(batch: Batch) -> torch.Tensor:
            index = batch.index
            img, txt = img_all[index], txt_all[index]  # the whole global batch on every rank
            s = batch_similarity(sim_img[index], sim_txt[index], thresholds[index], p["a1"], p["a2"])
            img_mix, txt_mix = neighbour_mix(img, s), neighbour_mix(txt, s)
            with autocast(device, cfg.amp):
                out = net(img_mix, txt_mix, s)
                logits = model.img_head(img), model.txt_head(txt)
            h_img, h_txt, h, dec_img, dec_txt = (x.float() for x in out)
            u_img, u_txt = (torch.tanh(x.float()) for x in logits)
            return (net_loss(h_img, h_txt, h, dec_img, dec_txt, img_mix, txt_mix, s, p["lambda1"], p["lambda2"])
                    + head_loss(u_img, u_txt, torch.sign(h), s, p["beta"]))

        return Plan(f"{cfg.method} {cfg.n_bits} bits", model, {"model": model, "net": net}, optimizer, rest, loss=loss,
                    validate=validator(codes_of, "hamming", model, setup.val, rest, device),
                    graphable=self.graphable)
