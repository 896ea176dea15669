"""Training: every item used, determinism, and codes that beat random ones only once trained."""
from __future__ import annotations

import torch

from ucmfh.config import HashConfig
from ucmfh.evaluate import encode_split, evaluate_hashing, random_codes_map
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.train import batches, beta_at, fit_fusion, fit_hashing

from conftest import small_fusion, small_hash


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
    a, history_a = _train(tiny)
    b, history_b = _train(tiny)
    assert history_a == history_b
    codes_a = encode_split(a, tiny.query, "unimodal", "cpu")
    codes_b = encode_split(b, tiny.query, "unimodal", "cpu")
    assert torch.equal(codes_a[0], codes_b[0]) and torch.equal(codes_a[1], codes_b[1])
    assert evaluate_hashing(a, tiny, device="cpu") == evaluate_hashing(b, tiny, device="cpu")


def test_trained_codes_beat_random_and_untrained_do_not(tiny):
    floor = random_codes_map(tiny, 16)
    torch.manual_seed(0)
    untrained = CrossModalHasher(FusionEncoder(tiny.d_img, tiny.d_txt, small_fusion()), small_hash()).eval()
    fusion, _ = fit_fusion(tiny, small_fusion(epochs=10), progress=False)
    trained, _ = fit_hashing(tiny, small_hash(epochs=10), fusion, progress=False)
    for protocol in ("unimodal", "fused"):
        [before] = evaluate_hashing(untrained, tiny, [protocol], device="cpu")
        [after] = evaluate_hashing(trained, tiny, [protocol], device="cpu")
        for direction in ("map_i2t", "map_t2i"):
            assert abs(before[direction] - floor[direction]) < 0.08, (protocol, direction, before, floor)
            assert after[direction] > floor[direction] + 0.12, (protocol, direction, after, floor)
