"""Multi-index hashing (ucmfh.search.mih): the linear scan's exact top k, item for item, ties by position."""
import numpy as np
import pytest

from ucmfh.search.index import as_words, hamming_search
from ucmfh.search.kernels import kernels_module
from ucmfh.search.mih import MultiIndex, _layout, default_substrings, popcount

COMPILED = (True, False) if kernels_module() is not None else (False,)


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
    for m in (None, default_substrings(n_bits, 1500) + 1):
        mih = MultiIndex(rw, n_bits, m)
        for k in (1, 10, 100, 2000):  # 2000: more than the collection
            want = hamming_search(qw, rw, n_bits, k, threads=1)
            for compiled in COMPILED:  # the kernel, and the numpy reference
                got = mih.search(qw, k, threads=2, compiled=compiled)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (m, k, compiled)


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


def test_popcount_matches_a_bit_count():
    words = np.array([0, 1, 2**63, 2**64 - 1, 0x0F0F], dtype=np.uint64)
    assert popcount(words).tolist() == [0, 1, 1, 64, 8]
