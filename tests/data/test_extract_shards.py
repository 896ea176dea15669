"""Sharded extraction: shards compute disjoint chunks, resume their own, and a merge writes the unsharded file."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("PIL.Image", reason="pillow is not installed (pip install 'ucmfh[extract]')")

from test_data_errors import user_error
from test_extract import SIZES, FakeEncoder, make_images, tiny_clip, write_inputs  # noqa: F401 - a fixture
from ucmfh.data import DataError
from ucmfh.data.extract import ExtractConfig, extract_features
from ucmfh.data.scratch import Scratch, chunks, gather_chunks, parse_shard

CFG = ExtractConfig(batch_size=2, chunk_items=2, workers=1)  # 7 images: 4 chunks; 14 captions: 7 chunks


def file_content(path):
    """Every dataset and attribute of an HDF5 file, for equality; image paths (``paths``, relative to the file's
    folder) as the files they name."""
    content = {}
    with h5py.File(path, "r") as f:
        content["/"] = dict(f.attrs)
        f.visititems(lambda name, obj: content.__setitem__(name, obj[()] if isinstance(obj, h5py.Dataset) else None))
    for name in [name for name in content if name.endswith("/paths")]:
        content[name] = np.array([os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), p.decode()))
                                  for p in content[name]])
    return content


def assert_same_file(a, b):
    """Same datasets, values and attributes (files of one name: the name is an attribute)."""
    ca, cb = file_content(a), file_content(b)
    assert ca.keys() == cb.keys() and ca["/"].keys() == cb["/"].keys()
    for key in ca["/"]:
        np.testing.assert_array_equal(ca["/"][key], cb["/"][key], err_msg=f"attribute {key}")
    for key in set(ca) - {"/"}:
        np.testing.assert_array_equal(ca[key], cb[key], err_msg=key)


def reference(tmp_path, name="set.h5"):
    (tmp_path / "ref").mkdir(exist_ok=True)
    return tmp_path / "ref" / name


@pytest.fixture
def inputs(tmp_path):
    names = make_images(tmp_path / "imgs")
    caps, labels = write_inputs(tmp_path, names)
    return tmp_path / "imgs", caps, labels


def extract(inputs, out, **kwargs):
    kwargs.setdefault("encoder", FakeEncoder())
    return extract_features(*inputs, out, sizes=SIZES, config=CFG, progress=False, **kwargs)


def test_another_extraction_of_one_out_under_way_is_refused_and_a_removed_scratch_is_not_written_anew(tmp_path,
                                                                                                      inputs):
    """Two extractions of one OUT at once (a second terminal; a --restart of other captions): one's restart or end
    removed the scratch under the other, whose next chunk made it anew, and a file was written whose captions had
    the features of other captions (an audit's). One extraction of an OUT at a time, shards beside each other."""
    from ucmfh.files import locked

    out, parts = tmp_path / "set.h5", str(tmp_path / "set.h5.parts")
    with locked(parts, hidden=True, shared=True):  # a shard under way
        with pytest.raises(DataError, match=r"set\.h5\.parts: another extraction of .*set\.h5 is under way now \(in "
                                            r"another process\); let it finish, or extract into another OUT$"):
            extract(inputs, out, restart=True)
        assert extract(inputs, out, shard=(1, 2)).path is None  # a shard beside it
        with pytest.raises(DataError, match="another extraction of"):
            extract(inputs, out, merge=True)
    assert extract(inputs, out, shard=(0, 2)).path is None
    # the folder removed under a run: its next chunk is refused, not written into a folder made anew
    scratch = Scratch(str(tmp_path / "other.h5.parts"), "key", str(tmp_path / "other.h5"))
    os.remove(tmp_path / "other.h5.parts" / "manifest.json")
    with pytest.raises(DataError, match=r"parts: removed while this extraction wrote into it \(by another "
                                        r"extraction of the same OUT, one that restarted or finished\); run it "
                                        r"again$"):
        scratch.save("image", 0, np.zeros((2, 3), np.float32), np.ones(2, bool))
    os.remove(os.path.join(parts, "manifest.json"))  # the chunks of the shards, of nothing said
    with pytest.raises(DataError, match=r"parts: chunks without a manifest \(an extraction's, whose folder was removed "
                                        r"under it\): of what, nothing says"):
        extract(inputs, out)


def test_shards_killed_and_resumed_merge_into_the_unsharded_file(tmp_path, inputs):
    ref = extract(inputs, reference(tmp_path))
    out, parts = tmp_path / "set.h5", tmp_path / "set.h5.parts"
    first = extract(inputs, out, shard=(0, 3))
    # shard 0 of 3: image chunks 0, 3 and text chunks 0, 3, 6; nothing written but its chunks and marker
    assert first.path is None and first.chunks_computed == 5 and not out.exists()
    assert sorted(p.name for p in parts.iterdir() if p.suffix == ".npz") == [
        "image-000000.npz", "image-000003.npz", "text-000000.npz", "text-000003.npz", "text-000006.npz"]
    extract(inputs, out, shard=(2, 3))
    with pytest.raises(DataError, match=r"set\.h5\.parts: cannot merge, shard 1/3 not done \(image chunks 1; "
                                        r"text chunks 1, 4 missing\)"):
        extract(inputs, out, merge=True)

    # shard 1 (image chunk 1, text chunks 1 and 4; one batch each) killed in its third batch, then resumed
    with pytest.raises(KeyboardInterrupt):
        extract(inputs, out, shard=(1, 3), encoder=FakeEncoder(fail_after=2))
    assert (parts / "text-000001.npz").exists() and not (parts / "text-000004.npz").exists()
    assert not (parts / "shard-1-of-3.done").exists()
    with pytest.raises(DataError, match="shard 1/3 not done"):
        extract(inputs, out, merge=True)
    again = FakeEncoder()
    resumed = extract(inputs, out, shard=(1, 3), encoder=again)
    assert (resumed.chunks_reused, resumed.chunks_computed) == (2, 1) and again.calls == {"image": 0, "text": 1}

    merging = FakeEncoder()
    merged = extract(inputs, out, merge=True, encoder=merging)
    assert merged.path == str(out) and merged.rows == ref.rows and merging.calls == {"image": 0, "text": 0}
    assert_same_file(ref.path, out)
    assert not parts.exists()


@pytest.mark.parametrize("n_chunks", [11, 101])
def test_a_merge_puts_the_chunks_in_number_order(tmp_path, n_chunks):
    """Chunk 10 after chunk 9 (string order puts it after chunk 1), chunk 100 after 99, whatever order the
    shards wrote them in."""
    scratch = Scratch(str(tmp_path / "set.h5.parts"), "fingerprint", str(tmp_path / "set.h5"))
    n_items = 2 * n_chunks - 1  # chunks of 2 items, the last of 1
    for shard in (2, 0, 1):
        for chunk, start, stop in chunks(n_items, 2, (shard, 3)):
            scratch.save("text", chunk, np.arange(start, stop, dtype=np.float32)[:, None], np.ones(stop - start, bool))
    features, ok = gather_chunks("text", n_items, scratch, 2)
    assert features[:, 0].tolist() == list(range(n_items)) and ok.shape == (n_items,) and ok.all()


def test_shards_of_more_than_ten_chunks_merge_each_item_in_its_row(tmp_path):
    """11 images and 22 captions in chunks of one item, 3 shards: every row of the merged file holds the
    features of its own image and caption (the fake encoder's: an image's height is 30 + its index; a
    caption's length and checksum). An unsharded extraction merges its chunks the same way, so the rows are
    checked against the encoder itself."""
    names = make_images(tmp_path / "imgs", 11)
    caps, labels = write_inputs(tmp_path, names)
    cfg = ExtractConfig(batch_size=1, chunk_items=1, workers=1)
    args = (tmp_path / "imgs", caps, labels, tmp_path / "set.h5")
    for shard in range(3):
        extract_features(*args, sizes=SIZES, config=cfg, progress=False, encoder=FakeEncoder(), shard=(shard, 3))
    merged = extract_features(*args, sizes=SIZES, config=cfg, progress=False, encoder=FakeEncoder(), merge=True)
    listed = sorted(names)  # an id is the image's place in the folder's sorted listing: img10 after img1
    captions = {name: [] for name in names}
    for line in caps.read_text().splitlines():
        name, caption = line.split("\t")
        captions[name].append(caption)
    with h5py.File(merged.path, "r") as f:
        for split in ("query", "retrieval", "train"):
            ids, img, txt = f[split]["ids"][:], f[split]["image"][:], f[split]["text"][:]
            assert len(ids) == merged.rows[split] > 0
            heights = [30 + names.index(listed[i]) for i in ids]  # make_images: image i is 30 + i high
            np.testing.assert_array_equal(img[:, 4], heights, err_msg=split)
            for i, features in zip(ids, txt):
                its_own = FakeEncoder().encode_texts(captions[listed[i]])
                assert (its_own == features).all(axis=1).any(), (split, listed[i], features)


def test_a_shard_that_merges_waits_for_the_others(tmp_path, inputs):
    ref = extract(inputs, reference(tmp_path))
    out = tmp_path / "set.h5"
    extract(inputs, out, shard=(1, 2))
    report = extract(inputs, out, shard=(0, 2), merge=True, poll_seconds=0.01)
    assert report.path == str(out)
    assert_same_file(ref.path, out)


def test_a_merge_reads_no_image_and_a_shard_recomputes_only_a_changed_image_s_chunk(tmp_path, inputs):
    """A merge computes nothing: on a machine where the images are not (its list file alone), it writes the file
    (an image's size and time in the scratch's fingerprint refused it, and an image merely touched refused every
    shard's chunks, the remedy said being to delete them all)."""
    folder, caps, labels = inputs
    listed = tmp_path / "list.txt"
    listed.write_text("".join(f"imgs/{name}\n" for name in sorted(os.listdir(folder))))
    for path in (caps, labels):
        path.write_text("".join(f"imgs/{line}\n" for line in path.read_text().splitlines()))
    args = (listed, caps, labels)
    ref = extract(args, reference(tmp_path))
    out = tmp_path / "set.h5"
    extract(args, out, shard=(0, 2))
    os.utime(folder / sorted(os.listdir(folder))[0], ns=(1, 1))  # touched: its chunk (shard 0's) computed again
    again = extract(args, out, shard=(0, 2))
    assert (again.chunks_computed, again.chunks_reused) == (1, 5)
    extract(args, out, shard=(1, 2))
    os.rename(folder, tmp_path / "elsewhere")  # the merging machine has none of the images
    merged = extract(args, out, merge=True)
    assert merged.path == str(out) and merged.chunks_computed == 0
    assert_same_file(ref.path, out)


def test_merge_before_any_shard_and_bad_shards(tmp_path, inputs):
    with pytest.raises(DataError, match=r"cannot merge, no shard has finished \(image chunks 0, 1, 2, 3; text chunks "
                                        r"0, 1, 2, 3, 4 and 2 more missing\)"):
        extract(inputs, tmp_path / "set.h5", merge=True)
    for text, problem in [("1", "expected I/N"), ("2/2", "needs 0 <= I < N"), ("a/b", "expected I/N")]:
        with pytest.raises(ValueError, match=problem):
            parse_shard(text)
    with pytest.raises(ValueError, match="restarting would discard the chunks of every shard"):
        extract(inputs, tmp_path / "set.h5", shard=(0, 2), restart=True)


def test_shard_and_merge_options(tmp_path, tiny_clip):  # noqa: F811 - the fixture
    names = make_images(tmp_path / "imgs", 5)
    caps, labels = write_inputs(tmp_path, names)
    args = [str(tmp_path / "imgs"), str(caps), str(labels), str(tmp_path / "c.h5"), "--model", tiny_clip,
            "--device", "cpu", "--query", "1", "--train", "2", "--workers", "1", "--chunk-items", "3"]
    user_error(["extract", *args, "--shard", "2/2"], "shard '2/2': needs 0 <= I < N")
    user_error(["extract", *args, "--shard", "0/2", "--restart"], "--restart would discard the chunks of every shard")
    # a shard that merges waited without end for the chunks of shards nobody runs (torchrun's rank 0 alone does)
    user_error(["extract", *args, "--shard", "0/2", "--merge"], "--shard and --merge go apart: run each --shard I/N")
    user_error(["extract", *args, "--merge"], "c.h5.parts: cannot merge, no shard has finished")
    from ucmfh.app.cli import main

    result = CliRunner().invoke(main, ["extract", *args, "--shard", "1/2"])
    assert result.exit_code == 0 and "shard 1/2 done: chunks computed 3, reused 0" in result.output, result.output
    # another shard of other settings: the remedy is to delete the scratch ('--restart', which a shard refuses, was
    # named)
    other = [*args[:-1], "2"]
    said = user_error(["extract", *other, "--shard", "0/2"], "scratch of a different extraction")
    assert f"delete {tmp_path / 'c.h5'}.parts/ yourself to start the shards over" in said and "--restart" not in said
    user_error(["extract", *args, "--merge"], "c.h5.parts: cannot merge, shard 0/2 not done")
    assert CliRunner().invoke(main, ["extract", *args, "--shard", "0/2"]).exit_code == 0
    result = CliRunner().invoke(main, ["extract", *args, "--merge"])
    assert result.exit_code == 0 and "chunks computed 0, reused 6" in result.output, result.output
    assert CliRunner().invoke(main, ["extract", *args[:3], str(reference(tmp_path, "c.h5")), *args[4:]]).exit_code == 0
    assert_same_file(reference(tmp_path, "c.h5"), tmp_path / "c.h5")


@pytest.mark.slow  # 18 s: a torchrun launch and a second extraction; the shards' merge is tested in-process above
def test_torchrun_ranks_are_the_shards(tmp_path, tiny_clip):  # noqa: F811 - the fixture
    names = make_images(tmp_path / "imgs", 6)
    caps, labels = write_inputs(tmp_path, names)
    args = [str(tmp_path / "imgs"), str(caps), str(labels), "--model", tiny_clip, "--device", "cpu", "--query", "1",
            "--train", "2", "--workers", "1", "--chunk-items", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)}

    def run(launcher, out):  # both in processes of one thread: the same arithmetic
        done = subprocess.run([sys.executable, "-m", *launcher, "ucmfh", "extract", *args[:3], str(out), *args[3:]],
                              env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    output = run(["torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"],
                 tmp_path / "c.h5")
    assert "shard 1/2 done" in output and f"wrote {tmp_path / 'c.h5'}" in output, output
    assert not (tmp_path / "c.h5.parts").exists()
    run([], reference(tmp_path, "c.h5"))
    assert_same_file(reference(tmp_path, "c.h5"), tmp_path / "c.h5")
