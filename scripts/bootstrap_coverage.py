"""How often `ucmfh compare`'s 95% interval covers a known difference: a simulation of per-query differences.

Each case draws, many times, the per-query differences of two methods with a known mean (0.02), builds the
interval as `compare` does (`ucmfh.metrics.intervals.paired_bootstrap`) and counts how often it covers the
mean. The cases: independent queries (one seed, skewed scores, several seeds with little or much seed-to-seed
variation) and a caption set's queries, five captions of one image sharing an image effect, resampled apart
(as `compare` did before 2026-12-01) and by image (``clusters``, as it does now). An audit's simulation
(2026-12-01), kept so that the figures of docs/evaluation.md have their command:

    OMP_NUM_THREADS=1 python scripts/bootstrap_coverage.py --repeats 500

A coverage well under 0.95 means intervals too narrow; ± is the simulation's own 95% margin.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ucmfh.metrics.intervals import paired_bootstrap

DELTA = 0.02  # the true mean difference
CASES = {
    "independent queries, 1 seed, Q=500": dict(seeds=1, queries=500, query_sd=0.15, seed_sd=0.0, noise_sd=0.05),
    "independent queries, 1 seed, skewed, Q=100": dict(seeds=1, queries=100, query_sd=0.15, seed_sd=0.0,
                                                       noise_sd=0.05, skewed=True),
    "independent queries, 5 seeds, little seed variation": dict(seeds=5, queries=500, query_sd=0.15, seed_sd=0.003,
                                                                noise_sd=0.05),
    "independent queries, 3 seeds, seed variation dominates": dict(seeds=3, queries=500, query_sd=0.15,
                                                                   seed_sd=0.02, noise_sd=0.05),
    "independent queries, 5 seeds, seed variation dominates": dict(seeds=5, queries=500, query_sd=0.15,
                                                                   seed_sd=0.02, noise_sd=0.05),
    "captions of 200 images x5, 1 seed, resampled apart": dict(seeds=1, queries=1000, query_sd=0.05, seed_sd=0.0,
                                                               noise_sd=0.05, captions=5, image_sd=0.15),
    "captions of 200 images x5, 1 seed, resampled by image": dict(seeds=1, queries=1000, query_sd=0.05, seed_sd=0.0,
                                                                  noise_sd=0.05, captions=5, image_sd=0.15,
                                                                  by_image=True),
}


def draw(rng: np.random.Generator, seeds: int, queries: int, query_sd: float, seed_sd: float, noise_sd: float,
         captions: int = 1, image_sd: float = 0.0, skewed: bool = False) -> np.ndarray:
    """Per-query differences [seeds, queries]: the mean, an image effect shared by its captions, a query effect
    shared by the seeds, a seed effect, and noise."""
    image = rng.normal(0, image_sd, queries // captions).repeat(captions)
    query = query_sd * (rng.exponential(1, queries) - 1) if skewed else rng.normal(0, query_sd, queries)
    return DELTA + image + query + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, noise_sd, (seeds, queries))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=500, help="simulated comparisons per case")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of each interval")
    args = parser.parse_args()
    for name, case in CASES.items():
        rng, start, covered = np.random.default_rng(12345), time.time(), 0
        for repeat in range(args.repeats):
            d = draw(rng, **{name: value for name, value in case.items() if name != "by_image"})
            clusters = [np.arange(d.shape[1]) // case["captions"]] if case.get("by_image") else None
            interval = paired_bootstrap([d], resamples=args.resamples, seed=repeat, clusters=clusters)
            covered += interval["low"] <= DELTA <= interval["high"]
        p = covered / args.repeats
        print(f"{name}: coverage {p:.3f} (±{1.96 * np.sqrt(p * (1 - p) / args.repeats):.3f}, {args.repeats} "
              f"repeats, {args.resamples} resamples) [{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
