"""Converters: every value survives; .mat v5 and v7.3 agree; bad input fails by name."""
import fractions
import logging
import os
import pickle

import h5py
import numpy as np
import pytest
import scipy.io
import torch

from ucmfh.config import SettingError
from ucmfh.data import DataError, load_dataset
from ucmfh.data.arrays import open_array
from ucmfh.data.convert import convert_arrays, convert_pkl
from ucmfh.data.writer import open_writer
from ucmfh.data.splits import STANDARD_SPLITS, SplitSizes, load_split_index, resolve_sizes, sample_split

N, D_IMG, D_TXT, C = 60, 12, 7, 5
SIZES = SplitSizes(query=10, train=20)


def whole_set(seed=0, n=N):
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((n, D_IMG)).astype(np.float32)
    text = rng.standard_normal((n, D_TXT)).astype(np.float32)
    labels = (rng.random((n, C)) < 0.4).astype(np.uint8)
    labels[np.arange(n), rng.integers(0, C, n)] = 1  # every row has a label
    return image, text, labels


def save_npy(tmp_path, image, text, labels):
    paths = []
    for name, array in (("image", image), ("text", text), ("labels", labels)):
        paths.append(str(tmp_path / f"{name}.npy"))
        np.save(paths[-1], array)
    return paths


def save_mat73(path, variables):
    """MATLAB v7.3 layout: an HDF5 file whose datasets hold MATLAB's [N, d] as [d, N]."""
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, array in variables.items():
            f.create_dataset(name, data=np.ascontiguousarray(array.T))
            f[name].attrs["MATLAB_class"] = np.bytes_("double" if array.dtype == np.float64 else "uint8")
    with open(path, "r+b") as f:  # MATLAB's 128-byte text header inside the user block
        f.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: test HDF5 schema 1.00 .".ljust(128))


def check_values(ds, image, text, labels):
    for split, part in ds.splits():
        rows = part.ids.numpy()
        np.testing.assert_array_equal(part.img.numpy(), image[rows].astype(np.float32))
        np.testing.assert_array_equal(part.txt.numpy(), text[rows].astype(np.float32))
        np.testing.assert_array_equal(part.labels.numpy(), labels[rows])


def test_arrays_round_trip_preserves_every_value(tmp_path):
    image, text, labels = whole_set()
    out = tmp_path / "set.h5"
    report = convert_arrays(*save_npy(tmp_path, image, text, labels), out, sizes=SIZES, seed=3, progress=False)
    ds = load_dataset(out)
    assert report.rows == {"train": 20, "query": 10, "retrieval": 50}
    check_values(ds, image, text, labels)
    q, r, t = (set(p.ids.tolist()) for p in (ds.query, ds.retrieval, ds.train))
    assert not q & r and t <= r and q | r == set(range(N))
    assert "seed=3" in ds.attrs["split"] and "first 20 of retrieval" in ds.attrs["split"]
    assert ds.attrs["classes"] == [f"class_{i}" for i in range(C)]


def test_a_caption_set_from_arrays_keeps_an_image_s_captions_in_one_split(tmp_path):
    """LABELS 'none' and --ids: a caption set (relevance: same id). An image's captions stay in one split, the
    sizes count images, the ids written are the ones given; a missing --ids, ids of another length or below
    0 are refused by name. (The command could make no caption set: LABELS was required, ids were row numbers.)"""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    rng = np.random.default_rng(4)
    ids = np.repeat(np.arange(100, 130), 2)  # 30 images, 2 captions each
    image = np.repeat(rng.standard_normal((30, D_IMG)).astype(np.float32), 2, axis=0)
    text = rng.standard_normal((60, D_TXT)).astype(np.float32)
    paths = save_npy(tmp_path, image, text, np.zeros((60, 1)))[:2]
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "captions.h5"
    result = CliRunner().invoke(main, ["convert", "npz", *paths, "none", str(out), "--ids", str(tmp_path / "ids.npy"),
                                       "--query", "5", "--train", "10", "--quiet"])
    assert result.exit_code == 0, result.output
    ds = load_dataset(out)
    assert ds.caption_set and (len(ds.query), len(ds.retrieval), len(ds.train)) == (10, 50, 20)
    assert "classes" not in ds.attrs  # no classes: no attribute, where an empty float64 array was written
    for _, part in ds.splits():  # each image's two captions, its features and its id as given
        row = {int(i): r for r, i in enumerate(ids)}
        source = np.array([row[int(i)] for i in part.ids])  # a source row of each id: its image's features
        np.testing.assert_array_equal(part.img.numpy(), image[source])
        assert np.all(np.bincount(part.ids.numpy() - 100) % 2 == 0)
    assert not set(ds.query.ids.tolist()) & set(ds.retrieval.ids.tolist())
    huge = np.arange(60, dtype=np.uint64) // 2
    huge[7] = 2**63 + 5  # wrapped to a negative id, said of the output file (an audit's)
    np.save(tmp_path / "huge.npy", huge)
    for argv, said in [(["none", str(tmp_path / "o.h5")], "LABELS 'none' makes a caption set, which needs --ids"),
                       (["none", str(tmp_path / "o.h5"), "--ids", paths[0]], "image.npy: expected 60 ids, one a row "
                                                                            "of the features, got shape (60, 12)"),
                       (["none", str(tmp_path / "o.h5"), "--ids", str(tmp_path / "huge.npy")],
                        f"{tmp_path / 'huge.npy'}: id 9223372036854775813 at row 7 does not fit int64")]:
        refused = CliRunner().invoke(main, ["convert", "npz", *paths, *argv, "--query", "5", "--train", "10"])
        assert refused.exit_code == 2 and said in refused.output, refused.output
    assert not (tmp_path / "o.h5").exists()


def test_npz_keys_and_chunked_equals_unchunked(tmp_path):
    image, text, labels = whole_set(1)
    src = tmp_path / "all.npz"
    np.savez(src, img=image, txt=text, L=labels)
    a = convert_arrays(src, src, src, tmp_path / "a.h5", sizes=SIZES, progress=False)
    b = convert_arrays(src, src, src, tmp_path / "b.h5", sizes=SIZES, chunk_rows=7, progress=False)
    da, db = load_dataset(a.path), load_dataset(b.path)
    for (_, pa), (_, pb) in zip(da.splits(), db.splits()):
        assert torch.equal(pa.img, pb.img) and torch.equal(pa.txt, pb.txt) and torch.equal(pa.ids, pb.ids)
    check_values(da, image, text, labels)


@pytest.mark.parametrize("fmt", ["v5", "v7.3"])
def test_mat_release_matches_npy(tmp_path, fmt):
    image, text, labels = whole_set(2)
    # DJSRH-style: three files, float64 features, MATLAB variable names
    files = {}
    for stem, key, array in (("iall", "IAll", image.astype(np.float64)), ("yall", "YAll", text.astype(np.float64)),
                             ("lall", "LAll", labels)):
        files[stem] = str(tmp_path / f"mirflickr25k-{stem}.mat")
        if fmt == "v5":
            scipy.io.savemat(files[stem], {key: array})
        else:
            save_mat73(files[stem], {key: array})
    assert h5py.is_hdf5(files["iall"]) == (fmt == "v7.3")
    assert open_array(files["iall"], role="image").shape == (N, D_IMG)
    got = convert_arrays(files["iall"], files["yall"], files["lall"], tmp_path / "mat.h5", sizes=SIZES, seed=5,
                         progress=False)
    ref = convert_arrays(*save_npy(tmp_path, image, text, labels), tmp_path / "npy.h5", sizes=SIZES, seed=5,
                         progress=False)
    dg, dr = load_dataset(got.path), load_dataset(ref.path)
    check_values(dg, image, text, labels)
    for (_, pg), (_, pr) in zip(dg.splits(), dr.splits()):
        assert torch.equal(pg.ids, pr.ids) and torch.equal(pg.img, pr.img)


def test_mat73_raw_images_point_to_extract(tmp_path):
    path = tmp_path / "iall.mat"
    save_mat73(path, {"IAll": np.zeros((4, 3, 8, 8), dtype=np.uint8)})
    with pytest.raises(DataError, match=r"iall\.mat:IAll: .*ucmfh extract"):
        open_array(path, role="image")


def test_mat_with_several_variables_needs_a_key(tmp_path):
    path = tmp_path / "two.mat"
    scipy.io.savemat(path, {"A": np.ones((3, 2)), "B": np.ones((3, 2))})
    with pytest.raises(DataError, match="2 variables"):
        open_array(path, role="image")
    assert open_array(path, key="B").shape == (3, 2)
    with pytest.raises(DataError, match="no variable 'Z'"):
        open_array(path, key="Z")


def test_empty_label_rows_dropped_with_count_or_fail(tmp_path, caplog):
    image, text, labels = whole_set(3)
    labels[[4, 9, 30]] = 0
    paths = save_npy(tmp_path, image, text, labels)
    with pytest.raises(DataError, match=r"labels\.npy: 3 rows have no label \(first: row 4\)"):
        convert_arrays(*paths, tmp_path / "fail.h5", sizes=SIZES, empty_labels="fail", progress=False)
    assert not (tmp_path / "fail.h5").exists()
    with caplog.at_level(logging.WARNING, logger="ucmfh.data.convert"):
        report = convert_arrays(*paths, tmp_path / "drop.h5", sizes=SIZES, progress=False)
    assert "dropped 3 of 60 rows" in caplog.text
    assert report.dropped == {"all": 3} and report.rows["retrieval"] == 47
    ds = load_dataset(report.path)
    assert not {4, 9, 30} & set(torch.cat([p.ids for _, p in ds.splits()]).tolist())
    check_values(ds, image, text, labels)


def test_mismatched_rows_and_bad_labels_name_the_file(tmp_path):
    image, text, labels = whole_set(4)
    paths = save_npy(tmp_path, image, text[:-1], labels)
    with pytest.raises(DataError, match=r"text\.npy: 59 rows, but .*image\.npy has 60"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    labels = labels.astype(np.float32) * 2
    paths = save_npy(tmp_path, image, text, labels)
    with pytest.raises(DataError, match=r"labels\.npy: labels must be multi-hot 0/1"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    with pytest.raises(SettingError, match="asks for query 10 \\+ retrieval 55 of 60 rows") as refused:
        convert_arrays(*save_npy(tmp_path, *whole_set()), tmp_path / "x.h5", sizes=SplitSizes(10, 5, 55),
                       progress=False)
    assert refused.value.settings == ("query", "retrieval")  # said as --query and --retrieval by the command
    with pytest.raises(DataError, match="no such file"):
        convert_arrays(tmp_path / "missing.npy", *paths[1:], tmp_path / "x.h5", sizes=SIZES, progress=False)
    assert not (tmp_path / "x.h5").exists()


def test_existing_output_is_kept_unless_overwrite(tmp_path):
    paths = save_npy(tmp_path, *whole_set())
    out = tmp_path / "set.h5"
    convert_arrays(*paths, out, sizes=SIZES, progress=False)
    with pytest.raises(FileExistsError):
        convert_arrays(*paths, out, sizes=SIZES, progress=False)
    convert_arrays(*paths, out, sizes=SIZES, seed=9, overwrite=True, progress=False)
    assert "seed=9" in load_dataset(out).attrs["split"]


def test_given_split_index(tmp_path):
    paths = save_npy(tmp_path, *whole_set())
    idx = tmp_path / "split.npz"
    np.savez(idx, query=np.arange(5), retrieval=np.arange(5, N), train=np.arange(5, 25))
    report = convert_arrays(*paths, tmp_path / "given.h5", split_index=idx, progress=False)
    ds = load_dataset(report.path)
    assert ds.query.ids.tolist() == list(range(5)) and "given" in ds.attrs["split"]
    np.savez(idx, query=np.arange(5), retrieval=np.arange(3, N), train=np.arange(5, 25))
    with pytest.raises(ValueError, match="disjoint"):
        load_split_index(str(idx))


def write_pkl(path, arrays):
    with open(path, "wb") as f:
        pickle.dump(arrays, f)


def test_pkl_release_split_as_released(tmp_path):
    rng = np.random.default_rng(0)
    parts = {}
    for split, n in (("train", 20), ("query", 8), ("retrieval", 30)):
        labels = (rng.random((n, C)) < 0.5).astype(np.float32)
        labels[:, 0] = 1
        parts[split] = {"image": rng.standard_normal((n, 512)).astype(np.float32),
                        "text": rng.standard_normal((n, 512)).astype(np.float32), "label": labels}
    # UCMFH's files may hold numpy arrays or torch tensors
    write_pkl(tmp_path / "train.pkl", {k: torch.from_numpy(v) for k, v in parts["train"].items()})
    write_pkl(tmp_path / "query.pkl", parts["query"])
    write_pkl(tmp_path / "retrieval.pkl", parts["retrieval"])
    classes = [f"c{i}" for i in range(C)]
    report = convert_pkl(tmp_path, tmp_path / "ucmfh.h5", classes=classes, name="mir")
    ds = load_dataset(report.path)
    assert report.rows == {"train": 20, "query": 8, "retrieval": 30}
    assert ds.attrs["classes"] == classes and ds.attrs["name"] == "mir" and "as released" in ds.attrs["split"]
    for split, part in ds.splits():
        np.testing.assert_array_equal(part.img.numpy(), parts[split]["image"])
        np.testing.assert_array_equal(part.txt.numpy(), parts[split]["text"])
        np.testing.assert_array_equal(part.labels.numpy(), parts[split]["label"].astype(np.uint8))


def test_pkl_bad_input(tmp_path):
    write_pkl(tmp_path / "train.pkl", {"image": np.ones((3, 4)), "text": np.ones((2, 4)), "label": np.ones((3, 2))})
    write_pkl(tmp_path / "query.pkl", {"image": np.ones((3, 4))})
    write_pkl(tmp_path / "retrieval.pkl", {"image": np.ones((3, 4)), "text": np.ones((3, 4)), "label": np.ones((3, 2))})
    with pytest.raises(DataError, match=r"train\.pkl: 'text' has 2 rows, 'image' has 3"):
        convert_pkl(tmp_path, tmp_path / "x.h5")
    write_pkl(tmp_path / "train.pkl", {"image": np.ones((3, 4)), "text": np.ones((3, 4)), "label": np.ones((3, 2))})
    with pytest.raises(DataError, match=r"query\.pkl: missing keys \['text', 'label'\]"):
        convert_pkl(tmp_path, tmp_path / "x.h5")
    write_pkl(tmp_path / "query.pkl", {"image": np.ones((2, 4)), "text": np.ones((2, 4)), "label": np.zeros((2, 2))})
    with pytest.raises(DataError, match=r"query\.pkl: empty split"):
        convert_pkl(tmp_path, tmp_path / "x.h5")
    # each key named as the file names it: a 1-D 'label' was said to be 'labels', a key the file has not (an audit's)
    write_pkl(tmp_path / "query.pkl", {"image": np.ones((2, 4)), "text": np.ones((2, 4)), "label": np.ones(2)})
    with pytest.raises(DataError, match=r"query\.pkl: 'label': expected a 2-D array, got shape \(2,\)$"):
        convert_pkl(tmp_path, tmp_path / "x.h5")
    write_pkl(tmp_path / "query.pkl", {"image": np.ones((2, 4)), "text": np.ones((2, 4)), "labels": np.ones((2, 3))})
    with pytest.raises(DataError, match=r"query\.pkl: 'labels' has 3 columns, but .*train\.pkl has 2$"):
        convert_pkl(tmp_path, tmp_path / "x.h5")
    assert not (tmp_path / "x.h5").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_sampler_seeded_and_protocol_sizes():
    sizes = STANDARD_SPLITS["mirflickr"]
    a, b = sample_split(20015, sizes, seed=1), sample_split(20015, sizes, seed=1)
    c = sample_split(20015, sizes, seed=2)
    assert all(np.array_equal(a.as_dict()[k], b.as_dict()[k]) for k in ("query", "retrieval", "train"))
    assert not np.array_equal(a.query, c.query)
    assert (len(a.query), len(a.retrieval), len(a.train)) == (2000, 18015, 5000)
    assert np.isin(a.train, a.retrieval).all() and not np.intersect1d(a.query, a.retrieval).size
    assert resolve_sizes("nuswide") == SplitSizes(2100, 10500)
    assert resolve_sizes("coco", train=2000) == SplitSizes(5000, 2000)
    with pytest.raises(ValueError, match="unknown standard split"):
        resolve_sizes("flickr30k")


def test_sampler_keeps_captions_of_one_image_together():
    ids = np.repeat(np.arange(30), 5)  # 5 captions per image
    split = sample_split(len(ids), SplitSizes(query=4, train=10), seed=0, ids=ids)
    q, r = set(ids[split.query]), set(ids[split.retrieval])
    assert len(q) == 4 and len(r) == 26 and not q & r
    assert len(split.query) == 20 and len(split.train) == 50


def test_streaming_writer_leaves_nothing_on_error(tmp_path):
    out = tmp_path / "bad.h5"
    with pytest.raises(DataError, match="bad.h5: not written: /train"):
        with open_writer(out, {"name": "x"}) as f:
            f.create_group("train")
    assert os.listdir(tmp_path) == []


def test_convert_commands(tmp_path):
    from click.testing import CliRunner

    from ucmfh.app.data_cli import convert

    image, text, labels = whole_set()
    files = []
    for key, array in (("IAll", image.astype(np.float64)), ("YAll", text), ("LAll", labels)):
        files.append(str(tmp_path / f"{key}.mat"))
        scipy.io.savemat(files[-1], {key: array})
    (tmp_path / "classes.txt").write_text("\n".join(f"k{i}" for i in range(C)))
    out = str(tmp_path / "cli.h5")
    result = CliRunner().invoke(convert, ["mat", *files, out, "--query", "10", "--train", "20", "--seed", "4",
                                          "--classes", str(tmp_path / "classes.txt")])
    assert result.exit_code == 0, result.output
    assert "query 10" in result.output
    ds = load_dataset(out)
    assert ds.attrs["classes"] == [f"k{i}" for i in range(C)] and "seed=4" in ds.attrs["split"]
    check_values(ds, image, text, labels)
    result = CliRunner().invoke(convert, ["npz", *save_npy(tmp_path, image, text, labels), out + ".new.h5"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == \
        "Error: give the split: --standard-split NAME, or both --query and --train", result.output  # by its flags


def test_a_key_given_for_an_npy_file_is_refused(tmp_path):
    """--image-key for an .npy file was ignored without a word (an .npz's unknown key is refused)."""
    from ucmfh.data.arrays import open_array

    np.save(tmp_path / "i.npy", np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(DataError, match=r"i.npy: an .npy file holds one array, not variables: the key 'nope' names "
                                        r"nothing here"):
        open_array(tmp_path / "i.npy", "nope", "image")
    assert open_array(tmp_path / "i.npy", None, "image") is not None


def test_a_signal_heard_while_writing_stops_the_conversion_between_blocks(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM raised inside h5py could land in a weakref callback, where Python prints it and goes on:
    the conversion ran to its end. A signal is heard between two blocks: nothing written, SIGTERM's code."""
    import contextlib

    from click.testing import CliRunner

    import ucmfh.data.convert as convert
    from ucmfh.app.cli import main

    @contextlib.contextmanager
    def heard():
        yield {"signal": 15}

    monkeypatch.setattr(convert, "stop_on_signals", heard)
    paths = save_npy(tmp_path, *whole_set())
    with pytest.raises(KeyboardInterrupt, match="interrupted; nothing written") as stopped:
        convert_arrays(*paths, tmp_path / "o.h5", sizes=SIZES, progress=False)
    assert stopped.value.signum == 15
    result = CliRunner().invoke(main, ["convert", "npz", *paths, str(tmp_path / "o.h5"), "--query", "10", "--train",
                                       "20", "--quiet"])
    assert result.exit_code == 143 and "interrupted; nothing written" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.npy", "labels.npy", "text.npy"]


def test_a_conversion_s_warning_is_said_as_every_other_command_says_one(tmp_path):
    """The library's log reached the terminal as 'WARNING labels.npy: dropped ...' and 'INFO ...', where every other
    line of ucmfh says 'warning: ...'. Run as a user runs it (pytest's own log handlers would hide the format)."""
    import subprocess
    import sys

    from conftest import ROOT

    image, text, labels = whole_set(3)
    labels[[4, 9]] = 0
    paths = save_npy(tmp_path, image, text, labels)
    done = subprocess.run([sys.executable, "-m", "ucmfh", "convert", "npz", *paths, str(tmp_path / "o.h5"), "--query",
                           "6", "--train", "20"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "dropped 2 of 60 rows" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "WARNING" not in done.stderr, done.stderr


def test_split_rows_numbered_from_1_are_said(tmp_path, caplog):
    """MATLAB numbers rows from 1: such a split index shifted every row by one without a word unless its last
    row reached past the end, and then with no hint of why."""
    paths = save_npy(tmp_path, *whole_set())
    idx = tmp_path / "split.npz"
    np.savez(idx, query=np.arange(1, 6), retrieval=np.arange(6, N + 1), train=np.arange(6, 26))
    with pytest.raises(DataError, match=r"retrieval: 1 rows out of range for 60 source rows \(first: 60\) \(numbered "
                                        r"from 1, as MATLAB does\? row numbers start at 0: subtract 1\)"):
        convert_arrays(*paths, tmp_path / "x.h5", split_index=idx, progress=False)
    np.savez(idx, query=np.arange(1, 6), retrieval=np.arange(6, N), train=np.arange(6, 26))  # the last row dropped
    with caplog.at_level(logging.WARNING, logger="ucmfh.data.convert"):
        convert_arrays(*paths, tmp_path / "x.h5", split_index=idx, progress=False)
    assert "no split holds source row 0, the one labelled row left out (numbered from 1" in caplog.text
    for out, query in (("y.h5", np.arange(0, 5)), ("z.h5", np.arange(1, 5))):  # row 5 out; rows 0 and 5 out
        caplog.clear()
        np.savez(idx, query=query, retrieval=np.arange(6, N), train=np.arange(6, 26))  # a release's subset: unsaid
        with caplog.at_level(logging.WARNING, logger="ucmfh.data.convert"):
            convert_arrays(*paths, tmp_path / out, split_index=idx, progress=False)
        assert "numbered from 1" not in caplog.text


@pytest.mark.parametrize("labels, said", [
    # a column of class indices: its values are not 0/1
    (lambda l: l.argmax(1)[:, None], r"got 4 at row 2, column 0 \(a column of class indices\? give it one-hot: "
                                     r"numpy\.eye\(C\)\[classes\]\)"),
    # a column of 0/1: one class, kept by about half the rows, every MAP 1 (about half the rows dropped, said no more)
    (lambda l: l[:, :1], r"one label column: one class for every labelled row would make every MAP 1 \(class "
                         r"indices\? give it one-hot"),
    (lambda l: np.where(np.arange(N)[:, None] == 7, 3 * l, l), r"got 3 at row 7, column \d \(counts\? labels > 0"),
    (lambda l: np.where(l == 0, -1, 1), r"got -1 at row 0, column \d$"),
])
def test_labels_not_a_multi_hot_matrix_are_refused_by_row_and_column(tmp_path, labels, said):
    image, text, matrix = whole_set()
    matrix[2] = np.eye(C)[4]
    paths = save_npy(tmp_path, image, text, labels(matrix))
    with pytest.raises(DataError, match=said):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    assert not (tmp_path / "x.h5").exists()


def test_a_matrix_given_twice_or_transposed_is_named(tmp_path):
    image, text, labels = whole_set()
    paths = save_npy(tmp_path, image, image.copy(), labels)  # the image matrix given as TEXT too: it was converted
    with pytest.raises(DataError, match=r"text\.npy: its first 60 rows are those of .*image\.npy: the image matrix "
                                        r"given as the text matrix too\?"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    blank = np.zeros((N, D_IMG), np.float32)  # rows of zeros in both (features missing): not called the same matrix
    with pytest.raises(DataError, match=r"blank\.h5: not written: /train/ids: .* rows hold an image that other rows "
                                        r"hold under other ids"):
        convert_arrays(*save_npy(tmp_path, blank, blank.copy(), labels), tmp_path / "blank.h5", sizes=SIZES,
                       progress=False)
    paths = save_npy(tmp_path, image, text, labels.T.copy())
    with pytest.raises(DataError, match=r"labels\.npy: 5 rows, but .*image\.npy has 60 \(.*labels\.npy stored "
                                        r"transposed, \[d, N\]\? save it as \[N, d\]\)"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    paths = save_npy(tmp_path, image.T.copy(), text, labels)
    with pytest.raises(DataError, match=r"text\.npy: 60 rows, but .*image\.npy has 12 \(.*image\.npy stored "
                                        r"transposed"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)
    labels[:] = 0
    paths = save_npy(tmp_path, image, text, labels)  # every row unlabelled: "image.npy: split asks for query 10 of 0"
    with pytest.raises(DataError, match=r"labels\.npy: no row has a label"):
        convert_arrays(*paths, tmp_path / "x.h5", sizes=SIZES, progress=False)


def test_convert_s_refusals_name_the_flags_and_the_way_forward(tmp_path):
    """Sizes the rows cannot give are said as the flags that asked (they named the image file); a split release
    stored as I_tr, I_te, ... is named as such (it pointed to --image-key, which drew a new split from one part);
    copies across the split are said as not written, with --ids as the way to keep them together."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    image, text, labels = whole_set()
    paths = save_npy(tmp_path, image, text, labels)
    out = str(tmp_path / "o.h5")
    result = CliRunner().invoke(main, ["convert", "npz", *paths, out, "--query", "10", "--train", "55"])
    assert result.exit_code == 2 and "split asks for --train 55 drawn from the 50 rows of retrieval" in result.output
    scipy.io.savemat(tmp_path / "release.mat", {f"{m}_{s}": a[:20] for s in ("tr", "te", "db")
                                                for m, a in (("I", image), ("T", text), ("L", labels))})
    mat = str(tmp_path / "release.mat")
    result = CliRunner().invoke(main, ["convert", "mat", mat, mat, mat, out, "--query", "5", "--train", "5"])
    assert result.exit_code == 2 and "a split's rows in each (I_" in result.output, result.output
    assert "use --split-index SPLIT.npz to keep the released split" in result.output
    scipy.io.savemat(tmp_path / "other.mat", {"feats": image, "idx_test": np.arange(5)})  # no split's matrices
    result = CliRunner().invoke(main, ["convert", "mat", str(tmp_path / "other.mat"), *paths[1:], out, "--query",
                                       "5", "--train", "5"])
    assert result.exit_code == 2 and "use --image-key NAME to choose one" in result.output, result.output
    result = CliRunner().invoke(main, ["convert", "npz", *paths, out, "--standard-split", "mirflickr"])
    assert result.exit_code == 2 and "split asks for query 2000 of 60 rows: retrieval would be empty (the sizes " \
        "of --standard-split mirflickr; --query, --train, --retrieval give others)" in result.output, result.output
    image[30:40], text[30:40] = image[:10], text[:10]  # ten copies: some fall in query, their originals outside it
    paths = save_npy(tmp_path, image, text, labels)
    result = CliRunner().invoke(main, ["convert", "npz", *paths, out, "--query", "20", "--train", "10"])
    assert result.exit_code == 2 and f"{out}: not written: /query: " in result.output, result.output
    assert "use --ids IDS giving copies of one item one id" in result.output and not os.path.exists(out)
    np.save(tmp_path / "ids.npy", np.where(np.arange(N) // 10 == 3, np.arange(N) - 30, np.arange(N)))
    result = CliRunner().invoke(main, ["convert", "npz", *paths, out, "--query", "20", "--train", "10",
                                       "--ids", str(tmp_path / "ids.npy"), "--quiet"])
    assert result.exit_code == 0, result.output


def test_a_torch_save_archive_under_a_pickle_s_name_is_read(tmp_path):
    """torch.save writes a zip since torch 1.6: a release's train.pkl made so was 'not a readable pickle, truncated
    or damaged'. Read by torch.load(weights_only=True), numpy's arrays allowed; a cut archive said as one."""
    from ucmfh.data.safe_pickle import load_pickle

    arrays = {"image": np.ones((3, 4), np.float32), "text": torch.zeros(3, 4), "label": np.eye(3)[:, :2]}
    torch.save(arrays, tmp_path / "train.pkl")
    got = load_pickle(tmp_path / "train.pkl")
    np.testing.assert_array_equal(got["image"], arrays["image"])
    torch.testing.assert_close(got["text"], arrays["text"])
    np.testing.assert_array_equal(got["label"], arrays["label"])
    (tmp_path / "cut.pkl").write_bytes((tmp_path / "train.pkl").read_bytes()[:300])
    with pytest.raises(DataError, match=r"cut\.pkl: a torch\.save archive, not readable \(RuntimeError: "):
        load_pickle(tmp_path / "cut.pkl")
    with open(tmp_path / "arrays.pkl", "wb") as f:  # an .npz under a pickle's name: not torch's ('RuntimeError')
        np.savez(f, image=arrays["image"])
    with pytest.raises(DataError, match=r"arrays\.pkl: a zip archive, not a pickle or a torch\.save archive \(an "
                                        r"\.npz\? 'ucmfh convert npz' reads those\)"):
        load_pickle(tmp_path / "arrays.pkl")
    torch.save({"image": np.array(["a", "b"])}, tmp_path / "words.pkl")  # torch's other wording of a refusal
    with pytest.raises(DataError, match=r"words\.pkl: a torch\.save archive: refuses to load numpy\.dtype"):
        load_pickle(tmp_path / "words.pkl")
    torch.save({"image": fractions.Fraction(1, 3)}, tmp_path / "code.pkl")  # no object of code: refused by name
    with pytest.raises(DataError, match=r"code\.pkl: a torch\.save archive: refuses to load fractions\.Fraction"):
        load_pickle(tmp_path / "code.pkl")
