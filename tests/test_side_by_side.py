"""A run's candidates trained side by side in threads (ucmfh.side_by_side, --candidates-side-by-side): the models
and the choice of one after another; stopped by a signal, both states saved, resumed to the same model; an error
in one stops the other and is raised once both have ended."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest
import torch
from click.testing import CliRunner

import ucmfh.trainer as trainer
from conftest import SigtermFromAThread
from ucmfh import signals
from ucmfh.app.cli import main
from ucmfh.app.experiment import VARYING
from ucmfh.methods import fit_hashing, hash_config
from ucmfh.side_by_side import candidates_side_by_side, side_by_side
from ucmfh.signals import TrainingInterrupted
from ucmfh.training_state import StateFile


def _cfg():
    # two-tower chooses between two temperatures on validation; dropout: every step draws from the generator
    return hash_config("two-tower", n_bits=16, epochs=3, batch_size=32, device="cpu", dropout=0.3)


def _weights(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


@pytest.fixture(scope="module")
def one_after_another(tiny):
    model, history = fit_hashing(tiny, _cfg(), progress=False)
    return _weights(model), history


def test_candidates_side_by_side_train_the_models_and_the_choice_of_one_after_another(tiny, one_after_another):
    weights, history = one_after_another
    with candidates_side_by_side():
        model, side = fit_hashing(tiny, _cfg(), progress=False)
    assert _same(_weights(model), weights)
    assert side.chosen == history.chosen and side.choice_scores == history.choice_scores
    assert len(side.choice_scores) == 2 and side.as_dict() == history.as_dict()


def test_a_signal_stops_both_candidates_with_their_states_saved_and_the_run_resumes_to_the_same_model(
        tiny, one_after_another, tmp_path, monkeypatch):
    state = StateFile(str(tmp_path / "hash16.state.pt"), interval_s=1e9)
    monkeypatch.setattr(trainer, "tqdm", SigtermFromAThread)
    with candidates_side_by_side(), pytest.raises(TrainingInterrupted) as stopped:
        fit_hashing(tiny, _cfg(), progress=True, state=state)
    assert "interrupted by SIGTERM at epoch 2/3" in str(stopped.value) and stopped.value.signum == signal.SIGTERM
    assert sorted(os.listdir(tmp_path)) == ["hash16.t0.1.state.pt", "hash16.t0.3.state.pt"]  # each candidate's
    said = str(stopped.value)  # both named (the first candidate's alone was)
    assert all(str(tmp_path / name) in said for name in os.listdir(tmp_path)) and "the others' states: " in said
    assert not signals._IN_THREADS
    monkeypatch.undo()
    with candidates_side_by_side():
        model, _ = fit_hashing(tiny, _cfg(), progress=False, state=StateFile(state.path, resume=True))
    assert _same(_weights(model), one_after_another[0])


def test_an_error_in_one_fit_stops_the_other_at_its_next_step_and_is_raised_once_both_have_ended():
    looping, stopped_by = threading.Event(), []

    def training():  # a training loop: it stops where its flag says so
        with signals.stop_on_signals() as flag:
            looping.set()
            deadline = time.monotonic() + 60
            while flag["signal"] is None and time.monotonic() < deadline:
                time.sleep(0.01)
            stopped_by.append(flag["signal"])
            raise TrainingInterrupted("interrupted by SIGTERM; training state saved", None, flag["signal"])

    def failing():
        assert looping.wait(60)
        raise ValueError("damaged features")

    began = time.monotonic()
    with pytest.raises(ValueError, match="damaged features"):  # the error, not the interrupt it caused
        side_by_side([training, failing], torch.device("cpu"))
    assert stopped_by == [signal.SIGTERM] and time.monotonic() - began < 30 and not signals._IN_THREADS
    assert side_by_side([lambda: 1, lambda: 2], torch.device("cpu")) == [1, 2]  # results in the fits' order


def test_the_flag_trains_the_rows_of_a_run_without_it(tiny_path, tmp_path):
    rows = []
    for folder, flag in (("plain", []), ("side", ["--candidates-side-by-side"])):
        result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "two-tower", "-b", "16",
                                           "--epochs", "2", "--device", "cpu", "--out", str(tmp_path / folder),
                                           "--results", str(tmp_path / f"{folder}.jsonl"), "--quiet", *flag])
        assert result.exit_code == 0, result.output
        rows.append((tmp_path / f"{folder}.jsonl").read_text())
    plain, side = ([{k: v for k, v in row.items() if k not in VARYING}
                    for row in map(json.loads, text.splitlines())] for text in rows)
    assert plain == side and plain[0]["choice_val_scores"].keys() == {"t0.1", "t0.3"}


def test_the_flag_and_torchrun_s_ranks_are_refused_together(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it (the command alone: no process group joined)
    train_hash = main.get_command(None, "train-hash")
    result = CliRunner().invoke(train_hash, ["-d", tiny_path, "--candidates-side-by-side", "--out",
                                             str(tmp_path / "runs")])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        "Error: Invalid value for '--candidates-side-by-side': candidates side by side and torchrun's ranks do not "
        "mix: use one or the other")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, said", [
    (["--method", "cca-itq"], "method 'cca-itq' trains one model here: it has no candidates to choose between on "
                              "validation"),
    (["--method", "djsrh", "--epochs", "1"], "method 'djsrh' trains one model here"),
    (["--val-fraction", "0", "--epochs", "1"], "without a validation split (--val-fraction 0) method 'two-tower' "
                                               "trains its first candidate alone"),
])
def test_the_flag_is_refused_where_there_are_no_candidates(tiny_path, tmp_path, args, said):
    """The flag was taken, and did nothing, for a method of one model and a run without a validation split."""
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--candidates-side-by-side", *args, "--out",
                                       str(tmp_path / "runs"), "--results", ""])
    last = result.output.splitlines()[-1]
    assert result.exit_code == 2 and last.startswith("Error: Invalid value for --candidates-side-by-side: ") \
        and said in last, result.output
    assert not (tmp_path / "runs").exists()


def test_a_grid_refuses_the_flag_where_no_cell_has_candidates_and_notes_the_methods_without(tiny_path, tmp_path):
    common = ["grid", "-d", tiny_path, "-b", "8", "--candidates-side-by-side", "--out", str(tmp_path / "runs"),
              "--results", str(tmp_path / "r.jsonl"), "--table", str(tmp_path / "t"), "--device", "cpu"]
    refused = CliRunner().invoke(main, [*common, "--methods", "cca-itq,djsrh"])
    assert refused.exit_code == 2 and refused.output.splitlines()[-1].startswith(
        "Error: Invalid value for --candidates-side-by-side: no cell of the grid trains candidates to choose between: "
        "method 'cca-itq' trains one model here"), refused.output
    noted = CliRunner().invoke(main, [*common, "--methods", "cca-itq,two-tower", "--epochs", "1", "--set",
                                      "hash.hidden=32"])
    assert noted.exit_code == 0, noted.output
    assert ("note: --candidates-side-by-side not applied: method 'cca-itq' trains one model here: it has no "
            "candidates to choose between on validation") in noted.stderr  # beside the grid's other notes


def test_a_fit_s_own_stream_waits_for_the_work_before_it_and_its_thread_for_the_fit_s(monkeypatch):
    """On CUDA (a recording stand-in for torch.cuda's streams: no GPU here): the fit's stream is made on the device
    asked, first waits for the launching thread's stream, is current inside the block only, and the thread's stream
    waits for it at the end, also when the fit fails; off CUDA, no stream at all."""
    from ucmfh.side_by_side import own_stream

    said = []

    class Stream:
        def __init__(self, name, device=None):
            self.name, self.device, self.cuda_stream = name, device, id(self)  # a handle of its own

        def wait_stream(self, other):
            said.append(f"{self.name} waits for {other.name}")

    current = [Stream("launcher")]

    @contextlib.contextmanager
    def stream(s):
        current.append(s)
        said.append(f"in {s.name}")
        try:
            yield
        finally:
            current.pop()
            said.append(f"out of {s.name}")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("fit's", device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1])
    monkeypatch.setattr(torch.cuda, "stream", stream)
    with pytest.raises(RuntimeError):
        with own_stream(torch.device("cuda", 1)):
            said.append(f"the fit runs on {current[-1].name}, device {current[-1].device}")
            raise RuntimeError("the fit fails")
    assert said == ["fit's waits for launcher", "in fit's", "the fit runs on fit's, device cuda:1", "out of fit's",
                    "launcher waits for fit's"]
    said.clear()
    with own_stream(torch.device("cpu")):
        pass
    assert said == []


def test_a_stream_of_its_own_is_no_other_live_one_s(monkeypatch):
    """PyTorch's streams come from a pool of 32 a device, round-robin: the 33rd asked for is the first again, and
    two runs side by side could share one (one's work recorded into the other's graph). unshared_stream draws
    again past the live ones; a stream let go is drawn again."""
    import gc

    from ucmfh import streams

    class PoolStream:  # a pool of 4, round-robin, as PyTorch's of 32
        drawn = 0

        def __init__(self, device=None):
            self.device, self.cuda_stream = "cuda:0", PoolStream.drawn % 4
            PoolStream.drawn += 1

    monkeypatch.setattr(streams, "_LIVE", {})
    live = [streams.unshared_stream(make=PoolStream) for _ in range(3)]
    assert [s.cuda_stream for s in live] == [0, 1, 2]
    fourth = streams.unshared_stream(make=PoolStream)
    fifth = streams.unshared_stream(make=PoolStream)  # the pool's first again, live: drawn past
    assert fourth.cuda_stream == 3 and fifth.cuda_stream in (0, 1, 2, 3)  # every one live: shared, as it must be
    del live[1], fifth
    gc.collect()
    assert streams.unshared_stream(make=PoolStream).cuda_stream == 1  # let go: drawn again
