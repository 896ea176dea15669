"""Whole experiments for the front doors (``ucmfh`` and ``demo.py``): train, save, evaluate, record."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ucmfh.checkpoint import load_model, read_checkpoint, save_checkpoint
from ucmfh.config import PROTOCOLS, FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset
from ucmfh.files import PathLike, append_jsonl
from ucmfh.data.synthetic import make_synthetic
from ucmfh.codes import save_codes
from ucmfh.scoring import encode_split, evaluate_fusion, evaluate_hashing, random_codes_map
from ucmfh.models.fusion import FusionEncoder
from ucmfh.train import fit_fusion, fit_hashing
from ucmfh.utils import resolve_device

PROTOCOL_NOTES = {
    "unimodal": "cross-modal: image codes from images alone, text codes from texts alone",
    "fused": "UCMFH's protocol: every code also sees its item's paired modality (not cross-modal retrieval)",
}


def resolve_dataset(name: str, data_dir: PathLike) -> str:
    """The file for a dataset name (``DATA_DIR/NAME.h5``) or path; ``synthetic`` is created on first use."""
    if name.endswith((".h5", ".hdf5")) or os.sep in name:
        if not os.path.exists(name):
            raise FileNotFoundError(f"{name}: no such dataset file")
        return name
    path = os.path.join(os.fspath(data_dir), f"{name}.h5")
    if os.path.exists(path):
        return path
    if name == "synthetic":
        return make_synthetic(path)
    found = sorted(f[:-3] for f in os.listdir(data_dir) if f.endswith(".h5")) if os.path.isdir(data_dir) else []
    raise FileNotFoundError(
        f"{path}: no such dataset file (datasets in {data_dir}: {found or 'none'}); "
        "convert yours with 'ucmfh convert', or use --dataset synthetic"
    )


def run_dir(root: PathLike, dataset: str, loss: str, seed: int) -> str:
    """Where a run's checkpoints go: ``ROOT/DATASET/LOSS-seedSEED``."""
    return os.path.join(os.fspath(root), dataset, f"{loss}-seed{seed}")


def fusion_path(directory: str) -> str:
    return os.path.join(directory, "fusion.pt")


def hash_path(directory: str, n_bits: int) -> str:
    return os.path.join(directory, f"hash{n_bits}.pt")


def git_commit() -> Optional[str]:
    """The commit of the ucmfh source tree, when it is a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True, text=True, timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _rows(
    scores: List[Dict[str, Any]], data: Dataset, task: str, loss: str, seed: int,
    epochs: int, seconds: float, device: str, checkpoint: str, n_bits: Optional[int] = None,
    extra: Optional[Dict[str, Any]] = None,
) -> List[Dict[str, Any]]:
    common = {
        "dataset": data.name, "task": task, "loss": loss, "n_bits": n_bits,
        "ranking": "hamming" if n_bits else "cosine", "seed": seed, "epochs": epochs,
        "train_time_s": round(seconds, 2), "device": str(resolve_device(device)),
        "checkpoint": checkpoint, "git_commit": git_commit(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return [{**common, **row, **(extra or {})} for row in scores]


def train_fusion_stage(
    data: Dataset, cfg: FusionConfig, out_dir: str, protocols: Sequence[str] = PROTOCOLS,
    k: int = 50, progress: bool = True,
) -> List[Dict[str, Any]]:
    """Task 0: train the fusion encoder, save it, and score its embeddings by cosine ranking."""
    start = time.perf_counter()
    fusion, history = fit_fusion(data, cfg, progress=progress)
    seconds = time.perf_counter() - start
    path = save_checkpoint(fusion_path(out_dir), fusion, cfg, meta={"dataset": data.name, "loss_history": history})
    scores = evaluate_fusion(fusion, data, protocols, k, cfg.device, progress)
    return _rows(scores, data, "fusion", cfg.loss, cfg.seed, cfg.epochs, seconds, cfg.device, path)


def load_or_train_fusion(
    data: Dataset, cfg: FusionConfig, out_dir: str, progress: bool = True, log=print,
) -> Tuple[FusionEncoder, FusionConfig]:
    """The run's saved fusion encoder and its config, or a new one trained (and saved) when there is none."""
    path = fusion_path(out_dir)
    if os.path.exists(path):
        fusion, saved_cfg, _, _ = load_model(path, "fusion", d_img=data.d_img, d_txt=data.d_txt)
        log(f"fusion encoder: {path} (trained {saved_cfg.epochs} epochs, loss {saved_cfg.loss})")
        differ = [
            f"{name}={getattr(saved_cfg, name)!r} (asked: {getattr(cfg, name)!r})"
            for name in (f.name for f in dataclasses.fields(FusionConfig))
            if name != "device" and getattr(saved_cfg, name) != getattr(cfg, name)
        ]
        if differ:
            log(f"note: the saved fusion encoder was trained with other settings: {', '.join(differ)}; "
                f"it is used as saved. Delete {path} (or train-fusion again) to use the new settings.")
        return fusion, saved_cfg
    log(f"fusion encoder: none at {path}; training it first (task 0)")
    fusion, history = fit_fusion(data, cfg, progress=progress)
    save_checkpoint(path, fusion, cfg, meta={"dataset": data.name, "loss_history": history})
    return fusion, cfg


def train_hash_stage(
    data: Dataset, fusion_cfg: FusionConfig, hash_cfg: HashConfig, out_dir: str,
    protocols: Sequence[str] = PROTOCOLS, k: int = 50, progress: bool = True, log=print,
) -> List[Dict[str, Any]]:
    """Task 1: train hash heads on the run's fusion encoder, save the model, score its codes."""
    fusion, fusion_cfg = load_or_train_fusion(data, fusion_cfg, out_dir, progress, log)
    start = time.perf_counter()
    model, history = fit_hashing(data, hash_cfg, fusion, progress=progress)
    seconds = time.perf_counter() - start
    path = save_checkpoint(hash_path(out_dir, hash_cfg.n_bits), model, fusion_cfg, hash_cfg,
                           meta={"dataset": data.name, "loss_history": history})
    return score_hash_model(model, data, hash_cfg, path, seconds, protocols, k, progress)


def score_hash_model(
    model, data: Dataset, hash_cfg: HashConfig, checkpoint: str, seconds: float,
    protocols: Sequence[str] = PROTOCOLS, k: int = 50, progress: bool = False,
) -> List[Dict[str, Any]]:
    scores = evaluate_hashing(model, data, protocols, k, hash_cfg.device, progress)
    floor = random_codes_map(data, hash_cfg.n_bits, k, seed=hash_cfg.seed)
    extra = {"random_map_i2t": floor["map_i2t"], "random_map_t2i": floor["map_t2i"]}
    return _rows(scores, data, "hashing", hash_cfg.loss, hash_cfg.seed, hash_cfg.epochs, seconds,
                 hash_cfg.device, checkpoint, hash_cfg.n_bits, extra)


def evaluate_checkpoint(
    data: Dataset, path: str, protocols: Sequence[str] = PROTOCOLS, k: int = 50,
    device: str = "auto", n_bits: Optional[int] = None, progress: bool = True,
) -> List[Dict[str, Any]]:
    """Tasks 2/3: reload a fusion or hashing checkpoint and score it on ``data``."""
    kind = read_checkpoint(path)["kind"]
    model, fusion_cfg, hash_cfg, _ = load_model(path, kind, d_img=data.d_img, d_txt=data.d_txt, n_bits=n_bits)
    if kind == "fusion":
        scores = evaluate_fusion(model, data, protocols, k, device, progress)
        return _rows(scores, data, "fusion", fusion_cfg.loss, fusion_cfg.seed, fusion_cfg.epochs, 0.0, device, path)
    hash_cfg.device = device
    return score_hash_model(model, data, hash_cfg, path, 0.0, protocols, k, progress)


def encode_checkpoint(
    data: Dataset, checkpoint: str, out: PathLike, protocol: str = "unimodal",
    device: str = "auto", progress: bool = True,
) -> str:
    """Write the query and retrieval codes of a hashing checkpoint to a codes file (packed bits)."""
    model, fusion_cfg, hash_cfg, _ = load_model(checkpoint, "hash", d_img=data.d_img, d_txt=data.d_txt)
    query = encode_split(model, data.query, protocol, device, progress=progress)
    retrieval = encode_split(model, data.retrieval, protocol, device, progress=progress)
    return save_codes(
        out, query_img=query[0].cpu(), query_txt=query[1].cpu(),
        retrieval_img=retrieval[0].cpu(), retrieval_txt=retrieval[1].cpu(),
        query_labels=data.query.labels, retrieval_labels=data.retrieval.labels,
        query_ids=data.query.ids, retrieval_ids=data.retrieval.ids,
        attrs={"dataset": data.name, "protocol": protocol, "loss": hash_cfg.loss,
               "checkpoint": os.path.abspath(checkpoint), "seed": hash_cfg.seed},
    )


def append_results(path: PathLike, rows: List[Dict[str, Any]]) -> None:
    """Append result rows to a JSON-lines file (locked, one write per row: concurrent runs keep every row)."""
    append_jsonl(path, rows)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A small plain-text table of MAP rows, with what each protocol means."""
    lines = [f"{'dataset':<14}{'task':<9}{'loss':<10}{'bits':>5}  {'protocol':<9}{'MAP@k':>6}{'I->T':>8}{'T->I':>8}"]
    for r in rows:
        bits = r["n_bits"] or "-"
        lines.append(f"{r['dataset']:<14}{r['task']:<9}{r['loss']:<10}{bits:>5}  {r['protocol']:<9}"
                     f"{r['k']:>6}{r['map_i2t']:>8.4f}{r['map_t2i']:>8.4f}")
    floors = {(r["dataset"], r["n_bits"]): r for r in rows if "random_map_i2t" in r}
    for (name, bits), r in floors.items():
        lines.append(f"{name:<14}{'random':<9}{'-':<10}{bits:>5}  {'-':<9}{r['k']:>6}"
                     f"{r['random_map_i2t']:>8.4f}{r['random_map_t2i']:>8.4f}")
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        lines.append(f"  {protocol}: {PROTOCOL_NOTES[protocol]}")
    return "\n".join(lines)

