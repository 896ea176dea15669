"""The HDF5 contract: round trips and clear errors for every kind of bad file."""
from __future__ import annotations

import os
import warnings

import h5py
import numpy as np
import pytest

from ucmfh.data.h5 import DataError, load_dataset, validate_file
from ucmfh.data.writer import write_dataset
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic, make_synthetic_arrays

from conftest import TINY


def arrays(n=(10, 4, 12), d_img=6, d_txt=3, c=4, seed=0):
    rng = np.random.default_rng(seed)
    out, start = {}, 0
    for split, rows in zip(("train", "query", "retrieval"), n):
        labels = rng.integers(0, 2, size=(rows, c)).astype(np.uint8)
        labels[np.arange(rows), rng.integers(0, c, rows)] = 1
        out[split] = {
            "image": rng.normal(size=(rows, d_img)).astype(np.float32),
            "text": rng.normal(size=(rows, d_txt)).astype(np.float32),
            "labels": labels,
            "ids": np.arange(start, start + rows),
        }
        start += rows
    return out


def test_round_trip_keeps_every_value(tmp_path):
    src = arrays()
    path = write_dataset(tmp_path / "d.h5", src, {"name": "toy", "classes": ["a", "b", "c", "d"]})
    data = load_dataset(path)
    assert data.name == "toy" and data.attrs["classes"] == ["a", "b", "c", "d"]
    assert (data.d_img, data.d_txt, data.n_classes) == (6, 3, 4)
    for split, got in data.splits():
        np.testing.assert_array_equal(got.img.numpy(), src[split]["image"])
        np.testing.assert_array_equal(got.txt.numpy(), src[split]["text"])
        np.testing.assert_array_equal(got.labels.numpy(), src[split]["labels"])
        np.testing.assert_array_equal(got.ids.numpy(), src[split]["ids"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_load_reads_each_feature_dataset_once(tmp_path, monkeypatch, dtype):
    """Validation's reads are the load's: the features held in memory come from them (as float32, as a load
    without validation reads them), not from a second read of the file."""
    src = arrays()
    for split in src.values():
        split["image"], split["text"] = split["image"].astype(dtype), split["text"].astype(dtype)
    path = write_dataset(tmp_path / "d.h5", src, {"name": "toy"})
    unvalidated = load_dataset(path, validate=False)
    reads, getitem = [], h5py.Dataset.__getitem__

    def counted(dataset, key):
        reads.append(dataset.name)
        return getitem(dataset, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", counted)
    data = load_dataset(path)
    assert sorted(name for name in reads if name.endswith(("/image", "/text"))) == sorted(
        f"/{split}/{name}" for split in src for name in ("image", "text"))
    for (_, got), (_, want) in zip(data.splits(), unvalidated.splits()):
        assert got.img.dtype == got.txt.dtype == want.img.dtype == want.txt.dtype
        np.testing.assert_array_equal(got.img.numpy(), want.img.numpy())
        np.testing.assert_array_equal(got.txt.numpy(), want.txt.numpy())


def test_write_refuses_to_overwrite_and_leaves_no_temp_file(tmp_path):
    path = write_dataset(tmp_path / "d.h5", arrays())
    with pytest.raises(FileExistsError):
        write_dataset(path, arrays(seed=1))
    bad = arrays()
    bad["query"]["image"][0, 0] = np.nan
    with pytest.raises(DataError, match="NaN"):
        write_dataset(tmp_path / "bad.h5", bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5"]


def _negative_zero_copy(f):
    for split in ("train", "query", "retrieval"):
        for name in ("image", "text"):
            values = f[split][name][()]
            values[:, 0] = 0.0
            f[split][name][...] = values
    for name in ("image", "text"):
        row = f["train"][name][5]
        row[0] = -0.0
        f["query"][name][2] = row


def _replace(f, name, data):
    del f[name]
    f.create_dataset(name, data=data)


def _break(tmp_path, edit):
    path = write_dataset(tmp_path / "d.h5", arrays())
    with h5py.File(path, "a") as f:
        edit(f)
    return str(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: f.__delitem__("query"), r"/query: missing group"),
        (lambda f: f["train"].__delitem__("text"), r"/train/text: missing dataset"),
        (lambda f: (f["retrieval"].__delitem__("labels"),
                    f["retrieval"].create_dataset("labels", data=np.ones((11, 4), np.uint8))),
         r"/retrieval/labels: 11 rows, but /retrieval/image has 12"),
        (lambda f: (f["query"].__delitem__("image"),
                    f["query"].create_dataset("image", data=np.ones((4, 7), np.float32))),
         r"/query/image: 7 columns, but /train/image has 6"),
        (lambda f: f["train"]["image"].__setitem__((3, 2), np.inf), r"/train/image: 1 non-finite .*inf at row 3, column 2"),
        (lambda f: f["query"]["labels"].__setitem__(2, np.zeros(4, np.uint8)), r"/query/labels: 1 rows have no label"),
        (lambda f: f["retrieval"]["ids"].__setitem__(0, 10), r"/query/ids: 1 ids also appear in /retrieval/ids"),
        # a query item trained on
        (lambda f: f["train"]["ids"].__setitem__(0, 10), r"/query/ids: 1 ids also appear in /train/ids .*query and "
                                                        r"train must be disjoint"),
        # ... under another id: the same image and text features (a query split copied from the training one)
        (lambda f: (f["query"]["image"].__setitem__(2, f["train"]["image"][5]),
                    f["query"]["text"].__setitem__(2, f["train"]["text"][5])),
         r"/query: 1 items have the image and text features of /train items \(first: query row 2, id 12\); query "
         r"and train must be disjoint"),
        # ... with its zeros written as -0.0: equal values, other bits (the print read the bits)
        (_negative_zero_copy, r"/query: 1 items have the image and text features of /train items \(first: query row "
                              r"2, id 12\)"),
        # float64 beyond float32's range: read as inf
        (lambda f: (_replace(f, "query/image", f["query"]["image"][()].astype(np.float64)),
                    f["query"]["image"].__setitem__((1, 2), 1e300)),
         r"/query/image \(read as float32: float64 values beyond its range become inf\): 1 non-finite .*inf at row 1, "
         r"column 2"),
        (lambda f: f["query"]["labels"].__setitem__(0, np.full(4, 2, np.uint8)), r"multi-hot 0/1"),
        (lambda f: f.attrs.__setitem__("classes", ["a", "b"]), r"2 names for 4 label columns"),
        (lambda f: f.attrs.__setitem__("classes", "abcd"), r"attribute 'classes': a single str for 4 label columns"),
        # an object of the wrong kind: a dataset where a group belongs, and the reverse
        (lambda f: (f.__delitem__("query"), f.create_dataset("query", data=np.zeros(3))),
         r"/query: expected a group, found a dataset"),
        (lambda f: (f["train"].__delitem__("image"), f["train"].create_group("image")),
         r"/train/image: expected a dataset, found a group"),
        # a link to nothing was 'missing dataset (the group has: [..., 'image', ...])'
        (lambda f: (f["query"].__delitem__("image"), f["query"].__setitem__("image", h5py.SoftLink("/nowhere"))),
         r"/query/image: a link to /nowhere, which is not there"),
        (lambda f: (f["query"].__delitem__("text"), f["query"].__setitem__("text", h5py.ExternalLink("gone.h5", "/x"))),
         r"/query/text: a link to /x in gone.h5, which is not there"),
        (lambda f: (f["train"].__delitem__("ids"), f["train"].create_group("ids")),
         r"/train/ids: expected a dataset, found a group"),
        (lambda f: f["query"].create_dataset("text_bow", data=np.ones((3, 5), np.uint8)),
         r"/query/text_bow: expected shape \(4, V\), got \(3, 5\)"),
        # ids: integers (a float id is truncated on loading), one per row, >= 0
        (lambda f: _replace(f, "retrieval/ids", np.arange(12) + 0.5), r"/retrieval/ids: ids must be integers, got float64"),
        (lambda f: _replace(f, "retrieval/ids", np.arange(12).reshape(12, 1)), r"/retrieval/ids: expected shape \(12,\), got \(12, 1\)"),
        (lambda f: _replace(f, "query/ids", np.array([-1, 11, 12, 13])), r"/query/ids: 1 negative ids \(first: -1 at row 0\)"),
        # rows sharing an id are one image: ids numbered as if 2 captions an image where each row is its own image
        (lambda f: _replace(f, "query/ids", np.array([10, 10, 11, 11])),
         r"/query/image: rows 0 and 1 share id 10 but hold different image features \(2 such rows\); rows sharing an "
         r"id are one image"),
        # ... and the converse: an id a row where rows are the captions of images (each caption its own image)
        (lambda f: [f["query"]["image"].__setitem__(row, f["query"]["image"][row - 1]) for row in (1, 3)],
         r"/query/ids: 4 of 4 rows hold an image that other rows hold under other ids \(first: rows 0 and 1, ids 10 "
         r"and 11\); the rows of one image share its id"),
        # an id names one image in every split: a train split's rows under retrieval's ids, other images
        (lambda f: _replace(f, "train/ids", f["retrieval"]["ids"][:10]),
         r"/train/ids: id 14 is another image than /retrieval's \(train row 0, retrieval row 0; 10 such ids\); an id "
         r"names one image in every split$"),
        # ids in some splits alone: read by one command and not the next
        (lambda f: f["train"].__delitem__("ids"), r"/train/ids: missing dataset, but /query/ids exists: either every "
                                                  r"split has ids or none"),
    ],
)
def test_validation_names_file_dataset_and_problem(tmp_path, edit, message):
    path = _break(tmp_path, edit)
    with pytest.raises(DataError, match=message) as info:
        load_dataset(path)
    assert str(info.value).startswith(path)


def _with(name, values):
    """An edit adding dataset ``name`` to every split, its rows from ``values(split, rows)``."""
    return lambda f: [f[split].create_dataset(name, data=values(split, len(f[split]["image"]))) for split in f]


@pytest.mark.parametrize("edit, message", [
    # §9's UTF-8 strings: 'validate' passed bytes that 'ucmfh index' then refused
    (_with("text_raw", lambda split, n: np.array([b"a caption"] * (n - 1) + [b"\xff caption"], dtype="S12")),
     r"/train/text_raw: row 9: not UTF-8 text \(invalid start byte, byte 0\)$"),
    (_with("paths", lambda split, n: np.array([b"\xed\xa0\x80.jpg"] * n, dtype="S8")),
     r"/train/paths: row 0: not UTF-8 text"),
    # §1's uint8 bag of words: counts of 0.5 and vocabularies of two sizes were valid
    (_with("text_bow", lambda split, n: np.full((n, 5), 0.5, np.float32)),
     r"/train/text_bow: bag-of-words counts must be whole numbers from 0 to 255 \(uint8\)$"),
    (_with("text_bow", lambda split, n: np.ones((n, 6 if split == "query" else 5), np.uint8)),
     r"/query/text_bow: 6 words, but /\w+/text_bow has 5$"),
    (_with("text_bow", lambda split, n: np.array([["one"] * 5] * n, dtype="S3")),
     r"/train/text_bow: expected word counts, got \|S3$"),
])
def test_validation_reads_every_string_and_word_count(tmp_path, edit, message):
    """What a dataset's pooled features are loaded without (its strings, its word counts) is read whole by
    'validate' (and by the writer's check of what it wrote), each file said in one line."""
    path = _break(tmp_path, edit)
    with pytest.raises(DataError, match=message) as info:
        validate_file(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    if "words, but" not in message and "expected word counts" not in message:  # the layout holds: it loads
        assert len(load_dataset(path).train) == 10


def test_a_disk_without_room_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A full disk crashed the process (HDF5's close, a segmentation fault) and left the temporary file; the
    room the data take is checked first: one line naming the file, nothing written, the CLI's exit 2."""
    import shutil
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    full = shutil.disk_usage(tmp_path)._replace(free=100_000)
    monkeypatch.setattr("ucmfh.files.shutil.disk_usage", lambda path: full)
    with pytest.raises(OSError, match=r"d.h5: needs about 1\.0 MiB, and its disk has 0\.1 MiB free"):
        write_dataset(tmp_path / "d.h5", arrays())
    result = CliRunner().invoke(main, ["make-synthetic", str(tmp_path / "s.h5")])
    assert result.exit_code == 2 and result.output == \
        f"Error: {tmp_path / 's.h5'}: needs about 101.4 MiB, and its disk has 0.1 MiB free\n"
    # a codes file too: HDF5 met the full disk closing it, and the process crashed (encode, an audit's tmpfs)
    from ucmfh.codes import save_codes
    codes = np.where(np.random.default_rng(0).random((40_000, 64)) > 0.5, 1.0, -1.0).astype(np.float32)
    labels = np.eye(4, dtype=np.uint8)[np.arange(40_000) % 4]
    with pytest.raises(OSError, match=r"c\.h5: needs about 2\.\d MiB, and its disk has 0\.1 MiB free"):
        save_codes(tmp_path / "c.h5", query_img=codes, query_txt=codes, retrieval_img=codes, retrieval_txt=codes,
                   query_labels=labels, retrieval_labels=labels)
    assert list(tmp_path.iterdir()) == []


def test_sparse_items_equal_in_the_sampled_columns_alone_are_no_leak(tmp_path):
    """Bags of words for both modalities: every item zero in the few columns a fingerprint samples, so every
    query item's print was a retrieval item's, and a file of distinct items was refused as a query split copied
    from retrieval. The whole rows decide; a real copy among them is still refused."""
    rng = np.random.default_rng(0)
    n, d = 60, 1000
    sampled = set(np.unique(np.linspace(0, d - 1, 32).astype(int)))
    free = np.array([c for c in range(d) if c not in sampled])
    image, text = np.zeros((n, d), np.float32), np.zeros((n, d), np.float32)
    for i in range(n):
        image[i, rng.choice(free, 5, replace=False)] = 1
        text[i, rng.choice(free, 5, replace=False)] = 1
    labels = np.eye(3, dtype=np.uint8)[np.arange(n) % 3]

    def splits(query_rows):
        take = lambda rows: {"image": image[rows], "text": text[rows], "labels": labels[rows]}
        return {"query": take(query_rows), "retrieval": take(np.arange(10, n)), "train": take(np.arange(10, n))}

    write_dataset(tmp_path / "sparse.h5", splits(np.arange(10)))  # distinct items: written
    with pytest.raises(DataError, match=r"/query: 1 items have the image and text features of /retrieval items "
                                        r"\(first: query row 3\)"):
        write_dataset(tmp_path / "copied.h5", splits(np.array([0, 1, 2, 25, 4, 5])))


def test_captions_and_image_paths_are_written_for_search_to_show(tmp_path):
    """write_dataset takes each split's ``text_raw`` and ``paths`` (one string an item), which an index built from
    the file shows (they were refused: 'unknown dataset name', and only h5py could write them)."""
    from ucmfh.search.collection import open_collection

    src = arrays()
    for split, part in src.items():
        part["text_raw"] = [f"a caption of {split} item {i}" for i in range(len(part["image"]))]
        part["paths"] = np.array([f"photos/{i}.jpg" for i in part["ids"]])
    path = write_dataset(tmp_path / "d.h5", src)
    coll = open_collection(path, ["query"])
    assert coll.read("text_raw") == [f"a caption of query item {i}" for i in range(4)]
    assert coll.read("paths") == [f"photos/{i}.jpg" for i in src["query"]["ids"]]
    for bad, message in [(["a", None, "c", "d"], r"/query/text_raw: item 1 is NoneType, not a string \('' for none\)"),
                         (["a", "b"], r"/query/text_raw: 2 strings, the split has 4 rows"),
                         ("one caption", r"/query/text_raw: expected one string an item, got a single str"),
                         # h5py's traceback ('VLEN strings do not support embedded NULLs'); a UnicodeDecodeError
                         (["a", "b\0c", "c", "d"], r"/query/text_raw: item 1 holds a NUL character \(\\x00\), "
                                                  r"which an HDF5 string cannot hold$"),
                         ([b"a", b"b", b"\xff", b"d"], r"/query/text_raw: item 2 is bytes, not UTF-8 \(invalid "
                                                         r"start byte at byte 0\)$"),
                         # os.fsdecode of a name not UTF-8: h5py's UnicodeEncodeError
                         (["a", "b", "c", "d\udcff"], r"/query/text_raw: item 3 is no UTF-8 text \(surrogates not "
                                                       r"allowed at character 1: a name of bytes not UTF-8\?\)$")]:
        src["query"]["text_raw"] = bad
        with pytest.raises(DataError, match=message):
            write_dataset(tmp_path / "e.h5", src)
    assert not (tmp_path / "e.h5").exists()


def test_the_word_of_each_text_token_row_is_written(tmp_path):
    """§9's ``text_words`` (a string a text token row) was refused: 'unknown dataset name'."""
    import h5py

    src = arrays()
    for part in src.values():
        lengths = np.arange(len(part["image"])) % 3  # 0 to 2 words a text
        part["text_offsets"] = np.concatenate([[0], np.cumsum(lengths)])
        part["text_tokens"] = np.ones((lengths.sum(), 5), np.float16)
        part["image_tokens"] = np.ones((len(part["image"]), 2, 5), np.float16)
        part["text_words"] = [f"w{i}" for i in range(lengths.sum())]
    path = write_dataset(tmp_path / "d.h5", src)
    with h5py.File(path, "r") as f:
        assert [w.decode() for w in f["query/text_words"][()]] == src["query"]["text_words"]
    src["query"]["text_words"] = src["query"]["text_words"][1:]
    with pytest.raises(DataError, match=r"/query/text_words: 2 strings, the split has 3 text token rows$"):
        write_dataset(tmp_path / "e.h5", src)
    assert not (tmp_path / "e.h5").exists()


def test_float_ids_are_refused_not_truncated(tmp_path):
    # 0.0, 0.5, ..., 9.5 as int64 would be 0, 0, 1, 1, ...: 20 distinct items collapsing into 10
    src = arrays()
    src["train"]["ids"] = np.arange(10) / 2
    with pytest.raises(DataError, match=r"d\.h5: /train/ids: ids must be integers, got float64"):
        write_dataset(tmp_path / "d.h5", src)
    src = arrays()
    src["query"]["labels"] = src["query"]["labels"] * 0.5  # 0.5 would become 0
    with pytest.raises(DataError, match=r"/query/labels: labels must be multi-hot 0/1 values"):
        write_dataset(tmp_path / "d.h5", src)
    src = arrays()
    src["train"]["text"] = src["train"]["text"].astype(np.float64)
    src["train"]["text"][7, 1] = 1e300  # finite as given: said as beyond float32's range, without numpy's warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"d\.h5: /train/text \(read as float32: float64 values beyond its range "
                                            r"become inf\): 1 non-finite values .*\(first: inf at row 7, column 1\)"):
            write_dataset(tmp_path / "d.h5", src)
    src = arrays()
    src["query"]["labels"] = src["query"]["labels"].argmax(axis=1)  # class numbers: said by their shape
    with pytest.raises(DataError, match=r"/query/labels: expected multi-hot labels \[N, C\], got shape \(4,\) \(one "
                                        r"class an item\? give it one-hot: numpy.eye\(C\)\[classes\]\)"):
        write_dataset(tmp_path / "d.h5", src)
    src = arrays()
    src["query"]["text_bow"] = np.full((4, 3), 300)  # 300 would become 44 in uint8
    with pytest.raises(DataError, match=r"/query/text_bow: bag-of-words counts must be whole numbers from 0 to 255"):
        write_dataset(tmp_path / "d.h5", src)
    assert list(tmp_path.iterdir()) == []


def test_output_where_no_file_can_be(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match=r"file/sub/d\.h5: cannot create the folder .*file/sub") as info:
        write_dataset(tmp_path / "file" / "sub" / "d.h5", arrays())
    assert not isinstance(info.value, FileExistsError)  # no output to overwrite: no --overwrite hint
    (tmp_path / "folder.h5").mkdir()
    with pytest.raises(IsADirectoryError, match=r"folder\.h5: is a folder"):
        write_dataset(tmp_path / "folder.h5", arrays(), overwrite=True)


def test_a_pipe_given_as_the_dataset_is_refused_not_waited_on(tmp_path):
    """'ucmfh validate fifo.h5' opened the pipe for reading and waited for a writer for ever."""
    import os

    from click.testing import CliRunner

    from ucmfh.app.cli import main

    fifo = tmp_path / "fifo.h5"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="fifo.h5: not a regular file"):
        validate_file(fifo)
    result = CliRunner().invoke(main, ["validate", str(fifo)])
    assert result.exit_code == 2 and result.output == \
        f"Error: {fifo}: not a regular file (a pipe or a device); give the dataset file\n"


def test_not_hdf5_and_missing_file(tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file")
    with pytest.raises(DataError, match="not a readable HDF5 file"):
        validate_file(junk)
    with pytest.raises(DataError, match="no such file"):
        validate_file(tmp_path / "absent.h5")
    with pytest.raises(DataError, match=r": is a folder, not a dataset file$"):  # HDF5's word ran to several lines
        validate_file(tmp_path)


def test_synthetic_is_deterministic_and_shaped_like_mirflickr():
    spec = SyntheticSpec()
    assert (spec.n_query, spec.n_retrieval, spec.n_train, spec.n_classes, spec.d_img) == (2000, 18015, 5000, 24, 512)
    a, b = make_synthetic_arrays(TINY), make_synthetic_arrays(TINY)
    for split in a:
        for key in a[split]:
            np.testing.assert_array_equal(a[split][key], b[split][key])
    assert np.intersect1d(a["query"]["ids"], a["retrieval"]["ids"]).size == 0
    assert np.isin(a["train"]["ids"], a["retrieval"]["ids"]).all()
    assert (a["retrieval"]["labels"].sum(1) >= 1).all()


def test_make_synthetic_writes_a_valid_file(tmp_path):
    path = make_synthetic(tmp_path / "s.h5", TINY)
    attrs = validate_file(path)
    assert attrs["name"] == "synthetic" and len(attrs["classes"]) == TINY.n_classes


def test_make_synthetic_refuses_an_existing_file_before_making_the_data(tmp_path, monkeypatch):
    """The refusal came after the data were made: 50 s for 300,000 items."""
    import ucmfh.data.synthetic as synthetic

    path = tmp_path / "s.h5"
    path.write_bytes(b"precious")
    monkeypatch.setattr(synthetic, "make_synthetic_arrays", lambda spec: pytest.fail("the data were made"))
    with pytest.raises(FileExistsError, match="s.h5: exists; not replaced"):
        make_synthetic(path, TINY)
    assert path.read_bytes() == b"precious"


def test_the_synthetic_set_made_by_another_command_meanwhile_is_read_not_made_again(tmp_path, monkeypatch):
    """Two commands started together where data/synthetic.h5 is not yet (a job array, two terminals): the second
    waits for the first to make it and reads it, where it made the set again and was refused ('written by another
    process meanwhile', exit 2, after a minute's work)."""
    import threading

    import ucmfh.data.synthetic as synthetic
    from ucmfh.app.environment import resolve_dataset
    from ucmfh.files import locked

    path, found = tmp_path / "synthetic.h5", []
    with locked(path, hidden=True):  # the first command, making the set
        second = threading.Thread(target=lambda: found.append(resolve_dataset("synthetic", tmp_path)))
        second.start()
        second.join(0.5)
        assert second.is_alive() and not path.exists()  # waiting, not making it
        make_synthetic(path, TINY)
        monkeypatch.setattr(synthetic, "make_synthetic", lambda *a, **k: pytest.fail("made again"))
    second.join(60)
    assert found == [str(path)] and validate_file(path)["name"] == "synthetic"


def test_the_synthetic_set_made_on_first_use_is_said_once(tmp_path, monkeypatch, capsys):
    """-d synthetic made a file of 100 MB in --data-dir without a word (an audit's, into a folder of its real
    datasets): its making is said, once."""
    import ucmfh.data.synthetic as synthetic
    from ucmfh.app.environment import resolve_dataset

    monkeypatch.setattr(synthetic, "make_synthetic", lambda path: make_synthetic(path, TINY))
    path = str(tmp_path / "synthetic.h5")
    assert resolve_dataset("synthetic", tmp_path) == path
    size = os.path.getsize(path) / 1e6
    assert capsys.readouterr().out == f"note: made {path} ({size:.0f} MB), the synthetic dataset, once: read from " \
                                      "there after\n"
    assert resolve_dataset("synthetic", tmp_path) == path and capsys.readouterr().out == ""


def test_a_dataset_and_its_splits_print_as_their_sizes(tiny):
    """A library user's print(data): names and sizes, one line, not every feature (a dataclass's repr printed
    the tensors: pages for one file); the splits withheld from training say so."""
    split = tiny.train
    assert repr(split) == (f"Split({len(split)} items, image {tiny.d_img}-d, text {tiny.d_txt}-d, "
                           f"{tiny.n_classes} classes, ids)")
    sizes = f"train {len(tiny.train)}, query {len(tiny.query)}, retrieval {len(tiny.retrieval)}"
    assert repr(tiny) == (f"Dataset({tiny.name!r}: {sizes}; image {tiny.d_img}-d, text {tiny.d_txt}-d, "
                          f"{tiny.n_classes} classes; {tiny.path})")
    assert repr(tiny.train_only()).startswith(f"Dataset({os.path.basename(tiny.path)!r}: train {len(tiny.train)}, "
                                              "query withheld, "
                                              "retrieval withheld;")


def test_the_data_page_s_write_dataset_block_runs(tmp_path, monkeypatch):
    """docs/data.md's own-arrays block writes a valid caption set with its captions and image paths."""
    from conftest import ROOT
    from ucmfh.search.collection import open_collection

    block = (ROOT / "docs" / "data.md").read_text(encoding="utf-8").split("```python\n")[-1].split("```")[0]
    assert "ucmfh.write_dataset(" in block
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/data.md", "exec"), {})
    data = load_dataset("mine.h5")
    assert data.caption_set and (len(data.query), len(data.train)) == (250, 1250)
    assert open_collection("mine.h5", ["query"]).read("paths")[:6] == ["photos/0.jpg"] * 5 + ["photos/1.jpg"]


def test_a_negative_infinity_is_named_as_such():
    from ucmfh.data.format import check_finite

    with pytest.raises(DataError, match=r"x: 1 non-finite values in rows 3..4 \(first: -inf at row 4, column 1\)"):
        check_finite(np.array([[0.0, 1.0], [2.0, -np.inf]], dtype=np.float32), "x", first_row=3)


def test_paths_and_captions_that_are_not_one_string_an_item_are_refused(tmp_path):
    """validate passed a file whose /query/paths were int64, which index then refused."""
    path = make_synthetic(tmp_path / "s.h5", SyntheticSpec(n_train=20, n_query=5, n_retrieval=30, d_img=8, d_txt=8,
                                                           n_classes=3))
    with h5py.File(path, "a") as f:
        f["query/paths"] = np.arange(5)
    with pytest.raises(DataError, match=r"/query/paths: expected 5 strings, one an item, got int64 \(5,\)"):
        validate_file(path)
    with h5py.File(path, "a") as f:
        del f["query/paths"]
        f["query/text_raw"] = np.array(["a", "b"], dtype=object)
    with pytest.raises(DataError, match=r"/query/text_raw: expected 5 strings, one an item, got object \(2,\)"):
        validate_file(path)


def test_a_virtual_dataset_of_one_split_over_the_query_split_s_rows_is_refused(tmp_path):
    """The file check compares the query split's pooled features with the others', row by row, and its token
    features not at all: training tokens that were a virtual dataset over the query's were valid, and SEPS trained
    on the query images. Training and retrieval rows may be one another's (the layout's shared files' are)."""
    path = write_dataset(tmp_path / "d.h5", arrays())

    def over(split: str, source: str) -> None:
        with h5py.File(path, "a") as f:
            text = f[split]["text"]
            n = min(text.shape[0], f[source]["text"].shape[0])
            f[split].create_dataset("kept", data=text[()])
            layout = h5py.VirtualLayout(shape=text.shape, dtype=text.dtype)
            layout[:] = h5py.VirtualSource(".", f"/{split}/kept", shape=text.shape)
            layout[:n] = h5py.VirtualSource(".", f"/{source}/text", shape=f[source]["text"].shape)[:n]
            del f[split]["text"]
            f[split].create_virtual_dataset("text", layout, fillvalue=0)

    over("train", "retrieval")
    validate_file(path)
    over("retrieval", "query")
    with pytest.raises(DataError, match=r"d.h5: /retrieval/text: a virtual dataset whose rows are /query/text's: the "
                                        r"query split's rows and another split's must be disjoint"):
        validate_file(path)


def test_a_virtual_dataset_whose_source_is_gone_is_refused_where_hdf5_reads_zeros(tmp_path):
    """HDF5 reads the rows of a virtual dataset whose source is gone as its fill value, without an error; zeros
    pass every check of values, and a re-ranking by tokens read so scored half its rSum without a word."""
    path = write_dataset(tmp_path / "d.h5", arrays())
    with h5py.File(path, "a") as f:
        image = f["query"]["image"][()]
        del f["query"]["image"]
        with h5py.File(tmp_path / "source.h5", "w") as source:
            source.create_dataset("rows", data=image)
        layout = h5py.VirtualLayout(shape=image.shape, dtype=image.dtype)
        layout[:] = h5py.VirtualSource("source.h5", "rows", shape=image.shape)
        f["query"].create_virtual_dataset("image", layout, fillvalue=0)
        f["train"].create_dataset("kept", data=f["train"]["text"][()])  # a source inside the file itself
        text = f["train"]["text"]
        inside = h5py.VirtualLayout(shape=text.shape, dtype=text.dtype)
        inside[:] = h5py.VirtualSource(".", "/train/kept", shape=text.shape)
        del f["train"]["text"]
        f["train"].create_virtual_dataset("text", inside, fillvalue=0)
    data = load_dataset(path)  # whole, both kinds of source there
    np.testing.assert_array_equal(data.query.img.numpy(), image)
    with h5py.File(path, "a") as f:
        del f["train"]["kept"]
    with pytest.raises(DataError, match=r"d.h5: /train/text: a virtual dataset whose source /train/kept in this file "
                                        r"is not there \(its rows would read as zeros\)"):
        load_dataset(path)
    with h5py.File(path, "a") as f:
        f["train"].create_dataset("kept", data=data.train.txt.numpy())
    os.remove(tmp_path / "source.h5")
    with pytest.raises(DataError, match=r"/query/image: a virtual dataset whose source file source.h5 is not there"):
        validate_file(path)


def test_validation_reads_a_wide_file_in_blocks_of_bounded_bytes(tmp_path, monkeypatch):
    """'ucmfh validate' of Flickr8k (1,280-d images) peaked at 1.5 GB: 65,536 rows were read at a time and copied
    as they were checked. A feature dataset's rows are read as many at a time as _CHECK_BYTES of float64 hold; the
    file is judged the same, and a loaded split is the file's."""
    import ucmfh.data.h5 as h5

    path = make_synthetic(tmp_path / "wide.h5", SyntheticSpec(n_query=40, n_retrieval=300, n_train=200, n_classes=4,
                                                             d_img=256, d_txt=64))
    monkeypatch.setattr(h5, "_CHECK_BYTES", 8 * 256 * 64)  # 64 rows of the images a read
    reads = []
    real = h5._read
    monkeypatch.setattr(h5, "_read", lambda path_, where, dset, rows=slice(None): reads.append(
        (where, len(range(*rows.indices(dset.shape[0]))) * (dset.shape[1] if dset.ndim > 1 else 1)))
        or real(path_, where, dset, rows))
    validate_file(path)
    features = [(where, size) for where, size in reads if where.endswith(("/image", "/text"))]
    assert features and max(size for _, size in features) <= 64 * 256
    assert {where for where, _ in features} >= {f"/{s}/{m}" for s in ("train", "query", "retrieval")
                                                for m in ("image", "text")}
    data = load_dataset(path)
    with h5py.File(path) as f:
        assert np.array_equal(data.retrieval.img.numpy(), f["retrieval/image"][()])


def test_a_dataset_s_bare_name_given_for_its_path_is_said_to_be_one(tmp_path, monkeypatch):
    """ucmfh.load_dataset('wiki'), as the commands' -d wiki, said 'wiki: no such file' alone; the library takes a
    path, and says so where a bare name was given (a path with a folder or an extension: as before)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"^wiki: no such file \(a file's path is asked for here: the commands find "
                                        r"-d wiki in --data-dir as wiki\.h5\)$"):
        load_dataset("wiki")
    # ... and so do 'ucmfh index' and 'search -q', which said 'wiki: no such collection file' (an audit's)
    from ucmfh.search.collection import open_collection, read_queries

    for read, what in ((open_collection, "collection"), (lambda p: read_queries(p, "txt", {}), "query")):
        with pytest.raises(FileNotFoundError, match=rf"^wiki: no such {what} file \(a file's path is asked for here: "
                                                    r"the commands find -d wiki in --data-dir as wiki\.h5\)$"):
            read("wiki")
    for path in ("wiki.h5", os.path.join("data", "wiki")):
        with pytest.raises(DataError, match=rf"^{path}: no such file$"):
            load_dataset(path)
