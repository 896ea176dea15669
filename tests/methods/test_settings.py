"""A method's settings resolved in the library (ucmfh.methods.settings): a library user gets the configs the
command line builds, and every refusal is a ValueError naming the setting."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

import ucmfh.app.cli as cli
import ucmfh.app.hashing_cli as hashing_cli
from ucmfh.config import FusionConfig, HashConfig, SettingError, default_epochs
from ucmfh.methods import METHODS, hash_config, stage_configs
from ucmfh.methods.settings import (
    SETTINGS, default_loss, fusion_config, scored_protocols, trains_fusion, unused_settings,
)


def _cli_configs(monkeypatch, argv):
    """The (fusion, hashing) configs of each run ``ucmfh train-hash ARGV`` would train, taken where the command
    checks them against interrupted runs, before anything trains."""
    runs = []

    def stop(found, opts):
        runs.extend((run.fusion_cfg, run.hash_cfg) for run in found)
        raise SystemExit(0)

    monkeypatch.setattr(hashing_cli, "check_interrupted", stop)
    result = CliRunner().invoke(cli.main, ["train-hash", *argv])
    assert result.exit_code == 0 and runs, result.output
    return runs


@pytest.mark.parametrize("method, argv, settings", [
    ("distill", ["--epochs", "3", "--val-fraction", "0.2", "--patience", "2", "--batch-size", "32", "-b", "16", "-b", "32",
                 "--set", "fusion.d_model=64", "--set", "hash.hidden=32"],
     dict(epochs=3, val_fraction=0.2, patience=2, batch_size=32, n_bits=[16, 32],
          overrides={"fusion": {"d_model": 64}, "hash": {"hidden": 32}})),
    ("distill", ["--fusion-epochs", "2", "--modality-dropout", "0.3", "--seed", "5"],
     dict(fusion_epochs=2, modality_dropout=0.3, seed=5)),
    ("ucmfh", ["--loss", "infonce", "--loss-param", "temperature=0.5", "--epochs", "2", "--modality-dropout", "0.2",
               "--amp", "bf16", "--beta-schedule", "hashnet", "--lr-fusion", "0"],
     dict(loss="infonce", loss_params={"temperature": 0.5}, epochs=2, modality_dropout=0.2, amp="bf16",
          beta_schedule="hashnet", lr_fusion=0.0)),
    ("cca-itq", ["-b", "8", "--method-param", "iterations=3"], dict(n_bits=[8], method_params={"iterations": 3})),
    ("two-tower", ["--method-param", "temperatures=0.2", "--refit", "--set", "hash.hidden=64"],
     dict(method_params={"temperatures": "0.2"}, refit=True, overrides={"hash": {"hidden": 64}})),
])
def test_a_library_user_gets_the_configs_the_command_line_builds(monkeypatch, tiny_path, method, argv, settings):
    runs = _cli_configs(monkeypatch, ["--method", method, "-d", tiny_path, "--device", "cpu", *argv])
    fusion, hashes = stage_configs(method, dataset=tiny_path, device="cpu", **settings)
    assert runs == [(fusion, cfg) for cfg in hashes]
    assert [cfg.n_bits for cfg in hashes] == settings.get("n_bits", [HashConfig.n_bits])


def test_each_method_resolves_by_its_own_rules():
    """'ucmfh' shares every training setting with its fusion stage and takes the reference's epochs; another
    method starts from its own defaults; a teacher's fusion stage ('distill') takes the student's validation
    settings, else the method's fusion defaults, and its own loss; a method without a fusion stage has none."""
    fusion, [ucmfh] = stage_configs("ucmfh", dataset="data/mscoco.h5", loss="infonce", batch_size=64, val_fraction=0.1)
    assert (fusion.loss, fusion.batch_size, fusion.val_fraction, fusion.epochs) == ("infonce", 64, 0.1, 500)
    assert (ucmfh.loss, ucmfh.batch_size, ucmfh.val_fraction, ucmfh.epochs) == ("infonce", 64, 0.1, 500)
    teacher, [student] = stage_configs("distill", dataset="mscoco", epochs=4)
    assert (teacher.loss, teacher.val_fraction, teacher.patience, teacher.epochs) == ("original", 0.1, 10, 4)
    assert student == hash_config("distill", epochs=4)
    teacher, [student] = stage_configs("distill", val_fraction=0.3, fusion_epochs=2)
    assert (teacher.val_fraction, teacher.patience, teacher.epochs, student.val_fraction) == (0.3, 10, 2, 0.3)
    teacher, _ = stage_configs("distill", val_fraction=0)  # no validation split: no patience either
    assert (teacher.val_fraction, teacher.patience) == (0, 0)
    assert stage_configs("two-tower", dataset="mscoco") == (None, [hash_config("two-tower")])
    assert default_epochs("mirflickr") == default_epochs("/data/mirflickr.h5") == 100
    assert default_epochs("nus-wide") == 150 and default_epochs("synthetic") == default_epochs(None) == FusionConfig.epochs


def test_hash_config_is_one_code_length_of_stage_configs():
    """``hash_config`` resolves by the front doors' rules: a HashConfig field given as itself is the override
    ``hash.FIELD``, a dataset's name sets UCMFH's epochs, and what the method has no use for is refused (named
    as given) or, with ``drop_unused``, left out; an unknown name is refused with the names there are."""
    assert hash_config("ucmfh", dataset="nuswide", n_bits=32) == stage_configs("ucmfh", dataset="nuswide",
                                                                              n_bits=[32]).hashes[0]
    assert hash_config("ucmfh", dataset="nuswide").epochs == 150 and hash_config("ucmfh").epochs == HashConfig.epochs
    given = hash_config("two-tower", n_bits=16, hidden=64, epochs=3, seed=7)
    resolved = stage_configs("two-tower", n_bits=[16], epochs=3, seed=7, overrides={"hash": {"hidden": 64}})
    assert given == resolved.hashes[0]
    for method, settings, setting, why in [
        ("cca-itq", {"hidden": 512}, "hidden", "fixes hidden, whatever is asked"),
        ("cca-itq", {"epochs": 5}, "epochs", "is fitted in closed form"),
        ("two-tower", {"lr_fusion": 1e-3}, "lr_fusion", "trains no fusion stage"),
        ("two-tower", {"hidden": -1}, "hidden", "hidden must be >= 0"),
        ("two-tower", {"loss": "ntxent"}, "loss", "unknown loss 'ntxent'"),
        ("two-tower", {"hiden": 64}, "hiden", "unknown setting 'hiden' (did you mean 'hidden'?); settings are n_bits,"),
        ("two-tower", {"lr": 1e-3}, "lr", "unknown setting 'lr' (did you mean 'lr_fusion' or 'lr_head'?); settings"),
        # a typo of a protocol, and the fusion stage's epochs of a config without it, were dropped without a word
        ("two-tower", {"protocol": "fuse"}, "protocol", "protocol must be one of unimodal, fused, got 'fuse'"),
        ("ucmfh", {"protocol": 3}, "protocol", "protocol must be one of unimodal, fused, got 3"),
        ("ucmfh", {"fusion_epochs": 3}, "fusion_epochs", "hash_config does not return: stage_configs('ucmfh', "),
        ("two-tower", {"fusion_epochs": 3}, "fusion_epochs", "trains no fusion stage"),
    ]:
        with pytest.raises(SettingError, match=re.escape(why)) as refused:
            hash_config(method, **settings)
        assert refused.value.settings == (setting,) and "hash." not in str(refused.value)
    assert hash_config("cca-itq", hidden=512, epochs=5, drop_unused=True) == hash_config("cca-itq")
    assert hash_config("ucmfh", fusion_epochs=3, drop_unused=True) == hash_config("ucmfh")
    with pytest.raises(SettingError, match="protocol must be one of unimodal, fused, got 'fuse'"):
        stage_configs("ucmfh", protocol="fuse")


def test_the_questions_a_front_door_asks_of_a_method():
    assert scored_protocols("two-tower") == ("unimodal",) and scored_protocols("ucmfh") == ("unimodal", "fused")
    assert scored_protocols("cca-itq", ("fused",)) == ("unimodal",)  # 'fused' would repeat 'unimodal'
    assert default_loss("ucmfh") == HashConfig.loss and default_loss("two-tower") == "infonce"
    assert default_loss("cca-itq") is None and default_loss("cirh") is None
    assert [m for m in METHODS if trains_fusion(m)] == ["ucmfh", "distill"]
    assert unused_settings("cca-itq", {"epochs": 3, "seed": 1, "fusion_epochs": None, "protocol": "fused",
                                       "overrides": {"fusion": {"d_model": 64}}}) == {
        "protocol": "is leak-free, its codes having no fused view (scored under unimodal only)",
        "epochs": "is fitted in closed form", "fusion.d_model": "trains no fusion stage"}
    assert unused_settings("ucmfh", {"epochs": 3, "protocol": "fused", "fusion_epochs": 2}) == {}


@pytest.mark.parametrize("method, settings, setting", [
    ("cca-itq", dict(loss="infonce"), "loss"),  # a method with a loss of its own
    ("cirh", dict(loss_params={"temperature": 0.5}), "loss_params"),
    ("two-tower", dict(fusion_epochs=2), "fusion_epochs"),  # a method without a fusion stage
    ("two-tower", dict(modality_dropout=0.2), "modality_dropout"),
    ("two-tower", dict(overrides={"fusion": {"d_model": 64}}), "fusion.d_model"),
    ("cca-itq", dict(epochs=3), "epochs"),  # a method fitted in closed form
    ("cca-itq", dict(refit=False), "refit"),
    ("two-tower", dict(protocol="fused"), "protocol"),  # a leak-free method
    ("two-tower", dict(method_params={"temperatures": "0.3", "nosuch": 1}), "method_params.nosuch"),
    ("two-tower", dict(loss_params={"temperature": "abc"}), "loss_params.temperature"),
    ("ucmfh", dict(loss="triplet", loss_params={"margin": "x"}), "loss_params.margin"),
    ("two-tower", dict(loss="nosuch"), "loss"),
    ("distill", dict(loss="triplet"), "loss"),  # distill's teacher mixes into InfoNCE's targets
    ("ucch", dict(supervised=True), "supervised"),
    ("two-tower", dict(val_fraction=0, refit=True), "refit"),  # the setting whose addition is refused
    ("two-tower", dict(refit=True, val_fraction=0), "val_fraction"),
    ("ucmfh", dict(overrides={"fusion": {"d_model": 30}}), "fusion.d_model"),  # not divisible by the 4 heads
    ("ucmfh", dict(overrides={"hash": {"hidden": "abc"}}), "hash.hidden"),
    ("ucmfh", dict(overrides={"hash": {"nosuch": 1}}), "hash.nosuch"),
    ("ucmfh", dict(overrides={"seps": {"lr": 1}}), "seps.lr"),
    ("ucmfh", dict(hidden=32), "hidden"),  # not a setting: an override of the hashing stage
    ("nosuch", {}, "method"),
])
def test_every_refusal_is_a_value_error_naming_the_setting(method, settings, setting):
    with pytest.raises(ValueError) as refused:
        stage_configs(method, **settings)
    assert isinstance(refused.value, SettingError) and refused.value.setting == setting
    assert setting.split(".")[-1].split("_")[0] in str(refused.value) or setting == "method", str(refused.value)


def test_an_override_of_a_setting_with_an_argument_of_its_own_says_which():
    for key in ("n_bits", "seed", "device", "method"):
        with pytest.raises(SettingError) as refused:
            stage_configs("ucmfh", overrides={"hash": {key: HashConfig().__dict__[key]}})
        assert (refused.value.setting, refused.value.instead) == (f"hash.{key}", key)


def test_several_overrides_refused_together_are_named_together():
    """Overrides refused only together (or each alone) are all named; one that is fine alone is not."""
    with pytest.raises(SettingError) as refused:
        stage_configs("ucmfh", overrides={"fusion": {"d_model": 30, "n_layers": 1}})
    assert refused.value.settings == ("fusion.d_model",)
    with pytest.raises(SettingError) as refused:
        stage_configs("two-tower", overrides={"hash": {"val_fraction": 0.0, "refit": True}})
    assert refused.value.settings == ("hash.val_fraction", "hash.refit")


@pytest.mark.parametrize("method, settings, overrides, refused", [
    ("two-tower", {"epochs": 1}, {"hash": {"epochs": 2}}, ("hash.epochs", "epochs")),
    ("two-tower", {"val_fraction": 0.2}, {"hash": {"val_fraction": 0.0}}, ("hash.val_fraction", "val_fraction")),
    ("distill", {"fusion_epochs": 1}, {"fusion": {"epochs": 2}}, ("fusion.epochs", "fusion_epochs")),
    ("ucmfh", {"batch_size": 64}, {"fusion": {"batch_size": 32}}, ("fusion.batch_size", "batch_size")),
])
def test_a_setting_given_twice_is_refused(method, settings, overrides, refused):
    """A setting given as itself and as an override: one would win without a word (the override did)."""
    with pytest.raises(SettingError, match="given twice") as err:
        stage_configs(method, overrides=overrides, **settings)
    assert (err.value.setting, err.value.instead) == refused


def test_an_override_of_a_setting_the_method_fixes_is_refused():
    """cca-itq fixes the settings of training by steps: an override of one did nothing, silently."""
    with pytest.raises(SettingError, match="fixes batch_size, whatever is asked") as err:
        stage_configs("cca-itq", overrides={"hash": {"batch_size": 64}})
    assert err.value.setting == "hash.batch_size"
    _, [cfg] = stage_configs("cca-itq", drop_unused=True, overrides={"hash": {"batch_size": 64, "hidden": 5}})
    assert (cfg.batch_size, cfg.hidden) == (HashConfig().batch_size, 0)


def test_a_setting_the_method_fixes_is_refused_by_its_flag_too():
    """--beta-schedule for DJSRH (which fixes its β schedule) was applied silently as nothing, where the override
    hash.beta_schedule was refused; a grid leaves it to the methods that take it."""
    with pytest.raises(SettingError, match="method 'djsrh' fixes beta_schedule, whatever is asked") as err:
        stage_configs("djsrh", beta_schedule="none")
    assert err.value.setting == "beta_schedule"
    _, [cfg] = stage_configs("djsrh", drop_unused=True, beta_schedule="none")
    assert cfg.beta_schedule == "step"
    _, [cfg] = stage_configs("two-tower", beta_schedule="none")
    assert cfg.beta_schedule == "none"


def test_a_grid_drops_what_a_method_has_no_use_for():
    """``drop_unused``: one set of settings serving several methods; each takes those it uses."""
    settings = dict(epochs=3, fusion_epochs=2, modality_dropout=0.3, overrides={"fusion": {"d_model": 64}})
    fusion, [cca] = stage_configs("cca-itq", drop_unused=True, **settings)
    assert fusion is None and cca == hash_config("cca-itq")
    fusion, [tower] = stage_configs("two-tower", drop_unused=True, **settings)
    assert fusion is None and tower == hash_config("two-tower", epochs=3)
    fusion, _ = stage_configs("ucmfh", drop_unused=True, **settings)
    assert (fusion.epochs, fusion.modality_dropout, fusion.d_model) == (2, 0.3, 64)


def test_every_setting_has_a_flag():
    from ucmfh.app.options import FLAGS

    assert not [name for name in SETTINGS if name not in FLAGS]


def test_ucmfh_takes_refit_for_its_hashing_stage_and_refuses_it_without_validation():
    """--refit reaches ucmfh's hashing stage (it was once dropped without a word); without a validation split
    there is no epoch to refit for, and the refusal names the setting."""
    fusion, hashes = stage_configs("ucmfh", dataset="wiki", n_bits=[16], refit=True, val_fraction=0.1)
    assert hashes[0].refit and hashes[0].val_fraction == 0.1 and not hasattr(fusion, "refit")
    with pytest.raises(SettingError) as err:
        stage_configs("ucmfh", dataset="wiki", n_bits=[16], refit=True)
    assert err.value.setting == "refit"


@pytest.mark.parametrize("overrides", [{"hash": {"loss": "infonce"}}, {"hash": {"loss_params": {"temperature": 0.1}}}])
def test_a_loss_override_for_a_method_with_a_loss_of_its_own_is_refused(overrides):
    """--set hash.loss=... for djsrh did nothing but change the run's identity: refused, naming the override."""
    with pytest.raises(SettingError, match="has a loss of its own") as err:
        stage_configs("djsrh", n_bits=[16], overrides=overrides)
    assert err.value.setting == f"hash.{next(iter(overrides['hash']))}"
    # a grid's override for its methods that take a loss: not applied to this one (and said so by the grid)
    _, [cfg] = stage_configs("djsrh", n_bits=[16], overrides=overrides, drop_unused=True)
    assert cfg == stage_configs("djsrh", n_bits=[16])[1][0]


def test_a_moved_setting_given_as_an_override_points_to_the_method_parameter(tmp_path):
    with pytest.raises(SettingError, match="a parameter of method 'ucmfh'") as err:
        stage_configs("ucmfh", n_bits=[16], overrides={"hash": {"code_weight": 1.0}})
    assert err.value.instead == "method_params"
    result = CliRunner().invoke(cli.main, ["train-hash", "--method", "ucmfh", "--set", "hash.code_weight=1",
                                           "--out", str(tmp_path), "--device", "cpu"])
    assert result.exit_code == 2 and "use --method-param" in result.output, result.output
    _, [cfg] = stage_configs("ucmfh", n_bits=[16], method_params={"code_weight": 1.0})
    assert cfg.method_params["code_weight"] == 1.0
    with pytest.raises(SettingError, match="code_weight"):
        stage_configs("ucmfh", n_bits=[16], method_params={"code_weight": -1.0})
    with pytest.raises(SettingError, match="teacher_weight"):
        stage_configs("distill", n_bits=[16], method_params={"teacher_weight": 1.5})


def test_an_override_without_a_field_names_what_was_given():
    """--set foo=1 was refused as 'foo.' (a dot the user never typed)."""
    with pytest.raises(SettingError, match=r"^'foo': expected fusion.FIELD or hash.FIELD$"):
        stage_configs("ucmfh", overrides={"foo": {"": 1}})


@pytest.mark.parametrize("method, settings, why", [
    ("two-tower", {}, "trains with 'infonce', which uses no labels (pairwise does)"),
    ("djsrh", {}, "trains with a loss of its own, which uses no labels (pairwise does)"),
    ("ucmfh", {}, "trains with 'original', which uses no labels (pairwise does)"),
])
def test_supervised_training_with_no_loss_that_uses_labels_is_refused(method, settings, why):
    """--supervised gives the loss the labels: with a loss that ignores them it trained the same model under
    another run key (two runs, one result). The pairwise loss uses them: accepted there."""
    with pytest.raises(SettingError, match=re.escape(f"method {method!r} {why}: it has no use for supervised")):
        stage_configs(method, supervised=True, **settings)
    _, [cfg] = stage_configs("two-tower", supervised=True, loss="pairwise")
    assert cfg.supervised and cfg.loss == "pairwise"
    with pytest.raises(SettingError, match=r"the fusion stage trains with 'original', which uses no labels"):
        fusion_config(supervised=True)
    assert fusion_config(supervised=True, loss="pairwise").supervised


def test_fusion_config_takes_its_fields_and_refuses_one_of_a_setting_given():
    """Its refusal of an unknown setting pointed at overrides={'hash': ...}; an override of a setting given too
    won silently."""
    # a field of FusionConfig is taken as itself, as hash_config takes HashConfig's (it was refused; an audit's)
    assert fusion_config(d_model=128).d_model == 128 == fusion_config(overrides={"fusion": {"d_model": 128}}).d_model
    with pytest.raises(SettingError, match=r"^unknown setting 'd_modl' \(did you mean 'd_model'\?\); settings are "
                                           r"loss, .*, lr and the fields of FusionConfig$"):
        fusion_config(d_modl=128)
    with pytest.raises(SettingError, match=r"^'d_model': d_model must be >= 1, got 0$"):
        fusion_config(d_model=0)
    with pytest.raises(SettingError, match=re.escape("'fusion.d_model': given twice, as d_model and as an override")):
        fusion_config(d_model=64, overrides={"fusion": {"d_model": 128}})
    with pytest.raises(SettingError, match=re.escape("'fusion.epochs': given twice, as epochs and as an override")):
        fusion_config(epochs=1, overrides={"fusion": {"epochs": 2}})


def test_a_fusion_stage_whose_loss_ignores_labels_is_the_unsupervised_one():
    """ucmfh --supervised with a pairwise hashing loss: its fusion stage ('original') cannot use the labels, so it
    is the unsupervised stage (reused as such), not one more run key for the same model."""
    fusion, [hashing] = stage_configs("ucmfh", supervised=True, overrides={"hash": {"loss": "pairwise"}})
    assert (fusion.supervised, hashing.supervised, hashing.loss) == (False, True, "pairwise")
    assert fusion == stage_configs("ucmfh", overrides={"hash": {"loss": "pairwise"}}).fusion
    fusion, _ = stage_configs("ucmfh", supervised=True, loss="pairwise")
    assert fusion.supervised and fusion.loss == "pairwise"


@pytest.mark.parametrize("setting, value", [("hash.relaxation", "sign"), ("beta_schedule", "step"),
                                            ("hash.beta_gamma", 0.1)])
def test_a_relaxation_setting_for_a_method_that_relaxes_its_own_way_is_refused(setting, value):
    """--set hash.relaxation=sign for UCCH (its codes relaxed by its own loss) trained a new run, identical to the
    default's, under another settings key (an audit's, with a method of another package): refused, naming it;
    a grid leaves it to the methods that take it."""
    name = setting.split(".")[-1]
    given = {"overrides": {"hash": {name: value}}} if setting.startswith("hash.") else {name: value}
    with pytest.raises(SettingError, match="method 'ucch' relaxes its codes its own way") as err:
        stage_configs("ucch", n_bits=[16], **given)
    assert err.value.setting == setting
    _, [cfg] = stage_configs("ucch", n_bits=[16], drop_unused=True, **given)
    assert cfg == stage_configs("ucch", n_bits=[16])[1][0]
    _, [tower] = stage_configs("two-tower", n_bits=[16], **given)  # two-tower takes it
    assert getattr(tower, name) == value
