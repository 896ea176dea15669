"""Pickles someone else wrote: data loads as plain pickle loads it; code is refused, by name, and never runs."""
from __future__ import annotations

import collections
import io
import os
import pickle
import subprocess

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ucmfh.app.data_cli import convert
from ucmfh.data import DataError
from ucmfh.data.safe_pickle import REFUSAL, load_pickle


def data_object():
    """What released feature files hold: numpy arrays, tensors, numpy scalars and plain containers."""
    rng = np.random.default_rng(0)
    return {
        "image": rng.standard_normal((4, 3)).astype(np.float32),
        "text": torch.from_numpy(rng.standard_normal((4, 2))),
        "label": (rng.random((4, 5)) < 0.5).astype(np.uint8),
        "ints": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, 1:],  # a strided view
        "scalar": np.float64(0.5),
        "names": ["a", ("b", 1), {2, 3}, frozenset({4}), b"", b"raw", bytearray(b"x"), None, True, 1.5],
        "ordered": collections.OrderedDict(n=np.int32(7)),
    }


def assert_same(got, expected):
    assert type(got) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected) and got.stride() == expected.stride()
    elif isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same(a, b)
    else:
        assert got == expected


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_data_loads_as_plain_pickle_loads_it(tmp_path, protocol):
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(data_object(), protocol=protocol))
    assert_same(load_pickle(path), pickle.loads(path.read_bytes()))
    assert_same(load_pickle(path), data_object())


def test_numpy_1_spelling_loads(tmp_path):
    """numpy 1 wrote ``numpy.core.multiarray``; numpy 2 writes ``numpy._core``: released files hold either, and
    either is read under numpy 1 or 2 (numpy 2's under numpy < 1.26.1 was 'truncated or damaged')."""
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = pickle.dumps({"image": array, "scalar": np.float32(2)}, protocol=2)
    written = next(s for s in (b"numpy._core.multiarray", b"numpy.core.multiarray") if s in data)
    for spelling in (b"numpy.core.multiarray", b"numpy._core.multiarray"):
        path = tmp_path / "old.pkl"
        path.write_bytes(data.replace(written, spelling))
        loaded = load_pickle(path)
        np.testing.assert_array_equal(loaded["image"], array)
        assert loaded["scalar"] == np.float32(2)


class Reduces:
    """An object that pickles as the call ``function(*args)``: what a malicious pickle is."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args

    def __call__(self, *args):  # pickle wants a callable where this stands for one (the getattr gadget)
        raise AssertionError("never called: it is only pickled")


def legacy_torch_bytes(obj) -> bytes:
    """What a tensor's storage pickles as: a ``torch.save`` in the legacy format, read back by ``torch.load``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def payloads(marker: str):
    """Pickles that would create ``marker``, each with the global the loader names as it refuses it."""
    return {
        "os.system": (Reduces(os.system, f"touch {marker}"), f"{os.system.__module__}.system"),
        "eval": (Reduces(eval, f"__import__('os').system('touch {marker}')"), "builtins.eval"),
        "subprocess.Popen": (Reduces(subprocess.Popen, ["touch", marker]), "subprocess.Popen"),
        # getattr reaches a method of an allowed class, which writes a file
        "getattr": ({"image": Reduces(Reduces(getattr, np.ndarray, "tofile"), np.zeros(1), marker)},
                    "builtins.getattr"),
        # a tensor's storage bytes are themselves a pickle, which plain pickle hands to an unrestricted torch.load
        "tensor storage": ({"image": Reduces(torch.storage._load_from_bytes,
                                             legacy_torch_bytes(Reduces(os.system, f"touch {marker}")))},
                           f"{os.system.__module__}.system"),
    }


def run_plain_pickle(data: bytes) -> None:
    """Load with ``pickle.loads``: proves a payload is live (it runs ``touch`` in a test's tmp_path)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's advice on weights_only
        loaded = pickle.loads(data)
    for value in (loaded.values() if isinstance(loaded, dict) else [loaded]):
        if isinstance(value, subprocess.Popen):
            value.wait()


@pytest.mark.parametrize("kind", list(payloads("m")))
def test_code_is_refused_by_name_and_never_runs(tmp_path, kind):
    marker = tmp_path / "MARKER"
    payload, wanted = payloads(str(marker))[kind]
    data = pickle.dumps(payload)
    run_plain_pickle(data)
    assert marker.exists(), "the payload is live: plain pickle runs it"
    marker.unlink()
    path = tmp_path / "evil.pkl"
    path.write_bytes(data)
    with pytest.raises(DataError) as err:
        load_pickle(path)
    assert str(err.value) == f"{path}: refuses to load '{wanted}': {REFUSAL}"
    assert not marker.exists()


def write_release(folder, train=None):
    rng = np.random.default_rng(1)
    for split in ("train", "query", "retrieval"):
        labels = np.zeros((6, 3), dtype=np.float32)
        labels[:, 0] = 1
        part = {"image": rng.standard_normal((6, 8)).astype(np.float32),
                "text": rng.standard_normal((6, 8)).astype(np.float32), "label": labels}
        with open(folder / f"{split}.pkl", "wb") as f:
            pickle.dump(train if split == "train" and train is not None else part, f)


@pytest.mark.parametrize("kind", list(payloads("m")))
def test_convert_pkl_refuses_a_malicious_file_with_exit_2(tmp_path, kind):
    marker = tmp_path / "MARKER"
    folder = tmp_path / "release"
    folder.mkdir()
    write_release(folder, train=payloads(str(marker))[kind][0])
    out = tmp_path / "out.h5"
    result = CliRunner().invoke(convert, ["pkl", str(folder), str(out)])
    assert result.exit_code == 2, result.output
    wanted = payloads("m")[kind][1]
    assert result.output == f"Error: {folder / 'train.pkl'}: refuses to load '{wanted}': {REFUSAL}\n"
    assert not marker.exists() and not out.exists()


def test_convert_pkl_still_reads_a_release(tmp_path):
    folder = tmp_path / "release"
    folder.mkdir()
    write_release(folder)
    result = CliRunner().invoke(convert, ["pkl", str(folder), str(tmp_path / "out.h5")])
    assert result.exit_code == 0, result.output
    assert "train 6, query 6, retrieval 6" in result.output
