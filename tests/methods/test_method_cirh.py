"""Method 'cirh' against slow loop-level transcriptions of the released code (XizeWu/CIRH, my_opt.py), and
that it learns on tiny data."""
from __future__ import annotations

import math
from typing import List

import pytest
import torch

from ucmfh.methods import fit_hashing, hash_config
from ucmfh.methods.cirh import (
    CirhNet, batch_similarity, head_loss, neighbour_mix, net_loss, row_thresholds,
)
from ucmfh.evaluation import evaluate_hashing, random_codes_map

# ----------------------------------------------------------------------------
# Slow references: lists and loops in float64, each line a line of my_opt.PCIRH.
# ----------------------------------------------------------------------------


def _unit(row: List[float]) -> List[float]:
    n = math.sqrt(sum(v * v for v in row))
    return [v / n for v in row] if n > 0 else row


def _dot(a: List[float], b: List[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _cos_matrix(x: torch.Tensor, y: torch.Tensor) -> List[List[float]]:
    u, v = [_unit(r) for r in x.double().tolist()], [_unit(r) for r in y.double().tolist()]
    return [[_dot(a, b) for b in v] for a in u]


def ref_cal_similarity(img: torch.Tensor, txt: torch.Tensor, k: int, a1: float, a2: float) -> List[List[float]]:
    """cal_similarity over the whole split: S1, its K lowest per row zeroed, S2, S."""
    n = img.shape[0]
    s_i, s_t = _cos_matrix(img, img), _cos_matrix(txt, txt)
    s1 = [[a1 * s_i[i][j] + (1 - a1) * s_t[i][j] for j in range(n)] for i in range(n)]
    for i in range(n):
        for j in sorted(range(n), key=lambda j: s1[i][j])[:k]:  # S1.sort(), the first top_size columns
            s1[i][j] = 0.0
    s2 = [[2.0 / (1 + math.exp(-s1[i][j])) - 1 + (1.0 if i == j else 0.0) for j in range(n)] for i in range(n)]
    s2 = [[(s2[i][j] + s2[j][i]) / 2 for j in range(n)] for i in range(n)]
    return [[a2 * s1[i][j] + (1 - a2) * s2[i][j] for j in range(n)] for i in range(n)]


def ref_nn_mix(x: torch.Tensor, s: List[List[float]]) -> List[List[float]]:
    """NN_select (sort ascending, columns [-4:-1], the first two) and 0.7 x + 0.2 x[ind2] + 0.1 x[ind1]."""
    rows, out = x.double().tolist(), []
    for i in range(len(rows)):
        order = sorted(range(len(rows)), key=lambda j: s[i][j])
        ind1, ind2 = order[-4:-1][0], order[-4:-1][1]
        out.append([0.7 * a + 0.2 * b + 0.1 * c for a, b, c in zip(rows[i], rows[ind2], rows[ind1])])
    return out


def _mse(a: List[List[float]], b: List[List[float]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum((x - y) ** 2 for x, y in pairs) / len(pairs)


def _sign(a: List[List[float]]) -> List[List[float]]:
    return [[(v > 0) - (v < 0) for v in r] for r in a]


def ref_net_loss(h_img, h_txt, h, dec_img, dec_txt, img_mix, txt_mix, s, lambda1, lambda2) -> float:
    """loss_CCR + loss_method (loss_ACR + loss_DIS)."""
    t = lambda x: x.double().tolist()  # noqa: E731
    ccr = lambda1 * (_mse(t(dec_img), t(img_mix)) + _mse(t(dec_txt), t(txt_mix)))
    acr = lambda2 * sum(_mse(s, _cos_matrix(x, x)) for x in (h_img, h_txt, h))
    return ccr + acr + _mse(t(h), _sign(t(h)))


def ref_head_loss(u_img, u_txt, codes, s, beta) -> float:
    """loss_f1 + beta * loss_f2 of train_Hashfunc."""
    t = lambda x: x.double().tolist()  # noqa: E731
    f1 = _mse(t(u_img), t(codes)) + _mse(t(u_txt), t(codes)) + _mse(t(u_img), t(u_txt))
    f2 = (_mse(_cos_matrix(u_img, u_txt), s) + _mse(_cos_matrix(u_img, u_img), s)
          + _mse(_cos_matrix(u_txt, u_txt), s))
    return f1 + beta * f2


# ----------------------------------------------------------------------------


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    n, d_img, d_txt = 30, 7, 5
    img = torch.nn.functional.normalize(torch.randn(n, d_img, generator=g, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(torch.randn(n, d_txt, generator=g, dtype=torch.float64), dim=1)
    index = torch.randperm(n, generator=g)[:12]
    return img, txt, index


@pytest.mark.parametrize("k, a1, a2", [(18, 0.6, 0.6), (0, 0.1, 0.3), (29, 0.5, 0.5)])
def test_batch_similarity_is_the_batch_block_of_the_released_whole_matrix(batch, k, a1, a2):
    img, txt, index = batch
    want = torch.tensor(ref_cal_similarity(img, txt, k, a1, a2), dtype=torch.float64)[index][:, index]
    got = batch_similarity(img[index], txt[index], row_thresholds(img, txt, a1, k, chunk=7)[index], a1, a2)
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("tied", [False, True])
def test_row_thresholds_are_midway_between_the_k_th_and_k_plus_first_smallest(batch, tied):
    img, txt, _ = batch
    if tied:  # one-hot features: every similarity is exactly 0, 0.4, 0.6 or 1, so most k-th values are tied
        n = len(img)
        img = torch.nn.functional.one_hot(torch.arange(n) % 4, 7).double()
        txt = torch.nn.functional.one_hot(torch.arange(n) % 3, 5).double()
    s1 = 0.6 * img @ img.T + 0.4 * txt @ txt.T
    for k in range(1, len(img)):
        want = (s1.kthvalue(k, dim=1).values + s1.kthvalue(k + 1, dim=1).values) / 2
        assert torch.allclose(row_thresholds(img, txt, 0.6, k, chunk=7), want, atol=1e-12, rtol=0)
    if tied:  # both branches were taken: k-th and k+1-th equal in some rows, apart in others
        gap = s1.kthvalue(15, dim=1).values != s1.kthvalue(16, dim=1).values
        assert gap.any() and not gap.all()


def test_neighbour_mix_takes_the_third_and_fourth_most_similar(batch):
    img, txt, index = batch
    # few zeroed entries, so that no tie at 0 makes the order of the third and fourth arbitrary
    s = batch_similarity(img[index], txt[index], row_thresholds(img, txt, 0.6, 6)[index], 0.6, 0.6)
    want = torch.tensor(ref_nn_mix(img[index], s.tolist()), dtype=torch.float64)
    assert torch.allclose(neighbour_mix(img[index], s), want, atol=1e-12)
    tiny = neighbour_mix(img[:3], s[:3, :3])  # under 4 items: the last-ranked stands in for the missing one
    assert tiny.shape == (3, img.shape[1]) and torch.isfinite(tiny).all()


def test_the_losses_are_the_released_formulas(batch):
    img, txt, index = batch
    g = torch.Generator().manual_seed(1)
    b, bits = len(index), 6
    s = batch_similarity(img[index], txt[index], row_thresholds(img, txt, 0.6, 18)[index], 0.6, 0.6)
    h_img, h_txt = torch.randn(b, bits, generator=g, dtype=torch.float64), torch.randn(b, bits, generator=g,
                                                                                       dtype=torch.float64)
    h = torch.tanh(torch.randn(b, bits, generator=g, dtype=torch.float64))
    dec_img, dec_txt = torch.randn_like(img[index]), torch.randn_like(txt[index])
    img_mix, txt_mix = neighbour_mix(img[index], s), neighbour_mix(txt[index], s)
    got = net_loss(h_img, h_txt, h, dec_img, dec_txt, img_mix, txt_mix, s, 10.0, 1.0)
    want = ref_net_loss(h_img, h_txt, h, dec_img, dec_txt, img_mix, txt_mix, s.tolist(), 10.0, 1.0)
    assert math.isclose(float(got), want, rel_tol=1e-10)
    u_img, u_txt = torch.tanh(h_img), torch.tanh(h_txt)
    got = head_loss(u_img, u_txt, torch.sign(h), s, 0.01)
    assert math.isclose(float(got), ref_head_loss(u_img, u_txt, torch.sign(h), s.tolist(), 0.01), rel_tol=1e-10)


def test_the_network_sees_both_modalities_and_the_heads_one(batch):
    """MyNet's joint code changes with the text; it only trains. The hash functions alone give the codes."""
    torch.manual_seed(0)
    img, txt = batch[0].float(), batch[1].float()
    net = CirhNet(img.shape[1], txt.shape[1], 8, width=16)
    s = batch_similarity(img, txt, row_thresholds(img, txt, 0.6, 18), 0.6, 0.6)
    h_img, h_txt, h, dec_img, dec_txt = net(img, txt, s)
    assert h.shape == (len(img), 8) and dec_img.shape == img.shape and dec_txt.shape == txt.shape
    assert (h.abs() <= 1).all()
    _, _, h_other, _, _ = net(img, txt.flip(0), s)
    assert not torch.allclose(h, h_other)


class ReleasedMyNet(torch.nn.Module):
    """XizeWu/CIRH ``models.MyNet`` (commit b6d16f3), transcribed line by line with the release's layer names and
    the width 512 made a parameter; ``.cuda()`` of its identity matrix dropped (the CPU)."""

    def __init__(self, code_len, ori_featI, ori_featT, width=512):
        super().__init__()
        nn, w = torch.nn, width
        self.encoderIMG = nn.Sequential(nn.Linear(ori_featI, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True))
        self.gcnI1, self.BNI1, self.actI1 = nn.Linear(w, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True)
        self.decoderIMG = nn.Sequential(nn.Linear(code_len, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True),
                                        nn.Linear(w, ori_featI), nn.BatchNorm1d(ori_featI))
        self.encoderTXT = nn.Sequential(nn.Linear(ori_featT, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True))
        self.gcnT1, self.BNT1, self.actT1 = nn.Linear(w, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True)
        self.decoderTXT = nn.Sequential(nn.Linear(code_len, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True),
                                        nn.Linear(w, ori_featT), nn.BatchNorm1d(ori_featT))
        self.gcnJ1, self.BNJ1, self.actJ1 = nn.Linear(w, w), nn.BatchNorm1d(w), nn.ReLU(inplace=True)
        self.HJ = nn.Linear(w, code_len)
        self.img_fc, self.txt_fc = nn.Linear(2 * w, code_len), nn.Linear(2 * w, code_len)
        self.HC = nn.Linear(3 * code_len, code_len)
        self.HIBN, self.HTBN = nn.BatchNorm1d(code_len), nn.BatchNorm1d(code_len)
        self.HJBN, self.HBN = nn.BatchNorm1d(code_len), nn.BatchNorm1d(code_len)

    def forward(self, XI, XT, affinity_A):
        F = torch.nn.functional
        self.batch_num = XI.size(0)
        VI = F.normalize(self.encoderIMG(XI), dim=1)
        VgcnI = self.actI1(self.BNI1(affinity_A.mm(self.gcnI1(VI))))
        VT = F.normalize(self.encoderTXT(XT), dim=1)
        VgcnT = self.actT1(self.BNT1(affinity_A.mm(self.gcnT1(VT))))
        VC = torch.cat((VI, VT), 0)
        II = torch.eye(affinity_A.shape[0], affinity_A.shape[1])
        S_cma = torch.cat((torch.cat((affinity_A, II), 1), torch.cat((II, affinity_A), 1)), 0)
        VJ1 = self.BNJ1(S_cma.mm(self.gcnJ1(VC)))
        VJ1 = VJ1[:self.batch_num, :] + VJ1[self.batch_num:, :]
        VJ = self.actJ1(VJ1)
        HJ = self.HJBN(self.HJ(VJ))
        HI = self.HIBN(self.img_fc(torch.cat((VgcnI, VJ), 1)))
        HT = self.HTBN(self.txt_fc(torch.cat((VJ, VgcnT), 1)))
        H = torch.tanh(self.HBN(self.HC(torch.cat((HI, HJ, HT), 1))))
        B = torch.sign(H)
        DeI_feat = self.decoderIMG(H + torch.tanh(HI))
        DeT_feat = self.decoderTXT(H + torch.tanh(HT))
        return HI, HT, H, B, DeI_feat, DeT_feat


# ucmfh's CirhNet's names -> the release's (the rest of each name as it is)
RELEASED_NAMES = {"enc_img.": "encoderIMG.", "enc_txt.": "encoderTXT.", "gcn_img.": "gcnI1.", "gcn_txt.": "gcnT1.",
                  "gcn_joint.": "gcnJ1.", "bn_img.": "BNI1.", "bn_txt.": "BNT1.", "bn_joint.": "BNJ1.",
                  "head_joint.": "HJ.", "head_img.": "img_fc.", "head_txt.": "txt_fc.", "head_all.": "HC.",
                  "bn_h_img.": "HIBN.", "bn_h_txt.": "HTBN.", "bn_h_joint.": "HJBN.", "bn_h.": "HBN.",
                  "dec_img.0.0.": "decoderIMG.0.", "dec_img.0.1.": "decoderIMG.1.", "dec_img.1.0.": "decoderIMG.3.",
                  "dec_img.1.1.": "decoderIMG.4.", "dec_txt.0.0.": "decoderTXT.0.", "dec_txt.0.1.": "decoderTXT.1.",
                  "dec_txt.1.0.": "decoderTXT.3.", "dec_txt.1.1.": "decoderTXT.4."}


@pytest.mark.parametrize("train", [True, False])
def test_the_network_is_the_released_mynet_output_for_output(batch, train):
    """CirhNet, its weights loaded into a line-by-line transcription of the release's MyNet (every weight mapped,
    none left over), gives the same five outputs (the release's B is the sign of H), in training mode (batch
    statistics) and in evaluation mode (running statistics, after a step)."""
    torch.manual_seed(0)
    img, txt = batch[0].float(), batch[1].float()
    s = batch_similarity(img, txt, row_thresholds(img, txt, 0.6, 18), 0.6, 0.6).float()
    ours = CirhNet(img.shape[1], txt.shape[1], 8, width=16)
    ours(img, txt, s)  # running statistics of one batch, for evaluation mode
    theirs = ReleasedMyNet(8, img.shape[1], txt.shape[1], width=16)
    state = {}
    for name, value in ours.state_dict().items():
        prefix = max((p for p in RELEASED_NAMES if name.startswith(p)), key=len)
        state[RELEASED_NAMES[prefix] + name[len(prefix):]] = value
    theirs.load_state_dict(state, strict=True)
    ours.train(train)
    theirs.train(train)
    with torch.no_grad():
        h_img, h_txt, h, dec_img, dec_txt = ours(img, txt, s)
        HI, HT, H, B, DeI, DeT = theirs(img, txt, s)
    for mine, released in ((h_img, HI), (h_txt, HT), (h, H), (dec_img, DeI), (dec_txt, DeT)):
        torch.testing.assert_close(mine, released, rtol=0, atol=1e-6)
    assert torch.equal(torch.sign(h), B)


def test_cirh_learns_on_tiny_data(tiny):
    # 5 steps an epoch here (the released MIRFlickr run: 10): the heads at 1e-3, not the released 1e-4
    cfg = hash_config("cirh", n_bits=16, hidden=256, epochs=25, batch_size=64, lr_head=1e-3, device="cpu",
                      val_fraction=0.2, patience=0, method_params={"width": 128})
    model, history = fit_hashing(tiny, cfg, progress=False)
    assert history.best_epoch is not None and len(history) == 25
    row = evaluate_hashing(model, tiny, ["unimodal"], device="cpu")[0]
    floor = random_codes_map(tiny, 16)
    assert row["map_i2t"] > floor["map_i2t"] + 0.1 and row["map_t2i"] > floor["map_t2i"] + 0.1


def test_cirh_similarity_from_centred_features_is_an_option(tiny):
    """Off by default (the released similarity); on, the similarity and so the run differ."""
    base = dict(n_bits=16, hidden=64, epochs=2, batch_size=64, device="cpu", val_fraction=0.2, patience=0)
    runs = [fit_hashing(tiny, hash_config("cirh", **base, method_params={"width": 64, "centred_similarity": c}),
                        progress=False)[0] for c in (False, True)]
    assert hash_config("cirh").method_params["centred_similarity"] is False
    a, b = (m.codes(tiny.query.img, tiny.query.txt, "unimodal")[0] for m in runs)
    assert not torch.equal(a, b)


def test_cirh_refuses_parameters_out_of_range():
    with pytest.raises(ValueError, match="k_fraction"):
        hash_config("cirh", method_params={"k_fraction": 1.0})
    with pytest.raises(ValueError, match="lr_net"):
        hash_config("cirh", method_params={"lr_net": 0.0})
