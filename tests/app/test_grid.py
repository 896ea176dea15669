"""``ucmfh grid`` on a tiny synthetic file: cells, skip and resume, the tables."""
from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main

TINY_MODEL = ["--methods", "ucmfh", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64", "--set", "hash.hidden=64",
              "--batch-size", "64", "--set", "fusion.lr=1e-3", "--set", "hash.lr_fusion=1e-3", "--epochs", "1",
              "--device", "cpu", "--quiet"]


def _grid(*args: str) -> str:
    result = CliRunner().invoke(main, ["grid", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_grid_runs_every_cell_once_and_tabulates_seeds(tiny_path, tmp_path):
    results, table = tmp_path / "grid.jsonl", tmp_path / "table"
    argv = ["-d", tiny_path, "-b", "8", "-b", "16", "--seeds", "1,2", "--losses", "original,balanced",
            "--out", str(tmp_path / "runs"), "--results", str(results), "--table", str(table), *TINY_MODEL]
    output = _grid(*argv)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 * 2  # losses x bits x seeds x protocols
    assert {(r["loss"], r["n_bits"], r["seed"]) for r in rows} == {
        (loss, b, s) for loss in ("original", "balanced") for b in (8, 16) for s in (1, 2)}
    # one fusion encoder per (loss, seed), trained once and reused by the other code length
    assert output.count("fusion encoder: training") == 4 and output.count("fusion encoder: already trained, reused") == 4
    assert "nothing to resume" not in output  # a grid always resumes: a fresh cell is not news

    with open(f"{table}.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 2 * 2 * 2  # losses x bits x protocols
    for s in summary:
        mine = [r["map_i2t"] for r in rows
                if (r["loss"], r["n_bits"], r["protocol"]) == (s["loss"], int(s["n_bits"]), s["protocol"])]
        assert s["n_seeds"] == "2" and float(s["map_i2t_mean"]) == pytest.approx(sum(mine) / 2)
        assert float(s["map_i2t_std"]) == pytest.approx(abs(mine[0] - mine[1]) / 2 ** 0.5)
        fusion = [r["fusion_train_time_s"] for r in rows
                  if (r["loss"], r["n_bits"], r["protocol"]) == (s["loss"], int(s["n_bits"]), s["protocol"])]
        assert float(s["fusion_train_time_s_mean"]) == pytest.approx(sum(fusion) / 2) and min(fusion) > 0
    md = Path(f"{table}.md").read_text()
    assert "protocol `unimodal`" in md and "random codes" in md and "against `ucmfh`" in md and "±" in md
    # the fusion stage's seconds, which the table's hashing seconds leave out, said once under each table
    assert md.count("Hashing s leaves out the fusion stage a method stands on") == 2  # one table a protocol

    again = _grid(*argv)  # everything finished: nothing trained, nothing appended
    assert again.count("skip") == 8 and "training" not in again
    assert len(results.read_text().splitlines()) == len(rows)

    # one seed: no spread in the CSV (a blank), where 0.0 read as one measured
    single = ["1" if a == "1,2" else str(tmp_path / "one.jsonl") if a == str(results) else
              str(tmp_path / "one") if a == str(table) else a for a in argv]
    _grid(*single)
    with open(tmp_path / "one.csv", newline="") as f:
        spreads = {(s["n_seeds"], s["map_i2t_std"], s["map_i2t_expected_std"]) for s in csv.DictReader(f)}
    assert spreads == {("1", "", "")}

    other = _grid(*argv, "--k", "20")  # another setting: the cells are scored again (training reused)
    assert "skip" not in other and "training" not in other
    assert len(results.read_text().splitlines()) == 2 * len(rows)


def test_grid_cells_with_other_settings_train_their_own_fusion_encoder(tiny_path, tmp_path):
    common = ["-d", tiny_path, "-b", "8", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "g.jsonl"),
              "--table", str(tmp_path / "t"), *TINY_MODEL]
    _grid(*common)
    output = _grid(*common, "--fusion-epochs", "2")
    assert "fusion encoder: training" in output and "skip" not in output
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len({r["checkpoint"] for r in rows}) == 2


def test_grid_rejects_an_unknown_loss_before_training(tiny_path, tmp_path):
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--losses", "original,nosuch",
                                       "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "nosuch" in result.output and not (tmp_path / "runs").exists()
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "16", "-b", "300", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "'--n-bits' / '-b': 300 is not in the range" in result.output
    assert not (tmp_path / "runs").exists()


def test_an_interrupted_grid_says_to_run_it_again_and_that_finishes_it(tiny_path, tmp_path, monkeypatch):
    """A grid has no --resume (it always resumes): stopped inside a cell, it says to run the same command,
    and that command goes on from the cell's saved state and ends with every cell's rows."""
    from conftest import StopAfter
    from ucmfh import trainer

    results = tmp_path / "grid.jsonl"
    argv = ["grid", "-d", tiny_path, "-b", "8", "-b", "16", "--methods", "two-tower", "--set", "hash.hidden=64",
            "--batch-size", "64", "--epochs", "3", "--device", "cpu", "--protocol", "unimodal",
            "--out", str(tmp_path / "runs"), "--results", str(results), "--table", str(tmp_path / "table")]
    bars = StopAfter(2, signal.SIGINT)
    monkeypatch.setattr(trainer, "tqdm", bars)
    stopped = CliRunner().invoke(main, argv)
    assert stopped.exit_code == 130, stopped.output
    assert "interrupted by SIGINT" in stopped.output and "run the same command to continue" in stopped.output
    assert "--resume" not in stopped.output and not results.exists()
    bars.epochs = None  # no more interruptions
    output = _grid(*argv[1:])
    assert "resuming" in output and 2 in bars.starts  # the stopped cell went on from its third epoch
    assert sorted(json.loads(line)["n_bits"] for line in results.read_text().splitlines()) == [8, 16]


def test_grid_applies_an_option_only_to_the_methods_that_use_it_and_says_so(tmp_path):
    """One set of options serves every method of a grid: --epochs reaches two-tower, not cca-itq (fitted in
    closed form, as train-hash --method cca-itq --epochs refuses), said in one line before anything is read;
    an option that no method of the grid uses is refused, as train-hash refuses it."""
    common = ["grid", "-d", str(tmp_path / "missing.h5"), "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(main, [*common, "--methods", "two-tower,cca-itq", "--epochs", "3",
                                       "--batch-size", "32"])
    assert result.exit_code == 2 and "missing.h5: no such dataset file" in result.output  # accepted: the data was next
    assert result.stderr.splitlines()[0] == ("method 'cca-itq': --epochs, --batch-size not applied (it is fitted in "
                                             "closed form); the other methods apply them")
    for methods, option, error in (
            ("cca-itq", ["--epochs", "3"], "Invalid value for --epochs: no method of the grid has a use for it: "
                                           "'cca-itq' is fitted in closed form"),
            ("two-tower,cca-itq", ["--fusion-epochs", "2"], "Invalid value for --fusion-epochs: no method of the grid "
             "has a use for it: 'two-tower' trains no fusion stage, 'cca-itq' trains no fusion stage"),
            ("two-tower", ["--set", "fusion.d_model=32"], "Invalid value for --set fusion.d_model: no method of the "
                                                          "grid has a use for it: 'two-tower' trains no fusion stage")):
        result = CliRunner().invoke(main, [*common, "--methods", methods, *option])
        assert result.exit_code == 2 and f"Error: {error}" in result.output, result.output
        assert "no such dataset file" not in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["train-hash", "-d", str(tmp_path / "missing.h5"), "--method", "cca-itq",
                                       "--epochs", "3"])
    assert result.exit_code == 2 and ("Invalid value for --epochs: method 'cca-itq' is fitted in closed form: it has "
                                      "no use for epochs") in result.output


@pytest.mark.parametrize("option, value, error", [
    ("--methods", "", "Invalid value for '--methods': expected a comma-separated list, got '': give at least one"),
    ("--seeds", " , ", "Invalid value for '--seeds': expected a comma-separated list, got ' , ': give at least one"),
    ("--seeds", "1,-3", "Invalid value for '--seeds': -3 is not in the range 0<=x<4294967296"),
    ("--seeds", "1,x", "Invalid value for '--seeds': expected comma-separated whole numbers, got '1,x'"),
    ("--seeds", "1,2,1", "Invalid value for '--seeds': 1 is given twice in '1,2,1'"),  # for '1,2,11'?
    ("--methods", "cca-itq,cca-itq", "Invalid value for '--methods': cca-itq is given twice in 'cca-itq,cca-itq'"),
    ("--results", "", "Invalid value for --results: a grid keeps its rows, the cells it skips when run again: give a "
                      "file"),  # it trained a cell, then failed on ''
])
def test_grid_refuses_an_empty_list_and_a_seed_no_generator_takes(tmp_path, option, value, error):
    """No method or no seed was a traceback, or an empty grid that wrote an empty table over the last one; a
    negative seed failed at its cell, after the cells before it had trained."""
    result = CliRunner().invoke(main, ["grid", "-d", str(tmp_path / "x.h5"), option, value,
                                       "--table", str(tmp_path / "grid")])
    assert result.exit_code == 2 and f"Error: {error}" in result.output, result.output
    assert not list(tmp_path.iterdir())


def test_grid_reads_every_dataset_before_its_first_cell(tiny_path, tmp_path):
    """A damaged second dataset is refused before the first dataset's cells train (it was said hours in)."""
    bad = tmp_path / "bad.h5"
    bad.write_text("not HDF5")
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-d", str(bad), "--methods", "cca-itq", "-b", "16",
                                       "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs"),
                                       "--table", str(tmp_path / "grid"), "--quiet"])
    assert result.exit_code == 2 and "bad.h5: not a readable HDF5 file" in result.output, result.output
    assert "run " not in result.output and not (tmp_path / "r.jsonl").exists()


def test_a_finished_grid_reads_no_dataset_to_print_its_table(tiny_path, tmp_path, monkeypatch):
    """A cell is known finished by its dataset file's fingerprint: a grid run again to print its table reads no
    dataset (full Flickr8k: 5 s and 0.8 GB, now 2 s and 0.3 GB); a dataset with a cell to run is read, and
    checked, before the first cell."""
    import ucmfh.app.grid as grid_module

    argv = ["-d", tiny_path, "--methods", "cca-itq", "-b", "16", "--results", str(tmp_path / "r.jsonl"),
            "--out", str(tmp_path / "runs"), "--quiet"]
    _grid(*argv)
    read = []
    real = grid_module.load_dataset
    monkeypatch.setattr(grid_module, "load_dataset", lambda path, **kw: read.append(path) or real(path, **kw))
    again = _grid(*argv)
    assert "skip" in again and "wrote" in again and read == []
    more = _grid(*argv, "-b", "32")
    assert more.count("skip") == 1 and "run  " in more and read == [tiny_path]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_named_as_a_grid_s_dataset_is_refused_not_waited_on(tmp_path):
    pipe = tmp_path / "pipe.h5"
    os.mkfifo(pipe)
    result = CliRunner().invoke(main, ["grid", "-d", str(pipe), "--methods", "cca-itq", "-b", "16", "--quiet",
                                       "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and "pipe.h5" in result.output and "Traceback" not in result.output, result.output


def test_the_default_results_file_of_older_grids_is_said_not_read(tiny_path, tmp_path, monkeypatch):
    """grid's default --results was runs/grid.jsonl until 2026-11-27: after an upgrade a grid ran every cell again
    into runs/results.jsonl, and runs and compare showed none of the old rows, without a word (an audit of a
    study across an upgrade). It is said before the cells run."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs")
    with open("runs/grid.jsonl", "w") as f:
        f.write("")
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "8", "--quiet",
                                       "--table", "grid"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        "warning: runs/grid.jsonl: rows of grids run before 2026-11-27, its default results file then, are not read: "
        "a cell whose row is there alone runs again into runs/results.jsonl; give --results runs/grid.jsonl to go on "
        "with those rows\n"), result.output


def test_a_table_path_given_with_its_extension_is_not_doubled(tiny_path, tmp_path):
    """--table x.md wrote x.md.md and x.md.csv."""
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "16", "--results",
                                       str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs"), "--table",
                                       str(tmp_path / "x.md"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.glob("x*")) == ["x.csv", "x.md"]


def test_the_table_goes_beside_the_results_named_after_them(tiny_path, tmp_path, monkeypatch):
    """A grid given --out and --results elsewhere wrote its table into ./runs/grid.md and .csv of wherever it
    was started (an audit's): the table of r.jsonl is r.md and r.csv beside it."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "16", "--results",
                                       str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.glob("r.*")) == ["r.csv", "r.jsonl", "r.md"]
    assert not list(here.iterdir())


def test_supervised_applies_to_the_cells_whose_loss_uses_labels(tiny_path, tmp_path):
    """--supervised in a grid of losses: the pairwise cells train with the labels, the others without, said in
    one line (it was refused: the check saw each method's default loss, not --losses)."""
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "two-tower", "--losses", "pairwise,infonce",
                                       "--supervised", "-b", "8", "--epochs", "1", "--set", "hash.hidden=32",
                                       "--loss-params", "infonce:temperature=0.3", "--results", str(tmp_path / "r.jsonl"),
                                       "--out", str(tmp_path / "runs"), "--table", str(tmp_path / "t"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == ("method 'two-tower' with loss 'infonce': --supervised not applied (it "
                                             "trains with 'infonce', which uses no labels (pairwise does)); the other "
                                             "methods apply them")
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert {(r["loss"], r["settings"]["hash"]["supervised"]) for r in rows if r["task"] == "hashing"} == {
        ("pairwise", True), ("infonce", False)}


def test_loss_parameters_reach_ucmfh_whose_stages_share_them(tiny_path, tmp_path):
    """--loss-params NAME:... for ucmfh (its fusion stage shares the hashing stage's loss) was refused as a
    setting given twice, naming --loss-params, which the user gave once."""
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "ucmfh", "--losses", "infonce",
                                       "--loss-params", "infonce:temperature=0.2", "-b", "8", "--epochs", "1",
                                       "--set", "hash.hidden=32", "--set", "fusion.d_model=32", "--set", "fusion.d_ff=64",
                                       "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs"),
                                       "--table", str(tmp_path / "t"), "--quiet"])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert row["settings"]["fusion"]["loss_params"] == row["settings"]["hash"]["loss_params"] == {"temperature": 0.2}


@pytest.mark.parametrize("methods, given, says", [
    ("two-tower", "infonce", "expected NAME:KEY=VALUE,..., got 'infonce'"),
    ("two-tower", "infonce:", "expected NAME:KEY=VALUE,..., got 'infonce:'"),
    # the loss left out: 'unknown loss 'temperature=0.5'' (an audit's)
    ("two-tower", "temperature=0.5", "expected NAME:KEY=VALUE,..., the loss first, got 'temperature=0.5' (e.g. "
                                     "infonce:temperature=0.5)"),
    ("two-tower", "triplet:foo=1", "triplet: no cell of the grid trains with this loss (the grid's: infonce)"),
    # a method fitted in closed form trains no loss, whatever its config's loss field says
    ("cca-itq,two-tower", "original:temperature=0.3", "original: no cell of the grid trains with this loss (the "
                                                      "grid's: infonce)"),
    ("cirh", "infonce:bogus=1", "infonce: no cell of the grid trains with this loss (its methods have losses of "
                                   "their own, or are fitted in closed form)"),  # was '(the grid's: )'
])
def test_loss_parameters_of_nothing_are_refused(tiny_path, tmp_path, methods, given, says):
    """--loss-params without parameters, or of a loss no cell trains with (never checked, never applied), ran
    the grid without a word."""
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", methods, "-b", "8", "--epochs", "1",
                                       "--loss-params", given, "--results", str(tmp_path / "r.jsonl"),
                                       "--out", str(tmp_path / "runs"), "--table", str(tmp_path / "t"), "--quiet"])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("flag, given", [("--seeds", "1,,2"), ("--methods", "two-tower,"), ("--losses", ",infonce")])
def test_a_list_with_an_empty_item_is_refused(tiny_path, tmp_path, flag, given):
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "-b", "8", "--epochs", "1", flag, given,
                                       "--results", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "runs"),
                                       "--table", str(tmp_path / "t"), "--quiet"])
    assert result.exit_code == 2 and f"an empty item in {given!r}" in result.output, result.output


def test_two_dataset_files_of_one_name_keep_their_own_tables_and_comparisons(tmp_path):
    """Two files of one name in one grid: its table keyed by the name showed the second file's figures alone (and
    half the paired differences), and 'compare' dropped the first file's cells, silently; 'runs' and the figures
    told them apart. Every view names them as 'runs' does now: 'synthetic [fingerprint]'."""
    from ucmfh.data.synthetic import SyntheticSpec, make_synthetic

    spec = dict(n_query=30, n_retrieval=120, n_train=60, d_img=12, d_txt=10, n_classes=4)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    files = [make_synthetic(tmp_path / folder / "syn.h5", SyntheticSpec(**spec, seed=seed))
             for folder, seed in (("a", 1), ("b", 2))]
    results, table = tmp_path / "r.jsonl", tmp_path / "t"
    _grid("-d", files[0], "-d", files[1], "--methods", "cca-itq,two-tower", "-b", "8", "--seeds", "1,2", "--epochs",
          "1", "--set", "hash.hidden=16", "--device", "cpu", "--quiet", "--out", str(tmp_path / "runs"),
          "--results", str(results), "--table", str(table))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    labels = sorted({f"{r['dataset']} [{r['dataset_fingerprint'][:8]}]" for r in rows})
    assert len(labels) == 2
    md = (table.with_suffix(".md")).read_text()
    for label in labels:  # each file's table, and its 4 pairs (2 seeds x 2 directions), not 2 of one file's
        assert f"### {label}, protocol `unimodal`" in md
        [delta] = [line for line in md.splitlines() if line.startswith(f"| {label} | unimodal | - | `two-tower` |")]
        assert delta.endswith("/4 |"), delta
    with open(table.with_suffix(".csv"), newline="") as f:
        assert len({line["dataset_fingerprint"] for line in csv.DictReader(f)}) == 2
    compared = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json"])
    assert compared.exit_code == 0, compared.output
    assert sorted({json.loads(line)["dataset"] for line in compared.output.splitlines()}) == labels


def test_a_method_that_needs_the_split_in_memory_is_refused_before_the_first_cell(tiny_path, tmp_path, monkeypatch):
    """A streamed training split (--max-memory) and cca-itq after two-tower: two-tower's cell trained and wrote
    its row, and the grid ended at cca-itq's; the refusal now comes before any cell."""
    import ucmfh.app.grid as grid_module

    monkeypatch.setattr(grid_module, "train_hash_stage", lambda *a, **kw: pytest.fail("a cell ran"))
    results = tmp_path / "r.jsonl"
    refused = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "two-tower,cca-itq", "-b", "16",
                                        "--max-memory", "1KB", "--out", str(tmp_path / "runs"), "--results",
                                        str(results)])
    assert refused.exit_code == 2 and refused.output.splitlines()[-1] == (
        f"Error: {tiny_path}: method 'cca-itq' fits in closed form on the whole training split; this training split "
        "is streamed (larger than the memory threshold), too large for it")
    assert not results.exists()


def test_a_cell_s_rows_are_looked_for_among_the_lines_naming_its_run_alone(tmp_path, monkeypatch):
    """After every cell a grid parsed the whole results file to learn whether a grid beside it had appended the
    cell's rows: 14 s a cell in a lab's file of 100,000 rows. The lines naming the cell's run alone are parsed now;
    rows appended meanwhile are still found, and a cell's own rows appended once."""
    import ucmfh.files as files
    from ucmfh.app.grid import by_run, finished
    from ucmfh.app.table import append_cell_rows
    from ucmfh.files import append_jsonl, read_jsonl

    path = tmp_path / "results.jsonl"
    append_jsonl(path, [{"run": f"other{i}", "protocol": "unimodal", "k": 50} for i in range(2000)])
    cell = [{"run": "cell", "protocol": p, "database": None, "k": 50} for p in ("unimodal", "fused")]
    parsed, said = [], []
    real = files._rows_of_line
    monkeypatch.setattr(files, "_rows_of_line", lambda line: parsed.append(line) or real(line))
    append_cell_rows(path, cell, said.append, "wiki two-tower seed 1 16 bits")
    assert {json.loads(line)["run"] for line in parsed} == {"other0"} and not said  # the first row: the file's check
    parsed.clear()
    append_cell_rows(path, cell, said.append, "wiki two-tower seed 1 16 bits")  # a grid beside it appended them
    assert {json.loads(line)["run"] for line in parsed} == {"other0", "cell"} and said == [f"      wiki two-tower seed 1 16 bits: its rows are in {path} already "
                                         "(appended meanwhile by a grid beside this one)"]
    monkeypatch.undo()
    rows = read_jsonl(path)
    assert len(rows) == 2002
    recorded = by_run(rows)
    assert finished(recorded, "cell", ("unimodal", "fused"), 50) == cell
    assert finished(recorded, "cell", ("unimodal", "fused"), 20) == []
    assert finished(recorded, "nosuch", ("unimodal",), 50) == []
    by_run([{"run": "late", "protocol": "unimodal", "k": 50}], into=recorded)
    assert finished(recorded, "late", ("unimodal",), 50) == [{"run": "late", "protocol": "unimodal", "k": 50}]


def test_a_grid_reads_the_rows_of_its_own_cells_alone(tiny_path, tmp_path, monkeypatch):
    """A grid read the whole results file and held every row (1.3 GB at a lab's 100,000 rows) to learn which of
    its cells were finished: it reads the lines naming its cells' runs alone, and skips the same cells."""
    import ucmfh.files as files
    from ucmfh.files import append_jsonl, read_jsonl

    results = tmp_path / "r.jsonl"
    argv = ["-d", tiny_path, "--methods", "cca-itq", "-b", "8", "--seeds", "1,2", "--out", str(tmp_path / "runs"),
            "--results", str(results), "--table", str(tmp_path / "t")]
    _grid(*argv)
    mine = {row["run"] for row in read_jsonl(results)}
    append_jsonl(results, [{**read_jsonl(results)[0], "run": f"other{i}"} for i in range(300)])
    parsed = []
    real = files._rows_of_line
    monkeypatch.setattr(files, "_rows_of_line", lambda line: parsed.append(line) or real(line))
    again = _grid(*argv)
    assert again.count("skip") == 2 and "run  " not in again
    assert {json.loads(line)["run"] for line in parsed} == mine  # the file's first row is one of its cells'


def test_a_caption_set_s_recalls_and_a_collapse_reach_the_csv(tmp_path):
    """The grid's CSV held the MAP columns alone: a caption set's R@K and rSum (what its tables lead with) were left
    out, and so was the mark of seeds whose codes collapsed, which grid.md shows (an audit's)."""
    from conftest import caption_file

    from ucmfh.app.grid import write_tables

    path = caption_file(tmp_path / "cap.h5")
    table = tmp_path / "t"
    _grid("-d", str(path), "--methods", "cca-itq", "-b", "8", "--seeds", "1,2", "--results", str(tmp_path / "r.jsonl"),
          "--out", str(tmp_path / "runs"), "--table", str(table), "--quiet")
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    with open(f"{table}.csv", newline="") as f:
        summary = {s["database"]: s for s in csv.DictReader(f)}
    assert sorted(summary) == ["collection", "test"]
    for database, s in summary.items():
        mine = [r for r in rows if r["database"] == database]
        assert float(s["r1_i2t_expected_mean"]) == pytest.approx(sum(r["recall_i2t_expected"]["1"] for r in mine) / 2)
        assert float(s["rsum_mean"]) == pytest.approx(sum(r["rsum"] for r in mine) / 2)
        assert float(s["random_rsum_mean"]) == pytest.approx(sum(r["random_rsum"] for r in mine) / 2)
        assert s["collapsed_seeds"] == "0" and s["map_i2t_mean"] != ""
    # grid.md leads a caption set with R@1 (rSum), as 'ucmfh runs' and the figures do, its MAP by id after (it led
    # with MAP); a method against the first in rSum
    from ucmfh.app.grid import markdown

    md = Path(f"{table}.md").read_text()
    for database, s in summary.items():
        lead = md.index(f"R@1 I→T / T→I in % (rSum), database `{database}` (mean ± std over seeds")
        assert lead < md.index(f"MAP@50 by id I→T / T→I, database `{database}`")
        figures = [f"{float(s[f'{field}_mean']):.1f} ± {float(s[f'{field}_std']):.1f}"
                   for field in ("r1_i2t_expected", "r1_t2i_expected", "rsum_expected", "random_r1_i2t",
                                 "random_r1_t2i", "random_rsum")]
        lines = md[lead:].splitlines()
        assert lines[4].startswith(f"| `cca-itq` | {figures[0]} / {figures[1]} ({figures[2]}) | 2 | ")
        # random codes' R@1 (the rows kept their rSum alone: "– / –")
        assert lines[5] == f"| random codes | {figures[3]} / {figures[4]} ({figures[5]}) | 2 | – |"
        for field in ("r1_i2t", "r5_t2i", "r10_i2t"):  # the CSV's random R@K, as every other figure's
            rank, direction = field[1:].split("_")
            assert float(s[f"random_{field}_mean"]) == pytest.approx(
                sum(r[f"random_recall_{direction}"][rank] for r in rows if r["database"] == database) / 2)
        by_id = md[md.index(f"MAP@50 by id I→T / T→I, database `{database}`"):].split("\n\n")[1].splitlines()
        assert by_id[-1] == ("| random codes | " + " / ".join(f"{float(s[f'random_map_{d}_mean']):.3f}"
                                                              for d in ("i2t", "t2i")) + " |")
    better = [{**r, "method": "two-tower", "rsum_expected": r["rsum_expected"] + 10} for r in rows]
    md = markdown(rows + better, ["cca-itq", "two-tower"], [8])
    assert "Δ rSum in % paired by (seed, code length)" in md
    for database in ("test", "collection"):
        assert f"| cap | unimodal | {database} | `two-tower` | +10.0 ± 0.0 | 2/2 |" in md
    fell = [{**r, "distinct_codes": {"img": [1, 48], "txt": [40, 144], "n_bits": 8}} if r["seed"] == 2 else r
            for r in rows]
    write_tables(fell, ["cca-itq"], [8], str(tmp_path / "fell"))
    with open(tmp_path / "fell.csv", newline="") as f:
        assert {s["collapsed_seeds"] for s in csv.DictReader(f)} == {"1"}


def test_losses_for_methods_with_a_loss_of_their_own_are_said_not_applied_or_refused(tiny_path, tmp_path):
    """--losses beside a method with a loss of its own ran its cells without a word, and a grid of such methods
    alone ran where train-hash --loss refuses (an audit's)."""
    argv = ["grid", "-d", tiny_path, "-b", "8", "--results", str(tmp_path / "r.jsonl"), "--out",
            str(tmp_path / "runs"), "--quiet", "--losses", "infonce"]
    refused = CliRunner().invoke(main, [*argv, "--methods", "cca-itq"])
    assert refused.exit_code == 2 and not (tmp_path / "r.jsonl").exists()
    assert "Invalid value for --losses: no method of the grid takes a loss: method 'cca-itq': a loss of its own" \
        in refused.output, refused.output
    said = CliRunner().invoke(main, [*argv, "--methods", "cca-itq,two-tower", "--epochs", "1", "--batch-size", "64"])
    assert said.exit_code == 0, said.output
    assert "method 'cca-itq': --losses not applied (a loss of its own); the other methods apply it" in said.stderr


def test_options_of_training_by_epochs_are_said_not_applied_to_a_method_fitted_in_closed_form(tiny_path, tmp_path):
    """--tensorboard, --save-interval and --cuda-graph were taken without a word for cca-itq, which trains no epoch
    (--tensorboard made no folder; an audit's): refused where no method trains by epochs, as a setting no method
    uses is, and said not applied beside methods that do."""
    runs = str(tmp_path / "runs")
    for command in (["train-hash", "--method", "cca-itq"], ["grid", "--methods", "cca-itq"]):
        alone = CliRunner().invoke(main, [*command, "-d", tiny_path, "-b", "8", "--out", runs, "--results",
                                          str(tmp_path / "r.jsonl"), "--no-cuda-graph", "--quiet"])
        assert alone.exit_code == 2 and not os.path.exists(runs), alone.output
        assert ("Invalid value for --no-cuda-graph: 'cca-itq' is fitted in closed form: no epochs to draw, save or "
                "capture") in alone.output, alone.output
    grid = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq,two-tower", "-b", "8", "--out",
                                     runs, "--results", str(tmp_path / "r.jsonl"), "--save-interval", "5", "--epochs",
                                     "1", "--batch-size", "64", "--quiet"])
    assert grid.exit_code == 0, grid.output
    assert ("method 'cca-itq': --save-interval not applied (it is fitted in closed form: no epochs); the other methods "
            "apply it") in grid.stderr
    quiet = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8", "--out", runs,
                                      "--results", "", "--quiet"])
    assert quiet.exit_code == 0 and "not applied" not in quiet.output, quiet.output  # nothing given, nothing said


def _another_process_on_seed_1(real, results: Path, other_finishes: bool, tries: list):
    """``real`` (train_hash_stage) as it runs beside another process training seed 1's cell: refused as busy when
    first met and when first looked at again, meanwhile (``other_finishes``) that process's rows appended."""
    from ucmfh.app.stage import RunInProgress

    def train(data, fcfg, hcfg, *args, **kwargs):
        tries.append(hcfg.seed)
        if hcfg.seed == 1 and tries.count(1) <= 2:
            if tries.count(1) == 2 and other_finishes:
                rows = real(data, fcfg, hcfg, *args, **kwargs)
                with open(results, "a") as f:
                    f.writelines(json.dumps(row) + "\n" for row in rows)
            raise RunInProgress("runs/x: another process (pid 1) is training this run; wait for it or use another "
                                "--out")
        return real(data, fcfg, hcfg, *args, **kwargs)

    return train


@pytest.mark.parametrize("other_finishes", [False, True])
def test_a_cell_another_process_trains_is_run_after_the_others(tmp_path, tiny_path, monkeypatch, other_finishes):
    """A second grid on the same runs folder died at the first cell another process was training ('another
    process (pid N) is training this run'), its other cells not run (a concurrency audit's): such a cell waits
    until the others are done, then its rows are the other process's, or it is trained once the run is free."""
    import ucmfh.app.grid as grid_module

    results, tries = tmp_path / "r.jsonl", []
    monkeypatch.setattr(grid_module, "train_hash_stage",
                        _another_process_on_seed_1(grid_module.train_hash_stage, results, other_finishes, tries))
    monkeypatch.setattr(grid_module, "BUSY_POLL_S", 0.0)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "--seeds", "1,2", "-b", "8",
                                       "--protocol", "unimodal", "--out", str(tmp_path / "runs"), "--results",
                                       str(results), "--quiet"])
    assert result.exit_code == 0, result.output
    said = [line.split(" ")[0] for line in result.stderr.splitlines()]
    assert said == ["busy", "wait"] and "it is run after the other cells" in result.stderr
    assert "use another --out" not in result.stderr  # a command's remedy, not a grid's, which waits for the run
    assert ("finished by the other process" in result.stdout) is other_finishes
    assert tries == [1, 2, 1] + ([] if other_finishes else [1])
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(row["seed"] for row in rows) == [1, 2]  # each cell's rows once
    table = (tmp_path / "r.md").read_text()
    assert "2 |" in table  # two seeds in the grid's table


@pytest.mark.parametrize("other_finishes", [False, True])
def test_a_cell_another_process_trains_is_run_after_the_others_side_by_side_too(tmp_path, tiny_path, monkeypatch,
                                                                                 other_finishes):
    """As above, with --jobs: a worker's cell refused as busy ended the grid once the others had stopped."""
    import ucmfh.app.jobs as jobs_module

    results, tries = tmp_path / "r.jsonl", []
    monkeypatch.setattr(jobs_module, "train_hash_stage",
                        _another_process_on_seed_1(jobs_module.train_hash_stage, results, other_finishes, tries))
    monkeypatch.setattr(jobs_module, "BUSY_POLL_S", 0.0)
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "cca-itq", "--seeds", "1,2", "-b", "8",
                                       "--protocol", "unimodal", "--out", str(tmp_path / "runs"), "--results",
                                       str(results), "--quiet", "--jobs", "2", "--workers", "threads"])
    assert result.exit_code == 0, result.output
    assert result.output.count("busy ") == 1 and "it is run after the other cells" in result.output
    assert "use another --out" not in result.output
    assert ("finished by the other process" in result.output) is other_finishes
    assert sorted(tries) == ([1, 1, 2] if other_finishes else [1, 1, 1, 2])  # found there: not tried a third time
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(row["seed"] for row in rows) == [1, 2]  # each cell's rows once
