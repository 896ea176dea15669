"""The backend setting: which path computes Hamming metrics of CPU tensors."""
from __future__ import annotations

import pytest
import torch

import ucmfh.metrics.native as native
from ucmfh.metrics import backend, native_kernels, set_backend, top_k
from ucmfh.metrics.native import use_native

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def restore_backend():
    previous = set_backend("auto")
    yield
    set_backend(previous)


def codes(n, n_bits, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(n, n_bits, generator=g) > 0.5, 1.0, -1.0)


def test_set_backend_returns_the_previous_choice_and_results_do_not_change():
    q, r = codes(5, 16, 11), codes(300, 16, 12)
    assert set_backend("torch") == "auto"
    assert not use_native(CPU)
    d0, i0 = top_k(q, r, 20)
    assert set_backend("auto") == "torch"
    assert use_native(CPU) == (native_kernels() is not None)
    d1, i1 = top_k(q, r, 20)
    assert torch.equal(i0, i1) and torch.equal(d0, d1)


def test_backend_context_restores_the_previous_choice_even_after_an_error():
    with backend("torch"):
        assert not use_native(CPU)
        with pytest.raises(ValueError, match="k must be"):
            with backend("auto"):
                top_k(codes(2, 8, 0), codes(5, 8, 1), 0)
        assert not use_native(CPU)
    assert use_native(CPU) == (native_kernels() is not None)


def test_bad_choices_are_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        set_backend("gpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        with backend("numpy"):
            pass
    assert use_native(CPU) == (native_kernels() is not None)  # unchanged


def test_native_needs_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(native, "_hamming", None)  # as where the C build failed
    monkeypatch.setattr(native, "_SAID", [False])
    with pytest.raises(RuntimeError, match="not built"):
        set_backend("native")
    # and says so, once a process
    with pytest.warns(RuntimeWarning, match="kernels are not built beside the ucmfh imported here"):
        assert not use_native(CPU)  # "auto" falls back to torch


def test_the_library_reads_no_environment_variable(monkeypatch):
    """UCMFH_NATIVE is the ucmfh command's business: it calls set_backend."""
    if native_kernels() is None:
        pytest.skip("the compiled Hamming kernels are not built")
    monkeypatch.setenv("UCMFH_NATIVE", "0")
    assert use_native(CPU)
    with backend("native"):
        assert use_native(CPU) and not use_native(torch.device("cuda"))
