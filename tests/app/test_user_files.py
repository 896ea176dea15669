"""What a new user meets: no file of theirs written over or into, every message true, no traceback.

Every output flag of every command is listed here with what it writes; a flag added later without a
line here fails :func:`test_every_output_flag_is_covered`.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.app.errors import EXIT_BROKEN_PIPE
from ucmfh.files import MARKS, check_jsonl, check_replaceable

from conftest import ROOT, cli_commands

SMALL = ["--set", "hash.hidden=64", "--batch-size", "64", "--device", "cpu", "--quiet"]


def _md5(path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


# every flag that names a file or folder a command writes, and how it treats one that is there already:
# "refuses" an existing file without --overwrite, "own" rewrites only a file of the kind it writes,
# "appends" rows to a JSON-lines file only, "folder" is a folder of ucmfh's (runs, an index)
OUTPUTS = {
    ("make-synthetic", "out"): "refuses", ("encode", "out"): "refuses", ("extract", "out"): "refuses",
    ("convert pkl", "out"): "refuses", ("convert mat", "out"): "refuses", ("convert npz", "out"): "refuses",
    ("search", "html"): "own", ("evaluate", "metrics_out"): "own", ("evaluate", "plot"): "own",
    ("grid", "table"): "own", ("runs", "plot"): "own", ("compare", "plot"): "own", ("grid", "plot"): "own",
    **{(command, "results"): "appends" for command in ("train-fusion", "train-hash", "evaluate", "grid", "train-seps",
                                                      "rerank")},
    **{(command, "out"): "folder" for command in ("train-fusion", "train-hash", "grid", "train-seps", "index")},
    **{(command, "tensorboard"): "folder" for command in ("train-fusion", "train-hash", "grid", "train-seps")},
}
OUTPUT_NAMES = {"out", "results", "html", "table", "plot", "metrics_out", "tensorboard"}


def test_every_output_flag_is_covered():
    """Each option or argument that names a written file is in OUTPUTS; one whose help speaks of writing
    has an output's name."""
    found = set()
    for name, command in cli_commands():
        for param in command.params:
            help_text = (getattr(param, "help", None) or "").lower()
            if param.name in OUTPUT_NAMES and not (name in ("runs", "compare") and param.name == "results"):
                found.add((name, param.name))
            elif re.search(r"\b(write|writes|written|append|appended) (to|here|a|the)\b", help_text):
                raise AssertionError(f"{name} {param.opts}: writes a file but is not an output ({help_text})")
    assert found == set(OUTPUTS)
    for (name, param), kind in OUTPUTS.items():
        command = dict(cli_commands())[name]
        if kind in ("refuses", "own"):  # the remedy the refusal names is there
            assert "overwrite" in {p.name for p in command.params}, name


@pytest.fixture()
def victim(tmp_path, tiny_path) -> Path:
    """A user's dataset (binary HDF5) in the way of an output."""
    path = tmp_path / "victim.h5"
    shutil.copy(tiny_path, path)
    return path


@pytest.mark.parametrize("argv, flag", [
    (["search", "IDX", "-q", "Q.npy", "--html", "{victim}"], "--html"),
    (["evaluate", "--codes", "C.h5", "--metrics-out", "{victim}"], "--metrics-out"),
    (["evaluate", "--codes", "C.h5", "--plot", "{prefix}"], "--plot"),
    (["grid", "-d", "{data}", "-b", "8", "--table", "{prefix}"], "--table"),
])
def test_a_whole_file_output_never_replaces_a_users_file(tmp_path, victim, tiny_path, argv, flag):
    """search --html, evaluate --metrics-out / --plot and grid --table pointed at a user's file: refused
    before any work, naming the flag, the file untouched; --overwrite is the remedy it names."""
    if flag == "--plot":
        shutil.move(victim, tmp_path / "victim_pk.png")
        victim = tmp_path / "victim_pk.png"
    if flag == "--table":
        shutil.move(victim, tmp_path / "victim.csv")
        victim = tmp_path / "victim.csv"
    before = _md5(victim)
    args = [a.format(victim=victim, prefix=tmp_path / "victim", data=tiny_path) for a in argv]
    result = CliRunner().invoke(main, [*args, "--results", str(tmp_path / "r.jsonl")] if argv[0] == "grid" else args)
    assert result.exit_code == 2, result.output
    assert f"Error: {flag} {victim}: exists without the mark of a" in result.output, result.output
    assert "ucmfh wrote (the user's, or one of a ucmfh before 2026-11-27, which had none); not replaced " \
           "(pass --overwrite to replace it)" in result.output
    assert _md5(victim) == before and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("argv, flag, input_flag", [
    (["encode", "-d", "{victim}", "-c", "{checkpoint}", "-o", "{victim}"], "--out", "--dataset"),
    (["encode", "-d", "{data}", "-c", "{checkpoint}", "-o", "{checkpoint}"], "--out", "--checkpoint"),
    (["evaluate", "--codes", "{victim}", "--metrics-out", "{victim}"], "--metrics-out", "--codes"),
    (["search", "{index}", "-q", "{victim}", "--html", "{victim}"], "--html", "--queries"),
    (["search", "{index}", "-q", "{data}", "--html", "{index}/index.json"], "--html", "INDEX"),
    (["convert", "npz", "{victim}", "{victim}", "{victim}", "{victim}"], "OUT", "IMAGE"),
    (["make-synthetic", "/dev/null"], "OUT", None),
    (["extract", "--model", "{model}", "{victim}", "{victim}", "{victim}", "{model}/model.safetensors"], "OUT",
     "--model"),  # a local model's weights were replaced by the features, with --overwrite (an audit's)
])
def test_an_output_that_is_an_input_is_refused_even_with_overwrite(tmp_path, victim, tiny_path, argv, flag,
                                                                   input_flag):
    """--overwrite replaces a file of the user's that is in the way; never the command's own input (encode -o
    onto its dataset or checkpoint, --metrics-out onto its codes, --html onto its queries or into its index),
    nor a device (make-synthetic /dev/null replaced the device with a file): refused before any work. Without
    --overwrite, the same refusal: encode -o CHECKPOINT said 'exists; not replaced (pass --overwrite ...)', which
    --overwrite then refused otherwise."""
    checkpoint = tmp_path / "hash16.pt"
    index = tmp_path / "idx"
    if "{checkpoint}" in argv or "{index}" in argv:  # a checkpoint of cca-itq (fitted in seconds), an index of it
        trained = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "16", "--out",
                                            str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"), "--quiet"])
        assert trained.exit_code == 0, trained.output
        shutil.copy(next((tmp_path / "runs").rglob("hash16.pt")), checkpoint)
        if "{index}" in argv:
            built = CliRunner().invoke(main, ["index", tiny_path, "-c", str(checkpoint), "-o", str(index), "--quiet"])
            assert built.exit_code == 0, built.output
    model = tmp_path / "clip"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"the weights")
    args = [a.format(victim=victim, data=tiny_path, checkpoint=checkpoint, index=index, model=model) for a in argv]
    target = Path(args[-1])  # the output, last in each command line
    before = _md5(target) if target.is_file() else None
    for overwrite in (["--overwrite"], []):
        result = CliRunner().invoke(main, [*args, *overwrite])
        assert result.exit_code == 2, result.output
        if input_flag is None:
            assert f"Error: {flag} {target}: is not a regular file (a device, a pipe or a socket); not written" \
                in result.output
        else:
            assert re.search(rf"Error: {re.escape(flag)} {re.escape(str(target))}: is (inside )?.*, an input of this "
                             rf"command \({re.escape(input_flag)}\); not written (over|there), even with --overwrite",
                             result.output), result.output
            assert _md5(target) == before


def test_own_files_are_recognised_by_their_mark(tmp_path):
    """A page, a table, a figure and a metrics file ucmfh wrote carry their mark in their first bytes and
    are written again; the same path with another file in it needs --overwrite."""
    import numpy as np

    pytest.importorskip("matplotlib")
    from ucmfh.metrics.plots import plot_precision_at_k

    figure = plot_precision_at_k({"i2t": {"precision_at_k": {"k": [1, 2], "precision": [0.5, 0.4]}}},
                                 str(tmp_path / "f.png"))
    check_replaceable(figure, "figure")
    for kind, mark in MARKS.items():
        path = tmp_path / f"{kind}.out"
        path.write_bytes(b"x" * 100 + mark + b"y")
        check_replaceable(path, kind)
        path.write_bytes(b"\x89HDF\r\n" + bytes(np.arange(200, dtype=np.uint8)))
        with pytest.raises(FileExistsError, match="not replaced"):
            check_replaceable(path, kind)
        check_replaceable(path, kind, overwrite=True)


def test_search_page_and_metrics_file_carry_their_mark(tmp_path):
    from ucmfh.app.grid import write_tables

    md, csv = write_tables([], ["two-tower"], [16], str(tmp_path / "t"))
    check_replaceable(md, "table") and check_replaceable(csv, "table-csv")
    assert Path(md).read_text().startswith(MARKS["table"].decode())


def test_results_are_appended_to_a_results_file_only(tmp_path, victim, tiny_path):
    """--results naming an HDF5 file: refused before the data are read, the file untouched, by its name and, named
    otherwise, by its bytes; reading it as results names the file; a text that is not JSON lines is refused too,
    written or read, and so is a file of the user's made empty (rows were appended to an empty 'notes.txt')."""
    before = _md5(victim)
    train = ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "1", "-b", "8", "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(main, [*train, "--results", str(victim)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == \
        f"Error: --results {victim}: is named as a .h5 file, not JSON lines; not appended to (give a .jsonl name)"
    assert _md5(victim) == before and not (tmp_path / "runs").exists() and "dataset:" not in result.output
    data = shutil.copy(victim, tmp_path / "mydata")
    result = CliRunner().invoke(main, [*train, "--results", str(data)])
    assert result.exit_code == 2, result.output
    assert f"Error: --results {data}: is not a JSON-lines results file (it holds binary data)" in result.output
    result = CliRunner().invoke(main, ["runs", "--results", str(victim)])
    assert result.exit_code == 2 and f"Error: {victim}: is not a JSON-lines results file" in result.output
    (tmp_path / "empty.txt").touch()
    for name, said in (("empty.txt", "exists, empty or blank, and is not named as JSON lines (.jsonl)"),
                       ("new.png", "is named as a .png file, not JSON lines")):
        result = CliRunner().invoke(main, [*train, "--results", str(tmp_path / name)])
        assert result.exit_code == 2 and f"--results {tmp_path / name}: {said}; not appended to" in result.output
    assert (tmp_path / "empty.txt").read_text() == "" and not (tmp_path / "new.png").exists()
    assert not (tmp_path / "runs").exists()
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    result = CliRunner().invoke(main, ["evaluate", "-d", tiny_path, "-c", "x.pt", "--results", str(notes)])
    assert result.exit_code == 2 and "(line 1: my notes)" in result.output and notes.read_text() == "my notes\n"
    result = CliRunner().invoke(main, ["runs", "--results", str(notes)])  # read: the same, not "no runs match"
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == \
        f"Error: {notes}: is not a JSON-lines results file (line 1: my notes)", result.output
    # JSON lines of another program: rows were appended to it, which 'runs' then called "not results"
    events = tmp_path / "events.jsonl"
    events.write_text('{"user": "me", "clicks": 3}\n')
    result = CliRunner().invoke(main, ["evaluate", "-d", tiny_path, "-c", "x.pt", "--results", str(events)])
    assert result.exit_code == 2 and result.output.endswith(
        f"--results {events}: holds JSON lines that are not results rows (line 1 has no dataset and task: "
        '{"user": "me", "clicks": 3}); not appended to\n') and events.read_text() == '{"user": "me", "clicks": 3}\n'
    for command in (["runs"], ["compare", "jdsh", "two-tower"]):  # a folder where the results file is read
        result = CliRunner().invoke(main, [*command, "--results", str(tmp_path)])
        assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == \
            f"Error: {tmp_path}: is a folder, not a JSON-lines results file", result.output


def test_a_results_file_whose_first_row_is_damaged_is_read_and_appended_to(tmp_path, tiny_path):
    """A first row cut short (a writer killed there, an editor's slip) made the whole file 'not a JSON-lines
    results file', for reading and appending: the rows after it were lost to every command. It is skipped with a
    warning as a later one is; a file with no row at all is still the user's text, refused."""
    row = {"dataset": "wiki", "task": "hashing", "method": "cca-itq", "n_bits": 16, "protocol": "unimodal", "k": 50,
           "seed": 1, "map_i2t": 0.25, "map_t2i": 0.38, "run": "a", "settings": {"hash": {"n_bits": 16}}}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({**row, "seed": 2, "run": "b"})[:40] + "\n" + json.dumps(row) + "\n")
    result = CliRunner().invoke(main, ["runs", "--results", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: {path}: line 1: not a JSON row (") and "skipped" in result.stderr
    assert [json.loads(line)["seeds"] for line in result.stdout.splitlines()] == [[1]]
    check_jsonl(path, results=True)  # what every command asks before appending: passes
    path.write_text(path.read_text().rstrip("\n"))  # the row after it without its newline: still whole
    check_jsonl(path, results=True)
    # a text of the user's with a row somewhere in it is not a results file, nor two damaged lines before a row
    text = tmp_path / "notes.jsonl"
    for content in ("my notes\nmore notes\n", "my notes\n" + json.dumps(row) + "\n",
                    '{"cut\n{"cut again\n' + json.dumps(row) + "\n"):
        text.write_text(content)
        first = content.splitlines()[0]
        with pytest.raises(ValueError, match=re.escape(f"{text}: is not a JSON-lines results file (line 1: {first})")):
            check_jsonl(text, results=True)
        result = CliRunner().invoke(main, ["runs", "--results", str(text)])
        assert result.exit_code == 2 and f"(line 1: {first})" in result.output, result.output


def test_a_results_file_with_foreign_lines_is_read_with_one_line_warnings(tmp_path):
    """A line that is not JSON and a {} row are skipped with a 'warning:' line each, not a Python warning
    with its source line, and the {} row is no line of dashes in the table."""
    path = tmp_path / "r.jsonl"
    row = {"dataset": "wiki", "task": "hashing", "method": "cca-itq", "n_bits": 16, "protocol": "unimodal", "k": 50,
           "seed": 1, "map_i2t": 0.25, "map_t2i": 0.38, "run": "a", "settings": {"hash": {"n_bits": 16}}}
    path.write_text("{}\nnot json at all\n" + json.dumps(row) + "\n")
    result = CliRunner().invoke(main, ["runs", "--results", str(path)])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}: line 2: not a JSON row (not json at all); skipped" in result.output
    assert "1 row(s) without a dataset and a task" in result.output
    assert "UserWarning" not in result.output and "warnings.warn" not in result.output
    table = [line for line in result.output.splitlines() if line.startswith(("wiki", "-  "))]
    assert len(table) == 1 and table[0].startswith("wiki")


class _Closed(io.TextIOBase):
    """A standard output whose reader has gone."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


@pytest.mark.parametrize("argv", [["methods"], ["losses"], ["runs", "--results", "{results}"],
                                  ["runs", "--results", "{results}", "--json"], ["validate", "{data}"],
                                  ["--help"], ["search", "--help"]])
def test_a_closed_pipe_ends_every_command_quietly(monkeypatch, capsys, tmp_path, tiny_path, argv):
    """``ucmfh … | head -1``: the reader goes, the command ends with SIGPIPE's code (141) and says
    nothing (no 'Error: [Errno 32] Broken pipe', no exit 1 or 2)."""
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"dataset": "d", "task": "hashing", "n_bits": 8, "map_i2t": 0.5}) + "\n")
    args = [a.format(results=results, data=tiny_path) for a in argv]
    monkeypatch.setattr(sys, "stdout", _Closed())
    with pytest.raises(SystemExit) as ended:
        main.main(args, prog_name="ucmfh")
    assert ended.value.code == EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_in_a_shell(tmp_path):
    """The same through a real pipe: ``ucmfh methods`` whose reader closed at once."""
    proc = subprocess.Popen([sys.executable, "-m", "ucmfh", "methods"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE and stderr == "", stderr


def test_characters_the_output_s_encoding_lacks_are_written_as_escapes(tmp_path, monkeypatch):
    """'ucmfh losses > out.txt' on Windows (cp1252) ended at its first arrow in a UnicodeEncodeError traceback, and
    'ucmfh compare' at its first minus sign in 'charmap codec can't encode', exit 2: each such character is now
    written as its escape, as Python's standard error writes it, and the command ends as it would have."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "cp1252"}
    ran = subprocess.run([sys.executable, "-m", "ucmfh", "losses"], capture_output=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert (ran.returncode, ran.stderr) == (0, b"")
    assert b"\\u2192" in ran.stdout  # its last loss's line too: the output whole
    assert ran.stdout.decode("cp1252").rstrip().endswith("max_violation=False, normalize=True")
    from ucmfh.app.errors import escape_what_output_cannot_encode

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="cp1252"))  # demo.py's, run as a script
    escape_what_output_cannot_encode()
    print("two-tower \u2212 cca-itq: 0.12 \u00d7 2, \u6cb3\u8fb9\u7684\u72d7")
    sys.stdout.flush()
    assert raw.getvalue() == b"two-tower \\u2212 cca-itq: 0.12 \xd7 2, \\u6cb3\\u8fb9\\u7684\\u72d7\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (a device every write to fails)")
def test_an_output_that_cannot_be_written_or_was_closed_is_no_traceback(tmp_path):
    """'ucmfh methods > /dev/full' (a full disk) ended in an OSError traceback, exit 1, and with its output closed
    ('>&-') in an AttributeError's: the first says so in one line, exit 2; the second writes nowhere, as asked."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "w") as full:
        ran = subprocess.run([sys.executable, "-m", "ucmfh", "methods"], stdout=full, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path, env=env, timeout=120)
    assert (ran.returncode, ran.stderr) == (2, "error: standard output: No space left on device; what the command "
                                               "wrote there is lost\n")
    results = tmp_path / "r.jsonl"  # 'no runs match' goes to standard error
    results.write_text(json.dumps({"task": "hashing", "method": "cca-itq", "dataset": "wiki", "n_bits": 16, "seed": 1,
                                   "protocol": "unimodal", "k": 50, "map_i2t": 0.3, "map_t2i": 0.3, "run": "r"}) + "\n")
    with open("/dev/full", "w") as full:  # standard error alone: what it says lost, the command's result stands
        said = subprocess.run([sys.executable, "-m", "ucmfh", "runs", "--results", str(results), "-d", "nope"],
                              stdout=subprocess.PIPE, stderr=full, text=True, cwd=tmp_path, env=env, timeout=120)
    assert said.returncode == 0
    closed = subprocess.run([sys.executable, "-m", "ucmfh", "methods"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, timeout=120,
                            preexec_fn=lambda: os.close(1))
    assert (closed.returncode, closed.stderr) == (0, "")


@pytest.mark.parametrize("front_door, together", [("ucmfh", False), ("demo", False), ("ucmfh", True)])
def test_a_reader_gone_early_ends_a_training_command_once_its_work_is_done(tmp_path, tiny_path, front_door,
                                                                           together):
    """``ucmfh train-hash ... | head -2`` (or ``| grep -m1 MAP``): the first write that found the reader gone ended
    the command there: the checkpoint saved, no row appended, the other code lengths not trained (demo.py said
    'error: [Errno 32] Broken pipe', exit 2). Every length is trained and its rows appended, then exit 141."""
    results = tmp_path / "r.jsonl"
    if front_door == "ucmfh":
        argv = [sys.executable, "-m", "ucmfh", "train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8",
                "-b", "16", "--quiet", "--device", "cpu", "--out", str(tmp_path / "runs"), "--results", str(results)]
    else:
        argv = [sys.executable, str(ROOT / "demo.py"), "--task", "1", "--dataset", tiny_path, "--hash_lens", "8",
                "--epoch", "1", "--batch_size", "64", "--device", "cpu", "--out", str(tmp_path / "runs"),
                "--results", str(results)]
    if together:  # 2>&1 | head: the progress bars and warnings reach the reader gone too
        argv = [a for a in argv if a != "--quiet"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if together else subprocess.PIPE,
                            cwd=tmp_path)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes after the first line
    stderr = "" if together else proc.stderr.read().decode()
    assert proc.wait(timeout=300) == EXIT_BROKEN_PIPE, stderr
    assert "Broken pipe" not in stderr and "Traceback" not in stderr, stderr
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted({row["n_bits"] for row in rows}) == ([8, 16] if front_door == "ucmfh" else [8])


def test_a_dataset_file_here_without_its_extension_is_read(tmp_path, tiny_path, monkeypatch):
    """-d wikicopy, a dataset file here named without .h5, was 'not a dataset file ... convert yours'; a file of
    another kind so named still is."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(tiny_path, "mine")
    result = CliRunner().invoke(main, ["validate", "mine"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["train-hash", "-d", "mine", "--data-dir", str(tmp_path / "none"),
                                       "--method", "cca-itq", "-b", "8", "--quiet", "--results", ""])
    assert result.exit_code == 0 and "dataset: mine" in result.output, result.output
    Path("features").write_bytes(b"\x93NUMPY not a dataset")
    result = CliRunner().invoke(main, ["train-hash", "-d", "features", "--data-dir", str(tmp_path / "none")])
    assert result.exit_code == 2 and "features: not a dataset file" in result.output, result.output


def test_a_folder_as_dataset_and_a_file_in_data_dir(tmp_path, tiny_path):
    """-d FOLDER is refused in one line; -d NAME.h5 is looked for in --data-dir too."""
    result = CliRunner().invoke(main, ["train-hash", "-d", str(tmp_path), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2 and f"Error: {tmp_path}: is a folder, not a dataset file" in result.output
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(tiny_path, data_dir / "mine.h5")
    result = CliRunner().invoke(main, ["train-hash", "-d", "mine.h5", "--data-dir", str(data_dir), *SMALL,
                                       "--epochs", "1", "-b", "8", "--protocol", "unimodal",
                                       "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 0, result.output
    assert f"dataset: {data_dir / 'mine.h5'}" in result.output
    result = CliRunner().invoke(main, ["train-hash", "-d", "gone.h5", "--data-dir", str(data_dir)])
    assert result.exit_code == 2
    assert f"gone.h5: no such dataset file (nor {data_dir / 'gone.h5'} in --data-dir)" in result.output


def test_sigterm_exits_with_its_own_code(tmp_path, tiny_path, monkeypatch):
    """A training run stopped by SIGTERM exits 143 (128 + 15), as the shell reports a process it ended; its
    progress bar is closed first (the interrupt's line was glued to the bar's)."""
    from conftest import StopAfter
    from ucmfh import trainer

    stop = StopAfter(1, signal.SIGTERM)
    monkeypatch.setattr(trainer, "tqdm", stop)
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "3", "-b", "8",
                                       "--protocol", "unimodal", "--save-interval", "0",
                                       "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 143, result.output
    assert "interrupted by SIGTERM" in result.output and "--resume" in result.output and stop.closed
    again = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "3", "-b", "8",
                                      "--protocol", "unimodal", "--out", str(tmp_path / "runs"),
                                      "--results", str(tmp_path / "r.jsonl")])
    assert again.exit_code == 2 and "continue it with --resume" in again.output
    assert "--overwrite" not in again.output  # train-hash has no --overwrite: the message does not name it


def test_sigterm_ends_any_command_as_ctrl_c_does(tmp_path, monkeypatch):
    """A command with no loop of its own (make-synthetic, convert, extract) was killed on the spot by SIGTERM,
    saying nothing and leaving its temporary file (182 MB): now its interrupt removes the file, says one line
    and exits 143; and SIGTERM has its default action again once the command is over."""
    import os
    import time

    import ucmfh.data.writer as writer

    as_format = writer._as_format

    def terminated_while_writing(*args):  # the file is open under its temporary name
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.h5")]
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        return as_format(*args)

    monkeypatch.setattr(writer, "_as_format", terminated_while_writing)
    result = CliRunner().invoke(main, ["make-synthetic", str(tmp_path / "s.h5"), "--n-query", "10",
                                       "--n-retrieval", "60", "--n-train", "20"])
    assert result.exit_code == 143 and result.output == "terminated\n"
    assert list(tmp_path.iterdir()) == [] and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


LOST_IN_A_CALLBACK = """
import os, signal, sys, time, weakref
from ucmfh.app.errors import interrupted
from ucmfh.signals import terminate_as_interrupt

class Thing:
    pass

def callback(ref):  # SIGTERM arrives, and its handler raises, while Python runs a weakref callback
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)

terminate_as_interrupt()
try:
    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
    time.sleep(2)
    print("went on to the end")
except KeyboardInterrupt as err:
    interrupted(err)
"""


def test_a_sigterm_python_drops_in_a_callback_still_ends_the_command():
    """A signal handler's interrupt raised inside a weakref callback (or a __del__, importlib's lock callback) is
    dropped by Python with 'Exception ignored in' and a traceback, and the command went on to exit 0 after SIGTERM
    (an audit's 'ucmfh evaluate'; a grid's worker printed the traceback). It is sent again, and ends the command
    as any SIGTERM does: one line, 143."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOST_IN_A_CALLBACK], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert (done.returncode, done.stdout, done.stderr) == (143, "", "terminated\n")


# flags of other programs that messages may name: torchrun's, git's (asked by git_commit)
OTHERS = {"--help", "--nproc-per-node", "--show-toplevel", "--porcelain", "--untracked-files"}


def _messages(path: Path):
    """The string constants of a module, docstrings left out (they cite the released code's own flags)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_every_flag_a_message_names_exists():
    """Each --flag in a message of the package is an option of a ucmfh command (or another program's,
    OTHERS); the remedies added to errors are checked against the command running (errors.describe)."""
    options = {opt for _, command in cli_commands() for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    wrong = []
    for path in sorted((ROOT / "ucmfh").rglob("*.py")):
        for line, text in _messages(path):
            wrong += [f"{path.relative_to(ROOT)}:{line}: {flag}" for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)
                      if flag not in options | OTHERS]
    assert not wrong, wrong


def test_compare_takes_the_cells_both_methods_have(tmp_path):
    """A method with two settings in a cell the other method lacks does not stop the comparison; two
    settings in a shared cell are each compared (a settings column), none refused."""
    from ucmfh.app.compare import cells, parse_side

    def row(method, dataset, key, seed=1):
        return {"dataset": dataset, "dataset_fingerprint": dataset, "task": "hashing", "method": method,
                "n_bits": 16, "protocol": "unimodal", "k": 50, "seed": seed, "run": f"{method}{dataset}{key}",
                "settings": {"hash": {"n_bits": 16, "method": method, "hidden": key}}}

    rows = [row("cca-itq", "big", 0), row("two-tower", "big", 1), row("two-tower", "small", 1),
            row("two-tower", "small", 2)]
    base, other = parse_side("cca-itq", "BASE"), parse_side("two-tower", "OTHER")
    found = cells(rows, base, other)
    assert [cell[0] for cell in found] == ["big"]
    rows.append(row("two-tower", "big", 2))
    found = cells(rows, base, other)
    assert len(found) == 2 and {cell[:5] for cell in found} == {("big", 16, "unimodal", None, 50)}
    assert len({cell[6] for cell in found}) == 2


def test_a_dataset_name_that_is_a_folder_or_a_data_dir_that_is_a_file(tmp_path, tiny_path):
    """-d NAME where DATA_DIR/NAME.h5 is a folder gave HDF5's own error ('errno = 21 ... buf = 0x7ffc...');
    a --data-dir that is a file, 'cannot create the folder'; -d '' looked for data/.h5."""
    (tmp_path / "dd.h5").mkdir()
    (tmp_path / "afile").write_text("x")
    for args, says in ((["-d", "dd", "--data-dir", str(tmp_path)], f"{tmp_path / 'dd.h5'}: is a folder, not a dataset file"),
                       (["-d", "synthetic", "--data-dir", str(tmp_path / "afile")],
                        f"{tmp_path / 'afile'}: is a file, not a folder of NAME.h5 dataset files (--data-dir)"),
                       (["-d", ""], "--dataset: an empty name; give a dataset name or an .h5 file")):
        result = CliRunner().invoke(main, ["train-hash", *args, "--results", str(tmp_path / "r.jsonl"),
                                           "--out", str(tmp_path / "runs")])
        assert result.exit_code == 2 and result.output == f"Error: {says}\n", result.output


def test_what_is_and_is_not_an_input(tmp_path, tiny_path):
    """The images of extract (a folder of them or a list) and search's --image files are inputs; a page into the
    index folder is refused new or not. Not inputs: a folder named as the dataset (a run's outputs of -d NAME),
    an earlier output in convert pkl's FOLDER (its inputs are the three .pkl files)."""
    from PIL import Image

    images = tmp_path / "imgs"
    images.mkdir()
    Image.new("RGB", (8, 8)).save(images / "0.jpg")
    (tmp_path / "list.txt").write_text(f"{images / '0.jpg'}\n")
    (tmp_path / "caps.tsv").write_text("0.jpg\ta caption\n")
    (tmp_path / "labels.tsv").write_text("0.jpg\tsea\n")
    before = _md5(images / "0.jpg")
    for source in (images, tmp_path / "list.txt"):
        result = CliRunner().invoke(main, ["extract", str(source), str(tmp_path / "caps.tsv"), str(tmp_path / "labels.tsv"),
                                           str(images / "0.jpg"), "--overwrite", "--model", str(tmp_path / "no-model")])
        assert result.exit_code == 2 and f"OUT {images / '0.jpg'}: is {images / '0.jpg'}, an input of this command " \
                                         "(IMAGES)" in result.output, result.output
    assert _md5(images / "0.jpg") == before
    index = tmp_path / "idx"
    index.mkdir()
    (index / "index.json").write_text("{}")
    for html, says in ((str(images / "0.jpg"), f"is {images / '0.jpg'}, an input of this command (--image)"),
                       (str(index / "new.html"), f"is inside {index}, an input of this command (INDEX)")):
        result = CliRunner().invoke(main, ["search", str(index), "--image", str(images / "0.jpg"), "--html", html,
                                           "--overwrite"])
        assert result.exit_code == 2 and f"--html {html}: {says}" in result.output, result.output
    assert not (index / "new.html").exists() and _md5(images / "0.jpg") == before
    # not inputs
    from ucmfh.app.environment import dataset_paths

    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki.h5").write_bytes(b"")
    assert dataset_paths("wiki", tmp_path) == [str(tmp_path / "wiki.h5")]
    assert dataset_paths(str(tmp_path / "wiki.h5"), "elsewhere") == [str(tmp_path / "wiki.h5")]
    from ucmfh.app.outputs import check_outputs

    (tmp_path / "pkl").mkdir()
    for split in ("train", "query", "retrieval"):
        (tmp_path / "pkl" / f"{split}.pkl").write_bytes(b"")
    (tmp_path / "pkl" / "out.h5").write_bytes(b"an earlier output")
    check_outputs({"OUT": str(tmp_path / "pkl" / "out.h5")},
                  inputs={"FOLDER": [str(tmp_path / "pkl" / f"{s}.pkl") for s in ("train", "query", "retrieval")],
                          "--dataset": dataset_paths("wiki", tmp_path)})
    with pytest.raises(ValueError, match=r"train.pkl: is .*train.pkl, an input of this command \(FOLDER\)"):
        check_outputs({"OUT": str(tmp_path / "pkl" / "train.pkl")},
                      inputs={"FOLDER": [str(tmp_path / "pkl" / f"{s}.pkl") for s in ("train", "query", "retrieval")]})


def test_a_read_only_file_is_not_replaced_even_with_overwrite(tmp_path, tiny_path):
    """A file no one may write (mode 444: a shared dataset) was replaced by 'make-synthetic --overwrite' run as
    root, who ignores permission bits; it is refused, the file left as it was."""
    shared = tmp_path / "shared.h5"
    shutil.copy(tiny_path, shared)
    shared.chmod(0o444)
    before = _md5(shared)
    result = CliRunner().invoke(main, ["make-synthetic", str(shared), "--overwrite"])
    assert result.exit_code == 2 and result.output == f"Error: OUT {shared}: cannot be written: the file is read-only\n"
    assert _md5(shared) == before


def test_a_read_only_input_given_as_an_output_is_named_as_the_input(tmp_path):
    """--results pointing at a read-only dataset (the shared copy) said 'read-only', not that it is the
    command's own input."""
    from ucmfh.app.outputs import check_outputs

    data = tmp_path / "wiki.h5"
    data.write_bytes(b"x")
    data.chmod(0o444)
    with pytest.raises(ValueError) as refused:
        check_outputs({"--html": str(data)}, inputs={"--queries": str(data)}, overwrite=True)
    assert str(refused.value).startswith("--html ") and "--queries" in str(refused.value)
    assert "read-only" not in str(refused.value)


def test_a_closed_form_fit_interrupted_leaves_no_folder_and_says_how_to_go_on(tmp_path, tiny_path, monkeypatch):
    """Ctrl-C in a cca-itq fit (no step, nothing saved): one line saying that the same command fits it again,
    exit 130, and no run folder holding its lock file alone."""
    import ucmfh.methods.cca_itq as cca_itq

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cca_itq, "fit_cca_itq", interrupted)
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "8", "--device",
                                       "cpu", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 130, result.output
    assert result.output.splitlines()[-1] == ("cca-itq 8 bits interrupted while fitting (a fit keeps no state: the "
                                              "same command fits it again)")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.lock"))


def test_a_file_in_the_way_of_a_checkpoint_is_refused_before_the_run_trains(tmp_path, tiny_path):
    """A file not a checkpoint's settings where a run's PATH.json goes was refused only once the run had trained,
    leaving its training states, and '--resume' trained again to the same refusal: now before the training."""
    args = ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "1", "-b", "8", "--out", str(tmp_path / "runs"),
            "--results", str(tmp_path / "r.jsonl")]
    assert CliRunner().invoke(main, args).exit_code == 0
    [checkpoint] = (tmp_path / "runs").rglob("hash8.pt")
    checkpoint.unlink()
    settings = checkpoint.with_suffix(".json")
    settings.write_text("my notes\n")
    before = sorted(p.name for p in checkpoint.parent.iterdir())
    for extra in ([], ["--resume"]):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 2 and result.output.splitlines()[-1] == (
            f"Error: {settings}: exists and is not a checkpoint's settings file, which {checkpoint} would write "
            "there; not replaced"), result.output
        assert "training" not in result.output and settings.read_text() == "my notes\n"
        assert sorted(p.name for p in checkpoint.parent.iterdir()) == before  # no training state left


def test_a_results_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch):
    """'runs' and 'compare' of a results file the user may not read said '[Errno 13] Permission denied: ...'.
    (Root reads any file: the refusal is made by open() itself here.)"""
    import builtins

    path = tmp_path / "r.jsonl"
    path.write_text("")
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    for command in (["runs"], ["compare", "cca-itq", "two-tower"]):
        result = CliRunner().invoke(main, [*command, "--results", str(path)])
        assert result.exit_code == 2 and result.output.splitlines() == [
            f"Error: {path}: the results file cannot be read (Permission denied)"], result.output


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_given_as_an_input_is_refused_not_waited_on(tmp_path, tiny_path, monkeypatch):
    """A FIFO given as a dataset, a checkpoint, a codes or a results file hung the command in open(), waiting
    for a writer (an index even past SIGTERM; an audit's): each reader now refuses what is not a regular file."""
    from ucmfh.data.input_files import load_npy
    from ucmfh.search.collection import open_collection

    for name in ("p.h5", "p.pt", "p.jsonl", "p.npy"):
        os.mkfifo(tmp_path / name)
    pipe = {name: str(tmp_path / name) for name in ("p.h5", "p.pt", "p.jsonl", "p.npy")}
    said = "is a pipe or a device (not a regular file), not a"

    def hung(signum, frame):
        raise TimeoutError("waited on a pipe")

    monkeypatch.setattr(signal, "signal", signal.signal)  # the handler is put back below, and the alarm off
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)  # a reader that opens the pipe waits for ever: the test fails rather than the suite hangs
    try:
        for argv, says in (
                (["train-hash", "-d", pipe["p.h5"], *SMALL, "--epochs", "1", "-b", "8", "--out", str(tmp_path / "r")],
                 f"{pipe['p.h5']}: not a regular file (a pipe or a device)"),
                (["evaluate", "--codes", pipe["p.h5"]], f"{pipe['p.h5']}: {said} codes file"),
                (["evaluate", "-c", pipe["p.pt"], "-d", tiny_path], f"{pipe['p.pt']}: {said} checkpoint"),
                (["index", "-c", pipe["p.pt"], tiny_path, "-o", str(tmp_path / "ix")], f"{pipe['p.pt']}: {said} "),
                (["runs", "--results", pipe["p.jsonl"]], f"{pipe['p.jsonl']}: {said} JSON-lines results file"),
                (["compare", "cca-itq", "two-tower", "--results", pipe["p.jsonl"]], f"{pipe['p.jsonl']}: {said} ")):
            result = CliRunner().invoke(main, argv)
            assert result.exit_code == 2 and result.output.splitlines()[-1].startswith(f"Error: {says}"), \
                (argv, result.output)
        with pytest.raises(ValueError, match=re.escape(f"p.h5: {said} collection file")):
            open_collection(pipe["p.h5"])
        with pytest.raises(ValueError, match=re.escape(f"p.npy: {said}n .npy array")):  # was 'empty file (0 bytes)'
            load_npy(pipe["p.npy"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_output_name_that_could_never_be_written_is_refused_before_any_work(tmp_path, tiny_path):
    """A dangling symbolic link as OUT was written through by nothing and said to be 'written by another process
    meanwhile', after the work; a legal name of 250 bytes failed after the work on its temporary name's extra
    bytes (an audit's). Both are refused up front, naming the flag."""
    (tmp_path / "dangling.h5").symlink_to(tmp_path / "nowhere.h5")
    result = CliRunner().invoke(main, ["make-synthetic", str(tmp_path / "dangling.h5")])
    assert result.exit_code == 2 and result.output == (
        f"Error: OUT {tmp_path / 'dangling.h5'}: is a symbolic link to {tmp_path / 'nowhere.h5'}, which does not "
        "exist; not written through it (give another name, or remove the link)\n")
    long = tmp_path / ("e" * 240 + ".jsonl")  # 246 bytes: a legal name, whose temporary name is not
    result = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, *SMALL, "--epochs", "1", "-b", "8",
                                       "--out", str(tmp_path / "runs"), "--results", str(long)])
    assert result.exit_code == 2 and result.output.startswith(f"Error: --results {long}: a name of 246 bytes "), \
        result.output
    assert "at most 220 here, as ucmfh writes it first under a temporary name up to 35 bytes longer" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.h5"]  # nothing trained, nothing written


def test_a_file_in_the_run_folders_way_and_an_unwritable_side_file_are_said_in_one_line(tmp_path, tiny_path,
                                                                                         monkeypatch):
    """A file where a run's folder goes was '[Errno 17] File exists: ...', and a grid added '(pass --overwrite to
    replace it)', which did not help; a checkpoint scored from a read-only folder lost its rows, after the scoring,
    to the per-query file beside it that no one asked for (an audit's)."""
    import errno

    import ucmfh.app.per_query

    runs = tmp_path / "runs"
    args = ["-d", tiny_path, *SMALL, "--epochs", "1", "-b", "8", "--out", str(runs)]
    assert CliRunner().invoke(main, ["train-hash", *args, "--results", ""]).exit_code == 0
    [checkpoint] = runs.rglob("hash8.pt")
    results = tmp_path / "r.jsonl"

    def read_only(path, replace=True):
        raise OSError(errno.EROFS, "Read-only file system")

    for written in checkpoint.parent.glob("hash8.queries-*.npz"):  # the training's scoring wrote the same file
        written.unlink()
    monkeypatch.setattr(ucmfh.app.per_query, "atomic_binary", read_only)
    result = CliRunner().invoke(main, ["evaluate", "-c", str(checkpoint), "-d", tiny_path, "--quiet", "--results",
                                       str(results)])
    assert result.exit_code == 0, result.output
    assert "per-query scores were not kept (Read-only file system): these rows have none" in result.output
    assert [row["per_query"] for row in map(json.loads, results.read_text().splitlines())] == [None]
    monkeypatch.undo()
    run_folder = checkpoint.parent
    shutil.rmtree(run_folder)
    run_folder.write_text("in the way")
    for command in (["train-hash", *args, "--results", ""],
                    ["grid", *args, "--methods", "two-tower", "--results", str(tmp_path / "g.jsonl"), "--overwrite"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2 and result.output.splitlines()[-1] == (
            f"Error: {run_folder}: the run's folder cannot be made or written (File exists: a file is in its way); "
            "give another --out"), result.output


def test_a_file_output_named_as_a_folder_and_a_folder_named_as_a_file_are_refused(tmp_path, tiny_path):
    """'encode -o codes/' encoded every item, then failed renaming its temporary file onto the name, in a line that
    named the temporary file ('[Errno 20] Not a directory: ..tmp...'); every file output ending in '/' is refused
    up front, naming its flag (an audit's)."""
    args = ["-d", tiny_path, *SMALL, "--epochs", "1", "-b", "8", "--out", str(tmp_path / "runs")]
    assert CliRunner().invoke(main, ["train-hash", *args, "--results", ""]).exit_code == 0
    [checkpoint] = (tmp_path / "runs").rglob("hash8.pt")
    for argv, flag in ((["encode", "-c", str(checkpoint), "-d", tiny_path, "-o"], "--out"),
                       (["train-hash", *args, "--results"], "--results")):
        given = f"{tmp_path / 'codes'}/"
        result = CliRunner().invoke(main, [*argv, given])
        assert result.exit_code == 2 and result.output == (
            f"Error: {flag} {given}: a folder's name (it ends in '/'); {flag} takes a file's path\n"), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    # the converse: 'train-hash --out model.pt' made a folder model.pt for its runs, without a word
    for argv in (["train-hash", "-d", tiny_path, "--results", "", "--out"], ["index", tiny_path, "-c", str(checkpoint),
                                                                               "-o"]):
        given = str(tmp_path / "model.pt")
        result = CliRunner().invoke(main, [*argv, given])
        assert result.exit_code == 2 and result.output.splitlines()[-1] == (
            f"Error: --out {given}: a file's name (.pt), where --out is a folder that ucmfh writes into; give a "
            "folder's name"), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_table_prefix_that_is_a_folder_is_refused(tmp_path, tiny_path):
    """'grid --table DIR/' wrote DIR/.md and DIR/.csv, files a listing does not show (an audit's)."""
    result = CliRunner().invoke(main, ["grid", "-d", tiny_path, "--methods", "two-tower", "-b", "8", "--table",
                                       f"{tmp_path / 'tables'}/", "--results", str(tmp_path / "g.jsonl")])
    assert result.exit_code == 2 and result.output.splitlines()[-1].startswith(
        f"Error: --table {tmp_path / 'tables'}/: a folder; --table takes a prefix of the files' names"), result.output
    assert list(tmp_path.iterdir()) == []
    # a folder of the prefix's name: the files beside it (the default table of --results g.jsonl, with --out g, was
    # refused as 'a folder' once g was made, naming a --table never given; a concurrency audit's)
    argv = ["grid", "-d", tiny_path, "--methods", "cca-itq", "-b", "8", "--out", str(tmp_path / "g"), "--results",
            str(tmp_path / "g.jsonl")]
    for _ in range(2):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 0 and f"wrote {tmp_path / 'g.md'}" in result.output, result.output


def test_a_name_from_the_users_data_neither_rewrites_the_terminal_nor_breaks_a_table(tmp_path, tiny_path):
    """A dataset file named with escape codes, '|', '<img …>', a leading '=' or '$…$' (an audit's): the terminal's
    tables and error lines showed the codes raw (a title set, the screen cleared), the grid's Markdown split its
    cells and held markup, its CSV a spreadsheet formula, and every plot command ended in mathtext's
    'Unknown symbol'."""
    from ucmfh.printable import printable

    assert printable("a\x1b]0;title\x07\x1b[2J\r\nb\u202ec\x00") == "a\\x1b]0;title\\x07\\x1b[2J\\r\\nb\\u202ec\\x00"
    assert printable("café ✓ | <x>") == "café ✓ | <x>"  # what is not a control character stays
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "\x1b]0;owned\x07\x1b[2Jmissing.h5")])
    assert result.exit_code == 2 and "\x1b" not in result.output and "\\x1b]0;owned\\x07" in result.output
    name = "=a|b<img src=x>$\\nope$\x1b[31m *z* `c` [l](u) _i_ ~~s~~"
    hostile = tmp_path / f"{name}.h5"
    shutil.copy(tiny_path, hostile)
    results, prefix = tmp_path / "g.jsonl", tmp_path / "tables"
    result = CliRunner().invoke(main, ["grid", "-d", str(hostile), "--methods", "cca-itq", "-b", "8", "--quiet",
                                       "--out", str(tmp_path / "runs"), "--results", str(results),
                                       "--table", str(prefix), "--plot", str(tmp_path / "plots" / "p")])
    assert result.exit_code == 0, result.output
    shown = printable(name)
    assert "\x1b" not in result.output and json.loads(results.read_text().splitlines()[0])["dataset"] == shown
    md = (tmp_path / "tables.md").read_text()
    # each character Markdown reads as markup written as it is: '*z*' was in italics, '[l](u)' a link
    assert "### =a\\|b&lt;img src=x&gt;\\$\\\\nope\\$\\\\x1b[31m \\*z\\* \\`c\\` [l]\\(u) \\_i\\_ \\~\\~s\\~\\~, protocol" in md
    assert "<img" not in md
    with open(tmp_path / "tables.csv", newline="") as f:
        assert next(csv.DictReader(f))["dataset"] == "'" + shown  # text in a spreadsheet, not a formula
    assert list((tmp_path / "plots").iterdir())  # drawn, '$…$' as it is
    result = CliRunner().invoke(main, ["runs", "--results", str(results)])
    assert result.exit_code == 0 and "\x1b" not in result.output and shown in result.output


def test_a_checkpoint_and_an_hdf5_file_given_for_each_other_are_said_to_be_so(tmp_path, tiny_path):
    """A dataset given for -c was 'not a readable checkpoint (truncated, or not a file torch saved)', and a
    checkpoint given for a dataset, a collection or a codes file 'not a readable HDF5 file (... file signature not
    found)' (an audit's)."""
    import torch

    saved = tmp_path / "hash8.pt"
    torch.save({"state": torch.zeros(2)}, saved)
    for argv in (["validate", str(saved)], ["train-hash", "-d", str(saved), "--results", ""],
                 ["index", str(saved), "-c", str(saved), "-o", str(tmp_path / "ix")],
                 ["evaluate", "--codes", str(saved), "--results", ""]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 2 and result.output.splitlines()[-1] == (
            f"Error: {saved}: a file torch saved (a checkpoint?), not an HDF5 file"), (argv, result.output)
    for argv in (["evaluate", "-c", tiny_path, "-d", tiny_path, "--results", ""],
                 ["encode", "-c", tiny_path, "-o", str(tmp_path / "codes.h5")]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 2 and result.output.splitlines()[-1] == (
            f"Error: {tiny_path}: not a readable checkpoint (an HDF5 file: a dataset, collection or codes file, not "
            "one torch saved)"), (argv, result.output)
