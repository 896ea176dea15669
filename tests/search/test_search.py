"""Search: exact top-K against a brute-force ranking, shards as one, mmap, appends, resumable builds, refusals."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from ucmfh.checkpoint import save_checkpoint
from ucmfh.codes import pack_codes
from ucmfh.config import BackendConfig, HashConfig
from ucmfh.data.h5 import DataError
from ucmfh.metrics import backend
from ucmfh.models.hashing import FeatureHasher
from ucmfh.evaluation import encode_split
from ucmfh.search import Index
from ucmfh.search.build import Encoder, build_index
from ucmfh.search.collection import read_queries
from ucmfh.search.html import write_html
from ucmfh.search.kernels import kernels_module
from ucmfh.search.results import merged, result_rows, search_blocks, search_queries
from ucmfh.search.shards import Shards, open_index


def brute_force(q: np.ndarray, r: np.ndarray, k: int):
    """Hamming distances of ±1 codes by counting unequal signs; a stable sort: ties by index."""
    d = (q[:, None, :] != r[None, :, :]).sum(axis=2)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), order


def pm1(rng, n, bits):
    return rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(n, bits))


@pytest.mark.parametrize("bits", [8, 20, 64, 100, 128])
def test_search_equals_brute_force_with_ties_by_index(bits):
    rng = np.random.default_rng(bits)
    r, q = pm1(rng, 700, bits), pm1(rng, 37, bits)
    r[100:110] = r[5]  # exact duplicates: their order must be by position
    q[0] = r[5]
    index = Index(bits)
    index.add("txt", r)
    for k in (1, 10, 700, 1000):
        dist, pos = index.search(q, k, "text")
        want_d, want_i = brute_force(q, r, min(k, 700))
        assert np.array_equal(pos, want_i) and np.array_equal(dist, want_d)
    assert list(index.search(q[:1], 11, "txt")[1][0]) == [5, *range(100, 110)]
    with backend("torch"):  # the torch path (the GPU's) gives the same
        assert np.array_equal(index.search(q, 10, "txt")[1], brute_force(q, r, 10)[1])
    # packed bytes and torch tensors in, the same out
    assert np.array_equal(index.search(pack_codes(q), 10, "txt")[1], index.search(torch.from_numpy(q), 10, "txt")[1])


def test_the_torch_path_searches_queries_in_chunks_of_bounded_memory(monkeypatch):
    """Every query at once made the GPU top-k's candidates grow with the queries."""
    from ucmfh.metrics import topk
    from ucmfh.search import scan as scan_module

    rng = np.random.default_rng(0)
    r, q = pm1(rng, 500, 64), pm1(rng, 23, 64)
    index = Index(64)
    index.add("txt", r)
    rows = []
    real = topk.hamming_top_k_torch
    monkeypatch.setattr(topk, "hamming_top_k_torch", lambda qq, *a: rows.append(qq.shape[0]) or real(qq, *a))
    monkeypatch.setattr(scan_module, "QUERY_CHUNK_BYTES", scan_module.CANDIDATE_BYTES * 40 * 5)  # 5 queries at k=40
    with backend("torch"):
        dist, pos = index.search(q, 40, "txt")
    assert rows == [5, 5, 5, 5, 3]
    want_d, want_i = brute_force(q, r, 40)
    assert np.array_equal(pos, want_i) and np.array_equal(dist, want_d)


@pytest.mark.skipif(kernels_module() is None, reason="without ucmfh's C kernels the CPU scan is torch's")
def test_a_cpu_search_never_imports_torch(tmp_path):
    """Loading an index and searching it, by the scan and by multi-index hashing, and a refused input,
    run without torch (200 MB of memory a CPU search does not need)."""
    rng = np.random.default_rng(0)
    index = Index(n_bits=64)
    index.add("txt", rng.choice([-1, 1], size=(70000, 64)).astype(np.int8))
    index.save(tmp_path / "i.index")
    script = f"""
import sys
import numpy as np
from ucmfh.config import BackendConfig
from ucmfh.data.format import DataError
from ucmfh.search import Index
index = Index.load({str(tmp_path / "i.index")!r})
q = np.random.default_rng(1).choice([-1, 1], size=(20, 64)).astype(np.int8)
d, p = index.search(q, 5, "txt")
d2, p2 = index.search(q, 5, "txt", backend=BackendConfig(backend="mih"))
assert (p == p2).all() and (d == d2).all()
try:
    index.search(q[:, :8], 5, "txt")
except ValueError:
    pass
assert "torch" not in sys.modules, "torch was imported"
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_bad_arguments_are_clear(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"a dataset")
    index = Index(16)
    index.add("img", pm1(np.random.default_rng(0), 5, 16))
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search(pm1(np.random.default_rng(1), 2, 16), 0, "img")
    with pytest.raises(TypeError, match=r"^k must be a whole number, got float 2.5$"):  # it ran as k = 2
        index.search(pm1(np.random.default_rng(1), 2, 16), 2.5, "img")
    for at in ([-1], [5]):  # -1 was the last item, 5 numpy's IndexError from inside
        with pytest.raises(IndexError, match=rf"^position {at[0]} is not one of the 5 img items \(0 to 4\)$"):
            index.take("img", "ids", at)
    assert index.take("img", "ids", np.array([4, 0])).tolist() == [4, 0]
    with pytest.raises(ValueError, match=r"^the index holds no txt items \(it holds 5 img and 0 txt items\)$"):
        index.search(pm1(np.random.default_rng(1), 2, 16), 3, "txt")  # a KeyError, its message quoted
    for n_bits in ("16", 16.7):  # taken as 16
        with pytest.raises(TypeError, match=r"^n_bits must be a whole number, got "):
            Index(n_bits)
    with pytest.raises(DataError, match=r"x.h5: a file, not an index folder \('ucmfh index' makes one\)$"):
        Index.load(str(tmp_path / "x.h5"))  # it said 'no such index folder' of a file that is there
    with pytest.raises(ValueError, match=r"queries: 32 columns, the index holds 16-bit codes; features are encoded "
                                         r"first: ucmfh.search.Encoder\(checkpoint\).encode\(features, modality\)"):
        index.search(np.full((2, 32), 0.3), 3, "img")  # features where codes belong
    with pytest.raises(ValueError, match=r"queries: 32 columns, the index holds 16-bit codes; codes of another "
                                         r"length: of another model than the index's$"):
        index.search(pm1(np.random.default_rng(1), 2, 32), 3, "img")
    with pytest.raises(ValueError, match="modality must be"):
        index.search(np.ones((2, 16)), 3, "audio")
    with pytest.raises(ValueError, match=re.escape("queries: expected a 2-D array [N, 16], a row an item (one: "
                                                   "queries[None]), got shape (16,)")):  # how to ask with one code
        index.search(np.ones(16), 3, "img")
    with pytest.raises(ValueError, match="columns"):
        index.add("img", np.ones((2, 16)), text=["a", "b"])  # a column the first items did not have
    with pytest.raises(ValueError, match=r"^txt text: None at position 1; give a string \('' for none\)$"):
        Index(16).add("txt", np.ones((3, 16)), text=["a", None, "c"])  # it was stored as the text 'None'
    packed = np.full((1, 2), 0xFF, dtype=np.uint8)
    with pytest.raises(ValueError, match="beyond bit 12"):
        Index(12).add("img", packed)
    with pytest.raises(ValueError, match=r"^txt ids: must be >= 0, got -2 \(first at row 1\)$"):  # as 'index' says
        Index(16).add("txt", np.ones((3, 16)), ids=np.array([1, -2, 3]))


def test_save_with_overwrite_replaces_an_index_and_nothing_else(tmp_path):
    """Index.save(overwrite=True) deleted a folder of the user's and, over a file, raised NotADirectoryError with the
    file renamed to a hidden name (an audit's find): both are refused and left as they were."""
    index = Index(64)
    index.add("txt", np.ones((3, 64)))
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "cat.jpg").write_text("meow")
    (tmp_path / "mine.txt").write_text("mine")
    for path in (photos, tmp_path / "mine.txt"):
        with pytest.raises(FileExistsError, match="is not an index folder; not replaced"):
            index.save(path, overwrite=True)
    assert (photos / "cat.jpg").read_text() == "meow" and (tmp_path / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt", "photos"]
    Index(64).save(tmp_path / "ix")
    index.save(tmp_path / "ix", overwrite=True)
    assert Index.load(tmp_path / "ix").count("txt") == 3


def test_save_refuses_a_folder_made_meanwhile_and_leaves_it(tmp_path, monkeypatch):
    """A folder made at the index's path while save wrote its columns (another build's) was moved aside and deleted,
    without overwrite (an audit's find): it is refused and left as it was."""
    from ucmfh.search import folder

    index, out = Index(64), tmp_path / "ix"
    index.add("txt", np.ones((3, 64)))
    writing = folder.write_json_atomic

    def another_made_it(path, value):  # the manifest written last, once the other process has made its folder
        if not out.exists():
            out.mkdir()
            (out / "theirs").write_text("theirs")
        return writing(path, value)

    monkeypatch.setattr(folder, "write_json_atomic", another_made_it)
    with pytest.raises(FileExistsError, match=r"ix: made by another process meanwhile; not replaced$"):
        index.save(out)
    assert [p.name for p in out.iterdir()] == ["theirs"] and [p.name for p in tmp_path.iterdir()] == ["ix"]


def test_a_cached_structure_removed_meanwhile_by_another_search_is_no_error(tmp_path, monkeypatch):
    """A search that builds a cached structure (multi-index tables, a FAISS index) removes those of other item
    counts; another search's build of the same index removing one first made this one's removal a traceback."""
    from ucmfh.search import index as index_module

    index = Index(64)
    index.add("txt", np.ones((3, 64)))
    opened = Index.load(index.save(tmp_path / "ix"))
    gone = str(tmp_path / "ix" / "cache" / "tables-2000")  # listed, then removed by the other search
    monkeypatch.setattr(index_module.glob, "glob", lambda pattern: [gone])

    def write(it, path):
        with open(path, "w") as f:
            f.write(str(it))

    assert opened.derived("cache", "tables-3", lambda: 3, lambda path: None, write, "tables-*") == (3, "built")


def test_save_load_mmap_append_and_shards(tmp_path):
    rng = np.random.default_rng(0)
    r, q = pm1(rng, 900, 64), pm1(rng, 20, 64)
    ids = np.arange(900) // 3
    text = [f"caption {i} é" for i in range(900)]
    whole = Index(64, {"note": "x"})
    whole.add("txt", r, ids=ids, text=text, embeddings=r[:, :8])
    path = whole.save(tmp_path / "whole")
    loaded = Index.load(path)
    assert isinstance(loaded.codes("txt"), np.memmap) and loaded.meta == {"note": "x"}
    assert np.array_equal(loaded.search(q, 15, "txt")[1], whole.search(q, 15, "txt")[1])
    assert loaded.strings("txt", "text", [0, 899]) == ["caption 0 é", "caption 899 é"]
    # each item decoded once, from one read of what the items asked for span, or item by item beyond a span
    asked = np.array([[7, 3, 7], [899, 3, 0]])
    from ucmfh.search import index as index_module

    for span in (index_module.STRINGS_SPAN, 0):
        index_module.STRINGS_SPAN, before = span, index_module.STRINGS_SPAN
        try:
            assert loaded.strings("txt", "text", asked) == [text[i] for i in asked.ravel()]
            assert loaded.strings("txt", "text", np.zeros(0, np.int64)) == []
        finally:
            index_module.STRINGS_SPAN = before
    with pytest.raises(FileExistsError):
        whole.save(path)
    # appends: a folder grown in three adds equals one add; what a reader opened before stays as it was
    grown = Index(64)
    grown.save(tmp_path / "grown")
    grown.add("txt", r[:100], ids=ids[:100], text=text[:100], embeddings=r[:100, :8])
    before = Index.load(tmp_path / "grown")
    grown.add("txt", r[100:500], ids=ids[100:500], text=text[100:500], embeddings=r[100:500, :8])
    grown.add("txt", r[500:], ids=ids[500:], text=text[500:], embeddings=r[500:, :8])
    again = Index.load(tmp_path / "grown", mmap=False)
    assert before.count("txt") == 100 and again.count("txt") == 900
    assert np.array_equal(again.ids("txt"), ids) and again.strings("txt", "text", [450]) == [text[450]]
    assert np.array_equal(again.search(q, 50, "txt")[1], brute_force(q, r, 50)[1])
    # shards searched as one equal one index of their items in order, ties included
    r[600:610] = r[3]
    q[0] = r[3]
    single = Index(64)
    single.add("txt", r, ids=ids, text=text)
    parts = []
    for i, (a, b) in enumerate([(0, 250), (250, 605), (605, 900)]):
        part = Index(64)
        part.add("txt", r[a:b], ids=ids[a:b], text=text[a:b])
        parts.append(part.save(tmp_path / f"shard{i}"))
    shards = open_index(parts)
    assert isinstance(shards, Shards) and shards.count("txt") == 900
    for k in (1, 12, 300, 900):
        d1, p1 = single.search(q, k, "txt")
        d2, p2 = shards.search(q, k, "txt")
        assert np.array_equal(p1, p2) and np.array_equal(d1, d2)
    assert shards.take("txt", "text", p2[:2, :3]) == single.take("txt", "text", p1[:2, :3])
    assert np.array_equal(shards.take("txt", "ids", p2), ids[p1])


def test_rows_of_a_killed_append_are_never_seen(tmp_path):
    rng = np.random.default_rng(1)
    r = pm1(rng, 50, 32)
    index = Index(32)
    index.add("img", r[:30], paths=[f"p{i}.jpg" for i in range(30)])
    index.save(tmp_path / "ix")
    # a writer killed after writing rows but before committing them
    with open(tmp_path / "ix" / "img.codes", "ab") as f:
        f.write(b"\xff" * 8 * 7)
    with open(tmp_path / "ix" / "img.paths.bytes", "ab") as f:
        f.write(b"garbage")
    reader = Index.load(tmp_path / "ix")
    assert reader.count("img") == 30
    reader.add("img", r[30:], paths=[f"p{i}.jpg" for i in range(30, 50)])
    full = Index.load(tmp_path / "ix")
    assert np.array_equal(full.search(r, 1, "img")[1][:, 0], np.arange(50))
    assert full.strings("img", "paths", [29, 30, 49]) == ["p29.jpg", "p30.jpg", "p49.jpg"]
    assert os.path.getsize(tmp_path / "ix" / "img.codes") == 50 * 8


# ------------------------------------------------------------ collections and checkpoints


@pytest.fixture(scope="module")
def collection(tmp_path_factory, request):
    """A caption set: 40 images x 3 captions (ids repeat), with paths and captions; a checkpoint for it.
    Image features 12-d, text features 10-d, or as many as a test parametrises (indirect)."""
    d_txt = getattr(request, "param", 10)
    folder = tmp_path_factory.mktemp("search")
    rng = np.random.default_rng(0)
    n_img, per = 40, 3
    img = np.repeat(rng.normal(size=(n_img, 12)).astype(np.float32), per, axis=0)
    txt = rng.normal(size=(n_img * per, d_txt)).astype(np.float32)
    ids = np.repeat(np.arange(100, 100 + n_img), per)
    path = folder / "coll.h5"
    with h5py.File(path, "w") as f:
        f.attrs["image_feature"] = "toy image features"
        f.attrs["text_feature"] = "toy text features"
        f["image"], f["text"], f["ids"] = img, txt, ids
        f.create_dataset("text_raw", data=[f"a caption of image {i}" for i in ids], dtype=h5py.string_dtype())
        f.create_dataset("paths", data=[f"img/{i}.jpg" for i in ids], dtype=h5py.string_dtype())
    (folder / "img").mkdir()
    for i in range(101, 100 + n_img):  # each image's file but the first's (a page says it is not found)
        (folder / "img" / f"{i}.jpg").write_bytes(b"\xff\xd8 a picture")
    checkpoints = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        cfg = HashConfig(method="two-tower", n_bits=24, hidden=16)
        model = FeatureHasher(12, d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)
        model.fit_feature_stats(torch.from_numpy(img), torch.from_numpy(txt))
        checkpoints.append(save_checkpoint(folder / f"hash24_{seed}.pt", model.eval(), None, cfg))
    return {"path": str(path), "img": img, "txt": txt, "ids": ids, "ckpt": checkpoints, "folder": folder}


def test_a_build_beside_another_of_its_folder_is_refused_before_it_writes(collection, tmp_path):
    """Two builds of one folder at once each refused the other's rows ('changed by another writer'), and the one
    that had made the folder deleted it, or left it without a manifest (an audit's find): one build writes to a
    folder at a time, and another is refused before it reads or writes anything."""
    from ucmfh.files import locked

    c, out = collection, tmp_path / "ix"
    with locked(out, hidden=True):  # the other build, under way
        with pytest.raises(DataError, match=r"ix/: another build is writing to it now \(an 'ucmfh index' in another "
                                            r"process\); let it finish, then run this one again$"):
            build_index(c["path"], c["ckpt"][0], str(out) + os.sep)
        assert not out.exists()
    assert build_index(c["path"], c["ckpt"][0], str(out)).added == {"img": 40, "txt": 120}


def test_build_index_s_arguments_are_checked_before_its_folder_is_made_or_locked(collection, tmp_path):
    """From Python (an audit's): splits='query' was read as the groups q, u, e, r and y; a Dataset for the
    collection failed in os.stat; and a missing input left the folder's lock file behind."""
    c = collection
    with pytest.raises(DataError, match=r"coll\.h5: /query: no such group \(the file has: none\)$"):
        build_index(c["path"], c["ckpt"][0], str(tmp_path / "a" / "ix"), splits="query")  # one group, named
    with pytest.raises(TypeError, match=r"^build_index: collection must be a str or a PathLike \(a collection or "
                                        r"dataset file's path\), got dict$"):
        build_index(dict(c), c["ckpt"][0], str(tmp_path / "a" / "ix"))
    with pytest.raises(TypeError, match=r"^Encoder: checkpoint must be a str or a PathLike"):
        Encoder(torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match="nope.h5: no such collection file"):
        build_index(str(tmp_path / "nope.h5"), c["ckpt"][0], str(tmp_path / "a" / "ix"))
    with pytest.raises(ValueError, match="nope.pt: no such checkpoint"):
        build_index(c["path"], str(tmp_path / "nope.pt"), str(tmp_path / "a" / "ix"))
    assert not (tmp_path / "a").exists()  # no folder, no lock file
    ok = build_index(c["path"], c["ckpt"][0], str(tmp_path / "b" / "ix"), splits=["/"])
    assert ok.added == {"img": 40, "txt": 120}


def test_an_edited_manifest_s_column_layout_ids_past_int64_and_one_string_as_captions_are_refused(tmp_path):
    """A search audit's: ids said to be int32 in an edited manifest were read as 0 (exit 0), objects crashed the
    process (SIGSEGV); uint64 ids past int64 were kept as negative ids; text='dog' was three captions."""
    index = Index(16)
    index.add("txt", np.ones((3, 16), np.float32), ids=np.array([5, 6, 7]), text=["a", "b", "c"])
    index.save(tmp_path / "ix")
    manifest = tmp_path / "ix" / "index.json"
    good = json.loads(manifest.read_text())
    for spec, said in ((["<i4", None], r"its ids column is <i4, where an index's is <i8$"),
                       (["|O", None], r"its ids column is \|O, where an index's is <i8$")):
        edited = json.loads(json.dumps(good))
        edited["modalities"]["txt"]["columns"]["ids"] = spec
        manifest.write_text(json.dumps(edited))
        with pytest.raises(DataError, match=r"index\.json: damaged \(" + said[:-1] + r"\); build the index again$"):
            Index.load(tmp_path / "ix")
    with pytest.raises(ValueError, match=r"^txt ids: 9223372036854775809 does not fit int64, as ids are kept$"):
        Index(8).add("txt", np.ones((1, 8)), ids=np.array([2**63 + 1], dtype=np.uint64))
    with pytest.raises(TypeError, match=r"^txt text: a list of strings, one an item, not one str$"):
        Index(8).add("txt", np.ones((3, 8)), text="dog")
    with pytest.raises(ValueError, match=r"^chunk_size must be a whole number >= 1, got 2\.5$"):
        build_index(str(tmp_path / "none.h5"), str(tmp_path / "none.pt"), str(tmp_path / "b"), chunk_size=2.5)
    assert not (tmp_path / "b").exists()  # an unfinished index was left


def test_an_index_whose_meta_json_cannot_write_is_refused_before_any_column(tmp_path):
    """Index(meta={"n": np.int64(3)}).save(...) failed in the json module, 11 frames deep, every column written
    (an audit's)."""
    index = Index(16, {"n": np.int64(3)})
    index.add("img", np.ones((2, 16), np.float32))
    with pytest.raises(ValueError, match=r"m: not saved: the index's meta holds what JSON cannot write \(Object of "
                                         r"type int64 is not JSON serializable; give plain numbers"):
        index.save(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_build_encodes_unimodal_codes_dedupes_images_and_resumes(collection, tmp_path):
    c = collection
    out = tmp_path / "ix"
    report = build_index(c["path"], c["ckpt"][0], str(out), chunk_size=7)
    index = report.index
    assert report.added == {"img": 40, "txt": 120} and not report.already
    # the codes of `ucmfh encode --protocol unimodal`
    from ucmfh.checkpoint import load_model
    from ucmfh.data.h5 import Split

    model = load_model(c["ckpt"][0], "hash")[0]
    split = Split(torch.from_numpy(c["img"]), torch.from_numpy(c["txt"]), None, torch.from_numpy(c["ids"]))
    img_codes, txt_codes = encode_split(model, split, "unimodal", "cpu")
    assert np.array_equal(index.codes("txt").view(np.uint8)[:, :3], pack_codes(txt_codes))
    assert np.array_equal(index.codes("img").view(np.uint8)[:, :3], pack_codes(img_codes[::3]))  # one per id
    assert np.array_equal(index.ids("img"), np.arange(100, 140))
    assert index.strings("txt", "text", [5]) == ["a caption of image 101"]
    assert index.strings("img", "paths", [2]) == ["img/102.jpg"]
    # the same collection again adds nothing
    assert build_index(c["path"], c["ckpt"][0], str(out)).already
    # a build killed after 5 chunks, resumed, equals the uninterrupted one
    killed = tmp_path / "killed"
    build_index(c["path"], c["ckpt"][0], str(killed), chunk_size=7, stop_after=5)
    assert Index.load(killed).count("txt") == 35
    resumed = build_index(c["path"], c["ckpt"][0], str(killed), chunk_size=7)
    assert resumed.resumed_at == 35
    for name in ("img.codes", "img.ids", "txt.codes", "txt.ids", "txt.embed", "txt.text.bytes", "img.paths.offsets"):
        assert (killed / name).read_bytes() == (out / name).read_bytes(), name
    # a copy of the collection under another name (another content: a re-export) would index every item twice
    other = tmp_path / "other.h5"
    shutil.copy(c["path"], other)
    with h5py.File(other, "a") as f:
        f.attrs["name"] = "a second collection"
    with pytest.raises(DataError, match=r"other.h5: 120 of its 120 rows have ids .* holds already \(first: id \d+ "
                                        r"at row 0\); adding it would index those items twice") as refused:
        build_index(str(other), c["ckpt"][0], str(out))
    largest = int(max(Index.load(out).ids("img").max(), Index.load(out).ids("txt").max()))  # the remedy's number
    assert f"give new items ids of their own, after {out}'s largest, {largest} ('ucmfh extract --first-id " \
           f"{largest + 1}')" in str(refused.value)
    assert Index.load(out).count("txt") == 120
    # another collection (items of ids of their own) appends
    with h5py.File(other, "a") as f:
        f["ids"][...] = f["ids"][:] + 1000
    appended = build_index(str(other), c["ckpt"][0], str(out))
    assert appended.added == {"img": 40, "txt": 120} and appended.index.count("txt") == 240


@pytest.mark.parametrize("collection", [10, 12], ids=["d_txt=10", "d_txt=12"], indirect=True)
def test_an_index_and_a_search_hash_each_modality_by_its_own_head(collection, tmp_path):
    """`ucmfh index` and a search's Encoder give the codes of `ucmfh encode --protocol unimodal` and the heads'
    own outputs: images by the image head, texts by the text head, also with features of one width (12 and
    12, as CLIP's 512 and 512), where the other head would take them without a shape error."""
    from ucmfh.checkpoint import load_model  # noqa: PLC0415
    from ucmfh.data.h5 import Split  # noqa: PLC0415
    from ucmfh.similarity import normalize  # noqa: PLC0415

    c = collection
    index = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    model = load_model(c["ckpt"][0], "hash")[0].eval()
    img, txt = torch.from_numpy(c["img"]), torch.from_numpy(c["txt"])
    img_codes, txt_codes = encode_split(model, Split(img, txt, None, torch.from_numpy(c["ids"])), "unimodal", "cpu")
    assert np.array_equal(index.codes("txt").view(np.uint8)[:, :3], pack_codes(txt_codes))
    assert np.array_equal(index.codes("img").view(np.uint8)[:, :3], pack_codes(img_codes[::3]))
    with torch.no_grad():
        own = {"img": model.img_head(normalize(img - model.img_mean)),
               "txt": model.txt_head(normalize(txt - model.txt_mean))}
    encoder = Encoder(c["ckpt"][0])
    for modality, short, codes in (("image", "img", img_codes), ("text", "txt", txt_codes)):
        torch.testing.assert_close(torch.from_numpy(encoder.encode(c[short], modality)), own[short])
        assert torch.equal(torch.where(own[short] >= 0, 1.0, -1.0), codes)


def test_search_queries_refuses_other_checkpoints_dims_and_extractors(collection, tmp_path, monkeypatch):
    c = collection
    index = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    encoder = Encoder(c["ckpt"][0])
    queries = read_queries(c["path"], "txt", encoder.dims, ids=[101, 130])
    assert len(queries) == 6 and queries.text[0] == "a caption of image 101"
    results = search_queries(index, encoder, queries, 5, "image")
    logits = encoder.encode(c["txt"][3:6], "txt")
    assert np.array_equal(results.positions[:3], index.search(logits, 5, "img")[1])
    assert results.relevance == "same id" and np.array_equal(results.relevant, results.ids == queries.ids[:, None])
    # cosine re-ranking of the Hamming candidates, checked by hand
    reranked = search_queries(index, encoder, queries, 4, "image", rerank="cosine", candidates=12)
    d, p = index.search(encoder.encode(queries.features, "txt"), 12, "img")
    emb = index.embeddings("img")[p].astype(np.float64)
    q = encoder.encode(queries.features, "txt").astype(np.float64)
    cos = np.einsum("qme,qe->qm", emb, q) / (np.linalg.norm(emb, axis=2) * np.linalg.norm(q, axis=1)[:, None])
    for i in range(len(queries)):
        order = sorted(range(12), key=lambda j: (-cos[i, j], p[i, j]))[:4]
        assert list(reranked.positions[i]) == [p[i, j] for j in order]
    # a query's candidates at a time (memory bounded, :data:`RERANK_VALUES`): the same scores
    from ucmfh.search import results as results_module

    for values in (1, 2 * 12 * 24):
        monkeypatch.setattr(results_module, "RERANK_VALUES", values)
        blocked = search_queries(index, encoder, queries, 4, "image", rerank="cosine", candidates=12)
        assert np.array_equal(blocked.positions, reranked.positions) and np.array_equal(blocked.cosine,
                                                                                        reranked.cosine)
    monkeypatch.undo()
    # and a block of queries' candidates at a time, each block keeping its top k (3.6 GB at 100,000 candidates
    # for every query at once): the same hits, scores and distances, by either backend; what multi-index hashing
    # served, the same counts
    for backend in ("exact", "mih"):
        whole = search_queries(index, encoder, queries, 4, "image", rerank="cosine", candidates=12, backend=backend)
        for found in (1, 12, 2 * 12):
            monkeypatch.setattr(results_module, "SEARCH_CANDIDATES", found)
            blocked = search_queries(index, encoder, queries, 4, "image", rerank="cosine", candidates=12,
                                     backend=backend)
            assert np.array_equal(blocked.positions, whole.positions) and np.array_equal(blocked.cosine, whole.cosine)
            assert np.array_equal(blocked.distances, whole.distances) and blocked.seconds.keys() == whole.seconds.keys()
            if backend == "mih":
                assert {n: np.asarray(v).tolist() for n, v in blocked.served.items()} == \
                    {n: np.asarray(v).tolist() for n, v in whole.served.items()}
        monkeypatch.undo()
    import dataclasses  # no query at all: one empty search, as before the blocks

    none = dataclasses.replace(queries, features=queries.features[:0], ids=queries.ids[:0], text=[])
    for rerank in (None, "cosine"):
        assert search_queries(index, encoder, none, 4, "image", rerank=rerank, candidates=12).positions.shape == (0, 4)
    with pytest.raises(DataError, match="made by checkpoint .*hash24_0.pt"):
        search_queries(index, Encoder(c["ckpt"][1]), queries, 5, "image")
    with pytest.raises(DataError, match="made by checkpoint"):
        build_index(c["path"], c["ckpt"][1], str(tmp_path / "ix"))
    wide = tmp_path / "wide.npy"
    np.save(wide, np.ones((2, 11), dtype=np.float32))
    with pytest.raises(DataError, match=r"11-d features fit neither modality of the checkpoint \(image 12-d, text "
                                        r"10-d\); features of the extractors the index was built from are needed$"):
        read_queries(str(wide), None, encoder.dims)
    bad = read_queries(str(wide), "txt", encoder.dims)
    with pytest.raises(DataError, match="11-d text features, the checkpoint .* takes 10-d"):
        search_queries(index, encoder, bad, 5, "image")
    queries.feature = "another extractor"
    with pytest.raises(DataError, match="its text features were made by 'another extractor', but the index's by "
                                        "'toy text features'; codes of features of different extractors"):
        search_queries(index, encoder, queries, 5, "image")
    with pytest.raises(DataError, match=r"no item with id 7 \(its \d+ ids run from \d+ to \d+(, with gaps)?\)$"):
        read_queries(c["path"], "txt", encoder.dims, ids=[7])


def test_a_search_in_blocks_of_queries_is_the_search_of_them_all(collection, tmp_path):
    """search_queries searches a block of queries at a time (the encoder's batch; a long list held every hit
    until the first was printed): 120 text and 40 image queries in blocks of 16 find what one block finds,
    field by field, by each backend; what multi-index hashing served and an approximate backend's recall
    (blocks of unequal size, the last of 8) are counted over every query."""
    c = collection
    bare = tmp_path / "bare.h5"
    with h5py.File(bare, "w") as f:  # a second shard: items without captions, paths or ids
        f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
        f["image"], f["text"] = c["img"][:30], c["txt"][:30]
    build_index(c["path"], c["ckpt"][0], str(tmp_path / "a"))
    build_index(str(bare), c["ckpt"][0], str(tmp_path / "b"))
    encoder = Encoder(c["ckpt"][0], batch_size=16)
    backends = [("exact", {}), ("mih", {})]
    if importlib.util.find_spec("faiss") is not None:
        backends.append(("faiss-ivf", {"check_recall": True}))
    for index in (open_index(tmp_path / "a"), open_index([tmp_path / "a", tmp_path / "b"])):
        for modality, searched in (("txt", "image"), ("img", "text")):
            queries = read_queries(c["path"], modality, encoder.dims)
            for name, options in backends:
                if name == "faiss-ivf" and isinstance(index, Shards):
                    continue
                options = {"backend": BackendConfig(name, **({"nlist": 2, "nprobe": 1} if name == "faiss-ivf"
                                                             else {})), **options}
                for rerank in (None, "cosine") if name != "faiss-ivf" else (None,):  # 9 found in 20 of 40: not all
                    blocks = search_queries(index, encoder, queries, 5, searched, rerank=rerank, candidates=9,
                                            **options)
                    whole = merged(queries, search_blocks(index, encoder, queries, 5, searched, rerank=rerank,
                                                          candidates=9, block=10 ** 6, **options))
                    assert len(queries) % 16 and len(list(search_blocks(
                        index, encoder, queries, 5, searched, **options))) == -(-len(queries) // 16)
                    for field in dataclasses.fields(whole):
                        a, b = getattr(blocks, field.name), getattr(whole, field.name)
                        if field.name == "seconds":
                            assert a.keys() == b.keys()
                        elif field.name == "served" and a is not None:
                            assert {n: np.asarray(v).tolist() for n, v in a.items()} == \
                                {n: np.asarray(v).tolist() for n, v in b.items()}
                        elif field.name == "recall" and a is not None:  # a mean of means: to a rounding
                            assert a == pytest.approx(b, rel=1e-12)
                        elif isinstance(a, np.ndarray):
                            assert np.array_equal(a, b), field.name
                        elif field.name != "queries":
                            assert a == b, field.name
                    if name == "faiss-ivf":
                        assert 0 < blocks.recall["ids"] < 1, blocks.recall


def test_an_id_of_another_split_of_a_dataset_file_is_said_to_be_another_split_s(tiny_path, tiny):
    """'--ids 300' of a retrieval item said 'no item with id 300 (its 500 ids run from 2 to 999)', a range holding
    300: the query split read by default has gaps, and the id is another split's. Said so, with the flag."""
    from ucmfh.search.collection import read_queries

    retrieval_only = int(np.setdiff1d(tiny.retrieval.ids.numpy(), tiny.query.ids.numpy())[0])
    dims = {"img": tiny.d_img, "txt": tiny.d_txt}
    with pytest.raises(DataError, match=rf"/query/ids: no item with id {retrieval_only} \(its \d+ ids run from \d+ "
                                        r"to \d+, with gaps\); --split retrieval or --split train reads another split$"):
        read_queries(tiny_path, "txt", dims, ids=[retrieval_only])
    assert read_queries(tiny_path, "txt", dims, split="retrieval", ids=[retrieval_only]).ids.tolist() == [retrieval_only]


def test_faiss_flat_gives_the_same_ids(collection):
    faiss = pytest.importorskip("faiss", reason="faiss-cpu not installed (optional extra 'faiss')")
    rng = np.random.default_rng(3)
    r, q = pm1(rng, 3000, 64), pm1(rng, 25, 64)
    r[1000:1020] = r[7]
    index = Index(64)
    index.add("txt", r)
    flat = faiss.IndexBinaryFlat(64)
    flat.add(pack_codes(r))
    for k in (1, 10, 100):
        fd, fi = flat.search(pack_codes(q), k)
        d, p = index.search(q, k, "txt")
        assert np.array_equal(p, fi) and np.array_equal(d, fd)


def test_html_page_renders_in_headless_chromium(collection, tmp_path):
    c = collection
    index = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    encoder = Encoder(c["ckpt"][0])
    queries = read_queries(c["path"], "img", encoder.dims, ids=[101, 102])
    results = search_queries(index, encoder, queries, 3, "text")
    page = write_html(tmp_path / "page.html", results, title="toy <search>")
    text = open(page, encoding="utf-8").read()
    assert text.count("class='meta'") == 6 and text.count("alt='query'") == 2 and "toy &lt;search&gt;" in text and "a caption of image" in text
    assert "2 image queries against text items" in text
    one = read_queries(c["path"], "img", encoder.dims, ids=[101])
    page = write_html(tmp_path / "one.html", search_queries(index, encoder, one, 3, "text"))
    assert "1 image query against text items" in open(page, encoding="utf-8").read()  # '1 image queries'
    chromium = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None)
    if chromium is None:
        pytest.skip("no headless Chromium at /usr/bin/chromium: the page is checked as text only")
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(args + ["--dump-dom", f"file://{page}"], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="meta"') == 6 and "a caption of image" in dom.stdout
    shot = tmp_path / "page.png"
    subprocess.run(args + [f"--screenshot={shot}", "--window-size=900,700", f"file://{page}"],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 2000


def test_the_page_links_images_relative_to_their_collection_file(collection, tmp_path, monkeypatch):
    """A collection's relative image paths ('img/101.jpg') mean its own folder's files: the page links them from
    wherever it is written and whatever folder the search runs in (they were taken relative to the shell's
    folder, so a search run elsewhere linked to nothing); the results still show the paths as stored."""
    c = collection
    index = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    encoder = Encoder(c["ckpt"][0])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    queries = read_queries(c["path"], "txt", encoder.dims, ids=[101])
    results = search_queries(index, encoder, queries, 3, "image")
    assert [os.path.dirname(s) for s in results.shown[0]] == ["img"] * 3
    (tmp_path / "pages").mkdir()
    page = write_html(tmp_path / "pages" / "page.html", results)
    linked = re.findall(r"<img src='([^']*)'", open(page, encoding="utf-8").read())
    folder = os.path.dirname(c["path"])
    shown = [path for hits in results.shown for path in hits]  # the captions of id 101, 3 hits each
    assert len(linked) == len(shown) == 9 and all(os.path.normpath(os.path.join(tmp_path / "pages", src)) ==
                                                  os.path.join(folder, path) for src, path in zip(linked, shown))


def test_an_image_file_not_found_is_said_on_the_page_and_by_the_command(collection, tmp_path):
    """A hit or query whose image file is not there was a broken image on the page, and no command said so."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main
    from ucmfh.search.html import missing_images

    c = collection
    index = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    encoder = Encoder(c["ckpt"][0])
    results = search_queries(index, encoder, read_queries(c["path"], "txt", encoder.dims, ids=[101]), 40, "image")
    lost = os.path.join(c["folder"], "img", "100.jpg")
    assert missing_images(results) == [lost]
    text = open(write_html(tmp_path / "page.html", results), encoding="utf-8").read()
    assert text.count("<img src=") == 117 and text.count(f"<i>image file not found:</i> {lost}</div>") == 3  # 3 queries
    images = read_queries(c["path"], "img", encoder.dims, ids=[100, 101])
    assert missing_images(search_queries(index, encoder, images, 3, "text")) == [lost]  # a query's image
    said = CliRunner().invoke(main, ["search", str(tmp_path / "ix"), "-q", c["path"], "--ids", "101", "-m", "image",
                                     "-k", "40", "--html", str(tmp_path / "p.html")])
    assert said.exit_code == 0 and f"  1 of its image files not found from here (first: {lost}); the page says " \
        "so in their place" in said.output, said.output


def test_an_image_query_without_a_path_is_shown_by_its_paired_text_and_no_text_turns_the_page(collection, tmp_path):
    """An image query of a caption set without image paths (flickr8k1000's) was a heading and nothing more: the
    reader could not judge its hits. Its own item's text says what it is, on the page and in the table. A
    caption's U+202E turned what followed it on the page (the terminal showed it as an escape), and a long word
    ran over the hits beside it."""
    from ucmfh.search.results import result_lines

    c = collection
    path = tmp_path / "no_paths.h5"
    with h5py.File(c["path"]) as src, h5py.File(path, "w") as f:
        for name, value in src.attrs.items():
            f.attrs[name] = value
        f["image"], f["text"], f["ids"] = src["image"][()], src["text"][()], src["ids"][()]
        captions = [f"a caption of image {i}" for i in c["ids"]]
        captions[3] = "a cat \u202egpj.exe"  # id 101's first caption
        f.create_dataset("text_raw", data=captions, dtype=h5py.string_dtype())
    index = build_index(str(path), c["ckpt"][0], str(tmp_path / "ix")).index
    encoder = Encoder(c["ckpt"][0])
    queries = read_queries(str(path), "img", encoder.dims, ids=[100, 101])
    assert queries.paths is None and queries.paired_text == ["a caption of image 100", "a cat \u202egpj.exe"]
    results = search_queries(index, encoder, queries, 3, "text")
    text = open(write_html(tmp_path / "page.html", results), encoding="utf-8").read()
    assert "<p class='qtext'><i>its paired text:</i> a caption of image 100</p>" in text
    assert "a cat \\u202egpj.exe" in text and "\u202e" not in text  # as the terminal writes it
    assert "overflow-wrap: anywhere" in text and "<html lang='en'>" in text
    table = "\n".join(result_lines(results))
    assert "query 0 (id 100): its paired text: a caption of image 100  [image -> text]" in table
    assert "query 1 (id 101): its paired text: a cat \\u202egpj.exe" in table


def test_an_image_path_links_to_its_file_and_never_to_another_url(tmp_path):
    """A collection's image paths are the user's data: 'javascript:alert(1)', 'data:text/html,…' and
    'http:/host/x.png' became live links of the page (an audit's), 'a%20b.jpg' and 'q?x=1#f.jpg' links to other
    files. Each is now a link to the file of that name, beside the page."""
    from urllib.parse import unquote, urljoin

    from ucmfh.search.html import _src

    page_dir = str(tmp_path)
    for name in ("javascript:alert(1)", "data:text/html,<script>alert(1)</script>", "http:/evil.example/t.png",
                 "a%20b.jpg", "q?x=1#frag.jpg", "caf\u00e9 'quoted'.jpg", "img/101.jpg"):
        src = _src(os.path.join(page_dir, name), page_dir)
        resolved = urljoin(f"file://{page_dir}/page.html", src)  # as a browser reads the link
        assert resolved.startswith(f"file://{page_dir}/") and unquote(resolved[len("file://"):]) == \
            os.path.join(page_dir, name), (name, src, resolved)


def test_features_become_codes_by_the_encoder_as_docs_search_shows(collection, tmp_path):
    """The Python snippet of docs/search.md, raw features -> Encoder -> Index.search, finds what a
    search of the index 'ucmfh index' builds finds."""
    from ucmfh.search import Encoder as Exported

    c = collection
    encoder = Exported(c["ckpt"][0])
    index = Index(n_bits=encoder.n_bits)
    index.add("txt", encoder.encode(c["txt"], "txt"), ids=c["ids"])
    queries = encoder.encode(c["img"][::3], "img")
    built = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index
    assert Exported is Encoder
    assert np.array_equal(index.search(queries, k=5, modality="txt")[1], built.search(queries, k=5, modality="txt")[1])


def test_the_encoder_takes_torch_features_and_refuses_other_widths_and_nan(collection):
    """A library user's features: a tensor encodes as its array does; the other modality's features, or NaN,
    are one line naming the problem (they were torch's matmul error, and NaN codes read as set bits)."""
    c = collection
    encoder = Encoder(c["ckpt"][0])
    assert np.array_equal(encoder.encode(torch.from_numpy(c["img"][:4]), "img"), encoder.encode(c["img"][:4], "img"))
    with pytest.raises(DataError, match=r"features: \d+-d text features, the checkpoint .* takes \d+-d"):
        encoder.encode(c["img"][:4], "txt")
    broken = c["txt"][:4].copy()
    broken[1, 0] = np.nan
    with pytest.raises(DataError, match="text features must be finite floating-point numbers, got float32 with NaN"):
        encoder.encode(broken, "txt")
    # one vector is one item, as the command line takes one query vector; a 3-D array is named by its shape
    assert np.array_equal(encoder.encode(c["img"][2], "img"), encoder.encode(c["img"][2:3], "img"))
    with pytest.raises(DataError, match=r"^features: expected image features \[N, 12\] \(one vector: \[12\]\), got "
                                        r"shape \(1, 4, 12\)$"):
        encoder.encode(c["img"][None, :4], "img")


# ------------------------------------------------------- one item once, one extraction, one backend name


def split_file(c, path, **attrs):
    """``c``'s collection as a dataset file: query (ids 100..109), retrieval (ids 110..139) and train, the
    retrieval items again (the field's standard: train drawn from retrieval)."""
    with h5py.File(path, "w") as f:
        f.attrs["image_feature"] = attrs.get("image_feature", "toy image features")
        f.attrs["text_feature"] = "toy text features"
        for group, rows in (("query", slice(0, 30)), ("retrieval", slice(30, 120)), ("train", slice(30, 120))):
            f[f"{group}/image"], f[f"{group}/text"], f[f"{group}/ids"] = c["img"][rows], c["txt"][rows], c["ids"][rows]
    return str(path)


def test_one_index_folder_named_twice_is_refused(collection, tmp_path, monkeypatch):
    """IDX twice, IDX and IDX/, a relative and an absolute path: one folder, whose hits would all come twice."""
    c = collection
    path = build_index(c["path"], c["ckpt"][0], str(tmp_path / "ix")).index.path
    monkeypatch.chdir(tmp_path)
    for spellings in ([path, path], [path, path + "/"], ["ix", path], [path, "./ix/"]):
        with pytest.raises(ValueError) as err:
            open_index(spellings)
        assert str(err.value) == (f"{path}: index folder named twice (as '{spellings[0]}' and '{spellings[1]}'); "
                                  "its items would be searched twice and every hit returned twice")
    index = Index.load(path)
    with pytest.raises(ValueError, match="given twice"):
        Shards([index, Index.load(path + "/")])
    with pytest.raises(ValueError, match="given twice"):
        Shards([index, index])
    # two folders of different groups searched as one: every item once, as in one index of both
    dataset = split_file(c, tmp_path / "split.h5")
    build_index(dataset, c["ckpt"][0], str(tmp_path / "q"), splits=["query"])
    build_index(dataset, c["ckpt"][0], str(tmp_path / "r"), splits=["retrieval"])
    whole = build_index(dataset, c["ckpt"][0], str(tmp_path / "both")).index
    shards = open_index([str(tmp_path / "q"), str(tmp_path / "r")])
    queries = Encoder(c["ckpt"][0]).encode(c["img"][::3], "img")
    d, p = shards.search(queries, 120, "txt")
    assert p.shape == (40, 120) and sorted(shards.take("txt", "ids", p[0])) == sorted(c["ids"])
    assert np.array_equal(p, whole.search(queries, 120, "txt")[1]) and np.array_equal(d, whole.search(queries, 120, "txt")[0])
    # two folders holding a group of one collection (by content, wherever the file is): refused, not every hit twice
    shutil.copy(dataset, tmp_path / "copy.h5")
    build_index(str(tmp_path / "copy.h5"), c["ckpt"][0], str(tmp_path / "again"), splits=["retrieval"])
    for folders, group in ((["both", "r"], "/retrieval"), (["r", "again"], "/retrieval"), (["q", "both"], "/query")):
        with pytest.raises(ValueError) as err:
            open_index([str(tmp_path / f) for f in folders])
        assert str(err.value).startswith(f"{tmp_path / folders[1]}: holds the items of ") and str(err.value).endswith(
            f"{group}, as {tmp_path / folders[0]} does; searched as one, every hit of them would be returned twice")


def test_indexes_searched_as_one_share_checkpoint_bits_and_extractors(collection, tmp_path):
    """Every folder is checked, not the first alone: a second one of another extraction is refused, naming
    both folders and showing where the descriptions differ (they share a long beginning)."""
    c = collection
    long = "a long description of the image extractor, its weights, preprocessing and pooling, " * 2
    a = split_file(c, tmp_path / "a.h5", image_feature=long + "L2-normalised")
    b = split_file(c, tmp_path / "b.h5", image_feature=long + "not normalised")
    build_index(a, c["ckpt"][0], str(tmp_path / "A"))
    build_index(b, c["ckpt"][0], str(tmp_path / "B"))
    build_index(a, c["ckpt"][1], str(tmp_path / "C"))  # another checkpoint
    with pytest.raises(DataError) as err:
        open_index([str(tmp_path / "A"), str(tmp_path / "B")])
    assert str(err.value) == (f"{tmp_path / 'B'}: its image features were made by '…preprocessing and pooling, not normalised', but "
                              f"those of {tmp_path / 'A'} by '…preprocessing and pooling, L2-normalised'; indexes searched as one "
                              "must share their extractors")
    with pytest.raises(DataError, match=f"{tmp_path / 'C'}: was made by another checkpoint than {tmp_path / 'A'}"):
        open_index([str(tmp_path / "A"), str(tmp_path / "C")])
    with pytest.raises(DataError, match=f"{tmp_path / 'C'}: was made by another checkpoint than {tmp_path / 'A'}"):
        open_index([str(tmp_path / "A"), str(tmp_path / "A"), str(tmp_path / "C")][::2])
    # a shard recording no extractor takes the others': queries of another extractor are refused for all
    bare = Index(24, {"checkpoint": Index.load(tmp_path / "A").meta["checkpoint"]})
    bare.add("img", pm1(np.random.default_rng(0), 3, 24))
    shards = Shards([bare, Index.load(tmp_path / "B")])
    queries = read_queries(b, "img", Encoder(c["ckpt"][0]).dims)
    queries.feature = long + "L2-normalised"
    with pytest.raises(DataError, match="its image features were made by '…preprocessing and pooling, L2-normalised', but the "
                                        "index's by '…preprocessing and pooling, not normalised'"):
        search_queries(shards, Encoder(c["ckpt"][0]), queries, 3, "img")


def test_a_group_indexed_already_is_never_added_again(collection, tmp_path):
    """Whatever groups a later build names (--split query, --split train, both defaults), the index holds each
    item of the collection once; only really new groups are added."""
    c = collection
    dataset = split_file(c, tmp_path / "split.h5")
    ck = c["ckpt"][0]
    whole = tmp_path / "whole"
    first = build_index(dataset, ck, str(whole))
    assert first.added == {"img": 40, "txt": 120} and first.skipped == {}
    with h5py.File(dataset, "r") as f:
        n = {split: len(f[split]["text"]) for split in ("train", "query", "retrieval")}
    # the rows each build asked for, each item once: train named with retrieval is counted by retrieval
    rows = {None: n["query"] + n["retrieval"], "query": n["query"], "train": n["train"], "/retrieval/": n["retrieval"],
            "query,train": n["query"] + n["train"], "train,retrieval": n["retrieval"]}
    for splits in (None, ["query"], ["train"], ["/retrieval/"], ["query", "train"], ["train", "retrieval"]):
        again = build_index(dataset, ck, str(whole), splits=splits)
        assert again.already and again.added == {"img": 0, "txt": 0}, splits
        assert again.rows == rows[",".join(splits) if splits else None], splits
        assert Index.load(whole).count("txt") == 120 and Index.load(whole).count("img") == 40
    assert build_index(dataset, ck, str(whole), splits=["train"]).skipped == {"/train": "/retrieval"}
    assert build_index(dataset, ck, str(whole), splits=["query"]).skipped == {"/query": "/query"}
    # a byte-identical copy is the same collection
    shutil.copy(dataset, tmp_path / "copy.h5")
    assert build_index(str(tmp_path / "copy.h5"), ck, str(whole)).already
    # query first, then the default: only retrieval is added, and the index equals the one-build one
    grown = tmp_path / "grown"
    assert build_index(dataset, ck, str(grown), splits=["query"]).added == {"img": 10, "txt": 30}
    more = build_index(dataset, ck, str(grown))
    assert more.skipped == {"/query": "/query"} and more.added == {"img": 30, "txt": 90} and not more.already
    for name in ("img.codes", "img.ids", "txt.codes", "txt.ids"):
        assert (grown / name).read_bytes() == (whole / name).read_bytes(), name
    # train and retrieval named together: train's items come once, by retrieval
    both = build_index(dataset, ck, str(tmp_path / "both"), splits=["train", "retrieval"])
    assert both.skipped == {"/train": "/retrieval"} and both.added == {"img": 30, "txt": 90}
    # train indexed first: retrieval would add its items again, and is refused; query alone is added
    trained = tmp_path / "trained"
    build_index(dataset, ck, str(trained), splits=["train"])
    with pytest.raises(DataError, match=r"split.h5: /retrieval holds the items of /train \(a dataset file's train "
                                        r"split is drawn from its retrieval split\), which .*trained holds already"):
        build_index(dataset, ck, str(trained))
    assert Index.load(trained).count("txt") == 90
    assert build_index(dataset, ck, str(trained), splits=["query"]).added == {"img": 10, "txt": 30}
    # another build of the file, interrupted: finished by its own call, not doubled by another
    cut = tmp_path / "cut"
    build_index(dataset, ck, str(cut), chunk_size=20, stop_after=1)
    with pytest.raises(DataError, match=r"cut: its build of /query, /retrieval from .*split.h5 is at row 20 of "
                                        r"120 \(interrupted, or under way in another process\)"):
        build_index(dataset, ck, str(cut), splits=["query"])
    assert build_index(dataset, ck, str(cut), chunk_size=20).resumed_at == 20
    assert np.array_equal(np.sort(Index.load(cut).ids("txt")), np.sort(c["ids"]))
    # interrupted, then the file changed: the build was taken for a new one (every item added again) and the
    # unfinished one stayed, each search sending the user back to the command that said "already indexed"
    changed = tmp_path / "changed"
    build_index(dataset, ck, str(changed), chunk_size=20, stop_after=1)
    with h5py.File(dataset, "a") as f:  # a caption's text (an image's rows must hold one image: validate)
        f["query/text"][0] = f["query/text"][0] + 1.0
    before = Index.load(changed).count("txt")
    with pytest.raises(DataError, match=r"changed: its build from .*split.h5 stopped at row 20 of 120 \(interrupted\), "
                                        r"and the file has changed since: that build cannot be finished"):
        build_index(dataset, ck, str(changed), chunk_size=20)
    assert Index.load(changed).count("txt") == before


def test_nothing_is_added_between_an_interrupted_build_and_the_rest_of_it(collection, tmp_path):
    """Another collection added while a build is interrupted put its rows between that build's first rows and
    the rest: positions, and so the order of every tie, then differed from the uninterrupted builds'. It is
    refused until the interrupted build is finished; then the index is the one of the two builds in turn."""
    c = collection
    other = tmp_path / "other.h5"
    shutil.copy(c["path"], other)
    with h5py.File(other, "a") as f:
        f["ids"][...] = f["ids"][:] + 1000
    cut, straight = tmp_path / "cut", tmp_path / "straight"
    build_index(c["path"], c["ckpt"][0], str(cut), chunk_size=7, stop_after=1)
    with pytest.raises(DataError, match=r"cut: its build of / from .* is at row 7 of \d+ \(interrupted, or under "
                                        r"way in another process\); let that build finish first"):
        build_index(str(other), c["ckpt"][0], str(cut), chunk_size=7)
    assert build_index(c["path"], c["ckpt"][0], str(cut), chunk_size=7).resumed_at == 7
    build_index(str(other), c["ckpt"][0], str(cut), chunk_size=7)
    for path in (c["path"], str(other)):
        build_index(path, c["ckpt"][0], str(straight), chunk_size=7)
    for name in ("img.codes", "img.ids", "txt.codes", "txt.ids"):
        assert (cut / name).read_bytes() == (straight / name).read_bytes(), name


def test_a_build_refused_part_way_leaves_the_index_as_it_was(collection, tmp_path):
    """A collection refused at a later chunk (NaN features at row 37) left the index 'unfinished' for good: its
    own command failed again, and a mended file was another build. Now the index is rolled back (a new one is
    not created, an empty folder made for it left empty), searchable, and the mended file is added; a
    collection lacking the index's paths is refused before anything is added, naming the file and what it
    lacks."""
    c = collection
    out = tmp_path / "ix"
    build_index(c["path"], c["ckpt"][0], str(out))
    manifest = json.loads((out / "index.json").read_text())
    late, empty = tmp_path / "late.h5", tmp_path / "empty"
    shutil.copy(c["path"], late)
    with h5py.File(late, "a") as f:
        f["ids"][...] = f["ids"][:] + 1000
    _set_image(late, 37, np.nan)
    empty.mkdir()
    for target, left in ((out, "left as it was before this build"), (tmp_path / "new", "not created"),
                         (empty, "not created")):
        with pytest.raises(DataError, match=r"late.h5: /image: 1 non-finite values in rows 35..41 \(first: NaN at "
                                            rf"row 37, column 3\) \({target}: {left}\)$"):
            build_index(str(late), c["ckpt"][0], str(target), chunk_size=7)
    assert not (tmp_path / "new").exists() and empty.is_dir() and not os.listdir(empty)
    index = Index.load(out)
    index.check_finished()
    assert json.loads((out / "index.json").read_text()) == manifest
    _set_image(late, 37, c["img"][37, 3])  # mended: the image of its id's other rows again
    assert build_index(str(late), c["ckpt"][0], str(out), chunk_size=7).added == {"img": 40, "txt": 120}
    assert np.array_equal(Index.load(out).ids("txt"), np.concatenate([c["ids"], c["ids"] + 1000]))
    assert build_index(str(late), c["ckpt"][0], str(empty)).added == {"img": 40, "txt": 120}
    bare = tmp_path / "bare.h5"
    with h5py.File(bare, "w") as f:
        f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
        f["image"], f["text"], f["ids"] = c["img"], c["txt"], c["ids"] + 2000
    with pytest.raises(DataError, match=r"bare.h5: has no /paths \(image files\), which the image items of .*ix "
                                        r"have: every collection in an index gives the same columns"):
        build_index(str(bare), c["ckpt"][0], str(out))
    assert Index.load(out).count("txt") == 240 and not Index.load(out).unfinished()


def _set_image(path, row, value):
    with h5py.File(path, "a") as f:
        image = f["image"][:]
        image[row, 3] = value
        f["image"][...] = image


def test_a_collection_file_grown_since_it_was_indexed_is_not_indexed_twice(collection, tmp_path):
    """A file indexed, then grown by new rows, was another collection to the index: every item it held went in
    twice. It is refused, naming the first id held already; the same file name holding new items only (a
    day's batch) is added. Negative ids ('unknown') would make one image of all their rows: refused."""
    c = collection

    def write(path, rows, ids):
        with h5py.File(path, "w") as f:
            f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
            f["image"], f["text"], f["ids"] = c["img"][rows], c["txt"][rows], ids

    out, batch = tmp_path / "ix", tmp_path / "batch.h5"
    write(batch, slice(0, 60), c["ids"][:60])
    build_index(str(batch), c["ckpt"][0], str(out))
    write(batch, slice(0, 120), c["ids"])  # grown: the first 60 rows again, 60 new
    with pytest.raises(DataError, match=r"batch.h5: built into .*ix before, and changed since: 60 of its 120 rows have "
                                        r"ids .*ix holds already \(first: id 100 at row 0\); adding it would index "
                                        r"those items twice"):
        build_index(str(batch), c["ckpt"][0], str(out))
    write(batch, slice(60, 120), c["ids"][60:])  # the new rows alone, under the same name
    assert build_index(str(batch), c["ckpt"][0], str(out)).added == {"img": 20, "txt": 60}
    assert np.array_equal(Index.load(out).ids("txt"), c["ids"])
    write(tmp_path / "none.h5", slice(0, 0), c["ids"][:0])  # no rows: refused, not 'already indexed (0 rows)'
    with pytest.raises(DataError, match=r"none.h5: /: no rows$"):
        build_index(str(tmp_path / "none.h5"), c["ckpt"][0], str(tmp_path / "empty"))
    unknown = c["ids"].copy()
    unknown[90:] = -1
    write(tmp_path / "unknown.h5", slice(0, 120), unknown)
    with pytest.raises(DataError, match=r"unknown.h5: /ids: 30 negative ids \(first at row 90\); ids must be >= 0"):
        build_index(str(tmp_path / "unknown.h5"), c["ckpt"][0], str(tmp_path / "other"))


def test_items_of_collections_without_ids_never_share_an_id(collection, tmp_path):
    """Rows without ids are items of their own, numbered after the index's largest id: a second file's, or
    a later build's of one file, never take ids the index holds (each file's rows were numbered from 0, and a
    search listed two items as one id). The first build numbers from 0; a resumed build goes on with its
    number; one file built in two builds equals one build; a grown file is still refused."""
    c = collection

    def write(path, rows):
        with h5py.File(path, "w") as f:
            f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
            f["image"], f["text"] = c["img"][rows], c["txt"][rows]
        return str(path)

    a, b = write(tmp_path / "a.h5", slice(0, 60)), write(tmp_path / "b.h5", slice(60, 120))
    out = tmp_path / "ix"
    build_index(a, c["ckpt"][0], str(out))
    killed = build_index(b, c["ckpt"][0], str(out), chunk_size=7, stop_after=2)
    assert killed.index.count("txt") == 74
    build_index(b, c["ckpt"][0], str(out), chunk_size=7)  # resumed: the number its start recorded
    index = Index.load(out)
    for modality in ("img", "txt"):  # every row an item: images too
        assert np.array_equal(index.ids(modality), np.arange(120)), modality
    _, positions = index.search(index.codes("txt")[:5], 120, "img")
    assert all(len(set(index.ids("img")[row])) == 120 for row in positions)
    assert [s["first_id"] for s in index.sources] == [0, 60]
    # the two files' rows in one file, built in one build: the same ids
    whole = build_index(write(tmp_path / "whole.h5", slice(0, 120)), c["ckpt"][0], str(tmp_path / "one")).index
    assert np.array_equal(whole.ids("txt"), index.ids("txt"))
    # b grown by rows of its own: the first 60 are items the index holds (ids 60..119), refused
    write(b, slice(60, 120 + 0))
    with h5py.File(b, "a") as f:
        f.attrs["name"] = "b, changed"
    with pytest.raises(DataError, match=r"b.h5: built into .*ix before, and changed since: 60 of its 60 rows have ids "
                                        r".*ix holds already \(first: id 60 at row 0\)"):
        build_index(b, c["ckpt"][0], str(out))


def test_shards_show_the_captions_they_hold_and_name_each_hit_s_index(collection, tmp_path):
    """A shard without captions searched beside one with them dropped every hit's caption; and shards built from
    files without ids number their items alike, so a hit's id did not say which item it was (an audit's finds):
    the hits of the shard with captions keep them, and every row names its index folder."""
    c = collection
    bare = tmp_path / "bare.h5"
    with h5py.File(bare, "w") as f:  # items without captions, paths or ids: numbered from 0 in their index
        f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
        f["image"], f["text"] = c["img"][:30], c["txt"][:30]
    a, b = build_index(c["path"], c["ckpt"][0], str(tmp_path / "a")), build_index(str(bare), c["ckpt"][0],
                                                                                  str(tmp_path / "b"))
    shards = open_index([tmp_path / "a", tmp_path / "b"])
    encoder = Encoder(c["ckpt"][0])
    queries = read_queries(c["path"], "img", encoder.dims, ids=[101])
    results = search_queries(shards, encoder, queries, 150, "text")
    [rows] = list(result_rows(results))
    assert len(rows) == 150
    for row in rows:
        own = row["position"] < 120  # a's 120 captions, then b's 30
        assert row["index"] == str(tmp_path / ("a" if own else "b"))
        assert ("text" in row) == own and (not own or row["text"] == f"a caption of image {row['id']}")
    images = search_queries(shards, encoder, read_queries(c["path"], "txt", encoder.dims, ids=[101]), 70, "image")
    for row, file in zip(next(result_rows(images)), images.files[0]):  # a's 40 images and their files, then b's 30
        own = row["position"] < 40
        assert ("path" in row) == own and (file is not None) == own and (not own or file.endswith(row["path"]))
    alone = search_queries(open_index(tmp_path / "b"), encoder, queries, 5, "text")
    assert alone.shards is None and "index" not in next(result_rows(alone))[0]
    assert a.added["txt"] == 120 and b.added["txt"] == 30


def test_rows_without_ids_past_the_largest_id_are_refused_before_the_build_starts(collection, tmp_path):
    """Numbered after an id near 2**63 - 1, a file's rows without ids overflowed: a traceback, and the index left
    unfinished for good, every later build and search refused (an audit's find). Refused before anything is
    recorded: the index is as it was."""
    c = collection

    def write(path, rows, ids=None):
        with h5py.File(path, "w") as f:
            f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
            f["image"], f["text"] = c["img"][rows], c["txt"][rows]
            if ids is not None:
                f["ids"] = ids
        return str(path)

    out = tmp_path / "ix"
    build_index(write(tmp_path / "a.h5", slice(0, 3), ids=np.array([0, 1, 2**63 - 1])), c["ckpt"][0], str(out))
    before = (out / "index.json").read_text()
    for n in (1, 10):
        with pytest.raises(DataError, match=r"b.h5: its \d+ rows have no ids, and numbered after .*ix's largest id "
                                            r"\(9223372036854775807\) they would pass the largest an id may be"):
            build_index(write(tmp_path / "b.h5", slice(3, 3 + n)), c["ckpt"][0], str(out))
    assert (out / "index.json").read_text() == before and not Index.load(out).unfinished()


def test_search_takes_a_backend_name_as_faiss_users_write_it():
    from ucmfh.config import BackendConfig

    rng = np.random.default_rng(2)
    r, q = pm1(rng, 500, 32), pm1(rng, 9, 32)
    index = Index(32)
    index.add("txt", r)
    want = index.search(q, 7, "txt")
    for backend in ("mih", "exact", BackendConfig(backend="mih"), None):
        got = index.search(q, 7, "txt", backend=backend)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), backend
    half = Index(32)
    half.add("txt", r[:250])
    rest = Index(32)
    rest.add("txt", r[250:])
    assert np.array_equal(Shards([half, rest]).search(q, 7, "txt", backend="mih")[1], want[1])
    with pytest.raises(ValueError, match=r"backend must be one of \('exact', 'mih', 'faiss-ivf', 'faiss-hnsw'\), "
                                         r"got 'MIH'"):
        index.search(q, 7, "txt", backend="MIH")
    with pytest.raises(TypeError, match=r"backend must be a name \(exact, mih, faiss-ivf, faiss-hnsw\) or a "
                                        r"BackendConfig, got dict"):
        index.search(q, 7, "txt", backend={"backend": "mih"})


def test_queries_that_could_be_either_modality_name_the_flag_that_says_which(tmp_path, tiny_path):
    """CLIP's image and text features are both 512-d: an .npy of queries fits either, and a dataset file holds
    both. The refusal names --query-modality, where the command has it (and only there)."""
    from ucmfh.app.errors import describe
    from ucmfh.search.collection import read_queries

    queries = tmp_path / "q.npy"
    np.save(queries, np.ones((2, 48), dtype=np.float32))
    for path, split in ((str(queries), None), (tiny_path, "query")):
        with pytest.raises(DataError) as refused:
            read_queries(path, None, {"img": 48, "txt": 48}, split=split)
        said = describe(refused.value, options={"--query-modality"})
        assert said.endswith("; use --query-modality image|text to say which"), said
        assert "--query-modality" not in describe(refused.value, options=set())


def test_a_manifest_with_a_negative_count_is_refused_in_one_line(tmp_path):
    """A tampered index.json with a count below 0 was an OverflowError from the memory map."""
    index = Index(16)
    index.add("txt", pm1(np.random.default_rng(0), 20, 16))
    index.save(tmp_path / "ix")
    manifest = json.loads((tmp_path / "ix" / "index.json").read_text())
    manifest["modalities"]["txt"]["count"] = -5
    (tmp_path / "ix" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"index.json: modalities.txt.count is -5, not a count of items"):
        Index.load(tmp_path / "ix")


def test_an_npy_of_no_queries_is_refused(tmp_path):
    """A [0, d] array searched 'successfully': 0 queries, exit 0."""
    np.save(tmp_path / "q.npy", np.zeros((0, 48), dtype=np.float32))
    with pytest.raises(DataError, match=r"q.npy: no queries \(0 rows\)"):
        read_queries(str(tmp_path / "q.npy"), "txt", {"img": 48, "txt": 32})


def test_an_id_of_several_images_and_labels_of_other_values_are_refused_and_the_index_left(collection, tmp_path):
    """A flat collection whose ids group several images (an album's id, say): one image of each id was indexed
    and the others dropped without a word; refused as a dataset file's are, with chunks read before the refusal
    undone, also where the id's rows lie in two chunks. Labels of other values than 0 and 1 were read as 'not
    zero' (0.5 a label), and labels of strings were a traceback: refused, the index as it was."""
    c = collection

    def write(path, ids, labels=None):
        with h5py.File(path, "w") as f:
            f.attrs["image_feature"], f.attrs["text_feature"] = "toy image features", "toy text features"
            f["image"], f["text"], f["ids"] = c["img"], c["txt"], ids
            if labels is not None:
                f["labels"] = labels
        return str(path)

    albums = c["ids"] // 4 * 4  # the rows of images 100-103 under id 100, ...: rows 0 and 3 share id 100
    for chunk_size in (7, 3):  # rows 0 and 3 in one chunk, then in two
        with pytest.raises(DataError, match=r"albums.h5: /image: rows 0 and 3 share id 100 but hold different image "
                                            r"features; rows sharing an id are one image, indexed once: give each "
                                            r"image an id of its own \(.*ix: not created\)$"):
            build_index(write(tmp_path / "albums.h5", albums), c["ckpt"][0], str(tmp_path / "ix"),
                        chunk_size=chunk_size)
        assert not (tmp_path / "ix").exists()
    labels = np.zeros((len(c["ids"]), 2), np.float32)
    labels[:, 0] = 1
    labels[50, 1] = 0.5
    with pytest.raises(DataError, match=r"halves.h5: /labels: labels must be multi-hot 0/1 values \(row 50 has 0.5\)"):
        build_index(write(tmp_path / "halves.h5", c["ids"], labels), c["ckpt"][0], str(tmp_path / "ix"), chunk_size=7)
    assert not (tmp_path / "ix").exists()
    with pytest.raises(DataError, match=r"words.h5: /labels: labels must be multi-hot 0/1 numbers, got \|S1"):
        build_index(write(tmp_path / "words.h5", c["ids"], labels.astype("S1")), c["ckpt"][0], str(tmp_path / "ix"))
    assert build_index(write(tmp_path / "right.h5", c["ids"], (labels == 1).astype(np.uint8)), c["ckpt"][0],
                       str(tmp_path / "ix")).added == {"img": 40, "txt": 120}


def test_the_exported_scan_and_encoder_refuse_what_index_search_refuses(collection):
    """hamming_search took k = -1 (numpy's 'negative dimensions'), 0 (lists of nothing) and ±1 codes ('expected
    2560 bytes'); Encoder took batch_size 0 (range()'s error at the first encode): an API audit's finds."""
    from ucmfh.search import as_words, hamming_search

    rng = np.random.default_rng(1)
    codes = np.where(rng.random((6, 24)) > 0.5, 1.0, -1.0)
    words = as_words(codes, 24)
    for k, error in ((-1, ValueError), (0, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"k must be"):
            hamming_search(words, words, 24, k)
    with pytest.raises(ValueError, match=r"query words: expected uint64 \[N, W\] \(ucmfh.search.as_words"):
        hamming_search(codes, words, 24, 3)
    distances, positions = hamming_search(words, words, 24, 3)
    assert distances.shape == (6, 3) and (distances[:, 0] == 0).all()
    with pytest.raises(ValueError, match=r"batch_size must be a whole number >= 1, got 0"):
        Encoder(collection["ckpt"][0], batch_size=0)


def test_an_image_hit_without_a_path_is_shown_by_a_text_of_its_id(collection, tmp_path):
    """Text -> image search of a set that keeps no image paths (Flickr8k's features alone) showed each hit as an
    empty line and an empty box on the page. A hit is shown by the first text of its id in the index (a caption of
    that image), in the table, the JSON rows and the page; an index with paths shows them, and shards (whose ids
    are each one's own) show nothing of the kind."""
    c = collection
    bare = tmp_path / "bare.h5"
    with h5py.File(c["path"]) as f, h5py.File(bare, "w") as g:
        for name in ("image", "text", "ids", "text_raw"):
            g[name] = f[name][()]
        g.attrs.update(dict(f.attrs))
    encoder = Encoder(c["ckpt"][0])
    index = build_index(str(bare), c["ckpt"][0], str(tmp_path / "ix")).index
    queries = read_queries(c["path"], "txt", encoder.dims, ids=[101, 130])
    results = search_queries(index, encoder, queries, 5, "image")
    assert all(shown is None for row in results.shown for shown in row)
    assert results.described == [[f"a caption of image {i}" for i in row] for row in results.ids.tolist()]
    rows = [row for query in result_rows(results) for row in query]
    assert [row["text_of_id"] for row in rows] == [f"a caption of image {row['id']}" for row in rows]
    from ucmfh.search.results import result_lines

    table = "\n".join(result_lines(results))
    assert "a text of its id (the index keeps no image path)" in table and "a caption of image 101" in table
    page = write_html(str(tmp_path / "p.html"), results)
    assert open(page).read().count("<i>a text of its id:</i> a caption of image") == results.positions.size
    with_paths = search_queries(build_index(c["path"], c["ckpt"][0], str(tmp_path / "full")).index, encoder,
                                queries, 5, "image")
    assert with_paths.described is None and with_paths.shown[0][0].startswith("img/")
    shards = open_index([str(tmp_path / "ix"), str(tmp_path / "full")])
    assert search_queries(shards, encoder, queries, 5, "image").described is None
