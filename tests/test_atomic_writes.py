"""Atomic writes shown by failure (README: "atomic writes"): a write that stops halfway — a full disk,
a killed process — leaves the previous checkpoint, training state, index and results file readable and whole,
and no half-written file under any name."""
from __future__ import annotations

import builtins
import errno
import os
import re

import numpy as np
import pytest
import torch

import ucmfh.search.folder
from ucmfh.checkpoint import load_model, save_checkpoint
from ucmfh.config import HashConfig
from ucmfh.trainer import Plan, train
from ucmfh.training_state import StateFile, read_state
from ucmfh.files import append_jsonl, read_jsonl
from ucmfh.models.hashing import FeatureHasher
from ucmfh.search import Index


def _full_disk() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device (the test's, halfway through a write)")


def _torch_save_cut_short(monkeypatch, after: int = 0) -> None:
    """The files ``torch.save`` writes (through ucmfh's own write of its bytes: a checkpoint, a training state):
    the first ``after`` whole, then half of the next one's bytes, and the disk is full."""
    real_open, calls = builtins.open, []

    def cut_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and "w" in mode and ".pt.tmp" in os.path.basename(file):
            calls.append(file)
            if len(calls) > after:
                return _CutShort(f)
        return f

    monkeypatch.setattr(builtins, "open", cut_open)


class _CutShort:
    """A file whose first write stops halfway: half the bytes reach the disk, then the disk is full."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise _full_disk()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


def _writes_to_cut_short(monkeypatch, name: str) -> None:
    """Every file opened for writing whose name holds ``name`` (the destination, or a temporary file beside
    it) is cut short at its first write."""
    real_open = builtins.open

    def cut_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+") and name in os.path.basename(file):
            return _CutShort(f)
        return f

    monkeypatch.setattr(builtins, "open", cut_open)


def _hasher(seed: int) -> FeatureHasher:
    torch.manual_seed(seed)
    return FeatureHasher(12, 10, 16, 0).eval()


def test_a_checkpoint_write_cut_short_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "hash16.pt"
    cfg = HashConfig(method="two-tower", n_bits=16, hidden=0)
    save_checkpoint(path, _hasher(0), None, cfg)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    _torch_save_cut_short(monkeypatch)
    # said of the checkpoint (a full disk's '[Errno 28] No space left on device' named no file; torch.save to a
    # path said it as a RuntimeError, 'unexpected pos 6976 vs 6904', and a traceback)
    with pytest.raises(OSError, match=rf"^{re.escape(str(path))}: not written \(No space left on device.*\); a file "
                                      "there before is kept$"):
        save_checkpoint(path, _hasher(1), None, cfg)
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before  # no temporary file
    model, _, _, _ = load_model(path, "hash", d_img=12, d_txt=10)
    for (name, saved), first in zip(model.state_dict().items(), _hasher(0).state_dict().values(), strict=True):
        assert torch.equal(saved, first), name


def test_a_write_cut_short_releases_its_view_of_the_bytes(tmp_path, monkeypatch):
    """The view of the bytes a full disk refused stayed alive in the error's traceback, beside the buffer it
    views: CPython 3.12.1's garbage collector crashed on the pair (a segmentation fault, the test above's on
    3.12.1, an audit's). The view is released however the write ends."""
    seen, cut_write = [], _CutShort.write

    def write(self, data):
        seen.append(data)
        return cut_write(self, data)

    monkeypatch.setattr(_CutShort, "write", write)
    _torch_save_cut_short(monkeypatch)
    with pytest.raises(OSError, match="No space left on device"):
        save_checkpoint(tmp_path / "hash16.pt", _hasher(0), None, HashConfig(method="two-tower", n_bits=16, hidden=0))
    with pytest.raises(ValueError, match="released memoryview"):
        seen[0].tobytes()


def test_a_training_state_write_cut_short_leaves_the_previous_state(tmp_path, monkeypatch):
    """The state saved after epoch 1 survives the save after epoch 2 failing halfway; a resume continues
    from it."""
    path = str(tmp_path / "hash16.state.pt")
    cfg = HashConfig(epochs=3, batch_size=4, val_fraction=0.0)

    def fit(resume: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(12, 2, generator=torch.Generator().manual_seed(0))

        plan = Plan("hash", model, {"m": model}, optimizer, 12, loss=lambda batch: model(x[batch.index]).pow(2).mean())
        train(plan, cfg, torch.device("cpu"), torch.Generator().manual_seed(1),
              StateFile(path, interval_s=0, resume=resume), False)
        return model

    _torch_save_cut_short(monkeypatch, after=1)  # epoch 1's state whole, epoch 2's cut short
    with pytest.raises(OSError, match="No space left"):
        fit(resume=False)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["hash16.state.pt"]
    saved = read_state(path, torch.device("cpu"))
    assert (saved["epoch"], saved["step"], len(saved["history"])) == (1, 0, 1)
    resumed = fit(resume=True)
    os.remove(path)
    never_stopped = fit(resume=False)
    for a, b in zip(resumed.state_dict().values(), never_stopped.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def _pm1(rng, n: int, bits: int) -> np.ndarray:
    return np.where(rng.random((n, bits)) < 0.5, -1.0, 1.0).astype(np.float32)


def test_an_index_write_cut_short_leaves_the_previous_index(tmp_path, monkeypatch):
    """A replacement of a saved index, and an append's commit (its manifest), each cut short halfway: the
    index reads as it was, and takes the same append again."""
    rng = np.random.default_rng(0)
    r = _pm1(rng, 60, 32)
    first = Index(32, {"note": "first"})
    first.add("img", r[:30], paths=[f"p{i}.jpg" for i in range(30)])
    path = first.save(tmp_path / "ix")

    def unchanged() -> Index:
        index = Index.load(path, mmap=False)
        assert index.count("img") == 30 and index.meta == {"note": "first"}
        assert np.array_equal(index.search(r[:30], 1, "img")[1][:, 0], np.arange(30))
        assert index.strings("img", "paths", [0, 29]) == ["p0.jpg", "p29.jpg"]
        return index

    real_write_raw = ucmfh.search.folder.write_raw

    def write_raw_cut_short(file, array):
        real_write_raw(file, np.ascontiguousarray(array).reshape(-1)[: max(1, array.size // 2)])
        raise _full_disk()

    other = Index(32, {"note": "other"})
    other.add("img", r[30:], paths=[f"q{i}.jpg" for i in range(30)])
    monkeypatch.setattr(ucmfh.search.folder, "write_raw", write_raw_cut_short)
    with pytest.raises(OSError, match="No space left"):
        other.save(path, overwrite=True)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ix"]
    unchanged()
    # an append: its rows are written past the committed ones, then the manifest commits them
    _writes_to_cut_short(monkeypatch, "index.json")
    with pytest.raises(OSError, match="No space left"):
        Index.load(path).add("img", r[30:], paths=[f"p{i}.jpg" for i in range(30, 60)])
    monkeypatch.undo()
    assert not [name for name in os.listdir(path) if ".tmp" in name]
    unchanged().add("img", r[30:], paths=[f"p{i}.jpg" for i in range(30, 60)])
    grown = Index.load(path)
    assert grown.count("img") == 60 and np.array_equal(grown.search(r, 1, "img")[1][:, 0], np.arange(60))


def test_a_results_row_cut_short_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    """A row whose write stops halfway (a full disk) is taken back: the file as it was before it, where half a row
    stayed and every later read warned of it (an audit's, on a small tmpfs). A killed writer's half row, which
    no one takes back, spoils no earlier row: a reader skips it, saying so (tests/app/test_runs.py)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc/self/fd to tell the results file's writes from others")
    path = tmp_path / "results.jsonl"
    append_jsonl(path, [{"run": "a", "map_i2t": 0.5}, {"run": "b", "map_i2t": 0.25}])
    real_write = os.write

    def write_cut_short(fd, data):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) != path.name:
            return real_write(fd, data)
        real_write(fd, data[: len(data) // 2])
        raise _full_disk()

    before = path.read_bytes()
    monkeypatch.setattr(os, "write", write_cut_short)  # append_jsonl's one write per row
    with pytest.raises(OSError, match=r"results\.jsonl: a row not appended \(No space left on device.*\); the file "
                                      r"is as it was before it$"):
        append_jsonl(path, [{"run": "c", "map_i2t": 0.75}, {"run": "d", "map_i2t": 1.0}])
    monkeypatch.undo()
    assert path.read_bytes() == before
    append_jsonl(path, [{"run": "e", "map_i2t": 0.125}])
    skipped = []
    assert [row["run"] for row in read_jsonl(path, skipped.append)] == ["a", "b", "e"] and not skipped
    # a killed writer's half row, which no one took back: the next row starts a line of its own, and a reader
    # skips the cut line alone, saying so
    with open(path, "ab") as f:
        f.write(b'{"run": "f", "map_i2')
    append_jsonl(path, [{"run": "g", "map_i2t": 0.5}])
    assert [row["run"] for row in read_jsonl(path, skipped.append)] == ["a", "b", "e", "g"]
    assert len(skipped) == 1 and "line 4: not a JSON row" in skipped[0]


def test_a_results_file_is_read_between_appends_never_in_the_middle_of_one(tmp_path):
    """A reader met half a row another process was appending: it said the line was not a JSON row, or refused a
    file whose first row it was (a concurrency audit's). A read waits for the append under way."""
    import threading
    import time

    from ucmfh.files import locked

    for before in ([], [{"run": "a", "map_i2t": 0.5}]):  # the file's first row being appended, or a later one
        path = tmp_path / f"r{len(before)}.jsonl"
        append_jsonl(path, before) if before else None
        halfway = threading.Event()

        def append_slowly():
            with locked(path, hidden=True), open(path, "ab") as f:  # as append_jsonl holds it
                f.write(b'{"run": "b", "map_')
                f.flush()
                halfway.set()
                time.sleep(0.3)
                f.write(b'i2t": 0.25}\n')

        writer = threading.Thread(target=append_slowly)
        writer.start()
        halfway.wait()
        skipped = []
        assert [row["run"] for row in read_jsonl(path, skipped.append)] == [*(r["run"] for r in before), "b"]
        assert not skipped
        writer.join()
    # a file no writer locked (another machine's, sent): read as it is, no lock file made beside it
    (tmp_path / "sent").mkdir()
    (tmp_path / "sent" / "r.jsonl").write_text('{"run": "a"}\n')
    assert read_jsonl(tmp_path / "sent" / "r.jsonl") == [{"run": "a"}]
    assert os.listdir(tmp_path / "sent") == ["r.jsonl"]


def test_a_file_written_there_by_another_process_meanwhile_is_kept_where_replacing_was_not_asked(tmp_path, tiny_path,
                                                                                                monkeypatch):
    """Two 'ucmfh encode -o X' started together each looked, found no X, and wrote it: both said 'wrote X', and
    one command's codes were gone. Without overwrite the finished file takes the name only where none is there
    by then; the other process's file is kept and the writer is told (a codes file, a dataset file alike)."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main
    from ucmfh.files import atomic_file

    path = tmp_path / "x.txt"
    with pytest.raises(FileExistsError, match=r"x.txt: written by another process meanwhile; not replaced$"):
        with atomic_file(path, replace=False) as tmp:
            open(tmp, "w").write("mine")
            path.write_text("theirs")  # the other process's, finished first
    assert path.read_text() == "theirs" and os.listdir(tmp_path) == ["x.txt"]
    with atomic_file(path, replace=True) as tmp:  # asked to replace: replaced
        open(tmp, "w").write("mine")
    assert path.read_text() == "mine"
    model = FeatureHasher(48, 32, 16, 0)
    checkpoint = save_checkpoint(tmp_path / "hash16.pt", model.eval(), None, HashConfig(method="two-tower", n_bits=16,
                                                                                        hidden=0))
    import ucmfh.codes as codes_module

    out = tmp_path / "codes.h5"
    check_space = codes_module.check_space

    def other_writes_first(*args, **kwargs):  # while this command writes its codes, another one writes its file
        if not out.exists():
            out.write_bytes(b"the other command's codes")
        return check_space(*args, **kwargs)

    monkeypatch.setattr(codes_module, "check_space", other_writes_first)
    said = CliRunner().invoke(main, ["encode", "-c", str(checkpoint), "-d", tiny_path, "-o", str(out), "--quiet"])
    assert said.exit_code == 2 and said.output.splitlines()[-1] == (
        f"Error: {out}: written by another process meanwhile; not replaced (pass --overwrite to replace it)")
    assert out.read_bytes() == b"the other command's codes"


def test_a_temporary_file_of_another_machine_is_left_until_untouched_for_a_day(tmp_path):
    """A temporary file's name held its writer's pid alone: a writer in a container (its pid 40) had its file taken
    for a dead process's by a writer on the host, where no pid 40 ran, and removed mid-write; and two containers'
    pid 1 wrote one temporary name (an audit's find). A name now holds its machine (host and pid space) and random
    digits: another machine's temporary file is left while it may be written, a dead process's here is removed."""
    from conftest import dead_pid
    from ucmfh.files import _machine, atomic_path, remove_stale_temps, temp_destination

    target = tmp_path / "grid.md"
    first, second = atomic_path(target), atomic_path(target)  # one pid and thread, one machine: two names
    assert first != second and temp_destination(first) == temp_destination(second) == "grid.md"
    other = "0badf00d" if _machine() != "0badf00d" else "0badf00e"
    theirs = tmp_path / f".grid.md.tmp{dead_pid()}.{other}123abc"  # a pid that runs nowhere here
    ours = tmp_path / f".grid.md.tmp{dead_pid()}.{_machine()}123abc"
    older = tmp_path / f".grid.md.tmp{dead_pid()}"  # named before machines were
    for path in (theirs, ours, older):
        path.write_text("half")
    assert sorted(remove_stale_temps(target)) == sorted([str(ours), str(older)]) and theirs.exists()
    day_ago = theirs.stat().st_mtime - 24 * 3600 - 60
    os.utime(theirs, (day_ago, day_ago))
    assert remove_stale_temps(target) == [str(theirs)] and not theirs.exists()
    # a folder's (an index saved whole, then renamed), its writer killed: it stayed for ever (a concurrency audit's)
    folder = tmp_path / f".my.index.tmp{dead_pid()}.{_machine()}123abc"
    (folder / "sub").mkdir(parents=True)
    (folder / "img.codes").write_bytes(b"half")
    assert remove_stale_temps(tmp_path / "my.index") == [str(folder)] and not folder.exists()


def test_a_file_of_many_damaged_lines_is_said_in_a_few_lines_its_control_characters_escaped(tmp_path):
    """999 damaged lines said 999 warnings; a line of NUL bytes (a crash's tail) reached the terminal raw. The
    first lines are named, the rest counted in one line; a line's control characters are escaped."""
    from ucmfh.files import SKIPS_SAID

    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"run": "a", "map_i2t": 0.5}\n' + b"".join(b'{"run": "cut%d", "map\n' % i for i in range(12))
                     + b"\x00" * 60 + b'\n{"run": "b", "map_i2t": 0.25}\n')
    skipped = []
    assert [row["run"] for row in read_jsonl(path, skipped.append)] == ["a", "b"]
    assert len(skipped) == SKIPS_SAID + 1 and all("not a JSON row" in line for line in skipped[:SKIPS_SAID])
    assert skipped[0] == f'{path}: line 2: not a JSON row ({{"run": "cut0", "map); skipped'
    assert skipped[-1] == f"{path}: {13 - SKIPS_SAID} more line(s) that are not JSON rows (the last: line 14); skipped"
    with open(tmp_path / "nul.jsonl", "wb") as f:
        f.write(b'{"run": "a"}\n' + b"\x00" * 80 + b"\n")
    skipped = []
    read_jsonl(tmp_path / "nul.jsonl", skipped.append)
    [said] = skipped
    assert "\x00" not in said and "\\x00" in said and said.endswith("…); skipped")


def test_a_read_for_some_runs_parses_the_lines_that_name_them_alone(tmp_path, monkeypatch):
    """A grid looked for its cell's rows by parsing the whole results file after every cell (14 s a cell at a
    lab's 100,000 rows): ``containing`` reads the first row (the file's check) and the lines naming the texts."""
    import ucmfh.files as files

    path = tmp_path / "results.jsonl"
    append_jsonl(path, [{"run": f"run{i:04d}", "map_i2t": 0.5} for i in range(1000)])
    with open(path, "ab") as f:
        f.write(b'{"run": "damaged\n')  # passed over unread: not one of the runs asked for
    append_jsonl(path, [{"run": "mine", "protocol": "unimodal"}, {"run": "mine", "protocol": "fused"}])
    parsed = []
    real = files._rows_of_line
    monkeypatch.setattr(files, "_rows_of_line", lambda line: parsed.append(line) or real(line))
    skipped = []
    rows = read_jsonl(path, skipped.append, containing=['"mine"', '"run0500"'])
    assert [row["run"] for row in rows] == ["run0000", "run0500", "mine", "mine"] and len(parsed) == 4
    assert not skipped
    with pytest.raises(ValueError, match="is not a JSON-lines results file"):  # the first line still checked
        (tmp_path / "notes.txt").write_text("my notes\n" + '{"run": "mine"}\n')
        read_jsonl(tmp_path / "notes.txt", containing=['"mine"'])


def test_a_read_pauses_the_cycle_collector_and_leaves_it_as_it_was(tmp_path, monkeypatch):
    """Each collection walked every row read so far (two thirds of reading a lab's 100,000 rows): no collection runs
    while the rows are parsed, and the collector is left as the caller had it, on or off, a read that fails too."""
    import gc

    import ucmfh.files as files

    path = tmp_path / "results.jsonl"
    append_jsonl(path, [{"run": "a"}, {"run": "b"}])
    states = []
    real = files._rows_of_line
    monkeypatch.setattr(files, "_rows_of_line", lambda line: states.append(gc.isenabled()) or real(line))
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            assert [row["run"] for row in read_jsonl(path)] == ["a", "b"] and gc.isenabled() == enabled
            (tmp_path / "notes.txt").write_text("my notes\n")
            with pytest.raises(ValueError, match="is not a JSON-lines results file"):
                read_jsonl(tmp_path / "notes.txt")
            assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()
    assert states == [False] * 6
