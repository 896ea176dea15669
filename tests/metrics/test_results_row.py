"""A results row checked end to end: a run trained and scored through the CLI on 8-bit codes, where
Hamming ties are everywhere, and every figure its row holds recomputed — from its per-query file, and from
:mod:`ucmfh.metrics` on the checkpoint's own codes with ties handled both ways — the tie-aware twins
(``*_expected``, what ``ucmfh runs`` and ``ucmfh compare`` lead with) included."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import caption_file
from test_metrics import ref_map
from ucmfh.app.cli import main
from ucmfh.app.per_query import load_per_query
from ucmfh.checkpoint import load_model
from ucmfh.data.h5 import load_dataset
from ucmfh.metrics import average_precision_at_k, evaluate_caption_set
from ucmfh.evaluation import head_outputs_split, random_codes_scores
from ucmfh.similarity import sign_codes

TIES = ("index", "expected")


def mean(values: torch.Tensor):
    """The mean of per-query scores, as a row's figure (up to the order of summation)."""
    return pytest.approx(values.double().mean().item(), rel=0, abs=1e-12)


def _scored_run(tmp_path, data_path: str):
    """The rows of ``train-hash --method cca-itq -b 8`` (closed form: no epochs), and the checkpoint's head
    outputs (query, retrieval; each image, text) under the row's protocol."""
    results = tmp_path / "results.jsonl"
    done = CliRunner().invoke(main, ["train-hash", "-d", data_path, "--method", "cca-itq", "-b", "8", "--device", "cpu",
                                     "--quiet", "--out", str(tmp_path / "runs"), "--results", str(results)])
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    data = load_dataset(data_path)
    model = load_model(rows[0]["checkpoint"], "hash", d_img=data.d_img, d_txt=data.d_txt)[0]
    assert {row["protocol"] for row in rows} == {"unimodal"}
    outputs = [head_outputs_split(model, split, "unimodal", "cpu") for split in (data.query, data.retrieval)]
    return results, rows, data, outputs


def _codes(outputs):
    return [tuple(sign_codes(x) for x in pair) for pair in outputs]


def test_every_figure_of_a_labelled_row_is_its_per_query_files_and_the_metrics(tmp_path, tiny_path):
    results, rows, data, outputs = _scored_run(tmp_path, tiny_path)
    (row,) = rows
    (q_img, q_txt), (r_img, r_txt) = _codes(outputs)
    assert len(torch.unique(r_txt, dim=0)) <= 2 ** 8 < len(r_txt)  # 600 items on at most 256 codes: ties
    directions = {"i2t": (q_img, r_txt), "t2i": (q_txt, r_img)}
    ql, rl = data.query.labels, data.retrieval.labels
    per_query = load_per_query(row)
    assert set(per_query) == {"ap_i2t", "ap_t2i"}
    for d, (q, r) in directions.items():
        ap = {ties: average_precision_at_k(q, r, ql, rl, k=row["k"], ties=ties) for ties in TIES}
        assert row[f"map_{d}"] == mean(ap["index"])
        assert row[f"map_{d}"] == pytest.approx(ref_map(q, r, ql, rl, row["k"]), abs=1e-12)  # plain Python loops
        assert row[f"map_{d}_expected"] == mean(ap["expected"])
        # the per-query file holds the tie-aware scores the twin is the mean of, query by query
        assert per_query[f"ap_{d}"].dtype == np.float32 and len(per_query[f"ap_{d}"]) == len(data.query)
        assert np.allclose(per_query[f"ap_{d}"], ap["expected"].numpy(), rtol=0, atol=1e-6)
        assert per_query[f"ap_{d}"].astype(np.float64).mean() == pytest.approx(row[f"map_{d}_expected"], abs=1e-6)
        assert abs(row[f"map_{d}_expected"] - row[f"map_{d}"]) > 1e-3  # the ties matter here: a swap would show
        # the heads' real-valued outputs, ranked by cosine
        (qo_img, qo_txt), (ro_img, ro_txt) = outputs
        qo, ro = {"i2t": (qo_img, ro_txt), "t2i": (qo_txt, ro_img)}[d]
        for ties, twin in zip(TIES, ("", "_expected")):
            cosine = average_precision_at_k(qo, ro, ql, rl, k=row["k"], ranking="cosine", ties=ties)
            assert row["real_valued"][f"map_{d}{twin}"] == mean(cosine)
    floor = random_codes_scores(data, 8, row["k"], seed=row["seed"])[0]
    assert (row["random_map_i2t"], row["random_map_t2i"]) == (floor["map_i2t"], floor["map_t2i"])
    # ucmfh runs leads with the twins, and shows the figures by index beside them
    shown = CliRunner().invoke(main, ["runs", "--results", str(results)])
    assert shown.exit_code == 0, shown.output
    e, i = (row["map_i2t_expected"], row["map_t2i_expected"]), (row["map_i2t"], row["map_t2i"])
    assert re.search(rf"{e[0]:.4f}\s+{e[1]:.4f}\s+{i[0]:.4f} / {i[1]:.4f}\s", shown.output), shown.output


def test_every_figure_of_a_caption_set_row_is_its_per_query_files_and_the_metrics(tmp_path):
    """R@1/5/10, rSum and MAP by id of both databases, each by index and tie-aware."""
    _, rows, data, outputs = _scored_run(tmp_path, caption_file(tmp_path / "captions.h5"))
    assert {row["database"] for row in rows} == {"test", "collection"}
    (q_img, q_txt), (r_img, r_txt) = _codes(outputs)
    ids = (data.query.ids, data.retrieval.ids)
    scores = {ties: evaluate_caption_set(q_img, q_txt, ids[0], r_img, r_txt, ids[1], k=rows[0]["k"], ties=ties,
                                         per_query=True) for ties in TIES}
    (qo_img, qo_txt), (ro_img, ro_txt) = outputs
    cosine = {ties: evaluate_caption_set(qo_img, qo_txt, ids[0], ro_img, ro_txt, ids[1], k=rows[0]["k"],
                                         ranking="cosine", ties=ties) for ties in TIES}
    differ = 0
    for row in rows:
        per_query = load_per_query(row)
        assert set(per_query) == {"ap_i2t", "ap_t2i", "hits_i2t", "hits_t2i", "image_t2i"}
        for ties, twin in zip(TIES, ("", "_expected")):
            want = scores[ties][row["database"]]
            for key in ("map_i2t", "map_t2i", "recall_i2t", "recall_t2i", "rsum"):
                assert row[key + twin] == want[key], (row["database"], key + twin)
                assert row["real_valued"][key + twin] == cosine[ties][row["database"]][key], (row["database"], key)
        expected = scores["expected"][row["database"]]["per_query"]
        for name, values in per_query.items():
            if name == "image_t2i":  # each caption's image, numbered as the I→T queries (their ids, first rows)
                first = np.sort(np.unique(ids[0], return_index=True)[1])
                assert values.dtype == np.int64 and (ids[0][first][values] == ids[0]).all()  # was float32
                continue
            assert np.allclose(values, expected[name].numpy(), rtol=0, atol=1e-6), (row["database"], name)
        hits = {d: 100 * per_query[f"hits_{d}"].astype(np.float64) for d in ("i2t", "t2i")}
        for d in ("i2t", "t2i"):
            assert [row[f"recall_{d}_expected"][r] for r in ("1", "5", "10")] == pytest.approx(hits[d].mean(0), abs=1e-4)
            assert row[f"map_{d}_expected"] == pytest.approx(per_query[f"ap_{d}"].astype(np.float64).mean(), abs=1e-6)
        rsum = hits["i2t"].sum(1).mean() + hits["t2i"].sum(1).mean()
        assert row["rsum_expected"] == pytest.approx(rsum, abs=1e-3)
        differ += abs(row["rsum_expected"] - row["rsum"]) > 1 and row["map_i2t_expected"] != row["map_i2t"]
    assert differ  # the ties matter on a database here: a swap of the twins would show
