"""The grid runner on a tiny synthetic file: cells, resume, and the mean ± std table."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ["--d-model", "32", "--d-ff", "64", "--hidden", "64", "--batch-size", "64", "--lr-fusion", "1e-3",
              "--epochs", "1", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def grid():
    spec = importlib.util.spec_from_file_location("run_grid", ROOT / "scripts" / "run_grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_runs_every_cell_once_and_tabulates_seeds(grid, tiny_path, tmp_path, capsys):
    results, table = tmp_path / "grid.jsonl", tmp_path / "table"
    argv = ["-d", tiny_path, "-b", "8", "-b", "16", "--seeds", "1,2", "--out", str(tmp_path / "runs"),
            "--results", str(results), "--table", str(table), *TINY_MODEL]
    grid.main(argv)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2  # bits x seeds x protocols
    assert {(r["n_bits"], r["seed"]) for r in rows} == {(8, 1), (8, 2), (16, 1), (16, 2)}
    # one fusion encoder per (dataset, loss, seed), shared by both bit lengths
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny" / "original-seed1").glob("*.pt")) == \
        ["fusion.pt", "hash16.pt", "hash8.pt"]

    with open(f"{table}.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 2 * 2  # bits x protocols
    for s in summary:
        mine = [r["map_i2t"] for r in rows if r["n_bits"] == int(s["n_bits"]) and r["protocol"] == s["protocol"]]
        assert s["n_seeds"] == "2" and float(s["map_i2t_mean"]) == pytest.approx(sum(mine) / 2)
        assert float(s["map_i2t_std"]) == pytest.approx(abs(mine[0] - mine[1]) / 2 ** 0.5)
    assert "±" in Path(f"{table}.md").read_text()

    capsys.readouterr()
    grid.main(argv)  # everything finished: nothing trained, nothing appended
    assert capsys.readouterr().out.count("skip") == 4
    assert len(results.read_text().splitlines()) == len(rows)

    grid.main([*argv[:2], "-b", "8", *argv[6:], "--k", "20"])  # other settings: the cells run again
    assert len(results.read_text().splitlines()) == len(rows) + 2 * 2


def test_grid_refuses_a_fusion_encoder_trained_otherwise(grid, tiny_path, tmp_path):
    common = ["-d", tiny_path, "-b", "8", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "g.jsonl"),
              "--table", str(tmp_path / "t"), *TINY_MODEL]
    grid.main(common)
    with pytest.raises(ValueError, match="fusion encoder was trained with other settings"):
        grid.main([*common, "--fusion-epochs", "2"])
