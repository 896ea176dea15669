"""Method 'djsrh': its target and loss against a loop-level transcription of the released code
(zs-zhong/DJSRH ``train.py``, ``Session.train``), its model, and that it learns on tiny data."""
from __future__ import annotations

from typing import List

import pytest
import torch

from ucmfh.methods import fit_hashing, hash_config
from ucmfh.methods.djsrh import djsrh_loss, joint_semantics, scaled_cosines
from ucmfh.evaluation import evaluate_hashing, random_codes_map

from conftest import dot, float_rows, unit

# ----------------------------------------------------------------------------
# Slow reference: plain loops in float64, line by line from Session.train.
# ----------------------------------------------------------------------------


def ref_target(img, txt, beta, eta, mu) -> List[List[float]]:
    """F_I = F.normalize(F_I); S_I = F_I F_Iᵀ * 2 - 1 (and S_T); S_tilde = β S_I + (1 - β) S_T;
    S = (1 - η) S_tilde + η S_tilde S_tilde / BATCH_SIZE; S = S * μ."""
    fi, ft = [unit(r) for r in float_rows(img)], [unit(r) for r in float_rows(txt)]
    m = len(fi)
    s_i = [[dot(fi[a], fi[b]) * 2 - 1 for b in range(m)] for a in range(m)]
    s_t = [[dot(ft[a], ft[b]) * 2 - 1 for b in range(m)] for a in range(m)]
    tilde = [[beta * s_i[a][b] + (1 - beta) * s_t[a][b] for b in range(m)] for a in range(m)]
    return [[mu * ((1 - eta) * tilde[a][b] + eta * sum(tilde[a][k] * tilde[k][b] for k in range(m)) / m)
             for b in range(m)] for a in range(m)]


def ref_loss(code_i, code_t, s, lambda1, lambda2) -> float:
    """B = F.normalize(code); loss = λ1 mse(B_I B_Iᵀ, S) + mse(B_I B_Tᵀ, S) + λ2 mse(B_T B_Tᵀ, S)."""
    bi, bt = [unit(r) for r in float_rows(code_i)], [unit(r) for r in float_rows(code_t)]
    m = len(bi)

    def mse(x, y) -> float:
        return sum((dot(x[a], y[b]) - s[a][b]) ** 2 for a in range(m) for b in range(m)) / (m * m)

    return lambda1 * mse(bi, bi) + mse(bi, bt) + lambda2 * mse(bt, bt)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(7)
    img = torch.rand(9, 12, generator=g)  # non-negative, like fc7 features and bags of words
    txt = torch.rand(9, 6, generator=g) * (torch.rand(9, 6, generator=g) > 0.5)
    txt[0, 0] = 1.0  # no all-zero text
    codes = torch.tanh(2.0 * torch.randn(2, 9, 16, generator=g))
    return img, txt, codes[0], codes[1]


@pytest.mark.parametrize("beta,eta,mu", [(0.9, 0.4, 1.5), (0.3, 0.0, 1.0), (0.6, 1.0, 0.7)])
def test_joint_semantics_matches_the_released_loops(batch, beta, eta, mu):
    img, txt, _, _ = batch
    got = joint_semantics(img, txt, beta, eta, mu)
    assert torch.allclose(got.double(), torch.tensor(ref_target(img, txt, beta, eta, mu), dtype=torch.float64), atol=1e-5)
    assert torch.allclose(got, got.T, atol=1e-6)


@pytest.mark.parametrize("lambda1,lambda2", [(0.1, 0.1), (0.3, 0.3), (1.0, 0.0)])
def test_djsrh_loss_matches_the_released_loops(batch, lambda1, lambda2):
    img, txt, code_i, code_t = batch
    s = joint_semantics(img, txt)
    got = djsrh_loss(code_i, code_t, s, lambda1, lambda2)
    want = ref_loss(code_i, code_t, ref_target(img, txt, 0.9, 0.4, 1.5), lambda1, lambda2)
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_scaled_cosines_maps_non_negative_features_to_minus_one_one(batch):
    s = scaled_cosines(batch[0])
    assert torch.allclose(s.diagonal(), torch.ones(9)) and s.min() >= -1 and s.max() <= 1 + 1e-6
    assert torch.allclose(scaled_cosines(3 * batch[0]), s, atol=1e-6)  # scale-free


def test_perfect_codes_for_a_target_give_zero_loss():
    codes = torch.tensor([[1.0, 1, -1, -1], [1, 1, -1, -1], [-1, -1, 1, 1]])
    b = codes / 2
    assert djsrh_loss(codes, codes, b @ b.T, 0.1, 0.1).item() == pytest.approx(0.0, abs=1e-7)


def test_the_defaults_are_the_released_mirflickr_settings():
    cfg = hash_config("djsrh")
    assert cfg.method_params == {"beta": 0.9, "eta": 0.4, "mu": 1.5, "lambda1": 0.1, "lambda2": 0.1, "lr_img": 0.001,
                                 "momentum": 0.9, "weight_decay": 5e-4, "sim_inputs": "raw"}
    assert (cfg.epochs, cfg.batch_size, cfg.lr_head, cfg.hidden, cfg.dropout) == (80, 32, 0.01, 4096, 0.0)
    assert (cfg.relaxation, cfg.beta_schedule, cfg.beta_step_epochs) == ("tanh", "step", 1)  # tanh(sqrt(epoch+1) h)
    with pytest.raises(ValueError, match="sim_inputs"):
        hash_config("djsrh", method_params={"sim_inputs": "other"})
    with pytest.raises(ValueError, match="beta and eta"):
        hash_config("djsrh", method_params={"eta": 1.5})


def test_the_image_side_is_one_linear_layer_and_the_text_side_an_mlp(tiny):
    from ucmfh.methods import build_method
    model = build_method("djsrh").build_model(48, 32, hash_config("djsrh", n_bits=16, hidden=64))
    assert [type(m).__name__ for m in model.img_head.net] == ["Linear"]
    assert [type(m).__name__ for m in model.txt_head.net] == ["Linear", "ReLU", "Dropout", "Linear"]


@pytest.fixture
def one_thread():
    """Batches of 32 are too small to share between threads: on a loaded machine two threads wait on
    each other for most of the run (measured: 50 s instead of 1 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("sim_inputs", ["raw", "centred"])
def test_djsrh_learns_on_tiny_data(tiny, sim_inputs, one_thread):
    cfg = hash_config("djsrh", n_bits=16, hidden=64, epochs=20, batch_size=32, device="cpu", patience=0,
                      method_params={"sim_inputs": sim_inputs})
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history.best_epoch is not None and history[-1] < history[0]
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    assert row["map_i2t"] > floor["map_i2t"] + 0.05 and row["map_t2i"] > floor["map_t2i"] + 0.05, (row, floor)
