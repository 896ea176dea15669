"""Training on data larger than memory (ucmfh.data.stream): streamed splits read by blocks."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.data.h5 import load_dataset
from ucmfh.data import stream
from ucmfh.data.stream import Rows, StreamSettings
from ucmfh.evaluation import evaluate_hashing
from ucmfh.methods import METHODS, fit_hashing, hash_config
from ucmfh.fusion_stage import fit_fusion

from conftest import small_fusion, small_hash

SMALL_BLOCKS = StreamSettings(block_rows=32, window=3)


def test_streamed_rows_read_what_is_in_memory(tiny_path, tiny):
    rows = Rows(tiny_path, "train/image", SMALL_BLOCKS)
    assert rows.shape == tuple(tiny.train.img.shape) and len(rows) == len(tiny.train)
    assert torch.equal(rows[10:150], tiny.train.img[10:150])
    index = torch.tensor([399, 3, 3, 200, 0, 77, 64])  # any order, repeats, several blocks
    assert torch.equal(rows[index], tiny.train.img[index])
    positions = torch.tensor([1, 5, 40, 41, 300, 390])
    part = rows.subset(positions)
    assert torch.equal(part[:], tiny.train.img[positions]) and torch.equal(part[[5, 0]], tiny.train.img[[390, 1]])
    assert len(rows.blocks.cache) <= 2 * SMALL_BLOCKS.window  # the cache never grows beyond its bound
    mean, std = rows.column_stats()
    x = tiny.train.img.double()
    assert torch.allclose(mean, x.mean(0)) and torch.allclose(std, x.std(0, correction=0))
    with pytest.raises(ValueError, match="increasing positions"):
        rows.subset(torch.tensor([3, 1]))
    # as a notebook reaches for a tensor's (an audit's: no numpy(), a dtype of None)
    assert rows.dtype == tiny.train.img.dtype and np.array_equal(part.numpy(), tiny.train.img[positions].numpy())


def test_a_file_written_over_while_streamed_is_refused_and_one_renamed_over_is_not(tiny_path, tiny, tmp_path):
    """A file copied over a streamed one gave the new file's rows, or HDF5's 'addr overflow'; one renamed into its
    path leaves the opened file as it was, read on."""
    from ucmfh.data.format import DataError
    from ucmfh.data.synthetic import SyntheticSpec, make_synthetic

    other = make_synthetic(tmp_path / "other.h5", SyntheticSpec(n_query=50, n_retrieval=400, n_train=400, d_img=80,
                                                                d_txt=40, seed=9))
    for replace_it in ("copy", "rename"):
        path = tmp_path / f"{replace_it}.h5"
        shutil.copy(tiny_path, path)
        rows = Rows(str(path), "train/image", SMALL_BLOCKS)
        assert torch.equal(rows[torch.tensor([3, 200])], tiny.train.img[[3, 200]])
        if replace_it == "copy":
            shutil.copyfile(other, path)
            with pytest.raises(DataError, match=f"{path}: changed since it was opened"):
                rows[torch.tensor([5, 300])]
        else:
            shutil.copy(other, tmp_path / "new.h5")
            (tmp_path / "new.h5").replace(path)
            assert torch.equal(rows[torch.tensor([5, 300])], tiny.train.img[[5, 300]])


class CountingReads:
    """An HDF5 dataset that records the number of rows of each read."""

    def __init__(self, dataset):
        self.dataset, self.shape, self.reads = dataset, dataset.shape, []

    def __getitem__(self, key):
        out = self.dataset[key]
        self.reads.append(len(out))
        return out


def test_spread_rows_are_read_a_block_at_a_time(tiny_path, tiny):
    """A subset spread through the file (a validation part) is read span by span, never as one read
    from its first row to its last: memory stays bounded by a block."""
    rows = Rows(tiny_path, "train/image", SMALL_BLOCKS)
    rows.blocks.dataset = counting = CountingReads(rows.blocks.dataset)
    positions = torch.arange(0, len(rows), 37)  # one row in 37: a view-block spans about 1,200 file rows
    assert torch.equal(rows.subset(positions)[:], tiny.train.img[positions])
    assert max(counting.reads) <= SMALL_BLOCKS.block_rows
    counting.reads.clear()
    assert torch.equal(rows[5:70], tiny.train.img[5:70]) and counting.reads == [32, 32, 32]  # dense: whole blocks


def test_a_streamed_split_is_shuffled_as_in_memory_and_its_batches_read_row_by_row(tiny_path, tiny):
    """The order of an epoch does not depend on streaming; a batch scattered over more blocks than the cache
    holds is read row by row, past the cache, never block by block."""
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=SMALL_BLOCKS)
    assert data.train.streamed
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    order = data.train.shuffle(g1)
    assert torch.equal(order, tiny.train.shuffle(g2))
    rows = data.train.img
    rows.blocks.dataset = counting = CountingReads(rows.blocks.dataset)
    batch = torch.tensor([390, 5, 200, 77, 301, 120, 121])  # 6 blocks of 13, far apart but 120 and 121
    assert torch.equal(rows[batch], tiny.train.img[batch])
    assert not rows.blocks.cache and sorted(counting.reads) == [1, 1, 1, 1, 1, 2]  # not 6 blocks of 32 rows
    counting.reads.clear()
    rows.read_ahead(batch)  # kept for the step that asks for it, which reads nothing
    reads = len(counting.reads)
    assert reads and torch.equal(rows[batch.clone()], tiny.train.img[batch]) and len(counting.reads) == reads
    assert torch.equal(rows[batch], tiny.train.img[batch]) and len(counting.reads) > reads  # taken once


@pytest.mark.parametrize("layout", ["chunked", "contiguous", "gzip", "float64"])
def test_scattered_rows_are_read_at_their_offsets_where_the_file_holds_them_as_they_are(tmp_path, layout):
    """Rows of a float32, unfiltered dataset are read past HDF5, at their byte offsets, several threads at once;
    the same rows as h5py reads, runs across a chunk's edge included. Other layouts are read through h5py."""
    x = np.random.default_rng(0).standard_normal((1000, 24))
    path = str(tmp_path / f"{layout}.h5")
    kwargs = {"chunked": {"chunks": (64, 24)}, "contiguous": {}, "float64": {"chunks": (64, 24)},
              "gzip": {"chunks": (64, 24), "compression": "gzip"}}[layout]
    with h5py.File(path, "w") as f:
        data = x if layout == "float64" else x.astype(np.float32)
        dataset = f.create_dataset("train/image", shape=data.shape, dtype=data.dtype, **kwargs)
        for start in range(960, -1, -64):  # the last chunk written first: the chunks in reverse in the file
            dataset[start:start + 64] = data[start:start + 64]
    want = torch.from_numpy(x.astype(np.float32))
    rows = Rows(path, "train/image", StreamSettings(block_rows=256, window=1))
    assert (rows.blocks.pread is not None) == (layout in ("chunked", "contiguous"))
    rows.blocks.dataset = counting = CountingReads(rows.blocks.dataset)
    file_rows = np.array([0, 1, 2, 40, 60, 61, 62, 63, 64, 65, 70, 127, 128, 300, 301, 640, 998, 999])
    assert np.array_equal(rows.blocks.read(file_rows), want[file_rows].numpy())  # runs over the edges 64, 128
    batch = torch.from_numpy(np.random.default_rng(1).choice(1000, 40, replace=False))  # scattered: row by row
    assert torch.equal(rows[batch], want[batch])
    assert (counting.reads == []) == (rows.blocks.pread is not None)  # h5py read none of them


def test_rows_read_at_their_offsets_are_read_at_most_read_bytes_at_once(tmp_path, monkeypatch):
    """Each read is bounded (READ_BYTES), however long the run of rows."""
    x = np.random.default_rng(0).standard_normal((1000, 24)).astype(np.float32)
    path = str(tmp_path / "contiguous.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("train/image", data=x)
    rows = Rows(path, "train/image", StreamSettings(block_rows=256, window=1))
    sizes = []
    real = stream.os.preadv
    monkeypatch.setattr(stream.os, "preadv", lambda fd, buffers, at: sizes.append(buffers[0].nbytes)
                        or real(fd, buffers, at))
    monkeypatch.setattr(stream, "READ_BYTES", 5 * 24 * 4)
    file_rows = np.concatenate([np.arange(10, 40), np.arange(500, 540, 2), [990]])  # long runs, within GAP
    assert np.array_equal(rows.blocks.read(file_rows), x[file_rows])
    assert sizes and max(sizes) <= 5 * 24 * 4


def test_training_on_rows_read_at_their_offsets_gives_the_weights_of_memory(tiny_path, tiny, tmp_path):
    """The tiny set with its features chunked by whole rows, so that streamed batches are read at their
    offsets (several threads at once): two-tower trains to the weights of memory, bit for bit."""
    path = str(tmp_path / "rows.h5")
    shutil.copy(tiny_path, path)
    with h5py.File(path, "r+") as f:
        for split in ("train", "query", "retrieval"):
            for name in ("image", "text"):
                data = f[split][name][()]
                del f[split][name]
                f[split].create_dataset(name, data=data, chunks=(64, data.shape[1]))
    streamed = load_dataset(path, max_memory_bytes=4 * 80 * 100, stream=SMALL_BLOCKS)
    assert streamed.train.streamed and streamed.train.img.blocks.pread is not None
    models = [fit_hashing(d, small_hash(method="two-tower", epochs=2, val_fraction=0.2), progress=False)[0]
              for d in (streamed, tiny)]
    for key, value in models[1].state_dict().items():
        assert torch.equal(models[0].state_dict()[key], value), key


def test_dataset_beyond_the_threshold_streams_its_largest_splits(tiny_path):
    whole = load_dataset(tiny_path)
    assert not any(s.streamed for s in (whole.train, whole.query, whole.retrieval))
    # features: train 400, retrieval 600, query 80 items of 48 + 32 floats; room for query and train only
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 500)
    assert [s.streamed for s in (data.train, data.query, data.retrieval)] == [False, False, True]
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100)
    assert [s.streamed for s in (data.train, data.query, data.retrieval)] == [True, False, True]
    assert data.d_img == 48 and len(data.train) == 400
    # the block caches fit in what is left: 6.4 kB here, so blocks of the smallest size
    assert data.train.img.settings.block_rows == 256
    default = StreamSettings()  # blocks of 16384 rows, windows of 8 blocks: a cache of 16 blocks
    assert default.within(16 * 4 * 512 * 1000, 512).block_rows == 1000
    assert default.within(0, 512).block_rows == 256 and default.within(10**12, 512).block_rows == 16384


def test_training_on_small_blocks_gives_the_weights_and_map_of_memory(tiny_path, tiny):
    """Fusion, then hash heads on it (method ucmfh), on a training split read 32 rows at a time, with a
    validation part: the same batches as in memory, so bit for bit the same weights and MAP (a run's
    identity leaves streaming out)."""
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=SMALL_BLOCKS)
    assert data.train.streamed and data.retrieval.streamed
    models, maps = {}, {}
    for name, d in (("streamed", data), ("memory", tiny)):
        fusion, _ = fit_fusion(d, small_fusion(epochs=2, val_fraction=0.2), progress=False)
        model, history = fit_hashing(d, small_hash(epochs=2, val_fraction=0.2), fusion, progress=False)
        [row] = evaluate_hashing(model, d, ("unimodal",), 50, "cpu")
        models[name], maps[name] = model.state_dict(), (row["map_i2t"], row["map_t2i"])
    for key, value in models["memory"].items():
        assert torch.equal(models["streamed"][key], value), key
    assert maps["streamed"] == maps["memory"]
    assert len(data.train.img.blocks.cache) <= 2 * SMALL_BLOCKS.window


@pytest.mark.parametrize("name", [name for name, spec in METHODS.items() if not (spec.in_memory or spec.closed_form)])
def test_every_method_trains_on_small_blocks_to_the_weights_of_memory(tiny_path, tiny, name):
    """Every method that trains on a streamed split, on blocks of 32 rows (13 blocks, a cache of 6) with a
    validation part: bit for bit the model trained in memory (a run's identity leaves streaming out)."""
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=SMALL_BLOCKS)
    assert data.train.streamed
    fusions = [fit_fusion(d, small_fusion(epochs=1), progress=False)[0] if METHODS[name].uses_fusion else None
               for d in (data, tiny)]
    cfg = hash_config(name, n_bits=16, hidden=32, epochs=2, batch_size=64, device="cpu", val_fraction=0.2, patience=0)
    streamed, held = (fit_hashing(d, cfg, fusion, progress=False)[0].state_dict()
                      for d, fusion in zip((data, tiny), fusions))
    assert streamed.keys() == held.keys() and all(torch.equal(streamed[k], held[k]) for k in held)


def test_distill_on_a_streamed_split_leaves_the_caller_s_teacher_as_it_was(tiny_path):
    """On a streamed split, distill's teacher embeds each batch as it comes: it did so by the caller's fusion
    encoder, moved to the device and left in eval mode after the fit. A copy does it now."""
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=SMALL_BLOCKS)
    assert data.train.streamed
    fusion = fit_fusion(data, small_fusion(epochs=1), progress=False)[0].train()
    before = {key: value.clone() for key, value in fusion.state_dict().items()}
    fit_hashing(data, hash_config("distill", n_bits=16, hidden=32, epochs=1, batch_size=64, device="cpu"), fusion,
                progress=False)
    assert all(module.training for module in fusion.modules())
    assert all(torch.equal(before[key], value) for key, value in fusion.state_dict().items())


def test_streamed_rows_are_read_ahead_of_the_step_and_train_the_same(tiny_path, monkeypatch):
    """The blocks of each batch are read on the step-ahead thread while the step before it runs, and
    training ends with the weights of reading them in the step."""
    import threading

    from ucmfh import trainer
    from ucmfh.data.stream import _Blocks

    readers = []
    read = _Blocks.read
    monkeypatch.setattr(_Blocks, "read", lambda self, rows: readers.append(threading.current_thread().name)
                        or read(self, rows))
    cfg = small_hash(method="two-tower", epochs=2)
    blocks = StreamSettings(block_rows=32, window=4)  # a window holds two batches: the cache holds both
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=blocks)
    ahead, _ = fit_hashing(data, cfg, progress=False)
    n_blocks = -(-len(data.train) // blocks.block_rows)
    training = readers[2 * n_blocks:]  # after the column statistics, one pass over each feature's blocks
    in_the_step = [name for name in training if not name.startswith("ucmfh-step-ahead")]
    # in the step: each epoch's first batch alone (two features, a batch within three blocks)
    assert len(in_the_step) <= 2 * cfg.epochs * 3 and len(training) > 4 * len(in_the_step), readers
    monkeypatch.setattr(trainer, "split_ahead", lambda split, group: None)
    readers.clear()
    data = load_dataset(tiny_path, max_memory_bytes=4 * 80 * 100, stream=blocks)
    in_step, _ = fit_hashing(data, cfg, progress=False)
    assert readers and not any(name.startswith("ucmfh-step-ahead") for name in readers)
    for (name, a), b in zip(ahead.state_dict().items(), in_step.state_dict().values()):
        assert torch.equal(a, b), name


def test_an_error_reading_ahead_is_raised_by_the_training_loop():
    from ucmfh.config import HashConfig
    from ucmfh.trainer import Plan, train

    def ahead(index):
        raise OSError("the file went away")

    model = torch.nn.Linear(2, 2)
    cfg = HashConfig(epochs=1, batch_size=4, val_fraction=0.0)
    plan = Plan("hash", model, {"m": model}, torch.optim.SGD(model.parameters(), lr=0.1), 12,
                step=lambda batch: torch.zeros(()), ahead=ahead)
    with pytest.raises(OSError, match="went away"):
        train(plan, cfg, torch.device("cpu"), torch.Generator(), None, False)


def test_cli_streams_beyond_max_memory_with_the_result_of_memory(tmp_path, tiny_path):
    """--max-memory is no part of a run's identity: it changes no result (the user's report: wiki's MAP
    moved with it)."""
    rows = {}
    for name, extra in (("memory", []), ("streamed", ["--max-memory", "100kB"])):
        results = tmp_path / f"{name}.jsonl"
        result = CliRunner().invoke(main, [
            "train-hash", "-d", tiny_path, "--method", "two-tower", "-b", "16", "--epochs", "2", "--device", "cpu",
            "--quiet", "--out", str(tmp_path / name), "--results", str(results), *extra])
        assert result.exit_code == 0, result.output
        assert ("streamed from the file: train, retrieval" in result.output) == (name == "streamed")
        rows[name] = [json.loads(line) for line in results.read_text().splitlines()]
    for a, b in zip(rows["memory"], rows["streamed"], strict=True):
        assert (a["run"], a["map_i2t"], a["map_t2i"]) == (b["run"], b["map_i2t"], b["map_t2i"])
    weights = [torch.load(rows[name][0]["checkpoint"])["state_dict"] for name in ("memory", "streamed")]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    bad = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--max-memory", "lots"])
    assert bad.exit_code == 2 and "expected a size such as 500MB" in bad.output
    cca = CliRunner().invoke(main, ["train-hash", "-d", tiny_path, "--method", "cca-itq", "-b", "16", "--device", "cpu",
                                    "--max-memory", "100kB", "--out", str(tmp_path / "runs")])
    assert cca.exit_code == 2 and "is streamed" in cca.output and "Traceback" not in cca.output
