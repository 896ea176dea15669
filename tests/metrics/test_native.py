"""The compiled Hamming kernels (ucmfh/metrics/_hamming.c) against numpy stable sorts and the torch path.

test_metrics.py runs every metric on both paths on small cases; here the cases are
large enough to reach the kernels' own branches: retrieval tiles (8,192 items),
codes of 1, 2 and more 64-bit words, more than 64 labels, the bucket and the
counting top-K, query groups, threads, and every build chosen for the CPU.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ucmfh.codes import pack_codes
from ucmfh.metrics import average_precision_at_k, backend, native_kernels, pr_curve_hamming, top_k

if native_kernels() is None:
    if os.environ.get("UCMFH_REQUIRE_NATIVE") == "1":
        raise RuntimeError("UCMFH_REQUIRE_NATIVE=1 but ucmfh.metrics._hamming is not built")
    pytest.skip("the compiled Hamming kernels are not built", allow_module_level=True)

from ucmfh.metrics import _hamming  # noqa: E402


@pytest.fixture(params=["dispatched", "generic"])
def build(request):
    """The build chosen for this CPU, and the portable one."""
    _hamming.use_generic(request.param == "generic")
    yield request.param
    _hamming.use_generic(False)


def codes(n, n_bits, seed, dup_every=5):
    """±1 codes with many exact duplicates (ties at every distance)."""
    rng = np.random.default_rng(seed)
    c = rng.choice([-1.0, 1.0], size=(n, n_bits)).astype(np.float32)
    c[1::dup_every] = c[0]
    return torch.from_numpy(c)


def labels(n, n_classes, seed):
    rng = np.random.default_rng(seed)
    return torch.from_numpy((rng.random((n, n_classes)) < 2.0 / n_classes).astype(np.uint8))


def numpy_ranking(q, r):
    """(distances, order) of every query over the whole set, by a stable numpy sort."""
    dist = ((q.numpy()[:, None, :] != r.numpy()[None, :, :]).sum(-1)).astype(np.int64)
    order = np.argsort(dist, axis=1, kind="stable")
    return np.take_along_axis(dist, order, axis=1), order


def torch_path(fn, *args, **kw):
    with backend("torch"):
        return fn(*args, **kw)


@pytest.mark.parametrize("n_bits,k", [(8, 1), (12, 50), (16, 50), (64, 50), (64, 1000), (128, 600), (200, 37)])
def test_top_k_equals_stable_sort(build, n_bits, k):
    """Ties across tile boundaries (N > 8,192); (n_bits + 1) * k > 65,536 takes the counting top-K."""
    q, r = codes(7, n_bits, 1), codes(9000, n_bits, 2)
    r[8000:8400] = r[3]  # a run of equal codes across the first tile boundary
    dist, idx = top_k(q, r, k)
    exp_d, exp_i = numpy_ranking(q, r)
    assert np.array_equal(idx.numpy(), exp_i[:, :k])
    assert np.array_equal(dist.numpy(), exp_d[:, :k])


def test_top_k_query_groups_and_threads(build):
    """65 * 1000 slots per query: the bucket top-K runs in groups of 64 queries; 3 threads split them."""
    q, r = codes(150, 64, 3, dup_every=3), codes(1500, 64, 4, dup_every=3)
    exp_d, exp_i = numpy_ranking(q, r)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 3):
            torch.set_num_threads(n_threads)
            dist, idx = top_k(q, r, 1000, chunk_size=1000)
            assert np.array_equal(idx.numpy(), exp_i[:, :1000])
            assert np.array_equal(dist.numpy(), exp_d[:, :1000])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("n_bits,n_classes", [(16, 21), (64, 81), (130, 5)])
def test_map_and_histograms_equal_torch_path(build, n_bits, n_classes):
    """AP@K, MAP@all and the PR curve: bit-identical to the torch path (81 labels: two label words)."""
    q, r = codes(40, n_bits, 5), codes(10_000, n_bits, 6)
    ql, rl = labels(40, n_classes, 7), labels(10_000, n_classes, 8)
    ql[0] = 0  # no relevant item
    for k in (50, 600, 10_000, None):  # 600 at 130 bits: the counting top-K; 10,000 = N: counting AP
        native = average_precision_at_k(q, r, ql, rl, k=k, chunk_size=16)
        assert torch.equal(native, torch_path(average_precision_at_k, q, r, ql, rl, k=k))
    assert pr_curve_hamming(q, r, ql, rl) == torch_path(pr_curve_hamming, q, r, ql, rl)


def test_packed_input_with_padding(build):
    """Packed uint8 codes of 13 bits: the padding bits are zero on both sides and add nothing."""
    q, r = codes(9, 13, 9), codes(500, 13, 10)
    pq, pr = torch.from_numpy(pack_codes(q)), torch.from_numpy(pack_codes(r))
    d1, i1 = top_k(pq, pr, 77)
    d2, i2 = top_k(q, r, 77)
    assert torch.equal(i1, i2) and torch.equal(d1, d2)


def test_kernels_check_their_buffers():
    q = np.zeros((3, 1), dtype=np.uint64)
    r = np.zeros((10, 1), dtype=np.uint64)
    idx = np.empty((3, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="retrieval codes: expected 88 bytes"):
        _hamming.top_k(q, r, 3, 11, 1, 64, 4, idx, idx.copy())
    for k in (-1, 0, 11):
        with pytest.raises(ValueError, match="k must be in 1 .. 10"):
            _hamming.top_k(q, r, 3, 10, 1, 64, k, idx, idx.copy())
    labels = np.zeros((3, 1), dtype=np.uint64), np.zeros((10, 1), dtype=np.uint64)
    with pytest.raises(ValueError, match="k must be in 1 .. 10"):
        _hamming.average_precision(q, r, 3, 10, 1, 64, 0, *labels, 1, 1.0, idx[:, 0].copy(), idx[:, 0].copy())
    with pytest.raises(ValueError, match="bad sizes"):
        _hamming.top_k(q, r, 3, 10, 1, 65, 4, idx, idx.copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        _hamming.top_k(q, r, 3, 10, 1, 64, 4, idx, np.empty((4, 3), dtype=np.int64).T)


@pytest.mark.parametrize("n_bits", [12, 64, 128])
def test_tie_aware_map_and_multi_index_on_every_build(build, n_bits):
    """The histograms cut at k (tie-aware metrics) and the multi-index probing, in the build chosen for
    this CPU and in the portable one, against the torch path and the scan; past a retrieval tile."""
    from ucmfh.metrics import map_at_k
    from ucmfh.bits import as_words
    from ucmfh.search.scan import hamming_search
    from ucmfh.search.mih import MultiIndex

    q, r = codes(40, n_bits, 1), codes(9000, n_bits, 2)
    ql, rl = labels(40, 70, 3), labels(9000, 70, 4)
    for k in (1, 50, 700):
        want = torch_path(map_at_k, q, r, ql, rl, k, ties="expected")
        assert map_at_k(q, r, ql, rl, k, ties="expected") == pytest.approx(want, abs=1e-12)
    rw, qw = as_words(r.numpy(), n_bits), as_words(q.numpy(), n_bits)
    for k in (1, 10, 300):
        got = MultiIndex(rw, n_bits).search(qw, k)
        scan = hamming_search(qw, rw, n_bits, k, threads=1)
        assert np.array_equal(got[0], scan[0]) and np.array_equal(got[1], scan[1])
