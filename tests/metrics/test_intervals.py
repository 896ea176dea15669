"""The paired bootstrap against a slow transcription of its resampling (ucmfh.metrics.intervals)."""
from __future__ import annotations

import numpy as np
import pytest

from ucmfh.metrics.intervals import _BATCH, cluster_sums, paired_bootstrap


def _slow(parts, resamples, level, seed, clusters=None):
    """The resampling as first written: each seed's draws gathered and averaged, one seed at a time."""
    parts = [np.asarray(p, dtype=np.float64) for p in parts]
    n_seeds = parts[0].shape[0]
    if clusters is not None:  # the clusters' sums, as the bootstrap adds them up (unchanged): its resampling below
        units, sums, counts = cluster_sums(parts, clusters)
    rng = np.random.default_rng(seed)
    figures = np.zeros(resamples)
    for start in range(0, resamples, _BATCH):
        b = min(_BATCH, resamples - start)
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
