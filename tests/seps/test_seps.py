"""SEPS (docs/reference.md §8) and its token data (§9): contract, model, training, re-ranking, front doors."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import math
import os

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.checkpoint import load_seps, save_seps
from ucmfh.config import HashConfig, SepsConfig
from ucmfh.data.h5 import DataError, load_dataset, validate_file
from ucmfh.data.writer import write_dataset
from ucmfh.data.tokens import Tokens
from ucmfh.metrics.captions import evaluate_caption_set
from ucmfh.seps.model import SEPS
from ucmfh.two_stage import Reranking
from ucmfh.utils import seed_everything
from ucmfh.seps import build_model, database_scores, databases, fit_seps, recall_rows
from ucmfh.similarity import normalize
import ucmfh
from ucmfh.methods import fit_hashing

from conftest import D_IMG, D_TXT, T, small_seps, token_splits


OF_IMAGES = {"dense_text_from": "image"}  # a file's dense descriptions generated from its images (§9)


@pytest.fixture(scope="module")
def token_path(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("tok") / "tok.h5", token_splits(), attrs={"name": "tok"})


# ---------------------------------------------------------------- the token contract (§9)

def _broken(tmp_path, edit) -> str:
    splits = token_splits()
    edit(splits)
    path = str(tmp_path / "bad.h5")
    with h5py.File(path, "w") as f:
        for split, arrays in splits.items():
            for name, array in arrays.items():
                f.create_dataset(f"{split}/{name}", data=array)
    return path


def _dense_wider(splits) -> None:
    """Dense descriptions beside the word tokens, one column wider than them (validate passed it, then train-seps
    ended in a traceback: 'mat1 and mat2 shapes cannot be multiplied')."""
    for split, arrays in token_splits(dense=True).items():
        tokens = arrays["dense_text_tokens"]
        splits[split].update(dense_text_tokens=np.concatenate([tokens, tokens[:, :1]], axis=1),
                             dense_text_offsets=arrays["dense_text_offsets"])


def _words_without_tokens(splits) -> None:
    for split, arrays in list(splits.items()):
        words = np.array([b"word"] * len(arrays["text_tokens"]))
        splits[split] = {name: value for name, value in arrays.items() if name not in ("text_tokens", "text_offsets")}
        splits[split]["text_words"] = words


@pytest.mark.parametrize("edit, where, problem", [
    (_dense_wider, "/train/dense_text_tokens", f"{D_TXT + 1}-d rows, but /train/text_tokens has {D_TXT}-d rows"),
    # §9's text_words, the word of each token row, as UTF-8 strings: numbers were valid, and words without tokens
    (lambda s: [a.update(text_words=np.arange(len(a["text_tokens"]), dtype=np.float32)) for a in s.values()],
     "/train/text_words", "expected strings, got float32"),
    (lambda s: [a.update(text_words=np.array([b"\xffword"] * len(a["text_tokens"]))) for a in s.values()],
     "/train/text_words", "row 0: not UTF-8 text"),
    (_words_without_tokens, "/train/text_words",
     "the word of each /train/text_tokens row, but there is no text_tokens dataset"),
    (lambda s: s["query"].update(text_offsets=s["query"]["text_offsets"][[0, 2, 1, *range(3, 25)]]),
     "/query/text_offsets", "offsets not increasing"),
    (lambda s: s["query"].update(text_offsets=s["query"]["text_offsets"] + np.r_[0, np.ones(24, int)]),
     "/query/text_offsets", "the last offset is"),
    (lambda s: s["query"].update(image_tokens=s["query"]["image_tokens"][:, :5]),
     "/query/image_tokens", "but /train/image_tokens has"),
    (lambda s: s["query"].update(text_tokens=s["query"]["text_tokens"][:, :7]),
     "/query/text_tokens", "but /train/text_tokens has"),
    (lambda s: s["query"]["text_tokens"].__setitem__((3, 1), np.nan), "/query/text_tokens", "NaN at row 3"),
    (lambda s: s["query"]["image_tokens"].__setitem__((2, 1, 0), np.inf), "/query/image_tokens", "item 2"),
    (lambda s: s["query"].pop("text_offsets"), "/query/text_offsets", "they come in pairs"),
    (lambda s: [s[k].pop("image_tokens") for k in ("query",)], "/query/image_tokens", "either every split"),
])
def test_token_datasets_are_validated_with_one_clear_line(tmp_path, edit, where, problem):
    path = _broken(tmp_path, edit)
    with pytest.raises(DataError) as err:
        validate_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {where}: ") and problem in message and "\n" not in message


@pytest.mark.parametrize("edit, where", [
    (lambda s: s["train"]["image_tokens"].__setitem__((4, 0, 2), np.nan), "/train/image_tokens"),
    (lambda s: s["query"]["text_tokens"].__setitem__((3, 1), np.inf), "/query/text_tokens"),
])
def test_token_values_are_checked_where_tokens_are_read_not_by_every_load(tmp_path, edit, where):
    """A file's pooled features load without a scan of its token values (seconds to minutes of reading for
    pooled methods, which never read them); every reader of the tokens says a bad value before its work."""
    path = _broken(tmp_path, edit)
    data = load_dataset(path)  # the layout is checked, the values are not
    assert len(data.train) == len(token_splits()["train"]["image"])
    split = where.split("/")[1]
    with pytest.raises(DataError, match=f"^{path}: {where}: 1 non-finite"):
        validate_file(path)  # ucmfh validate: every value
    with pytest.raises(DataError, match=f"^{path}: {where}: 1 non-finite"):
        Tokens(path, split)
    out = CliRunner().invoke(main, ["train-seps", "-d", path, "--quiet", "--out", str(tmp_path / "runs")])
    assert out.exit_code == 2 and f"{where}: 1 non-finite" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "runs").exists(), out.output  # said before the run's folder


def test_token_reader_reads_csr_rows_and_one_copy_per_image(token_path):
    splits = token_splits()
    q = splits["query"]
    items = np.array([5, 0, 3])
    for memory in (1 << 30, 0):  # in memory, and streamed from the file (sorted reads)
        with Tokens(token_path, "query", max_memory_bytes=memory) as tok:
            assert tok.in_memory == bool(memory)
            np.testing.assert_array_equal(tok.images(items).numpy(), q["image_tokens"][items].astype(np.float16))
            words, mask = tok.texts(items)
            for row, item in enumerate(items):
                a, b = q["text_offsets"][item], q["text_offsets"][item + 1]
                assert mask[row].sum() == b - a and not mask[row, b - a:].any()
                np.testing.assert_array_equal(words[row, :b - a].numpy(), q["text_tokens"][a:b].astype(np.float16))
            assert tok.n_images == 12 and (tok.image_index([0, 1, 2]) == [0, 0, 1]).all()
    with pytest.raises(DataError, match="no token features"):
        Tokens(write_dataset(str(token_path) + ".plain.h5", {
            s: {k: v for k, v in a.items() if k in ("image", "text", "ids")} for s, a in token_splits().items()}),
            "query")


# ---------------------------------------------------------------- the model (§8)

def reference_pair(model: SEPS, img_tok: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """One pair the released code's way (lib/cross_net.py, CrossSparseAggrNet_v2.forward and TokenSparse, with
    ``aggregate='raw'``): select with top-K, gather, aggregate, HRPA. No batching tricks. ucmfh's default,
    'normalised', aggregates the normalised patches and adds their mean as a global token where there is no
    [CLS] (docs/seps.md, departures 6 and 7)."""
    cfg = model.cfg
    v = model.img_proj(img_tok)
    patches = v[int(model.image_cls):]
    vn = normalize(patches)
    s_im = vn @ normalize(patches.mean(0))
    w = model.txt_proj(words)
    s_st = vn @ normalize(w.mean(0))
    if cfg.version == "code":
        score = s_im + s_st
    else:
        mm = lambda s: (s - s.min()) / (s.max() - s.min() + 1e-8)  # noqa: E731
        pred = torch.sigmoid(model.predictor(vn)).squeeze(-1)
        score = (1 - 2 * cfg.beta) * pred + cfg.beta * (mm(s_st) + 2 * mm(s_im))
    order = score.argsort(descending=True)
    keep, drop = order[:model.n_keep], order[model.n_keep:]
    raw = cfg.aggregate == "raw"
    weighed = patches if raw else vn  # the released code gathers and aggregates the raw tokens
    kept = weighed[keep]
    weights = torch.softmax(model.aggr["sparse"](kept).T, dim=1)  # [N_c, K]
    glob = [v[0]] if model.image_cls else [] if raw else [vn.mean(0)]  # [CLS], ucmfh's mean, or none
    tokens = [*glob, *(weights @ kept)]
    if len(drop):
        tokens.append(torch.softmax(score[drop], 0) @ weighed[drop])
    tokens = normalize(torch.stack(tokens))
    a = normalize(w) @ tokens.T
    if cfg.version == "code":
        a = F.leaky_relu(a, 0.1)
    row, col = a.max(dim=1).values, a.max(dim=0).values
    sim = row.mean() + col.mean()
    if cfg.version == "paper":
        top = lambda x: F.pad(x.topk(min(5, len(x))).values, (0, max(0, 5 - len(x))))  # noqa: E731
        sim = sim + model.row_mlp(top(row)).squeeze() + model.col_mlp(top(col)).squeeze()
    return sim


@pytest.mark.parametrize("version", ["code", "paper"])
@pytest.mark.parametrize("cls", [False, True])
@pytest.mark.parametrize("selection", ["frozen", "learned"])
@pytest.mark.parametrize("aggregate", ["normalised", "raw"])
def test_grid_equals_the_released_per_pair_computation(version, cls, selection, aggregate):
    torch.manual_seed(0)
    model = SEPS(D_IMG, D_TXT, T + int(cls), SepsConfig(version=version, selection=selection, embed_dim=24,
                                                        aggregate=aggregate), image_cls=cls).eval()
    img_tok = torch.randn(5, T + int(cls), D_IMG)
    lengths = [4, 1, 6, 3]
    words = torch.zeros(4, 6, D_TXT)
    mask = torch.arange(6)[None] < torch.tensor(lengths)[:, None]
    words[mask] = torch.randn(int(mask.sum()), D_TXT)
    with torch.no_grad():
        grid, _ = model.grid(model.encode_images(img_tok), model.encode_texts(words, mask), text_chunk=3)
        expected = torch.tensor([[reference_pair(model, img_tok[v], words[t, :lengths[t]]) for v in range(5)]
                                 for t in range(4)])
    torch.testing.assert_close(grid, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("selection, learns", [("frozen", False), ("learned", True), ("gumbel", True)])
def test_the_selection_learns_unless_frozen(selection, learns):
    """Defect 2: the released code's selection gets no gradient; 'learned' and 'gumbel' give it one."""
    torch.manual_seed(0)
    model = SEPS(D_IMG, D_TXT, T, SepsConfig(version="paper", selection=selection, embed_dim=24)).train()
    words, mask = torch.randn(3, 5, D_TXT), torch.ones(3, 5, dtype=torch.bool)
    sims, soft = model.grid(model.encode_images(torch.randn(4, T, D_IMG)), model.encode_texts(words, mask))
    (sims.sum() + (0 if soft is None else (soft - 0.5) ** 2)).backward()
    grads = [p.grad for p in model.predictor.parameters()]
    if learns:
        assert all(g is not None and g.abs().sum() > 0 for g in grads)
    else:
        assert all(g is None or g.abs().sum() == 0 for g in grads)


def test_gumbel_keeps_a_sample_of_the_patches_while_training_and_the_top_k_in_evaluation():
    """Straight-through Gumbel-softmax: the forward's hard top-K is of the noisy scores (a sample), where it was
    the scores' own top-K whatever the noise (the noise reached the gradient alone); evaluation keeps the top K."""
    torch.manual_seed(0)
    model = SEPS(D_IMG, D_TXT, T, SepsConfig(version="paper", selection="gumbel", embed_dim=24))
    score, logits = torch.randn(3, 4, model.n_patches), torch.randn(4, model.n_patches, 2)

    def kept(training: bool) -> torch.Tensor:
        model.train(training)
        return model._select(score, logits)[0][-1][:, :, 0].abs() < 1e-6  # the extra token weighs the dropped ones

    top = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, score.topk(model.n_keep, dim=-1).indices, True)
    assert torch.equal(kept(False), top)
    samples = [kept(True) for _ in range(5)]
    assert all(int(s.sum()) == top.sum() for s in samples) and any(not torch.equal(s, top) for s in samples)


def test_dense_text_of_the_candidate_image_never_leaks_the_caption_s_own():
    """dense_text='image': a pair's score uses the candidate's description only; 'leak' uses the caption's."""
    torch.manual_seed(0)
    img_tok = torch.randn(3, T, D_IMG)
    dense = torch.randn(3, 4, D_TXT)
    dmask = torch.ones(3, 4, dtype=torch.bool)
    words, mask = torch.randn(2, 5, D_TXT), torch.ones(2, 5, dtype=torch.bool)
    for version in ("code", "paper"):
        model = SEPS(D_IMG, D_TXT, T, SepsConfig(version=version, dense_text="image", embed_dim=24), dense=True).eval()
        base = model.grid(model.encode_images(img_tok, dense, dmask), model.encode_texts(words, mask))[0]
        changed = dense.clone()
        changed[0] += 5.0  # another description for image 0: only its column may move
        after = model.grid(model.encode_images(img_tok, changed, dmask), model.encode_texts(words, mask))[0]
        torch.testing.assert_close(after[:, 1:], base[:, 1:])
        assert not torch.allclose(after[:, 0], base[:, 0])
        leak = SEPS(D_IMG, D_TXT, T, SepsConfig(version=version, dense_text="leak", embed_dim=24), dense=True).eval()
        own = leak.grid(leak.encode_images(img_tok), leak.encode_texts(words, mask, dense[:2], dmask[:2]))[0]
        assert own.shape == (2, 3)
        # 'leak': a caption's row moves with its own image's description, and with nothing else's
        moved = leak.grid(leak.encode_images(img_tok), leak.encode_texts(words, mask, changed[:2], dmask[:2]))[0]
        assert not torch.allclose(moved[0], own[0])  # caption 0 carries image 0's (changed) description
        torch.testing.assert_close(moved[1], own[1])
        still = leak.grid(leak.encode_images(img_tok, changed, dmask), leak.encode_texts(words, mask, dense[:2],
                                                                                          dmask[:2]))[0]
        torch.testing.assert_close(still, own)  # the candidate images' descriptions play no part


# ---------------------------------------------------------------- training and scoring

@pytest.fixture(scope="module")
def trained(token_path):
    return fit_seps(token_path, small_seps(), progress=False)


def test_fit_seps_takes_a_path_or_the_dataset_read_from_it_and_refuses_other_arguments_in_words(token_path, trained):
    """From Python a Dataset failed in os.fspath and a HashConfig in an attribute lookup (an audit's)."""
    import dataclasses

    from ucmfh.data.h5 import load_dataset

    data = load_dataset(token_path)
    model, _ = fit_seps(data, small_seps(), progress=False)  # the file it was read from: as the path trains
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained[0].state_dict().values()))
    with pytest.raises(TypeError, match=r"^fit_seps: cfg must be a SepsConfig \(ucmfh.config.SepsConfig\(...\)\), "
                                        r"got HashConfig$"):
        fit_seps(token_path, ucmfh.hash_config(), progress=False)
    with pytest.raises(TypeError, match=r"^fit_seps: path must be a str or a PathLike or a Dataset"):
        fit_seps(None, small_seps(), progress=False)
    with pytest.raises(ValueError, match=r"^fit_seps: the Dataset given was made in memory"):
        fit_seps(dataclasses.replace(data, path=None), small_seps(), progress=False)


def test_amp_bf16_autocasts_the_forward_pass_and_keeps_the_loss_in_float32(token_path, monkeypatch):
    """SepsConfig.amp changed the run's key but fit_seps trained float32 whatever it said."""
    from ucmfh.seps import fit as seps_module

    seen = []
    real = seps_module.vse_hinge
    monkeypatch.setattr(seps_module, "vse_hinge", lambda sims, *a: seen.append(
        (torch.is_autocast_enabled("cpu"), sims.dtype)) or real(sims, *a))
    model, history = fit_seps(token_path, small_seps(epochs=1, amp="bf16", val_fraction=0.0), progress=False)
    assert seen and all(s == (False, torch.float32) for s in seen) and math.isfinite(history[-1])
    monkeypatch.setattr(seps_module, "autocast", lambda device, amp: seen.append(amp) or contextlib.nullcontext())
    fit_seps(token_path, small_seps(epochs=1, amp="bf16", val_fraction=0.0), progress=False)
    assert "bf16" in seen


def test_token_rows_are_read_ahead_of_the_step_and_train_the_same(token_path, monkeypatch):
    """Each batch's token rows are read on the step-ahead thread while the step before it runs (the
    device does not wait for the file), and training ends with the weights of reading them in the step."""
    import threading

    from ucmfh.seps import fit as seps_module

    readers = []
    images = Tokens.images
    monkeypatch.setattr(Tokens, "images", lambda self, items: readers.append(threading.current_thread().name)
                        or images(self, items))
    cfg = small_seps(epochs=2, val_fraction=0.0)
    ahead, _ = fit_seps(token_path, cfg, progress=False)
    n_steps = len(readers)
    ahead_of_step = sum(name.startswith("ucmfh-step-ahead") for name in readers)
    assert n_steps >= 6 and ahead_of_step == n_steps - cfg.epochs  # all but each epoch's first batch
    real = seps_module.train
    monkeypatch.setattr(seps_module, "train", lambda plan, *a, **k: real(dataclasses.replace(plan, ahead=None), *a, **k))
    readers.clear()
    in_step, _ = fit_seps(token_path, cfg, progress=False)
    assert len(readers) == n_steps and not any(name.startswith("ucmfh-step-ahead") for name in readers)
    for (name, a), b in zip(ahead.state_dict().items(), in_step.state_dict().values()):
        assert torch.equal(a, b), name


def test_training_learns_and_keeps_the_best_validation_epoch(token_path, trained):
    model, history = trained
    assert history.best_epoch == max(history.validation, key=lambda e: e[1])[0]
    q, r = Tokens(token_path, "query"), Tokens(token_path, "retrieval")
    db = databases(q, r, ["test"])[0]
    # the trained model's own initial weights (a model drawn from whatever state torch's generator was left in
    # scored 137-304 by seed, and a fit no longer leaves it seeded)
    seed_everything(small_seps().seed)
    untrained = build_model(q, small_seps()).eval()
    before = recall_rows(database_scores(untrained, db, torch.device("cpu"), 64)[0], db.txt_ids, db.img_ids,
                         db.query_txt, db.query_img)
    after = recall_rows(database_scores(model, db, torch.device("cpu"), 64)[0], db.txt_ids, db.img_ids,
                        db.query_txt, db.query_img)
    assert after["rsum"] > before["rsum"] + 40, (before, after)


def test_seps_checkpoint_round_trip(tmp_path, trained, token_path):
    model, _ = trained
    path = save_seps(tmp_path / "seps.pt", model, meta={"x": 1})
    again, cfg, meta = load_seps(path, d_img=D_IMG, d_txt=D_TXT, n_image_tokens=T)
    assert cfg == model.cfg and meta == {"x": 1}
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="n_image_tokens"):
        load_seps(path, n_image_tokens=T + 1)


def test_rerank_stages_agree_with_the_full_rankings(token_path, trained):
    """Hamming = the caption protocol's Hamming ranking; with M = every item, re-ranking = ranking all pairs."""
    model, _ = trained
    data = load_dataset(token_path)
    hasher, _ = fit_hashing(data, HashConfig(method="two-tower", n_bits=16, hidden=0, epochs=3, device="cpu",
                                             val_fraction=0, patience=0))
    q, r = Tokens(token_path, "query"), Tokens(token_path, "retrieval")
    for db in databases(q, r):
        rr = Reranking(db, data, hasher, model)
        n_all = max(len(db.txt_ids), len(db.img_ids))
        with torch.no_grad():
            img, txt = hasher.codes(data.query.img, data.query.txt, "unimodal")
            ri, rt = hasher.codes(data.retrieval.img, data.retrieval.txt, "unimodal")
        expected = evaluate_caption_set(img, txt, data.query.ids, ri, rt, data.retrieval.ids)[db.name]
        hamming = rr.run("hamming", 20)
        assert hamming["recall_i2t"] == pytest.approx(expected["recall_i2t"])
        assert hamming["recall_t2i"] == pytest.approx(expected["recall_t2i"])
        full = rr.run("seps-full", 0)
        reranked = rr.run("seps-rerank", n_all)
        assert reranked["recall_i2t"] == pytest.approx(full["recall_i2t"])
        assert reranked["recall_t2i"] == pytest.approx(full["recall_t2i"])
        assert reranked["recall_at_m_i2t"] == 100.0
        # the lists hold the whole database where M is larger: said, per direction
        assert (reranked["candidates_i2t"], reranked["candidates_t2i"]) == (len(db.txt_ids), len(db.img_ids))
        with pytest.raises(ValueError, match=r"^M = 5: a list of 5 candidates has no R@10; give M of 10 or more$"):
            rr.run("hamming", 5)  # its R@10 was read as R@5
        for direction in ("i2t", "t2i"):
            assert set(reranked["latency_ms"][direction]) == {"search", "fetch", "score"}


# ---------------------------------------------------------------- front doors

def test_train_seps_and_rerank_commands(tmp_path, token_path):
    runner = CliRunner()
    results = str(tmp_path / "results.jsonl")
    common = ["-d", str(token_path), "--results", results, "--quiet", "--device", "cpu"]
    args = ["train-seps", *common, "--out", str(tmp_path / "runs"), "--epochs", "2", "--batch-size", "32",
            "--set", "embed_dim=32", "--set", "pair_chunk=256"]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "seps-full" in first.output
    again = runner.invoke(main, args)
    assert again.exit_code == 0 and "reused" in again.output
    seps_ckpt = next((tmp_path / "runs").rglob("seps.pt"))
    hash_run = runner.invoke(main, ["train-hash", *common, "--out", str(tmp_path / "runs"), "-b", "16",
                                    "--epochs", "2", "--set", "hash.hidden=0"])
    assert hash_run.exit_code == 0, hash_run.output
    hash_ckpt = next((tmp_path / "runs").rglob("hash16.pt"))
    out = runner.invoke(main, ["rerank", *common, "-c", str(hash_ckpt), "--seps", str(seps_ckpt), "-m", "10",
                               "--full"])
    assert out.exit_code == 0, out.output
    assert "ties by database index: the lists the search returns" in out.output  # no tie-aware twins: said
    rows = [json.loads(line) for line in open(results)]
    stages = [(r.get("stage"), r.get("database")) for r in rows if r["task"] == "rerank"]
    assert stages == [(s, db) for db in ("test", "collection")
                      for s in ("hamming", "cosine-rerank", "seps-rerank", "seps-full")]
    assert all(r["protocol"] == "unimodal" for r in rows if r["task"] in ("rerank", "seps"))
    short = runner.invoke(main, ["rerank", *common, "-c", str(hash_ckpt), "-m", "20", "-m", "5"])
    assert short.exit_code == 2 and "'-m' / '--candidates': 5: a list of 5 candidates has no R@10" in short.output
    alone = runner.invoke(main, ["rerank", *common, "-c", str(hash_ckpt), "--full"])  # no SEPS: --full did nothing
    assert alone.exit_code == 2 and "--full scores every pair by SEPS: it goes with --seps SEPS.pt" in alone.output
    many = runner.invoke(main, ["rerank", *common, "-c", str(hash_ckpt), "-m", "100000"])
    assert many.exit_code == 0 and re.search(r"  M 100000 on the test database: its \d+ items of a modality are all "
                                             r"the candidates", many.output), many.output  # the column said 100000
    # a results file with re-ranking rows (no seed) and SEPS rows (a seed) still summarises,
    # each stage and M on a line of its own
    summary = runner.invoke(main, ["runs", "--results", results])
    assert summary.exit_code == 0, summary.output
    for stage in ("hamming m=10", "cosine-rerank m=10", "seps-rerank m=10", "seps-full"):
        assert sum(stage in line for line in summary.output.splitlines()) >= 2, stage  # both databases
    bad = runner.invoke(main, ["train-seps", *common, "--set", "nonsense=1"])
    assert bad.exit_code == 2 and "nonsense" in bad.output


def test_rerank_without_seps_reads_no_token(tmp_path, token_path, monkeypatch):
    """The Hamming and cosine stages use pooled features alone: a caption set without token features (full
    Flickr8k's) is re-ranked by cosine, with the figures of the same items in a file that has tokens."""
    pooled = write_dataset(tmp_path / "pooled.h5", {s: {k: v for k, v in a.items() if k in ("image", "text", "ids")}
                                                    for s, a in token_splits().items()})
    runner = CliRunner()
    hash_run = runner.invoke(main, ["train-hash", "-d", str(token_path), "--out", str(tmp_path / "runs"), "-b", "16",
                                    "--epochs", "2", "--set", "hash.hidden=0", "--quiet", "--device", "cpu",
                                    "--results", str(tmp_path / "h.jsonl")])
    assert hash_run.exit_code == 0, hash_run.output
    ckpt = str(next((tmp_path / "runs").rglob("hash16.pt")))
    rows = {}
    for name, path in (("tokens", str(token_path)), ("pooled", pooled)):
        results = tmp_path / f"{name}.jsonl"
        out = runner.invoke(main, ["rerank", "-d", path, "-c", ckpt, "-m", "10", "--quiet", "--device", "cpu",
                                   "--results", str(results)])
        assert out.exit_code == 0, out.output
        rows[name] = [{k: r[k] for k in ("stage", "database", "recall_i2t", "recall_t2i", "recall_at_m_i2t")}
                      for r in map(json.loads, open(results))]
    assert [(r["stage"], r["database"]) for r in rows["pooled"]] == [
        (stage, db) for db in ("test", "collection") for stage in ("hamming", "cosine-rerank")]
    assert rows["pooled"] == rows["tokens"]
    # interrupted on the second database: the first database's rows are kept (they were written at the end)
    stop = Reranking.run

    def run(self, stage, m, *args, **kwargs):
        if self.db.name == "collection":
            raise KeyboardInterrupt
        return stop(self, stage, m, *args, **kwargs)

    monkeypatch.setattr(Reranking, "run", run)
    stopped = tmp_path / "stopped.jsonl"
    out = runner.invoke(main, ["rerank", "-d", pooled, "-c", ckpt, "-m", "10", "--quiet", "--device", "cpu",
                               "--results", str(stopped)])
    assert out.exit_code == 130, out.output
    assert [(r["stage"], r["database"]) for r in map(json.loads, open(stopped))] == [
        ("hamming", "test"), ("cosine-rerank", "test")]


def test_rerank_says_when_its_models_were_trained_on_another_file_holding_its_queries(tmp_path):
    """``evaluate`` warned of a checkpoint trained on a file whose training split held the queries; ``rerank``
    took both its models (the hashing and the SEPS checkpoint) without a look at where they were trained, and its
    rows read as honest figures (a query split's own items in training: R@1 97 against an honest 43)."""
    scored = token_splits(seed=0, images=(20, 30))
    other = {s: {**a, "ids": a["ids"] + 1000} for s, a in token_splits(seed=1).items()}
    leaky = write_dataset(tmp_path / "leaky.h5", {"train": scored["query"], "query": other["query"],
                                                  "retrieval": other["retrieval"]})
    path = write_dataset(tmp_path / "scored.h5", scored)
    runner, runs = CliRunner(), str(tmp_path / "runs")
    common = ["--quiet", "--device", "cpu", "--results", ""]
    for args in (["train-hash", "-b", "16", "--epochs", "2", "--set", "hash.hidden=0", "--val-fraction", "0"],
                 ["train-seps", "--epochs", "1", "--batch-size", "16", "--set", "embed_dim=32", "--val-fraction", "0",
                  "--database", "test"]):
        trained = runner.invoke(main, [*args, "-d", leaky, "--out", runs, *common])
        assert trained.exit_code == 0, trained.output
    hash_ckpt, seps_ckpt = (str(next((tmp_path / "runs").rglob(name))) for name in ("hash16.pt", "seps.pt"))
    results = tmp_path / "r.jsonl"
    out = runner.invoke(main, ["rerank", "-d", path, "-c", hash_ckpt, "--seps", seps_ckpt, "-m", "10", "--quiet",
                               "--device", "cpu", "--results", str(results), "--database", "test"])
    assert out.exit_code == 0, out.output
    for ckpt in (hash_ckpt, seps_ckpt):
        assert (f"the training split of {os.path.realpath(leaky)} (by their features), which {ckpt} was trained on: "
                "its scores here are inflated") in out.output
    rows = [json.loads(line) for line in open(results)]
    assert [r["stage"] for r in rows] == ["hamming", "cosine-rerank", "seps-rerank"]
    assert all(r["trained_on"]["path"] == os.path.realpath(leaky) and r["trained_on"]["queries_trained_on"] == [40, 40]
               for r in rows)
    assert [bool(r.get("seps_trained_on")) for r in rows] == [False, False, True]
    # the models' own file: no word of it
    own = runner.invoke(main, ["rerank", "-d", leaky, "-c", hash_ckpt, "--seps", seps_ckpt, "-m", "10", *common])
    assert own.exit_code == 0 and "trained on" not in own.output and "warning" not in own.output, own.output


def test_rerank_of_a_labelled_set_says_its_relevance_is_the_exact_pair(tmp_path, tiny_path):
    """A labelled set was refused without --seps and scored with --seps (a tokens file), its labels unused both
    times without a word. One rule now: scored by the caption protocol (relevance the same id: each item's own
    pair; validated files keep query and retrieval ids apart), said in a note and in every row."""
    runner = CliRunner()
    trained = runner.invoke(main, ["train-hash", "-d", tiny_path, "--method", "two-tower", "-b", "16", "--epochs", "1",
                                   "--set", "hash.hidden=0", "--quiet", "--device", "cpu", "--out",
                                   str(tmp_path / "runs"), "--results", ""])
    assert trained.exit_code == 0, trained.output
    ckpt = str(next((tmp_path / "runs").rglob("hash16.pt")))
    results = tmp_path / "r.jsonl"
    out = runner.invoke(main, ["rerank", "-d", tiny_path, "-c", ckpt, "--device", "cpu", "-m", "10", "--quiet",
                               "--results", str(results)])
    assert out.exit_code == 0, out.output
    assert f"note: {tiny_path} has labels; SEPS and rerank score by the caption protocol" in out.output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert rows and all(row["relevance"] == "id" for row in rows)


def test_a_file_without_tokens_is_one_clear_line(tmp_path, tiny_path):
    """Said before the run starts: no 'training …' line, no run folder or lock left under --out."""
    out = CliRunner().invoke(main, ["train-seps", "-d", tiny_path, "--quiet", "--out", str(tmp_path / "runs")])
    assert out.exit_code == 2
    assert "no token features" in out.output and "Traceback" not in out.output
    assert "training" not in out.output and not (tmp_path / "runs").exists(), out.output


def test_validate_says_what_tokens_a_file_holds_and_texts_without_a_word(tmp_path, token_path):
    """validate said nothing of tokens: a file whose query texts had no word token was 'valid', and re-ranked."""
    said = CliRunner().invoke(main, ["validate", str(token_path)])
    assert said.exit_code == 0 and said.output.endswith(f"; tokens: image {T} x {D_IMG}, text {D_TXT}-d word tokens)\n")
    dense = write_dataset(tmp_path / "dense.h5", token_splits(dense=True), attrs=OF_IMAGES)
    said = CliRunner().invoke(main, ["validate", str(dense)])
    assert said.exit_code == 0 and said.output.endswith(f"text {D_TXT}-d word tokens, dense descriptions {D_TXT}-d)\n")
    splits = token_splits()
    query = splits["query"]
    n = len(query["ids"])
    query["text_offsets"] = np.zeros(n + 1, dtype=np.int64)  # every text without a word
    query["text_tokens"] = np.zeros((0, D_TXT), np.float32)
    path = write_dataset(tmp_path / "wordless.h5", splits, attrs={"name": "wordless"})
    said = CliRunner().invoke(main, ["validate", str(path)])
    assert said.exit_code == 0, said.output
    assert f"warning: {path}: /query: {n} of {n} texts have no word tokens (none has one)" in said.output
    # train-seps and rerank scored such a file at chance without a word, and appended the rows
    common = ["-d", str(path), "--results", str(tmp_path / "r.jsonl"), "--quiet", "--device", "cpu"]
    for args in (["train-seps", *common, "--out", str(tmp_path / "runs"), "--epochs", "1"],
                 ["rerank", *common, "-c", "none.pt", "--seps", "none.pt"]):
        (tmp_path / "none.pt").write_bytes(b"")
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and refused.output.splitlines()[-1] == (
            f"Error: {path}: /query: none of its {n} texts has a word token (/query/text_offsets): SEPS would score "
            "every text by nothing")
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "runs").exists()
    some = token_splits()
    lengths = np.diff(some["query"]["text_offsets"])
    lengths[:3] = 0  # three texts without a word
    some["query"]["text_offsets"] = np.concatenate([[0], np.cumsum(lengths)])
    some["query"]["text_tokens"] = some["query"]["text_tokens"][:lengths.sum()]
    path = write_dataset(tmp_path / "some.h5", some, attrs={"name": "some"})
    trained = CliRunner().invoke(main, ["train-seps", *common[:1], str(path), *common[2:], "--out",
                                        str(tmp_path / "runs"), "--epochs", "1", "--set", "embed_dim=32"])
    assert trained.exit_code == 0, trained.output
    assert f"warning: {path}: /query: 3 of {n} texts have no word tokens, which SEPS scores by nothing" in \
        trained.output


def test_dense_text_a_file_lacks_is_said_before_the_run_starts(tmp_path, token_path):
    """It was said once the run had started: its 'training ... (run ...)' line printed first."""
    out = CliRunner().invoke(main, ["train-seps", "-d", str(token_path), "--quiet", "--dense-text", "image",
                                    "--out", str(tmp_path / "runs"), "--results", ""])
    assert out.exit_code == 2 and "dense_text='image' but the file has no dense_text_tokens" in out.output
    assert "training" not in out.output and not (tmp_path / "runs").exists(), out.output


def test_dense_descriptions_say_what_they_were_generated_from_and_are_of_images_where_taken_for_them(tmp_path):
    """§9: 'a root attribute says what each description was generated from'. A file without it was valid, and
    --dense-text image took descriptions generated from the captions for the images' (an audit's): the attribute
    is required, and both dense modes take descriptions of images, in training and in a later scoring."""
    from ucmfh.data.tokens import Tokens
    from ucmfh.seps.scoring import image_inputs

    for attrs, said in (({}, "root attribute 'dense_text_from': missing; a file with dense_text_tokens says what "
                              "each description was generated from: 'image' (its item's image), 'text' (its item's "
                              "text)"),
                        ({"dense_text_from": "captions"}, "root attribute 'dense_text_from': 'captions'; a file")):
        with pytest.raises(DataError) as refused:
            write_dataset(tmp_path / "dense.h5", token_splits(dense=True), attrs=attrs)
        assert str(refused.value).startswith(f"{tmp_path / 'dense.h5'}: not written: {said}"), refused.value
    path = write_dataset(tmp_path / "dense.h5", token_splits(dense=True), attrs={"dense_text_from": "text"})
    for mode in ("image", "leak"):
        out = CliRunner().invoke(main, ["train-seps", "-d", str(path), "--quiet", "--dense-text", mode, "--results", "",
                                        "--out", str(tmp_path / "runs")])
        assert out.exit_code == 2 and out.output.splitlines()[-1] == (
            f"Error: {path}: its dense descriptions were generated from its item's text (root attribute "
            f"'dense_text_from': 'text'); dense_text={mode!r} takes descriptions of images"), out.output
    assert not (tmp_path / "runs").exists()
    model = SEPS(D_IMG, D_TXT, T, SepsConfig(dense_text="image", embed_dim=24), dense=True)
    tokens = Tokens(path, "query")
    with pytest.raises(DataError, match="generated from its item's text"):  # a model trained on another file
        image_inputs(model, tokens, np.arange(3), torch.device("cpu"))
    tokens.close()


def test_leaking_dense_text_is_labelled_in_every_row(tmp_path):
    path = write_dataset(tmp_path / "dense.h5", token_splits(dense=True), attrs=OF_IMAGES)
    results = str(tmp_path / "r.jsonl")
    out = CliRunner().invoke(main, ["train-seps", "-d", str(path), "--quiet", "--device", "cpu", "--results", results,
                                    "--out", str(tmp_path / "runs"), "--epochs", "1", "--dense-text", "leak",
                                    "--set", "embed_dim=16"])
    assert out.exit_code == 0, out.output
    assert "LEAKS" in out.output and "dense-text-leak:" in out.output
    assert all(json.loads(line)["protocol"] == "dense-text-leak" for line in open(results))
    assert math.isfinite(json.loads(open(results).readline())["rsum"])


def test_train_seps_run_again_after_an_interrupt_says_to_resume_not_that_it_is_busy(tmp_path, token_path,
                                                                                    monkeypatch):
    """Run again after Ctrl-C, train-seps refused itself: it checked for a busy run while holding the run's
    lock, and named its own pid as another process's. It says what train-hash says, and --resume continues."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    args = ["train-seps", "-d", str(token_path), "--results", str(tmp_path / "r.jsonl"), "--quiet", "--device", "cpu",
            "--out", str(tmp_path / "runs"), "--epochs", "3", "--batch-size", "32", "--set", "embed_dim=32",
            "--set", "pair_chunk=256"]
    bars = StopAfter(1)
    monkeypatch.setattr(trainer_module, "tqdm", bars)
    stopped = CliRunner().invoke(main, args)
    assert stopped.exit_code == 130, stopped.output
    bars.epochs = None
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "an interrupted run of these settings is saved here" in again.output, again.output
    assert "another process" not in again.output
    resumed = CliRunner().invoke(main, [*args, "--resume"])
    assert resumed.exit_code == 0 and bars.starts[-1] == 1, resumed.output


def test_train_seps_resume_in_another_number_of_processes_is_refused(tmp_path, token_path, monkeypatch):
    """As train-hash (tests/app/test_runs.py): a SEPS run interrupted in 2 processes (its identity says so),
    ``--resume`` in one is refused in one line naming its state and torchrun; without it, another run trains."""
    import types

    import ucmfh.app.identity as identity_module
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter

    args = ["train-seps", "-d", str(token_path), "--results", str(tmp_path / "r.jsonl"), "--quiet", "--device", "cpu",
            "--out", str(tmp_path / "runs"), "--epochs", "3", "--batch-size", "32", "--set", "embed_dim=32",
            "--set", "pair_chunk=256"]
    with monkeypatch.context() as patched:
        patched.setattr(identity_module, "current_group", lambda: types.SimpleNamespace(world_size=2))
        patched.setattr(trainer_module, "tqdm", StopAfter(1))
        assert CliRunner().invoke(main, args).exit_code == 130
    [state] = (tmp_path / "runs").rglob("seps.state.pt")
    refused = CliRunner().invoke(main, [*args, "--resume"])
    assert refused.exit_code == 2 and refused.stderr.splitlines() == [
        f"Error: {state}: an interrupted run of these settings in 2 processes is saved here (epoch 2 of 3), and this "
        "one runs in 1: a run's number of processes is part of its identity; resume it with torchrun "
        "--nproc-per-node 2"], refused.output
    fresh = CliRunner().invoke(main, args)
    assert fresh.exit_code == 0 and state.exists(), fresh.output
