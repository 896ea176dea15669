"""Method 'daeh' against slow transcriptions of the released code (reresearcher/DAEH: daeh.py, model_loader.py),
and that it learns on tiny data."""
from __future__ import annotations

import math
from typing import List

import numpy as np
import pytest
import torch
from scipy.spatial.distance import pdist, squareform
from scipy.stats import norm

from ucmfh.methods import fit_hashing, hash_config
from ucmfh.methods.daeh import (
    DaehTeacher, batch_similarity, daeh_loss, distance_split, mutual_information, mutual_informations, pair_loss,
)
from ucmfh.evaluation import evaluate_hashing, random_codes_map

# ----------------------------------------------------------------------------
# Slow references: numpy / scipy and loops in float64, each line a line of the released code.
# ----------------------------------------------------------------------------


def ref_generate_similarity_matrix(cos_dist: np.ndarray, alpha: float, beta: float):
    """daeh.generate_similarity_matrix, line by line; also returns (max_cos, left_std, right_std)."""
    max_cnt, max_cos, interval, cur = 0, 0, 1.0 / 100, 0
    for _ in range(100):
        cur_cnt = np.sum((cos_dist > cur) & (cos_dist < cur + interval))
        if max_cnt < cur_cnt:
            max_cnt, max_cos = cur_cnt, cur
        cur += interval
    flat = cos_dist.reshape((-1, 1))
    left, right = flat[np.where(flat <= max_cos)[0]], flat[np.where(flat > max_cos)[0]]
    left = np.concatenate([left, 2 * max_cos - left])
    right = np.concatenate([2 * max_cos - right, right])
    left_mean, left_std = norm.fit(left)
    right_mean, right_std = norm.fit(right)
    s = (cos_dist < (left_mean - alpha * left_std)) * 1.0 + (cos_dist > (right_mean + beta * right_std)) * -1.0
    return s, (max_cos, left_std, right_std)


def ref_distance_fusion(img: np.ndarray, txt: np.ndarray, alpha: float, beta: float, a1: float) -> np.ndarray:
    """daeh.distance_fusion, with the text decided by the image's rule (the departure named in daeh.py)."""
    s_vgg, _ = ref_generate_similarity_matrix(squareform(pdist(img, metric="cosine")), alpha, beta)
    s_txt, _ = ref_generate_similarity_matrix(squareform(pdist(txt, metric="cosine")), alpha, beta)
    s_near = 1.0 * (s_vgg + s_txt == 2)
    s_far = -1.0 * (((s_vgg == -1) + (s_txt == -1)) > 0)
    s = s_near + s_far
    confident = ((s == 1.0) + (s == -1.0)) == 1
    f_i = img / np.linalg.norm(img, axis=1, keepdims=True)
    f_t = txt / np.linalg.norm(txt, axis=1, keepdims=True)
    s_pair = 2.0 * (a1 * f_t @ f_t.T + (1 - a1) * f_i @ f_i.T) - 1
    s_pair[confident] = 0
    return s_pair + s


def ref_mutual_information(x: np.ndarray, y: np.ndarray, sigma1=1.0, sigma2=1.0, alpha=2.0) -> float:
    """model_loader.guassianMatrix and mutual_information, with loops for the kernel."""
    n = x.shape[0]

    def kernel(v, sigma):
        g = v @ v.T
        k = np.array([[math.exp((1 / (2 * sigma * sigma)) * ((2 * g[i, j] - g[j, j]) - g[j, j])) for j in range(n)]
                      for i in range(n)])
        return k

    def entropy(k):
        lam = np.linalg.eigvals(k)
        parts = np.abs(np.stack([lam.real, lam.imag], 1))
        return (1 / (1 - alpha)) * math.log(np.sum(parts ** alpha))

    k_x, k_y = kernel(x, sigma1) / n, kernel(y, sigma2) / n
    return entropy(k_x) + entropy(k_y) - entropy(k_x * k_y * n)


def _rows(x: torch.Tensor) -> List[List[float]]:
    out = []
    for r in x.double().tolist():
        n = math.sqrt(sum(v * v for v in r))
        out.append([v / n for v in r])
    return out


def _cos(a, b):
    return [[sum(x * y for x, y in zip(u, v)) for v in b] for u in a]


def _mse(a, b) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum((x - y) ** 2 for x, y in pairs) / len(pairs)


def ref_cross_loss(code_i, code_t, s) -> float:
    """daeh.cross_loss: diagonal to 1.5, off-diagonal to S, BT_BT to BI_BI."""
    b_i, b_t = _rows(code_i), _rows(code_t)
    n = len(b_i)
    bi_bt = _cos(b_i, b_t)
    pair = sum((bi_bt[k][k] - 1.5) ** 2 for k in range(n)) / n
    off = [[0.0 if i == j else 1.0 for j in range(n)] for i in range(n)]
    dis = _mse([[bi_bt[i][j] * off[i][j] for j in range(n)] for i in range(n)],
               [[s[i][j] * off[i][j] for j in range(n)] for i in range(n)])
    return pair + dis + _mse(_cos(b_t, b_t), _cos(b_i, b_i))


def ref_process_loss(f, g, tea, code, s, w_tri, w_tea, w_cross, gamma) -> float:
    """daeh.process's loss: tri_loss + gamma * code_loss / B + ceshi_cross * the MI-chosen cross_loss."""
    tri = w_tri * ref_cross_loss(f, g, s) + w_tea * (ref_cross_loss(f, tea, s) + ref_cross_loss(g, tea, s))
    code_loss = sum((x - y) ** 2 for rx, ry in zip(code.double().tolist(), tea.double().tolist())
                    for x, y in zip(rx, ry))
    s_np = np.array(s)
    if ref_mutual_information(s_np, f.double().numpy()) > ref_mutual_information(s_np, g.double().numpy()):
        enhance = ref_cross_loss(tea, g, s)
    else:
        enhance = ref_cross_loss(f, tea, s)
    return tri + gamma * code_loss / len(s) + w_cross * enhance


# ----------------------------------------------------------------------------


@pytest.fixture
def features():
    """Non-negative features (as the released VGG features): cosine distances in [0, 1], a clear mode."""
    g = torch.Generator().manual_seed(0)
    latent = torch.rand(60, 4, generator=g, dtype=torch.float64)
    img = latent @ torch.rand(4, 9, generator=g, dtype=torch.float64) + 0.3 * torch.rand(60, 9, generator=g,
                                                                                            dtype=torch.float64)
    txt = latent @ torch.rand(4, 6, generator=g, dtype=torch.float64) + 0.3 * torch.rand(60, 6, generator=g,
                                                                                            dtype=torch.float64)
    return img, txt


def test_distance_split_is_the_released_mode_and_gaussian_fits(features):
    img, _ = features
    _, (m, sigma_l, sigma_r) = ref_generate_similarity_matrix(squareform(pdist(img.numpy(), metric="cosine")), 2, 2)
    got = distance_split(img, chunk=7)
    assert got[0] == pytest.approx(m, abs=1e-12)
    assert got[1] == pytest.approx(sigma_l, rel=1e-9) and got[2] == pytest.approx(sigma_r, rel=1e-9)


@pytest.mark.parametrize("alpha, beta, a1", [(2.0, 2.0, 0.3), (0.5, 0.5, 0.7)])
def test_batch_similarity_is_the_batch_block_of_the_released_matrix(features, alpha, beta, a1):
    img, txt = features
    want = ref_distance_fusion(img.numpy(), txt.numpy(), alpha, beta, a1)
    assert (want == 1).any() and (want == -1).any() and ((want != 1) & (want != -1)).any()  # all three cases
    index = torch.randperm(60, generator=torch.Generator().manual_seed(1))[:18]
    got = batch_similarity(img[index], txt[index], distance_split(img), distance_split(txt), alpha, beta, a1)
    assert torch.allclose(got, torch.from_numpy(want)[index][:, index], atol=1e-9)


@pytest.mark.parametrize("rows, n_bits, seed", [(12, 8, 2), (18, 64, 4), (18, 128, 5)])
def test_mutual_information_is_the_released_renyi_estimate(features, rows, n_bits, seed):
    """The closed form against the released eigenvalues (numpy's ``eigvals`` of the looped kernel): on rows of
    any matrix, and on a batch's ``S`` with codes of DAEH's lengths."""
    g = torch.Generator().manual_seed(seed)
    if rows == 12:
        s = torch.rand(12, 12, generator=g, dtype=torch.float64)
    else:
        img, txt = features
        index = torch.randperm(60, generator=g)[:rows]
        s = batch_similarity(img[index], txt[index], distance_split(img), distance_split(txt), 2.0, 2.0, 0.3)
    codes = [torch.tanh(2.0 * torch.randn(rows, n_bits, generator=g, dtype=torch.float64)) for _ in range(2)]
    want = [ref_mutual_information(s.numpy(), c.numpy()) for c in codes]
    assert float(mutual_information(s, codes[0])) == pytest.approx(want[0], rel=1e-8)
    assert mutual_informations(s, codes).tolist() == pytest.approx(want, rel=1e-8)


def test_the_loss_is_the_released_objective(features):
    img, txt = features
    g = torch.Generator().manual_seed(3)
    index = torch.arange(18)
    s = batch_similarity(img[index], txt[index], distance_split(img), distance_split(txt), 2.0, 2.0, 0.3)
    f, gg, tea, code = (torch.tanh(torch.randn(18, 8, generator=g, dtype=torch.float64)) for _ in range(4))
    want = ref_process_loss(f, gg, tea, code, s.tolist(), 4.0, 1.0, 0.1, 1e-3)
    assert float(daeh_loss(f, gg, tea, code, s, 4.0, 1.0, 0.1, 1e-3)) == pytest.approx(want, rel=1e-10)
    # both branches of the enhancement are met: the one chosen depends on which student S explains better
    assert float(pair_loss(tea, gg, s)) == pytest.approx(ref_cross_loss(tea, gg, s.tolist()), rel=1e-10)
    assert float(pair_loss(f, tea, s)) == pytest.approx(ref_cross_loss(f, tea, s.tolist()), rel=1e-10)


def test_the_teacher_is_the_released_heads():
    teacher = DaehTeacher(10, 16)
    shapes = [tuple(m.weight.shape) for m in teacher.modules() if isinstance(m, torch.nn.Linear)]
    assert shapes == [(16, 10), (256, 16), (512, 256), (1000, 512), (512, 1000), (256, 512), (16, 256)]
    code, rebuilt = teacher(torch.randn(5, 10))
    assert code.shape == rebuilt.shape == (5, 16) and (code.abs() <= 1).all()


def test_daeh_learns_on_tiny_data(tiny):
    cfg = hash_config("daeh", n_bits=16, hidden=256, epochs=10, device="cpu", val_fraction=0.2, patience=0)
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history.best_epoch is not None and len(history) == 10
    row = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")[0]
    floor = random_codes_map(tiny, 16)
    assert row["map_i2t"] > floor["map_i2t"] + 0.1 and row["map_t2i"] > floor["map_t2i"] + 0.1


def test_daeh_refuses_parameters_out_of_range():
    with pytest.raises(ValueError, match="a1"):
        hash_config("daeh", method_params={"a1": 1.5})
    with pytest.raises(ValueError, match="momentum"):
        hash_config("daeh", method_params={"momentum": 1.0})
