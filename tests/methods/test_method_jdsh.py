"""Method 'jdsh': its target and loss against a loop-level transcription of the released code
(KaiserLew/JDSH ``JDSH.py``: ``cal_similarity_matrix``, ``cal_loss``), and that it learns on tiny data."""
from __future__ import annotations

import math
from typing import List

import pytest
import torch

from ucmfh.methods import build_method, fit_hashing, hash_config
from ucmfh.methods.jdsh import dsdw, jdsh_loss, joint_modal_similarity
from ucmfh.evaluation import evaluate_hashing, random_codes_map

from conftest import dot, float_rows, unit

# ----------------------------------------------------------------------------
# Slow reference: plain loops in float64, line by line from JDSH.py.
# ----------------------------------------------------------------------------

MIR = dict(alpha=0.5, beta=0.1, lamb=0.4, mu=1.4, MIN=-0.52, MAX=0.68, ALPHA=2, LOC_LEFT=-0.49, SCALE_LEFT=0.019,
           BETA=4, LOC_RIGHT=-0.49, SCALE_RIGHT=0.088, L1=0.1, L2=0.2)  # config/JDSH_MIRFlickr.json


def ref_similarity(img, txt, c) -> List[List[float]]:
    """cal_similarity_matrix: S_I, S_T = 2 cos - 1; S_high = norm(S_I) norm(S_T)ᵀ;
    S_ = α S_I + β S_T + λ (S_high + S_highᵀ) / 2; S_[S_ < left] = ...; S_[S_ > right] = ...; S = S_ μ."""
    fi, ft = [unit(r) for r in float_rows(img)], [unit(r) for r in float_rows(txt)]
    m = len(fi)
    s_i = [[dot(fi[a], fi[b]) * 2 - 1 for b in range(m)] for a in range(m)]
    s_t = [[dot(ft[a], ft[b]) * 2 - 1 for b in range(m)] for a in range(m)]
    ni, nt = [unit(r) for r in s_i], [unit(r) for r in s_t]
    high = [[dot(ni[a], nt[b]) for b in range(m)] for a in range(m)]
    s = [[c["alpha"] * s_i[a][b] + c["beta"] * s_t[a][b] + c["lamb"] * (high[a][b] + high[b][a]) / 2
          for b in range(m)] for a in range(m)]
    left = c["LOC_LEFT"] - c["ALPHA"] * c["SCALE_LEFT"]
    right = c["LOC_RIGHT"] + c["BETA"] * c["SCALE_RIGHT"]
    for a in range(m):  # the first masked assignment, over the whole matrix
        for b in range(m):
            if s[a][b] < left:
                s[a][b] = (1 + c["L1"] * math.exp(-(s[a][b] - c["MIN"]))) * s[a][b]
    for a in range(m):  # then the second, on the matrix the first one left
        for b in range(m):
            if s[a][b] > right:
                s[a][b] = (1 + c["L2"] * math.exp(s[a][b] - c["MAX"])) * s[a][b]
    return [[v * c["mu"] for v in row] for row in s]


def ref_loss(code_i, code_t, s, intra) -> float:
    """cal_loss: loss1 = mse(BI_BI, S); loss2 = mse(BI_BT, S) + mse(BT_BI, S) - (B_I * B_T).sum(1).mean();
    loss3 = mse(BT_BT, S); loss = INTRA loss1 + loss2 + INTRA loss3."""
    bi, bt = [unit(r) for r in float_rows(code_i)], [unit(r) for r in float_rows(code_t)]
    m = len(bi)

    def mse(x, y) -> float:
        return sum((dot(x[a], y[b]) - s[a][b]) ** 2 for a in range(m) for b in range(m)) / (m * m)

    diag = sum(dot(bi[a], bt[a]) for a in range(m)) / m
    return intra * mse(bi, bi) + (mse(bi, bt) + mse(bt, bi) - diag) + intra * mse(bt, bt)


def target(img, txt, c) -> torch.Tensor:
    """The method's own target (``Jdsh.target``) of the released config ``c``, its names mapped to the method's
    parameters: the mapping (ALPHA is ``k_left``, BETA ``k_right``...) is under test too (an audit's find: this
    helper rebuilt the target from the functions, and the method's wiring of them went unchecked)."""
    from ucmfh.methods.jdsh import Jdsh

    names = {"alpha": "alpha", "beta": "beta", "lamb": "lamb", "mu": "mu", "loc_left": "LOC_LEFT",
             "scale_left": "SCALE_LEFT", "k_left": "ALPHA", "loc_right": "LOC_RIGHT", "scale_right": "SCALE_RIGHT",
             "k_right": "BETA", "s_min": "MIN", "s_max": "MAX", "l1": "L1", "l2": "L2"}
    return Jdsh().target({**Jdsh.params, **{mine: c[theirs] for mine, theirs in names.items()}})(img, txt)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(11)
    img = torch.rand(10, 12, generator=g) ** 3  # non-negative and spread, like fc7 features
    txt = (torch.rand(10, 8, generator=g) > 0.6).float()  # a bag of words
    txt[:, 0] = 1.0  # no empty text
    codes = torch.tanh(2.0 * torch.randn(2, 10, 16, generator=g))
    return img, txt, codes[0], codes[1]


# the published thresholds, and ones that put entries on both sides (and where the first weighting
# pushes entries past `right`: LOC_LEFT > 0)
CONFIGS = [MIR, {**MIR, "LOC_LEFT": -0.1, "LOC_RIGHT": -0.1, "SCALE_RIGHT": 0.02},
           {**MIR, "LOC_LEFT": 0.5, "SCALE_LEFT": 0.05, "LOC_RIGHT": 0.0, "SCALE_RIGHT": 0.05, "L1": 2.0}]


@pytest.mark.parametrize("c", CONFIGS)
def test_the_target_matches_the_released_loops(batch, c):
    img, txt, _, _ = batch
    want = torch.tensor(ref_similarity(img, txt, c), dtype=torch.float64)
    got = target(img, txt, c)
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert torch.allclose(got, got.T, atol=1e-6)


def _bounds(c) -> tuple:
    return c["LOC_LEFT"] - c["ALPHA"] * c["SCALE_LEFT"], c["LOC_RIGHT"] + c["BETA"] * c["SCALE_RIGHT"]


def test_the_test_batch_reaches_both_weightings_and_their_order(batch):
    """CONFIGS[1] weights entries on both sides; under CONFIGS[2] the first weighting carries entries
    past `right`, where the released code's order (the second mask on the updated matrix) matters."""
    s = joint_modal_similarity(batch[0], batch[1], 0.5, 0.1, 0.4)
    left, right = _bounds(CONFIGS[1])
    assert (s < left).any() and (s > right).any()
    c = CONFIGS[2]
    left, right = _bounds(c)
    once = torch.where(s < left, (1 + c["L1"] * torch.exp(-(s - c["MIN"]))) * s, s)
    assert ((s <= right) & (once > right)).any()


@pytest.mark.parametrize("intra", [0.1, 0.0, 1.0])
def test_jdsh_loss_matches_the_released_loops(batch, intra):
    img, txt, code_i, code_t = batch
    s = target(img, txt, MIR)
    got = jdsh_loss(code_i, code_t, s, intra)
    assert got.item() == pytest.approx(ref_loss(code_i, code_t, ref_similarity(img, txt, MIR), intra), rel=1e-5)


def test_dsdw_leaves_the_middle_alone_and_pushes_the_tails_out():
    s = torch.tensor([[-0.9, -0.3], [0.1, 0.9]])
    out = dsdw(s, left=-0.5, right=0.0, s_min=-0.52, s_max=0.68, l1=0.1, l2=0.2)
    assert out[0, 1] == s[0, 1]  # between left and right: unchanged
    assert out[0, 0] < s[0, 0] and out[1, 0] > s[1, 0] and out[1, 1] > s[1, 1]


def test_the_defaults_are_the_released_mirflickr_settings():
    cfg = hash_config("jdsh")
    p = cfg.method_params
    assert (p["alpha"], p["beta"], p["lamb"], p["mu"], p["intra"], p["l1"], p["l2"]) == (0.5, 0.1, 0.4, 1.4, 0.1, 0.1, 0.2)
    assert (p["loc_left"], p["scale_left"], p["k_left"], p["s_min"]) == (-0.49, 0.019, 2.0, -0.52)
    assert (p["loc_right"], p["scale_right"], p["k_right"], p["s_max"]) == (-0.49, 0.088, 4.0, 0.68)
    assert (p["lr_img"], p["momentum"], p["weight_decay"], p["sim_inputs"]) == (0.01, 0.9, 5e-4, "raw")
    assert (cfg.epochs, cfg.batch_size, cfg.lr_head, cfg.hidden, cfg.dropout) == (300, 32, 0.01, 4096, 0.0)
    assert (cfg.relaxation, cfg.beta_schedule, cfg.beta_step_epochs) == ("tanh", "step", 1)
    model = build_method("jdsh").build_model(48, 32, hash_config("jdsh", n_bits=16, hidden=64))
    assert [type(m).__name__ for m in model.img_head.net] == ["Linear"]
    with pytest.raises(ValueError, match="mu must be > 0"):
        hash_config("jdsh", method_params={"mu": 0.0})


@pytest.fixture
def one_thread():
    """Batches of 32 are too small to share between threads: on a loaded machine two threads wait on
    each other for most of the run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_jdsh_learns_on_tiny_data(tiny, one_thread):
    cfg = hash_config("jdsh", n_bits=16, hidden=64, epochs=20, batch_size=32, device="cpu", patience=0)
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history.best_epoch is not None and history[-1] < history[0]
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    assert row["map_i2t"] > floor["map_i2t"] + 0.05 and row["map_t2i"] > floor["map_t2i"] + 0.05, (row, floor)
