"""Method 'ucch' (UCCH, Hu et al., TPAMI 2023): its losses and memory bank against slow loop-level
transcriptions of the released code (NCE/NCEAverage.py, NCE/NCECriterion.py, src/utils.py), its
networks, and that it learns leak-free codes on tiny data."""
from __future__ import annotations

import math

import pytest
import torch

from ucmfh.methods import METHODS, fit_hashing, hash_config
from ucmfh.methods.ucch import (
    MemoryBank, UcchHasher, contrastive_hashing_loss, cross_modal_ranking_loss, hash_outputs, learning_rate,
    negatives_generator, ucch_loss,
)
from ucmfh.evaluation import evaluate_hashing, random_codes_map

# ----------------------------------------------------------------------------
# Slow references: loops over items and pairs in float64, transcribing the released code.
# ----------------------------------------------------------------------------


def _dot(a, b) -> float:
    return sum(float(x) * float(y) for x, y in zip(a, b))


def _sign(x: float) -> float:
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def _unit(v):
    n = math.sqrt(sum(float(x) ** 2 for x in v))
    return [float(x) / n for x in v]


def ref_nce(h_img, h_txt, keys, temperature) -> float:
    """NCEAverage.forward (use_softmax) + NCESoftmaxLoss for both modalities: out = key . h / (T sqrt(bits)),
    -log of the softmax's first entry, averaged over items; l_loss + ab_loss."""
    b, k1, bits = keys.shape
    t = temperature * math.sqrt(bits)
    total = 0.0
    for h in (h_img, h_txt):
        loss = 0.0
        for i in range(b):
            out = [_dot(keys[i, j], h[i]) / t for j in range(k1)]
            denom = sum(math.exp(o) for o in out)
            loss += -math.log(math.exp(out[0]) / denom)
        total += loss / b
    return total


def ref_ranking(h_img, h_txt, margin, shift, tau=1.0) -> float:
    """src/utils.py ContrastiveLoss.forward(im, s) with its masks written out per pair."""
    b = h_img.shape[0]
    s = [[_dot(h_img[i], h_txt[j]) for j in range(b)] for i in range(b)]
    cost_s = [[s[i][j] if s[i][j] >= s[i][i] - margin else s[i][j] - shift for j in range(b)] for i in range(b)]
    cost_im = [[s[i][j] if s[i][j] >= s[j][j] - margin else s[i][j] - shift for j in range(b)] for i in range(b)]
    rows = sum(-cost_s[i][i] + tau * math.log(sum(math.exp(cost_s[i][j] / tau) for j in range(b))) + margin
               for i in range(b)) / b
    cols = sum(-cost_im[j][j] + tau * math.log(sum(math.exp(cost_im[i][j] / tau) for i in range(b))) + margin
               for j in range(b)) / b
    return rows + cols


def ref_inbatch_keys(h_img, h_txt):
    """NCEAverage.forward with momentum <= 0: row i is [sign((l_i + ab_i) / 2), then every j != i in order]."""
    b = h_img.shape[0]
    w = [[_sign((float(x) + float(y)) / 2) for x, y in zip(h_img[j], h_txt[j])] for j in range(b)]
    return [[w[i]] + [w[j] for j in range(b) if j != i] for i in range(b)]


def ref_update(memory, index, h_img, h_txt, momentum):
    """NCEAverage.forward's memory update: l = normalize((l + ab) / 2); v = normalize(d v + (1 - d) l)."""
    out = [list(map(float, row)) for row in memory]
    for r, i in enumerate(index.tolist()):
        mean = _unit([(float(x) + float(y)) / 2 for x, y in zip(h_img[r], h_txt[r])])
        out[i] = _unit([momentum * v + (1 - momentum) * m for v, m in zip(out[i], mean)])
    return out


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    h_img = hash_outputs(torch.randn(6, 8, generator=g, dtype=torch.float64))
    h_txt = hash_outputs(torch.randn(6, 8, generator=g, dtype=torch.float64))
    codes = torch.randn(20, 8, generator=g, dtype=torch.float64).sign()
    rows = torch.randint(20, (6, 11), generator=g)  # repeats allowed, as the released draws
    rows[:, 0] = torch.tensor([4, 0, 19, 7, 7, 2])
    return h_img, h_txt, codes, rows


# ----------------------------------------------------------------------------


def test_hash_outputs_are_the_released_networks_tanh_then_l2():
    z = torch.randn(5, 16, dtype=torch.float64)
    h = hash_outputs(z)
    assert torch.allclose(h, z.tanh() / z.tanh().norm(dim=1, keepdim=True))
    assert torch.equal(h.sign(), z.sign())  # codes: tanh and the norm change no sign


@pytest.mark.parametrize("temperature", [0.9, 0.2])
def test_contrastive_hashing_loss_matches_the_released_nce(batch, temperature):
    h_img, h_txt, codes, rows = batch
    got = contrastive_hashing_loss(h_img, h_txt, codes, rows, temperature)
    assert got.item() == pytest.approx(ref_nce(h_img, h_txt, codes[rows], temperature), rel=1e-10)


@pytest.mark.parametrize("margin, shift", [(0.2, 0.1), (0.2, 1.0), (0.0, 0.5), (2.0, 0.1)])
def test_cross_modal_ranking_loss_matches_the_released_contrastive_loss(batch, margin, shift):
    h_img, h_txt, _, _ = batch
    got = cross_modal_ranking_loss(h_img, h_txt, margin, shift)
    assert got.item() == pytest.approx(ref_ranking(h_img, h_txt, margin, shift), rel=1e-10)


def test_ranking_masks_carry_no_gradient_and_margin_only_shifts_the_value(batch):
    """A margin large enough that every negative is 'near' leaves plain bidirectional InfoNCE (tau 1) + 2 m."""
    h_img, h_txt, _, _ = batch
    scores = h_img @ h_txt.T
    target = torch.arange(6)
    plain = (torch.nn.functional.cross_entropy(scores, target) + torch.nn.functional.cross_entropy(scores.T, target))
    assert cross_modal_ranking_loss(h_img, h_txt, 10.0, 0.3).item() == pytest.approx(plain.item() + 20.0, rel=1e-12)


def test_ucch_loss_weighs_its_terms_by_alpha(batch):
    h_img, h_txt, codes, rows = batch
    lc, lr = ref_nce(h_img, h_txt, codes[rows], 0.9), ref_ranking(h_img, h_txt, 0.2, 0.1)
    got = ucch_loss(h_img, h_txt, codes, rows, 0.7, 0.9, 0.2, 0.1).item()
    assert got == pytest.approx(0.7 * lc + 0.3 * lr, rel=1e-10)


def test_warm_up_keys_are_the_batch_signs_in_the_released_order(batch):
    h_img, h_txt, _, _ = batch
    bank = MemoryBank(20, 8).double()
    codes, rows = bank.keys(torch.tensor([9, 2, 4, 0, 7, 1]), h_img, h_txt, None)
    assert rows.shape == (6, 6)
    assert codes[rows].tolist() == ref_inbatch_keys(h_img, h_txt)


def test_momentum_keys_are_the_signs_of_the_own_row_then_uniform_draws(batch):
    h_img, h_txt, _, _ = batch
    bank = MemoryBank(30, 8, seed=1).double()
    bank.memory.copy_(torch.randn(30, 8, dtype=torch.float64))
    index = torch.tensor([3, 7, 0, 29, 12, 5])
    codes, rows = bank.keys(index, h_img, h_txt, bank.draw(6, 50, negatives_generator(2023, 5)))
    drawn = torch.randint(30, (6, 50), generator=negatives_generator(2023, 5))
    assert rows.shape == (6, 51) and rows[:, 0].tolist() == index.tolist() and torch.equal(rows[:, 1:], drawn)
    keys = codes[rows]
    for i in range(6):
        for j in range(51):
            assert keys[i, j].tolist() == [_sign(v) for v in bank.memory[rows[i, j]].tolist()]
    # the same (seed, iteration) draws the same rows; another iteration others
    assert torch.equal(bank.draw(6, 50, negatives_generator(2023, 5)), drawn)
    assert not torch.equal(bank.draw(6, 50, negatives_generator(2023, 6)), drawn)


@pytest.mark.parametrize("momentum", [0.4, 0.0])
def test_memory_update_is_the_released_momentum_rule(batch, momentum):
    h_img, h_txt, _, _ = batch
    bank = MemoryBank(10, 8, seed=3).double()
    before = bank.memory.clone()
    index = torch.tensor([9, 2, 4, 0, 7, 1])
    bank.update(index, h_img, h_txt, momentum)
    expected = torch.tensor(ref_update(before, index, h_img, h_txt, momentum), dtype=torch.float64)
    assert torch.allclose(bank.memory, expected, atol=1e-12)
    untouched = [3, 5, 6, 8]
    assert torch.equal(bank.memory[untouched], before[untouched])


def test_memory_starts_as_normalised_signs_of_a_shifted_gaussian():
    bank = MemoryBank(4000, 32, seed=0)
    values = bank.memory * math.sqrt(32)
    assert torch.allclose(values.abs(), torch.ones_like(values))  # ±1 / sqrt(bits)
    share = (values > 0).float().mean().item()  # sign(2 s z - s) = sign(z - 1/2): P(+1) = 0.3085
    assert share == pytest.approx(0.3085, abs=0.01)


def test_learning_rate_follows_the_released_multistep_schedule():
    assert [learning_rate(1e-4, e) for e in (0, 1, 20, 30)] == [1e-4] * 4
    assert learning_rate(1e-4, 31) == pytest.approx(1e-5) and learning_rate(1e-4, 61) == pytest.approx(1e-6)


def test_networks_have_the_released_widths_and_layers():
    cfg = hash_config("ucch", n_bits=32, hidden=8192)  # the released width (the default is narrower)
    with torch.device("meta"):  # the shapes alone: 8192 x 8192 weights are not drawn
        model = METHODS["ucch"].build_model(4096, 1386, cfg)
    assert isinstance(model, UcchHasher)
    widths = lambda net: [(m.in_features, m.out_features) for m in net if isinstance(m, torch.nn.Linear)]
    assert widths(model.img_head) == [(4096, 8192), (8192, 8192), (8192, 32)]
    assert widths(model.txt_head) == [(1386, 8192), (8192, 32)]
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    linear = METHODS["ucch"].build_model(12, 10, hash_config("ucch", hidden=0))
    assert widths(linear.img_head) == [(12, 64)] and widths(linear.txt_head) == [(10, 64)]


def test_defaults_are_the_published_mirflickr_settings_but_the_width():
    cfg = hash_config("ucch")
    assert (cfg.hidden, cfg.epochs, cfg.batch_size, cfg.lr_head, tuple(cfg.betas), cfg.dropout) == \
        (1024, 20, 256, 1e-4, (0.9, 0.999), 0.0)  # hidden: 8192 released, a named departure
    assert cfg.method_params == {"alpha": 0.7, "n_negatives": 4096, "temperature": 0.9, "momentum": 0.4,
                                 "margin": 0.2, "shift": 0.1, "warmup_epochs": 1, "img_layers": 3,
                                 "txt_layers": 2, "weight_decay": 1e-6, "clip_norm": 1.0}
    with pytest.raises(ValueError, match="alpha must be in"):
        hash_config("ucch", method_params={"alpha": 1.5})
    with pytest.raises(ValueError, match="a loss of its own, which uses no labels .*no use for supervised"):
        hash_config("ucch", supervised=True)


def test_ucch_learns_leak_free_codes_that_beat_random_ones(tiny):
    # small for tiny data: a narrower MLP, fewer negatives than its 320 training items, a larger step
    cfg = hash_config("ucch", n_bits=16, hidden=128, epochs=8, batch_size=64, lr_head=1e-3, device="cpu",
                      method_params={"n_negatives": 128})
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert "memory" not in "".join(model.state_dict())  # the bank is training state, not the model
    assert history.best_epoch is not None and len(history) == 8  # patience 0: every epoch
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    for direction in ("map_i2t", "map_t2i"):
        assert row[direction] > floor[direction] + 0.1, (row, floor)


def test_negatives_are_drawn_ahead_of_the_step_and_train_the_same(tiny, monkeypatch):
    """Each step's negatives are drawn on the step-ahead thread while the step before it runs (each epoch's
    first step draws its own), and training ends with the weights of drawing every step's in the step."""
    import threading

    from ucmfh.batches import StepAhead

    drawers = []
    draw = MemoryBank.draw
    monkeypatch.setattr(MemoryBank, "draw", lambda self, *args: drawers.append(threading.current_thread().name)
                        or draw(self, *args))
    cfg = hash_config("ucch", n_bits=16, hidden=32, epochs=3, batch_size=64, device="cpu", val_fraction=0.0,
                      method_params={"n_negatives": 32})
    ahead = fit_hashing(tiny, cfg, progress=False)[0].state_dict()
    steps = -(-len(tiny.train) // 64)
    assert len(drawers) == 2 * steps  # after the one warm-up epoch, each step's
    assert drawers.count("MainThread") == 2 and all(name.startswith("ucmfh-step-ahead") or name == "MainThread"
                                                     for name in drawers), drawers
    monkeypatch.setattr(StepAhead, "start", lambda self, work, batch: None)  # nothing ahead: each step its own
    drawers.clear()
    in_step = fit_hashing(tiny, cfg, progress=False)[0].state_dict()
    assert drawers == ["MainThread"] * 2 * steps
    assert all(torch.equal(in_step[key], value) for key, value in ahead.items())



def test_negatives_drawn_several_steps_ahead_train_the_same(tiny, monkeypatch):
    """On a GPU the negatives are drawn up to several steps ahead, each step's on a thread (a generator of its
    own for each step, ucmfh.trainer._Run.steps_ahead): the same weights as drawing one step ahead."""
    import threading

    import ucmfh.trainer as trainer_module
    from ucmfh.batches import StepAhead

    cfg = hash_config("ucch", n_bits=16, hidden=32, epochs=3, batch_size=32, device="cpu", val_fraction=0.0,
                      method_params={"n_negatives": 32})
    one = fit_hashing(tiny, cfg, progress=False)[0].state_dict()
    in_flight, start = [], StepAhead.start

    def counted(self, work, batch):
        start(self, work, batch)
        in_flight.append(len(self.pending))

    drawers, draw = [], MemoryBank.draw
    monkeypatch.setattr(MemoryBank, "draw", lambda self, *args: drawers.append(threading.current_thread().name)
                        or draw(self, *args))
    monkeypatch.setattr(StepAhead, "start", counted)
    monkeypatch.setattr(trainer_module._Run, "steps_ahead", lambda self: 4)
    four = fit_hashing(tiny, cfg, progress=False)[0].state_dict()
    assert max(in_flight) == 4  # four steps' draws begun at once
    assert drawers.count("MainThread") == 2  # each epoch's first step after the warm-up: the rest drawn ahead
    assert all(torch.equal(four[key], value) for key, value in one.items())