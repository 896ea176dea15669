"""A training step captured as a CUDA graph and replayed (``ucmfh.captured_step``): on the CPU stand-in of CUDA
(tests/cuda_standin.py), with graphs that run the captured step again at every replay, the captured path
trains the eager path's model, its step waits for the host never (no host sync while captured) and its
static batch keeps its shape; where the machine has a GPU, real CUDA graphs train a model close to the eager
one (the GPU checklist's suite)."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import ucmfh.captured_step as captured_module
from conftest import method_config, small_fusion
from cuda_standin import STATS, cuda_standin
from ucmfh.captured_step import WARMUP_STEPS, capture_steps
from ucmfh.fusion_stage import fit_fusion
from ucmfh.methods import METHODS, fit_hashing


class StandinGraphs:
    """CUDA graphs as the stand-in has them: a capture runs the step (and says so), a replay runs it again,
    writing its loss into the captured loss tensor; every run is checked to make no host sync and to read a
    batch of the captured shape."""

    log = []  # (event, batch shape) of every capture and replay, across instances

    def side_stream(self, device):
        assert torch.device(device).type == "cuda"
        return "side"

    def on(self, stream):
        import contextlib

        return contextlib.nullcontext()

    def capture(self, body, before, stream):
        plan_step = self._run(body, before, "capture")

        def replay():
            plan_step.copy_(self._run(body, before, "replay"))

        return replay, plan_step, True

    def _run(self, body, before, event):
        before()  # a replay writes every gradient anew, as a graph does
        syncs = STATS["syncs"]
        out = body()
        assert STATS["syncs"] == syncs, f"a host sync in the captured step ({event})"
        StandinGraphs.log.append(event)
        return out


@pytest.fixture
def standin_graphs(monkeypatch):
    StandinGraphs.log = []
    monkeypatch.setattr(captured_module, "CudaGraphs", StandinGraphs)
    return StandinGraphs


def _steps(n_items, batch_size, epochs):
    """(full batches, short batches) of a run: a last batch of one joins the batch before it."""
    full, rest = divmod(n_items, batch_size)
    if rest == 1:
        return (full - 1) * epochs, epochs
    return full * epochs, (1 if rest else 0) * epochs


# every plan that can be captured, with the settings of one run (two-tower: one temperature); β by epoch (DJSRH's
# and JDSH's α) or by iteration (`hashnet`) is read by the graph from the device: one capture
CAPTURED = {
    "two-tower": ("two-tower", {"loss_params": {"temperature": 0.3}}),
    "two-tower, beta by iteration": ("two-tower", {"loss_params": {"temperature": 0.3}, "relaxation": "tanh",
                                                  "beta_schedule": "hashnet", "beta_step_iters": 2}),
    "ucmfh": ("ucmfh", {}),
    "distill": ("distill", {}),
    "djsrh": ("djsrh", {}),
    "jdsh": ("jdsh", {}),
    "cirh": ("cirh", {}),
    "dgcpn": ("dgcpn", {}),  # a step of its own: three updates
    "daeh": ("daeh", {}),  # its mutual information in closed form: no eigen-solve on the host
    "ucch": ("ucch", {"method_params": {"n_negatives": 64}}),  # its negatives drawn on the host; momentum by epoch
    "ucch, learning rate lowered": ("ucch", {"method_params": {"n_negatives": 64}}),  # its milestone moved to 2
    # epochs of three full batches: the warm-up is the first epoch, without draws; the second epoch draws
    "ucch, three full batches an epoch": ("ucch", {"method_params": {"n_negatives": 64}, "batch_size": 96}),
}


def test_every_method_trained_by_epochs_is_captured_above_or_says_why_not():
    """The methods whose step may be captured are the ones the test below captures; each other method trained
    by epochs says why it runs eagerly (`ucmfh methods` shows it)."""
    trained = {name for name, method in METHODS.items() if not method.closed_form}
    graphable = {name for name in trained if METHODS[name].graphable}
    assert {method for method, _ in CAPTURED.values()} == graphable
    assert trained == graphable
    from ucmfh.methods.settings import captured_step

    assert {name: captured_step(name) for name in METHODS} == {
        name: None if METHODS[name].closed_form else "its step captured" for name in METHODS}


def _expected_log(cfg, n_items, scalars, draws=lambda epoch: False):
    """The captures and replays of a run: after the warm-up, each full batch replays the graph, or captures one
    where its scalars (β) differ from the graph's; where the step's draws begin (``draws(epoch)``: UCCH's
    negatives after its warm-up epoch), the warm-up is run again before the capture."""
    full, short = _steps(n_items, cfg.batch_size, 1)
    none = object()  # no graph held
    log, held, warm, warmed_with = [], none, 0, None
    for epoch in range(cfg.epochs):
        for step in range(full):
            if warm >= WARMUP_STEPS and draws(epoch) != warmed_with:  # a step the warm-up did not run
                warm, held = 0, none
            if warm < WARMUP_STEPS:
                warm, warmed_with = warm + 1, draws(epoch)
                continue
            now = scalars(epoch, (full + short) * epoch + step)
            log.append("capture" if held is none or now != held else "replay")
            held = now
    return log


@pytest.mark.parametrize("case", CAPTURED)
def test_a_captured_step_trains_the_eager_model_without_a_host_sync(tiny, monkeypatch, standin_graphs, case):
    import ucmfh.methods.ucch as ucch

    method, settings = CAPTURED[case]
    if case == "ucch, learning rate lowered":  # its first milestone (epoch 31) within the 3 epochs: epoch 2
        monkeypatch.setattr(ucch, "LR_MILESTONES", (1,))
    fusion = None
    if METHODS[method].uses_fusion:
        fusion = fit_fusion(tiny, small_fusion(epochs=1, dropout=0.0), progress=False)[0]
    cfg = method_config(method, **{"epochs": 3, "device": "cuda", "val_fraction": 0.2, "hidden": 32, "dropout": 0.0,
                                   "batch_size": 48, **settings})
    with cuda_standin(monkeypatch):
        eager, eager_history = fit_hashing(tiny, cfg, copy.deepcopy(fusion), progress=False)
        with capture_steps():
            captured, captured_history = fit_hashing(tiny, cfg, copy.deepcopy(fusion), progress=False)
    scalars = lambda epoch, iteration: None  # noqa: E731 - β fed to the graph (Plan.fed): one capture
    if method == "ucch":  # its memory bank's momentum after the warm-up epoch, its learning rate at each milestone
        scalars = lambda epoch, iteration: (epoch >= 1, ucch.learning_rate(cfg.lr_head, epoch))  # noqa: E731
    draws = (lambda epoch: epoch >= 1) if method == "ucch" else (lambda epoch: False)  # its negatives: epoch 1 on
    expected = _expected_log(cfg, int(len(tiny.train) * 0.8), scalars, draws)
    assert StandinGraphs.log == expected and expected.count("replay") > 0
    assert expected.count("capture") == {"ucch": 2, "ucch, learning rate lowered": 3}.get(case, 1)
    for (name, a), b in zip(eager.state_dict().items(), captured.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)
    assert captured_history.as_dict()["loss"] == pytest.approx(eager_history.as_dict()["loss"], rel=1e-5)


@pytest.mark.parametrize("first", ["eager", "captured"])
def test_a_run_interrupted_resumes_captured_to_the_eager_model(tiny, monkeypatch, standin_graphs, tmp_path, first):
    """Stopped after two epochs, eager or captured, and resumed captured (a state saved by an eager run keeps
    Adam's step count on the host, which a capturable Adam refuses), the run ends on the eager model."""
    import ucmfh.trainer as trainer_module
    from conftest import StopAfter
    from ucmfh.signals import TrainingInterrupted
    from ucmfh.training_state import StateFile

    cfg = method_config("two-tower", epochs=4, device="cuda", val_fraction=0.0, hidden=32, dropout=0.0, batch_size=48,
                        loss_params={"temperature": 0.3})
    with cuda_standin(monkeypatch):
        eager, _ = fit_hashing(tiny, cfg, progress=False)
        state = StateFile(str(tmp_path / "hash.state.pt"), interval_s=1e9)
        bars = StopAfter(2)
        monkeypatch.setattr(trainer_module, "tqdm", bars)
        with capture_steps(first == "captured"), pytest.raises(TrainingInterrupted):
            fit_hashing(tiny, cfg, progress=False, state=state)
        bars.epochs = None
        with capture_steps():
            resumed, _ = fit_hashing(tiny, cfg, progress=False, state=StateFile(state.path, resume=True))
    assert bars.starts[-1] == 2 and StandinGraphs.log.count("capture") == (2 if first == "captured" else 1)
    for (name, a), b in zip(eager.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)


def assert_captured_once_as_eager(monkeypatch, fit) -> None:
    """``fit()`` (a model and its history) on the stand-in, eager and captured: the captured run makes one capture
    and replays it, and trains the eager model (within float rounding). Needs the ``standin_graphs`` fixture."""
    with cuda_standin(monkeypatch):
        eager, _ = fit()
        with capture_steps():
            captured, _ = fit()
    assert StandinGraphs.log.count("capture") == 1 and StandinGraphs.log.count("replay") > 0
    for (name, a), b in zip(eager.state_dict().items(), captured.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)


def test_the_fusion_stage_is_captured_with_its_modality_dropout_draws(tiny, monkeypatch, standin_graphs):
    cfg = small_fusion(epochs=2, device="cuda", dropout=0.0, modality_dropout=0.5, val_fraction=0.0)
    assert_captured_once_as_eager(monkeypatch, lambda: fit_fusion(tiny, cfg, progress=False))


@pytest.mark.parametrize("method, settings, said", [
    ("jdsh", {}, "jdsh 16 bits runs eagerly: its step is not one a graph can replay ('ucmfh methods' says why)"),
    ("two-tower", {"device": "cpu"}, "two-tower 16 bits runs eagerly: CUDA graphs need a CUDA device, and it "
                                     "trains on cpu"),
])
def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why(tiny, monkeypatch, standin_graphs, method,
                                                                   settings, said):
    """No capture, and the listener of the block hears why, once (two-tower's two temperature candidates train
    two plans of one name and reason)."""
    cfg = method_config(method, epochs=2, n_bits=16, **{"device": "cuda", **settings})
    if method == "jdsh":  # as a method of another package whose step a graph cannot replay
        monkeypatch.setattr(type(METHODS["jdsh"]), "graphable", False)
    heard = []
    with cuda_standin(monkeypatch), capture_steps(on_eager=heard.append):
        fit_hashing(tiny, cfg, progress=False)
    assert StandinGraphs.log == [] and heard == [said]


def test_tf32_training_is_captured_with_tf32_matmuls_and_restores_the_setting(tiny, monkeypatch, standin_graphs):
    """``amp='tf32'``: the whole of training, its capture too, runs CUDA's float32 matmuls in TF32, and torch's
    setting is what it was once the run ends. The stand-in's matmuls are the CPU's: the model is the float32 one."""
    matmul = torch.backends.cuda.matmul
    seen = []

    class Watched(StandinGraphs):
        def capture(self, body, before, stream):
            seen.append(matmul.fp32_precision)
            return super().capture(body, before, stream)

    monkeypatch.setattr(captured_module, "CudaGraphs", Watched)
    before = matmul.fp32_precision
    cfg = method_config("two-tower", epochs=2, device="cuda", n_bits=16, batch_size=48, dropout=0.0,
                        loss_params={"temperature": 0.3})
    with cuda_standin(monkeypatch):
        full, _ = fit_hashing(tiny, cfg, progress=False)
        heard = []
        with capture_steps(on_eager=heard.append):
            tf32, _ = fit_hashing(tiny, dataclasses.replace(cfg, amp="tf32"), progress=False)
    assert seen == ["tf32"] and heard == [] and matmul.fp32_precision == before
    for (name, a), b in zip(full.state_dict().items(), tf32.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)


def test_a_captured_step_says_nothing(tiny, monkeypatch, standin_graphs):
    cfg = method_config("two-tower", epochs=2, device="cuda", n_bits=16, batch_size=48)
    heard = []
    with cuda_standin(monkeypatch), capture_steps(on_eager=heard.append):
        fit_hashing(tiny, cfg, progress=False)
    assert StandinGraphs.log.count("replay") > 0 and heard == []


def _train_hash_on_cuda(tmp_path, tiny_path, monkeypatch, *flags):
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    with cuda_standin(monkeypatch):
        ran = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "-b", "16", "--batch-size", "48", "--epochs",
                                        "2", "--quiet", "--device", "cuda", "--out", str(tmp_path / "runs"),
                                        "--results", str(tmp_path / "r.jsonl"), *flags])
    assert ran.exit_code == 0, ran.output
    return [line for line in ran.output.splitlines() if line.startswith("note: ")]


@pytest.mark.parametrize("flags, captured", [([], True), (["--no-cuda-graph"], False),
                                             (["--max-memory", "1KB"], False)])
def test_a_training_command_on_a_gpu_captures_its_steps_unless_told_not_to(tmp_path, tiny_path, monkeypatch,
                                                                          standin_graphs, flags, captured):
    """The commands capture by default where the device is CUDA and the step can be, without a note where it
    cannot (rows streamed from the file: none was asked for); ``--no-cuda-graph`` trains every step eagerly."""
    assert _train_hash_on_cuda(tmp_path, tiny_path, monkeypatch, *flags) == []
    assert ("replay" in standin_graphs.log) == captured


def test_a_capture_refused_by_default_is_said(tmp_path, tiny_path, monkeypatch):
    """Captured by default, a capture PyTorch refuses is news: one line says so, without 'asked for'."""
    class RefusingGraphs(StandinGraphs):
        def capture(self, body, before, stream):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(captured_module, "CudaGraphs", RefusingGraphs)
    assert _train_hash_on_cuda(tmp_path, tiny_path, monkeypatch) == [
        "note: two-tower 16 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: operation not "
        "permitted when stream is capturing)"]


@pytest.mark.parametrize("case", CAPTURED)
def test_real_cuda_graphs_train_close_to_the_eager_model(tiny, monkeypatch, case):
    """On a GPU: the graph path against the eager path, no dropout (a graph's draws are its own)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    method, settings = CAPTURED[case]
    if case == "ucch, learning rate lowered":  # a graph captured again at the milestone, as on the stand-in
        import ucmfh.methods.ucch as ucch

        monkeypatch.setattr(ucch, "LR_MILESTONES", (1,))
    fusion = None
    if METHODS[method].uses_fusion:
        fusion = fit_fusion(tiny, small_fusion(epochs=1, dropout=0.0, device="cuda"), progress=False)[0]
    cfg = method_config(method, epochs=3, device="cuda", hidden=64, dropout=0.0, **{"batch_size": 48, **settings})
    eager, _ = fit_hashing(tiny, cfg, copy.deepcopy(fusion), progress=False)
    replays = []

    class Counted(captured_module.CudaGraphs):  # a run that fell back to eager would pass the comparison below
        def capture(self, body, before, stream):
            replay, out, ran = super().capture(body, before, stream)
            return (lambda: (replays.append(1), replay())), out, ran

    monkeypatch.setattr(captured_module, "CudaGraphs", Counted)
    heard = []
    with capture_steps(on_eager=heard.append):
        captured, _ = fit_hashing(tiny, cfg, copy.deepcopy(fusion), progress=False)
    assert heard == [] and len(replays) > 0
    for (name, a), b in zip(eager.state_dict().items(), captured.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-4, atol=1e-5)


def test_real_a_refused_capture_leaves_dropout_and_the_next_capture_usable(tiny, monkeypatch):
    """On a GPU: a capture PyTorch refuses (a host sync inside it) ended before its epilogue, leaving the
    generator state it registered marked as capturing (the eager steps' next dropout: 'Offset increment outside
    graph capture encountered unexpectedly') and the allocator routing to its pool (the next capture's
    empty_cache asserted): captured_step.undo_refused_capture gives the generator its state from before and
    ends the routing, so the run goes on eagerly, dropout on, and the next run captures."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    cfg = method_config("two-tower", epochs=2, device="cuda", n_bits=16, batch_size=48, dropout=0.3,
                        loss_params={"temperature": 0.3})

    class SyncingGraphs(captured_module.CudaGraphs):  # .item() while capturing: the capture is invalidated
        def capture(self, body, before, stream):
            return super().capture(lambda: (torch.ones(1, device="cuda").sum().item(), body())[1], before, stream)

    monkeypatch.setattr(captured_module, "CudaGraphs", SyncingGraphs)
    heard = []
    with capture_steps(on_eager=heard.append):
        fit_hashing(tiny, cfg, progress=False)  # eager from the refused capture on, dropout drawing
    assert len(heard) == 1 and "its capture as a CUDA graph failed" in heard[0], heard
    replays = []

    class Counted(captured_module.CudaGraphs):
        def capture(self, body, before, stream):
            replay, out, ran = super().capture(body, before, stream)
            return (lambda: (replays.append(1), replay())), out, ran

    monkeypatch.setattr(captured_module, "CudaGraphs", Counted)
    heard.clear()
    with capture_steps(on_eager=heard.append):
        fit_hashing(tiny, cfg, progress=False)
    assert heard == [] and replays


def test_a_refused_capture_s_leftovers_are_undone_on_any_machine(monkeypatch):
    """undo_refused_capture (the real test above runs it on a GPU): the device's generator gets the state
    kept from before the capture, a run side by side goes on from it (run_draws.state_replaced), the pool's
    routing is ended where it is still on (once: ended already is no error), and a failure of its own leaves
    the capture's error to be said."""
    import ucmfh.run_draws as run_draws

    class Generator:
        device = torch.device("cuda", 0)

        def __init__(self):
            self.states = []

        def graphsafe_set_state(self, state):
            self.states.append(state)

    ended = []

    def end(device, pool):
        if ended:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        ended.append((device, pool))

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    draws = run_draws.RunDraws(torch.device("cpu"))
    draws.device, draws.state = torch.device("cuda", 0), "the run's state, marked as capturing"
    generator = Generator()
    monkeypatch.setattr(run_draws._ACTIVE, "draws", draws, raising=False)
    captured_module.undo_refused_capture(generator, "kept", (0, 7))
    assert generator.states == ["kept"] and draws.state == "kept" and ended == [(0, (0, 7))]
    captured_module.undo_refused_capture(generator, "kept again", (0, 7))  # the routing ended already
    assert generator.states == ["kept", "kept again"] and ended == [(0, (0, 7))]

    class Broken(Generator):
        def graphsafe_set_state(self, state):
            raise RuntimeError("no such state")

    captured_module.undo_refused_capture(Broken(), "kept", (0, 7))  # said nowhere: the refusal is the news


def test_a_capture_pytorch_refuses_leaves_the_plan_eager_and_says_why(tiny, monkeypatch, standin_graphs):
    """A capture that fails (an operation a graph cannot hold, on some GPU or PyTorch release) costs the run
    nothing but its speed: its steps run eagerly from that batch on, to the eager model, and the capture
    block's listener hears why, in one line."""
    class RefusingGraphs(StandinGraphs):
        def capture(self, body, before, stream):
            StandinGraphs.log.append("refused")
            raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")

    monkeypatch.setattr(captured_module, "CudaGraphs", RefusingGraphs)
    cfg = method_config("two-tower", epochs=3, device="cuda", n_bits=16, batch_size=48, dropout=0.0,
                        loss_params={"temperature": 0.3})
    heard = []
    with cuda_standin(monkeypatch):
        eager, eager_history = fit_hashing(tiny, cfg, progress=False)
        with capture_steps(on_eager=heard.append):
            captured, captured_history = fit_hashing(tiny, cfg, progress=False)
    assert StandinGraphs.log == ["refused"]  # tried once, then eager: no capture again, no replay
    assert heard == ["two-tower 16 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: operation "
                     "not permitted when stream is capturing)"]
    for (name, a), b in zip(eager.state_dict().items(), captured.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)
    assert captured_history.as_dict()["loss"] == pytest.approx(eager_history.as_dict()["loss"], rel=1e-5)


def test_a_capture_refused_after_replays_leaves_the_plan_eager_to_the_eager_model(tiny, monkeypatch, standin_graphs):
    """UCCH captures again after its warm-up epoch (its memory bank's momentum, its negatives drawn): its second
    capture refused, after the first graph's replays, the run goes on eagerly from that batch and ends on the
    eager model."""
    class SecondRefused(StandinGraphs):
        def capture(self, body, before, stream):
            if StandinGraphs.log.count("capture"):
                StandinGraphs.log.append("refused")
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().capture(body, before, stream)

    monkeypatch.setattr(captured_module, "CudaGraphs", SecondRefused)
    cfg = method_config("ucch", epochs=3, device="cuda", n_bits=16, batch_size=48, dropout=0.0, hidden=32,
                        val_fraction=0.0, method_params={"n_negatives": 64})
    heard = []
    with cuda_standin(monkeypatch):
        eager, _ = fit_hashing(tiny, cfg, progress=False)
        with capture_steps(on_eager=heard.append):
            captured, _ = fit_hashing(tiny, cfg, progress=False)
    log = StandinGraphs.log
    assert log[0] == "capture" and log.count("replay") > 0 and log[-1] == "refused" and log.count("refused") == 1
    assert heard == ["ucch 16 bits runs eagerly: its capture as a CUDA graph failed (RuntimeError: operation not "
                     "permitted when stream is capturing)"]
    for (name, a), b in zip(eager.state_dict().items(), captured.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name, rtol=1e-6, atol=1e-7)


def test_a_plan_feeding_its_step_scalars_it_has_not_is_refused_when_made():
    """``Plan.fed`` names scalars the plan's ``scalars`` gives: without them a captured step would fail on a GPU."""
    from ucmfh.trainer import Plan

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="feeds its step scalars"):
        Plan("p", model, {"model": model}, optimizer, 8, loss=lambda batch: model.weight.sum(), fed=("beta",))
    with pytest.raises(ValueError, match=r"feeds its step scalars \['alpha'\]"):
        Plan("p", model, {"model": model}, optimizer, 8, loss=lambda batch: model.weight.sum(), fed=("alpha",),
             scalars=lambda epoch, iteration: {"beta": 1.0})
    Plan("p", model, {"model": model}, optimizer, 8, loss=lambda batch: model.weight.sum(), fed=("beta",),
         scalars=lambda epoch, iteration: {"beta": 1.0})
