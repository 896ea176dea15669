"""Training curves: each epoch of every stage reported to the logs listening, as TensorBoard event files
(``ucmfh.training_log``), one curve per candidate and refit, a resumed run's points replacing its interrupted
tail."""
import builtins
import shutil

import pytest

import ucmfh.trainer as trainer_module
from conftest import method_config
from ucmfh.methods import fit_hashing
from ucmfh.training_log import EpochRecord, TensorBoardLog, logging_to
from ucmfh.training_state import StateFile

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


class Records:
    """A log that keeps what it is told."""

    def __init__(self):
        self.records, self.closed = [], False

    def record(self, record: EpochRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        self.closed = True


def curves(folder):
    """tag -> [(step, value)] of one TensorBoard run folder, as TensorBoard reads it (purged points gone)."""
    acc = event_accumulator.EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_every_epoch_of_every_candidate_and_the_refit_is_recorded_as_the_history_has_it(tiny, tmp_path):
    log = Records()
    cfg = method_config("two-tower", epochs=3, refit=True, method_params={"temperatures": "0.3,0.1"})
    with logging_to(log):
        _, history = fit_hashing(tiny, cfg, progress=False)
    assert log.closed
    parts = {r.part for r in log.records}
    assert parts == {"t0.3", "t0.1", "refit"} and {r.stage for r in log.records} == {"two-tower 16 bits"}
    chosen = [r for r in log.records if r.part == history.chosen]
    assert [r.epoch for r in chosen] == [1, 2, 3]
    assert [r.loss for r in chosen] == pytest.approx(list(history))
    assert [[r.epoch, r.validation] for r in chosen] == history.validation
    refit = [r for r in log.records if r.part == "refit"]
    assert [r.loss for r in refit] == pytest.approx(history.refit_loss) and all(r.validation is None for r in refit)
    assert all(r.learning_rates == [cfg.lr_head] and set(r.scalars) == {"beta"} and r.seconds > 0
               for r in log.records)


def test_tensorboard_curves_of_a_resumed_run_equal_those_of_a_run_never_stopped(tiny, tmp_path, monkeypatch):
    cfg = method_config("djsrh", epochs=4, patience=0)
    with logging_to(TensorBoardLog(str(tmp_path / "whole"))):
        fit_hashing(tiny, cfg, progress=False)
    whole = curves(tmp_path / "whole" / "djsrh-16-bits")
    assert [step for step, _ in whole["loss"]] == [1, 2, 3, 4]
    assert set(whole) == {"loss", "validation", "lr/0", "lr/1", "alpha", "seconds"}

    # a run killed after epoch 4 had written its curves, its last saved state at the end of epoch 2: resumed,
    # it trains epochs 3 and 4 again, and their new points replace the old ones
    state, saved_at_2 = tmp_path / "hash16.state.pt", tmp_path / "saved-at-2.pt"
    write_state = trainer_module.write_state

    def keep_epoch_2(path, payload):
        write_state(path, payload)
        if payload["epoch"] == 2:
            shutil.copy(path, saved_at_2)

    monkeypatch.setattr(trainer_module, "write_state", keep_epoch_2)
    with logging_to(TensorBoardLog(str(tmp_path / "resumed"))):
        fit_hashing(tiny, cfg, progress=False, state=StateFile(str(state), interval_s=0))
    monkeypatch.undo()
    shutil.copy(saved_at_2, state)
    with logging_to(TensorBoardLog(str(tmp_path / "resumed"))):
        fit_hashing(tiny, cfg, progress=False, state=StateFile(str(state), resume=True))
    resumed = curves(tmp_path / "resumed" / "djsrh-16-bits")
    for tag in ("loss", "validation", "alpha", "lr/0"):
        assert resumed[tag] == whole[tag], tag  # one point per epoch, none twice, the same values


def test_without_tensorboard_the_log_names_the_extra(monkeypatch):
    real = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ImportError, match=r"pip install 'ucmfh\[tensorboard\]'"):
        TensorBoardLog("anywhere")
