"""Every setting of the stage configs has its range, checked before anything is read or trained.

One table of values each setting can never take walks every field of FusionConfig, HashConfig and
SepsConfig: the library refuses each (``ValueError`` naming the setting) and the command line refuses
each given by ``--set`` with exit 2, naming ``--set`` and the setting, before the dataset is opened.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.config import FusionConfig, HashConfig, Range, SepsConfig, check_setting, identity_dict

NAN, INF = float("nan"), float("inf")

# values each setting can never take (with the defaults of the other settings, train-hash --method ucmfh)
BAD = {
    FusionConfig: {
        "d_model": [0, -8, 30],  # 30: not divisible by the 4 heads
        "n_layers": [0],
        "n_heads": [0, -4, 3],  # 3 does not divide d_model 512
        "d_ff": [0],
        "dropout": [-0.1, 1, 5, NAN],
        "modality_dropout": [-0.1, 1.5],
        "loss": ["nope"],
        "loss_params": [{"nope": 1}, {"temperature": -1}],
        "epochs": [0],
        "batch_size": [1],
        "lr": [0, -1e-4, INF],
        "betas": [[0.5, 2], [-0.1, 0.9], [0.5], ["a", 0.9]],
        "seed": [2**64],
        "amp": ["fp16"],
        "device": ["mps"],
        "val_fraction": [1, -0.1],
        "patience": [-1, 3],  # 3: without a validation split
    },
    HashConfig: {
        "method": ["nope"],
        "method_params": [{"nope": 1}],
        "n_bits": [4, 512],
        "hidden": [-1],
        "dropout": [1, 2, NAN],
        "modality_dropout": [2],
        "relaxation": ["nope"],
        "beta_schedule": ["nope"],
        "beta_gamma": [-0.1],
        "beta_step_iters": [0],
        "beta_step_epochs": [0],
        "loss": ["nope"],
        "loss_params": [{"nope": 1}],
        "epochs": [0],
        "batch_size": [1],
        "lr_fusion": [-1],
        "lr_head": [0, NAN],
        "betas": [[0.5, 2], [0.9, 0.999, 0.5]],
        "seed": [-2**63 - 1],
        "amp": ["fp16"],
        "device": ["gpu"],  # a spelling; whether the machine has the device is --device's (resolve_device)
        "val_fraction": [1],
        "patience": [-1],
        "refit": [True],  # without a validation split
    },
    SepsConfig: {
        "version": ["nope"],
        "aggregate": ["nope"],
        "selection": ["nope"],
        "dense_text": ["nope"],
        "embed_dim": [0],
        "keep_ratio": [0, 1.5],
        "aggr_ratio": [0, 2],
        "aggr_hidden_ratio": [0],
        "beta": [0.6, -0.1],
        "select_temperature": [0],
        "hrpa_top_k": [0],
        "margin": [-0.1],
        "max_violation_from": [-1],
        "ratio_weight": [-1],
        "epochs": [0],
        "batch_size": [1],
        "lr": [0],
        "weight_decay": [-1e-4],
        "val_fraction": [1],
        "patience": [-1],
        "pair_chunk": [0],
        "seed": [2**64],
        "amp": ["fp16"],
        "device": ["cuda:x"],
    },
}

# settings with no value a config can refuse, and why
NO_BAD_VALUE = {
    (FusionConfig, "supervised"): "a flag: true and false are both valid (another type is refused: tests/app/test_runs.py)",
    (HashConfig, "supervised"): "a flag: true and false are both valid (another type is refused: tests/app/test_runs.py)",
}
# settings the config takes as given and whose check is where they are used (still before anything trains)
CHECKED_WHERE_USED = {"loss": "build_loss", "loss_params": "build_loss", "method": "build_method",
                      "method_params": "the method"}
STAGE = {FusionConfig: "fusion", HashConfig: "hash", SepsConfig: ""}
# settings with an option of their own: --set refuses them ('use OPTION'), the option checks the value
OWN_OPTIONS = {
    (FusionConfig, "seed"): "--seed", (HashConfig, "seed"): "--seed", (HashConfig, "n_bits"): "--n-bits",
    (HashConfig, "method"): "--method",
    **{(cls, "device"): "--device" for cls in (FusionConfig, HashConfig, SepsConfig)},
    **{(SepsConfig, name): "--" + name.replace("_", "-") for name in (
        "version", "selection", "dense_text", "epochs", "batch_size", "lr", "val_fraction", "patience", "seed")},
}

CASES = [(cls, name, value) for cls, table in BAD.items() for name, values in table.items() for value in values]


def _id(case) -> str:
    cls, name, value = case
    return f"{cls.__name__}.{name}={value!r}"


def test_the_table_walks_every_field():
    for cls in BAD:
        fields = {f.name for f in dataclasses.fields(cls)}
        listed = set(BAD[cls]) | {name for c, name in NO_BAD_VALUE if c is cls}
        assert listed == fields, f"{cls.__name__}: no bad value listed for {sorted(fields - listed)}"


@pytest.mark.parametrize("cls, name, value", CASES, ids=map(_id, CASES))
def test_an_out_of_range_setting_is_refused_before_anything_is_read(tmp_path, cls, name, value):
    """Library: ``ValueError`` naming the setting. Command line: exit 2, one line naming ``--set`` and the
    setting (or, for a setting with an option of its own, the option), before the dataset is opened."""
    if name not in CHECKED_WHERE_USED:
        with pytest.raises(ValueError, match=name):
            cls(**{name: value})
    missing = str(tmp_path / "missing.h5")
    stage = STAGE[cls]
    command = ["train-seps", "-d", missing] if cls is SepsConfig else ["train-hash", "--method", "ucmfh", "-d", missing]
    out = ["--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl")]
    key = f"{stage}.{name}" if stage else name
    result = CliRunner().invoke(main, [*command, *out, "--set", f"{key}={json.dumps(value)}"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: Invalid value for --set: {key!r}: "), result.output
    assert "Traceback" not in result.output and "no such dataset file" not in result.output
    assert not (tmp_path / "runs").exists()
    option = OWN_OPTIONS.get((cls, name))
    if option is not None:
        assert errors[0].endswith(f"use {option}") or errors[0].endswith(f"use -b/{option}")
        given = [option, str(value)] if not isinstance(value, list) else []
        result = CliRunner().invoke(main, [*command, *out, *given])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert option in result.output and "no such dataset file" not in result.output, result.output
    elif name not in CHECKED_WHERE_USED and not isinstance(value, list):
        assert repr(value) in errors[0] or f"{value}" in errors[0], errors[0]  # the value given is named


@pytest.mark.parametrize("cls, name", sorted(NO_BAD_VALUE, key=lambda k: (k[0].__name__, k[1])),
                         ids=lambda x: getattr(x, "__name__", x))
def test_a_setting_with_no_bad_value_has_no_range(cls, name):
    from ucmfh.config import SETTINGS

    assert name not in SETTINGS[cls], NO_BAD_VALUE[(cls, name)]


def test_ranges_refuse_nan_and_infinities_and_say_what_they_allow():
    share = Range(0, 1, high_open=True)
    assert 0 in share and 0.5 in share and 1 not in share and NAN not in share and INF not in Range(0)
    assert str(share) == "in [0, 1)" and str(Range(0, low_open=True)) == "> 0" and str(Range(1)) == ">= 1"
    with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, got inf$"):
        check_setting(FusionConfig, "lr", math.inf)
    with pytest.raises(ValueError, match=r"^n_heads must be >= 1, got 0$"):
        check_setting(FusionConfig, "n_heads", 0)
    check_setting(HashConfig, "betas", [0.0, 0.999])  # a list, as JSON gives it


def test_settings_moved_into_a_methods_parameters_keep_every_runs_identity():
    """code_weight (ucmfh's) and teacher_weight/teacher_temperature (distill's) were HashConfig fields: a config
    saved then is read with them as its method's parameters (and without them for another method, where they
    did nothing), and every run's identity shows them where they were, so recorded runs keep their keys."""
    from ucmfh.config import from_dict, identity_dict, to_dict
    from ucmfh.methods import hash_config

    for method, moved in (("ucmfh", {"code_weight": 1.0}), ("distill", {"teacher_weight": 0.5,
                                                                       "teacher_temperature": 0.1})):
        now = hash_config(method, method_params=moved)
        saved_then = {k: v for k, v in to_dict(now).items() if k != "method_params"}
        saved_then.update({"method_params": {}, "code_weight": 0.5, "teacher_weight": 0.8, "teacher_temperature": 0.2,
                           **moved})
        assert from_dict(HashConfig, saved_then) == now
        assert identity_dict(now) == {k: v for k, v in saved_then.items() if k not in ("device", "refit")}
    other = hash_config("two-tower")
    saved_then = {**to_dict(other), "code_weight": 0.5, "teacher_weight": 0.8, "teacher_temperature": 0.2}
    assert from_dict(HashConfig, saved_then) == other
    assert identity_dict(other) == {k: v for k, v in saved_then.items() if k not in ("device", "refit")}


def test_a_method_parameter_added_later_keeps_the_runs_recorded_before():
    """ucmfh's fusion_start came after runs of ucmfh were recorded, all of them 'trained': at that value it is no
    part of a run's identity (their keys stand: checkpoints reused, rows grouped with the new ones), a config
    saved then reads back as one made now, and 'random' is a run of its own."""
    from ucmfh.app.identity import key_of
    from ucmfh.config import from_dict, identity_dict, to_dict
    from ucmfh.methods import hash_config

    now = hash_config("ucmfh")
    assert now.method_params == {"code_weight": 0.5, "fusion_start": "trained"}
    saved_then = {**to_dict(now), "method_params": {"code_weight": 0.5}}
    assert from_dict(HashConfig, saved_then) == now
    assert identity_dict(now) == identity_dict(from_dict(HashConfig, saved_then))
    assert "fusion_start" not in identity_dict(now)["method_params"]
    released = hash_config("ucmfh", method_params={"fusion_start": "random"})
    assert key_of(identity_dict(released)) != key_of(identity_dict(now))


def test_a_search_setting_the_backend_has_no_use_for_is_refused_naming_it():
    from ucmfh.config import BackendConfig, SettingError, backend_config

    assert backend_config("faiss-ivf", nprobe=4, nlist=None) == BackendConfig(backend="faiss-ivf", nprobe=4)
    assert backend_config("mih", substrings=3, check_recall=False) == BackendConfig(backend="mih", substrings=3)
    assert backend_config(None) == BackendConfig()
    for backend, setting in (("exact", "nprobe"), ("mih", "ef_search"), ("faiss-hnsw", "nlist"),
                             ("faiss-ivf", "substrings"), ("exact", "check_recall")):
        with pytest.raises(SettingError, match="does not apply to backend") as err:
            backend_config(backend, **{setting: True if setting == "check_recall" else 2})
        assert err.value.setting == setting


def test_blame_overrides_names_the_overrides_that_refuse_alone_else_all():
    from ucmfh.config import SettingError, blame_overrides

    def fusion(extra):
        return FusionConfig(**{"val_fraction": 0.0, **extra})

    assert blame_overrides(fusion, {"d_model": 64}).d_model == 64
    with pytest.raises(SettingError, match=r"^'patience': patience needs a validation split") as err:
        blame_overrides(fusion, {"d_model": 64, "patience": 3})
    assert err.value.settings == ("patience",)
    with pytest.raises(SettingError) as err:  # each is fine alone (4 heads divide 36, 8 divide 512): both named
        blame_overrides(lambda extra: FusionConfig(**extra), {"d_model": 36, "n_heads": 8})
    assert err.value.settings == ("d_model", "n_heads")
    with pytest.raises(ValueError, match="patience needs") as err:  # another setting's: raised as it is
        blame_overrides(lambda extra: FusionConfig(**{"val_fraction": 0.0, "patience": 3, **extra}), {"d_model": 64})
    assert not isinstance(err.value, SettingError)


def test_seps_config_checks_each_override_then_blames_those_that_refuse_together():
    from ucmfh.config import SepsConfig, SettingError, seps_config

    assert seps_config({"epochs": 2}, {"embed_dim": 64}) == SepsConfig(epochs=2, embed_dim=64)
    for overrides, setting, message, instead in [
        ({"nonsense": 1}, "nonsense", r"^'nonsense': SEPS settings are version, selection, dense_text, ", None),
        ({"epochs": 3}, "epochs", r"^'epochs': epochs is a setting of its own, not an override", "epochs"),
        ({"keep_ratio": 2.0}, "keep_ratio", r"^'keep_ratio': keep_ratio must be", None),
        ({"val_fraction": 0.0}, "val_fraction", r"^'val_fraction': patience needs a validation split", None),
    ]:
        with pytest.raises(SettingError, match=message) as err:
            seps_config({"epochs": 2, "patience": 3}, overrides)
        assert err.value.setting == setting and err.value.instead == instead


def test_seps_without_validation_turns_its_default_patience_off():
    """'train-seps --val-fraction 0' failed on the default --patience 5 the user never set; as for the other stages,
    no validation split turns a default patience off, and a patience asked for is still refused without one."""
    from ucmfh.config import SepsConfig, seps_config

    assert seps_config({"val_fraction": 0.0, "patience": None}, {}).patience == 0
    assert seps_config({"val_fraction": None, "patience": None}, {}).patience == SepsConfig.patience
    with pytest.raises(ValueError, match=r"patience needs a validation split \(val_fraction > 0\), got patience=3"):
        seps_config({"val_fraction": 0.0, "patience": 3}, {})


def test_an_integer_for_a_float_setting_is_that_float():
    """``--set hash.val_fraction=0`` gave 0 where ``--val-fraction 0`` gave 0.0: two identities for one
    setting, so the run trained twice and 'ucmfh runs' showed two settings that no legend told apart."""
    from ucmfh.app.identity import key_of
    from ucmfh.config import identity_dict
    from ucmfh.methods import hash_config

    given, typed = hash_config("two-tower", val_fraction=0), hash_config("two-tower", val_fraction=0.0)
    assert type(given.val_fraction) is float and key_of(identity_dict(given)) == key_of(identity_dict(typed))
    assert type(hash_config("two-tower", epochs=3).epochs) is int  # an integer setting stays one


def test_numpy_numbers_are_the_settings_plain_numbers():
    """A code length of numpy.arange trained, then its checkpoint's settings (JSON) failed at the save and left
    a file the next save would not replace (an audit's); hash_config said np.int64(64) was not one length."""
    import numpy as np

    from ucmfh.config import SettingError
    from ucmfh.methods import hash_config, stage_configs

    cfgs = stage_configs("cca-itq", n_bits=np.arange(8, 10)).hashes
    assert [cfg.n_bits for cfg in cfgs] == [8, 9] and all(type(cfg.n_bits) is int for cfg in cfgs)
    assert [cfg.n_bits for cfg in stage_configs("two-tower", n_bits=np.int64(64)).hashes] == [64]
    assert type(hash_config(n_bits=np.int64(64)).n_bits) is int
    cfg = HashConfig(n_bits=np.int32(32), lr_head=np.float32(1e-3), epochs=np.int64(3))
    assert (type(cfg.n_bits), type(cfg.lr_head), type(cfg.epochs)) == (int, float, int)
    json.dumps(dataclasses.asdict(cfg))
    for bad, said in ((64.0, "got 64.0"), ([64, 64.5], "got 64.5")):  # 64.0 was "'float' object is not iterable"
        with pytest.raises(SettingError, match=f"^n_bits must be an integer, {said}$"):
            stage_configs("two-tower", n_bits=bad)


def test_a_dataset_s_reference_epochs_are_found_by_its_letters_whatever_the_spelling():
    """'NUSWIDE' and 'NUS_WIDE' trained 100 epochs where 'nus-wide' trained its reference's 150, silently."""
    from ucmfh.config import default_epochs

    assert [default_epochs(name) for name in ("NUSWIDE", "nus-wide", "data/NUS_WIDE.h5", "MS-COCO", "MIRFlickr")] == \
        [150, 150, 150, 500, 100]
    assert default_epochs("wiki") == default_epochs(None) == FusionConfig.epochs


def test_a_seps_run_of_gumbel_selection_is_another_run_than_before_its_change():
    """Gumbel selection keeps the noisy scores' top K since 2026-11-30 (it kept the scores' own): a run of the
    same settings trained before was reused by the same key, and averaged with new runs as one setting (an
    audit's). Its identity now says which rule it trained by; the other selections' identities are as before."""
    gumbel, learned = SepsConfig(selection="gumbel"), SepsConfig(selection="learned")
    assert identity_dict(gumbel)["gumbel_keeps"] == "noisy top-k" and "gumbel_keeps" not in identity_dict(learned)
    assert set(identity_dict(gumbel)) - set(identity_dict(learned)) == {"gumbel_keeps"}
