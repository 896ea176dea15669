"""The CUDA paths, training included, run on the CPU stand-in (tests/cuda_standin.py): what a GPU would
refuse (tensors of two devices in one operation, ``.numpy()`` of a device tensor) fails here too, on every
CI run; each path gives the CPU's result; and a step neither waits for the device nor copies from pageable
memory. Where the machine has a GPU, the same tests run on it too (the GPU checklist's suite)."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Callable, ContextManager, List, Optional

import numpy as np
import pytest
import torch

from conftest import small_fusion, small_hash
from cuda_standin import cuda_standin, on_cuda, peek
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher, FeatureHasher
from ucmfh.evaluation import evaluate_fusion, evaluate_hashing


def test_the_standin_refuses_what_a_gpu_refuses(monkeypatch):
    with cuda_standin(monkeypatch) as stats:
        x = torch.randn(4, 3).to("cuda")
        assert on_cuda(x) and x.device == torch.device("cuda", 0) and torch.cuda.is_available()
        with pytest.raises(RuntimeError, match="device mixing"):
            x + torch.ones(4, 3)
        with pytest.raises(RuntimeError, match="device mixing"):
            torch.ones(3, 4) @ x
        assert (x + torch.tensor(1.0)).device.type == "cuda"  # a 0-d CPU scalar is allowed, as by CUDA
        with pytest.raises(TypeError, match="numpy"):
            x.numpy()
        host = x.cpu()
        assert not on_cuda(host) and host.device.type == "cpu"
        assert torch.zeros(2, device="cuda").device.type == "cuda"
        head = torch.nn.Linear(3, 2).to(torch.device("cuda"))
        out = head(x)
        assert out.device.type == "cuda" and head.weight.device.type == "cuda"
        with pytest.raises(RuntimeError, match="device mixing"):
            head(torch.randn(4, 3))  # the input left on the CPU
        out.sum().item()
        assert stats["syncs"] == 2  # the copy to the host (x.cpu() above) and .item()
        assert not on_cuda(peek(out)) and stats["syncs"] == 2  # a test's own look: not counted
    assert torch.randn(2).device.type == "cpu"  # and outside the block, nothing changed


@pytest.mark.parametrize("operation", [
    lambda x: x.nonzero(), lambda x: x[x > 0], lambda x: torch.where(x > 0), lambda x: x.unique(),
    lambda x: torch.masked_select(x, x > 0), lambda x: x.__setitem__(x > 0, 0.0),
    lambda x: torch.bincount((x > 0).long().flatten()), lambda x: x.repeat_interleave((x > 0).long().sum(1), dim=0),
    lambda x: torch.linalg.eigvals(x[:3]), lambda x: torch.linalg.svd(x), lambda x: torch.linalg.inv(x[:3] + 3 * torch.eye(3).to("cuda")),
], ids=["nonzero", "mask index", "where(condition)", "unique", "masked_select", "mask assignment", "bincount",
        "repeat_interleave(counts)", "linalg.eigvals", "linalg.svd", "linalg.inv"])
def test_an_operation_whose_shape_comes_from_the_values_is_a_host_sync(monkeypatch, operation):
    """As on a GPU, where the host waits for the values to learn the result's shape, or for the eigensolver that
    runs on the host (and a CUDA graph cannot capture it); the same operations of a static shape are none."""
    with cuda_standin(monkeypatch) as stats:
        x = torch.randn(4, 3).to("cuda")
        torch.where(x > 0, x, 0.0), x[torch.tensor([0, 2]).to("cuda")], x.masked_fill(x > 0, 0.0), x.topk(2)
        x.repeat_interleave(2, dim=0)
        assert stats["syncs"] == 0
        operation(x)
        assert stats["syncs"] == 1


@dataclasses.dataclass
class Cuda:
    """How a test reaches ``cuda``: ``block()`` enters it and yields the stand-in's counts (None on a GPU);
    ``tolerance`` for figures that a GPU's own float rounding moves (a code bit of a near-zero output)."""

    block: Callable[[], ContextManager]
    standin: bool

    @property
    def tolerance(self) -> float:
        return 1e-9 if self.standin else 0.02


@pytest.fixture(params=["stand-in", "gpu"])
def cuda(request, monkeypatch) -> Cuda:
    """The CPU stand-in, on every run; the machine's GPU where there is one (the GPU checklist's suite)."""
    if request.param == "gpu":
        if not torch.cuda.is_available():
            pytest.skip("needs a GPU")
        return Cuda(lambda: contextlib.nullcontext(None), False)
    return Cuda(lambda: cuda_standin(monkeypatch), True)


def _close(cpu_rows, gpu_rows, tolerance=1e-9):
    assert len(cpu_rows) == len(gpu_rows)
    for a, b in zip(cpu_rows, gpu_rows):
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, abs=tolerance), key
            elif isinstance(value, dict) and key != "per_query":
                _close([value], [b[key]], tolerance)


@pytest.mark.parametrize("method", ["two-tower", "ucmfh"])
def test_evaluation_on_cuda_gives_the_cpu_s_scores(tiny, cuda, method):
    """Encoding under both protocols, the codes' MAP (tie-aware too), the real-valued outputs' cosine MAP and
    the per-query scores: on ``cuda`` as on the CPU."""
    torch.manual_seed(0)
    if method == "ucmfh":
        fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, small_fusion())
        model = CrossModalHasher(fusion, small_hash().n_bits, small_hash().hidden)
        protocols = ("unimodal", "fused")
    else:
        model = FeatureHasher(tiny.d_img, tiny.d_txt, small_hash().n_bits, small_hash().hidden)
        model.fit_feature_stats(tiny.train.img, tiny.train.txt)
        protocols = ("unimodal",)
    model.eval()
    want = evaluate_hashing(copy.deepcopy(model), tiny, protocols, 20, "cpu", real_valued=True, per_query=True)
    with cuda.block():
        got = evaluate_hashing(copy.deepcopy(model), tiny, protocols, 20, "cuda", real_valued=True, per_query=True)
    _close(want, got, cuda.tolerance)
    for a, b in zip(want, got) if cuda.standin else ():
        for key, value in a["per_query"].items():
            assert torch.equal(torch.as_tensor(value).cpu(), torch.as_tensor(b["per_query"][key]).cpu()), key


def test_on_cuda_several_chunks_top_k_lists_found_in_one_call_are_the_cpu_s(cuda, monkeypatch):
    """A GPU finds the Hamming lists of many queries in one call (ucmfh.metrics.topk.GPU_QUERIES, here 7: two
    chunks of 3 a call) and yields them a chunk at a time: every chunk's start, distances and indices the CPU's,
    ties included (16-bit codes of few values)."""
    from ucmfh.metrics import topk

    monkeypatch.setattr(topk, "GPU_QUERIES", 7)
    g = torch.Generator().manual_seed(0)
    query, retrieval = (torch.randint(0, 2, (n, 16), generator=g).float() * 2 - 1 for n in (20, 300))
    want = list(topk.iter_top_k(query, retrieval, 25, chunk_size=3))
    with cuda.block():
        got = list(topk.iter_top_k(query.cuda(), retrieval.cuda(), 25, chunk_size=3))
    assert [start for start, _, _ in got] == [start for start, _, _ in want] == list(range(0, 20, 3))
    for (_, d_want, i_want), (_, d_got, i_got) in zip(want, got):
        assert torch.equal(d_got.cpu(), d_want) and torch.equal(i_got.cpu(), i_want)


def test_fusion_evaluation_on_cuda_gives_the_cpu_s_scores(tiny, cuda):
    torch.manual_seed(0)
    fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, small_fusion()).eval()
    want = evaluate_fusion(copy.deepcopy(fusion), tiny, ("unimodal", "fused"), 20, "cpu")
    with cuda.block():
        got = evaluate_fusion(copy.deepcopy(fusion), tiny, ("unimodal", "fused"), 20, "cuda")
    _close(want, got, cuda.tolerance)


def test_search_on_cuda_gives_the_scan_s_hits(cuda):
    """The torch path an index takes on a GPU (queries chunked, top-k by (distance, position)) returns the
    CPU kernels' ids and distances, ties included."""
    from ucmfh.search import Index

    rng = np.random.default_rng(0)
    index = Index(n_bits=16)
    index.add("txt", rng.choice([-1, 1], size=(3000, 16)).astype(np.int8))  # 16 bits: many ties
    queries = rng.choice([-1, 1], size=(50, 16)).astype(np.int8)
    want = index.search(queries, 25, "txt")
    with cuda.block():
        got = index.search(queries, 25, "txt", device="cuda")
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def test_two_stage_search_and_seps_scoring_on_cuda_give_the_cpu_s_figures(tmp_path, cuda):
    """``ucmfh rerank``'s stages (Hamming, cosine, SEPS re-ranking, SEPS over every pair) with the models
    and stores on ``cuda``: the CPU's recalls."""
    from conftest import D_IMG, D_TXT, T, small_seps, token_splits
    from ucmfh.data.h5 import load_dataset
    from ucmfh.data.writer import write_dataset
    from ucmfh.data.tokens import Tokens
    from ucmfh.seps.model import SEPS
    from ucmfh.seps.scoring import databases
    from ucmfh.two_stage import Reranking

    path = write_dataset(tmp_path / "tok.h5", token_splits(seed=3), attrs={"name": "tok"})
    data = load_dataset(path)
    torch.manual_seed(0)
    hasher = FeatureHasher(D_IMG, D_TXT, 16, 0)
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
    with cuda.block():
        got = figures("cuda")
    for (name, stage, i2t, t2i), (_, _, gi2t, gt2i) in zip(want, got):
        assert gi2t == pytest.approx(i2t, abs=cuda.tolerance) and gt2i == pytest.approx(t2i, abs=cuda.tolerance), \
            (name, stage)


def test_seps_scoring_on_cuda_leaves_the_caller_s_model_where_and_as_it_was(tmp_path, cuda):
    """Scoring a database by SEPS on the device moved the caller's model there and left it in eval mode (its
    training mode lost, a CPU model on the GPU for good); it is now scored there and left as it was."""
    from conftest import D_IMG, D_TXT, T, small_seps, token_splits
    from ucmfh.data.writer import write_dataset
    from ucmfh.data.tokens import Tokens
    from ucmfh.seps import database_scores, databases
    from ucmfh.seps.model import SEPS

    path = write_dataset(tmp_path / "tok.h5", token_splits(seed=3), attrs={"name": "tok"})
    torch.manual_seed(0)
    seps = SEPS(D_IMG, D_TXT, T, small_seps()).train()
    with Tokens(path, "query") as q, Tokens(path, "retrieval") as r:
        [db] = databases(q, r, ["test"])
        want, _ = database_scores(copy.deepcopy(seps), db, torch.device("cpu"), 64)
        with cuda.block():
            got, _ = database_scores(seps, db, torch.device("cuda"), 64)
    assert all(module.training for module in seps.modules())
    assert not any(on_cuda(p) for p in seps.parameters())
    assert torch.allclose(got, want, atol=cuda.tolerance)


def test_a_training_plan_s_batches_reach_the_host_and_streamed_rows_the_device_without_waiting(tiny_path,
                                                                                               monkeypatch):
    """What a step reads from a file needs its batch on the host: the plan keeps each batch's host copy, so
    nothing asks the device (which would wait for every step queued before), on one rank or on several;
    streamed rows go to the device through pinned memory."""
    from ucmfh.data.h5 import load_dataset
    from ucmfh.data.stream import StreamSettings
    from ucmfh.distributed import Group
    from ucmfh.batches import epoch_plan
    from ucmfh.utils import host_index

    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=StreamSettings(block_rows=32, window=4))
    assert data.train.streamed
    with cuda_standin(monkeypatch) as stats:
        plan = epoch_plan(len(data.train), 64, 0.5, torch.Generator().manual_seed(0), torch.device("cuda"),
                          data.train.shuffle)
        rows = data.train.img.to("cuda")
        group = Group(rank=1, world_size=2)
        for index, separate in plan:
            assert on_cuda(index) and on_cuda(separate)
            host = host_index(index)
            assert not on_cuda(host) and torch.equal(host, peek(index))
            part = group.local(index)
            assert torch.equal(host_index(part), group.local(host))
            got = rows[index]
            assert on_cuda(got) and torch.equal(peek(got), data.train.img[host])
        # pinned: the plan's two copies (indices, draws) and each batch's rows
        assert stats["syncs"] == 0 and stats["pageable"] == 0 and stats["pinned"] == 2 + len(plan)


class _EpochCounts:
    """A progress bar (``ucmfh.trainer.tqdm``) that keeps the stand-in's counts at the end of each epoch."""

    def __init__(self) -> None:
        self.stats: Optional[dict] = None
        self.at_epoch_end: List[dict] = []

    def __call__(self, *args, **kwargs):
        outer = self

        class Bar:
            def update(self, n):
                if outer.stats is not None:
                    outer.at_epoch_end.append(dict(outer.stats))

            def set_postfix(self, **kwargs):
                pass

            def close(self):
                pass

        return Bar()


def _fit_on(cuda, data, method, fusion, monkeypatch, dropout=None):
    """A hashing method trained two epochs on ``cuda`` (a :class:`Cuda`) or, given None, on the CPU, and
    the stand-in's counts at the end of each epoch (empty elsewhere). ``dropout``: the heads' (default:
    the method's)."""
    import ucmfh.trainer as trainer_module
    from ucmfh.methods import fit_hashing, hash_config

    cfg = hash_config(method, drop_unused=True, n_bits=16, hidden=64, epochs=2, val_fraction=0.0,
                      device="cpu" if cuda is None else "cuda", **({} if dropout is None else {"dropout": dropout}))
    counts = _EpochCounts()
    monkeypatch.setattr(trainer_module, "tqdm", counts)
    with contextlib.nullcontext() if cuda is None else cuda.block() as stats:
        counts.stats = stats
        model, _ = fit_hashing(data, cfg, copy.deepcopy(fusion), progress=False)
    return model, counts.at_epoch_end


def _same_model(want, got, cuda, score):
    """The CPU's weights on the stand-in (within float rounding: the fusion encoder's fast path, which a
    torch function mode turns off, sums in another order); on a GPU, whose rounding two epochs of Adam
    amplify, ``score(model)`` within 0.05."""
    if cuda.standin:
        for (name, a), b in zip(want.state_dict().items(), got.state_dict().values()):
            torch.testing.assert_close(b.cpu(), a, msg=name)
    else:
        assert score(got.cpu()) == pytest.approx(score(want), abs=0.05)


@pytest.fixture(scope="module")
def teacher(tiny):
    from ucmfh.fusion_stage import fit_fusion

    return fit_fusion(tiny, small_fusion(epochs=1), progress=False)[0]


@pytest.mark.parametrize("method", ["two-tower", "ucmfh", "distill", "cca-itq", "djsrh", "jdsh", "ucch", "dgcpn",
                                    "cirh", "daeh"])
def test_every_method_trains_on_cuda_as_on_the_cpu_without_waiting_for_it_each_step(tiny, teacher, cuda, method,
                                                                                    monkeypatch):
    """Training, the optimizer's step included, with every tensor on ``cuda``: no device mixing, the CPU's
    model (:func:`_same_model`), and on the stand-in no host sync or pageable copy per step: a second epoch
    adds the epoch loop's one sync and nothing else (DAEH's steps too: its mutual information in closed form, no
    eigen-solve, which a GPU makes on the host)."""
    from ucmfh.methods.registry import METHODS

    assert set(METHODS) <= set(test_every_method_trains_on_cuda_as_on_the_cpu_without_waiting_for_it_each_step
                               .pytestmark[0].args[1])  # every registered method is here
    fusion = teacher if METHODS[method].uses_fusion else None
    # on a GPU without dropout: there dropout draws from the GPU's generator, another stream than the CPU's;
    # at this size five CPU streams of dropout alone move DGCPN's and DAEH's figure by up to 0.05 and 0.08,
    # and an H100 gave 0.14 and 0.13 (docs/benchmarks.md). Without it both devices share the heads' draws (the
    # fusion encoder's own dropout, in the methods on one, stays);
    # scripts/device_agreement.py tells the two causes apart on a GPU
    dropout = None if cuda.standin else 0.0
    want, _ = _fit_on(None, tiny, method, fusion, monkeypatch, dropout)
    got, epochs = _fit_on(cuda, tiny, method, fusion, monkeypatch, dropout)
    _same_model(want, got, cuda, lambda model: sum(evaluate_hashing(model, tiny, ("unimodal",), 20, "cpu")[0][key]
                                                   for key in ("map_i2t", "map_t2i")))
    if cuda.standin and method != "cca-itq":  # cca-itq fits with numpy on the host, no epochs
        first, second = epochs
        assert second["syncs"] - first["syncs"] == 1, epochs
        assert second["pageable"] == first["pageable"], epochs


def test_seps_and_the_fusion_stage_train_on_cuda_as_on_the_cpu(tmp_path, tiny, cuda, monkeypatch):
    """The other two trained stages: SEPS on token rows read ahead (on the stand-in: pinned, no pageable copy
    or sync per step) and the fusion encoder, on ``cuda`` as on the CPU."""
    import ucmfh.trainer as trainer_module
    from ucmfh.data.tokens import Tokens
    from ucmfh.seps import database_scores, databases, recall_rows
    from conftest import small_seps, token_splits
    from ucmfh.data.writer import write_dataset
    from ucmfh.fusion_stage import fit_fusion
    from ucmfh.seps.fit import fit_seps

    path = write_dataset(tmp_path / "tok.h5", token_splits(seed=3), attrs={"name": "tok"})
    runs = {}
    for device in ("cpu", "cuda"):
        counts = _EpochCounts()
        monkeypatch.setattr(trainer_module, "tqdm", counts)
        with cuda.block() if device == "cuda" else contextlib.nullcontext() as stats:
            counts.stats = stats
            # batches of 64 captions: two text chunks of SEPS.grid, planned from the masks' host copies
            seps, _ = fit_seps(path, small_seps(epochs=2, val_fraction=0.0, batch_size=64, device=device),
                               progress=False)
            counts.stats = None
            fusion, _ = fit_fusion(tiny, small_fusion(epochs=2, device=device), progress=False)
        runs[device] = seps, fusion, counts.at_epoch_end

    def rsum(model):
        with Tokens(path, "query") as q, Tokens(path, "retrieval") as r:
            db = databases(q, r, ["test"])[0]
            return recall_rows(database_scores(model.eval(), db, torch.device("cpu"), 64)[0], db.txt_ids,
                               db.img_ids, db.query_txt, db.query_img)["rsum"] / 600

    _same_model(runs["cpu"][0], runs["cuda"][0], cuda, rsum)
    _same_model(runs["cpu"][1], runs["cuda"][1], cuda, lambda model: evaluate_fusion(
        model, tiny, ("unimodal",), 20, "cpu")[0]["map_i2t"])
    if not cuda.standin:
        return
    first, second = runs["cuda"][2]  # SEPS's two epochs
    assert second["pageable"] == first["pageable"] and second["syncs"] == first["syncs"] + 1, (first, second)
    assert second["pinned"] > first["pinned"]  # each step's token rows


def test_a_run_interrupted_on_cuda_resumes_to_the_model_of_one_never_stopped(tiny, cuda, tmp_path, monkeypatch):
    """The training state saved on ``cuda`` (the training device's generator included) and read back onto it:
    the weights and the loss record of the uninterrupted run on ``cuda``."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter, method_config
    from ucmfh.signals import TrainingInterrupted
    from ucmfh.training_state import StateFile
    from ucmfh.methods import fit_hashing

    cfg = method_config("two-tower", epochs=4, device="cuda")
    with cuda.block():
        reference, ref_history = fit_hashing(tiny, cfg, progress=False)
        state = StateFile(str(tmp_path / "hash.state.pt"), interval_s=1e9)
        bars = StopAfter(2)
        monkeypatch.setattr(trainer_module, "tqdm", bars)
        with pytest.raises(TrainingInterrupted):
            fit_hashing(tiny, cfg, progress=False, state=state)
        bars.epochs, first = None, len(bars.starts)
        resumed, history = fit_hashing(tiny, cfg, progress=False, state=StateFile(state.path, resume=True))
    assert bars.starts[first] == 2  # went on from the saved state, in the third epoch
    a, b = reference.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert list(history) == list(ref_history) and history.validation == ref_history.validation
