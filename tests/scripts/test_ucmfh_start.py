"""scripts/ucmfh_start.py: UCMFH's task 1 from the trained fusion stage and from random weights, side by side on a
tiny set: a row per seed, length and start, each start the run its front door trains."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, SCRIPTS


def test_both_starts_of_ucmfh_are_trained_and_scored(tiny_path, tmp_path):
    out = tmp_path / "rows.json"
    ran = subprocess.run([sys.executable, str(SCRIPTS / "ucmfh_start.py"), tiny_path, "--bits", "16", "--epochs", "1",
                          "--seed", "3", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert ran.returncode == 0, ran.stderr
    rows = json.loads(out.read_text())
    assert [(r["seed"], r["n_bits"], r["fusion_start"], r["epochs"]) for r in rows] == [(3, 16, "trained", 1),
                                                                                      (3, 16, "random", 1)]
    assert all(len(r["unimodal"]) == len(r["fused"]) == 2 for r in rows) and rows[0]["unimodal"] != rows[1]["unimodal"]
    assert "16 bits  random" in ran.stdout and "(1 seeds)" in ran.stdout
