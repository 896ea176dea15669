"""What every registered hashing method must do: leak-free codes when it says so, exact resume,
a checkpoint that gives back its codes, a config that refuses what it does not know."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import signal

import pytest
import torch

import ucmfh.trainer as trainer_module
import ucmfh.selection as selection_module
from ucmfh.checkpoint import load_model, save_checkpoint
from ucmfh.config import HashConfig
from ucmfh.methods import METHODS, build_method, fit_hashing, hash_config
from ucmfh.evaluation import embed_split, encode_split, head_outputs_split, score_splits
from ucmfh.signals import TrainingInterrupted
from ucmfh.training_state import StateFile
from ucmfh.fusion_stage import fit_fusion
from ucmfh.selection import validation_split, validation_view

from conftest import StopAfter, method_config as config, small_fusion

TRAINED = [name for name, spec in METHODS.items() if not spec.closed_form]


@pytest.fixture(scope="module")
def fusion(tiny):
    return fit_fusion(tiny, small_fusion(epochs=1), progress=False)[0]


@pytest.fixture(scope="module")
def fusion_equal(tiny_equal):
    return fit_fusion(tiny_equal, small_fusion(epochs=1), progress=False)[0]


# the data and fusion encoder of each feature width: image and text 48- and 32-d, or both 48-d (as CLIP's both 512-d)
WIDTHS = {"d_txt=32": ("tiny", "fusion"), "d_txt=48": ("tiny_equal", "fusion_equal")}


def fit(tiny, fusion, cfg: HashConfig, state=None):
    teacher = fusion if build_method(cfg.method).uses_fusion else None
    return fit_hashing(tiny, cfg, teacher, progress=False, state=state)


@pytest.mark.parametrize("widths", list(WIDTHS))
@pytest.mark.parametrize("name", list(METHODS))
def test_a_leak_free_method_codes_each_modality_from_itself(request, name, widths, tmp_path):
    """Another text beside each image changes no image code, and another image no text code, through
    the encoder a search uses (unimodal); a method that is not leak-free says so ('ucmfh'). With image and
    text features of one width, a modality hashed by the other's head is a wrong value, not a shape error."""
    from ucmfh.search.build import Encoder  # noqa: PLC0415

    tiny, fusion = (request.getfixturevalue(f) for f in WIDTHS[widths])
    cfg = config(name)
    model, _ = fit(tiny, fusion, cfg)
    split = tiny.query
    shuffled = type(split)(img=split.img.flip(0), txt=split.txt.flip(0), labels=split.labels)
    img, txt = encode_split(model, split, "unimodal", "cpu")
    img_other_txt, _ = encode_split(model, type(split)(img=split.img, txt=shuffled.txt, labels=split.labels),
                                    "unimodal", "cpu")
    _, txt_other_img = encode_split(model, type(split)(img=shuffled.img, txt=split.txt, labels=split.labels),
                                    "unimodal", "cpu")
    assert torch.equal(img, img_other_txt) and torch.equal(txt, txt_other_img)  # unimodal: every method
    fused_img, _ = encode_split(model, type(split)(img=split.img, txt=shuffled.txt, labels=split.labels),
                                "fused", "cpu")
    assert torch.equal(fused_img, img) == METHODS[name].leak_free  # only a method with a fused view differs
    assert len(img.unique(dim=0)) > 1 and len(txt.unique(dim=0)) > 1  # not one code for everything
    # `ucmfh index` and `search` encode with the checkpoint's modality_logits: one modality each, the same codes
    fusion_cfg = small_fusion(epochs=1) if METHODS[name].uses_fusion else None
    encoder = Encoder(save_checkpoint(tmp_path / "hash16.pt", model, fusion_cfg, cfg))
    for features, modality, codes in ((split.img, "image", img), (split.txt, "text", txt)):
        signs = torch.from_numpy(encoder.encode(features.numpy(), modality)) >= 0
        assert torch.equal(signs, codes > 0), modality
    # a caption set (no labels; equal ids, the same image): under `unimodal` an image is encoded once per id,
    # and every row's outputs are those of the image and text encoded together
    captions = _captions(split)
    seen, logits = [], model.modality_logits
    model.modality_logits = lambda x, modality: seen.append((modality, len(x))) or logits(x, modality)
    once = head_outputs_split(model, captions, "unimodal", "cpu")
    del model.modality_logits
    together = model.head_outputs(captions.img, captions.txt, "unimodal")
    assert torch.equal(once[0], together[0]) and torch.equal(once[1], together[1])
    assert seen == [("img", len(captions.ids.unique())), ("txt", len(captions))]


def _captions(split):
    """``split`` as a caption set: three rows (captions) per image, no labels."""
    ids = torch.arange(len(split)) // 3
    return dataclasses.replace(split, img=split.img[ids], labels=None, ids=ids)


def test_the_fusion_stage_embeds_an_image_once_per_id(fusion, tiny):
    captions = _captions(tiny.query)
    seen, encode_img = [], fusion.encode_img
    fusion.encode_img = lambda x: seen.append(len(x)) or encode_img(x)
    try:
        once = embed_split(fusion, captions, "unimodal", "cpu")
    finally:
        del fusion.encode_img
    with torch.no_grad():  # as embed_split computes (a transformer's no-grad path rounds otherwise)
        together = fusion.embed(captions.img, captions.txt, "unimodal")
        fused = fusion.embed(captions.img, captions.txt, "fused")
    assert torch.equal(once[0], together[0]) and torch.equal(once[1], together[1])
    assert seen == [len(captions.ids.unique())]
    # a fused image embedding reads its own row's text: every row encoded
    assert torch.equal(embed_split(fusion, captions, "fused", "cpu")[0], fused[0])


@pytest.mark.parametrize("name", TRAINED)
def test_validation_items_never_train_and_only_they_pick_the_epoch(tiny, fusion, name):
    """Honest selection: a run with a validation split trains exactly as a run on the rest of the
    training split alone, so no validation item trains; and its validation score is the MAP@50 of the
    validation items against that rest, never of the query split."""
    cfg = config(name, epochs=1)
    cfg = next(iter(build_method(name).choices(cfg).values()), cfg)  # one candidate: no choice to make
    model, history = fit(tiny, fusion, cfg)
    rest, val = validation_split(tiny.train, cfg.val_fraction, cfg.seed)
    alone, _ = fit(dataclasses.replace(tiny, train=rest), fusion, dataclasses.replace(cfg, val_fraction=0.0))
    a, b = model.state_dict(), alone.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    encode, ranking = validation_view(cfg)
    rows = score_splits(encode(model, val, "unimodal", "cpu"), encode(model, rest, "unimodal", "cpu"),
                        dataclasses.replace(tiny, train=rest, query=val, retrieval=rest), 50, ranking)
    assert history.validation == [[1, sum(r["map_i2t"] + r["map_t2i"] for r in rows) / (2 * len(rows))]]


@pytest.mark.parametrize("name, signum", [(name, signal.SIGINT) for name in TRAINED]
                         + [("two-tower", signal.SIGTERM)])  # the README promises a save on SIGTERM too
def test_an_interrupted_run_resumes_to_the_same_model(tiny, fusion, name, signum, tmp_path, monkeypatch):
    """Interrupted after its second epoch and resumed from its state, a run ends with the weights, codes and
    validation record of a run never stopped. The state is saved on the signal alone (save interval 1e9 s).
    The second epoch is made the best (its validation score raised by 1), so the best-so-far record the
    resumed run must keep is one from before the interruption, for every method."""
    cfg = config(name, epochs=4)
    bars = StopAfter(None, signum)
    monkeypatch.setattr(trainer_module, "tqdm", bars)
    validation_scores = selection_module.score_splits

    def best_second(*args, **kwargs):
        rows = validation_scores(*args, **kwargs)
        raise_by = 1.0 if bars.epoch == 2 else 0.0
        return [dict(row, map_i2t=row["map_i2t"] + raise_by, map_t2i=row["map_t2i"] + raise_by) for row in rows]

    monkeypatch.setattr(selection_module, "score_splits", best_second)
    reference, ref_history = fit(tiny, fusion, cfg)
    assert ref_history.best_epoch == 2 and [e for e, _ in ref_history.validation] == [1, 2, 3, 4]
    state = StateFile(str(tmp_path / "hash.state.pt"), interval_s=1e9)
    bars.epochs = 2
    with pytest.raises(TrainingInterrupted):
        fit(tiny, fusion, cfg, state)
    bars.epochs, first = None, len(bars.starts)  # no more interruptions
    resumed, history = fit(tiny, fusion, cfg, StateFile(state.path, resume=True))
    assert bars.starts[first] == 2  # went on from the saved state, in the third epoch
    a, b = reference.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert history.validation == ref_history.validation and list(history) == list(ref_history)
    assert history.best_epoch == 2


@pytest.mark.parametrize("name", list(METHODS))
def test_a_checkpoint_gives_back_the_same_codes(tiny, fusion, name, tmp_path):
    cfg = config(name, epochs=1)
    model, _ = fit(tiny, fusion, cfg)
    path = save_checkpoint(tmp_path / "hash.pt", model, small_fusion(epochs=1), cfg)
    loaded, _, loaded_cfg, _ = load_model(path, "hash", d_img=tiny.d_img, d_txt=tiny.d_txt, n_bits=16)
    assert loaded_cfg == cfg and type(loaded) is type(model)
    assert all(torch.equal(a, b) for a, b in zip(encode_split(model, tiny.query, "unimodal", "cpu"),
                                                 encode_split(loaded, tiny.query, "unimodal", "cpu")))


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_config_refuses_an_unknown_or_ill_typed_parameter(name):
    spec = METHODS[name]
    assert spec.name == name and spec.description
    with pytest.raises(ValueError, match=f"method '{name}' has no parameter 'nosuch'"):
        hash_config(name, method_params={"nosuch": 1})
    for key, default in spec.params.items():
        assert hash_config(name).method_params[key] == default
        # a number is text's text (temperatures=0.2), a list of them their text (temperatures=[0.3, 0.1])
        wrong = "text" if not isinstance(default, str) else {"a": 1}
        with pytest.raises(ValueError, match=f"parameter '{key}' must be (an? |text)"):
            hash_config(name, method_params={key: wrong})


@pytest.mark.parametrize("name", list(METHODS))
def test_a_method_trains_on_a_streamed_split_or_says_why_not(tiny_path, fusion, name):
    """A training split read from the file by blocks: the same model as in memory (one block holds it), or a
    one-line refusal naming the file and why the method needs the split in memory."""
    from ucmfh.data.h5 import Split, load_dataset
    from ucmfh.data.stream import Rows, StreamSettings

    data, held = load_dataset(tiny_path), load_dataset(tiny_path)
    one = StreamSettings(block_rows=10**6)
    data.train = Split(Rows(tiny_path, "train/image", one), Rows(tiny_path, "train/text", one), data.train.labels,
                       data.train.ids)
    spec, cfg = METHODS[name], config(name, epochs=1)
    if spec.in_memory or spec.closed_form:
        # the file's path withheld from the method, its name said
        with pytest.raises(ValueError, match=f"^{os.path.basename(data.path)}: method '{name}' .*streamed"):
            fit(data, fusion, cfg)
        return
    streamed, _ = fit(data, fusion, cfg)
    model, _ = fit(held, fusion, cfg)
    a, b = streamed.state_dict(), model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("name", [name for name, spec in METHODS.items() if spec.params])
def test_a_method_parameter_that_is_nan_infinite_or_out_of_range_is_refused_before_the_data_is_read(tmp_path, name):
    """NaN passes every check written as ``x < 0``: a float parameter must be finite. The command line refuses
    it with exit 2, naming the parameter, before the dataset is opened."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    for key, default in METHODS[name].params.items():
        for bad in ((math.nan, math.inf) if isinstance(default, float) else ()):
            with pytest.raises(ValueError, match=f"method '{name}': parameter '{key}' must be a finite number"):
                hash_config(name, method_params={key: bad})
        if isinstance(default, float):
            result = CliRunner().invoke(main, ["train-hash", "-d", str(tmp_path / "missing.h5"), "--method", name,
                                               "--method-param", f"{key}=NaN"])
            assert result.exit_code == 2 and f"parameter '{key}' must be a finite number, got nan" in result.output
            assert "no such dataset file" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("name, params, error", [
    ("jdsh", {"lamb": -0.4}, "method 'jdsh': lamb must be >= 0, got lamb=-0.4"),
    ("jdsh", {"scale_left": -1.0, "k_right": -2.0}, "method 'jdsh': scale_left, k_right must be >= 0"),
    ("daeh", {"alpha": -2.0}, "method 'daeh': alpha and beta must be >= 0, got alpha=-2.0"),
    ("two-tower", {"temperatures": "0.3,inf"}, "parameter 'temperatures' must be positive numbers"),
])
def test_a_method_parameter_out_of_its_range_is_refused(name, params, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        hash_config(name, method_params=params)
