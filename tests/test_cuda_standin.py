"""The CUDA paths of inference, run on the CPU stand-in (tests/cuda_standin.py): what a GPU would refuse
(tensors of two devices in one operation, ``.numpy()`` of a device tensor) fails here too, on every CI run;
and each path gives the CPU's result."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import small_fusion, small_hash
from cuda_standin import FakeCuda, cuda_standin
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher, FeatureHasher
from ucmfh.scoring import evaluate_fusion, evaluate_hashing


def test_the_standin_refuses_what_a_gpu_refuses(monkeypatch):
    with cuda_standin(monkeypatch) as stats:
        x = torch.randn(4, 3).to("cuda")
        assert isinstance(x, FakeCuda) and x.device == torch.device("cuda", 0) and torch.cuda.is_available()
        with pytest.raises(RuntimeError, match="device mixing"):
            x + torch.ones(4, 3)
        with pytest.raises(RuntimeError, match="device mixing"):
            torch.ones(3, 4) @ x
        assert (x + torch.tensor(1.0)).device.type == "cuda"  # a 0-d CPU scalar is allowed, as by CUDA
        with pytest.raises(TypeError, match="numpy"):
            x.numpy()
        host = x.cpu()
        assert type(host) is torch.Tensor and host.device.type == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cuda"
        head = torch.nn.Linear(3, 2).to(torch.device("cuda"))
        out = head(x)
        assert out.device.type == "cuda" and head.weight.device.type == "cuda"
        with pytest.raises(RuntimeError, match="device mixing"):
            head(torch.randn(4, 3))  # the input left on the CPU
        out.sum().item()
        assert stats["syncs"] == 1
    assert torch.randn(2).device.type == "cpu"  # and outside the block, nothing changed


def _close(cpu_rows, gpu_rows):
    assert len(cpu_rows) == len(gpu_rows)
    for a, b in zip(cpu_rows, gpu_rows):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, abs=1e-9), key
            elif isinstance(value, dict) and key != "per_query":
                _close([value], [b[key]])


@pytest.mark.parametrize("method", ["two-tower", "ucmfh"])
def test_evaluation_on_cuda_gives_the_cpu_s_scores(tiny, monkeypatch, method):
    """Encoding under both protocols, the codes' MAP (tie-aware too), the real-valued outputs' cosine MAP and
    the per-query scores: on the stand-in's ``cuda`` as on the CPU."""
    torch.manual_seed(0)
    if method == "ucmfh":
        model = CrossModalHasher(FusionEncoder(tiny.d_img, tiny.d_txt, small_fusion()), small_hash())
        protocols = ("unimodal", "fused")
    else:
        model = FeatureHasher(tiny.d_img, tiny.d_txt, small_hash(method="two-tower"))
        model.fit_feature_stats(tiny.train.img, tiny.train.txt)
        protocols = ("unimodal",)
    model.eval()
    want = evaluate_hashing(copy.deepcopy(model), tiny, protocols, 20, "cpu", real_valued=True, per_query=True)
    with cuda_standin(monkeypatch):
        got = evaluate_hashing(copy.deepcopy(model), tiny, protocols, 20, "cuda", real_valued=True, per_query=True)
    _close(want, got)
    for a, b in zip(want, got):
        for key, value in a["per_query"].items():
            assert torch.equal(torch.as_tensor(value).cpu(), torch.as_tensor(b["per_query"][key]).cpu()), key


def test_fusion_evaluation_on_cuda_gives_the_cpu_s_scores(tiny, monkeypatch):
    torch.manual_seed(0)
    fusion = FusionEncoder(tiny.d_img, tiny.d_txt, small_fusion()).eval()
    want = evaluate_fusion(copy.deepcopy(fusion), tiny, ("unimodal", "fused"), 20, "cpu")
    with cuda_standin(monkeypatch):
        got = evaluate_fusion(copy.deepcopy(fusion), tiny, ("unimodal", "fused"), 20, "cuda")
    _close(want, got)


def test_search_on_cuda_gives_the_scan_s_hits(monkeypatch):
    """The torch path an index takes on a GPU (queries chunked, top-k by (distance, position)) returns the
    CPU kernels' ids and distances, ties included."""
    from ucmfh.search import Index

    rng = np.random.default_rng(0)
    index = Index(n_bits=16)
    index.add("txt", rng.choice([-1, 1], size=(3000, 16)).astype(np.int8))  # 16 bits: many ties
    queries = rng.choice([-1, 1], size=(50, 16)).astype(np.int8)
    want = index.search(queries, 25, "txt")
    with cuda_standin(monkeypatch):
        got = index.search(queries, 25, "txt", device="cuda")
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_two_stage_search_and_seps_scoring_on_cuda_give_the_cpu_s_figures(tmp_path, monkeypatch):
    """``ucmfh rerank``'s stages (Hamming, cosine, SEPS re-ranking, SEPS over every pair) with the models
    and stores on ``cuda``: the CPU's recalls."""
    from test_seps import D_IMG, D_TXT, T, small_seps, token_splits
    from ucmfh.config import HashConfig
    from ucmfh.data.h5 import load_dataset, write_dataset
    from ucmfh.data.tokens import Tokens
    from ucmfh.seps.model import SEPS
    from ucmfh.seps.scoring import databases
    from ucmfh.two_stage import Reranking

    path = write_dataset(tmp_path / "tok.h5", token_splits(seed=3), attrs={"name": "tok"})
    data = load_dataset(path)
    torch.manual_seed(0)
    hasher = FeatureHasher(D_IMG, D_TXT, HashConfig(method="two-tower", n_bits=16, hidden=0))
    hasher.fit_feature_stats(data.train.img, data.train.txt)
    seps = SEPS(D_IMG, D_TXT, T, small_seps()).eval()

    def figures(device):
        out = []
        with Tokens(path, "query") as q, Tokens(path, "retrieval") as r:
            for db in databases(q, r, ["collection"]):  # both splits' items
                rr = Reranking(db, data, copy.deepcopy(hasher).eval(), copy.deepcopy(seps), device=device)
                for stage, m in (("hamming", 10), ("cosine-rerank", 10), ("seps-rerank", 10), ("seps-full", 0)):
                    row = rr.run(stage, m)
                    out.append((db.name, stage, row["recall_i2t"], row["recall_t2i"]))
        return out

    want = figures("cpu")
    with cuda_standin(monkeypatch):
        got = figures("cuda")
    for (name, stage, i2t, t2i), (_, _, gi2t, gt2i) in zip(want, got):
        assert gi2t == pytest.approx(i2t) and gt2i == pytest.approx(t2i), (name, stage)
