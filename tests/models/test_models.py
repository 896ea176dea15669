"""The fusion encoder: per-item encoding, and image codes that do not see texts under 'unimodal'; each modality's
own hash head."""
from __future__ import annotations

import pytest
import torch

from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher, FeatureHasher
from ucmfh.similarity import normalize

from conftest import small_fusion, small_hash


@pytest.fixture
def model():
    torch.manual_seed(0)
    return CrossModalHasher(FusionEncoder.from_config(12, 7, small_fusion()), 32, small_hash().hidden).eval()


def test_unimodal_image_code_ignores_the_text(model):
    img, txt = torch.randn(16, 12), torch.randn(16, 7)
    other_txt = torch.randn(16, 7)
    a_img, a_txt = model.codes(img, txt, "unimodal")
    b_img, b_txt = model.codes(img, other_txt, "unimodal")
    assert torch.equal(a_img, b_img)
    assert not torch.equal(a_txt, b_txt)
    # the fused protocol does see the paired text: the same change moves image embeddings
    fused_a, _ = model.fusion.embed(img, txt, "fused")
    fused_b, _ = model.fusion.embed(img, other_txt, "fused")
    assert not torch.allclose(fused_a, fused_b)


@pytest.mark.parametrize("protocol", ["unimodal", "fused"])
def test_each_item_is_encoded_on_its_own(model, protocol):
    img, txt = torch.randn(40, 12), torch.randn(40, 7)
    full = model.fusion.embed(img, txt, protocol)
    perm = torch.randperm(40)
    permuted = model.fusion.embed(img[perm], txt[perm], protocol)
    alone = [model.fusion.embed(img[i : i + 1], txt[i : i + 1], protocol) for i in range(40)]
    for which in range(2):
        torch.testing.assert_close(permuted[which], full[which][perm], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.cat([a[which] for a in alone]), full[which], rtol=1e-5, atol=1e-6)


def test_separated_items_match_single_modality_encoding(model):
    img, txt = torch.randn(10, 12), torch.randn(10, 7)
    separate = torch.tensor([True, False] * 5)
    z_img, z_txt = model.fusion(img, txt, separate)
    fused_img, fused_txt = model.fusion(img, txt)
    torch.testing.assert_close(z_img[separate], model.fusion.encode_img(img[separate]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z_txt[separate], model.fusion.encode_txt(txt[separate]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z_img[~separate], fused_img[~separate], rtol=1e-5, atol=1e-6)


def test_codes_are_plus_minus_one_with_sign_of_zero_positive(model):
    img_codes, _ = model.codes(torch.randn(5, 12), torch.randn(5, 7), "unimodal")
    assert img_codes.shape == (5, 32) and set(img_codes.unique().tolist()) <= {-1.0, 1.0}
    from ucmfh.similarity import sign_codes

    assert sign_codes(torch.tensor([0.0, -0.0, -1e-9, 2.0])).tolist() == [1.0, 1.0, -1.0, 1.0]


def test_inputs_are_standardised_with_training_statistics():
    torch.manual_seed(0)
    a = FusionEncoder.from_config(12, 7, small_fusion()).eval()
    b = FusionEncoder.from_config(12, 7, small_fusion()).eval()
    b.load_state_dict(a.state_dict())
    img, txt = torch.rand(30, 12) / 128, torch.rand(30, 7)  # Wiki-like: tiny, non-centred values
    img[:, 3] = 0.5  # a constant dimension must not divide by zero
    a.fit_feature_stats(img, txt)
    b.fit_feature_stats(img * 1000 + 3, txt * 0.01)
    for protocol in ("unimodal", "fused"):
        for x, y in zip(a.embed(img, txt, protocol), b.embed(img * 1000 + 3, txt * 0.01, protocol)):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert torch.isfinite(a.embed(torch.rand(4, 12), torch.rand(4, 7), "unimodal")[0]).all()


@pytest.mark.parametrize("d_txt", [7, 12])  # 12: as wide as the images (CLIP's 512 and 512)
@torch.no_grad()
def test_each_modality_is_hashed_by_its_own_head_whatever_the_widths(d_txt):
    """FeatureHasher's training outputs (logits) and a search's (modality_logits) are each modality's own
    head on its own centred, normalised features; with one width, the other head would give other values."""
    torch.manual_seed(0)
    model = FeatureHasher(12, d_txt, 16, 8).eval()
    img, txt = torch.randn(20, 12), torch.randn(20, d_txt)
    model.fit_feature_stats(img + 1.0, txt - 1.0)
    own_img = model.img_head(normalize(img - model.img_mean))
    own_txt = model.txt_head(normalize(txt - model.txt_mean))
    for got, own in zip(model.logits(img, txt), (own_img, own_txt)):
        torch.testing.assert_close(got, own)
    torch.testing.assert_close(model.modality_logits(img, "img"), own_img)
    torch.testing.assert_close(model.modality_logits(txt, "txt"), own_txt)
    if d_txt == 12:  # one width: the image head takes the texts too, and gives other values
        assert not torch.allclose(model.img_head(normalize(txt - model.txt_mean)), own_txt)
