"""Caption sets (docs/reference.md §7): relevance by id, unique-image queries, two databases."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.data.h5 import DataError, load_dataset, validate_file
from ucmfh.metrics import evaluate_caption_set
from ucmfh.evaluation import encode_split

from conftest import caption_file, shared_file


def _slow_rank(q: np.ndarray, db: np.ndarray, ranking: str) -> np.ndarray:
    """Database order for one query: Hamming ascending or cosine descending, ties by index (stable)."""
    if ranking == "hamming":
        score = (q.shape[0] - db @ q) / 2
    else:
        score = -(db @ q) / (np.linalg.norm(db, axis=1) * np.linalg.norm(q))
    return np.argsort(score, kind="stable")


def _slow(q_codes, q_ids, db_codes, db_ids, k, ranks, ranking):
    recalls, aps = np.zeros(len(ranks)), []
    for code, qid in zip(q_codes, q_ids):
        rel = db_ids[_slow_rank(code, db_codes, ranking)] == qid
        for j, r in enumerate(ranks):
            recalls[j] += rel[:r].any()
        top = rel[:k]
        hits = np.cumsum(top)
        aps.append(sum(hits[i] / (i + 1) for i in np.flatnonzero(top)) / max(top.sum(), 1))
    return 100 * recalls / len(q_ids), float(np.mean(aps))


def _slow_caption_set(query, retrieval, k, ranks, ranking):
    """docs/reference.md §7 written out: first row of each id, both databases, loops over queries."""
    (qi, qt, qid), (ri, rt, rid) = query, retrieval
    first = sorted(np.unique(qid, return_index=True)[1])
    out = {}
    for name in ("test", "collection"):
        if name == "test":
            di, dt, did = qi, qt, qid
        else:
            order = np.argsort(np.concatenate([qid, rid]), kind="stable")
            di, dt, did = (np.concatenate(pair)[order] for pair in ((qi, ri), (qt, rt), (qid, rid)))
        unique = sorted(np.unique(did, return_index=True)[1])
        r_i2t, m_i2t = _slow(qi[first], qid[first], dt, did, k, ranks, ranking)
        r_t2i, m_t2i = _slow(qt, qid, di[unique], did[unique], k, ranks, ranking)
        out[name] = (r_i2t, r_t2i, m_i2t, m_t2i)
    return out


def _caption_arrays(rng, n_images, first_id, n_bits):
    counts = rng.integers(1, 5, size=n_images)  # 1..4 captions per image
    ids = np.repeat(first_id + 3 * np.arange(n_images), counts)  # gaps between ids
    img = np.repeat(rng.choice([-1.0, 1.0], size=(n_images, n_bits)), counts, axis=0)
    txt = rng.choice([-1.0, 1.0], size=(len(ids), n_bits))
    return img, txt, ids


@pytest.mark.parametrize("database", ["test", "collection"])
def test_a_caption_sets_codes_curves_are_by_id_on_either_database(database):
    """evaluate_caption_codes (what `evaluate --codes` scores a caption set's codes file by) against loops over
    queries: images once per id against the database's captions and back (``test``: the query split;
    ``collection``: query and retrieval in id order, its images once per id); P@K with ties by index, and the
    precision-recall curve by Hamming radius, relevance "same id"; R@K and MAP@k as evaluate_caption_set's."""
    from ucmfh.metrics.report import evaluate_caption_codes

    rng = np.random.default_rng(5)
    n_bits, ks = 6, (1, 3, 8)
    query, retrieval = _caption_arrays(rng, 9, 1, n_bits), _caption_arrays(rng, 20, 1000, n_bits)
    retrieval = (retrieval[0], retrieval[1], retrieval[2] % 37 * 3 + 2)  # ids between the query's: id order matters
    (qi, qt, qid), (ri, rt, rid) = query, retrieval
    if database == "test":
        got = evaluate_caption_codes(*query, k=5, ks=ks, ranks=(1, 5, 10))  # the default: the query split
        di, dt, did = qi, qt, qid
    else:
        got = evaluate_caption_codes(*query, retrieval, database="collection", k=5, ks=ks, ranks=(1, 5, 10))
        order = np.argsort(np.concatenate([qid, rid]), kind="stable")
        di, dt, did = (np.concatenate(pair)[order] for pair in ((qi, ri), (qt, rt), (qid, rid)))
    first = sorted(np.unique(qid, return_index=True)[1])
    unique = sorted(np.unique(did, return_index=True)[1])
    assert got["settings"]["database"] == database and got["settings"]["n_query_img"] == 9
    assert (got["i2t"]["n_database"], got["t2i"]["n_database"]) == (len(did), len(unique))  # captions, images
    for name, (q, q_ids, db, db_ids) in {"i2t": (qi[first], qid[first], dt, did),
                                         "t2i": (qt, qid, di[unique], did[unique])}.items():
        precision = np.zeros(len(ks))
        pr = np.zeros((2, n_bits + 1))
        for code, own in zip(q, q_ids):
            rel = db_ids[_slow_rank(code, db, "hamming")] == own
            precision += [rel[:k].mean() for k in ks]
            distance = (n_bits - db @ code) / 2
            for radius in range(n_bits + 1):
                inside = distance <= radius
                pr[0, radius] += (db_ids[inside] == own).sum() / max(inside.sum(), 1)
                pr[1, radius] += (db_ids[inside] == own).sum() / (db_ids == own).sum()
        np.testing.assert_allclose(got[name]["precision_at_k"]["precision"], precision / len(q), atol=1e-12)
        np.testing.assert_allclose(got[name]["pr_curve"]["precision"], pr[0] / len(q), atol=1e-12)
        np.testing.assert_allclose(got[name]["pr_curve"]["recall"], pr[1] / len(q), atol=1e-12)
    row = evaluate_caption_set(*query, *retrieval, k=5)[database]
    assert got["i2t"]["map@5"] == pytest.approx(row["map_i2t"]) and got["t2i"]["map@5"] == pytest.approx(row["map_t2i"])
    for name in ("i2t", "t2i"):
        assert {r: 100 * v for r, v in got[name]["recall_at_ranks"].items()} == pytest.approx(row[f"recall_{name}"])


@pytest.mark.parametrize("ranking, n_bits", [("hamming", 4), ("hamming", 16), ("cosine", 6)])
def test_caption_metrics_equal_a_slow_reference(ranking, n_bits):
    rng = np.random.default_rng(n_bits)
    query = _caption_arrays(rng, 7, 1, n_bits)
    retrieval = _caption_arrays(rng, 30, 1000, n_bits)
    if ranking == "cosine":
        query = (query[0] + rng.normal(size=query[0].shape), query[1] + rng.normal(size=query[1].shape), query[2])
        retrieval = tuple(x + rng.normal(size=x.shape) if x.dtype.kind == "f" else x for x in retrieval)
    # interleave ids between the splits: the collection must be put in id order
    retrieval = (retrieval[0], retrieval[1], retrieval[2] % 37 * 3 + 2)
    k, ranks = 5, (1, 2, 5)
    got = evaluate_caption_set(*query, *retrieval, k=k, ranks=ranks, ranking=ranking)
    want = _slow_caption_set(query, retrieval, k, ranks, ranking)
    for name in ("test", "collection"):
        r_i2t, r_t2i, m_i2t, m_t2i = want[name]
        row = got[name]
        assert [row["recall_i2t"][str(r)] for r in ranks] == pytest.approx(list(r_i2t), abs=1e-9)
        assert [row["recall_t2i"][str(r)] for r in ranks] == pytest.approx(list(r_t2i), abs=1e-9)
        assert (row["map_i2t"], row["map_t2i"]) == pytest.approx((m_i2t, m_t2i), abs=1e-12)
        assert row["rsum"] == pytest.approx(sum(r_i2t) + sum(r_t2i))
        assert row["n_queries_i2t"] == len(np.unique(query[2])) and row["n_queries_t2i"] == len(query[2])
    assert got["test"]["n_database_img"] == len(np.unique(query[2]))
    assert got["collection"]["n_database_txt"] == len(query[2]) + len(retrieval[2])
    # MAP alone (a validation score): the same MAPs, no recall
    alone = evaluate_caption_set(*query, *retrieval, k=k, ranks=ranks, ranking=ranking, recall=False)
    for name in ("test", "collection"):
        assert {key: got[name][key] for key in alone[name]} == alone[name]
        assert not {"recall_i2t", "recall_t2i", "rsum"} & set(alone[name])


def test_ids_of_another_length_or_that_never_match_are_refused():
    """Two ways a library user got a wrong caption-set score without a word: retrieval ids shorter than the
    codes (the collection database shrank to them), and scoring by id between a caption set's query and
    retrieval splits, which share no id (every R@K and MAP by id 0)."""
    from ucmfh import map_at_k_by_id, recall_at_ranks

    rng = np.random.default_rng(0)
    query, retrieval = _caption_arrays(rng, 7, 1, 16), _caption_arrays(rng, 30, 1000, 16)
    with pytest.raises(ValueError, match="ids must be 1-D and match the codes"):
        evaluate_caption_set(*query[:2], query[2], *retrieval[:2], retrieval[2][:5])
    for metric in (recall_at_ranks, map_at_k_by_id):
        with pytest.raises(ValueError, match="no query id occurs among the retrieval ids.*evaluate_caption_set"):
            metric(query[0], retrieval[1], query[2], retrieval[2])
    assert recall_at_ranks(query[0], query[1], query[2], query[2])[-1] > 0  # within the query split: scored


@pytest.mark.slow  # 33 s: sklearn's iterative CCA on flickr8k1000
def test_flickr8k1000_cca_itq_matches_the_contracts_figures():
    """docs/reference.md §7 gives CCA-ITQ's R@K on flickr8k1000, test database: the evaluator reproduces them."""
    from ucmfh.methods.cca_itq import fit_cca_itq

    data = load_dataset(shared_file("flickr8k1000.h5"))
    assert data.caption_set and data.n_classes == 0
    model, _ = fit_cca_itq(data.train, 64)
    scores = evaluate_caption_set(*encode_split(model, data.query, "unimodal", "cpu"), data.query.ids,
                                  *encode_split(model, data.retrieval, "unimodal", "cpu"), data.retrieval.ids)
    test = scores["test"]
    assert [round(test["recall_i2t"][r]) for r in ("1", "5", "10")] == [32, 55, 69]
    assert [round(test["recall_t2i"][r], 1) for r in ("1", "5", "10")] == [18.6, 42.4, 56.4]


def test_a_caption_set_needs_ids_and_labels_everywhere_or_nowhere(tmp_path):
    data = load_dataset(caption_file(tmp_path / "c.h5"))
    assert data.caption_set and data.query.labels is None and len(data.query) == 24
    import h5py

    bad = tmp_path / "half.h5"
    caption_file(bad, labels=True)
    with h5py.File(bad, "a") as f:
        del f["query/labels"]
    with pytest.raises(DataError, match="/query/labels: missing dataset, but /train/labels exists"):
        validate_file(bad)
    with h5py.File(bad, "a") as f:
        del f["train/labels"], f["retrieval/labels"], f["train/ids"]
    with pytest.raises(DataError, match="/train/labels: missing dataset, and no /ids either"):
        validate_file(bad)


def test_train_hash_on_a_caption_set_reports_recall_on_both_databases(tmp_path):
    path = caption_file(tmp_path / "captions.h5")
    results = tmp_path / "r.jsonl"
    runner = CliRunner()
    result = runner.invoke(main, ["train-hash", "-d", path, "-b", "16", "--epochs", "2", "--batch-size", "16",
                                  "--method", "ucmfh", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--set", "hash.hidden=64",
                                  "--out", str(tmp_path / "runs"), "--results", str(results), "--device", "cpu",
                                  "--quiet"])
    assert result.exit_code == 0, result.output
    assert "R@1/5/10" in result.output and "collection" in result.output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["protocol"], r["database"]) for r in rows] == [
        (p, d) for p in ("unimodal", "fused") for d in ("test", "collection")]
    for r in rows:
        assert set(r["recall_i2t"]) == set(r["recall_t2i"]) == {"1", "5", "10"}
        assert all(0 <= v <= 100 for v in (*r["recall_i2t"].values(), *r["recall_t2i"].values()))
        assert r["rsum"] == pytest.approx(sum(r["recall_i2t"].values()) + sum(r["recall_t2i"].values()))
        assert 0 <= r["random_rsum"] <= 600
    summary = runner.invoke(main, ["runs", "--results", str(results)])
    assert summary.exit_code == 0 and "collection" in summary.output and "rSum" in summary.output
    supervised = runner.invoke(main, ["train-hash", "-d", path, "--supervised", "--loss", "pairwise", "--epochs", "1",
                                      "--device", "cpu",
                                      "--out", str(tmp_path / "runs"), "--results", str(results)])
    assert supervised.exit_code == 2 and "supervised training needs labels" in supervised.output
    # its codes file (ids, no labels) scores as the training did on either database, in both tie rules
    for (protocol, database), trained in zip([(p, d) for p in ("unimodal", "fused") for d in ("test", "collection")],
                                             rows):
        codes = tmp_path / f"c-{protocol}.h5"
        if not codes.exists():
            encode = runner.invoke(main, ["encode", "-d", path, "-c", trained["checkpoint"], "-o", str(codes),
                                          "--protocol", protocol, "--quiet"])
            assert encode.exit_code == 0, encode.output
        scored = runner.invoke(main, ["evaluate", "--codes", str(codes), "--results", str(tmp_path / "codes.jsonl")]
                               + (["--database", database] if database == "collection" else []))
        assert scored.exit_code == 0, scored.output
        assert f"database {database}" in scored.output
        row = json.loads((tmp_path / "codes.jsonl").read_text().splitlines()[-1])
        assert (row["task"], row["database"], row["protocol"], row["method"]) == ("codes", database, protocol, "ucmfh")
        for key in ("map_i2t", "map_t2i", "map_i2t_expected", "map_t2i_expected", "rsum", "rsum_expected"):
            assert row[key] == pytest.approx(trained[key], abs=1e-9), key
        for key in ("recall_i2t", "recall_t2i", "recall_i2t_expected", "recall_t2i_expected"):
            assert row[key] == pytest.approx(trained[key], abs=1e-9), key


def test_a_recall_of_whole_hits_is_their_share_in_percent_to_the_last_digit():
    """R@K in % of hits counted 0/1 is count × 100 / queries, as a float prints it: 55 of 100 queries was
    55.00000000000001 (100 × 0.55), and a notebook's ``== 55.0`` failed; ``rerank``'s lists say it alike."""
    import torch

    from ucmfh.metrics.captions import recall_of_lists

    g = np.random.default_rng(4)
    img, txt = np.sign(g.standard_normal((100, 8))), np.sign(g.standard_normal((500, 8)))
    ids = np.repeat(np.arange(100), 5)
    rows = evaluate_caption_set(img[ids], txt, ids, img[ids], txt, ids)
    for direction, queries, codes, db, db_ids, query_ids in (("i2t", img, img, txt, ids, np.arange(100)),
                                                             ("t2i", txt, txt, img, np.arange(100), ids)):
        distances = (codes.shape[1] - queries @ db.T) / 2
        order = np.argsort(distances, axis=1, kind="stable")  # ties by database index, as the row's
        for rank in (1, 5, 10):
            count = int((db_ids[order[:, :rank]] == query_ids[:, None]).any(axis=1).sum())
            assert rows["test"][f"recall_{direction}"][str(rank)] == count * 100 / len(queries)
        lists = recall_of_lists(torch.as_tensor(order[:, :10]), torch.as_tensor(query_ids), torch.as_tensor(db_ids))
        assert lists == rows["test"][f"recall_{direction}"]
