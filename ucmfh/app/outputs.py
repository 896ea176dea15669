"""Where a command will write, checked before it does any work; a refusal names the flag that points there.

A run that trains for an hour and then cannot save its checkpoint or its result rows has lost the
hour: every command checks each of its outputs first (:func:`ucmfh.files.check_writable`) and
refuses in one line (``OSError``, a user error for :mod:`ucmfh.app.errors`):
``--results /ro/r.jsonl: cannot be written (in /ro): Permission denied``.

Nothing the user saved is lost: a page, a table, a figure or a metrics file is written over only where
ucmfh wrote that kind of file before (:func:`ucmfh.files.check_replaceable`), any other file only with
``--overwrite``; result rows are appended only to a JSON-lines file (:func:`ucmfh.files.check_jsonl`).
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Union

from ucmfh.files import check_jsonl, check_not_input, check_replaceable, check_writable
from ucmfh.metrics.plots import SUFFIXES, figure_kind, figure_start
from ucmfh.training_log import TensorBoardLog

# the whole files each flag writes: (suffix of its path, kind of file); a --table PREFIX or --plot PREFIX
# stands for two
WRITES = {
    "--html": (("", "page"),),
    "--metrics-out": (("", "metrics"),),
    # evaluate's, after figure_start(PREFIX): PREFIX_ or FOLDER/
    "--plot": tuple((f"{kind}{suffix}", figure_kind(suffix)) for kind in ("pr", "pk") for suffix in SUFFIXES),
    "--table": ((".md", "table"), (".csv", "table-csv")),
}
STARTS = {"--plot": figure_start}  # an output whose path is the start of its files' names, worked out so
APPENDS = ("--results",)  # JSON-lines files that rows are appended to
# the names of files, refused as a new folder's (an existing folder of such a name is the user's choice)
FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".h5", ".hdf5", ".npz", ".npy", ".json", ".jsonl", ".csv", ".md", ".png",
                 ".svg", ".html")
NONE_IF_EMPTY = ("--results",)  # outputs that '' turns off (--results '': no row kept); any other '' is refused


Inputs = Dict[str, Union[str, Sequence[str], None]]


def check_outputs(files: Optional[Dict[str, Optional[str]]] = None,
                  folders: Optional[Dict[str, Optional[str]]] = None, overwrite: bool = False,
                  inputs: Optional[Inputs] = None, new: Sequence[str] = ()) -> None:
    """Refuse an output that could not be written, or would replace a file of the user's, naming its flag:
    ``files`` and ``folders`` map a flag (``"--results"``, ``"--out"``) to its path (None: no output; '': no
    output for a flag of NONE_IF_EMPTY, else refused: it would write './.md' or into the current folder).
    ``overwrite``: the command's --overwrite was given. ``inputs``: the command's inputs by flag (a path or
    several; a folder: an index), never written over, ``overwrite`` or not. ``new``: the flags of ``files``
    whose file is written whole, whatever it holds (a dataset, a codes file): one that exists is replaced only
    with ``overwrite`` (``FileExistsError``), said after the refusals that --overwrite does not lift (an input, a
    device, a file that cannot be written)."""
    for flag, path, folder in [(f, p, False) for f, p in (files or {}).items()] + \
            [(f, p, True) for f, p in (folders or {}).items()]:
        if path == "" and flag not in NONE_IF_EMPTY:
            raise ValueError(f"{flag}: an empty path; give the {'folder' if folder else 'file'} to write")
    # PREFIX.md of a folder was 'adir/.md' (a hidden file); a --plot folder holds its figures (figure_start). A
    # folder of the prefix's name is no matter: its files are beside it (grid's --table, defaulted from --results
    # r.jsonl, was refused the second time as 'r' was its --out too)
    for flag, path in (files or {}).items():
        if path and flag in WRITES and flag not in STARTS and WRITES[flag][0][0] and path.endswith(("/", os.sep)):
            raise ValueError(f"{flag} {path}: a folder; {flag} takes a prefix of the files' names: give one in it, "
                             f"e.g. {os.path.join(path, 'curves')}")
    for flag, path in (files or {}).items():  # 'codes/': written whole, then its rename onto a folder failed
        if path and flag not in STARTS and path.endswith(("/", os.sep)):
            raise ValueError(f"{flag} {path}: a folder's name (it ends in '{path[-1]}'); {flag} takes a file's path")
    for flag, path in (folders or {}).items():  # 'train-hash --out model.pt' made a folder model.pt, without a word
        suffix = os.path.splitext(os.path.normpath(path))[1].lower() if path else ""
        if suffix in FILE_SUFFIXES and not os.path.isdir(path):
            raise ValueError(f"{flag} {path}: a file's name ({suffix}), where {flag} is a folder that ucmfh writes "
                             "into; give a folder's name")
    outputs = [(flag, path, True, None) for flag, path in (folders or {}).items()]
    for flag, path in (files or {}).items():
        start = path and STARTS.get(flag, str)(path)
        outputs += [(flag, start and start + suffix, False, kind) for suffix, kind in WRITES.get(flag, (("", None),))]
    written: Dict[str, str] = {}  # two outputs of one command into one file: the second destroys the first
    for flag, path, folder, kind in outputs:
        if path and not folder:
            other = written.setdefault(os.path.realpath(path), flag)
            if other != flag:
                raise ValueError(f"{other} and {flag}: both would write {path}; give each its own file")
    for flag, path, folder, kind in outputs:
        if not path:
            continue
        if flag == "--tensorboard":
            TensorBoardLog(path)  # the package is there (an ImportError names the extra to install)
        try:
            if not folder:  # an input first: 'it is your --queries file' says more than 'it is read-only'
                check_not_input(path, inputs or {})
            check_writable(path, folder=folder)
            if flag in new and not overwrite and os.path.exists(path):
                raise FileExistsError(f"{path}: exists; not replaced")
            if kind is not None:
                check_replaceable(path, kind, overwrite)
            if flag in APPENDS:
                check_jsonl(path, results=True)
        except (OSError, ValueError) as err:  # a user error (ucmfh.app.errors): one line, exit 2
            raise type(err)(f"{flag} {err}") from None


def check_figures(flag: str, paths: Sequence[str], overwrite: bool = False) -> None:
    """:func:`check_outputs` for figures whose names a command works out itself (``runs --plot PREFIX``
    draws one per dataset and score, ``compare --plot PATH`` one, PNG or SVG by its suffix)."""
    for path in paths:
        try:
            check_writable(path)
            check_replaceable(path, figure_kind(path), overwrite)
        except (OSError, ValueError) as err:  # a user error (ucmfh.app.errors): one line, exit 2
            raise type(err)(f"{flag} {err}") from None
