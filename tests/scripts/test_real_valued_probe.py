"""scripts/real_valued_probe.py: the linear InfoNCE embedding is a two-tower model with linear heads
trained without codes, and the script runs end to end on a tiny synthetic set."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import SCRIPTS, load_script

SCRIPT = str(SCRIPTS / "real_valued_probe.py")


@pytest.fixture(scope="module")
def probe():
    return load_script("real_valued_probe")


def test_the_embedding_is_linear_and_keeps_its_best_validation_epoch(probe, tiny):
    model, best, epoch = probe.fit_embedding(tiny, seed=0, dim=16, temperature=0.1, lr=1e-2, epochs=6, patience=2)
    assert 1 <= epoch <= 6 and best > 0
    assert [type(m).__name__ for m in model.img_head.net] == ["Linear"]  # one linear map per modality
    img, txt = model.head_outputs(tiny.query.img[:5], tiny.query.txt[:5], "unimodal")
    assert img.shape == txt.shape == (5, 16)
    again, _, _ = probe.fit_embedding(tiny, seed=0, dim=16, temperature=0.1, lr=1e-2, epochs=6, patience=2)
    assert torch.equal(again.head_outputs(tiny.query.img[:5], tiny.query.txt[:5], "unimodal")[0], img)


@pytest.mark.slow  # 6 s: a research script run end to end (its pieces are tested above)
def test_the_script_prints_each_seed_and_the_means(tiny_path):
    out = subprocess.run([sys.executable, SCRIPT, tiny_path, "--seeds", "0,1", "--dim", "8", "--epochs", "2",
                          "--components", "8,16"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["model"], r["seed"]) for r in rows] == [
        ("linear InfoNCE 8", 0), ("CCA 8", 0), ("CCA 16", 0), ("linear InfoNCE 8", 1), ("CCA 8", 1), ("CCA 16", 1)]
    assert all(0.0 <= r["retrieval"]["map_i2t"] <= 1.0 for r in rows)
    means = out.split("mean over seeds:")[1]
    assert "linear InfoNCE 8" in means and "CCA 16" in means
