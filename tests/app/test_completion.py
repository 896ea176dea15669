"""Tab completion in the shell (click's: ``eval "$(_UCMFH_COMPLETE=bash_source ucmfh)"``): dataset names, files and
folders where an option names them."""
from __future__ import annotations

import click
from click.testing import CliRunner

from conftest import cli_commands
from ucmfh.app.cli import main

# options naming a file or folder to read or write
PATH_OPTIONS = {"dataset", "datasets", "data_dir", "results", "out", "tensorboard", "plot", "table", "metrics_out",
                "checkpoint", "codes", "seps_checkpoint", "image", "queries", "html", "classes_file", "ids",
                "split_index", "index", "collection", "folder", "images", "captions", "labels", "path", "text"}
# not paths: runs' and compare's -d filter rows by a dataset's name; search's --text is a query, its --ids ids;
# runs --checkpoint is a flag
FILTERS = {("runs", "dataset"), ("compare", "dataset"), ("search", "text"), ("search", "ids"), ("runs", "checkpoint")}


def complete(words: str, tmp_path, monkeypatch) -> list:
    """What bash is offered after ``words`` (the last word being completed), as (type, value) pairs."""
    monkeypatch.chdir(tmp_path)
    env = {"_UCMFH_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    result = CliRunner().invoke(main, [], env=env, prog_name="ucmfh")
    assert result.exit_code == 0, result.output
    return [tuple(line.split(",", 1)) for line in result.output.splitlines()]


def test_dataset_names_from_the_data_folder_then_files(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    for name in ("wiki.h5", "flickr8k.h5", "notes.txt"):
        (tmp_path / "data" / name).touch()
    assert complete("ucmfh train-hash -d ", tmp_path, monkeypatch) == [
        ("file", ""), ("plain", "flickr8k"), ("plain", "synthetic"), ("plain", "wiki")]
    assert complete("ucmfh grid -d wi", tmp_path, monkeypatch) == [("file", "wi"), ("plain", "wiki")]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.h5").touch()
    assert complete("ucmfh evaluate --data-dir other -d m", tmp_path, monkeypatch) == [("file", "m"),
                                                                                       ("plain", "mine")]
    # a path: no name begins so, and bash completes it as a file
    assert complete("ucmfh train-seps -d ../", tmp_path, monkeypatch) == [("file", "../")]


def test_folders_and_files(tmp_path, monkeypatch):
    assert complete("ucmfh train-hash --out ", tmp_path, monkeypatch) == [("dir", "")]
    assert complete("ucmfh train-hash --data-dir d", tmp_path, monkeypatch) == [("dir", "d")]
    assert complete("ucmfh grid -d wiki --tensorboard r", tmp_path, monkeypatch) == [("dir", "r")]
    assert complete("ucmfh runs --results r", tmp_path, monkeypatch) == [("file", "r")]
    assert complete("ucmfh grid -d wiki --table t", tmp_path, monkeypatch) == [("file", "t")]
    assert ("plain", "two-tower") in complete("ucmfh train-hash --method t", tmp_path, monkeypatch)


def test_every_option_naming_a_file_or_folder_completes_as_one():
    """A new path option without completion is caught here: click's Path types complete files themselves, a text
    option needs a ``shell_complete`` (:func:`ucmfh.app.options.complete_files` and its kin)."""
    missing = [f"{name} {param.name}" for name, command in cli_commands() for param in command.params
               if param.name in PATH_OPTIONS and (name, param.name) not in FILTERS
               and not isinstance(param.type, click.Path) and param._custom_shell_complete is None]
    assert missing == []
