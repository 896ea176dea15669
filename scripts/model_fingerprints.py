#!/usr/bin/env python3
"""Does a change to the training code leave every trained model as it was, bit for bit? (A refactoring's
check, not a test: the bits depend on the machine's arithmetic, so compare fingerprints taken on one machine.)

Trains the fusion stage, every trained method and SEPS on small synthetic data, each in the shapes its
code paths take (validation and its best epoch, a choice among candidates, a refit, modality dropout, a
streamed split, a saved training state, a caption set), and prints one SHA-256 per run of its weights and its history
(losses, validation scores, best epoch, choice). ``--save FILE`` writes them; ``--check FILE`` compares
and exits 1 on any difference.

    OMP_NUM_THREADS=1 python scripts/model_fingerprints.py --save /tmp/before.json   # on the old code
    OMP_NUM_THREADS=1 python scripts/model_fingerprints.py --check /tmp/before.json  # on the new code
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the suite's token fixture (conftest.token_splits)

from ucmfh.config import FusionConfig, SepsConfig  # noqa: E402
from ucmfh.data.h5 import load_dataset  # noqa: E402
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic  # noqa: E402
from ucmfh.data.writer import write_dataset  # noqa: E402
from ucmfh.training_state import StateFile  # noqa: E402
from ucmfh.fusion_stage import fit_fusion  # noqa: E402
from ucmfh.methods import METHODS, fit_hashing, hash_config  # noqa: E402
from ucmfh.seps.fit import fit_seps  # noqa: E402

TINY = SyntheticSpec(n_query=80, n_retrieval=600, n_train=400, n_classes=24, mean_extra_labels=1.0,
                     d_img=48, d_txt=32, d_latent=16, noise=1.0, item_scale=0.5)


def weights_digest(model: torch.nn.Module) -> "hashlib._Hash":
    """SHA-256 of a model's weights: names, dtypes, shapes, bytes (``scripts/bench_streams.py`` compares models so)."""
    h = hashlib.sha256()
    for name, value in model.state_dict().items():
        h.update(f"{name} {value.dtype} {tuple(value.shape)}".encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h


def fingerprint(model: torch.nn.Module, history) -> str:
    """SHA-256 of the weights (:func:`weights_digest`) and of the history's record."""
    h = weights_digest(model)
    h.update(json.dumps(history.as_dict(), sort_keys=True, default=str).encode())
    return h.hexdigest()


def runs(tmp: Path) -> List[Tuple[str, Callable[[], Tuple[torch.nn.Module, object]]]]:
    """Each named run, as a function that trains it."""
    data = load_dataset(make_synthetic(tmp / "tiny.h5", TINY))
    streamed = load_dataset(tmp / "tiny.h5", max_memory_bytes=1)  # every split read from the file
    from conftest import caption_file
    captions = load_dataset(caption_file(tmp / "captions.h5"))  # no labels: relevance by id, R@K
    fusion_cfg = FusionConfig(d_model=64, n_heads=4, d_ff=128, epochs=3, batch_size=64, lr=1e-3, device="cpu",
                              val_fraction=0.2, patience=0, modality_dropout=0.3)
    fusion = {}

    def teacher():
        if "model" not in fusion:
            fusion["model"] = fit_fusion(data, fusion_cfg, progress=False)[0]
        return copy.deepcopy(fusion["model"])

    def method(name: str, on=data, state: bool = False, **kw):
        def run():
            cfg = hash_config(name, drop_unused=True, **{"n_bits": 16, "hidden": 32, "epochs": 3, "batch_size": 64,
                                                         "device": "cpu", "val_fraction": 0.2, "patience": 0, **kw})
            saved = StateFile(str(tmp / f"{name}.state.pt"), interval_s=0) if state else None
            return fit_hashing(on, cfg, teacher() if METHODS[name].uses_fusion else None, progress=False,
                               state=saved)
        return run

    def seps():
        from conftest import token_splits
        path = write_dataset(tmp / "tok.h5", token_splits(), attrs={"name": "tok"})
        cfg = SepsConfig(embed_dim=32, epochs=3, batch_size=32, lr=3e-3, device="cpu", val_fraction=0.2,
                         patience=0, pair_chunk=256)
        return fit_seps(path, cfg, progress=False)

    out = [("fusion", lambda: fit_fusion(data, fusion_cfg, progress=False)),
           ("fusion streamed", lambda: fit_fusion(streamed, dataclasses.replace(fusion_cfg, epochs=2),
                                                  progress=False))]
    out += [(name, method(name)) for name in METHODS]
    out += [("two-tower refit", method("two-tower", refit=True)),
            ("two-tower streamed", method("two-tower", on=streamed)),
            ("two-tower saved state", method("two-tower", state=True)),
            ("ucmfh auto relaxation", method("ucmfh", relaxation="auto")),
            ("djsrh no validation", method("djsrh", val_fraction=0.0)),
            ("two-tower captions", method("two-tower", on=captions)),
            ("fusion captions", lambda: fit_fusion(captions, fusion_cfg, progress=False)),
            ("seps", seps)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--save", help="write the fingerprints to this JSON file")
    p.add_argument("--check", help="compare with the fingerprints in this JSON file; exit 1 on a difference")
    p.add_argument("--only", default="", help="comma-separated run names (default: all)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    want: Dict[str, str] = json.loads(Path(args.check).read_text()) if args.check else {}
    got: Dict[str, str] = {}
    only = set(filter(None, args.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in runs(Path(tmp)):
            if only and name not in only:
                continue
            got[name] = fingerprint(*run())
            mark = "" if not want else ("same" if want.get(name) == got[name] else "DIFFERENT")
            print(f"{name:<24} {got[name][:16]} {mark}", flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(got, indent=1) + "\n")
    differ = [name for name in got if want and want.get(name) != got[name]]
    if args.check:
        print(f"{len(got) - len(differ)} of {len(got)} runs the same" + (f"; different: {differ}" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
