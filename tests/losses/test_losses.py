"""Every loss against a slow loop-over-pairs reference, closed forms, gradients, invariances, extremes."""
from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import pytest
import torch

from ucmfh.losses import (
    LOSSES,
    BalancedContrastiveLoss,
    InfoNCELoss,
    NTXentLoss,
    TripletLoss,
    WeightedPairwiseLoss,
    build_loss,
)

# ----------------------------------------------------------------------------
# Slow references: plain Python loops over pairs in float64, from docs/reference.md §4.
# ----------------------------------------------------------------------------


def _unit(v: torch.Tensor) -> torch.Tensor:
    n = float(v.norm())
    return v / n if n > 0 else v


def _ids(b: int, ids: Optional[torch.Tensor]) -> List[int]:
    return list(range(b)) if ids is None else [int(i) for i in ids]


def _rows(x: torch.Tensor, unit: bool = True) -> List[torch.Tensor]:
    return [_unit(r) if unit else r for r in x.detach().double()]


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(sum(float(x) * float(y) for x, y in zip(a, b)))


def ref_original(img, txt, ids=None, temperature=0.5) -> float:
    b = img.shape[0]
    r = _rows(img) + _rows(txt)
    idk = _ids(b, ids) * 2
    total = 0.0
    for k in range(2 * b):
        p = (k + b) % (2 * b)
        denom = 0.0
        for l in range(2 * b):
            if l == k or (idk[l] == idk[k] and l != p):
                continue
            denom += math.exp(_dot(r[k], r[l]) / temperature)
        total += -math.log(math.exp(_dot(r[k], r[p]) / temperature) / denom)
    return total / (2 * b)


def _cross(img, txt, unit=True):
    u, v = _rows(img, unit), _rows(txt, unit)
    return [[_dot(ui, vj) for vj in v] for ui in u]


def ref_balanced(img, txt, ids=None, temperature=0.5, symmetric=False) -> float:
    b = img.shape[0]
    s = [[x / temperature for x in row] for row in _cross(img, txt)]
    idl = _ids(b, ids)
    pos = [[idl[i] == idl[j] for j in range(b)] for i in range(b)]
    s1 = sum(sum(row) for row in pos)
    s0 = b * b - s1
    w_pos = b * b / s1
    w_neg = b * b / s0 if s0 else 0.0

    def direction(score):  # score(i, j): query i, candidate j
        total = 0.0
        for i in range(b):
            neg = sum(math.exp(score(i, j)) for j in range(b) if not pos[i][j])
            e = math.exp(score(i, i))
            total += w_pos * -math.log(e / (e + w_neg * neg))
        return total / b

    i2t = direction(lambda i, j: s[i][j])
    if not symmetric:
        return i2t
    return 0.5 * (i2t + direction(lambda i, j: s[j][i]))


def ref_pairwise(img, txt, ids=None, labels=None, alpha=10.0, normalize=True) -> float:
    b = img.shape[0]
    dots = _cross(img, txt, unit=normalize)
    idl = _ids(b, ids)
    sim = [[0] * b for _ in range(b)]
    for i in range(b):
        for j in range(b):
            shared = labels is not None and _dot(labels[i].double(), labels[j].double()) > 0
            sim[i][j] = 1 if (idl[i] == idl[j] or shared) else 0
    s1 = sum(map(sum, sim))
    s0 = b * b - s1
    total = 0.0
    for i in range(b):
        for j in range(b):
            dp = alpha * dots[i][j]
            ell = math.log(1 + math.exp(dp)) - sim[i][j] * dp
            w = b * b / s1 if sim[i][j] else b * b / s0
            total += w * ell
    return total / (b * b)


def ref_infonce(img, txt, ids=None, temperature=0.07) -> float:
    b = img.shape[0]
    s = [[x / temperature for x in row] for row in _cross(img, txt)]
    idl = _ids(b, ids)
    i2t = t2i = 0.0
    for i in range(b):
        keep = [j for j in range(b) if j == i or idl[j] != idl[i]]
        i2t += -math.log(math.exp(s[i][i]) / sum(math.exp(s[i][j]) for j in keep))
        t2i += -math.log(math.exp(s[i][i]) / sum(math.exp(s[j][i]) for j in keep))
    return 0.5 * (i2t + t2i) / b


def ref_triplet(img, txt, ids=None, margin=0.2, max_violation=False, normalize=True) -> float:
    b = img.shape[0]
    s = _cross(img, txt, unit=normalize)
    idl = _ids(b, ids)
    anchor = []
    for i in range(b):
        p = [s[i][j] for j in range(b) if idl[j] == idl[i]]
        anchor.append(sum(p) / len(p))
    total = 0.0
    for i in range(b):  # image i against the texts j that are not its positives
        costs = [max(0.0, margin + s[i][j] - anchor[i]) for j in range(b) if idl[j] != idl[i]]
        total += (max(costs) if costs else 0.0) if max_violation else sum(costs)
    for j in range(b):  # text j against the images i that are not its positives
        costs = [max(0.0, margin + s[i][j] - anchor[j]) for i in range(b) if idl[i] != idl[j]]
        total += (max(costs) if costs else 0.0) if max_violation else sum(costs)
    return total


# ----------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------
REFERENCES = {
    "original": ref_original,
    "balanced": ref_balanced,
    "pairwise": ref_pairwise,
    "infonce": ref_infonce,
    "triplet": ref_triplet,
}

# (registry name, hyper-parameters): every option of every loss appears once
CONFIGS = [
    ("original", {}),
    ("original", {"temperature": 0.1}),
    ("balanced", {}),
    ("balanced", {"temperature": 0.2, "symmetric": True}),
    ("pairwise", {}),
    ("pairwise", {"alpha": 3.0, "normalize": False}),
    ("infonce", {}),
    ("infonce", {"temperature": 0.3, "learnable": True}),
    ("triplet", {}),
    ("triplet", {"margin": 0.5, "max_violation": True}),
    ("triplet", {"normalize": False}),
]
CONFIG_IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}" for n, p in CONFIGS]

# losses whose value does not change when img and txt swap roles
SYMMETRIC = [
    ("original", {}),
    ("balanced", {"symmetric": True}),
    ("pairwise", {}),
    ("infonce", {}),
    ("triplet", {}),
    ("triplet", {"max_violation": True}),
]


def reference(name: str, img, txt, ids=None, labels=None, **hp) -> float:
    hp = {k: v for k, v in hp.items() if k != "learnable"}  # a learnable τ starts at its given value
    if name == "pairwise":
        return REFERENCES[name](img, txt, ids=ids, labels=labels, **hp)
    return REFERENCES[name](img, txt, ids=ids, **hp)


def exact(loss):
    """The loss in float64, a learnable log τ included (a float32 log τ is off by ~1e-8)."""
    loss = loss.double()
    if getattr(loss, "log_temperature", None) is not None:
        with torch.no_grad():
            loss.log_temperature.fill_(math.log(loss._fixed_temperature))
    return loss


def batch(b: int, d: int = 6, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=dtype)
    txt = (img + 0.8 * torch.randn(b, d, generator=g, dtype=dtype)) if b else img
    ids = torch.randint(0, max(1, b // 2), (b,), generator=g)  # repeats: multi-positive rows
    labels = (torch.rand(b, 4, generator=g) < 0.3).to(torch.uint8)
    return img, txt, ids, labels


# ----------------------------------------------------------------------------
# Against the references
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("b", [2, 5, 9])
@pytest.mark.parametrize("with_ids", [False, True])
def test_matches_reference(name, hp, b, with_ids):
    img, txt, ids, _ = batch(b, seed=b)
    ids = ids if with_ids else None
    got = exact(build_loss(name, **hp))(img.double(), txt.double(), ids=ids)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(reference(name, img, txt, ids=ids, **hp), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("hp", [{}, {"alpha": 2.0, "normalize": False}])
@pytest.mark.parametrize("b", [2, 5, 9])
@pytest.mark.parametrize("with_ids", [False, True])
def test_pairwise_with_labels_matches_reference(hp, b, with_ids):
    img, txt, ids, labels = batch(b, seed=10 + b)
    ids = ids if with_ids else None
    got = WeightedPairwiseLoss(**hp)(img.double(), txt.double(), ids=ids, labels=labels)
    assert got.item() == pytest.approx(ref_pairwise(img, txt, ids=ids, labels=labels, **hp), rel=1e-9)


@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
def test_float32_close_to_reference(name, hp):
    img, txt, ids, _ = batch(16, d=32, seed=3)
    got = build_loss(name, **hp)(img, txt, ids=ids)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(reference(name, img, txt, ids=ids, **hp), rel=1e-5)


# ----------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("b", [2, 7])
def test_collinear_embeddings_closed_forms(b):
    # every img and txt row points the same way: every cosine is 1
    v = torch.randn(1, 5, dtype=torch.float64)
    img = v.repeat(b, 1) * torch.arange(1, b + 1, dtype=torch.float64)[:, None]
    txt = 3 * v.repeat(b, 1)
    tau, m, a = 0.5, 0.2, 10.0
    assert NTXentLoss(tau)(img, txt).item() == pytest.approx(math.log(2 * b - 1))
    assert InfoNCELoss(tau)(img, txt).item() == pytest.approx(math.log(b))
    # w_neg (B-1) = B, w_pos = B
    assert BalancedContrastiveLoss(tau)(img, txt).item() == pytest.approx(b * math.log(1 + b))
    assert BalancedContrastiveLoss(tau, symmetric=True)(img, txt).item() == pytest.approx(b * math.log(1 + b))
    assert TripletLoss(m)(img, txt).item() == pytest.approx(2 * m * b * (b - 1))
    assert TripletLoss(m, max_violation=True)(img, txt).item() == pytest.approx(2 * m * b)
    # mean over similar pairs log(1+e^-a) plus mean over dissimilar ones log(1+e^a)
    want = math.log1p(math.exp(-a)) + math.log1p(math.exp(a))
    assert WeightedPairwiseLoss(a)(img, txt).item() == pytest.approx(want)


@pytest.mark.parametrize("b", [2, 6])
def test_orthogonal_pairs_closed_forms(b):
    # img_i = txt_i = e_i: positives have cosine 1, everything else 0
    e = torch.eye(b, dtype=torch.float64)
    tau, m, a = 0.25, 0.2, 10.0
    x = math.exp(1 / tau)
    assert NTXentLoss(tau)(e, e).item() == pytest.approx(math.log((x + 2 * (b - 1)) / x))
    assert InfoNCELoss(tau)(e, e).item() == pytest.approx(math.log((x + b - 1) / x))
    w_neg = b / (b - 1)
    assert BalancedContrastiveLoss(tau)(e, e).item() == pytest.approx(b * math.log((x + w_neg * (b - 1)) / x))
    assert TripletLoss(m)(e, e).item() == 0.0
    assert TripletLoss(1.5)(e, e).item() == pytest.approx(2 * b * (b - 1) * 0.5)
    want = math.log1p(math.exp(-a)) + math.log(2)  # similar pairs at dp = a, dissimilar at dp = 0
    assert WeightedPairwiseLoss(a)(e, e).item() == pytest.approx(want)


def test_balanced_weights_at_batch_128():
    # docs/reference.md §4: w_pos = 128, w_neg = 128/127 for B = 128 with identical rows (all logits equal)
    v = torch.ones(128, 4, dtype=torch.float64)
    got = BalancedContrastiveLoss(0.5)(v, v).item()
    assert got == pytest.approx(128 * math.log(1 + 128 / 127 * 127))


def test_pairwise_one_kind_only_has_no_nan():
    img, txt, _, _ = batch(6, seed=4)
    all_similar = torch.ones(6, 3, dtype=torch.uint8)
    got = WeightedPairwiseLoss()(img.double(), txt.double(), labels=all_similar)
    assert torch.isfinite(got)
    dp = 10 * torch.nn.functional.normalize(img.double()) @ torch.nn.functional.normalize(txt.double()).T
    assert got.item() == pytest.approx(torch.nn.functional.softplus(-dp).mean().item())
    # one id for all: again only similar pairs
    assert torch.isfinite(WeightedPairwiseLoss()(img, txt, ids=torch.zeros(6, dtype=torch.long)))


def test_one_id_for_the_whole_batch_has_nothing_to_push_apart():
    img, txt, _, _ = batch(5, seed=5)
    ids = torch.full((5,), 7)
    for name in ["original", "balanced", "infonce", "triplet"]:
        assert build_loss(name)(img, txt, ids=ids).item() == pytest.approx(0.0, abs=1e-6), name


# ----------------------------------------------------------------------------
# Multi-positive: items that share an id are never negatives
# ----------------------------------------------------------------------------
def _duplicated(b: int = 4, d: int = 6):
    img, txt, _, labels = batch(b, d, seed=21)
    ids = torch.arange(b)
    dup = lambda x: torch.cat([x, x])  # noqa: E731
    return (img.double(), txt.double(), ids, labels), (dup(img).double(), dup(txt).double(), dup(ids), dup(labels))


def test_duplicates_add_no_triplet_penalty():
    (img, txt, ids, _), (dimg, dtxt, dids, _) = _duplicated()
    # every surviving hinge term of X appears 4 times (2 copies of the row × 2 of the negative) …
    assert TripletLoss()(dimg, dtxt, ids=dids).item() == pytest.approx(4 * TripletLoss()(img, txt).item())
    # … and each row's hardest negative is the same, over twice the rows
    hard = TripletLoss(max_violation=True)
    assert hard(dimg, dtxt, ids=dids).item() == pytest.approx(2 * hard(img, txt).item())
    # without ids each copy is a negative of the other at the full margin: +m per row and per column
    b = img.shape[0]
    assert TripletLoss()(dimg, dtxt).item() == pytest.approx(4 * TripletLoss()(img, txt).item() + 4 * b * 0.2)


def test_duplicates_add_no_pairwise_penalty():
    (img, txt, ids, labels), (dimg, dtxt, dids, dlabels) = _duplicated()
    loss = WeightedPairwiseLoss()
    assert loss(dimg, dtxt, ids=dids).item() == pytest.approx(loss(img, txt, ids=ids).item())
    assert loss(dimg, dtxt, ids=dids, labels=dlabels).item() == pytest.approx(loss(img, txt, labels=labels).item())
    assert loss(dimg, dtxt).item() != pytest.approx(loss(img, txt).item())


def test_duplicates_only_double_the_real_negatives():
    # [X; X] with shared ids: each row keeps its own pair as the positive, and
    # only X's real negatives (now twice each) in the denominator.
    (img, txt, _, _), (dimg, dtxt, dids, _) = _duplicated()
    tau = 0.5
    zi, zt = torch.nn.functional.normalize(img), torch.nn.functional.normalize(txt)
    b = img.shape[0]
    off = ~torch.eye(b, dtype=torch.bool)

    def contrast(s_pos, s_neg_rows, w=1.0):  # mean −log(e^pos / (e^pos + w·2·Σ e^neg))
        neg = torch.stack([r.exp().sum() for r in s_neg_rows])
        return (-(s_pos.exp() / (s_pos.exp() + w * 2 * neg)).log()).mean().item()

    sit = zi @ zt.T / tau
    sii, stt = zi @ zi.T / tau, zt @ zt.T / tau
    rows_img = [torch.cat([sit[i][off[i]], sii[i][off[i]]]) for i in range(b)]
    rows_txt = [torch.cat([sit[:, i][off[i]], stt[i][off[i]]]) for i in range(b)]
    want = 0.5 * (contrast(sit.diagonal(), rows_img) + contrast(sit.diagonal(), rows_txt))
    assert NTXentLoss(tau)(dimg, dtxt, ids=dids).item() == pytest.approx(want)

    want = 0.5 * (
        contrast(sit.diagonal(), [sit[i][off[i]] for i in range(b)])
        + contrast(sit.diagonal(), [sit[:, i][off[i]] for i in range(b)])
    )
    assert InfoNCELoss(tau)(dimg, dtxt, ids=dids).item() == pytest.approx(want)

    # 2B rows, 2 positives each: S1 = 4B, S0 = 4B² − 4B, so w_pos = B and w_neg = B/(B−1) as for X
    want = b * contrast(sit.diagonal(), [sit[i][off[i]] for i in range(b)], w=b / (b - 1))
    assert BalancedContrastiveLoss(tau)(dimg, dtxt, ids=dids).item() == pytest.approx(want)


@pytest.mark.parametrize("name", ["original", "balanced", "infonce", "triplet"])
def test_separated_duplicates_cost_nothing_only_with_ids(name):
    # one-hot items, each twice: perfectly separated except for the copies
    e = torch.eye(4).repeat(2, 1)
    ids = torch.arange(4).repeat(2)
    hp = {} if name == "triplet" else {"temperature": 0.02}
    loss = build_loss(name, **hp)
    assert loss(e, e, ids=ids).item() == pytest.approx(0.0, abs=1e-6)
    assert loss(e, e).item() > 0.1  # the copies would be pushed apart


# ----------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("with_ids", [False, True])
def test_gradcheck(name, hp, with_ids):
    img, txt, ids, labels = batch(5, d=4, seed=8, dtype=torch.float64)
    img.requires_grad_(True)
    txt.requires_grad_(True)
    loss = build_loss(name, **hp).double()
    ids = ids if with_ids else None
    labels = labels if name == "pairwise" else None
    assert torch.autograd.gradcheck(lambda a, b: loss(a, b, ids=ids, labels=labels), (img, txt))


def test_learnable_temperature_gets_a_gradient_and_is_clamped():
    loss = InfoNCELoss(temperature=0.1, learnable=True, min_temperature=0.05, max_temperature=0.5)
    assert [n for n, _ in loss.named_parameters()] == ["log_temperature"]
    img, txt, _, _ = batch(6, seed=9)
    loss(img, txt).backward()
    assert loss.log_temperature.grad is not None and loss.log_temperature.grad.item() != 0
    log_t = torch.tensor(math.log(0.1), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: torch.func.functional_call(loss, {"log_temperature": t}, (img.double(), txt.double())), (log_t,)
    )
    with torch.no_grad():
        loss.log_temperature.fill_(math.log(1e-4))
    assert loss.temperature.item() == pytest.approx(0.05)
    assert loss(img, txt).item() == pytest.approx(InfoNCELoss(0.05)(img, txt).item(), rel=1e-5)
    assert InfoNCELoss(0.07).temperature.item() == pytest.approx(0.07)
    assert list(InfoNCELoss(0.07).parameters()) == []


# ----------------------------------------------------------------------------
# Invariances
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
def test_row_permutation_invariance(name, hp):
    img, txt, ids, labels = batch(8, seed=12, dtype=torch.float64)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    loss = build_loss(name, **hp)
    for i in (None, ids):
        lab = labels if name == "pairwise" else None
        a = loss(img, txt, ids=i, labels=lab)
        b = loss(img[perm], txt[perm], ids=None if i is None else i[perm], labels=None if lab is None else lab[perm])
        assert a.item() == pytest.approx(b.item(), rel=1e-12)


@pytest.mark.parametrize("name,hp", SYMMETRIC)
def test_swapping_modalities_where_symmetric(name, hp):
    img, txt, ids, labels = batch(7, seed=13, dtype=torch.float64)
    loss = build_loss(name, **hp)
    lab = labels if name == "pairwise" else None
    assert loss(img, txt, labels=lab).item() == pytest.approx(loss(txt, img, labels=lab).item(), rel=1e-12)
    if name != "triplet":  # docs/reference.md §4: the t2i anchor is the row mean, so triplet with ids is not symmetric
        assert loss(img, txt, ids=ids, labels=lab).item() == pytest.approx(
            loss(txt, img, ids=ids, labels=lab).item(), rel=1e-12
        )


def test_balanced_image_rows_only_is_not_symmetric():
    img, txt, _, _ = batch(7, seed=13, dtype=torch.float64)
    loss = BalancedContrastiveLoss()
    assert loss(img, txt).item() != pytest.approx(loss(txt, img).item())


def test_scale_invariance_of_normalised_losses():
    img, txt, ids, _ = batch(6, seed=14, dtype=torch.float64)
    scale = torch.rand(6, 1, dtype=torch.float64) * 10 + 0.1
    for name in LOSSES:
        loss = build_loss(name)
        assert loss(img * scale, txt, ids=ids).item() == pytest.approx(loss(img, txt, ids=ids).item(), rel=1e-10)


# ----------------------------------------------------------------------------
# Bad arguments
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,hp",
    [
        ("original", {"temperature": 0.0}),
        ("original", {"temperature": -0.5}),
        ("original", {"temperature": float("nan")}),
        ("original", {"temperature": float("inf")}),
        ("balanced", {"temperature": 0.0}),
        ("balanced", {"symmetric": "yes"}),
        ("pairwise", {"alpha": 0.0}),
        ("pairwise", {"alpha": float("nan")}),
        ("pairwise", {"normalize": 1}),
        ("infonce", {"temperature": -1.0}),
        ("infonce", {"temperature": 2.0, "learnable": True}),
        ("infonce", {"temperature": 0.001, "learnable": True}),
        ("infonce", {"min_temperature": 0.0}),
        ("infonce", {"learnable": "no"}),
        ("infonce", {"min_temperature": 1.0, "max_temperature": 0.01}),  # refused learnable or not
        ("triplet", {"margin": -0.1}),
        ("triplet", {"margin": float("inf")}),
        ("triplet", {"max_violation": None}),
        ("triplet", {"temperature": 0.5}),  # not a triplet hyper-parameter
        ("original", {"batch_size": 128}),  # losses never take the batch size
        ("nonexistent", {}),
    ],
)
def test_bad_hyperparameters_raise(name, hp):
    with pytest.raises(ValueError):
        build_loss(name, **hp)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_bad_inputs_raise(name):
    loss = build_loss(name)
    with pytest.raises(ValueError):
        loss(torch.randn(1, 4), torch.randn(1, 4))  # B = 1
    with pytest.raises(ValueError):
        loss(torch.randn(4, 4), torch.randn(4, 3))
    with pytest.raises(ValueError):
        loss(torch.randn(4), torch.randn(4))
    with pytest.raises(ValueError):
        loss(torch.randn(4, 4), torch.randn(4, 4), ids=torch.arange(3))
    with pytest.raises(ValueError):
        loss(torch.randn(4, 4), torch.randn(4, 4), labels=torch.ones(3, 2))
    with pytest.raises(TypeError, match=r"img must be a torch.Tensor, got ndarray"):  # numpy's failed deep inside
        loss(np.ones((4, 4), np.float32), torch.randn(4, 4))
    with pytest.raises(TypeError, match=r"ids must be a torch.Tensor, got list"):
        loss(torch.randn(4, 4), torch.randn(4, 4), ids=[0, 1, 2, 3])


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_float64_beside_float32_is_computed_in_float64(name):
    """One matmul refused a float64 img beside a float32 txt, in four losses of five."""
    img, txt = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8)
    loss = build_loss(name)
    assert loss(img, txt).item() == pytest.approx(loss(img, txt.double()).item(), rel=1e-12)


def test_numpy_scalars_are_numbers_and_soft_targets_of_another_shape_are_refused():
    assert build_loss("original", temperature=np.float32(0.5)).temperature == 0.5  # np.float64 passed, float32 not
    with pytest.raises(ValueError, match=r"temperature must be a number"):
        build_loss("original", temperature=np.bool_(True))
    from ucmfh.losses.infonce import soft_infonce

    with pytest.raises(ValueError, match=r"targets \[B, B\], got \(5, 8\), \(5, 8\) and \(4, 4\)"):
        soft_infonce(torch.randn(5, 8), torch.randn(5, 8), torch.eye(4), 0.1)


# ----------------------------------------------------------------------------
# Numerical extremes and mixed precision
# ----------------------------------------------------------------------------
def _extreme_cases():
    g = torch.Generator().manual_seed(15)
    x = torch.randn(6, 8, generator=g)
    zero_rows = x.clone()
    zero_rows[[1, 4]] = 0
    return {
        "identical": (x[:1].repeat(6, 1), x[:1].repeat(6, 1)),
        "zero-rows": (zero_rows, x),
        "all-zero": (torch.zeros(6, 8), torch.zeros(6, 8)),
        "huge": (x * 1e18, x.flip(0) * 1e18),
        "tiny": (x * 1e-30, x * 1e-30),
    }


EXTREME_CONFIGS = [
    ("original", {"temperature": 0.01}),
    ("balanced", {"temperature": 0.01, "symmetric": True}),
    ("pairwise", {"alpha": 100.0}),
    ("infonce", {"temperature": 0.01}),
    ("infonce", {"temperature": 0.01, "learnable": True}),
    ("triplet", {"max_violation": True}),
    ("triplet", {}),
]


@pytest.mark.parametrize("name,hp", EXTREME_CONFIGS)
@pytest.mark.parametrize("case", sorted(_extreme_cases()))
@pytest.mark.parametrize("with_ids", [False, True])
def test_finite_loss_and_gradients_at_extremes(name, hp, case, with_ids):
    img, txt = (t.clone().requires_grad_(True) for t in _extreme_cases()[case])
    ids = torch.tensor([0, 0, 1, 2, 2, 3]) if with_ids else None
    loss = build_loss(name, **hp)(img, txt, ids=ids, labels=torch.eye(6, 3) if name == "pairwise" else None)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(img.grad).all() and torch.isfinite(txt.grad).all()


def test_zero_rows_stay_zero_in_the_similarities():
    # a zero row has cosine 0 with everything: the orthogonal closed form again
    z = torch.cat([torch.eye(3), torch.zeros(1, 3)]).double()  # 4 items, the last one zero
    x = math.exp(1 / 0.5)
    # 6 one-hot rows: partner at cosine 1, 6 negatives at cosine 0; 2 zero rows: 7 terms at cosine 0
    want = (6 * math.log((x + 6) / x) + 2 * math.log(7)) / 8
    assert NTXentLoss(0.5)(z, z).item() == pytest.approx(want)


@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_and_half_inputs_compute_in_float32(name, hp, dtype):
    g = torch.Generator().manual_seed(16)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(10, 8, generator=g)
    y = torch.randn(10, 8, generator=g)
    loss = build_loss(name, **hp)
    ids = torch.tensor([0, 0, 1, 2, 3, 4, 5, 5, 6, 7])
    try:
        with torch.autocast("cpu", dtype=dtype):
            img, txt = lin(x), lin(y)
            got = loss(img, txt, ids=ids)
    except RuntimeError as err:  # an older torch without CPU autocast for this dtype
        pytest.skip(str(err))
    assert img.dtype == dtype  # the features really are half precision …
    assert got.dtype == torch.float32  # … the loss is not
    want = loss(img.float(), txt.float(), ids=ids)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    got.backward()
    assert all(torch.isfinite(p.grad).all() for p in lin.parameters())
    assert loss(img.detach(), txt.detach(), ids=ids).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name,hp", CONFIGS, ids=CONFIG_IDS)
def test_cuda_matches_cpu(name, hp):
    img, txt, ids, labels = batch(12, seed=17)
    loss = build_loss(name, **hp)
    want = loss(img, txt, ids=ids, labels=labels).item()
    got = loss.cuda()(img.cuda(), txt.cuda(), ids=ids, labels=labels).item()  # ids/labels may stay on the CPU
    assert got == pytest.approx(want, rel=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert torch.isfinite(loss(img.cuda(), txt.cuda(), ids=ids.cuda()))
