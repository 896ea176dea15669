"""``ucmfh runs --history RUN``: a finished run's epoch history read back from its checkpoint."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.checkpoint import read_checkpoint
from ucmfh.files import read_jsonl


@pytest.fixture(scope="module")
def trained(tiny_path, tmp_path_factory):
    """A two-tower run that chose between two temperatures on validation, then refit."""
    tmp = tmp_path_factory.mktemp("history")
    results = tmp / "r.jsonl"
    result = CliRunner().invoke(main, [
        "train-hash", "-d", tiny_path, "--method", "two-tower", "-b", "16", "--epochs", "3", "--refit",
        "--set", "hash.hidden=32", "--device", "cpu", "--quiet", "--out", str(tmp / "runs"),
        "--results", str(results)])
    assert result.exit_code == 0, result.output
    row = read_jsonl(results)[0]
    return row, results


def test_history_prints_every_epoch_as_the_checkpoint_holds_it(trained):
    row, results = trained
    history = read_checkpoint(row["checkpoint"])["meta"]["history"]
    by_key = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", row["run"][:8], "--json"])
    by_path = CliRunner().invoke(main, ["runs", "--history", row["checkpoint"], "--json"])
    assert by_key.exit_code == 0 and by_key.output == by_path.output, by_key.output
    epochs = [json.loads(line) for line in by_key.output.splitlines()]
    run = [e for e in epochs if e["part"] == ""]
    assert [e["loss"] for e in run] == history["loss"] and len(run) == 3
    assert [[e["epoch"], e["validation"]] for e in run] == history["validation"]
    assert [e["epoch"] for e in run if e["kept"]] == [history["best_epoch"]]
    assert [e["loss"] for e in epochs if e["part"] == "refit"] == history["refit_loss"]
    # each line whole, as the table's head says it: its run's checkpoint and the candidate it chose
    assert {(e["checkpoint"], e["chosen"]) for e in epochs} == {(row["checkpoint"], history["chosen"])}
    text = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", row["run"]]).output
    assert f"validation kept epoch {history['best_epoch']}" in text and f"chose {history['chosen']}" in text
    assert "then refit for" in text and len(text.splitlines()) == 2 + len(epochs)


def test_an_older_ucmfh_s_history_is_read_as_it_was_kept(trained, tmp_path):
    """A checkpoint of an older ucmfh kept its losses alone (meta 'loss_history', 2026-11-23) and its choice as
    'relaxation' and 'candidates' (2026-11-25): the first was said to hold no history ('a checkpoint written by
    hand'), the second's choice was left out (an audit of a study across an upgrade)."""
    import torch

    row, _ = trained
    payload = torch.load(row["checkpoint"], map_location="cpu", weights_only=True)
    history = payload["meta"].pop("history")
    older = {"losses alone": {"loss_history": history["loss"]},
             "a choice": {"history": {"loss": history["loss"], "relaxation": "tanh",
                                      "candidates": {"sign": 0.6636, "tanh": 0.6641}}}}
    said = {}
    for name, meta in older.items():
        path = tmp_path / f"{name}.pt"
        torch.save({**payload, "meta": {**payload["meta"], **meta}}, path)
        result = CliRunner().invoke(main, ["runs", "--history", str(path)])
        assert result.exit_code == 0, result.output
        said[name] = result.output.splitlines()
    assert said["losses alone"][0] == f"{tmp_path / 'losses alone.pt'}: 3 epochs"
    assert said["a choice"][0] == f"{tmp_path / 'a choice.pt'}: 3 epochs; chose tanh (sign 0.6636, tanh 0.6641)"
    assert [line.split()[2] for line in said["losses alone"][2:]] == [f"{loss:.4f}" for loss in history["loss"]]


@pytest.mark.parametrize("run, problem", [("nosuchrun", "neither a checkpoint file nor a run of"),
                                          ("SHARED", "runs of"), ("", "an empty run key")])
def test_a_run_that_is_not_one_is_refused_in_one_line(trained, run, problem):
    row, results = trained
    if run == "SHARED":  # a prefix two runs of the file share: ambiguous
        rows = read_jsonl(results)
        first = rows[0]["run"]
        other = dict(rows[0], run=first[0] + ("f" if first[1] != "f" else "0") * 15)
        (results.parent / "two.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps(other) + "\n")
        results, run = results.parent / "two.jsonl", first[0]
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", run])
    assert result.exit_code == 2 and "--history" in result.output and problem in result.output, result.output


def test_a_run_the_filters_leave_out_is_said_to_be_left_out_not_absent(trained):
    """'runs --history RUN -b 128' said RUN was 'neither a checkpoint file nor a run of' the file (an audit's)."""
    row, results = trained
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", row["run"][:6], "-b", "128",
                                       "--seed", str(row["seed"])])
    assert result.exit_code == 2 and result.output.splitlines()[-1] == (
        f"Error: Invalid value for --history: {row['run'][:6]}: a run of {results}, but none of its rows passes the "
        "filters given (--n-bits, --seed)"), result.output


def test_history_plot_draws_the_epochs_the_checkpoint_holds(trained, tmp_path):
    pytest.importorskip("matplotlib")
    from ucmfh.app.history import history_figure
    from ucmfh.files import MARKS

    row, results = trained
    history = read_checkpoint(row["checkpoint"])["meta"]["history"]
    figure = history_figure(row["checkpoint"], history, what="two-tower 16 bits")
    # the line of the run's epochs is the chosen candidate's (it was 'run'), the title says what the run is
    assert figure["loss"][f"candidate {history['chosen']}"] == ([1, 2, 3], history["loss"])
    assert figure["title"].startswith("two-tower 16 bits, ")
    assert figure["loss"]["refit"] == (list(range(1, len(history["refit_loss"]) + 1)), history["refit_loss"])
    assert [list(p) for p in zip(*figure["validation"])] == history["validation"]
    assert figure["kept"] == (history["best_epoch"], dict(history["validation"])[history["best_epoch"]])
    assert f"chose {history['chosen']}" in figure["title"]
    prefix = str(tmp_path / "h")
    import ucmfh.app.history as history_module

    figures = []
    draw = history_module.draw_history
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(history_module, "draw_history", lambda figure, *a: (figures.append(figure), draw(figure, *a))[1])
        drawn = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", row["run"], "--plot",
                                          prefix])
    assert drawn.exit_code == 0, drawn.output
    assert figures[0]["title"].startswith("tiny: two-tower 16 bits, ")  # read from the checkpoint
    for suffix, kind in ((".png", "figure"), (".svg", "figure-svg")):
        assert MARKS[kind] in open(f"{prefix}_history{suffix}", "rb").read(4096)
    (tmp_path / "mine_history.png").write_bytes(b"my own picture")  # a file of the user's is never replaced
    refused = CliRunner().invoke(main, ["runs", "--history", row["checkpoint"], "--plot", str(tmp_path / "mine")])
    assert refused.exit_code == 2 and "--plot" in refused.output and "Traceback" not in refused.output
    assert (tmp_path / "mine_history.png").read_bytes() == b"my own picture"
    both = CliRunner().invoke(main, ["runs", "--history", row["checkpoint"], "--plot", prefix, "--json"])
    assert both.exit_code == 2 and "--plot does not go with --json" in both.output


def test_a_run_neither_a_file_nor_findable_names_the_run_not_only_the_results_file(tmp_path):
    """--history with a checkpoint path that does not exist, where no results file is either: the error
    names the --history argument and the results file it would have looked the key up in."""
    missing = tmp_path / "gone.pt"
    result = CliRunner().invoke(main, ["runs", "--results", str(tmp_path / "r.jsonl"), "--history", str(missing)])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == (
        f"Error: Invalid value for --history: {missing}: no such checkpoint file, and no results file "
        f"{tmp_path / 'r.jsonl'} to find a run key in"), result.output


def test_a_run_fitted_in_closed_form_has_no_history_and_says_so(tiny_path, tmp_path):
    """cca-itq trains no epoch: its history was a header over nothing, its figure an empty axes."""
    results = tmp_path / "r.jsonl"
    trained = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "16", "--out",
                                        str(tmp_path / "runs"), "--results", str(results), "--quiet"])
    assert trained.exit_code == 0, trained.output
    checkpoint = read_jsonl(results)[0]["checkpoint"]
    for extra in ([], ["--plot", str(tmp_path / "h")]):
        result = CliRunner().invoke(main, ["runs", "--history", checkpoint, *extra])
        assert result.exit_code == 2 and result.output.endswith(
            f"Invalid value for --history: {checkpoint}: no epoch was trained (a method fitted in closed form has "
            "no history)\n"), result.output
    assert not list(tmp_path.glob("h*"))


def test_a_run_asked_for_by_its_key_is_read_from_the_lines_that_hold_it(trained, tmp_path, monkeypatch):
    """'runs --history KEY' parsed a lab's whole results file (34 s at 100,000 rows) to find one run: the lines
    holding the key are read alone, with the same history; a key two runs start with is still refused."""
    import ucmfh.files as files
    from ucmfh.files import append_jsonl

    row, results = trained
    lab = tmp_path / "lab.jsonl"
    others = [{**row, "run": f"{i:04d}" + row["run"][4:], "map_i2t": 0.1} for i in range(500)]
    append_jsonl(lab, others[:250] + read_jsonl(results) + others[250:])
    alone = CliRunner().invoke(main, ["runs", "--results", str(results), "--history", row["run"][:8], "--json"])
    mine = len(read_jsonl(results))
    parsed = []
    real = files._rows_of_line
    monkeypatch.setattr(files, "_rows_of_line", lambda line: parsed.append(line) or real(line))
    found = CliRunner().invoke(main, ["runs", "--results", str(lab), "--history", row["run"][:8], "--json"])
    assert found.exit_code == 0 and found.output == alone.output, found.output
    assert len(parsed) == 1 + mine  # the file's first row, and the run's
    twice = CliRunner().invoke(main, ["runs", "--results", str(lab), "--history", "00"])
    assert twice.exit_code == 2 and "runs of" in twice.output and "start so" in twice.output
