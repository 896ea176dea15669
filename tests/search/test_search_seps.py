"""``ucmfh search --rerank seps``: Hamming candidates re-scored by SEPS on the collection's tokens."""
from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import D_IMG, D_TXT, T, small_seps, token_splits
from ucmfh.app.cli import main
from ucmfh.checkpoint import save_checkpoint, save_seps
from ucmfh.config import HashConfig
from ucmfh.data.format import first_of_each_id
from ucmfh.data.writer import write_dataset
from ucmfh.data.tokens import Tokens
from ucmfh.models.hashing import FeatureHasher
from ucmfh.seps.model import SEPS
from ucmfh.search import Index
from ucmfh.search.build import Encoder, build_index
from ucmfh.search.shards import open_index


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A token file (12 query + 40 retrieval images, 2 captions each), a hashing and a SEPS checkpoint."""
    folder = tmp_path_factory.mktemp("search_seps")
    splits = token_splits(seed=1)
    path = write_dataset(folder / "tok.h5", splits, attrs={"name": "tok"})
    torch.manual_seed(0)
    cfg = HashConfig(method="two-tower", n_bits=16, hidden=0)
    hasher = FeatureHasher(D_IMG, D_TXT, cfg.n_bits, cfg.hidden, cfg.dropout)
    hasher.fit_feature_stats(torch.from_numpy(splits["train"]["image"]).float(),
                             torch.from_numpy(splits["train"]["text"]).float())
    hash_ckpt = save_checkpoint(folder / "hash16.pt", hasher.eval(), None, cfg)
    torch.manual_seed(1)
    seps_ckpt = save_seps(folder / "seps.pt", SEPS(D_IMG, D_TXT, T, small_seps()).eval(), meta={})
    index = folder / "ix"
    build_index(path, hash_ckpt, str(index), chunk_size=17)
    return {"folder": folder, "path": path, "splits": splits, "hash": hash_ckpt, "seps": seps_ckpt,
            "index": str(index)}


def _rows(result):
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _direct_pair(model: SEPS, image_tokens: np.ndarray, words: np.ndarray) -> float:
    """One (image, caption) pair scored alone by the model."""
    img = model.encode_images(torch.from_numpy(image_tokens[None]).float())
    txt = model.encode_texts(torch.from_numpy(words[None]).float(), torch.ones(1, len(words), dtype=torch.bool))
    return float(model.grid(img, txt)[0][0, 0].detach())


@pytest.mark.parametrize("searched", ["text", "image"])
def test_cli_order_is_the_seps_order_of_the_hamming_candidates(files, searched, monkeypatch):
    """Image queries -> captions and caption queries -> images: the CLI's top k equal the M Hamming candidates
    scored pair by pair with the SEPS model, ordered by score (ties by position). A search reads the token rows
    of its queries and candidates alone: no scan of every token value (2 s a search on flickr8k1000)."""
    from ucmfh.checkpoint import load_seps
    from ucmfh.data import tokens

    def scan(*args):
        raise AssertionError("a search scanned every token value")

    monkeypatch.setattr(tokens, "check_token_values", scan)
    k, m = 5, 15
    out = CliRunner().invoke(main, ["search", files["index"], "-q", files["path"], "-m", searched, "-k", str(k),
                                    "--rerank", "seps", "--seps", files["seps"], "--candidates", str(m), "--json", "--ids", "0,3,4,9"])
    assert out.exit_code == 0, out.output
    rows = _rows(out)
    model = load_seps(files["seps"])[0]
    with h5py.File(files["path"], "r") as f:  # the tokens as stored (float16)
        splits = {split: {name: f[split][name][()] for name in f[split]} for split in ("query", "retrieval")}
    query = splits["query"]
    # the items in the order the index holds them: every caption, and the first row of each image id
    words, images = [], []
    for split in ("query", "retrieval"):
        s = splits[split]
        offsets = s["text_offsets"]
        words += [s["text_tokens"][offsets[i]:offsets[i + 1]] for i in range(len(s["ids"]))]
        images += [s["image_tokens"][i] for i in first_of_each_id(s["ids"])]
    encoder = Encoder(files["hash"])
    index = Index.load(files["index"])
    asked = np.isin(query["ids"], [0, 3, 4, 9])
    if searched == "text":  # the unique query images ask
        q_rows = first_of_each_id(query["ids"])
        q_rows = q_rows[asked[q_rows]]
        logits = encoder.encode(query["image"][q_rows].astype(np.float32), "img")
        _, cand = index.search(logits, m, "txt")
        scores = [[_direct_pair(model, query["image_tokens"][r], words[p]) for p in cand[i]]
                  for i, r in enumerate(q_rows)]
    else:  # every query caption asks
        q_rows = np.flatnonzero(asked)
        offsets = query["text_offsets"]
        logits = encoder.encode(query["text"][q_rows].astype(np.float32), "txt")
        _, cand = index.search(logits, m, "img")
        scores = [[_direct_pair(model, images[p], query["text_tokens"][offsets[r]:offsets[r + 1]]) for p in cand[i]]
                  for i, r in enumerate(q_rows)]
    assert len(rows) == k * len(cand)
    for i in range(len(cand)):
        order = sorted(range(m), key=lambda j: (-scores[i][j], cand[i][j]))[:k]
        got = rows[i * k:(i + 1) * k]
        assert [r["position"] for r in got] == [int(cand[i][j]) for j in order]
        np.testing.assert_allclose([r["seps"] for r in got], [scores[i][j] for j in order], atol=2e-5)
    # SEPS changed the Hamming order somewhere (else this test would not test the re-ranking)
    assert any([r["position"] for r in rows[i * k:(i + 1) * k]] != list(cand[i][:k]) for i in range(len(cand)))


def test_origins_map_positions_to_collection_rows_across_shards(files, tmp_path):
    """Two indexes built from the query and the retrieval group, searched as one, give each item's row."""
    a, b = tmp_path / "a", tmp_path / "b"
    build_index(files["path"], files["hash"], str(a), splits=["query"])
    build_index(files["path"], files["hash"], str(b), splits=["retrieval"])
    shards = open_index([a, b])
    n_q = len(files["splits"]["query"]["ids"])
    positions = np.array([[0, n_q - 1, n_q, shards.count("txt") - 1]])
    places, place, row = shards.origins("txt", positions)
    assert [(places[p]["group"], r) for p, r in zip(place, row)] == [
        ("/query", 0), ("/query", n_q - 1), ("/retrieval", 0), ("/retrieval", shards.count("txt") - n_q - 1)]
    # images: the first row of each id (2 captions per image)
    places, place, row = shards.origins("img", np.array([[1, 12]]))
    assert [(places[p]["group"], r) for p, r in zip(place, row)] == [("/query", 2), ("/retrieval", 0)]


def _one_line_error(result, *parts):
    """Exit code 2 and one error line (after click's usage lines for a misused option), naming ``parts``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and result.output.strip().endswith(errors[0]), result.output
    for part in parts:
        assert part in errors[0], errors[0]


def test_seps_rerank_refusals_are_one_line(files, tmp_path):
    runner = CliRunner()
    base = ["search", files["index"], "-k", "3", "--rerank", "seps"]
    # queries without tokens: an .npy of pooled features, captions typed in
    np.save(tmp_path / "q.npy", files["splits"]["query"]["text"][:2].astype(np.float32))
    _one_line_error(runner.invoke(main, [*base, "--seps", files["seps"], "-q", str(tmp_path / "q.npy"), "-m", "image"]),
                    "q.npy", "token features")
    _one_line_error(runner.invoke(main, [*base, "--seps", files["seps"], "--text", "a dog"]), "token features")
    _one_line_error(runner.invoke(main, [*base, "-q", files["path"]]), "--seps")
    # an HDF5 query file without token datasets
    plain = {s: {k: v for k, v in a.items() if "tokens" not in k and "offsets" not in k}
             for s, a in files["splits"].items()}
    no_tokens = write_dataset(tmp_path / "plain.h5", plain)
    _one_line_error(runner.invoke(main, [*base, "--seps", files["seps"], "-q", no_tokens]),
                    "plain.h5", "/query", "no token features")
    # a SEPS checkpoint made for other token widths
    wide = save_seps(tmp_path / "wide.pt", SEPS(D_IMG, D_TXT + 1, T, small_seps()), meta={})
    _one_line_error(runner.invoke(main, [*base, "--seps", wide, "-q", files["path"]]),
                    "tok.h5", "/query/text_tokens", f"width {D_TXT}", "wide.pt", f"takes {D_TXT + 1}")
    few = save_seps(tmp_path / "few.pt", SEPS(D_IMG, D_TXT, T - 1, small_seps()), meta={})
    _one_line_error(runner.invoke(main, [*base, "--seps", few, "-q", files["path"]]),
                    "/image_tokens", f"{T} tokens", f"takes {T - 1}")
    # a collection changed since the build (here: only its modification time)
    copy = tmp_path / "copy.h5"
    shutil.copy(files["path"], copy)
    build_index(str(copy), files["hash"], str(tmp_path / "ix"))
    stat = os.stat(copy)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    _one_line_error(runner.invoke(main, ["search", str(tmp_path / "ix"), "-q", files["path"], "--rerank", "seps",
                                         "--seps", files["seps"]]), "copy.h5", "changed since the index")


def test_an_index_without_origins_loads_appends_and_refuses_seps(files, tmp_path):
    """An index made before items kept their origin: searched and appended to as before; SEPS refused."""
    old = tmp_path / "old"
    shutil.copytree(files["index"], old)
    manifest = json.loads((old / "index.json").read_text())
    for modality in ("img", "txt"):
        del manifest["modalities"][modality]["columns"]["origin"]
    for source in manifest["sources"]:
        for key in ("group_rows", "size", "mtime_ns"):
            del source[key]
    (old / "index.json").write_text(json.dumps(manifest))
    runner = CliRunner()
    plain = runner.invoke(main, ["search", str(old), "-q", files["path"], "-k", "3", "--json"])
    assert plain.exit_code == 0, plain.output
    _one_line_error(runner.invoke(main, ["search", str(old), "-q", files["path"], "--rerank", "seps",
                                         "--seps", files["seps"]]), "old", "records no collection row", "again")
    other = tmp_path / "other.h5"
    shutil.copy(files["path"], other)
    with h5py.File(other, "a") as f:
        f.attrs["name"] = "another collection"
        for split in ("query", "retrieval", "train"):  # items of their own (the same ids would be the same items)
            if f"{split}/ids" in f:
                f[f"{split}/ids"][...] = f[f"{split}/ids"][:] + 100_000
    report = build_index(str(other), files["hash"], str(old))
    assert report.added["txt"] == Index.load(files["index"]).count("txt")
    assert not report.index.has("txt", "origin")


def test_query_tokens_are_read_from_the_query_rows(files):
    """The query file's rows are kept with the queries, and the tokens read from them are the split's own."""
    from ucmfh.search.collection import read_queries

    q = read_queries(files["path"], "img", Encoder(files["hash"]).dims, ids=[3, 5])
    assert q.group == "/query" and list(q.rows) == [6, 10]
    with Tokens(files["path"], "query") as tokens:
        assert torch.equal(tokens.images(q.rows), torch.from_numpy(files["splits"]["query"]["image_tokens"][[6, 10]]
                                                                    .astype(np.float16).astype(np.float32)))


def test_batches_of_queries_give_the_scores_of_one_batch(files):
    """Candidates encoded per small batch of queries (a small budget) score as all encoded at once."""
    from ucmfh.search.collection import read_queries
    from ucmfh.search.seps_rerank import _batches, load_matcher, seps_scores

    index = Index.load(files["index"])
    encoder = Encoder(files["hash"])
    queries = read_queries(files["path"], "txt", encoder.dims)
    _, positions = index.search(encoder.encode(queries.features, "txt"), 9, "img")
    matcher = load_matcher(files["seps"])
    whole = seps_scores(index, "img", positions, queries, matcher)
    assert len(_batches(positions, 20)) > 3
    np.testing.assert_allclose(seps_scores(index, "img", positions, queries, matcher, budget=20), whole, atol=1e-6)
    assert _batches(np.array([[1, 2], [2, 3], [4, 5], [6, 6], [7, 8]]), 3) == [(0, 2), (2, 4), (4, 5)]


@pytest.mark.parametrize("modality", ["img", "txt"])
def test_the_measured_cosine_stage_is_the_search_users_run(files, modality):
    """``ucmfh rerank``'s cosine stage (:class:`ucmfh.two_stage.Reranking`) and ``ucmfh search --rerank cosine``
    score and order alike: over every item of the collection (M = all of them, so the Hamming stage
    decides nothing), the same R@K from the same float16 embeddings and the same ordering step."""
    from ucmfh.checkpoint import load_model
    from ucmfh.data.h5 import load_dataset
    from ucmfh.two_stage import Reranking
    from ucmfh.search.collection import read_queries
    from ucmfh.search.results import scores, search_queries
    from ucmfh.seps import databases

    data = load_dataset(files["path"])
    encoder, index = Encoder(files["hash"]), Index.load(files["index"])
    searched = "txt" if modality == "img" else "img"
    n = index.count(searched)
    queries = read_queries(files["path"], modality, encoder.dims)
    found = scores(search_queries(index, encoder, queries, 10, searched, rerank="cosine", candidates=n))
    hasher = load_model(files["hash"], "hash", d_img=data.d_img, d_txt=data.d_txt)[0]
    # the codes are the signs of the head outputs, as the index's and every score's: a model's `codes`, which a
    # method of another package may replace (an audit's: scores and indexes never read it), is not read here either
    hasher.codes = None
    with Tokens(files["path"], "query") as q, Tokens(files["path"], "retrieval") as r:
        db = databases(q, r, ["collection"])[0]
        assert len(db.txt_ids if searched == "txt" else db.img_ids) == n
        row = Reranking(db, data, hasher).run("cosine-rerank", n)
    measured = row["recall_i2t" if modality == "img" else "recall_t2i"]
    assert 0 < found["recall@10"] < 100  # neither all nor nothing: the order matters
    assert measured == pytest.approx({str(k): found[f"recall@{k}"] for k in (1, 5, 10)})
