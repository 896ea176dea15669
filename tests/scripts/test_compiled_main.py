"""scripts/compiled_main.py and bench_steps' compiled losses: a plan's loss is compiled for its full batches
only (an epoch's short last batch runs the loss as it is, rather than compiling it again for that size), and
the main job so compiled trains the eager job's model within float rounding (on the CPU, slow: inductor
compiles the fusion and the hashing stage for the CPU in about a minute)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_script
from ucmfh.trainer import Batch, Plan

bench = load_script("bench_steps")
ROOT = Path(__file__).resolve().parents[2]


def _batch(size: int) -> Batch:
    return Batch(torch.arange(size), None, epoch=0, iteration=0)


def test_a_loss_is_compiled_for_the_first_batch_s_size_and_other_sizes_run_it_as_it_is(monkeypatch):
    calls = []

    def fake_compile(fn, dynamic=None):  # torch.compile's place: what it is asked, and which calls reach it
        calls.append(("compile", dynamic))
        return lambda batch: (calls.append(("compiled", len(batch.index))), fn(batch))[1]

    monkeypatch.setattr(bench.torch, "compile", fake_compile)
    loss = bench.compiled_for_full_batches(lambda batch: float(len(batch.index)))
    assert calls == [("compile", False)]  # shapes static: one compile, no recompile for a new size
    assert [loss(_batch(n)) for n in (8, 8, 3, 8, 3)] == [8.0, 8.0, 3.0, 8.0, 3.0]
    assert [c for c in calls if c[0] == "compiled"] == [("compiled", 8)] * 3  # the short batches ran it as it is


def test_inside_compiled_losses_every_plan_made_has_its_loss_compiled_and_only_there(monkeypatch):
    compiled = []
    monkeypatch.setattr(bench.torch, "compile", lambda fn, dynamic=None: compiled.append(fn) or fn)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(batch):
        return model(torch.ones(len(batch.index), 2)).sum()

    def plan() -> Plan:
        return Plan("stage", model, {"model": model}, optimizer, 8, loss=loss)

    import torch._inductor.config as inductor
    random = inductor.fallback_random
    with bench.compiled_losses():
        inside = plan()
        assert inductor.fallback_random  # dropout by torch's own kernels, which a CUDA graph captures
    outside = plan()
    assert compiled == [loss] and inside.loss is not loss and outside.loss is loss
    assert inductor.fallback_random == random and inside.loss(_batch(4)).item() == loss(_batch(4)).item()


@pytest.mark.slow  # about 2 minutes on 2 cores: inductor compiles both stages for the CPU
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="inductor compiles C++ for the CPU")
def test_the_compiled_main_job_trains_the_eager_job_s_model_within_rounding(tmp_path):
    from ucmfh.data.synthetic import SyntheticSpec, make_synthetic

    data = make_synthetic(tmp_path / "small.h5", SyntheticSpec(n_query=100, n_retrieval=600, n_train=300,
                                                              d_img=32, d_txt=32, d_latent=8))
    rows = {}
    for name, script in (("eager", ROOT / "demo.py"), ("compiled", ROOT / "scripts" / "compiled_main.py")):
        results = tmp_path / f"{name}.jsonl"
        subprocess.run([sys.executable, str(script), "--task", "1", "--dataset", data, "--hash_lens", "16",
                        "--epoch", "2", "--batch_size", "64", "--device", "cpu", "--protocol", "unimodal",
                        "--out", str(tmp_path / name), "--results", str(results)],
                       check=True, capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                            "PYTHONPATH": str(ROOT)})
        rows[name] = [json.loads(line) for line in results.read_text().splitlines()]
    hashing = {name: next(r for r in found if r["task"] == "hashing") for name, found in rows.items()}
    for field in ("map_i2t", "map_t2i"):
        assert abs(hashing["compiled"][field] - hashing["eager"][field]) < 0.02
    assert hashing["compiled"]["n_bits"] == 16 and hashing["compiled"]["epochs"] == 2
