"""One training step per case, on one process or on every rank of ``torchrun``; rank 0 saves the gradients.

Run by ``tests/test_distributed.py``: ``python tests/distributed_worker.py OUT`` (one process) and
``torchrun --nproc-per-node 2 tests/distributed_worker.py OUT`` (two), then their gradients are compared.
"""
from __future__ import annotations

import sys

import torch

from conftest import token_splits
from ucmfh.app.environment import join_process_group
from ucmfh.config import FusionConfig, HashConfig, SepsConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.data.writer import write_dataset
from ucmfh.distributed import current_group
from ucmfh.losses import LOSSES
from ucmfh.seps import fit_seps
from ucmfh.methods import fit_hashing
from ucmfh.fusion_stage import fit_fusion

N = 13  # odd: the ranks' parts of a batch differ in size


def datasets() -> dict:
    g = torch.Generator().manual_seed(0)
    img, txt = torch.randn(N, 12, generator=g), torch.randn(N, 10, generator=g)
    labels = (torch.rand(N, 4, generator=g) < 0.4).to(torch.uint8)
    labels[:, 0] = 1 - labels[:, 1:].amax(1)  # every item has a label
    ids = torch.arange(N) // 2  # pairs of captions of one image: positives of each other, often on two ranks
    labelled = Split(img, txt, labels)
    captions = Split(img, txt, None, ids)
    return {"labelled": Dataset(labelled, labelled, labelled), "captions": Dataset(captions, captions, captions)}


def cases():
    """(name, stage, dataset, config) of every case: each loss in each stage, supervised and by id."""
    common = dict(epochs=1, batch_size=N, val_fraction=0.0, device="cpu", dropout=0.0)
    fusion = dict(d_model=16, n_heads=2, d_ff=32, **common)
    for loss in LOSSES:
        yield f"fusion-{loss}", "fusion", "captions", FusionConfig(loss=loss, **fusion)
        yield f"two-tower-{loss}", "hash", "captions", HashConfig(method="two-tower", loss=loss, hidden=32,
                                                                   n_bits=16, **common)
    yield "fusion-supervised", "fusion", "labelled", FusionConfig(loss="pairwise", supervised=True, **fusion)
    yield "ucmfh", "hash", "captions", HashConfig(method="ucmfh", hidden=32, n_bits=16, lr_fusion=1e-3, **common)
    yield "distill", "hash", "captions", HashConfig(method="distill", loss="infonce", hidden=32, n_bits=16, **common)
    # three steps (batches of 5, 5, 3): the optimizer's state and the ranks stay in step
    yield "two-tower-3-steps", "hash", "labelled", HashConfig(method="two-tower", hidden=32, n_bits=16,
                                                             **{**common, "batch_size": 5, "epochs": 2})
    # SEPS on 26 captions of 16 images, two steps of 13 (parts of 7 and 6): the patch selection learns
    seps = dict(embed_dim=16, epochs=1, batch_size=13, val_fraction=0.0, patience=0, device="cpu", pair_chunk=256)
    yield "seps-code", "seps", "tokens", SepsConfig(**seps)
    yield "seps-paper", "seps", "tokens", SepsConfig(version="paper", **seps)
    yield "seps-max-violation", "seps", "tokens", SepsConfig(max_violation_from=0, **seps)
    yield "seps-dense-text", "seps", "dense", SepsConfig(dense_text="image", **seps)


def main(out: str) -> None:
    join_process_group()
    data = datasets()
    rank = current_group().rank  # each rank writes its own copy of the token files
    for name, dense in (("tokens", False), ("dense", True)):
        data[name] = write_dataset(f"{out}.{name}{rank}.h5", token_splits(images=(3, 13), dense=dense),
                                   attrs={"name": name, **({"dense_text_from": "image"} if dense else {})},
                                   overwrite=True)
    teacher = fit_fusion(data["captions"], FusionConfig(d_model=16, n_heads=2, d_ff=32, epochs=1, batch_size=N,
                                                        val_fraction=0.0, dropout=0.0, device="cpu"),
                         progress=False)[0]
    result = {}
    for name, stage, dataset, cfg in cases():
        if stage == "seps":
            model, _ = fit_seps(data[dataset], cfg, progress=False)
        elif stage == "fusion":
            model, _ = fit_fusion(data[dataset], cfg, progress=False)
        else:
            model, _ = fit_hashing(data[dataset], cfg, teacher if cfg.method in ("ucmfh", "distill") else None,
                                   progress=False)
        result[name] = {k: (p.detach().clone(), p.grad.clone()) for k, p in model.named_parameters()
                        if p.grad is not None}
    if current_group().is_main:
        torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1])
