"""Multi-index hashing (ucmfh.search.mih): the linear scan's exact top k, item for item, ties by position."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from test_search_cli import trained  # noqa: F401 - a fixture
from ucmfh.app.cli import main
from ucmfh.bits import as_words
from ucmfh.search.scan import hamming_search
from ucmfh.search.kernels import kernels_module
from ucmfh.search.mih import MultiIndex, _layout, cache_name, default_substrings, popcount

COMPILED = (True, False) if kernels_module() is not None else (False,)
# multi-index hashing serves queries through an index where the compiled probe is built (else the scan does)
needs_probe = pytest.mark.skipif(kernels_module() is None, reason="ucmfh's C kernels are not built here")


def codes(kind: str, n: int, n_bits: int, rng) -> np.ndarray:
    if kind == "random":
        return rng.choice([-1, 1], (n, n_bits))
    if kind == "clustered":  # learned codes: a few centres, a few bits flipped
        centres = rng.choice([-1, 1], (12, n_bits))
        return centres[rng.integers(0, 12, n)] * np.where(rng.random((n, n_bits)) < 0.05, -1, 1)
    if kind == "duplicated":
        return np.repeat(rng.choice([-1, 1], (n // 50, n_bits)), 50, axis=0)
    return np.ones((n, n_bits))  # all equal: every item ties


@pytest.mark.parametrize("n_bits", [16, 40, 64, 128])
@pytest.mark.parametrize("kind", ["random", "clustered", "duplicated", "equal"])
def test_the_top_k_is_the_linear_scans(n_bits, kind):
    rng = np.random.default_rng(n_bits)
    items = codes(kind, 1500, n_bits, rng)
    queries = np.concatenate([items[:4], rng.choice([-1, 1], (4, n_bits))])
    rw, qw = as_words(items, n_bits), as_words(queries, n_bits)
    # m = 1 (one table: no sketch) where a substring may hold the whole code
    for m in (None, default_substrings(n_bits, 1500) + 1) + ((1,) if n_bits <= 24 else ()):
        mih = MultiIndex(rw, n_bits, m)
        for k in (1, 10, 100, 2000):  # 2000: more than the collection
            want = hamming_search(qw, rw, n_bits, k, threads=1)
            for compiled in COMPILED:  # the kernel, and the numpy reference
                got = mih.search(qw, k, threads=2, compiled=compiled)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (m, k, compiled)


@pytest.mark.parametrize("kind", ["random", "clustered"])
def test_both_formats_of_the_tables_give_the_scans_top_k(kind, monkeypatch):
    """Up to 2^24 items a position's top byte holds 8 more sketch bits (24 in all); above, positions take
    32 bits and sketches 16: the second format forced here on a small collection."""
    from ucmfh.search import mih as mih_module

    rng = np.random.default_rng(7)
    items = codes(kind, 3000, 64, rng)
    rw, qw = as_words(items, 64), as_words(np.concatenate([items[:5], rng.choice([-1, 1], (5, 64))]), 64)
    small = MultiIndex(rw, 64, 3)  # 21-22-bit substrings: sketches wider than 16 bits
    assert (small.positions >> 24).any()  # sketch bits 16-23 above the positions
    monkeypatch.setattr(mih_module, "SMALL", 0)
    large = MultiIndex(rw, 64, 3)
    assert not (large.positions >> 24).any() and np.array_equal(large.sketches, small.sketches)
    for k in (1, 10, 100):
        want = hamming_search(qw, rw, 64, k, threads=1)
        for tables in (small, large):
            monkeypatch.setattr(mih_module, "SMALL", 1 << 24 if tables is small else 0)
            # the kernel, and the numpy reference on clustered codes' near queries (quick there)
            for compiled in COMPILED if kind == "clustered" else COMPILED[:1]:
                n = len(qw) if compiled else 5
                got = tables.search(qw[:n], k, threads=1, compiled=compiled)
                assert np.array_equal(got[0], want[0][:n]) and np.array_equal(got[1], want[1][:n]), (k, compiled)


def test_a_near_query_computes_few_distances():
    rng = np.random.default_rng(1)
    items = codes("clustered", 20000, 64, rng)
    mih = MultiIndex(as_words(items, 64), 64)
    _, _, computed = mih.search_one(as_words(items[:1], 64)[0], 10)
    assert computed < 20000 // 4  # sub-linear: most items are never looked at


def test_layout_and_its_limits():
    assert _layout(64, 4) == [(0, 0, 16), (0, 16, 16), (0, 32, 16), (0, 48, 16)]
    with pytest.raises(ValueError, match="at most 24"):
        _layout(128, 3)
    with pytest.raises(ValueError, match="at least 2"):
        _layout(128, 1)
    assert [w for _, _, w in _layout(40, 2)] == [20, 20]
    assert default_substrings(64, 2**20) == 4 and default_substrings(16, 10) == 4


def test_the_default_substrings_cut_every_length_at_every_size():
    """The default m cut 72-bit codes of 2^18 items in four, two of the first word's 64 bits each: 32-bit
    substrings, refused (an audit's find; 65-68 bits failed from 2^17 items, 96 from 2^24, 512 from 2^23). A last
    word of few bits now takes few substrings; words of 64 bits are cut as before (their cached tables stand)."""
    for n_bits in range(8, 513):
        for exponent in range(1, 31):
            _layout(n_bits, default_substrings(n_bits, 2**exponent))
    assert [w for _, _, w in _layout(72, default_substrings(72, 2**18))] == [22, 21, 21, 8]
    for n_bits in range(64, 513, 64):  # the even split of whole words
        n_words = n_bits // 64
        for m in range(n_words, n_bits + 1):
            shares = [m // n_words + (w < m % n_words) for w in range(n_words)]
            assert [sum(1 for w, _, _ in _layout(n_bits, m, check=False) if w == word)
                    for word in range(n_words)] == shares


@needs_probe
def test_72_bit_codes_of_a_quarter_million_items_are_searched_as_the_scan_does():
    from ucmfh.search import Index

    rng = np.random.default_rng(72)
    index = Index(72)
    index.add("txt", codes("clustered", 2**18, 72, rng))
    queries = rng.choice([-1, 1], (6, 72))
    served = {}
    got = index.search(queries, 10, "txt", backend="mih", served=served)
    want = index.search(queries, 10, "txt")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and served["mih"] + served["scan"] == 6


def test_popcount_matches_a_bit_count():
    words = np.array([0, 1, 2**63, 2**64 - 1, 0x0F0F], dtype=np.uint64)
    assert popcount(words).tolist() == [0, 1, 1, 64, 8]


@needs_probe
def test_the_index_backend_equals_the_scan_and_caches_its_tables(tmp_path, monkeypatch):
    from ucmfh.config import BackendConfig
    from ucmfh.search import mih as mih_module

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 0)  # a small collection probed all the same
    monkeypatch.setattr(mih_module, "BUDGET_PER_WORD", 1 / 4)
    from ucmfh.search import Index
    from ucmfh.search.mih import multi_index
    from ucmfh.search.shards import Shards

    rng = np.random.default_rng(4)
    items = codes("clustered", 4000, 64, rng)
    index = Index(64)
    index.add("txt", items[:3000])
    index.save(tmp_path / "ix")
    cfg = BackendConfig(backend="mih")
    opened = Index.load(tmp_path / "ix")
    assert multi_index(opened, "txt")[1] == "built"
    stem = cache_name("txt", default_substrings(64, 3000), 3000)
    assert sorted(os.listdir(tmp_path / "ix" / "mih")) == [f"{stem}.lock", f"{stem}.offsets.npy", f"{stem}.positions.npy",
                                                             f"{stem}.sketches.npy"]
    reopened = Index.load(tmp_path / "ix")
    assert multi_index(reopened, "txt")[1] == "cached"
    sketches = tmp_path / "ix" / "mih" / f"{stem}.sketches.npy"
    sketches.unlink()  # tables cached before sketches were kept: built again, not read half
    assert multi_index(Index.load(tmp_path / "ix"), "txt")[1] == "built" and sketches.exists()
    assert multi_index(Index.load(tmp_path / "ix"), "txt")[1] == "cached"
    queries = np.concatenate([items[:20], items[3000:3020]])
    served = {}
    got = reopened.search(queries, 10, "txt", backend=cfg, served=served)
    want = reopened.search(queries, 10, "txt")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert served["mih"] + served["scan"] == len(queries) and served["mih"] >= len(queries) // 2
    assert len(served["scanned"]) == served["scan"]
    reopened.add("txt", items[3000:])  # the index grew: the tables are built again, the old ones removed
    tables, how = multi_index(reopened, "txt")
    assert how == "built" and tables.words.shape[0] == 4000
    assert not any(name.startswith(stem) and name.endswith(".npy")
                   for name in os.listdir(tmp_path / "ix" / "mih"))
    whole = Index(64)
    whole.add("txt", items)
    a, b = Index(64), Index(64)
    a.add("txt", items[:1500])
    b.add("txt", items[1500:])
    served = {}
    got = Shards([a, b]).search(queries, 25, "txt", backend=cfg, served=served)
    want = whole.search(queries, 25, "txt")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert served["mih"] + served["scan"] == len(queries) == 40  # each query once, whatever the shards


@needs_probe
def test_device_auto_searches_as_the_cpu_does_where_there_is_no_gpu(monkeypatch):
    """``auto`` on a machine without a GPU is the CPU: the compiled kernels and multi-index hashing serve it
    (they served the CPU's name alone, so ``auto`` fell to the torch path and never probed)."""
    from ucmfh.config import BackendConfig
    from ucmfh.search import Index
    from ucmfh.search import mih as mih_module

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 0)
    monkeypatch.setattr(mih_module, "BUDGET_PER_WORD", 1 / 4)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    rng = np.random.default_rng(4)
    items = codes("clustered", 3000, 64, rng)
    index = Index(64)
    index.add("txt", items)
    queries = items[:20]
    got = {}
    for device in ("cpu", "auto"):
        served = {}
        got[device] = index.search(queries, 10, "txt", device=device, backend=BackendConfig(backend="mih"),
                                   served=served)
        assert served["mih"] >= len(queries) // 2, (device, served)
    assert all(np.array_equal(a, b) for a, b in zip(got["cpu"], got["auto"]))


@needs_probe
def test_far_queries_fall_back_to_the_scan(monkeypatch):
    """Uniform random codes: probing would read more than the scan, so the planner scans, with the same result
    (and a collection too small to probe is scanned outright)."""
    from ucmfh.search import mih as mih_module

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 0)  # probing is tried on these 20,000 items
    monkeypatch.setattr(mih_module, "BUDGET_PER_WORD", 1 / 32)
    rng = np.random.default_rng(5)
    rw = as_words(codes("random", 20000, 64, rng), 64)
    qw = as_words(codes("random", 40, 64, rng), 64)
    mih = MultiIndex(rw, 64)
    served = {}
    got = mih.search(qw, 10, scan=lambda q, k: hamming_search(q, rw, 64, k, threads=1), stats=served)
    want = hamming_search(qw, rw, 64, 10, threads=1)
    assert served["mih"] == 0 and served["scan"] == 40 and served["scanned"].tolist() == list(range(40))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_cli_backend(tiny_path, tmp_path, trained):
    out = str(tmp_path / "ix")
    runner = CliRunner()
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", out, "--quiet"]).exit_code == 0
    base = ["search", out, "-q", tiny_path, "-k", "5", "--json", "-m", "text"]
    exact, mih = runner.invoke(main, base), runner.invoke(main, [*base, "--backend", "mih", "--substrings", "4"])
    assert exact.exit_code == 0 and mih.exit_code == 0, mih.output
    rows = [[json.loads(line) for line in r.stdout.splitlines()] for r in (exact, mih)]
    assert {row.pop("searched_by") for row in rows[1]} == {"scan"}  # a collection this small is scanned
    assert rows[0] == rows[1]  # the same hits, in the same order
    assert "queries by multi-index hashing" in mih.stderr
    # ... and said so, with no tables built for it
    assert "by the scan (under 64,000 items the scan is faster than probing)" in mih.stderr
    assert not os.path.exists(os.path.join(out, "mih"))
    wrong = runner.invoke(main, [*base, "--substrings", "4"])
    assert wrong.exit_code == 2 and "--substrings does not apply to --backend exact" in wrong.output


@needs_probe
def test_shards_say_which_are_too_small_to_probe(monkeypatch):
    """A query is multi-index hashing's where it served every shard: one shard too small to probe made every
    query the scan's, said as if the whole index were small."""
    from ucmfh.config import BackendConfig
    from ucmfh.search import Index
    from ucmfh.search import mih as mih_module
    from ucmfh.search.shards import Shards

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 1000)
    monkeypatch.setattr(mih_module, "BUDGET_PER_WORD", 1 / 4)
    rng = np.random.default_rng(4)
    items = codes("clustered", 3500, 64, rng)
    big, tiny = Index(64), Index(64)
    big.add("txt", items[:3000])
    tiny.add("txt", items[3000:3500])
    served = {}
    Shards([big, tiny]).search(items[:20], 10, "txt", backend=BackendConfig(backend="mih"), served=served)
    assert served["mih"] == 0 and served["small"] == 0 and served["small_shards"] == (1, 2)
    served = {}
    big.search(items[:20], 10, "txt", backend=BackendConfig(backend="mih"), served=served)
    assert served["mih"] >= 10 and not served.get("small")


def test_without_the_compiled_probe_multi_index_hashing_is_the_scan(monkeypatch, tmp_path):
    """Where ucmfh's C kernels are not built (an install without a C compiler), the probe left is numpy's
    reference, one query at a time: about 10× slower than the scan on 100,000 codes. There every query is the
    scan's, as for a collection too small to probe: the same hits, no tables built, and the reason said."""
    from ucmfh.config import BackendConfig
    from ucmfh.search import Index
    from ucmfh.search import mih as mih_module
    from ucmfh.search.shards import Shards

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 1000)
    monkeypatch.setattr(mih_module, "compiled", lambda: False)
    built = []
    monkeypatch.setattr(mih_module, "multi_index", lambda *args: built.append(args))
    items = codes("clustered", 3000, 64, np.random.default_rng(5))
    index = Index(64)
    index.add("txt", items)
    for searched in (index, Shards([index])):
        served = {}
        got = searched.search(items[:20], 10, "txt", backend=BackendConfig(backend="mih"), served=served)
        want = index.search(items[:20], 10, "txt")
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert served["mih"] == 0 and served["scan"] == 20 and served["uncompiled"] == 20 and not served.get("small")
    assert built == []


def test_the_cli_says_why_the_scan_served_without_the_compiled_probe(tiny_path, tmp_path, trained, monkeypatch):
    from ucmfh.search import mih as mih_module

    monkeypatch.setattr(mih_module, "MIN_ITEMS", 10)
    monkeypatch.setattr(mih_module, "compiled", lambda: False)
    out = str(tmp_path / "ix")
    runner = CliRunner()
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", out, "--quiet"]).exit_code == 0
    said = runner.invoke(main, ["search", out, "-q", tiny_path, "-k", "5", "-m", "text", "--backend", "mih"])
    assert said.exit_code == 0, said.output
    assert "by the scan (ucmfh's C kernels are not built here (ucmfh.native_kernels() is None" in said.stderr
