"""Without the compiled kernels (no C compiler at install) scoring ran on torch without a word, 7-13x slower; it
is said once a process, and the ``ucmfh`` command shows its own warnings as one plain line."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import ucmfh.metrics.native as native
from ucmfh.app.errors import plain_warnings
from ucmfh.metrics import backend, map_at_k


def test_scoring_without_the_kernels_says_so_once(monkeypatch):
    monkeypatch.setattr(native, "_hamming", None)
    monkeypatch.setattr(native, "_SAID", [False])
    codes, labels = torch.ones(6, 16), torch.ones(6, 2)
    with backend("torch"), warnings.catch_warnings():  # the torch path chosen: nothing to say
        warnings.simplefilter("error")
        map_at_k(codes, codes, labels, labels)
    with pytest.warns(RuntimeWarning, match=r"compiled evaluation kernels are not built beside the ucmfh imported "
                                            r"here \(.*ucmfh\): .* 7-13x slower"):
        first = map_at_k(codes, codes, labels, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once a process
        assert map_at_k(codes, codes, labels, labels) == first == 1.0


def test_the_command_shows_ucmfh_s_warnings_as_one_line(capsys):
    inside = os.path.join(os.path.dirname(native.__file__), "native.py")
    elsewhere = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda *args, **kwargs: elsewhere.append(args[:4])  # Python's own, as it was
        plain_warnings()
        warnings.showwarning("the kernels are not built", RuntimeWarning, inside, 1)
        warnings.showwarning("another package's", UserWarning, "/elsewhere/pkg.py", 7)
    assert capsys.readouterr().err == "warning: the kernels are not built\n"
    assert elsewhere == [("another package's", UserWarning, "/elsewhere/pkg.py", 7)]
