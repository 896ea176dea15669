"""Method 'dgcpn': its loss, its neighbour graph and its training step against slow transcriptions of the
released code (github.com/Atmegal/DGCPN, train_div.py), the graph built without the validation items,
and learning on tiny data."""
from __future__ import annotations

import copy
import math
from typing import List

import pytest
import torch

import ucmfh.methods.dgcpn as dgcpn
from ucmfh.distributed import current_group
from ucmfh.methods import fit_hashing, hash_config
from ucmfh.methods.dgcpn import NeighbourGraph, dgcpn_loss, dgcpn_step
from ucmfh.models.hashing import FeatureHasher
from ucmfh.evaluation import evaluate_hashing, random_codes_map
from ucmfh.selection import validation_split

# ----------------------------------------------------------------------------
# Slow references: loops over entries in float64, read off train_div.py.
# ----------------------------------------------------------------------------


def _unit_rows(x: torch.Tensor) -> List[List[float]]:
    rows = []
    for r in x.detach().double().tolist():
        n = math.sqrt(sum(v * v for v in r))
        rows.append([v / n for v in r] if n > 0 else r)
    return rows


def _cos(a: List[List[float]], b: List[List[float]]) -> List[List[float]]:
    return [[sum(x * y for x, y in zip(u, v)) for v in b] for u in a]


def _mse(a: List[List[float]], b: List[List[float]]) -> float:
    flat = [(x - y) ** 2 for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(flat) / len(flat)


def ref_loss_cal(code_img, code_txt, s, k=1.5, dw=1.0, cw=1.0) -> float:
    """``Session.loss_cal``: pair, the three masked preserving terms, the four consistency terms."""
    b_i, b_t = _unit_rows(code_img), _unit_rows(code_txt)
    ii, tt, it = _cos(b_i, b_i), _cos(b_t, b_t), _cos(b_i, b_t)
    n = len(b_i)
    s = s.double().tolist()
    loss_pair = sum((it[i][i] - k) ** 2 for i in range(n)) / n
    off = [[0.0 if i == j else 1.0 for j in range(n)] for i in range(n)]

    def masked(m):
        return [[m[i][j] * off[i][j] for j in range(n)] for i in range(n)]

    loss_dis = _mse(masked(tt), masked(s)) + _mse(masked(it), masked(s)) + _mse(masked(ii), masked(s))
    it_t = [[it[j][i] for j in range(n)] for i in range(n)]
    loss_cons = _mse(it, ii) + _mse(it, tt) + _mse(ii, tt) + _mse(it, it_t)
    return loss_pair + dw * loss_dis + cw * loss_cons


def ref_cal_similarity(img, txt, a1, a2, knn_number, scale) -> torch.Tensor:
    """``Session.cal_similarity`` over the whole training set, row by row: zero each row's ``knn_number``
    smallest entries of S_pair and its largest, normalise the row, then S = 2((1-a2) S_pair + a2 scale P Pᵀ) - 1."""
    f_i, f_t = _unit_rows(img), _unit_rows(txt)
    s_i, s_t = _cos(f_i, f_i), _cos(f_t, f_t)
    n = len(f_i)
    s_pair = [[a1 * s_t[i][j] + (1 - a1) * s_i[i][j] for j in range(n)] for i in range(n)]
    pro = []
    for i in range(n):
        order = sorted(range(n), key=lambda j: s_pair[i][j])  # ascending, as pro.sort()
        row = list(s_pair[i])
        for j in order[:knn_number] + order[-1:]:
            row[j] = 0.0
        total = sum(row)
        pro.append([v / total for v in row])
    out = [[2 * ((1 - a2) * s_pair[i][j] + a2 * scale * sum(pro[i][m] * pro[j][m] for m in range(n))) - 1
            for j in range(n)] for i in range(n)]
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------


@pytest.mark.parametrize("binary", ["none", "img", "txt"])
def test_the_loss_is_the_released_loss_cal(binary):
    g = torch.Generator().manual_seed(0)
    img, txt = torch.tanh(torch.randn(7, 12, generator=g)), torch.tanh(torch.randn(7, 12, generator=g))
    if binary == "img":
        img = img.sign()
    elif binary == "txt":
        txt = txt.sign()
    s = torch.rand(7, 7, generator=g) * 2 - 1
    got = dgcpn_loss(img.double(), txt.double(), s.double(), 1.5, 0.7, 1.3)
    assert float(got) == pytest.approx(ref_loss_cal(img, txt, s, 1.5, 0.7, 1.3), rel=1e-10)
    assert float(dgcpn_loss(img, txt, s)) == pytest.approx(ref_loss_cal(img, txt, s), rel=1e-5)


def test_the_loss_has_gradients_and_its_minimum_where_the_codes_fit_the_target():
    g = torch.Generator().manual_seed(1)
    codes = torch.randn(5, 8, generator=g).sign()
    unit = codes / codes.norm(dim=1, keepdim=True)
    target = unit @ unit.T  # codes that fit their target exactly leave the pair term alone: (1 - 1.5)^2
    assert float(dgcpn_loss(codes, codes, target)) == pytest.approx(0.25, abs=1e-6)
    img = torch.randn(5, 8, generator=g, requires_grad=True)
    dgcpn_loss(torch.tanh(img), codes, target).backward()
    assert img.grad is not None and img.grad.abs().sum() > 0


@pytest.mark.parametrize("knn", [4, 9, 30])
def test_the_graph_gives_the_released_similarity_matrix(knn):
    """The released full-matrix S (paper's K = N - knn_number) at the entries of any batch; with knn = N,
    every other item is a neighbour (knn_number = 0)."""
    g = torch.Generator().manual_seed(2)
    n = 30
    img, txt = torch.rand(n, 10, generator=g), torch.rand(n, 6, generator=g)  # non-negative, as the release's
    full = ref_cal_similarity(img, txt, a1=0.2, a2=0.3, knn_number=n - knn, scale=2.0 * knn)
    graph = NeighbourGraph.build(img, txt, knn, 0.2)
    assert graph.index.shape == (n, min(knn, n) - 1)
    batch = torch.tensor([3, 17, 0, 29, 8])
    got = graph.similarity(batch, 0.3, 2.0 * knn)
    torch.testing.assert_close(got.double(), full[batch][:, batch], atol=1e-5, rtol=1e-5)


def test_the_graph_found_by_chunks_equals_the_graph_found_at_once():
    g = torch.Generator().manual_seed(3)
    img, txt = torch.rand(50, 10, generator=g), torch.rand(50, 6, generator=g)
    a, b = NeighbourGraph.build(img, txt, 12, 0.01, chunk=7), NeighbourGraph.build(img, txt, 12, 0.01, chunk=1024)
    assert torch.equal(a.index, b.index) and torch.allclose(a.weights, b.weights)
    assert not (a.index == torch.arange(50)[:, None]).any()  # no item is its own neighbour
    torch.testing.assert_close(a.weights.sum(1), torch.ones(50))


def test_a_step_is_the_released_two_optimiser_step():
    """dgcpn_step with one SGD over both heads = Session.train's three steps with opt_I and opt_T."""
    cfg = hash_config("dgcpn", n_bits=8, hidden=16, dropout=0.0, device="cpu")
    torch.manual_seed(4)
    model = FeatureHasher(6, 5, cfg.n_bits, cfg.hidden, cfg.dropout)
    released = copy.deepcopy(model)
    img, txt, target = torch.randn(9, 6), torch.randn(9, 5), torch.rand(9, 9) * 2 - 1
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
    optimizer = torch.optim.SGD(model.parameters(), **sgd)
    opt_i = torch.optim.SGD(released.img_head.parameters(), **sgd)
    opt_t = torch.optim.SGD(released.txt_head.parameters(), **sgd)
    for _ in range(3):
        dgcpn_step(model, optimizer, img, txt, target, dgcpn_loss, current_group(), 9, torch.device("cpu"))

        h_i, h_t = released.logits(img, txt)
        loss = dgcpn_loss(torch.tanh(h_i), torch.tanh(h_t), target)
        opt_i.zero_grad()
        opt_t.zero_grad()
        loss.backward(retain_graph=True)
        opt_i.step()
        opt_t.step()
        h_i, h_t = released.logits(img, txt)
        code_i, code_t = torch.tanh(h_i), torch.tanh(h_t)
        loss_i = dgcpn_loss(code_i, code_t.sign().detach(), target)
        opt_i.zero_grad()
        loss_i.backward(retain_graph=True)
        opt_i.step()
        loss_t = dgcpn_loss(code_i.sign().detach(), code_t, target)
        opt_t.zero_grad()
        loss_t.backward()
        opt_t.step()
    a, b = model.state_dict(), released.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_the_graph_is_built_from_the_training_items_left_after_the_validation_split(tiny, monkeypatch):
    seen = {}
    build = NeighbourGraph.build.__func__

    def spy(cls, img, txt, *args, **kwargs):
        seen["img"] = img.clone()
        return build(cls, img, txt, *args, **kwargs)

    monkeypatch.setattr(dgcpn.NeighbourGraph, "build", classmethod(spy))
    cfg = hash_config("dgcpn", n_bits=16, hidden=32, epochs=1, batch_size=64, device="cpu", val_fraction=0.2)
    fit_hashing(tiny, cfg, progress=False)
    rest, val = validation_split(tiny.train, 0.2, cfg.seed)
    assert torch.equal(seen["img"], rest.img)
    assert not (seen["img"][:, None, :] == val.img[None]).all(-1).any()  # no validation item in it


def test_dgcpn_learns_on_tiny_data(tiny):
    """On the tiny set (320 training items), a graph of 20 neighbours; the release's loss, steps and SGD."""
    cfg = hash_config("dgcpn", n_bits=16, hidden=128, epochs=8, batch_size=32, device="cpu",
                      method_params={"knn": 20})
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history.best_epoch is not None
    [row] = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")
    floor = random_codes_map(tiny, 16)
    for direction in ("map_i2t", "map_t2i"):
        assert row[direction] > floor[direction] + 0.1, (row, floor)


def test_dgcpn_refuses_parameters_it_cannot_use():
    for bad in ({"knn": 1}, {"text_weight": 1.5}, {"coherence_weight": -0.1}, {"momentum": 1.0},
                {"scale_ratio": -1.0}):
        with pytest.raises(ValueError, match="method 'dgcpn'"):
            hash_config("dgcpn", method_params=bad)
    with pytest.raises(ValueError, match="method 'dgcpn' fixes relaxation, whatever is asked"):
        hash_config("dgcpn", relaxation="sign")  # refused, not dropped without a word
    cfg = hash_config("dgcpn", relaxation="sign", drop_unused=True)
    assert cfg.relaxation == "tanh" and cfg.lr_head == 0.005 and cfg.batch_size == 32 and cfg.dropout == 0.5
