"""The hashing methods (--method): two-tower and cca-itq beside ucmfh, on tiny synthetic data."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from sklearn.cross_decomposition import CCA
from sklearn.decomposition import PCA

from ucmfh.app.cli import main
from ucmfh.app.runs import summarize
from ucmfh.methods.cca_itq import fit_cca_itq
from ucmfh.checkpoint import load_model, save_checkpoint
from ucmfh.config import HashConfig, SettingError
from ucmfh.methods import METHODS, hash_config
from ucmfh.data.h5 import Split
from ucmfh.models.hashing import FeatureHasher
from ucmfh.metrics import map_at_k
from ucmfh.evaluation import encode_split, evaluate_hashing, random_codes_map
from ucmfh.methods import fit_hashing

from conftest import small_hash


def two_tower(**kw) -> HashConfig:
    return hash_config("two-tower", **{"n_bits": 16, "hidden": 64, "epochs": 15, "batch_size": 64, "device": "cpu", **kw})


def test_a_method_starts_from_its_defaults_and_takes_what_is_given(tiny):
    cfg = hash_config("two-tower", n_bits=32)
    assert cfg.method == "two-tower" and cfg.n_bits == 32
    for name, value in METHODS["two-tower"].defaults.items():
        assert getattr(cfg, name) == value
    assert hash_config("two-tower", patience=3).patience == 3
    # ucmfh's defaults are the dataclass's, UCMFH's reference; its one parameter, code_weight, the reference's too
    assert dataclasses.replace(hash_config("ucmfh"), method_params={}) == HashConfig()
    assert hash_config("ucmfh").method_params == {"code_weight": 0.5, "fusion_start": "trained"}
    with pytest.raises(ValueError, match="unknown method 'nosuch'; methods: ucmfh, two-tower"):
        hash_config("nosuch")
    with pytest.raises(ValueError, match="unknown method 'nosuch'"):
        fit_hashing(tiny, HashConfig(method="nosuch"))
    with pytest.raises(ValueError, match="hidden must be >= 0"):
        HashConfig(hidden=-1)


def test_two_tower_learns_leak_free_codes_that_beat_random_ones(tiny):
    model, history = fit_hashing(tiny, two_tower(), progress=False)
    assert isinstance(model, FeatureHasher) and history.best_epoch is not None
    assert 1 <= history.best_epoch <= len(history) <= 15  # patience 10 may stop it early
    # image codes from images alone: another text beside each image changes nothing
    img, txt = tiny.query.img, tiny.query.txt
    assert torch.equal(model.codes(img, txt, "unimodal")[0], model.codes(img, txt.flip(0), "fused")[0])
    assert torch.equal(model.codes(img, txt, "unimodal")[1], model.codes(img.flip(0), txt, "fused")[1])
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    for direction in ("map_i2t", "map_t2i"):
        assert row[direction] > floor[direction] + 0.1, (row, floor)


def test_two_tower_without_validation_trains_every_epoch_and_is_deterministic(tiny):
    cfg = two_tower(epochs=3, val_fraction=0.0, patience=0)
    (a, history), (b, _) = (fit_hashing(tiny, cfg, progress=False) for _ in range(2))
    assert len(history) == 3 and history.best_epoch is None
    assert torch.equal(encode_split(a, tiny.query, "unimodal", "cpu")[0], encode_split(b, tiny.query, "unimodal", "cpu")[0])


def test_cca_itq_is_pca_then_cca_then_the_itq_rotation(tiny):
    """The fitted linear heads give the codes of the textbook pipeline computed here step by step."""
    model, n_used = fit_cca_itq(tiny.train, 16, max_pca=32, seed=3)
    assert n_used == 16
    img, txt = tiny.train.img.double().numpy(), tiny.train.txt.double().numpy()
    pca_img, pca_txt = PCA(32, random_state=3).fit(img), PCA(min(32, txt.shape[1]), random_state=3).fit(txt)
    cca = CCA(16, max_iter=1000).fit(pca_img.transform(img), pca_txt.transform(txt))
    proj = np.vstack(cca.transform(pca_img.transform(img), pca_txt.transform(txt)))
    rotation, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(16, 16)))
    for _ in range(50):
        u, _, vt = np.linalg.svd(proj.T @ np.where(proj @ rotation >= 0, 1.0, -1.0))
        rotation = u @ vt
    q_img, q_txt = cca.transform(pca_img.transform(tiny.query.img.double().numpy()),
                                 pca_txt.transform(tiny.query.txt.double().numpy()))
    want_img, want_txt = np.where(q_img @ rotation >= 0, 1.0, -1.0), np.where(q_txt @ rotation >= 0, 1.0, -1.0)
    got_img, got_txt = (c.numpy() for c in model.codes(tiny.query.img, tiny.query.txt, "unimodal"))
    assert (got_img == want_img).mean() > 0.999 and (got_txt == want_txt).mean() > 0.999


@pytest.mark.parametrize("data", ["mirflickr730", "skewed"])
def test_cca_is_scikit_learns_on_the_products_of_the_features(data):
    """ucmfh's CCA (the power method on XᵀX, YᵀY and XᵀY) projects as scikit-learn's CCA, which it replaced (full
    Flickr8k's 128 components took 220 s there, 0.5 s here): on real features after PCA (what it is given: PCA
    leaves out every direction of no variance first), and on features of scales 10^-3 to 10^2 apart."""
    from conftest import shared_file  # noqa: PLC0415

    from ucmfh.data.h5 import load_dataset  # noqa: PLC0415
    from ucmfh.methods.cca_itq import cca  # noqa: PLC0415

    if data == "skewed":
        rng = np.random.default_rng(0)
        x = rng.normal(size=(400, 15))
        y = (x[:, :6] @ rng.normal(size=(6, 8)) + rng.normal(size=(400, 8))) * 10.0 ** rng.uniform(-3, 2, size=8)
        x *= 10.0 ** rng.uniform(-3, 2, size=15)
    else:
        train = load_dataset(shared_file("mirflickr730.h5")).train
        x = PCA(64, random_state=0).fit_transform(train.img.double().numpy())
        y = PCA(64, random_state=0).fit_transform(train.txt.double().numpy())
    n = 7 if data == "skewed" else 32
    want = CCA(n, max_iter=1000).fit(x, y).transform(x, y)
    for got, wanted in zip((side(z) for side, z in zip(cca(x, y, n), (x, y))), want):
        assert np.abs(got - wanted).max() < 1e-9 * np.abs(wanted).max()


def test_cca_itq_bits_beyond_what_the_features_allow_are_constant(tmp_path):
    """Text features that sum to one (Wiki's topic proportions) have one direction of no variance."""
    rng = np.random.default_rng(0)
    txt = rng.dirichlet(np.ones(6), size=300).astype(np.float32)  # 6-d, rank 5 once centred
    img = np.concatenate([txt @ rng.normal(size=(6, 20)), rng.normal(size=(300, 4))], 1).astype(np.float32)
    split = Split(torch.from_numpy(img), torch.from_numpy(txt), None)
    model, n_used = fit_cca_itq(split, 16)
    assert n_used == 5
    codes_img, codes_txt = model.codes(split.img, split.txt, "unimodal")
    assert (codes_img[:, 5:] == 1).all() and (codes_txt[:, 5:] == 1).all()
    assert (codes_img[:, :5].mean(0).abs() < 0.9).all()  # the informative bits do vary


def test_cca_itq_says_how_many_bits_carry_information(tmp_path):
    """Asked for more bits than its features' directions, CCA-ITQ's codes are constant beyond them: the run says
    so before its table, and its rows and history record it."""
    from ucmfh.app.cli import main
    from ucmfh.data.writer import write_dataset

    path = tmp_path / "sums.h5"
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 200), ("query", 20), ("retrieval", 200)):
        txt = rng.dirichlet(np.ones(6), size=n).astype(np.float32)  # 6-d, rank 5 once centred
        arrays[split] = {"image": rng.normal(size=(n, 20)).astype(np.float32), "text": txt,
                         "labels": np.eye(3, dtype=np.uint8)[rng.integers(0, 3, n)]}
    write_dataset(path, arrays)
    results = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["train-hash", "-d", str(path), "--method", "cca-itq", "-b", "8", "-b", "16",
                                       "--quiet", "--device", "cpu", "--out", str(tmp_path / "runs"),
                                       "--results", str(results)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: 5 of the {n} bits carry information (as many as the features' directions after PCA); "
                     f"the other {n - 5} are +1 for every item and change no ranking" for n in (8, 16)]
    rows = [json.loads(line) for line in results.read_text().splitlines() if '"hashing"' in line]
    assert [(row["n_bits"], row.get("filled_bits")) for row in rows] == [(8, 5), (16, 5)]


@pytest.mark.parametrize("method", ["two-tower", "cca-itq"])
def test_a_feature_hasher_checkpoint_gives_back_the_same_codes(tiny, tmp_path, method):
    cfg = two_tower(epochs=2, n_bits=16) if method == "two-tower" else hash_config("cca-itq", n_bits=16, device="cpu")
    model, _ = fit_hashing(tiny, cfg, progress=False)
    path = save_checkpoint(tmp_path / "hash16.pt", model, None, cfg)
    loaded, fusion_cfg, hash_cfg, _ = load_model(path, "hash", d_img=tiny.d_img, d_txt=tiny.d_txt, n_bits=16)
    assert fusion_cfg is None and hash_cfg == cfg and isinstance(loaded, FeatureHasher)
    for a, b in zip(encode_split(model, tiny.query, "unimodal", "cpu"), encode_split(loaded, tiny.query, "unimodal", "cpu")):
        assert torch.equal(a, b)


def test_ucmfh_without_its_fusion_encoder_is_refused(tiny):
    with pytest.raises(ValueError, match="fusion encoder"):
        fit_hashing(tiny, small_hash(), progress=False)


def test_ucmfh_starts_on_a_fusion_encoder_of_random_weights_as_its_release_does(tiny):
    """UCMFH's released task 1 trains a fusion encoder of random weights with the heads, not task 0's:
    fusion_start='random' takes the fusion stage's settings alone, builds the encoder in the run's set-up (the
    same seed, the same model) and trains it; a trained encoder given there, or settings where one is wanted,
    are refused rather than set aside."""
    from conftest import small_fusion
    from ucmfh.fusion_stage import fit_fusion

    random = small_hash(method_params={"fusion_start": "random"})
    first, history = fit_hashing(tiny, random, small_fusion(), progress=False)
    again, _ = fit_hashing(tiny, random, small_fusion(), progress=False)
    assert len(history) == random.epochs
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.allclose(first.fusion.img_mean, tiny.train.img.mean(dim=0))  # its statistics fitted here
    trained, _ = fit_fusion(tiny, small_fusion(), progress=False)
    with pytest.raises(ValueError, match=r"trains a fusion encoder of random weights, as UCMFH's release does: give "
                                         r"its FusionConfig \(given: a trained encoder;"):
        fit_hashing(tiny, random, trained, progress=False)
    with pytest.raises(ValueError, match=r"give its FusionConfig \(given: none;"):  # said 'not a trained encoder'
        fit_hashing(tiny, random, None, progress=False)
    with pytest.raises(ValueError, match="learns from a trained fusion encoder: give ucmfh.fit_fusion's"):
        fit_hashing(tiny, small_hash(), small_fusion(), progress=False)
    with pytest.raises(ValueError, match="'fusion_start' must be one of trained, random, got 'warm'"):
        fit_hashing(tiny, small_hash(method_params={"fusion_start": "warm"}), trained, progress=False)


def test_two_tower_on_a_caption_set_keeps_the_captions_of_an_image_together(tmp_path):
    """Every caption of an image is a positive of it; validation holds out whole images."""
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    from ucmfh.data.h5 import load_dataset

    data = load_dataset(caption_file(tmp_path / "captions.h5", n_retrieval=60))
    model, history = fit_hashing(data, two_tower(n_bits=16, epochs=5, batch_size=32), progress=False)
    assert history.best_epoch is not None and len(history.validation) == len(history)
    rows = evaluate_hashing(model, data, ["unimodal"], device="cpu")
    assert [r["database"] for r in rows] == ["test", "collection"]
    assert all(set(r["recall_i2t"]) == {"1", "5", "10"} for r in rows)


def _rows(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_hash_method_from_the_command_line(tiny_path, tmp_path):
    runner, results, out = CliRunner(), tmp_path / "r.jsonl", str(tmp_path / "runs")
    common = ["-d", tiny_path, "-b", "16", "--results", str(results), "--out", out, "--device", "cpu", "--quiet"]
    result = runner.invoke(main, ["train-hash", *common, "--epochs", "3", "--set", "hash.hidden=64"])
    assert result.exit_code == 0, result.output
    assert "fusion encoder" not in result.output  # the default method trains no fusion stage
    [row] = _rows(results)  # leak-free: the unimodal protocol only
    assert (row["method"], row["loss"], row["protocol"]) == ("two-tower", "infonce", "unimodal")
    assert row["settings"]["fusion"] is None and row["settings"]["hash"]["val_fraction"] == 0.1
    assert row["best_epoch"] in (1, 2, 3) and row["epochs_run"] == 3
    checkpoint = Path(row["checkpoint"])
    assert checkpoint.parent.name.startswith("two-tower-seed2023-") and checkpoint.parent.parent.name.startswith("tiny-")
    result = runner.invoke(main, ["evaluate", "-d", tiny_path, "-c", str(checkpoint), "--results", str(results),
                                  "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    again = _rows(results)[-1]
    assert (again["method"], again["protocol"], again["map_i2t"]) == ("two-tower", "unimodal", row["map_i2t"])

    result = runner.invoke(main, ["train-hash", *common, "--method", "cca-itq"])
    assert result.exit_code == 0, result.output
    cca = _rows(results)[-1]
    assert (cca["method"], cca["loss"], cca["protocol"]) == ("cca-itq", None, "unimodal")
    assert cca["map_i2t"] > cca["random_map_i2t"]
    # the loss option reaches two-tower; an explicit validation setting replaces the method's
    result = runner.invoke(main, ["train-hash", *common, "--epochs", "2", "--set", "hash.hidden=64",
                                  "--loss", "original", "--val-fraction", "0"])
    assert result.exit_code == 0, result.output
    last = _rows(results)[-1]
    assert last["loss"] == "original" and last["settings"]["hash"]["val_fraction"] == 0 and "best_epoch" not in last

    # a patience alone suits two-tower, whose validation is on by default (no fusion stage to refuse it)
    result = runner.invoke(main, ["train-hash", *common, "--epochs", "2", "--set", "hash.hidden=64", "--patience", "3"])
    assert result.exit_code == 0, result.output
    assert _rows(results)[-1]["settings"]["hash"]["patience"] == 3

    bad = runner.invoke(main, ["train-hash", *common, "--method", "nosuch"])
    assert bad.exit_code == 2 and "nosuch" in bad.output


def test_grid_compares_methods_and_runs_a_closed_form_one_once(tiny_path, tmp_path):
    results, table = tmp_path / "g.jsonl", tmp_path / "t"
    argv = ["grid", "-d", tiny_path, "-b", "8", "--seeds", "1,2", "--methods", "two-tower,cca-itq",
            "--losses", "infonce,original", "--epochs", "2", "--set", "hash.hidden=32", "--out", str(tmp_path / "runs"),
            "--results", str(results), "--table", str(table), "--device", "cpu", "--quiet"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    rows = _rows(results)
    assert sorted((r["method"], r["loss"] or "-", r["seed"]) for r in rows) == sorted(
        [("two-tower", loss, s) for loss in ("infonce", "original") for s in (1, 2)] + [("cca-itq", "-", 1), ("cca-itq", "-", 2)])
    assert {r["protocol"] for r in rows} == {"unimodal"}
    md = Path(f"{table}.md").read_text()
    assert "| `two-tower` |" in md and "| `two-tower:original` |" in md and "| `cca-itq` |" in md
    assert "against `two-tower`" in md
    again = CliRunner().invoke(main, argv)
    assert again.output.count("skip") == 6 and len(_rows(results)) == len(rows)


def test_a_d_img_mismatch_is_refused_for_a_feature_hasher(tiny, tmp_path):
    cfg = hash_config("cca-itq", n_bits=16, device="cpu")
    model, _ = fit_hashing(tiny, cfg, progress=False)
    path = save_checkpoint(tmp_path / "h.pt", model, None, cfg)
    with pytest.raises(ValueError, match="image feature dim"):
        load_model(path, "hash", d_img=tiny.d_img + 1)


def test_distill_without_its_teacher_weight_is_infonce():
    from ucmfh.losses import build_loss, soft_infonce
    from ucmfh.similarity import normalize
    from ucmfh.losses.distill import distill_targets

    g = torch.Generator().manual_seed(0)
    img, txt, teacher = (normalize(torch.randn(12, 16, generator=g)) for _ in range(3))
    plain = build_loss("infonce", temperature=0.3)(img, txt)
    assert torch.allclose(soft_infonce(img, txt, distill_targets(teacher, None, 0.0, 0.2), 0.3), plain, atol=1e-6)
    targets = distill_targets(teacher, torch.tensor([0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), 0.8, 0.2)
    assert torch.allclose(targets.sum(1), torch.ones(12)) and targets[0, 1] > 0.1  # an id's items share the pair's share
    # with weight, the targets follow the teacher: a teacher that agrees with the student lowers the loss
    agree = soft_infonce(img, txt, distill_targets(normalize(img + txt), None, 0.8, 0.2), 0.3)
    disagree = soft_infonce(img, txt, distill_targets(teacher, None, 0.8, 0.2), 0.3)
    assert agree < disagree


def test_distill_needs_infonce_and_a_teacher(tiny):
    with pytest.raises(ValueError, match="loss must be 'infonce'"):
        hash_config("distill", loss="original")
    # its soft InfoNCE reads τ as a number: a learnable τ would be cut from its gradient and never move
    with pytest.raises(ValueError, match="fixed InfoNCE temperature: learnable must be false"):
        hash_config("distill", loss_params={"temperature": 0.3, "learnable": True})
    with pytest.raises(ValueError, match="learns from a fusion encoder"):
        fit_hashing(tiny, hash_config("distill", n_bits=16, device="cpu"), progress=False)


def test_distill_student_codes_are_leak_free_and_learnt(tiny):
    from ucmfh.fusion_stage import fit_fusion

    from conftest import small_fusion

    fusion, _ = fit_fusion(tiny, small_fusion(epochs=3), progress=False)
    model, history = fit_hashing(tiny, hash_config("distill", n_bits=16, hidden=64, epochs=10, device="cpu"),
                                 fusion, progress=False)
    assert isinstance(model, FeatureHasher) and history.best_epoch is not None
    img, txt = tiny.query.img, tiny.query.txt
    assert torch.equal(model.codes(img, txt, "unimodal")[0], model.codes(img, txt.flip(0), "fused")[0])
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    assert row["map_i2t"] > floor["map_i2t"] + 0.05 and row["map_t2i"] > floor["map_t2i"] + 0.05


def test_train_hash_distill_trains_its_teacher_with_the_students_validation_split(tiny_path, tmp_path):
    runner, results = CliRunner(), tmp_path / "r.jsonl"
    result = runner.invoke(main, ["train-hash", "-d", tiny_path, "-b", "16", "--method", "distill", "--epochs", "3",
                                  "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--set", "hash.hidden=64",
                                  "--results", str(results), "--out", str(tmp_path / "runs"), "--device", "cpu",
                                  "--quiet"])
    assert result.exit_code == 0, result.output
    assert "fusion encoder: training" in result.output
    [row] = _rows(results)
    assert (row["method"], row["loss"], row["protocol"]) == ("distill", "infonce", "unimodal")
    fusion, student = row["settings"]["fusion"], row["settings"]["hash"]
    assert fusion["loss"] == "original" and (fusion["val_fraction"], fusion["seed"]) == (student["val_fraction"], student["seed"])
    result = runner.invoke(main, ["evaluate", "-d", tiny_path, "-c", row["checkpoint"], "--results", str(results),
                                  "--device", "cpu", "--quiet"])
    assert result.exit_code == 0, result.output
    again = _rows(results)[-1]
    assert (again["run"], again["map_i2t"], again["map_t2i"]) == (row["run"], row["map_i2t"], row["map_t2i"])


def test_sign_relaxation_trains_on_the_codes_with_tanhs_gradient():
    from ucmfh.models.relaxation import relaxed_codes

    logits = torch.randn(5, 16, dtype=torch.float32, requires_grad=True)
    codes = relaxed_codes(logits, hash_config("two-tower", n_bits=16, relaxation="sign"), 1.0)
    assert hash_config("two-tower").relaxation == "sign" and HashConfig().relaxation == "tanh"
    assert torch.allclose(codes.abs(), torch.full_like(codes, 16 ** -0.5))  # the ±1 codes, L2-normalised
    assert torch.equal(codes.sign(), torch.where(logits >= 0, 1.0, -1.0))
    weights = torch.randn(5, 16)
    (codes * weights).sum().backward()
    unit = torch.where(logits >= 0, 1.0, -1.0).detach() / 4  # the normalised codes; |±1 codes| = √16 = 4
    through_norm = (weights - unit * (unit * weights).sum(1, keepdim=True)) / 4
    want = through_norm * (1 - torch.tanh(logits.detach()) ** 2)  # the sign passes tanh's gradient through
    assert torch.allclose(logits.grad, want, atol=1e-6)
    with pytest.raises(ValueError, match="relaxation must be one of"):
        HashConfig(relaxation="round")


def test_no_relaxation_trains_a_real_valued_embedding_and_validates_it_by_cosine(tiny):
    from ucmfh.evaluation import head_outputs_split  # noqa: PLC0415
    from ucmfh.models.relaxation import relaxed_codes  # noqa: PLC0415
    from ucmfh.selection import validation_split, validator

    logits = torch.randn(5, 16, requires_grad=True)
    embedding = relaxed_codes(logits, two_tower(relaxation="none"), 3.0)  # beta does nothing here
    assert torch.allclose(embedding, logits / logits.norm(dim=1, keepdim=True))
    embedding.sum().backward()
    assert logits.grad.abs().sum() > 0
    model, history = fit_hashing(tiny, two_tower(epochs=6, relaxation="none", loss_params=T03), progress=False)
    assert history.best_epoch is not None and history.chosen is None  # trained as asked, nothing chosen
    rest, val = validation_split(tiny.train, 0.1, 2023)
    by_cosine = validator(head_outputs_split, "cosine", model, val, rest, torch.device("cpu"))()
    assert by_cosine == pytest.approx(history.best_score, abs=1e-6)  # the kept epoch's score: its head outputs by cosine
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu", real_valued=True)
    floor = random_codes_map(tiny, 16)
    for direction in ("map_i2t", "map_t2i"):
        assert row["real_valued"][direction] > floor[direction] + 0.1, (row, floor)


def test_grid_on_a_caption_set_keeps_both_databases_and_tabulates_recall(tmp_path):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    path = caption_file(tmp_path / "captions.h5", n_retrieval=60)
    results, table = tmp_path / "g.jsonl", tmp_path / "t"
    argv = ["grid", "-d", path, "-b", "16", "--methods", "two-tower,cca-itq", "--epochs", "2", "--set",
            "hash.hidden=32", "--batch-size", "32", "--out", str(tmp_path / "runs"), "--results", str(results),
            "--table", str(table), "--device", "cpu", "--quiet", "--seeds", "2023,2024"]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    first_md = Path(f"{table}.md").read_text()
    again = CliRunner().invoke(main, argv)  # every cell skipped: the table is made from the recorded rows
    assert again.exit_code == 0 and again.output.count("skip") == 4
    md = Path(f"{table}.md").read_text()
    assert md == first_md
    for database in ("test", "collection"):
        assert f"MAP@50 by id I→T / T→I, database `{database}`" in md
        assert f"R@1 I→T / T→I in % (rSum), database `{database}`" in md
    # the field's figure, tie-aware, leads: each method's mean ± std over the two seeds, as `runs` summarises the rows
    recall = md.split("R@1 I→T / T→I in % (rSum), database `test` (mean ± std over seeds")[1]
    for group in (g for g in summarize(_rows(results)) if g["database"] == "test"):
        cell = " / ".join(f"{group[f'{f}_expected_mean']:.1f} ± {group[f'{f}_expected_std']:.1f}"
                          for f in ("r1_i2t", "r1_t2i"))
        rsum = f"{group['rsum_expected_mean']:.1f} ± {group['rsum_expected_std']:.1f}"
        assert f"| `{group['method']}` | {cell} ({rsum}) | 2 |" in recall.split("\n\n")[1], group["method"]
    assert {(r["method"], r["database"]) for r in _rows(results)} == {
        (m, d) for m in ("two-tower", "cca-itq") for d in ("test", "collection")}


def test_real_valued_scores_are_the_cosine_ranking_of_the_head_outputs_whose_signs_are_the_codes(tiny):
    model, _ = fit_hashing(tiny, two_tower(epochs=2, val_fraction=0.0, patience=0), progress=False)
    outputs = model.head_outputs(tiny.query.img, tiny.query.txt, "unimodal")
    codes = model.codes(tiny.query.img, tiny.query.txt, "unimodal")
    assert all(torch.equal(torch.where(o >= 0, 1.0, -1.0), c) for o, c in zip(outputs, codes))
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu", real_valued=True)
    retrieval = model.head_outputs(tiny.retrieval.img, tiny.retrieval.txt, "unimodal")
    want_i2t = map_at_k(outputs[0], retrieval[1], tiny.query.labels, tiny.retrieval.labels, k=50, ranking="cosine")
    want_t2i = map_at_k(outputs[1], retrieval[0], tiny.query.labels, tiny.retrieval.labels, k=50, ranking="cosine")
    assert {key: row["real_valued"][key] for key in ("map_i2t", "map_t2i")} == {"map_i2t": want_i2t, "map_t2i": want_t2i}
    # no cosine repeats here: the tie-aware twins equal the figures by index order
    assert row["real_valued"]["map_i2t_expected"] == pytest.approx(want_i2t, abs=1e-12)
    assert row["real_valued"]["map_t2i_expected"] == pytest.approx(want_t2i, abs=1e-12)
    assert row["real_valued"]["map_i2t"] != row["map_i2t"]  # the codes are scored by Hamming distance
    assert "real_valued" not in evaluate_hashing(model, tiny, ["unimodal"], device="cpu")[0]


def test_real_valued_cca_itq_is_real_valued_cca(tiny):
    """ITQ's rotation keeps cosines: the real-valued output of cca-itq ranks as plain PCA → CCA."""
    model, n_used = fit_cca_itq(tiny.train, 16, max_pca=32, seed=3)
    img, txt = tiny.train.img.double().numpy(), tiny.train.txt.double().numpy()
    pca_img, pca_txt = PCA(32, random_state=3).fit(img), PCA(min(32, txt.shape[1]), random_state=3).fit(txt)
    cca = CCA(n_used, max_iter=1000).fit(pca_img.transform(img), pca_txt.transform(txt))
    want = cca.transform(pca_img.transform(tiny.query.img.double().numpy()),
                         pca_txt.transform(tiny.query.txt.double().numpy()))
    got = model.head_outputs(tiny.query.img, tiny.query.txt, "unimodal")
    for g, w in zip(got, want):
        g, w = torch.nn.functional.normalize(g.double()[:, :n_used]), torch.nn.functional.normalize(torch.from_numpy(w))
        assert torch.allclose(g @ g.T, w @ w.T, atol=1e-4)


def test_a_caption_set_row_carries_the_real_valued_recall_and_the_grid_tabulates_it(tmp_path):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    path = caption_file(tmp_path / "captions.h5", n_retrieval=60)
    results, table = tmp_path / "g.jsonl", tmp_path / "t"
    argv = ["grid", "-d", path, "-b", "16", "--methods", "cca-itq", "--out", str(tmp_path / "runs"),
            "--results", str(results), "--table", str(table), "--device", "cpu", "--quiet"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    rows = _rows(results)
    for row in rows:
        scores = {"map_i2t", "map_t2i", "recall_i2t", "recall_t2i", "rsum"}
        assert set(row["real_valued"]) == scores | {f"{s}_expected" for s in scores}  # ties by index, tie-aware
        for twin in ("", "_expected"):
            real = row["real_valued"]
            assert real[f"rsum{twin}"] == pytest.approx(
                sum(real[f"recall_i2t{twin}"].values()) + sum(real[f"recall_t2i{twin}"].values()))
    md = Path(f"{table}.md").read_text()
    test = next(r for r in rows if r["database"] == "test")["real_valued"]
    assert "Real-valued head outputs ranked by cosine (before the sign), R@1 I→T / T→I in % (rSum), database `test`" in md
    assert (f"| `cca-itq` | {test['recall_i2t_expected']['1']:.1f} / {test['recall_t2i_expected']['1']:.1f} "
            f"({test['rsum_expected']:.1f}) |") in md
    shown = CliRunner().invoke(main, ["train-hash", "-d", path, "-b", "16", "--method", "cca-itq", "--out",
                                      str(tmp_path / "runs"), "--results", str(results), "--device", "cpu",
                                      "--quiet", "--resume"])
    assert shown.exit_code == 0 and shown.output.count("(cosine of the real-valued head outputs)") == 2, shown.output


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


T03 = {"temperature": 0.3}  # a temperature given: two-tower has no temperature to choose


def test_auto_relaxation_keeps_the_candidate_with_the_better_validation_score(tiny, tmp_path, monkeypatch):
    import ucmfh.trainer as trainer_module  # noqa: PLC0415 - its optimize is counted below
    from ucmfh.training_state import StateFile, candidate_path, discard_state

    runs = {name: fit_hashing(tiny, two_tower(epochs=6, relaxation=name, loss_params=T03), progress=False)
            for name in ("sign", "tanh")}
    state = StateFile(str(tmp_path / "hash16.state.pt"), interval_s=0)
    model, history = fit_hashing(tiny, two_tower(epochs=6, relaxation="auto", loss_params=T03), progress=False,
                                 state=state)
    # each candidate is the run asked for by name; the kept one scores higher on validation
    assert history.choice_scores == {name: h.best_score for name, (_, h) in runs.items()}
    assert history.chosen == max(runs, key=lambda name: (runs[name][1].best_score, name == "sign"))
    kept_model, kept = runs[history.chosen]
    assert _same_weights(model, kept_model) and history.validation == kept.validation
    assert history.as_dict()["chosen"] == history.chosen and "chosen" not in kept.as_dict()
    # every candidate left a finished state: resuming the choice trains nothing and returns the same model
    assert all(Path(candidate_path(state.path, c)).exists() for c in ("sign", "tanh"))
    steps = []
    monkeypatch.setattr(trainer_module, "optimize", lambda *a: steps.append(1))
    again, history_again = fit_hashing(tiny, two_tower(epochs=6, relaxation="auto", loss_params=T03), progress=False,
                                       state=StateFile(state.path, resume=True))
    assert not steps and _same_weights(again, model) and history_again.as_dict() == history.as_dict()
    monkeypatch.undo()
    discard_state(state)
    assert not list(tmp_path.iterdir())
    # without a validation split there is nothing to choose on: the first candidate, alone
    lone, lone_history = fit_hashing(tiny, two_tower(epochs=2, relaxation="auto", val_fraction=0.0, loss_params=T03),
                                     progress=False)
    sign, _ = fit_hashing(tiny, two_tower(epochs=2, relaxation="sign", val_fraction=0.0, loss_params=T03),
                          progress=False)
    assert _same_weights(lone, sign) and (lone_history.chosen, lone_history.choice_scores) == ("sign", {})
    assert HashConfig(method="cca-itq", relaxation="auto").relaxation == "auto"  # nothing to choose: one fit


def test_train_hash_auto_relaxation_reports_its_choice_and_refuses_to_restart_a_saved_candidate(tiny_path, tmp_path):
    from ucmfh.methods import fit_hashing as fit  # noqa: PLC0415
    from ucmfh.training_state import StateFile, candidate_path  # noqa: PLC0415

    runner, results, out = CliRunner(), tmp_path / "r.jsonl", tmp_path / "runs"
    argv = ["train-hash", "-d", tiny_path, "-b", "16", "--results", str(results), "--out", str(out), "--device",
            "cpu", "--quiet", "--epochs", "3", "--set", "hash.hidden=64", "--set", "hash.relaxation=auto",
            "--loss-param", "temperature=0.3"]
    result = runner.invoke(main, argv)
    assert result.exit_code == 0, result.output
    [row] = _rows(results)
    assert "chosen on validation: " + row["chosen"] in result.output
    assert set(row["choice_val_scores"]) == {"sign", "tanh"} and row["settings"]["hash"]["relaxation"] == "auto"
    assert row["val_score"] == row["choice_val_scores"][row["chosen"]]
    assert not list(out.rglob("*.state.pt"))  # both candidates' states are gone with the result saved
    # a candidate's saved state beside a checkpoint still to train is an interrupted run
    checkpoint = Path(row["checkpoint"])
    checkpoint.unlink()
    from ucmfh.data.h5 import load_dataset  # noqa: PLC0415

    cfg = hash_config("two-tower", n_bits=16, hidden=64, epochs=3, device="cpu", relaxation="sign", loss_params=T03)
    fit(load_dataset(tiny_path), cfg, progress=False,
        state=StateFile(candidate_path(str(checkpoint.with_suffix(".state.pt")), "sign"), interval_s=0))
    refused = runner.invoke(main, argv)
    assert refused.exit_code == 2 and "interrupted run of these settings" in refused.output
    assert "sign: finished" in refused.output and "Traceback" not in refused.output
    resumed = runner.invoke(main, [*argv, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming" in resumed.output and _rows(results)[-1]["map_i2t"] == row["map_i2t"]


def test_two_tower_chooses_infonces_temperature_on_validation_unless_one_is_given(tiny):
    method = METHODS["two-tower"]
    assert list(method.choices(two_tower())) == ["t0.3", "t0.1"]
    assert list(method.choices(two_tower(relaxation="auto"))) == ["sign-t0.3", "tanh-t0.3", "sign-t0.1", "tanh-t0.1"]
    assert method.choices(two_tower(loss_params=T03)) == {}  # a temperature given: trained as asked
    assert method.choices(two_tower(loss="triplet")) == {}  # no InfoNCE temperature to choose
    assert list(method.choices(two_tower(method_params={"temperatures": "0.2"}))) == ["t0.2"]
    distill = METHODS["distill"]
    assert distill.choices(hash_config("distill")) == {} and "temperatures" not in distill.params
    with pytest.raises(ValueError, match="parameter 'temperatures' must be positive numbers separated by commas"):
        two_tower(method_params={"temperatures": "0.3,x"})
    # temperatures asked for where none would be tried: refused, not dropped without a word
    with pytest.raises(ValueError, match=r"'temperatures' \('0.2'\) is tried .*; here the loss is infonce at "
                                         r"temperature 0.5"):
        two_tower(loss_params={"temperature": 0.5}, method_params={"temperatures": "0.2"})
    with pytest.raises(ValueError, match="here the loss is 'triplet'"):
        two_tower(loss="triplet", loss_params={}, method_params={"temperatures": "0.2"})
    # each candidate is the run asked for with that temperature; the better on validation is kept
    runs = {t: fit_hashing(tiny, two_tower(epochs=3, loss_params={"temperature": t}), progress=False)
            for t in (0.3, 0.1)}
    model, history = fit_hashing(tiny, two_tower(epochs=3), progress=False)
    assert history.choice_scores == {f"t{t:g}": h.best_score for t, (_, h) in runs.items()}
    best = max(runs, key=lambda t: (runs[t][1].best_score, t == 0.3))
    assert history.chosen == f"t{best:g}" and _same_weights(model, runs[best][0])
    # one temperature: nothing to choose, the run itself
    one, one_history = fit_hashing(tiny, two_tower(epochs=3, method_params={"temperatures": "0.1"}), progress=False)
    assert one_history.chosen is None and _same_weights(one, runs[0.1][0])


def test_cca_itq_keeps_no_setting_of_training_by_steps_and_names_a_file_too_small():
    plain = hash_config("cca-itq", n_bits=16)
    kept = dict(batch_size=7, amp="bf16", dropout=0.1, modality_dropout=0.0, supervised=True, lr_head=0.5,
                relaxation="sign")
    for name, value in kept.items():  # each refused, naming it
        with pytest.raises(SettingError, match=f"^method 'cca-itq' .*: it has no use for {name}$") as refused:
            hash_config("cca-itq", n_bits=16, **{name: value})
        assert refused.value.settings == (name,)
    # one set of settings serving several methods: left out, so nothing that does nothing tells two runs apart
    assert hash_config("cca-itq", n_bits=16, drop_unused=True, **kept) == plain
    with pytest.raises(SettingError, match="^method 'cca-itq' has a loss of its own; no loss or loss parameters"):
        hash_config("cca-itq", loss="infonce")
    few = Split(torch.randn(5, 6), torch.randn(5, 4), None)
    with pytest.raises(ValueError, match=r"^small\.h5: method 'cca-itq' needs at least 8 training items .*got 5$"):
        fit_cca_itq(few, 16, source="small.h5")
    same = Split(torch.ones(40, 6), torch.randn(40, 4), None)  # sklearn's warnings, then 'n_components ... Got 0'
    with pytest.raises(ValueError, match=r"^same\.h5: every training item has the same image features: method "
                                         r"'cca-itq' finds no direction to learn a bit from$"):
        fit_cca_itq(same, 16, source="same.h5")


@pytest.mark.parametrize("modality", ["img", "txt"])
def test_a_modality_the_same_for_every_training_item_is_refused_by_every_method(tiny, modality):
    """cca-itq refused training features all alike; the nine others trained on them and gave every item of that
    modality one code, scored (distill, ucch and cirh without a warning where only the training split was so)."""
    from ucmfh.fusion_stage import fit_fusion
    from ucmfh.methods import fit_hashing

    from conftest import small_fusion

    x = getattr(tiny.train, modality)
    same = dataclasses.replace(tiny, train=dataclasses.replace(tiny.train, **{modality: torch.ones_like(x)}))
    name = {"img": "image", "txt": "text"}[modality]
    refused = rf"every training item has the same {name} features: a model trained on them gives every {name} one code$"
    encoder = fit_fusion(tiny, small_fusion(epochs=1), progress=False)[0]
    for method in METHODS:
        cfg = hash_config(method, n_bits=16, device="cpu")
        fusion = encoder if METHODS[method].takes_fusion(cfg) is not None else None
        with pytest.raises(ValueError, match=refused):
            fit_hashing(same, cfg, fusion, progress=False)
    with pytest.raises(ValueError, match=refused):
        fit_fusion(same, small_fusion(), progress=False)


def test_temperatures_from_the_command_line_one_or_several():
    assert hash_config("two-tower", method_params={"temperatures": 0.2}).method_params["temperatures"] == "0.2"
    # from Python, a list (it was refused as not text; an audit's): the text the command line gives
    assert hash_config("two-tower", method_params={"temperatures": [0.3, 0.1]}) == \
        hash_config("two-tower", method_params={"temperatures": "0.3,0.1"})
    with pytest.raises(ValueError, match="parameter 'temperatures' must be text"):
        hash_config("two-tower", method_params={"temperatures": True})


def test_methods_lists_each_method_s_departures_and_what_it_fixes():
    """``ucmfh methods``: each method's defaults are its departures from HashConfig (a fixed setting equal to
    HashConfig's is not repeated among them) and a closed-form method names the settings it fixes. A method
    that does not follow the reference's epochs of a dataset says so: "else as ucmfh" read as distill's 500
    on MS-COCO, where it trains 100."""
    from ucmfh.config import HashConfig

    out = CliRunner().invoke(main, ["methods"]).output
    blocks = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            name = line.split()[0]
        blocks.setdefault(name, []).append(line.strip())
    assert sorted(blocks) == sorted(METHODS)
    for name, spec in METHODS.items():
        [defaults] = [line for line in blocks[name] if line.startswith("defaults: ")]
        base = vars(HashConfig())
        expected = {**spec.defaults, **{k: v for k, v in spec.fixed.items() if base[k] != v}}
        if name in ("two-tower", "distill"):  # their hashing stage trains 100 epochs where ucmfh trains 500
            expected["epochs"] = "100 on every dataset"
        assert re.findall(r"(\w+)=", defaults) == list(expected), name
        assert all(f"{k}={v}" in defaults for k, v in expected.items()), name
        said = "fixed (another value asked for is refused): "  # was 'fixed whatever is asked', which reads as ignored
        fixed = [line for line in blocks[name] if line.startswith(said)]
        assert fixed == ([said + ", ".join(spec.fixed)] if spec.fixed else []), name
    assert "defaults: hidden=0, epochs=1 (else as ucmfh)" in "\n".join(blocks["cca-itq"])


@pytest.mark.parametrize("method", ["daeh", "cirh", "dgcpn"])
def test_a_pass_over_the_training_pairs_before_the_first_epoch_shows_its_progress(tiny, monkeypatch, method):
    """DAEH's distances of every pair, CIRH's thresholds and DGCPN's neighbours grow with the square of the
    training items: minutes at 100,000, where nothing was said between 'training' and the first epoch. Each
    counts its rows on a bar of the run's progress (Setup.bar: shown after 2 s, off with --quiet)."""
    from ucmfh.trainer import Setup

    bars = []

    class Bar:
        def __init__(self, setup, total, desc):
            self.progress, self.total, self.desc, self.done = setup.progress, total, desc, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, rows):
            self.done += rows

    monkeypatch.setattr(Setup, "bar", lambda setup, total, desc: Bar(setup, total, desc))
    cfg = hash_config(method, n_bits=16, epochs=1, batch_size=16, val_fraction=0.0)
    for progress in (True, False):
        METHODS[method].fit(tiny, cfg, progress=progress)
        bar = bars.pop()
        assert bar.progress is progress and bar.done == bar.total == len(tiny.train) * (2 if method == "daeh" else 1)
        assert bar.desc.startswith(method.upper() + ":")
