"""scripts/bench_scoring.py times a results row's scoring: the figures it times are score_splits' of its outputs,
a labelled file's and a caption set's, both rankings, both tie rules."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import caption_file, load_script
from ucmfh.data.h5 import load_dataset
from ucmfh.evaluation import score_splits
from ucmfh.similarity import sign_codes

bench = load_script("bench_scoring")


@pytest.mark.parametrize("kind", ["labelled", "captions"])
def test_the_timed_figures_are_a_results_row_s(kind, tiny_path, tmp_path, capsys):
    path = tiny_path if kind == "labelled" else caption_file(tmp_path / "captions.h5")
    out = tmp_path / "scoring.json"
    results = bench.main([str(path), "--dim", "16", "--k", "5", "--repeats", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    data = load_dataset(path)
    g = torch.Generator().manual_seed(0)
    projections = (torch.randn(data.query.img.shape[1], 16, generator=g),
                   torch.randn(data.query.txt.shape[1], 16, generator=g))
    query, retrieval = bench.head_outputs(data.query, projections), bench.head_outputs(data.retrieval, projections)
    assert [r["ranking"] for r in results] == ["hamming", "cosine"]
    for result in results:
        q, r = (query, retrieval) if result["ranking"] == "cosine" else \
            (tuple(map(sign_codes, query)), tuple(map(sign_codes, retrieval)))
        assert result["rows"] == score_splits(q, r, data, k=5, ranking=result["ranking"], expected=True)
        assert len(result["seconds"]) == 2 and f"{result['ranking']:<8}" in printed
        assert any(key.endswith("_expected") for key in result["rows"][0])
    assert len(results[0]["rows"]) == (1 if kind == "labelled" else 2)  # a caption set: both databases
    assert json.loads(out.read_text())["results"][1]["rows"] == results[1]["rows"]
