"""Training: every item used, determinism, and codes that beat random ones only once trained."""
from __future__ import annotations

import math

import pytest
import torch

from ucmfh.config import HashConfig
from ucmfh.evaluation import encode_split, evaluate_hashing, random_codes_map
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.methods import fit_hashing
from ucmfh.fusion_stage import fit_fusion
from ucmfh.models.relaxation import beta_at
from ucmfh.batches import batches, epoch_plan

from conftest import method_config, small_fusion, small_hash


def test_batches_use_every_item_once_and_never_leave_one_alone():
    g = torch.Generator().manual_seed(0)
    for n, size in [(10, 4), (9, 4), (128, 128), (129, 128), (5, 128)]:
        chunks = list(batches(n, size, g))
        assert sorted(torch.cat(chunks).tolist()) == list(range(n))
        assert min(len(c) for c in chunks) >= 2


def test_beta_schedules():
    assert beta_at(HashConfig(), 5000, 50) == 1.0
    cfg = HashConfig(beta_schedule="hashnet")
    assert beta_at(cfg, 199, 0) == 1.0 and abs(beta_at(cfg, 200, 0) - 2.0**0.5) < 1e-12
    cfg = HashConfig(beta_schedule="step", beta_step_epochs=20)
    assert beta_at(cfg, 0, 19) == 1.0 and beta_at(cfg, 0, 60) == 2.0


def _train(data, seed=0):
    fusion, _ = fit_fusion(data, small_fusion(epochs=3, seed=seed), progress=False)
    model, history = fit_hashing(data, small_hash(epochs=3, seed=seed), fusion, progress=False)
    return model, history


def test_same_seed_same_codes_and_map(tiny):
    """The seed alone decides: the two runs start from other states of the process's generators (a fit leaves
    them as it found them, so without these draws a run that never seeded torch would pass)."""
    torch.manual_seed(11)
    a, history_a = _train(tiny)
    torch.manual_seed(12)
    b, history_b = _train(tiny)
    assert history_a == history_b
    codes_a = encode_split(a, tiny.query, "unimodal", "cpu")
    codes_b = encode_split(b, tiny.query, "unimodal", "cpu")
    assert torch.equal(codes_a[0], codes_b[0]) and torch.equal(codes_a[1], codes_b[1])
    assert evaluate_hashing(a, tiny, device="cpu") == evaluate_hashing(b, tiny, device="cpu")


def test_trained_codes_beat_random_and_untrained_do_not(tiny):
    floor = random_codes_map(tiny, 16)
    torch.manual_seed(0)
    fusion = FusionEncoder.from_config(tiny.d_img, tiny.d_txt, small_fusion())
    untrained = CrossModalHasher(fusion, small_hash().n_bits, small_hash().hidden).eval()
    fusion, _ = fit_fusion(tiny, small_fusion(epochs=10), progress=False)
    trained, _ = fit_hashing(tiny, small_hash(epochs=10), fusion, progress=False)
    for protocol in ("unimodal", "fused"):
        [before] = evaluate_hashing(untrained, tiny, [protocol], device="cpu")
        [after] = evaluate_hashing(trained, tiny, [protocol], device="cpu")
        for direction in ("map_i2t", "map_t2i"):
            assert abs(before[direction] - floor[direction]) < 0.08, (protocol, direction, before, floor)
            assert after[direction] > floor[direction] + 0.12, (protocol, direction, after, floor)


def test_epoch_plan_draws_what_a_per_step_loop_would():
    plan = epoch_plan(10, 4, 0.5, torch.Generator().manual_seed(3), torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    chunks = list(batches(10, 4, g))
    separate = [torch.rand(len(c), generator=g) < 0.5 for c in chunks]
    assert [torch.equal(i, c) and torch.equal(s, t) for (i, s), c, t in zip(plan, chunks, separate)] == [True] * 3
    assert all(s is None for _, s in epoch_plan(10, 4, 0.0, g, torch.device("cpu")))


def test_bf16_amp_trains_finite_and_is_reproducible(tiny):
    def run():
        fusion, h_fusion = fit_fusion(tiny, small_fusion(epochs=2, amp="bf16"), progress=False)
        model, h_hash = fit_hashing(tiny, small_hash(epochs=2, amp="bf16"), fusion, progress=False)
        return model, h_fusion + h_hash

    model, history = run()
    assert all(math.isfinite(x) for x in history)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast leaves the weights in float32
    codes = encode_split(model, tiny.query, "unimodal", "cpu")
    assert all(set(c.unique().tolist()) <= {-1.0, 1.0} for c in codes)
    again, history_again = run()
    assert history == history_again
    codes_again = encode_split(again, tiny.query, "unimodal", "cpu")
    assert torch.equal(codes[0], codes_again[0]) and torch.equal(codes[1], codes_again[1])


def test_tf32_is_refused_off_a_cuda_device(tiny):
    """TF32 is a GPU's matmul format: a CPU run under it would train in float32 while saying TF32."""
    with pytest.raises(ValueError, match="amp 'tf32' .* needs a CUDA device; this run trains on cpu"):
        fit_fusion(tiny, small_fusion(epochs=1, amp="tf32", device="cpu"), progress=False)


def test_amp_mode_is_validated():
    with pytest.raises(ValueError, match="amp"):
        small_fusion(amp="fp8").validate()
    with pytest.raises(ValueError, match="amp"):
        small_hash(amp="float16").validate()


def test_supervised_training_passes_labels_and_fit_hashing_keeps_the_callers_encoder(tiny, monkeypatch):
    import ucmfh.methods.ucmfh as ucmfh_method
    import ucmfh.fusion_stage as fusion_stage
    from ucmfh.losses import build_loss

    seen = []

    def recording(name, **hparams):
        loss = build_loss(name, **hparams)
        original_forward = loss.forward

        def forward(img, txt, ids=None, labels=None):
            seen.append(labels)
            return original_forward(img, txt, ids=ids, labels=labels)

        loss.forward = forward
        return loss

    monkeypatch.setattr(fusion_stage, "build_loss", recording)
    monkeypatch.setattr(ucmfh_method, "build_loss", recording)
    fusion, history = fit_fusion(tiny, small_fusion(epochs=1, loss="pairwise", supervised=True), progress=False)
    assert all(labels is not None and labels.shape[1] == tiny.n_classes for labels in seen)
    assert all(h == h for h in history)  # finite, not NaN
    seen.clear()
    before = {k: v.clone() for k, v in fusion.state_dict().items()}
    fit_hashing(tiny, small_hash(epochs=1), fusion, progress=False)
    assert seen and all(labels is None for labels in seen)
    assert all(torch.equal(before[k], v) for k, v in fusion.state_dict().items())


def test_lr_fusion_zero_keeps_the_encoder_and_trains_the_heads(tiny):
    fusion, _ = fit_fusion(tiny, small_fusion(epochs=1), progress=False)
    moved, _ = fit_hashing(tiny, small_hash(epochs=1), fusion, progress=False)
    kept, history = fit_hashing(tiny, small_hash(epochs=2, lr_fusion=0.0), fusion, progress=False)
    start = fusion.state_dict()
    assert all(torch.equal(start[k], v) for k, v in kept.fusion.state_dict().items())
    assert not all(torch.equal(start[k], v) for k, v in moved.fusion.state_dict().items())
    assert history[1] < history[0]  # the heads still learn
    with pytest.raises(ValueError, match="lr_fusion"):
        small_hash(lr_fusion=-1.0).validate()


def test_validation_split_is_seeded_disjoint_and_keeps_ids_together(tiny):
    from ucmfh.data.h5 import Split
    from ucmfh.selection import validation_split

    rest, val = validation_split(tiny.train, 0.2, seed=3)
    again_rest, again_val = validation_split(tiny.train, 0.2, seed=3)
    assert torch.equal(val.ids, again_val.ids) and torch.equal(rest.ids, again_rest.ids)
    assert len(val) == round(0.2 * len(tiny.train)) and len(rest) + len(val) == len(tiny.train)
    assert not set(val.ids.tolist()) & set(rest.ids.tolist())
    whole, none = validation_split(tiny.train, 0.0, seed=3)
    assert whole is tiny.train and none is None
    captions = Split(tiny.train.img[:40], tiny.train.txt[:40], None, torch.arange(40) // 5)  # 8 images x 5
    rest, val = validation_split(captions, 0.25, seed=0)
    assert len(val) == 10 and set(val.ids.tolist()).isdisjoint(rest.ids.tolist())


def test_validation_keeps_the_best_epoch_and_patience_stops_early(tiny):
    """With a validation split the returned weights are the best epoch's: training just that long gives them."""
    fusion, _ = fit_fusion(tiny, small_fusion(epochs=2), progress=False)
    model, history = fit_hashing(tiny, small_hash(epochs=6, val_fraction=0.2), fusion, progress=False)
    scores = [score for _, score in history.validation]
    assert [epoch for epoch, _ in history.validation] == list(range(1, 7))
    assert history.best_epoch == 1 + scores.index(max(scores))
    shorter, _ = fit_hashing(tiny, small_hash(epochs=history.best_epoch, val_fraction=0.2), fusion, progress=False)
    a, b = model.state_dict(), shorter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    _, stopped = fit_hashing(tiny, small_hash(epochs=30, val_fraction=0.2, patience=1), fusion, progress=False)
    assert len(stopped) < 30 and len(stopped) == stopped.best_epoch + 1
    with pytest.raises(ValueError, match="patience"):
        small_hash(patience=2)  # patience without a validation split


def test_resume_restores_the_training_devices_cuda_generator_whatever_gpus_saved_it(monkeypatch):
    """A state held every visible GPU's generator and was restored with set_rng_state_all,
    which fails (or restores the wrong one) on another number of GPUs; only the training device's counts."""
    from ucmfh.training_state import restore_cuda_rng

    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((int(state[0]), str(device))))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    mine, other = torch.tensor([7], dtype=torch.uint8), torch.tensor([9], dtype=torch.uint8)
    restore_cuda_rng(mine, torch.device("cuda:1"))  # saved since: the device's own
    restore_cuda_rng([mine, other], torch.device("cuda"))  # saved on two GPUs, resumed on the current one
    restore_cuda_rng([mine, other], torch.device("cuda:1"))
    restore_cuda_rng([mine], torch.device("cuda:1"))  # saved on one GPU, resumed on a second: nothing to restore
    restore_cuda_rng(mine, torch.device("cpu"))
    restore_cuda_rng(None, torch.device("cuda"))
    assert restored == [(7, "cuda:1"), (7, "cuda"), (9, "cuda:1")]


def test_state_paths_find_every_candidates_state_and_unfinished_first_save(tmp_path):
    from ucmfh.files import temp_destination
    from ucmfh.training_state import candidate_name, candidate_path, state_paths

    own = str(tmp_path / "hash64.state.pt")
    saved = candidate_path(own, "t0.3")
    open(saved, "wb").close()
    (tmp_path / ".hash64.sign-t0.1.state.pt.tmp123").write_bytes(b"half")  # a candidate's first save, cut short
    (tmp_path / "hash16.t0.3.state.pt").write_bytes(b"")  # another length's: not this run's
    assert state_paths(own) == [own, str(tmp_path / "hash64.sign-t0.1.state.pt"), saved]
    assert candidate_name(own, saved) == "t0.3" and temp_destination("x/.a.pt.tmp7") == "a.pt"
    assert temp_destination(".a.pt.tmpx") is None and temp_destination("a.pt") is None


def test_a_long_epoch_shows_its_steps_on_the_bar(tiny, monkeypatch):
    """A 1-epoch run at 100,000 items showed 0/1 for minutes: an epoch longer than STEP_SHOWN_AFTER_S shows
    its step beside the last epoch's figures, looked at every STEP_SHOWN_EVERY steps."""
    import ucmfh.trainer as trainer_module

    postfixes = []

    class Bar:
        def __init__(self, *args, **kwargs):
            pass

        def update(self, n):
            pass

        def set_postfix(self, **kwargs):
            postfixes.append(kwargs)

        def close(self):
            pass

    monkeypatch.setattr(trainer_module, "tqdm", Bar)
    monkeypatch.setattr(trainer_module, "STEP_SHOWN_AFTER_S", 0.0)
    monkeypatch.setattr(trainer_module, "STEP_SHOWN_EVERY", 2)
    cfg = method_config("two-tower", epochs=2, batch_size=8, val_fraction=0.0)
    fit_hashing(tiny, cfg, progress=True)
    steps = len(tiny.train) // 8 + (len(tiny.train) % 8 > 0)
    shown = [p["step"] for p in postfixes if "step" in p]
    assert shown[:steps // 2] == [f"{s}/{steps}" for s in range(2, steps + 1, 2)]
    assert [set(p) - {"step"} for p in postfixes if "step" in p][-1] == set(postfixes[steps // 2]) - {"step"}
    monkeypatch.setattr(trainer_module, "STEP_SHOWN_AFTER_S", 3600.0)  # short epochs: their figures alone
    postfixes.clear()
    fit_hashing(tiny, cfg, progress=True)
    assert postfixes and not any("step" in p for p in postfixes)
