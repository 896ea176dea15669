"""scripts/ucmfh_reference.py: UCMFH's code runs, keeps its defects (docs/reference.md §2), and its loss is NT-Xent."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from ucmfh.losses import NTXentLoss
from conftest import load_script

_reference = load_script("ucmfh_reference")  # scripts/: used by bench_train.py and here only
RefContrastiveLoss = _reference.RefContrastiveLoss
RefFuseTransEncoder = _reference.RefFuseTransEncoder
RefHashMlp = _reference.RefHashMlp
ref_encode = _reference.ref_encode
ref_fit_fusion = _reference.ref_fit_fusion
ref_fit_hashing = _reference.ref_fit_hashing
ref_optimizer = _reference.ref_optimizer

CPU = torch.device("cpu")


@pytest.fixture
def models(tiny):
    """Untrained reference modules, seeded, sized for the tiny set (token width d_img + d_txt)."""
    torch.manual_seed(0)
    fusion = RefFuseTransEncoder(hidden_size=tiny.d_img + tiny.d_txt)
    return fusion, RefHashMlp(fusion.sigal_d, 64), RefHashMlp(fusion.sigal_d, 64)


def test_one_fusion_and_one_hashing_step_give_a_finite_loss(tiny):
    split = tiny.train.subset(slice(0, 32))
    fusion = ref_fit_fusion(split, epochs=1, device=CPU, batch_size=32)
    assert fusion.n_items == 32 and len(fusion.losses) == 1 and math.isfinite(fusion.losses[0])
    assert len(fusion.seconds) == 1 and fusion.seconds[0] > 0  # each epoch's wall seconds (bench_train's clock)
    before = [p.detach().clone() for p in fusion.model.parameters()]
    hashing = ref_fit_hashing(split, fusion.model, n_bits=16, epochs=1, device=CPU, batch_size=32)
    assert hashing.n_items == 32 and len(hashing.losses) == 1 and math.isfinite(hashing.losses[0])
    # the hashing step trains the fusion encoder further, in place
    assert any(not torch.equal(a, b) for a, b in zip(before, hashing.model[0].parameters()))
    img_codes, txt_codes = ref_encode(hashing.model, tiny.query, CPU, batch_size=16)
    assert img_codes.shape == txt_codes.shape == (80, 16)
    assert set(img_codes.unique().tolist()) <= {-1.0, 1.0}


def test_a_code_depends_on_the_other_items_of_its_batch(tiny, models):
    # defect 1: at evaluation a batch is one sequence of B tokens, attending to each other
    items = tiny.query.subset(slice(0, 32))
    perm = torch.cat([torch.arange(0, 32, 2), torch.arange(1, 32, 2)])  # every item gets other batch-mates
    in_order = ref_encode(models, items, CPU, batch_size=16)
    mixed = ref_encode(models, items.subset(perm), CPU, batch_size=16)
    for a, b in zip(in_order, mixed):
        assert (a[perm] != b).any(dim=1).float().mean() > 0.5  # most items' codes changed
    # fed item by item, as in training, the same items get the same codes in any batch
    in_order = ref_encode(models, items, CPU, batch_size=16, itemwise=True)
    mixed = ref_encode(models, items.subset(perm), CPU, batch_size=16, itemwise=True)
    for a, b in zip(in_order, mixed):
        assert torch.equal(a[perm], b)


def test_an_image_code_depends_on_its_paired_text(tiny, models):
    # defect 2: every code is computed from the pair (fused protocol only)
    items = tiny.query.subset(slice(0, 32))
    other = dataclasses.replace(items, txt=torch.randn_like(items.txt))
    img_codes, _ = ref_encode(models, items, CPU, itemwise=True)
    img_codes_other_txt, _ = ref_encode(models, other, CPU, itemwise=True)
    assert (img_codes != img_codes_other_txt).any(dim=1).float().mean() > 0.5


def test_drop_last_drops_items(tiny, models):
    # defect 3: 80 query items in batches of 32 -> the last 16 are never coded
    codes = ref_encode(models, tiny.query, CPU, batch_size=32)
    first_64 = ref_encode(models, tiny.query.subset(slice(0, 64)), CPU, batch_size=32)
    for c, f in zip(codes, first_64):
        assert c.shape == (64, 64) and len(c) % 32 == 0
        assert torch.equal(c, f)
    assert all(len(c) == 80 for c in ref_encode(models, tiny.query, CPU, batch_size=32, itemwise=True))
    fewer = ref_encode(models, tiny.query.subset(slice(0, 31)), CPU, batch_size=32)
    assert [c.shape for c in fewer] == [(0, 64), (0, 64)]
    # training drops them too: 40 items, batch 32 -> 32 trained per epoch
    assert ref_fit_fusion(tiny.train.subset(slice(0, 40)), 2, CPU, batch_size=32).n_items == 64
    with pytest.raises(ValueError, match="drop_last leaves no batch"):
        ref_fit_fusion(tiny.train.subset(slice(0, 31)), 1, CPU, batch_size=32)


@pytest.mark.parametrize("temperature", [0.5, 0.1])
def test_loss_is_ntxent_on_a_batch_of_its_fixed_size(temperature):
    gen = torch.Generator().manual_seed(0)
    img, txt = torch.randn(16, 24, generator=gen), torch.randn(16, 24, generator=gen)
    ref = RefContrastiveLoss(16, CPU, temperature)(img, txt)
    ours = NTXentLoss(temperature)(img, txt)
    torch.testing.assert_close(ref, ours, rtol=1e-5, atol=1e-6)
    # the negatives mask is built for 16 pairs: no other batch size passes
    with pytest.raises(RuntimeError):
        RefContrastiveLoss(16, CPU, temperature)(img[:15], txt[:15])


def test_learning_rate_rises_per_batch():
    # defect 4: MultiStepLR([30, 80], gamma 1.2) stepped once per batch
    opt, sched = ref_optimizer(nn.Linear(2, 2), 1e-3)
    lrs = []
    for _ in range(80):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[28] == pytest.approx(1e-3) and lrs[29] == pytest.approx(1.2e-3)
    assert lrs[78] == pytest.approx(1.2e-3) and lrs[79] == pytest.approx(1.44e-3)


def test_the_ucmfh_settings_are_the_ones_docs_reference_states():
    """UCMFH's settings as docs/reference.md §2 states them, read from the page, are the
    ones `--method ucmfh` trains with (a changed default fails here, not silently in a reproduction)."""
    import re
    from pathlib import Path

    from ucmfh.config import REFERENCE_EPOCHS, FusionConfig
    from ucmfh.losses import build_loss
    from ucmfh.methods import hash_config

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference.md").read_text()
    head = re.search(r"`d → (\d+) → ReLU → dropout ([\d.]+) → n_bits → tanh`", page)
    weight = re.search(r"Loss = loss\(fused img, fused txt\) \+ ([\d.]+) · loss\(img head, txt head\)", page)
    settings = re.search(r"batch (\d+); Adam betas \(([\d.]+), ([\d.]+)\), lr ([\de.-]+) fusion, ([\de.-]+) heads; "
                         r"temperature ([\d.]+); epochs MIRFlickr (\d+), NUS-WIDE (\d+), COCO (\d+); seed (\d+)", page)
    assert head and weight and settings, "docs/reference.md §2 no longer states UCMFH's settings in these words"
    cfg, fusion = hash_config("ucmfh"), FusionConfig()
    batch, b1, b2, lr_fusion, lr_heads, tau, mir, nus, coco, seed = settings.groups()
    assert (cfg.hidden, cfg.dropout, cfg.method_params["code_weight"]) == (int(head[1]), float(head[2]),
                                                                           float(weight[1]))
    assert cfg.batch_size == fusion.batch_size == int(batch) and cfg.seed == fusion.seed == int(seed)
    assert tuple(cfg.betas) == tuple(fusion.betas) == (float(b1), float(b2))
    assert fusion.lr == cfg.lr_fusion == float(lr_fusion) and cfg.lr_head == float(lr_heads)
    assert cfg.loss == "original" and build_loss(cfg.loss, **cfg.loss_params).temperature == float(tau)
    assert (REFERENCE_EPOCHS["mirflickr"], REFERENCE_EPOCHS["nuswide"], REFERENCE_EPOCHS["coco"]) == (int(mir), int(nus), int(coco))
