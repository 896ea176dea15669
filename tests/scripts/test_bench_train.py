"""scripts/bench_train.py's throughput after a fit's first epoch: each epoch's seconds come from the reference's
own loop and from ucmfh's training log, and the rate leaves the first epoch (its set-up, a capture) out."""
from __future__ import annotations

import argparse

import pytest
import torch

from conftest import load_script

bench = load_script("bench_train")


@pytest.mark.parametrize("variant, stage", [("ref", "fusion"), ("ours-none", "fusion"), ("ours-none", "hashing")])
def test_a_fit_records_each_epoch_and_its_rate_after_the_first(tiny, variant, stage):
    args = argparse.Namespace(device=torch.device("cpu"), batch_size=32, n_bits=16, modality_dropout=0.5)
    run = bench.run_stage(variant, stage, tiny, args, 3)
    assert len(run.seconds) == 3 and all(s > 0 for s in run.seconds)
    per_epoch = run.n_items / 3
    assert bench.steady_rate(run) == pytest.approx(2 * per_epoch / sum(run.seconds[1:]))
    assert bench.steady_rate(bench.run_stage(variant, stage, tiny, args, 1)) is None  # nothing after its first
