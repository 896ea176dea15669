#!/usr/bin/env python3
"""The main job with every training plan's loss compiled by ``torch.compile`` (an experiment, not a test):
``demo.py``'s command, its arguments as they are, inside ``bench_steps.compiled_losses()``.

Issue 48's goal 1 asks for the main job in 15 s on one GPU; its captured steps were measured bound by their
kernels (about 250 a fusion step, 340 a ``ucmfh`` one, 5 µs each on an H200), and inductor's fused kernels are
the lever left for fewer of them. ``bench_steps.py --compile`` times one step so; this runs the whole job so,
the compile included, to say what a user would wait: its wall seconds and its MAPs beside the captured job's.
Each stage's loss is compiled for its full batches, in the captured step's warm-up, and captured with the step;
an epoch's short last batch runs the loss as it is (:func:`bench_steps.compiled_for_full_batches`). Inductor
keeps what it compiled in its cache (``TORCHINDUCTOR_CACHE_DIR``), so a second run of the same job compiles
less: the GPU checklist's ``compile`` group runs it on an empty cache, then again.

    python scripts/compiled_main.py --task 1 --dataset synthetic --hash_lens 64 --epoch 100
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # demo.py
sys.path.insert(0, str(ROOT / "scripts"))  # bench_steps.py

import demo  # noqa: E402
from bench_steps import compiled_losses  # noqa: E402

if __name__ == "__main__":
    with compiled_losses():
        sys.exit(demo.main())
