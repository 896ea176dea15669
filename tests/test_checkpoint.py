"""Checkpoints: round trip, refusal of other settings, atomic writes."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from ucmfh.checkpoint import CheckpointError, load_model, save_checkpoint
from ucmfh.evaluation import encode_split
from ucmfh.files import torch_file_problem
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher

from conftest import small_fusion, small_hash


@pytest.fixture
def saved(tmp_path, tiny):
    torch.manual_seed(0)
    fcfg, hcfg = small_fusion(), small_hash(n_bits=24)
    model = CrossModalHasher(FusionEncoder.from_config(tiny.d_img, tiny.d_txt, fcfg), hcfg.n_bits, hcfg.hidden).eval()
    path = save_checkpoint(tmp_path / "hash24.pt", model, fcfg, hcfg, meta={"dataset": "tiny"})
    return path, model, fcfg, hcfg


def test_a_checkpoint_never_replaces_a_file_that_is_not_one(saved, tmp_path, tiny_path):
    """save_checkpoint wrote over a copy of a dataset, wrote its settings over a user's notes.json, and, named
    .json, over itself (an audit's finds); a checkpoint saved again replaces itself."""
    import shutil

    path, model, fcfg, hcfg = saved
    shutil.copy(tiny_path, tmp_path / "data.h5")
    (tmp_path / "notes.json").write_text('{"my": "notes"}')
    for target, refused in (("data.h5", "data.h5: exists and is not a ucmfh checkpoint; not replaced"),
                            ("notes.pt", "notes.json: exists and is not a checkpoint's settings file, which "),
                            ("model.json", "model.json: a checkpoint named .json would be written over by its "
                                           "settings")):
        with pytest.raises((FileExistsError, ValueError), match=re.escape(refused)):
            save_checkpoint(tmp_path / target, model, fcfg, hcfg)
    assert (tmp_path / "notes.json").read_text() == '{"my": "notes"}' and not (tmp_path / "notes.pt").exists()
    assert (tmp_path / "data.h5").read_bytes() == open(tiny_path, "rb").read()
    assert save_checkpoint(path, model, fcfg, hcfg, meta={"again": True}) == path
    assert load_model(path, "hash")[3] == {"again": True}


def test_round_trip_gives_the_same_codes_and_config(saved, tiny):
    path, model, fcfg, hcfg = saved
    loaded, fcfg2, hcfg2, meta = load_model(path, "hash", d_img=tiny.d_img, d_txt=tiny.d_txt, n_bits=24)
    assert (fcfg2, hcfg2, meta) == (fcfg, hcfg, {"dataset": "tiny"})
    for a, b in zip(encode_split(model, tiny.query, "fused", "cpu"), encode_split(loaded, tiny.query, "fused", "cpu")):
        assert torch.equal(a, b)
    settings = json.loads(open(os.path.splitext(path)[0] + ".json").read())
    assert settings["hash_config"]["n_bits"] == 24 and settings["kind"] == "hash"
    assert [p for p in os.listdir(os.path.dirname(path)) if ".tmp" in p] == []


def test_saving_and_loading_a_checkpoint_leave_the_caller_s_draws_as_they_were(saved, tiny):
    """Each built a model of random initial weights, replaced by the saved ones, from torch's generator: a
    notebook's draws after a save or a load were not those it would have made without (a library audit's)."""
    path, model, fcfg, hcfg = saved
    torch.manual_seed(5)
    expected = torch.rand(3)
    for act in (lambda: load_model(path, "hash"),
                lambda: save_checkpoint(os.path.join(os.path.dirname(path), "again.pt"), model, fcfg, hcfg)):
        torch.manual_seed(5)
        act()
        assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="hash", n_bits=64), r"made for n_bits=24, but n_bits=64"),
        (dict(kind="hash", d_img=99), r"made for image feature dim=48, but image feature dim=99"),
        (dict(kind="hash", d_txt=5), r"made for text feature dim=32"),
        (dict(kind="fusion"), r"is a hashing checkpoint \(hashN.pt\); a fusion stage's checkpoint \(fusion.pt\) is "
                               "needed here"),
    ],
)
def test_checkpoint_for_other_settings_is_refused(saved, kwargs, message):
    with pytest.raises(CheckpointError, match=message):
        load_model(saved[0], **kwargs)


def test_damaged_or_foreign_files_are_refused(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_model(junk, "hash")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a ucmfh checkpoint"):
        load_model(tmp_path / "other.pt", "hash")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_model(tmp_path / "absent.pt", "hash")


def test_a_garbage_or_truncated_file_is_named_in_a_few_words(saved, tmp_path, tiny_path):
    """Not torch's 600-character weights_only advice nor '[Errno 22]': what is wrong with the file,
    one line and exit 2 from the command line (checkpoints and training states alike)."""
    import pickle

    from click.testing import CliRunner

    from ucmfh.app.cli import main
    from ucmfh.training_state import read_state

    cut = tmp_path / "cut.pt"
    cut.write_bytes(open(saved[0], "rb").read()[:5000])
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": "ucmfh-checkpoint", "thing": pickle.PickleError()}, pickled)
    for path, why in ((cut, "truncated, or not a file torch saved"), (empty, "an empty file"),
                      (pickled, "it holds objects other than tensors and plain values")):
        result = CliRunner().invoke(main, ["evaluate", "-d", tiny_path, "-c", str(path), "--quiet", "--results", ""])
        assert result.exit_code == 2
        assert result.output == f"Error: {path}: not a readable checkpoint ({why})\n"
    if os.path.exists("/proc/self/status"):  # sized 0 by the system, yet not empty
        with pytest.raises(CheckpointError, match=r"not a readable checkpoint \(truncated, or not a file torch saved"):
            load_model("/proc/self/status", "hash")
    with pytest.raises(ValueError, match=r"cut.pt: not a readable training state \(truncated, or not a file torch"
                                         r" saved\); delete it to train the run from its start"):
        read_state(str(cut), torch.device("cpu"))
    # a file the user may not read is said so, not 'truncated' (root reads every file: the refusal is given)
    assert torch_file_problem(cut, PermissionError(13, "Permission denied", str(cut))) == "permission denied"


class _RunsCode:
    """Pickles as ``os.system('touch MARKER')``: what a checkpoint from a sharing link may hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_runs_code_is_refused_and_never_runs(tmp_path):
    """Every torch.load of a user's file (checkpoints, SEPS checkpoints, training states) reads with
    weights_only: a pickled call is refused, not made."""
    from ucmfh.checkpoint import FORMAT, VERSION, load_seps
    from ucmfh.training_state import STATE_FORMAT, read_state

    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "version": VERSION, "kind": "hash", "thing": _RunsCode(marker)}, evil)
    torch.load(evil, weights_only=False)
    assert marker.exists(), "the payload is live: an unrestricted torch.load runs it"
    marker.unlink()
    refused = "it holds objects other than tensors and plain values"
    with pytest.raises(CheckpointError, match=f"evil.pt: not a readable checkpoint \\({refused}\\)"):
        load_model(evil, "hash")
    with pytest.raises(CheckpointError, match=f"evil.pt: not a readable checkpoint \\({refused}\\)"):
        load_seps(evil)
    state = tmp_path / "state.pt"
    torch.save({"format": STATE_FORMAT, "thing": _RunsCode(marker)}, state)
    with pytest.raises(ValueError, match=f"state.pt: not a readable training state \\({refused}\\)"):
        read_state(str(state), torch.device("cpu"))
    assert not marker.exists()


def test_a_checkpoint_load_model_would_refuse_is_not_saved(tmp_path, tiny):
    """``save_checkpoint`` rebuilds what it is given as ``load_model`` will: a hashing model without its
    hashing config, or with a config its weights do not fit, is refused with why, and no file is written."""
    torch.manual_seed(0)
    fcfg, hcfg = small_fusion(), small_hash(n_bits=24)
    model = CrossModalHasher(FusionEncoder.from_config(tiny.d_img, tiny.d_txt, fcfg), hcfg.n_bits, hcfg.hidden)
    for configs, why in [((fcfg, None), "a hashing checkpoint without its hashing settings"),
                         ((fcfg, small_hash(n_bits=32)), "weights do not fit the saved config"),
                         ((None, hcfg), "method 'ucmfh' needs its fusion encoder's settings")]:
        path = tmp_path / "hash.pt"
        with pytest.raises(CheckpointError, match=rf"^{path}: not saved, as load_model would refuse it: .*{why}"):
            save_checkpoint(path, model, *configs)
        assert os.listdir(tmp_path) == []
    with pytest.raises(TypeError, match=r"^save_checkpoint: hash_cfg must be a HashConfig or None, got FusionConfig$"):
        save_checkpoint(tmp_path / "hash.pt", model, fcfg, fcfg)
    with pytest.raises(CheckpointError, match=r"not saved: Linear is not a model of ucmfh's"):
        save_checkpoint(tmp_path / "hash.pt", torch.nn.Linear(2, 2), None, hcfg)
    assert os.listdir(tmp_path) == []
    save_checkpoint(tmp_path / "hash.pt", model, fcfg, hcfg)  # what loads back is saved
    assert load_model(tmp_path / "hash.pt", "hash")[2] == hcfg


@pytest.mark.parametrize("change, problem", [
    ({"hash_config": "garbage"}, "hash_config is a str, not a mapping"),  # was an AttributeError in read_checkpoint
    ({"kind": "weird"}, "kind 'weird', not fusion, hash or seps"),  # was read as a hashing checkpoint
    ({"d_img": -3}, "d_img -3"),
    ({"state_dict": {"w": [1.0]}}, "its weights are not tensors by name"),
    ({"meta": None, "hash_config": None}, "a hashing checkpoint without its hashing settings"),
])
def test_a_checkpoint_no_ucmfh_writes_is_named_damaged(saved, tmp_path, change, problem):
    payload = torch.load(saved[0], weights_only=False)
    torch.save({**payload, **change}, tmp_path / "forged.pt")
    with pytest.raises(CheckpointError, match=rf"forged.pt: (a damaged checkpoint \()?{re.escape(problem)}\)?$"):
        load_model(tmp_path / "forged.pt", "hash")


def test_a_checkpoint_without_its_meta_or_configs_is_named_damaged(saved, tmp_path):
    """A payload missing 'meta' or a config was a KeyError (a traceback at the command line)."""
    for missing in ("meta", "hash_config", "fusion_config"):
        payload = torch.load(saved[0], weights_only=False)
        del payload[missing]
        torch.save(payload, tmp_path / "forged.pt")
        with pytest.raises(CheckpointError, match=rf"forged.pt: a damaged checkpoint \(no {missing}\)$"):
            load_model(tmp_path / "forged.pt", "hash")


def test_weights_that_are_not_finite_are_refused(saved, tmp_path):
    """NaN weights evaluated at chance's level with exit 0: refused on load, naming the first such tensor."""
    payload = torch.load(saved[0], weights_only=False)
    name = next(iter(payload["state_dict"]))
    payload["state_dict"][name] = payload["state_dict"][name] * float("nan")
    torch.save(payload, tmp_path / "nan.pt")
    with pytest.raises(CheckpointError, match=rf"nan.pt: weights that are NaN or infinite \({re.escape(name)}\)"):
        load_model(tmp_path / "nan.pt", "hash")
    model, fcfg, hcfg, _ = load_model(saved[0], "hash")  # nor saved: load_model would refuse it
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"again.pt: not saved, as load_model would refuse it: weights that "
                                              r"are NaN"):
        save_checkpoint(tmp_path / "again.pt", model, fcfg, hcfg)
    assert not (tmp_path / "again.pt").exists() and not (tmp_path / "again.json").exists()
    with pytest.raises(ValueError, match=r"^save_checkpoint: an empty path; give the checkpoint file to write$"):
        save_checkpoint("", model, fcfg, hcfg)


def test_evaluate_keeping_no_row_writes_nothing_beside_the_checkpoint(saved, tiny_path):
    """'evaluate --results ""' kept no row, yet wrote the row's per-query scores beside the user's checkpoint."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    folder = os.path.dirname(saved[0])
    before = sorted(os.listdir(folder))
    result = CliRunner().invoke(main, ["evaluate", "-d", tiny_path, "-c", saved[0], "--quiet", "--results", ""])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(folder)) == before


@pytest.mark.parametrize("meta, says", [
    ({"epoch": np.int64(3)}, "its meta holds what JSON cannot write (Object of type int64 is not JSON serializable"),
    ({"map": torch.tensor(0.5)}, "its meta holds what JSON cannot write (Object of type Tensor"),
    ([1], "meta must be a dict of JSON values, got list"),
])
def test_a_meta_json_cannot_write_is_refused_before_any_file(saved, tmp_path, meta, says):
    """A NumPy number in meta: the checkpoint was written, then its settings failed (a raw TypeError), leaving a
    file load_model refused and a second save would not replace."""
    _, model, fcfg, hcfg = saved
    with pytest.raises(CheckpointError, match=re.escape(f"meta.pt: not saved: {says}")):
        save_checkpoint(tmp_path / "meta.pt", model, fcfg, hcfg, meta=meta)
    assert not (tmp_path / "meta.pt").exists() and not (tmp_path / "meta.json").exists()
    assert save_checkpoint(tmp_path / "meta.pt", model, fcfg, hcfg, meta={"epoch": 3}) == str(tmp_path / "meta.pt")


def test_settings_json_cannot_write_are_refused_before_any_file(saved, tmp_path):
    """Settings JSON cannot write (a numpy number a config was given after its checks): the weights were written
    first, then the settings failed, leaving a file that the next save refused to replace."""
    _, model, fcfg, hcfg = saved
    hcfg.method_params = {"alpha": np.float32(1.0)}
    with pytest.raises(CheckpointError, match=r"odd\.pt: not saved: its settings hold what JSON cannot write "
                                              r"\(Object of type float32 is not JSON serializable\)$"):
        save_checkpoint(tmp_path / "odd.pt", model, fcfg, hcfg)
    assert not list(tmp_path.glob("odd.*"))


def test_a_checkpoint_whose_settings_this_ucmfh_refuses_says_why_it_cannot_load(saved, tmp_path):
    """An older ucmfh took seeds of 2**32 and more: its checkpoints said only 'seed must be in [0, 4294967296)
    …, got 4294967296' at every evaluate, encode, index and search (an audit's)."""
    path = saved[0]
    payload = torch.load(path, weights_only=True)
    payload["hash_config"]["seed"] = 2**32
    older = tmp_path / "older.pt"
    torch.save(payload, older)
    with pytest.raises(CheckpointError, match=re.escape(f"{older}: its settings are refused by this ucmfh (seed must "
                                                        "be in [0, 4294967296)") + r".*got 4294967296\): a checkpoint "
                                                        r"of an older ucmfh that took them, or an edited one; train it "
                                                        r"again$"):
        load_model(older, "hash")
