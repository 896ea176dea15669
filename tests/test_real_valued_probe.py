"""scripts/real_valued_probe.py: the linear InfoNCE embedding keeps its best validation epoch, and the
script runs end to end on a tiny synthetic set."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from ucmfh.scoring import head_outputs_split
from ucmfh.train import _validator, validation_split

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "real_valued_probe.py")


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("real_valued_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kept_weights_are_the_best_validation_epoch(probe, tiny):
    model, best, epoch = probe.fit_embedding(tiny, seed=0, dim=16, temperature=0.1, lr=1e-2, epochs=6, patience=2)
    assert 1 <= epoch <= 6
    rest, val = validation_split(tiny.train, 0.1, 0)
    again = _validator(head_outputs_split, model, val, rest, "cosine", torch.device("cpu"))()
    assert again == pytest.approx(best, abs=1e-6)
    img, txt = model.head_outputs(tiny.query.img[:5], tiny.query.txt[:5], "unimodal")
    assert img.shape == txt.shape == (5, 16)
    assert torch.allclose(img.norm(dim=1), torch.ones(5), atol=1e-5)


def test_the_script_prints_each_seed_and_the_means(tiny_path):
    out = subprocess.run([sys.executable, SCRIPT, tiny_path, "--seeds", "0,1", "--dim", "8", "--epochs", "2",
                          "--components", "8,16"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["model"], r["seed"]) for r in rows] == [
        ("linear InfoNCE 8", 0), ("CCA 8", 0), ("CCA 16", 0), ("linear InfoNCE 8", 1), ("CCA 8", 1), ("CCA 16", 1)]
    assert all(0.0 <= r["retrieval"]["map_i2t"] <= 1.0 for r in rows)
    means = out.split("mean over seeds:")[1]
    assert "linear InfoNCE 8" in means and "CCA 16" in means
