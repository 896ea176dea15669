"""scripts/code_stats.py: the statistics of hand-made codes, images once per id, the script on a saved
checkpoint, and one-line errors with exit 2."""
from __future__ import annotations

import json
import subprocess
import sys

import h5py
import pytest
import torch

from ucmfh.checkpoint import save_checkpoint
from ucmfh.methods import fit_hashing, hash_config
from ucmfh.evaluation import encode_split

from conftest import SCRIPTS, load_script

SCRIPT = str(SCRIPTS / "code_stats.py")


@pytest.fixture(scope="module")
def stats():
    return load_script("code_stats")


def test_the_statistics_of_hand_made_codes(stats):
    # bits 0 and 1 always equal (correlation 1); bit 2 against either: cov -1/8, stds sqrt(3)/4 and 1/2
    codes = torch.tensor([[1, 1, -1], [1, 1, 1], [-1, -1, 1], [1, 1, -1]])
    out = stats.modality_stats(codes.numpy())
    assert out == pytest.approx({"items": 4, "distinct": 3, "largest": 2, "ones_min": 0.5, "ones_max": 0.75,
                                 "mean_abs_corr": (1 + 2 / 3 ** 0.5) / 3})


def test_a_constant_bit_has_no_correlation_and_one_item_none_at_all(stats):
    out = stats.modality_stats(torch.tensor([[1, 1, -1], [-1, 1, 1], [1, 1, 1]]).numpy())
    assert out["mean_abs_corr"] == pytest.approx(0.5) and out["ones_max"] == 1.0  # bits 0 and 2 only
    single = stats.modality_stats(torch.tensor([[1, -1]]).numpy())
    assert single["distinct"] == 1 and single["largest"] == 1 and single["mean_abs_corr"] != single["mean_abs_corr"]


def test_images_are_counted_once_per_id_and_pairs_over_every_row(stats):
    img = torch.tensor([[1, 1], [1, 1], [-1, 1], [-1, 1], [-1, 1]])  # ids 0, 0, 1, 1, 2: images 0, 1, 2
    txt = torch.tensor([[1, 1], [1, -1], [-1, 1], [1, -1], [-1, -1]])
    out = stats.code_stats(img, txt, torch.tensor([0, 0, 1, 1, 2]))
    assert out["img"]["items"] == 3 and out["img"]["distinct"] == 2 and out["img"]["largest"] == 2
    assert out["txt"]["items"] == 5 and out["txt"]["distinct"] == 4
    assert out["pair_agreement"] == pytest.approx(6 / 10)
    assert stats.code_stats(img, txt, None)["img"]["items"] == 5


def test_the_script_reads_a_checkpoint(tiny, tiny_path, tmp_path, stats):
    cfg = hash_config("cca-itq", n_bits=16, device="cpu")
    model, _ = fit_hashing(tiny, cfg, progress=False)
    path = save_checkpoint(tmp_path / "hash16.pt", model, None, cfg)
    run = subprocess.run([sys.executable, SCRIPT, tiny_path, path, "--split", "query"],
                         capture_output=True, text=True, check=True)
    row = json.loads(run.stdout)
    expected = stats.code_stats(*encode_split(model, tiny.query, "unimodal", "cpu"), None)
    assert row["checkpoint"] == path and row["split"] == "query"
    assert row["img"] == pytest.approx(expected["img"]) and row["txt"] == pytest.approx(expected["txt"])
    assert row["pair_agreement"] == pytest.approx(expected["pair_agreement"])
    assert row["img"]["items"] == len(tiny.query) and "pairs agree on" in run.stderr


@pytest.mark.parametrize("bad, message", [("data", "none.h5: no such file"), ("checkpoint", "none.pt: no such checkpoint"),
                                          ("dims", "made for image feature dim=")])
def test_bad_input_is_refused_in_one_line_with_exit_2(stats, tiny, tiny_path, tmp_path, monkeypatch, capsys, bad, message):
    cfg = hash_config("cca-itq", n_bits=8, device="cpu")
    path = save_checkpoint(tmp_path / "hash8.pt", fit_hashing(tiny, cfg, progress=False)[0], None, cfg)
    if bad == "dims":  # a checkpoint of other features
        with h5py.File(tiny_path) as f, h5py.File(tmp_path / "other.h5", "w") as g:
            for name in f:
                g[f"{name}/image"] = f[name]["image"][:, :-1]
                for key in set(f[name]) - {"image"}:
                    g[f"{name}/{key}"] = f[name][key][()]
            g.attrs.update(f.attrs)
    args = {"data": [str(tmp_path / "none.h5"), path], "checkpoint": [tiny_path, str(tmp_path / "none.pt")],
            "dims": [str(tmp_path / "other.h5"), path]}[bad]
    monkeypatch.setattr(sys, "argv", ["code_stats.py", *args])
    with pytest.raises(SystemExit) as exit_:
        stats.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
