"""``HashConfig.refit``: the setting validation chose, trained again on the whole training split."""
from __future__ import annotations

import dataclasses

import pytest

import ucmfh.trainer as trainer_module
from ucmfh.config import HashConfig, identity_dict
from ucmfh.signals import TrainingInterrupted
from ucmfh.training_state import StateFile
from ucmfh.methods import METHODS, build_method, fit_hashing, hash_config

from conftest import StopAfter
from test_methods import _same_weights as same_weights

TRAINED = [name for name, spec in METHODS.items() if not spec.closed_form and not spec.uses_fusion]


def config(name: str, **kw) -> HashConfig:
    return hash_config(name, drop_unused=True, **{"n_bits": 16, "hidden": 32, "epochs": 4, "batch_size": 64,
                                                  "device": "cpu", "val_fraction": 0.2, "patience": 0, "refit": True,
                                                  **kw})


@pytest.mark.parametrize("name", TRAINED)
def test_a_refit_is_the_chosen_setting_trained_on_the_whole_split_for_the_chosen_epochs(tiny, name):
    """The kept model is the one a run of the chosen candidate without validation (val_fraction 0) trains for
    the best epoch's number of epochs, bit for bit; the validation record is the run's that chose it."""
    cfg = config(name)
    model, history = fit_hashing(tiny, cfg, progress=False)
    without, chosen = fit_hashing(tiny, dataclasses.replace(cfg, refit=False), progress=False)
    assert history.validation == chosen.validation and history.best_epoch == chosen.best_epoch
    candidates = build_method(name).choices(cfg)
    setting = candidates[chosen.chosen] if chosen.chosen else next(iter(candidates.values()), cfg)
    whole = dataclasses.replace(setting, val_fraction=0.0, epochs=chosen.best_epoch, refit=False)
    alone, alone_history = fit_hashing(tiny, whole, progress=False)
    assert same_weights(model, alone) and not same_weights(model, without)
    assert history.refit_epochs == chosen.best_epoch and history.refit_loss == list(alone_history)
    assert history.as_dict()["refit_epochs"] == chosen.best_epoch


def test_an_interrupted_refit_resumes_to_the_same_model(tiny, tmp_path, monkeypatch):
    """Stopped during the refit (after both candidates have finished), the run resumes the refit from its own
    state and ends with the model of a run never stopped."""
    cfg = config("two-tower", epochs=3)
    reference, _ = fit_hashing(tiny, cfg, progress=False)
    bars = StopAfter(None)
    monkeypatch.setattr(trainer_module, "tqdm", bars)
    state = StateFile(str(tmp_path / "hash16.state.pt"), interval_s=1e9)
    original = trainer_module.train

    def stop_in_refit(plan, run_cfg, *args, **kwargs):  # the refit is the run without validation
        bars.epochs = 1 if run_cfg.val_fraction == 0 else None
        return original(plan, run_cfg, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "train", stop_in_refit)
    with pytest.raises(TrainingInterrupted, match=r"hash16\.refit\.state\.pt"):
        fit_hashing(tiny, cfg, progress=False, state=state)
    monkeypatch.setattr(trainer_module, "train", original)
    bars.epochs = None
    resumed, history = fit_hashing(tiny, cfg, progress=False, state=StateFile(state.path, resume=True))
    assert bars.starts[-1] == 1  # the refit went on from its saved epoch
    assert same_weights(reference, resumed) and history.refit_epochs is not None


def test_refit_without_a_validation_split_is_refused_and_closed_form_methods_ignore_it():
    with pytest.raises(ValueError, match="refit needs a validation split"):
        hash_config("two-tower", val_fraction=0.0, refit=True)
    with pytest.raises(ValueError, match="'cca-itq' is fitted in closed form: it has no use for refit"):
        hash_config("cca-itq", refit=True)  # fitted once on the whole split already
    assert hash_config("cca-itq", refit=True, drop_unused=True).refit is False


def test_refit_off_leaves_a_runs_identity_as_it_was_before_the_setting():
    """Runs recorded before ``refit`` existed keep their identity (run folders, states, results rows)."""
    cfg = hash_config("two-tower")
    assert "refit" not in identity_dict(cfg)
    assert identity_dict(dataclasses.replace(cfg, refit=True))["refit"] is True


def test_refit_from_the_command_line(tiny_path, tmp_path):
    """``--refit`` reaches the method's config, its row records the epochs trained again, and the
    commands that cannot refit refuse it (exit 2) instead of ignoring it."""
    import json

    from click.testing import CliRunner

    from ucmfh.app.cli import main

    runner, results = CliRunner(), tmp_path / "r.jsonl"
    common = ["-d", tiny_path, "-b", "16", "--results", str(results), "--out", str(tmp_path / "runs"), "--device",
              "cpu", "--quiet", "--epochs", "2", "--set", "hash.hidden=32"]
    result = runner.invoke(main, ["train-hash", *common, "--refit"])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in results.read_text().splitlines()]
    assert row["settings"]["hash"]["refit"] is True and row["refit_epochs"] == row["best_epoch"]
    closed_form = ["-d", tiny_path, "-b", "16", "--out", str(tmp_path / "runs"), "--method", "cca-itq", "--refit"]
    for argv, hint in ((["train-hash", *closed_form], "Invalid value for --refit"),
                       (["train-hash", *common, "--refit", "--val-fraction", "0"], "refit needs a validation split"),
                       (["train-fusion", "-d", tiny_path, "--refit"], "No such option")):
        bad = runner.invoke(main, argv)
        assert bad.exit_code == 2 and hint in bad.output, bad.output

