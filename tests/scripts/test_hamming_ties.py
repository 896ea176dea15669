"""scripts/hamming_ties.py: R@1 by index equals the metric's, its tie-free bounds hold it, and the
script runs end to end on a tiny caption set."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from ucmfh.checkpoint import save_checkpoint
from ucmfh.data.h5 import load_dataset
from ucmfh.methods import fit_hashing, hash_config
from ucmfh.metrics import evaluate_caption_set
from ucmfh.evaluation import encode_split

from conftest import SCRIPTS, load_script

SCRIPT = str(SCRIPTS / "hamming_ties.py")


@pytest.fixture(scope="module")
def ties():
    return load_script("hamming_ties")


def test_a_tie_is_won_by_the_smaller_index_and_bounded_both_ways(ties):
    query = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1]])
    database = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, -1]])
    with pytest.raises(ValueError, match="true match"):
        ties.tie_bounds(query, database, torch.tensor([7, 9]), torch.tensor([5, 7, 8]))
    query_ids, database_ids = torch.tensor([7, 8]), torch.tensor([5, 7, 8])
    out = ties.tie_bounds(query, database, query_ids, database_ids)
    # query 0: match at 0, index 0 (not a match) first -> lost; query 1: its match at 1 has two items nearer
    # tie-aware: query 0 wins its two-way tie half the time; query 1 never (two items strictly nearer)
    assert out == pytest.approx({"r1": 0.0, "r1_expected": 25.0, "r1_ties_won": 50.0,
                                 "r1_alone": 0.0, "as_near": 1.5})


def test_r1_by_index_is_the_metrics_on_both_databases(ties):
    g = torch.Generator().manual_seed(0)
    ids_q, ids_r = torch.arange(20).repeat_interleave(5), torch.arange(20, 60).repeat_interleave(5)
    codes_q = [torch.randint(0, 2, (100, 8), generator=g).float() * 2 - 1 for _ in range(2)]
    codes_r = [torch.randint(0, 2, (200, 8), generator=g).float() * 2 - 1 for _ in range(2)]
    out = ties.caption_set_ties(codes_q, codes_r, ids_q, ids_r)
    metric = evaluate_caption_set(codes_q[0], codes_q[1], ids_q, codes_r[0], codes_r[1], ids_r)
    expected = evaluate_caption_set(codes_q[0], codes_q[1], ids_q, codes_r[0], codes_r[1], ids_r, ties="expected")
    for db in ("test", "collection"):
        for direction in ("i2t", "t2i"):
            row = out[db][direction]
            assert row["r1"] == pytest.approx(metric[db][f"recall_{direction}"]["1"])
            assert row["r1_expected"] == pytest.approx(expected[db][f"recall_{direction}"]["1"])
            assert row["r1_alone"] <= row["r1"] <= row["r1_ties_won"]
            assert row["r1_alone"] <= row["r1_expected"] <= row["r1_ties_won"]
    assert out["collection"]["i2t"]["as_near"] > out["test"]["i2t"]["as_near"]  # a larger database, more items as near


@pytest.mark.slow  # 4 s: a research script run end to end (its pieces are tested above)
def test_the_script_prints_each_run_and_the_means(tmp_path):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    path = str(caption_file(tmp_path / "c.h5"))
    out = subprocess.run([sys.executable, SCRIPT, path, "--methods", "cca-itq", "-b", "8", "--seeds", "0,1"],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["method"], r["n_bits"], r["seed"]) for r in rows] == [("cca-itq", 8, 0), ("cca-itq", 8, 1)]
    assert set(rows[0]) >= {"test", "collection"}
    assert "cca-itq   8 bits       test:" in out.split("mean over seeds")[1]


@pytest.fixture
def run_main(ties, monkeypatch, capsys):
    """The script's main() in this process (no interpreter to start): (exit code, stdout, stderr). The
    threads main() sets are reset for the next test by conftest's ``_threads``."""

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["hamming_ties.py", *args])
        try:
            ties.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_the_script_scores_saved_checkpoints_each_alone(tmp_path, ties, run_main):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    path = str(caption_file(tmp_path / "c.h5"))
    data = load_dataset(path)
    saved = []
    for seed in (0, 1):
        cfg = hash_config("cca-itq", n_bits=8, seed=seed, device="cpu")
        model = fit_hashing(data, cfg, progress=False)[0]
        saved.append((save_checkpoint(tmp_path / f"hash8-{seed}.pt", model, None, cfg), model))
    code, out, _ = run_main(path, "--checkpoints", *(p for p, _ in saved))
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["checkpoint"], r["method"], r["n_bits"], r["seed"]) for r in rows] == [
        (saved[0][0], "cca-itq", 8, 0), (saved[1][0], "cca-itq", 8, 1)]
    for row, (_, model) in zip(rows, saved):
        query, retrieval = (encode_split(model, split, "unimodal", "cpu") for split in (data.query, data.retrieval))
        expected = ties.caption_set_ties(query, retrieval, data.query.ids, data.retrieval.ids)
        assert row["test"]["i2t"] == pytest.approx(expected["test"]["i2t"])
        assert row["collection"]["t2i"] == pytest.approx(expected["collection"]["t2i"])
    summary = out.split("mean over seeds")[1]
    assert f"{saved[0][0]}       test:" in summary and f"{saved[1][0]}       test:" in summary  # never averaged


@pytest.mark.parametrize("bad, message", [("labels", "not a caption set"), ("checkpoint", "none.pt: no such checkpoint")])
def test_bad_input_is_refused_in_one_line(tiny_path, tmp_path, run_main, bad, message):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    args = [tiny_path] if bad == "labels" else [str(caption_file(tmp_path / "c.h5")), "--checkpoints",
                                                 str(tmp_path / "none.pt")]
    code, out, err = run_main(*args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out
