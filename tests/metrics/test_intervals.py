"""The paired bootstrap against a slow transcription of its resampling (ucmfh.metrics.intervals)."""
from __future__ import annotations

import numpy as np
import pytest

from ucmfh.metrics.intervals import _BATCH, cluster_sums, paired_bootstrap


def _slow(parts, resamples, level, seed, clusters=None, batch=_BATCH):
    """The resampling as first written: each seed's draws gathered and averaged, one seed at a time, ``batch``
    resamples drawn at once."""
    parts = [np.asarray(p, dtype=np.float64) for p in parts]
    n_seeds = parts[0].shape[0]
    if clusters is not None:  # the clusters' sums, as the bootstrap adds them up (unchanged): its resampling below
        units, sums, counts = cluster_sums(parts, clusters)
    rng = np.random.default_rng(seed)
    figures = np.zeros(resamples)
    for start in range(0, resamples, batch):
        b = min(batch, resamples - start)
        seeds = rng.integers(0, n_seeds, (b, n_seeds)) if n_seeds > 1 else np.zeros((b, 1), dtype=np.int64)
        drawn = None if clusters is None else rng.integers(0, len(units), (b, len(units)))
        for i, p in enumerate(parts):
            if drawn is None:
                queries = rng.integers(0, p.shape[1], (b, p.shape[1]))
                per_seed = np.stack([p[s][queries].mean(axis=1) for s in range(n_seeds)], axis=1)
            else:
                n = counts[i][drawn].sum(axis=1)
                per_seed = np.stack([np.where(n > 0, sums[i][s][drawn].sum(axis=1) / np.maximum(n, 1), p[s].mean())
                                     for s in range(n_seeds)], axis=1)
            figures[start: start + b] += np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)
    return np.percentile(figures, [50 * (1 - level), 50 * (1 + level)])


@pytest.mark.parametrize("n_seeds", [1, 3])
@pytest.mark.parametrize("clustered", [False, True])
def test_the_bootstrap_resamples_as_its_slow_transcription(n_seeds, clustered):
    """Each resample's mean is one matrix product of how often each query (cluster) is drawn, where it gathered
    every draw seed by seed (0.5 s an interval at 50 seeds × 693 queries); the draws are the same, so the
    intervals are the slow code's to rounding. Two parts, the second's clusters a subset of the numbering (a
    resample that draws none of them keeps that part's own figure)."""
    rng = np.random.default_rng(7)
    parts = [rng.normal(size=(n_seeds, 37)), rng.normal(0.1, 1.0, size=(n_seeds, 12))]
    clusters = [np.arange(37) // 2, 40 + np.arange(12) // 6] if clustered else None
    got = paired_bootstrap(parts, resamples=2 * _BATCH + 17, level=0.9, seed=3, clusters=clusters)
    low, high = _slow(parts, 2 * _BATCH + 17, 0.9, 3, clusters)
    assert got["low"] == pytest.approx(low, rel=1e-12, abs=1e-12) and got["high"] == pytest.approx(high, rel=1e-12, abs=1e-12)
    assert got["mean"] == pytest.approx(sum(p.mean() for p in parts)) and got["low"] < got["mean"] < got["high"]


@pytest.mark.parametrize("clustered", [False, True])
def test_a_bootstrap_of_many_queries_draws_fewer_resamples_at_once(clustered, monkeypatch):
    """250 resamples were drawn at once whatever the queries: 1M queries took 7.9 GB (an audit's, at 1,000
    resamples). Where a part's queries (or the clusters) times 250 pass the bound of indices drawn at once, fewer
    resamples are drawn at a time, as the slow transcription does at that batch; below it, as it always did."""
    import ucmfh.metrics.intervals as intervals

    rng = np.random.default_rng(8)
    parts = [rng.normal(size=(2, 37)), rng.normal(0.1, 1.0, size=(2, 12))]
    clusters = [np.arange(37) // 2, 40 + np.arange(12) // 6] if clustered else None
    widest = 21 if clustered else 37  # the clusters of every part (19 + 2), or the queries of the widest part
    monkeypatch.setattr(intervals, "_DRAWN", 10 * widest + 3)
    sizes = []
    times_drawn = intervals._times_drawn
    monkeypatch.setattr(intervals, "_times_drawn", lambda drawn, n: sizes.append(drawn.size) or times_drawn(drawn, n))
    got = paired_bootstrap(parts, resamples=97, level=0.9, seed=3, clusters=clusters)
    assert max(sizes) <= 10 * widest + 3 and len(sizes) == (10 if clustered else 20)  # batches of 10, the last 7
    low, high = _slow(parts, 97, 0.9, 3, clusters, batch=10)
    assert got["low"] == pytest.approx(low, rel=1e-12, abs=1e-12) and got["high"] == pytest.approx(high, rel=1e-12, abs=1e-12)
