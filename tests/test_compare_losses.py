"""The loss-comparison script end to end on a tiny synthetic set (seconds on a CPU)."""
from __future__ import annotations

import csv
import importlib.util
import json
import os

import pytest

pytest.importorskip("ucmfh.train", reason="needs the training pipeline of main")

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "compare_losses.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("compare_losses", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_losses_tiny_grid_and_cache(tmp_path, monkeypatch):
    script = _load_script()
    argv = [
        "--dataset", "synthetic", "--synthetic", "n_query=20,n_retrieval=60,n_train=40,d_img=16,d_txt=12",
        "--losses", "original,balanced", "--bits", "8", "--seeds", "0,1",
        "--fusion-epochs", "1", "--hash-epochs", "1", "--batch-size", "16",
        "--d-model", "16", "--d-ff", "32", "--hidden", "32", "--device", "cpu", "--out", str(tmp_path),
    ]
    assert script.main(argv) == 0
    cell = json.loads((tmp_path / "cells" / "synthetic" / "balanced" / "seed1" / "bits8.json").read_text())
    assert set(cell["map"]) == {"fused", "unimodal"}
    assert all(0.0 <= v <= 1.0 for m in cell["map"].values() for v in m.values())
    assert cell["settings"]["hashing"]["n_bits"] == 8 and cell["settings"]["fusion"]["loss"] == "balanced"

    rows = list(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
    # 3 rows (2 losses + random codes) × 2 protocols × 1 n_bits × 2 directions
    assert len(rows) == 3 * 2 * 1 * 2
    assert {r["n_seeds"] for r in rows} == {"2"}
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "`original`" in table and "`balanced`" in table and "protocol `unimodal`" in table

    # finished cells are skipped: nothing is trained on a re-run …
    def refuse(*args, **kwargs):
        raise AssertionError("retrained a finished cell")

    monkeypatch.setattr(script, "fit_fusion", refuse)
    monkeypatch.setattr(script, "fit_hashing", refuse)
    assert script.main(argv) == 0
    # … unless the settings of a cell changed
    with pytest.raises(AssertionError, match="retrained"):
        script.main([*argv[:-2], "--hidden", "48", "--out", str(tmp_path)])
