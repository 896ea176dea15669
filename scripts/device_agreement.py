#!/usr/bin/env python3
"""Does a method train to the same model on a GPU as on the CPU? Where not, is it dropout's random stream
or the device's arithmetic? (A diagnostic of the GPU checklist, not a test.)

Each trained method is fitted for two epochs on small synthetic data (the test suite's ``tiny`` shape), 16
bits, on the CPU and on ``--device``, with its dropout as configured and with dropout 0. A row per method
and dropout: MAP@20 I→T + T→I (`unimodal`, tie-aware) on the CPU and on the device, the largest weight
difference, and the CPU's range over ``--seeds`` other seeds (how far a different random stream moves the
figure). With dropout 0 the two devices share every random draw (the model's initial weights and the
batches are drawn on the CPU either way; the fusion encoder that ``ucmfh`` and ``distill`` train on has
its dropout at 0 here), so a gap that stays there is arithmetic; one that goes is the device's own
dropout stream, which is a different draw, not a defect.

    python scripts/device_agreement.py --device cuda
    python scripts/device_agreement.py --device cuda --methods dgcpn,daeh --seeds 5
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch

from ucmfh.config import FusionConfig
from ucmfh.data.h5 import load_dataset
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.fusion_stage import fit_fusion
from ucmfh.methods import METHODS, fit_hashing, hash_config
from ucmfh.evaluation import evaluate_hashing

TINY = SyntheticSpec(n_query=80, n_retrieval=600, n_train=400, n_classes=24, mean_extra_labels=1.0,
                     d_img=48, d_txt=32, d_latent=16, noise=1.0, item_scale=0.5)


def fit(data, method: str, fusion, device: str, seed: int, dropout=None):
    kw = {} if dropout is None else {"dropout": dropout}
    cfg = hash_config(method, drop_unused=True, n_bits=16, hidden=64, epochs=2, val_fraction=0.0, device=device,
                      seed=seed, **kw)
    model, _ = fit_hashing(data, cfg, copy.deepcopy(fusion) if METHODS[method].uses_fusion else None,
                           progress=False)
    return model.cpu()


def score(model, data) -> float:
    row = evaluate_hashing(model, data, ("unimodal",), 20, "cpu")[0]
    return row["map_i2t"] + row["map_t2i"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--methods", default="", help="comma-separated (default: every trained method)")
    p.add_argument("--seeds", type=int, default=3, help="other CPU seeds for the spread")
    args = p.parse_args(argv)
    methods = args.methods.split(",") if args.methods else [m for m, v in METHODS.items() if not v.closed_form]
    torch.set_num_threads(1)  # tiny models: more threads wait on each other (2: 48 s beside a busy core; 1: 3.5 s)
    with tempfile.TemporaryDirectory() as tmp:
        data = load_dataset(make_synthetic(Path(tmp) / "tiny.h5", TINY))
        fusion = fit_fusion(data, FusionConfig(d_model=64, n_heads=4, d_ff=128, dropout=0.0, epochs=1, batch_size=64,
                                               lr=1e-3, device="cpu"), progress=False)[0]
        print(f"{'method':<10} {'dropout':>8} {'cpu':>7} {args.device:>7} {'Δ':>7} {'max|Δw|':>9} "
              f"{'cpu seed range':>15}", flush=True)
        for method in methods:
            for dropout in (None, 0.0):
                want = fit(data, method, fusion, "cpu", 2023, dropout)
                got = fit(data, method, fusion, args.device, 2023, dropout)
                dw = max((a - b).abs().max().item() for a, b in
                         zip(want.state_dict().values(), got.state_dict().values()) if a.is_floating_point())
                others = [score(fit(data, method, fusion, "cpu", 2024 + i, dropout), data) for i in range(args.seeds)]
                a, b = score(want, data), score(got, data)
                spread = [a] + others
                label = "config" if dropout is None else "0"
                print(f"{method:<10} {label:>8} {a:7.3f} {b:7.3f} {b - a:+7.3f} {dw:9.2e} "
                      f"{min(spread):7.3f}–{max(spread):.3f}", flush=True)


if __name__ == "__main__":
    main()
