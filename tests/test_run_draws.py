"""Runs side by side in one process (ucmfh.run_draws): inside separate_draws() each run trains the model it trains
alone, whatever the other threads draw from torch's generators meanwhile; outside it nothing changes.

On the CPU, where each run's state is the generator's bytes; on a GPU it is a graph-safe generator state, whose
draws and captures only a GPU can show (``scripts/bench_streams.py`` compares the models there)."""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch

import ucmfh.trainer as trainer
from ucmfh.methods import fit_hashing, hash_config
from ucmfh.run_draws import RunDraws, drawing_separately, separate_draws, setting_up


def _fit(data, seed):
    # dropout 0.3 in each head and 3 epochs: every step draws from the CPU's generator
    cfg = hash_config("two-tower", n_bits=16, epochs=3, batch_size=32, seed=seed, device="cpu", val_fraction=0.0,
                      dropout=0.3)
    model, _ = fit_hashing(data, cfg, progress=False)
    return {name: value.clone() for name, value in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.fixture(scope="module")
def alone(tiny):
    return {seed: _fit(tiny, seed) for seed in (1, 2)}


def _interrupted_run(tiny, monkeypatch, seed):
    """A run stopped after its first epoch while another "run" sets itself up (reseeds and draws from the CPU's
    generator, as a plan's initial weights do, under the set-up lock as a run's start is); its model."""
    paused, resume = threading.Event(), threading.Event()
    end_epoch = trainer._Run.end_epoch

    def pausing(self, epoch, began):
        shown = end_epoch(self, epoch, began)
        if epoch == 0:
            paused.set()
            assert resume.wait(30)
        return shown

    monkeypatch.setattr(trainer._Run, "end_epoch", pausing)
    out = {}
    worker = threading.Thread(target=lambda: out.update(model=_fit(tiny, seed)))
    worker.start()
    assert paused.wait(60)
    with setting_up():
        torch.manual_seed(12345)
        torch.randn(1000)
    resume.set()
    worker.join(60)
    return out["model"]


def test_inside_the_block_another_run_s_set_up_between_two_epochs_leaves_a_run_s_draws_its_own(tiny, alone,
                                                                                              monkeypatch):
    with separate_draws():
        assert _same(_interrupted_run(tiny, monkeypatch, 1), alone[1])


def test_outside_the_block_the_same_set_up_changes_the_run_s_dropout(tiny, alone, monkeypatch):
    """The test above has teeth: without the block, the second epoch's dropout comes from the reseeded
    generator (torch's global one, as it always was)."""
    assert not _same(_interrupted_run(tiny, monkeypatch, 1), alone[1])


def test_runs_in_threads_side_by_side_train_the_models_they_train_alone(tiny, alone):
    models = {}
    with separate_draws():
        threads = [threading.Thread(target=lambda s=s, i=i: models.update({(s, i): _fit(tiny, s)}))
                   for i in range(2) for s in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert len(models) == 4
    for (seed, _), model in models.items():
        assert _same(model, alone[seed]), seed


def test_a_run_alone_inside_the_block_trains_the_model_it_trains_outside(tiny, alone):
    with separate_draws():
        assert drawing_separately()
        assert _same(_fit(tiny, 2), alone[2])
    assert not drawing_separately()


def test_outside_the_block_a_run_holds_no_state_and_swaps_nothing():
    draws = RunDraws(torch.device("cpu"))
    before = torch.get_rng_state()
    with draws.active():
        torch.rand(3)
    assert draws.state is None and not torch.equal(torch.get_rng_state(), before)  # the global generator drew


def test_a_run_s_state_goes_on_from_where_its_last_block_left_it_and_the_global_one_is_set_again():
    torch.manual_seed(7)
    expected = torch.rand(6)
    torch.manual_seed(7)
    with separate_draws():
        draws = RunDraws(torch.device("cpu"))
    torch.manual_seed(99)
    outside = torch.get_rng_state()
    drawn = []
    for _ in range(2):
        with draws.active():
            drawn.append(torch.rand(3))
        assert torch.equal(torch.get_rng_state(), outside)  # the state set before the block, set again
    assert torch.equal(torch.cat(drawn), expected)


def _caller_draws():
    return random.random(), np.random.rand(), torch.rand(1).item()


def _seed_caller(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_a_run_leaves_the_caller_s_generators_as_it_found_them_however_it_ends(tiny):
    """A fit seeds Python's, NumPy's and torch's generators for its draws; a notebook's next draws are those it
    would have made without the fit, after a fit that ends well and after one that fails."""
    _seed_caller(5)
    expected = _caller_draws()
    for plan in (None, "fails"):
        _seed_caller(5)
        if plan is None:
            _fit(tiny, 1)
        else:
            def failing(setup):
                torch.randn(100)
                raise RuntimeError("a plan that fails after drawing")
            cfg = hash_config("two-tower", n_bits=16, epochs=1, device="cpu")
            with pytest.raises(RuntimeError, match="fails after drawing"):
                trainer.fit(failing, tiny.train, cfg, progress=False)
        assert _caller_draws() == expected, plan


def _fits_in_threads(tiny, fit=_fit):
    threads = [threading.Thread(target=fit, args=(tiny, seed)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


def test_runs_in_threads_whose_draws_interleave_say_so_and_name_the_remedy(tiny):
    """Said once for each thread whose runs clash (a fit of two candidates and a refit said it three times)."""
    def candidates(data, seed):  # the default's two candidates on a validation split: a run each, and a refit
        fit_hashing(data, hash_config("two-tower", n_bits=16, epochs=2, batch_size=32, seed=seed, device="cpu"),
                    progress=False)

    with pytest.warns(RuntimeWarning, match=r"draws interleave.*ucmfh\.separate_draws\(\)") as said:
        _fits_in_threads(tiny, candidates)
    assert 1 <= len([w for w in said if issubclass(w.category, RuntimeWarning)]) <= 2
    with pytest.warns(RuntimeWarning, match=r"draws interleave"):  # the runs over, told again at a new clash
        _fits_in_threads(tiny)


def test_runs_in_threads_inside_the_block_warn_of_nothing_and_leave_the_caller_s_generators(tiny, recwarn):
    """Runs side by side end in any order: each restored the state it found at its start, so the first to end
    restored the caller's while the other trained, and the last restored the first's seeded state."""
    _seed_caller(5)
    expected = _caller_draws()
    _seed_caller(5)
    with separate_draws():
        _fits_in_threads(tiny)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert _caller_draws() == expected


class _Held:
    """The set-up lock, with this thread's depth in it counted (whether a draw is a run's own)."""

    def __init__(self, lock):
        self.lock, self.depth = lock, threading.local()

    def inside(self):
        return getattr(self.depth, "n", 0) > 0

    def __enter__(self):
        self.lock.__enter__()
        self.depth.n = getattr(self.depth, "n", 0) + 1

    def __exit__(self, *exc):
        self.depth.n -= 1
        return self.lock.__exit__(*exc)


def test_no_method_draws_from_torch_s_generator_outside_a_run_s_set_up_and_steps(tiny_path, tmp_path, monkeypatch):
    """Everything a grid cell does — training, a closed-form fit, saving, loading and scoring its model — draws from
    the CPU's generator only in a run's set-up or in its steps, under the lock (each step with the run's own state
    set). A draw anywhere else, made while a run side by side steps, lands in that run's state: a checkpoint's
    model built to check it before it is saved did so, and cca-itq's model, built before its closed-form weights
    were written, and the rows of ``grid --workers threads`` were now and then not those of the cells alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import ucmfh.run_draws as run_draws
    from ucmfh.app.experiment import train_hash_stage
    from ucmfh.app.identity import RunOptions
    from ucmfh.checkpoint import load_model
    from ucmfh.data.h5 import load_dataset
    from ucmfh.methods import METHODS
    from ucmfh.methods.settings import stage_configs

    held = _Held(run_draws._LOCK)
    monkeypatch.setattr(run_draws, "_LOCK", held)
    outside = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.default_generator.get_state()
            out = func(*args, **(kwargs or {}))
            if not held.inside() and not torch.equal(before, torch.default_generator.get_state()):
                outside.append(str(func))
            return out

    data = load_dataset(tiny_path)
    opts = RunOptions(out=str(tmp_path / "runs"), progress=False)
    with separate_draws(), Watch():
        for method in METHODS:
            fusion_cfg, (hash_cfg,) = stage_configs(method, n_bits=[8], epochs=1, fusion_epochs=1, batch_size=64,
                                                    device="cpu", drop_unused=True)
            rows = train_hash_stage(data, fusion_cfg, hash_cfg, opts, ("unimodal",), log=lambda line: None)
            load_model(rows[0]["checkpoint"], "hash")  # trained, saved and scored; then loaded, as a finished run is
            assert not outside, (method, outside)


def test_every_method_s_fit_leaves_the_caller_s_draws_and_default_dtype_and_trains_in_float32(tiny):
    """A notebook's next draws after a fit of any method are those it would have made without it (cca-itq's
    model, built before its closed-form weights are written, drew from torch's generator itself); under a
    caller's default dtype of float64 each method trains the float32 model it trains under float32 (the dtype
    made a model of float64 weights from other draws: MAP 0.5117 against 0.4728 for two-tower), and the
    caller's dtype is float64 again after."""
    from ucmfh.methods import METHODS
    from ucmfh.methods.settings import stage_configs
    from ucmfh.fusion_stage import fit_fusion

    def fitted(method):
        fusion_cfg, (cfg,) = stage_configs(method, n_bits=[8], epochs=1, fusion_epochs=1, batch_size=64,
                                           device="cpu", drop_unused=True)
        fusion = fit_fusion(tiny, fusion_cfg, progress=False)[0] if fusion_cfg else None
        return fit_hashing(tiny, cfg, fusion, progress=False)[0].state_dict()

    _seed_caller(5)
    expected = _caller_draws()
    for method in METHODS:
        _seed_caller(5)
        weights = fitted(method)
        assert _caller_draws() == expected, method
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            other = fitted(method)
            assert torch.get_default_dtype() == torch.float64, method
        finally:
            torch.set_default_dtype(before)
        assert other.keys() == weights.keys() and all(torch.equal(other[k], weights[k]) for k in weights), method
