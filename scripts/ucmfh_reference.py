"""UCMFH's reference training and encoding code, reproduced with its defects, for benchmarks and comparisons.

This is **not** the model ucmfh trains (that is :mod:`ucmfh.models` with
:mod:`ucmfh.fusion_stage`, :mod:`ucmfh.methods`). It re-implements the reference code of Xia et al., "When
CLIP meets cross-modal hashing retrieval" (Information Fusion 2023) step for
step, so that ucmfh's speed and MAP can be compared with it, and it keeps the
reference's known defects (docs/reference.md §2) on purpose:

1. Batch dependence: :func:`ref_encode` feeds a batch as one sequence of B
   tokens, so an item's code depends on the other items of its batch
   (training feeds B sequences of length 1; ``itemwise=True`` encodes that way).
2. Paired-modality leak: every code is computed from the pair (image, text),
   i.e. only the ``fused`` protocol exists.
3. ``drop_last=True``: training and :func:`ref_encode` drop the last partial
   batch, and the loss mask of :class:`RefContrastiveLoss` is fixed to the
   batch size, so no other batch size can pass through it.
4. The learning-rate schedulers step per batch with gamma 1.2
   (:func:`ref_optimizer`): the learning rate rises by 1.2 after 30 batches
   and again after 80.

Also as in the reference: a per-item Dataset behind a DataLoader, NT-Xent
through the broadcast ``F.cosine_similarity`` over (2B, 2B, d), one Adam per
module, and ``loss.item()`` every batch. One hash-MLP class,
:class:`RefHashMlp`, stands for the reference's two identical classes
``ImageMlp`` and ``TextMlp`` (same layers, same parameter creation order, so
the same seeded weights).

Two departures from the released code, found on 2026-11-30 and not yet mended (the benchmarks' figures of
docs/benchmarks.md were measured with them): the released fusion optimizer has no scheduler (here
:func:`ref_optimizer` gives it the heads' ×1.2, up to 1.44e-4), and the released task 1 trains a fusion encoder
of random weights with the heads, where :func:`ref_fit_hashing` is given the trained fusion stage (so the
released hashing run costs its 100 epochs alone, not 100 + 100); COCO's ×0.6 after 200 batches is not
transcribed (docs/reference.md §2, "Departures").
"""
from __future__ import annotations

import time
from typing import Callable, List, NamedTuple, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from ucmfh.data.h5 import Split
from ucmfh.similarity import sign_codes
from ucmfh.utils import seed_everything

__all__ = [
    "RefDataSet",
    "RefFuseTransEncoder",
    "RefHashMlp",
    "RefContrastiveLoss",
    "RefFit",
    "ref_optimizer",
    "ref_fit_fusion",
    "ref_fit_hashing",
    "ref_encode",
]


class RefDataSet(TorchDataset):
    """UCMFH's CustomDataSet: one item per ``__getitem__``, as (img, txt, labels, index)."""

    def __init__(self, img: torch.Tensor, txt: torch.Tensor, labels: torch.Tensor) -> None:
        self.img, self.txt, self.labels = img, txt, labels

    def __getitem__(self, index: int):
        return self.img[index], self.txt[index], self.labels[index], index

    def __len__(self) -> int:
        return len(self.img)


class RefFuseTransEncoder(nn.Module):
    """UCMFH's FuseTransEncoder: a Transformer over ``concat(img, txt)`` tokens, split back in two halves.

    ``batch_first=False``: a [1, B, hidden] input is B sequences of one token
    (training), a [B, hidden] input one sequence of B tokens (the reference's
    evaluation, defect 1). The output is L2-normalised and cut at
    ``hidden_size // 2``, which is the image/text boundary only when
    d_img == d_txt (512 + 512 = 1024 for CLIP ViT-B/32, the reference's case).

    Shape: tokens [1, B, hidden] or [B, hidden] -> two [B, hidden // 2].
    """

    def __init__(self, num_layers: int = 2, hidden_size: int = 1024, nhead: int = 4) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=hidden_size, nhead=nhead, batch_first=False)
        # enable_nested_tensor only silences torch's warning: with batch_first=False the
        # nested-tensor fast path never runs, so the computation is the reference's.
        self.transformerEncoder = nn.TransformerEncoder(
            encoder_layer=layer, num_layers=num_layers, enable_nested_tensor=False
        )
        self.d_model, self.sigal_d = hidden_size, hidden_size // 2

    def forward(self, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        out = self.transformerEncoder(tokens).reshape(-1, self.d_model)
        out = F.normalize(out, p=2, dim=1)
        return out[:, : self.sigal_d], out[:, self.sigal_d :]


class RefHashMlp(nn.Module):
    """UCMFH's ImageMlp and TextMlp, which are identical code: one class for both modalities.

    ``normalize -> input_dim -> 4096 -> ReLU -> dropout 0.3 -> hash_lens -> tanh -> normalize``.
    The attribute names are the reference's, so its state dicts load.

    Shape: x [B, input_dim] -> [B, hash_lens], rows of unit norm.
    """

    def __init__(self, input_dim: int, hash_lens: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_dim, 4096)
        self.relu = nn.ReLU(inplace=True)
        self.dp = nn.Dropout(0.3)
        self.tohash = nn.Linear(4096, hash_lens)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.normalize(x, p=2, dim=1)
        out = self.tanh(self.tohash(self.dp(self.relu(self.fc1(x)))))
        return F.normalize(out, p=2, dim=1)


class RefContrastiveLoss(nn.Module):
    """UCMFH's ContrastiveLoss (SimCLR's NT-Xent), its negatives mask fixed to ``batch_size`` (defect 3).

    On a batch of exactly ``batch_size`` pairs it computes
    ``ucmfh.losses.NTXentLoss`` (docs/reference.md §4 'original'); any other
    batch size fails on the mask's shape.

    Shape: emb_i [batch_size, d], emb_j [batch_size, d] -> scalar.
    """

    def __init__(self, batch_size: int, device: torch.device, temperature: float = 0.5) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.register_buffer("temperature", torch.tensor(temperature).to(device))
        self.register_buffer(
            "negatives_mask", (~torch.eye(batch_size * 2, batch_size * 2, dtype=bool).to(device)).float()
        )

    def forward(self, emb_i: torch.Tensor, emb_j: torch.Tensor) -> torch.Tensor:
        z_i, z_j = F.normalize(emb_i, dim=1), F.normalize(emb_j, dim=1)
        representations = torch.cat([z_i, z_j], dim=0)
        similarity = F.cosine_similarity(representations.unsqueeze(1), representations.unsqueeze(0), dim=2)
        sim_ij = torch.diag(similarity, self.batch_size)
        sim_ji = torch.diag(similarity, -self.batch_size)
        positives = torch.cat([sim_ij, sim_ji], dim=0)
        nominator = torch.exp(positives / self.temperature)
        denominator = self.negatives_mask * torch.exp(similarity / self.temperature)
        loss_partial = -torch.log(nominator / torch.sum(denominator, dim=1))
        return torch.sum(loss_partial) / (2 * self.batch_size)


RefHasher = Tuple[RefFuseTransEncoder, RefHashMlp, RefHashMlp]
_Opt = Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.MultiStepLR]


class RefFit(NamedTuple):
    """What a reference training stage returns."""

    model: Union[RefFuseTransEncoder, RefHasher]  # the fusion stage's encoder, or the hashing stage's three modules
    n_items: int  # items trained on, all epochs together (the dropped last batch excluded)
    losses: List[float]  # mean loss of each epoch
    seconds: List[float]  # wall seconds of each epoch (its batches' losses read back: the device's work done)


def ref_optimizer(module: nn.Module, lr: float) -> _Opt:
    """The reference's Adam (betas 0.5, 0.999) and MultiStepLR([30, 80], gamma 1.2).

    The reference steps the scheduler once per batch (defect 4): the learning rate
    rises to 1.2 · lr after 30 batches and 1.44 · lr after 80.
    """
    opt = torch.optim.Adam(module.parameters(), lr=lr, betas=(0.5, 0.999))
    return opt, torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[30, 80], gamma=1.2)


def _ref_loader(split: Split, batch_size: int, shuffle: bool, drop_last: bool) -> DataLoader:
    return DataLoader(
        RefDataSet(split.img, split.txt, split.labels), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last
    )


def _ref_train(
    split: Split,
    batch_loss: Callable[[torch.Tensor], torch.Tensor],
    opts: List[_Opt],
    epochs: int,
    device: torch.device,
    batch_size: int,
) -> Tuple[int, List[float], List[float]]:
    """The reference's training loop: shuffled batches with drop_last, one ``concat(img, txt)`` token per item.
    Returns the items trained on, each epoch's mean loss and each epoch's wall seconds."""
    if len(split) < batch_size:
        raise ValueError(f"{len(split)} training items < batch size {batch_size}: drop_last leaves no batch")
    loader = _ref_loader(split, batch_size, shuffle=True, drop_last=True)
    losses, seconds = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        running = 0.0
        for img, txt, _, _ in loader:
            img, txt = img.to(device), txt.to(device)
            loss = batch_loss(torch.concat((img, txt), dim=1).unsqueeze(0))  # [1, B, d_img + d_txt]
            for opt, _ in opts:
                opt.zero_grad()
            loss.backward()
            for opt, _ in opts:
                opt.step()
            running += loss.item()  # read back every batch, as the reference does (a host sync on a GPU)
            for _, sched in opts:
                sched.step()
        losses.append(running / len(loader))
        seconds.append(time.perf_counter() - start)  # loss.item() above waited for the device
    return len(loader) * batch_size * epochs, losses, seconds


def ref_fit_fusion(
    split: Split, epochs: int, device: torch.device, batch_size: int = 128, seed: int = 2023
) -> RefFit:
    """The reference's fusion stage ("task 0"): NT-Xent between the two halves of the fused token, lr 1e-4.

    The encoder's width is d_img + d_txt (1024 for the reference's CLIP features).
    """
    seed_everything(seed)
    model = RefFuseTransEncoder(hidden_size=split.img.shape[1] + split.txt.shape[1]).to(device).train()
    loss_fn = RefContrastiveLoss(batch_size, device).to(device)
    n_items, losses, seconds = _ref_train(
        split, lambda tokens: loss_fn(*model(tokens)), [ref_optimizer(model, 1e-4)], epochs, device, batch_size
    )
    return RefFit(model, n_items, losses, seconds)


def ref_fit_hashing(
    split: Split,
    fusion: RefFuseTransEncoder,
    n_bits: int,
    epochs: int,
    device: torch.device,
    batch_size: int = 128,
    seed: int = 2023,
) -> RefFit:
    """The reference's hashing stage ("task 1"): loss(fused) + 0.5 · loss(heads); lr 1e-4 fusion, 1e-3 heads.

    ``fusion`` is trained further (in place). ``RefFit.model`` is (fusion, image MLP, text MLP).
    """
    seed_everything(seed)
    fusion.to(device).train()
    img_mlp = RefHashMlp(fusion.sigal_d, n_bits).to(device).train()
    txt_mlp = RefHashMlp(fusion.sigal_d, n_bits).to(device).train()
    loss_fn = RefContrastiveLoss(batch_size, device).to(device)
    opts = [ref_optimizer(fusion, 1e-4), ref_optimizer(img_mlp, 1e-3), ref_optimizer(txt_mlp, 1e-3)]

    def batch_loss(tokens: torch.Tensor) -> torch.Tensor:
        z_img, z_txt = fusion(tokens)
        loss1 = loss_fn(z_img, z_txt)
        loss2 = loss_fn(img_mlp(z_img), txt_mlp(z_txt))
        return loss1 + loss2 * 0.5

    n_items, losses, seconds = _ref_train(split, batch_loss, opts, epochs, device, batch_size)
    return RefFit((fusion, img_mlp, txt_mlp), n_items, losses, seconds)


@torch.no_grad()
def ref_encode(
    models: RefHasher, split: Split, device: torch.device, batch_size: int = 128, itemwise: bool = False
) -> Tuple[torch.Tensor, torch.Tensor]:
    """±1 image and text codes as the reference computes them (the ``fused`` protocol, defect 2).

    By default, batches of ``batch_size`` with drop_last (defect 3), each fed as
    [B, hidden] = one sequence of B tokens (defect 1): N // batch_size * batch_size
    items are coded, and each code depends on its batch. ``itemwise`` feeds
    [1, B, hidden] instead, as in training (each item alone, nothing dropped):
    the reference without its batch dependence, used to score its MAP.

    Shape: -> two [n_coded, n_bits].
    """
    fusion, img_mlp, txt_mlp = (m.eval() for m in models)
    codes_img, codes_txt = [], []
    for img, txt, _, _ in _ref_loader(split, batch_size, shuffle=False, drop_last=not itemwise):
        tokens = torch.concat((img.to(device), txt.to(device)), dim=1)
        z_img, z_txt = fusion(tokens.unsqueeze(0) if itemwise else tokens)
        codes_img.append(sign_codes(img_mlp(z_img)))
        codes_txt.append(sign_codes(txt_mlp(z_txt)))
    if not codes_img:  # fewer items than one batch, all dropped
        empty = torch.empty(0, img_mlp.tohash.out_features, device=device)
        return empty, empty.clone()
    return torch.cat(codes_img), torch.cat(codes_txt)
