"""Where a command will write, checked before it does any work; a refusal names the flag that points there.

A run that trains for an hour and then cannot save its checkpoint or its result rows has lost the
hour: every command checks each of its outputs first (:func:`ucmfh.files.check_writable`) and
refuses in one line (``OSError``, a user error for :mod:`ucmfh.app.errors`):
``--results /ro/r.jsonl: cannot be written (in /ro): Permission denied``.
"""
from __future__ import annotations

from typing import Dict, Optional

from ucmfh.files import check_writable

# the files a --table PREFIX or --plot PREFIX stands for
SUFFIXES = {"--table": (".md", ".csv"), "--plot": ("_pr.png", "_pk.png")}


def check_outputs(files: Optional[Dict[str, Optional[str]]] = None,
                  folders: Optional[Dict[str, Optional[str]]] = None) -> None:
    """Refuse an output that could not be written, naming its flag: ``files`` and ``folders`` map a flag
    (``"--results"``, ``"--out"``) to its path (None or '': no output). A ``--table`` or ``--plot`` path
    is the prefix of the files it stands for."""
    outputs = [(flag, path, True) for flag, path in (folders or {}).items()]
    for flag, path in (files or {}).items():
        outputs += [(flag, path and path + suffix, False) for suffix in SUFFIXES.get(flag, ("",))]
    for flag, path, folder in outputs:
        if path:
            try:
                check_writable(path, folder=folder)
            except OSError as err:
                raise OSError(f"{flag} {err}") from None  # a user error (ucmfh.app.errors): one line, exit 2
