"""scripts/compact_data.py: the copy is a valid dataset file whose features are the originals rounded to
float16, every other array and attribute as it was, smaller; an existing output is refused, exit 2."""
from __future__ import annotations

import os

import h5py
import numpy as np

from conftest import caption_file, load_script
from ucmfh.data.h5 import load_dataset, validate_file

compact = load_script("compact_data")


def test_the_copy_holds_the_features_rounded_to_float16_and_everything_else_as_it_was(tmp_path):
    src, dst = str(tmp_path / "captions.h5"), str(tmp_path / "out" / "captions.h5")
    caption_file(src, n_query=8, n_retrieval=200)
    with h5py.File(src, "a") as f:  # the train split is the retrieval split, as in flickr8k.h5: hard links
        for name in list(f["train"]):
            del f["train"][name]
            f["train"][name] = f["retrieval"][name]
    assert compact.main([src, dst]) == 0
    validate_file(dst)
    a, b = load_dataset(src), load_dataset(dst)
    for split in ("train", "query", "retrieval"):
        for name in ("img", "txt"):
            x, y = getattr(getattr(a, split), name).numpy(), getattr(getattr(b, split), name).numpy()
            assert y.dtype == np.float32 and np.array_equal(y, x.astype(np.float16).astype(np.float32)), (split, name)
            assert 0 < np.abs(x - y).max() <= 1e-3 * np.abs(x).max()
    with h5py.File(src, "r") as f, h5py.File(dst, "r") as g:
        assert all(g["train"][name].id == g["retrieval"][name].id for name in g["train"])  # one array, two names
        assert g.attrs["compacted"] == compact.NOTE
        assert {k: v for k, v in g.attrs.items() if k != "compacted"}.keys() == dict(f.attrs).keys()
        names = []
        f.visit(names.append)
        for name in names:
            if isinstance(f[name], h5py.Dataset) and f[name].dtype != np.float32:
                assert np.array_equal(f[name][()], g[name][()]), name
    assert os.path.getsize(dst) < os.path.getsize(src)
    assert not os.path.exists(dst + ".part")


def test_an_existing_output_is_refused(tmp_path, capsys):
    src = str(tmp_path / "captions.h5")
    caption_file(src)
    assert compact.main([src, src]) == 2 and "exists; remove it first" in capsys.readouterr().err


def test_a_feature_beyond_float16_s_range_is_copied_unrounded_and_said(tmp_path, capsys):
    """Rounded, a value beyond 65504 became inf: an invalid copy, said valid (exit 0)."""
    src, dst = str(tmp_path / "captions.h5"), str(tmp_path / "out.h5")
    caption_file(src)
    with h5py.File(src, "a") as f:
        big = f["query"]["image"][()] * 1e5
        del f["query"]["image"]
        f["query"]["image"] = big
    assert compact.main([src, dst]) == 0
    assert f"{dst}: /query/image: copied unrounded (a value beyond float16's range, 65504)" in capsys.readouterr().out
    validate_file(dst)
    with h5py.File(dst, "r") as g:
        assert np.array_equal(g["query"]["image"][()], big)


def test_a_stopped_or_failed_copy_leaves_nothing_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    src = str(tmp_path / "captions.h5")
    caption_file(src)
    (tmp_path / "file").write_text("in the way")
    for dst, says in (("", "dst: an empty path"), (str(tmp_path / "file" / "x.h5"), "File exists")):
        assert compact.main([src, dst]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("compact_data.py: error: ") and says in err, err

    class Stopped:  # Ctrl-C heard: the copy stops at the next array
        def __enter__(self):
            return {"signal": 2}

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(compact, "stop_on_signals", Stopped)
    assert compact.main([src, str(tmp_path / "out.h5")]) == 130
    assert "interrupted; nothing written" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["captions.h5", "file"]
