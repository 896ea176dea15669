"""Bad input to the data commands: one line naming the file and the problem, exit code 2, no traceback.

Each case runs the real command (``ucmfh convert``, ``validate``,
``make-synthetic``; ``extract`` in ``test_extract.py``) through click's test
runner; one runs ``python -m ucmfh`` in a subprocess to see exactly what a
user sees on stderr.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys

import h5py
import numpy as np
import pytest
import scipy.io
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.data.format import DataError
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.search.collection import open_collection

from conftest import ROOT, dead_pid

N = 30
SPLIT = ["--query", "5", "--train", "10"]


def user_error(args, *parts: str) -> str:
    """Run ``ucmfh ARGS``; check it failed as a user error and its message holds ``parts``; return the message."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, (result.exception, result.output)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


# ------------------------------------------------------------------ validate, make-synthetic


@pytest.fixture
def small_file(tmp_path) -> str:
    return make_synthetic(tmp_path / "d.h5", SyntheticSpec(n_query=5, n_retrieval=20, n_train=10, n_classes=3,
                                                           d_img=4, d_txt=3, d_latent=4))


def test_validate_object_of_the_wrong_kind(small_file):
    path = small_file
    with h5py.File(path, "a") as f:
        del f["query"]
        f.create_dataset("query", data=np.zeros(3))
    user_error(["validate", path], f"{path}: /query: expected a group, found a dataset")
    with h5py.File(path, "a") as f:
        del f["query"]
        f.copy(f["train"], "query")
        del f["train"]["image"]
        f["train"].create_group("image")
    user_error(["validate", path], f"{path}: /train/image: expected a dataset, found a group")


def test_validate_says_which_query_images_are_training_images(small_file):
    """A query row whose picture is a training row's, under another id and text (Wikipedia holds three), is valid
    (the field's splits hold such rows) but its image→text query ranks by an image trained on: validate said
    nothing of it."""
    plain = CliRunner().invoke(main, ["validate", small_file])
    assert plain.exit_code == 0 and "the image features of a /train row" not in plain.output, plain.output
    with h5py.File(small_file, "a") as f:
        f["query/image"][2] = f["train/image"][4]
    said = CliRunner().invoke(main, ["validate", small_file])
    assert said.exit_code == 0, said.output
    assert (f"warning: {small_file}: 1 of the 5 query rows have the image features of a /train row (the same "
            "picture under another id and text): their image→text queries rank by an image trained on") in said.output


def test_features_whose_normalisation_overflows_are_refused(small_file):
    """Features of magnitude 1e20 are finite in float32, but their squared norm is not: every method normalised
    them to zeros and gave every item one code (cca-itq, fitted in float64, at inference)."""
    with h5py.File(small_file, "a") as f:
        image = f["train/image"][()]
        image[3] *= 1e20
        f["train/image"][:] = image
    user_error(["validate", small_file], f"{small_file}: /train/image: 1 rows of L2 norm beyond 1e+18 (first: row 3, "
                                         "norm", "whose normalisation in float32 overflows")


def test_labels_under_which_no_ranking_is_scored(small_file):
    """Labels that make every query relevant to every retrieval item (one class for all) scored every method and
    the random codes 1.0000, and labels no retrieval item shares scored them 0, as results, without a word. Such
    a file is valid (a small collection of a few overlapping classes is one: two of three classes an item), and
    validate, training (grid's too) and scoring say how many query items are such."""
    with h5py.File(small_file, "a") as f:
        query, retrieval = f["query/labels"][()], f["retrieval/labels"][()]
        f["query/labels"][0] = 0
        f["query/labels"][0, 2] = 1
        f["retrieval/labels"][:, 2] = 0
        f["retrieval/labels"][:, 0] = 1  # column 2 nowhere in retrieval: query row 0 has nothing relevant
    said = CliRunner().invoke(main, ["validate", small_file])
    assert said.exit_code == 0, said.output
    assert (f"warning: {small_file}: 1 of the 5 query items share a label with no retrieval item: each scores 0 in "
            "every MAP, whatever the codes") in said.output
    with h5py.File(small_file, "a") as f:
        f["query/labels"][:] = np.eye(3, dtype=np.uint8)[2]
    said = CliRunner().invoke(main, ["validate", small_file])
    assert said.exit_code == 0 and (f"warning: {small_file}: every query item shares a label with no retrieval item: "
                                    "every MAP is 0, whatever the codes") in said.output, said.output
    with h5py.File(small_file, "a") as f:
        f["query/labels"][:], f["retrieval/labels"][:] = query, retrieval
        f["retrieval/labels"][:] = 1
    for args in (["validate"], ["train-hash", "-b", "8", "--epochs", "1", "--set", "hash.hidden=0", "--results", "",
                                "--device", "cpu", "--quiet", "--out", os.path.dirname(small_file), "-d"],
                 ["grid", "--epochs", "1", "--seeds", "1", "--device", "cpu", "-b", "8",
                  "--results", os.path.join(os.path.dirname(small_file), "g.jsonl"),
                  "--table", os.path.join(os.path.dirname(small_file), "g"),
                  "--out", os.path.dirname(small_file), "-d"]):
        said = CliRunner().invoke(main, [*args, small_file])
        assert said.exit_code == 0 and (f"warning: {small_file}: every query item shares a label with every "
                                        "retrieval item: every MAP is 1, whatever the codes (one class for all?)"
                                        ) in said.output, said.output


def test_a_split_that_is_a_dataset_in_a_collection_file(tmp_path):
    """Without /train the file is read as a search collection (validate, index): its /query a dataset is one
    line too, where it was an AttributeError's traceback."""
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("query", data=np.zeros(3))
    with pytest.raises(DataError, match=r"c\.h5: /query: expected a group, found a dataset"):
        open_collection(path)
    user_error(["validate", path], f"{path}: /train: missing group")


def test_validate_float_ids(small_file):
    path = small_file
    with h5py.File(path, "a") as f:
        ids = f["retrieval"]["ids"][()]
        del f["retrieval"]["ids"]
        f["retrieval"].create_dataset("ids", data=ids / 10.0)  # 0.0, 0.1, ..., 0.9 would all load as id 0
    user_error(["validate", path], f"{path}: /retrieval/ids: ids must be integers, got float64")


@pytest.mark.parametrize("args, message", [
    (["--n-classes", "0"], "Error: --n-classes must be at least 1, got 0"),  # the flag, not the spec's field
    (["--d-img", "-3"], "Error: --d-img must be at least 1, got -3"),
    (["--n-retrieval", "10", "--n-train", "20"], "Error: --n-train (20) must be at most --n-retrieval (10)"),
    (["--seed", "-1"], "Error: Invalid value for '--seed': -1 is not in the range 0<=x<4294967296"),
    # HDF5's own refusal, after the data were made: 'object header message is too large'
    (["--n-classes", "4001"], "Error: --n-classes must be at most 4000 (the classes' names are one HDF5 attribute), "
                              "got 4001"),
])
def test_make_synthetic_bad_sizes(tmp_path, args, message):
    user_error(["make-synthetic", tmp_path / "s.h5", *args], message)
    assert not (tmp_path / "s.h5").exists()


def test_synthetic_spec_checks_itself():
    with pytest.raises(ValueError, match="noise must be >= 0, got -0.5"):
        SyntheticSpec(noise=-0.5)
    with pytest.raises(ValueError, match="item_scale must be a finite number, got nan"):
        SyntheticSpec(item_scale=float("nan"))
    with pytest.raises(ValueError, match="n_query must be an integer, got 2.5"):
        SyntheticSpec(n_query=2.5)


@pytest.fixture
def arrays(tmp_path):
    """Whole-set image, text and label matrices as .npy files; returns their paths."""
    rng = np.random.default_rng(0)
    labels = np.zeros((N, 3), np.uint8)
    labels[np.arange(N), np.arange(N) % 3] = 1
    paths = []
    for name, array in (("image", rng.standard_normal((N, 6)).astype(np.float32)),
                        ("text", rng.standard_normal((N, 4)).astype(np.float32)), ("labels", labels)):
        paths.append(tmp_path / f"{name}.npy")
        np.save(paths[-1], array)
    return paths


def convert_npz(image, text, labels, out, *extra):
    return ["convert", "npz", image, text, labels, out, *SPLIT, *extra]


def test_class_names_of_another_count_are_said_as_the_classes_file(tmp_path, arrays):
    (tmp_path / "c.txt").write_text("a\nb\n")
    user_error(convert_npz(*arrays, tmp_path / "o.h5", "--classes", tmp_path / "c.txt"),
               "Error: --classes: 2 class names given for the 3 label columns of the input")
    assert not (tmp_path / "o.h5").exists()


# ------------------------------------------------------------------ broken .npy / .npz / .mat


def test_empty_npy(tmp_path, arrays):
    (tmp_path / "empty.npy").write_bytes(b"")
    user_error(convert_npz(tmp_path / "empty.npy", *arrays[1:], tmp_path / "o.h5"), "empty.npy: empty file (0 bytes)")


def test_broken_npy(tmp_path, arrays):
    data = arrays[0].read_bytes()
    cases = {
        "header.npy": (data[:40], "header.npy: truncated or damaged .npy header"),
        "data.npy": (data[:300], "data.npy: truncated: the header describes shape (30, 6) float32 (720 bytes of data)"),
        "long.npy": (data + b"\0" * 8, "long.npy: longer than its header says"),
        "text.npy": (b"0.5 0.25\n" * 4, "text.npy: not an .npy array (no NumPy header)"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        user_error(convert_npz(tmp_path / name, *arrays[1:], tmp_path / "o.h5"), message)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}] * N, dtype=object), allow_pickle=True)
    user_error(convert_npz(tmp_path / "objects.npy", *arrays[1:], tmp_path / "o.h5"),
               "objects.npy: holds pickled Python objects, not a numeric array")
    np.savez(tmp_path / "zipped.npz", image=np.ones((N, 6)))
    os.rename(tmp_path / "zipped.npz", tmp_path / "zipped.npy")
    user_error(convert_npz(tmp_path / "zipped.npy", *arrays[1:], tmp_path / "o.h5"),
               "zipped.npy: an .npz archive, not an .npy array")
    assert not (tmp_path / "o.h5").exists()


def test_truncated_and_damaged_npz(tmp_path, arrays):
    np.savez(tmp_path / "all.npz", image=np.load(arrays[0]), text=np.load(arrays[1]), labels=np.load(arrays[2]))
    data = (tmp_path / "all.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    cut = tmp_path / "cut.npz"
    user_error(convert_npz(cut, cut, cut, tmp_path / "o.h5"), "cut.npz: not a readable .npz archive, truncated or damaged")
    damaged = bytearray(data)
    damaged[data.find(b"NUMPY") + 200] ^= 0xFF  # inside the image member's data: its checksum fails
    (tmp_path / "crc.npz").write_bytes(bytes(damaged))
    crc = tmp_path / "crc.npz"
    user_error(convert_npz(crc, crc, crc, tmp_path / "o.h5"), "crc.npz:image: unreadable archive member")
    user_error(["convert", "npz", *arrays, tmp_path / "o.h5", "--split-index", arrays[0]],
               "image.npy: an .npy array, not an .npz archive")


def save_mat73(path, name, array, matlab_class="double"):
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset(name, data=np.ascontiguousarray(array.T))
        f[name].attrs["MATLAB_class"] = np.bytes_(matlab_class)
    with open(path, "r+b") as f:  # MATLAB's header: text, subsystem offset, version 0x0200, endian mark
        f.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, HDF5 schema 1.00 .".ljust(116) + bytes(8) + b"\x00\x02IM")


def test_truncated_mat_v73(tmp_path, arrays):
    save_mat73(tmp_path / "iall.mat", "IAll", np.load(arrays[0]).astype(np.float64))
    data = (tmp_path / "iall.mat").read_bytes()
    (tmp_path / "cut.mat").write_bytes(data[: len(data) // 2])
    user_error(["convert", "mat", tmp_path / "cut.mat", *arrays[1:], tmp_path / "o.h5", *SPLIT],
               "cut.mat: a MATLAB v7.3 (HDF5) file that cannot be read, truncated or damaged")
    (tmp_path / "head.mat").write_bytes(data[:300])  # MATLAB's header survives, the HDF5 superblock does not
    user_error(["convert", "mat", tmp_path / "head.mat", *arrays[1:], tmp_path / "o.h5", *SPLIT],
               "head.mat: a MATLAB v7.3 file that is not readable as HDF5")
    names = np.array([[ord(c) for c in f"im{i:04d}.jpg"] for i in range(N)], dtype=np.uint16)
    save_mat73(tmp_path / "fall.mat", "FAll", names, "char")  # file names: numbers in storage, text in MATLAB
    user_error(["convert", "mat", tmp_path / "fall.mat", *arrays[1:], tmp_path / "o.h5", *SPLIT],
               "fall.mat:FAll: a MATLAB char array (text), not a numeric matrix")


@pytest.mark.parametrize("compress", [False, True])
def test_truncated_mat_v5(tmp_path, arrays, compress):
    scipy.io.savemat(tmp_path / "iall.mat", {"IAll": np.load(arrays[0]).astype(np.float64)}, do_compression=compress)
    data = (tmp_path / "iall.mat").read_bytes()
    for cut in (0, 60, 130, 200, len(data) // 2, len(data) - 1):  # in the header, the tag, the data
        (tmp_path / "cut.mat").write_bytes(data[:cut])
        user_error(["convert", "mat", tmp_path / "cut.mat", *arrays[1:], tmp_path / "o.h5", *SPLIT],
                   "cut.mat", "truncated or damaged")


# ------------------------------------------------------------------ other inputs of convert


def test_bad_values_and_shapes_name_the_file(tmp_path, arrays):
    image = np.load(arrays[0])
    image[7, 2] = np.nan
    np.save(tmp_path / "nan.npy", image)
    user_error(convert_npz(tmp_path / "nan.npy", *arrays[1:], tmp_path / "o.h5"),
               "nan.npy: 1 non-finite values in rows 0..29 (first: NaN at row 7, column 2)")
    text = np.load(arrays[1]).astype(np.float64)
    text[4, 1] = 1e300  # finite as given: said as beyond float32's range, not as an inf the user never had
    np.save(tmp_path / "big.npy", text)
    user_error(convert_npz(arrays[0], tmp_path / "big.npy", arrays[2], tmp_path / "o.h5"),
               "big.npy (read as float32: float64 values beyond its range become inf): 1 non-finite values in rows "
               "0..29 (first: inf at row 4, column 1)")
    np.save(tmp_path / "classes.npy", np.load(arrays[2]).argmax(axis=1))  # class numbers, not multi-hot rows
    user_error(convert_npz(*arrays[:2], tmp_path / "classes.npy", tmp_path / "o.h5"),
               "classes.npy: expected a 2-D [N, d] labels matrix, got shape (30,) (one class an item? give it "
               "one-hot: numpy.eye(C)[classes])")
    labels = np.load(arrays[2])
    labels[[3, 8]] = 0
    np.save(tmp_path / "some_empty.npy", labels)
    user_error(convert_npz(*arrays[:2], tmp_path / "some_empty.npy", tmp_path / "o.h5", "--empty-labels", "fail"),
               "some_empty.npy: 2 rows have no label (first: row 3); use --empty-labels drop to leave them out")
    user_error(convert_npz(*arrays, tmp_path / "o.h5", "--seed", "-1"), "Invalid value for '--seed': -1 is not in the range 0<=x<4294967296")
    user_error(["convert", "npz", *arrays, tmp_path / "o.h5", "--query", "0", "--train", "5"],  # was 'query=0'
               "Invalid value for --query: a split's size must be positive, got 0")
    np.savez(tmp_path / "two.npz", a=np.load(arrays[0]), b=np.load(arrays[0]))
    user_error(convert_npz(tmp_path / "two.npz", *arrays[1:], tmp_path / "o.h5"),
               "two.npz: 2 variables ['a', 'b'], none with a usual image name; use --image-key NAME to choose one")


def test_bad_split_index(tmp_path, arrays):
    out = tmp_path / "o.h5"
    np.savez(tmp_path / "float.npz", query=np.arange(5) + 0.5, retrieval=np.arange(5, N), train=np.arange(5, 15))
    user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "float.npz"],
               "float.npz: query: row numbers must be integers, got float64")
    np.savez(tmp_path / "huge.npz", query=np.array([0, 2**63 + 1], np.uint64), retrieval=np.arange(5, N),
             train=np.arange(5, 15))  # a row wrapped to -9223372036854775807, said as out of range (an audit's)
    user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "huge.npz"],
               "huge.npz: query: row 9223372036854775809 is beyond any source")
    np.savez(tmp_path / "twice.npz", query=[0, 1, 1], retrieval=np.arange(5, N), train=np.arange(5, 15))
    user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "twice.npz"],
               "twice.npz: query: row 1 listed more than once")
    np.savez(tmp_path / "range.npz", query=[-2, 0, 1], retrieval=np.arange(5, N + 3), train=np.arange(5, 15))
    said = user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "range.npz"],
                      "range.npz: query: 1 rows out of range for 30 source rows (first: -2)")
    assert said == f"Error: {tmp_path / 'range.npz'}: query: 1 rows out of range for 30 source rows (first: -2)"
    # the sizes or the seed of a drawn split beside a given one: ignored, silently (--query 0 was)
    np.savez(tmp_path / "given.npz", query=np.arange(5), retrieval=np.arange(5, N), train=np.arange(5, 15))
    for extra in (["--query", "0"], ["--seed", "5"]):
        user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "given.npz", *extra],
                   f"--split-index gives the split; drop {extra[0]} (of a drawn split)")
    # a query item in the training split: every score inflated, silently
    np.savez(tmp_path / "trained.npz", query=np.arange(5), retrieval=np.arange(5, N), train=np.arange(0, 15))
    user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "trained.npz"],
               "trained.npz: query and train share rows; they must be disjoint")
    (tmp_path / "split.txt").write_text("query: 1 2 3\n")
    user_error(["convert", "npz", *arrays, out, "--split-index", tmp_path / "split.txt"],  # not numpy's pickle advice
               f"{tmp_path / 'split.txt'}: not an .npz archive (a zip file of .npy arrays, as numpy.savez writes)")
    assert not out.exists()


def test_rows_without_a_label_are_dropped_from_a_given_split_too(tmp_path, arrays):
    """--empty-labels drop (the default) left such rows out of a drawn split, but refused them in a given one, with
    'use --empty-labels drop' as its remedy: the drop was made. They leave each given split; a split of nothing but
    such rows is refused."""
    from ucmfh.data.h5 import load_dataset

    labels = np.load(arrays[2])
    labels[[3, 8, 20]] = 0
    np.save(tmp_path / "some_empty.npy", labels)
    np.savez(tmp_path / "given.npz", query=np.arange(5), retrieval=np.arange(5, N), train=np.arange(5, 15))
    out = tmp_path / "o.h5"
    result = CliRunner().invoke(main, [str(a) for a in ["convert", "npz", *arrays[:2], tmp_path / "some_empty.npy",
                                                        out, "--split-index", tmp_path / "given.npz", "--quiet"]])
    assert result.exit_code == 0, result.output
    data = load_dataset(out)
    assert (len(data.query), len(data.train), len(data.retrieval)) == (4, 9, 23)
    assert data.query.ids.tolist() == [0, 1, 2, 4] and 8 not in data.train.ids and 20 not in data.retrieval.ids
    assert data.attrs["split"].endswith("; rows without a label left out: train 1, query 1, retrieval 2")
    np.savez(tmp_path / "only.npz", query=[3, 8], retrieval=np.arange(9, N), train=np.arange(9, 15))
    user_error(["convert", "npz", *arrays[:2], tmp_path / "some_empty.npy", tmp_path / "o2.h5", "--split-index",
                tmp_path / "only.npz"], "only.npz: query: empty split (no row of it has a label)")


def test_text_files_in_another_encoding(tmp_path, arrays):
    (tmp_path / "classes.txt").write_bytes("sky\nmer\nfor\u00eat\n".encode("latin-1"))
    user_error(convert_npz(*arrays, tmp_path / "o.h5", "--classes", tmp_path / "classes.txt"),
               "classes.txt: line 3: not UTF-8 text (byte 0xea)")


def test_output_that_cannot_be_written(tmp_path, arrays):
    (tmp_path / "file").write_text("in the way")
    message = user_error(convert_npz(*arrays, tmp_path / "file" / "sub" / "o.h5"),
                         "o.h5: cannot create the folder", "file/sub")
    assert "--overwrite" not in message  # nothing there to overwrite
    assert CliRunner().invoke(main, [str(a) for a in convert_npz(*arrays, tmp_path / "o.h5")]).exit_code == 0
    user_error(convert_npz(*arrays, tmp_path / "o.h5"), "OUT",
               "o.h5: exists; not replaced (pass --overwrite to replace it)")


def write_pkl(path, n, d_img=8, d_txt=4, c=3):
    rng = np.random.default_rng(n)
    labels = np.zeros((n, c), np.float32)
    labels[:, 0] = 1
    with open(path, "wb") as f:
        pickle.dump({"image": rng.standard_normal((n, d_img)), "text": rng.standard_normal((n, d_txt)),
                     "label": labels}, f)


def test_bad_pkl_release(tmp_path):
    folder = tmp_path / "release"
    folder.mkdir()
    for split, n in (("train", 10), ("query", 4), ("retrieval", 12)):
        write_pkl(folder / f"{split}.pkl", n)
    write_pkl(folder / "query.pkl", 4, d_txt=5)
    user_error(["convert", "pkl", folder, tmp_path / "o.h5"], "query.pkl: 'text' has 5 columns, but",
               "train.pkl has 4")
    data = (folder / "retrieval.pkl").read_bytes()
    write_pkl(folder / "query.pkl", 4)
    (folder / "retrieval.pkl").write_bytes(data[: len(data) // 2])
    user_error(["convert", "pkl", folder, tmp_path / "o.h5"], "retrieval.pkl: not a readable pickle, truncated or damaged")
    assert not (tmp_path / "o.h5").exists()


def test_one_line_on_stderr_in_a_real_process(tmp_path, arrays):
    (tmp_path / "empty.npy").write_bytes(b"")
    args = [str(a) for a in convert_npz(tmp_path / "empty.npy", *arrays[1:], tmp_path / "o.h5")]
    proc = subprocess.run([sys.executable, "-m", "ucmfh", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"Error: {tmp_path / 'empty.npy'}: empty file (0 bytes)"]


# ------------------------------------------------------------------ stale temporary files


def test_stale_temp_of_a_dead_writer_is_removed_a_live_ones_kept(tmp_path, arrays):
    out = tmp_path / "o.h5"
    stale = tmp_path / f".o.h5.tmp{dead_pid()}"
    stale.write_bytes(b"half an HDF5 file")
    live_writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".o.h5.tmp{live_writer.pid}"
        live.write_bytes(b"being written")
        result = CliRunner().invoke(main, [str(a) for a in convert_npz(*arrays, out)])
        assert result.exit_code == 0, result.output
        assert out.exists() and not stale.exists() and live.exists()
    finally:
        live_writer.kill()
        live_writer.wait()


@pytest.mark.parametrize("flag, given, says", [
    ("--device", "nonsense", "Invalid value for '--device': device 'nonsense': unknown; use auto, cpu, cuda or cuda:N"),
    ("--shard", "3/2", "Invalid value for '--shard': shard '3/2': needs 0 <= I < N"),
    ("--shard", "x", "Invalid value for '--shard': shard 'x': expected I/N, e.g. 0/4"),
])
def test_extract_names_the_flag_of_a_device_or_shard_it_refuses(tmp_path, flag, given, says):
    """'Error: device 'nonsense': unknown' and 'Error: shard '3/2': ...' named no flag, as every other refusal does."""
    for name in ("c.tsv", "l.tsv"):
        (tmp_path / name).write_text("")
    (tmp_path / "imgs").mkdir()
    user_error(["extract", tmp_path / "imgs", tmp_path / "c.tsv", tmp_path / "l.tsv", tmp_path / "o.h5", flag, given],
               says)
    assert not (tmp_path / "o.h5").exists() and not (tmp_path / "o.h5.parts").exists()
