"""Per-query scores of a scored run: a compact side file beside its checkpoint, not in the results row.

A hashing run's rows are means over queries; the intervals of ``ucmfh compare`` need the
scores they are means of. :func:`save_per_query` writes them (tie-aware, float32) to
``hashN.queries-FINGERPRINT.npz`` beside ``hashN.pt`` — one file per checkpoint and dataset,
so scoring a checkpoint on another dataset writes another file — and puts its path in each
row (``per_query``). Keys: ``PROTOCOL/DATABASE/NAME`` (DATABASE ``-`` for a labelled set;
NAME ``ap_i2t``, ``ap_t2i`` and, for a caption set, ``hits_i2t``, ``hits_t2i`` [Q, 3]).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

import numpy as np

from ucmfh.files import atomic_file


def per_query_path(checkpoint: str, fingerprint: str) -> str:
    """Where the per-query scores of ``checkpoint`` on the dataset ``fingerprint`` are kept."""
    stem = checkpoint[: -len(".pt")] if checkpoint.endswith(".pt") else checkpoint
    return f"{stem}.queries-{fingerprint[:12]}.npz"


def _key(row: Dict[str, Any], name: str) -> str:
    return f"{row.get('protocol')}/{row.get('database') or '-'}/{name}"


def save_per_query(rows: List[Dict[str, Any]], checkpoint: str) -> None:
    """Move the rows' ``per_query`` arrays into one file beside ``checkpoint`` (atomically), leaving
    its path in each row. Rows without them are left as they are."""
    scored = [row for row in rows if isinstance(row.get("per_query"), dict)]
    if not scored:
        return
    path = per_query_path(checkpoint, str(scored[0].get("dataset_fingerprint") or "dataset"))
    arrays = {_key(row, name): values for row in scored for name, values in row["per_query"].items()}
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    for row in scored:
        row["per_query"] = path


def load_per_query(row: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """A row's per-query scores by name (``ap_i2t`` …); ``ValueError`` naming the file when it is missing."""
    path = row.get("per_query")
    if not isinstance(path, str):
        raise ValueError(f"run {row.get('run')} ({row.get('method')}, {row.get('n_bits')} bits): its row has no "
                         "per-query scores (scored before they were kept); score it again with "
                         f"'ucmfh evaluate -c {row.get('checkpoint')}'")
    if not os.path.exists(path):
        raise ValueError(f"{path}: per-query scores of run {row.get('run')} not found (moved or deleted?)")
    prefix = _key(row, "")
    with np.load(path) as f:
        return {key[len(prefix):]: f[key] for key in f.files if key.startswith(prefix)}
