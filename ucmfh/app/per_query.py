"""Per-query scores of a scored run: a compact side file beside its checkpoint, not in the results row.

A hashing run's rows are means over queries; the intervals of ``ucmfh compare`` need the
scores they are means of. :func:`save_per_query` writes them (tie-aware, float32) to
``hashN.queries-FINGERPRINT-DIGEST.npz`` beside ``hashN.pt``: named by the dataset scored on and by the
scores themselves, so a scoring of the checkpoint at another k, under other protocols or on another dataset
writes a file of its own and never replaces the one an earlier row names (scoring it again alike finds its
file there). Each row names its file (``per_query``). Keys: ``PROTOCOL/DATABASE/NAME`` (DATABASE ``-`` for
a labelled set; NAME ``ap_i2t``, ``ap_t2i`` and, for a caption set, ``hits_i2t``, ``hits_t2i`` [Q, 3]).
:func:`load_per_query` checks that the scores are the row's: their means are its tie-aware MAPs (a file
of the older name, one per checkpoint and dataset, was replaced by a later scoring of another k).
"""
from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
from typing import Any, Dict, List

import numpy as np

from ucmfh.files import atomic_binary


def per_query_path(checkpoint: str, fingerprint: str, arrays: Dict[str, np.ndarray]) -> str:
    """Where the per-query scores ``arrays`` of ``checkpoint`` on the dataset ``fingerprint`` are kept."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        values = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}:{values.dtype.str}:{values.shape};".encode())
        digest.update(values.tobytes())
    stem = checkpoint[: -len(".pt")] if checkpoint.endswith(".pt") else checkpoint
    return f"{stem}.queries-{fingerprint[:12]}-{digest.hexdigest()[:12]}.npz"


def _key(row: Dict[str, Any], name: str) -> str:
    return f"{row.get('protocol')}/{row.get('database') or '-'}/{name}"


def save_per_query(rows: List[Dict[str, Any]], checkpoint: str) -> None:
    """Move the rows' ``per_query`` arrays into one file beside ``checkpoint`` (atomically), leaving
    its path in each row. Rows without them are left as they are. A file that cannot be written there (a
    checkpoint scored from a read-only folder, a full disk) is said in a warning, and the rows go without it:
    they were lost, after the scoring, for a file no one asked for."""
    scored = [row for row in rows if isinstance(row.get("per_query"), dict)]
    if not scored:
        return
    arrays = {_key(row, name): values for row in scored for name, values in row["per_query"].items()}
    path = per_query_path(checkpoint, str(scored[0].get("dataset_fingerprint") or "dataset"), arrays)
    try:
        if not os.path.exists(path):  # else the same scores, written by an earlier scoring
            with atomic_binary(path) as f:
                np.savez_compressed(f, **arrays)
    except OSError as err:
        warnings.warn(f"{path}: the per-query scores were not kept ({err.strerror or err}): these rows have none, "
                      "which 'ucmfh compare' reads", stacklevel=2)
        path = None
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
    try:
        with np.load(path) as f:
            scores = {key[len(prefix):]: f[key] for key in f.files if key.startswith(prefix)}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a file of per-query scores ({type(err).__name__}: {err})"[:300]) from None
    shapes = {"ap_i2t": 1, "ap_t2i": 1, **({"hits_i2t": 2, "hits_t2i": 2} if row.get("database") else {})}
    for name, ndim in shapes.items():  # a file of this name made otherwise (by hand, another program)
        if name not in scores or scores[name].ndim != ndim or not np.issubdtype(scores[name].dtype, np.number):
            raise ValueError(f"{path}: not a file of per-query scores of run {row.get('run')} (no {ndim}-d numbers "
                             f"'{prefix}{name}'); score it again with 'ucmfh evaluate -c {row.get('checkpoint')}'")
        if not np.isfinite(scores[name]).all():  # a mean of NaN compares with nothing: its cell read 'level'
            raise ValueError(f"{path}: per-query scores of run {row.get('run')} hold NaN or inf ('{prefix}{name}'); "
                             f"score it again with 'ucmfh evaluate -c {row.get('checkpoint')}'")
    for name in ("ap_i2t", "ap_t2i"):
        figure = row.get(f"map_{name[3:]}_expected")
        if name in scores and isinstance(figure, float) and abs(float(scores[name].mean()) - figure) > 1e-5:
            raise ValueError(f"{path}: per-query scores of run {row.get('run')} are not its row's (their mean "
                             f"{float(scores[name].mean()):.4f}, the row's {name[3:]} MAP {figure:.4f}: replaced "
                             "by a later scoring of another k or protocol); score it again with "
                             f"'ucmfh evaluate -c {row.get('checkpoint')}'")
    return scores
