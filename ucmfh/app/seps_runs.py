"""The SEPS stage and two-stage search as runs: training (resumable, reused when saved), result rows.

A SEPS run lives in ``OUT/DATASET-FP/seps-seedS-KEY/seps.pt`` (KEY: the hash of its settings and the
dataset's fingerprint), beside ``identity.json``; its rows go to the results file like the other stages'.
Rows carry ``stage`` (``hamming``, ``cosine-rerank``, ``seps-rerank``, ``seps-full``), ``database``
(``test`` or ``collection``, docs/reference.md §7) and ``protocol``: ``unimodal``, or
``dense-text-leak`` for the released code's dense text of the caption's own image.
"""
from __future__ import annotations

import datetime
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ucmfh.app.errors import warn
from ucmfh.app.experiment import trained_elsewhere
from ucmfh.app.identity import (
    RunOptions, dataset_folder, dataset_identity, git_commit, key_of, processes, trained_in, versions,
)
from ucmfh.app.stage import Log, Stage, refuse_other_processes, reuse_or_fit
from ucmfh.checkpoint import load_model, load_seps, save_seps
from ucmfh.config import SepsConfig, identity_dict
from ucmfh.data.format import DataError
from ucmfh.data.h5 import Dataset
from ucmfh.data.tokens import Tokens, check_has_tokens, texts_without_words
from ucmfh.distributed import current_group
from ucmfh.methods.settings import scored_protocols
from ucmfh.metrics.captions import DATABASES
from ucmfh.printable import pad, shown_width
from ucmfh.seps.fit import check_dense_text, fit_seps
from ucmfh.seps.scoring import SplitIds, database_scores, databases, recall_rows
from ucmfh.two_stage import Reranking
from ucmfh.utils import resolve_device

LEAK_NOTE = ("dense-text-leak: each caption scored with the dense description of its own ground-truth image, "
             "for every candidate (the released code's test; not a search anyone can run)")


def protocol_of(cfg: SepsConfig) -> str:
    return "dense-text-leak" if cfg.dense_text == "leak" else "unimodal"


def seps_paths(out: str, dataset: Dict[str, str], cfg: SepsConfig, trained_in: Optional[int] = None
               ) -> Dict[str, Any]:
    """A SEPS run's identity, folder and checkpoint, trained in ``trained_in`` processes (None: this run's)."""
    identity = {"dataset_fingerprint": dataset["fingerprint"], "seps": identity_dict(cfg), **processes(trained_in)}
    name = f"seps-seed{cfg.seed}-{key_of(identity)[:8]}"
    folder = os.path.join(dataset_folder(out, dataset, name), name)
    return {"identity": identity, "dir": folder, "checkpoint": os.path.join(folder, "seps.pt")}


def _readers(data: Dataset, tokens: bool = True) -> Dict[str, Union[Tokens, SplitIds]]:
    """The query and retrieval splits' token readers; without ``tokens`` (no SEPS stage) their ids alone."""
    if tokens:
        return {split: Tokens(data.path, split) for split in ("query", "retrieval")}
    splits = {"query": data.query, "retrieval": data.retrieval}
    if any(split.ids is None for split in splits.values()):  # same id: relevant
        raise DataError(f"{data.path}: no ids: rerank scores by the caption protocol (docs/reference.md §7: "
                        "relevance is the same id)")
    return {name: SplitIds(name, split.ids.numpy()) for name, split in splits.items()}


def check_words(path: str, splits: Sequence[str]) -> None:
    """Say of ``splits`` (those SEPS reads) the texts without a word token (valid, §9, but SEPS scores such a text by
    nothing: every image alike to it), and refuse a split where no text has one (every score chance, said as a
    measurement before): ``DataError`` naming the file and split."""
    for split, (wordless, rows) in texts_without_words(path).items():
        if split not in splits or not wordless:
            continue
        if wordless == rows:
            raise DataError(f"{path}: /{split}: none of its {rows} texts has a word token (/{split}/text_offsets): "
                            "SEPS would score every text by nothing")
        warn(f"{path}: /{split}: {wordless} of {rows} texts have no word tokens, which SEPS scores by nothing")


def note_labels_unused(data: Dataset, log: Log) -> None:
    """Say that a labelled file is scored by the caption protocol here: relevance the same id, the labels unused
    (with or without tokens alike; the rows' ``relevance`` says so too)."""
    if not data.caption_set:
        log(f"note: {data.path} has labels; SEPS and rerank score by the caption protocol (docs/reference.md §7): "
            "relevance is the same id, the exact pair, and the labels are unused")


def _common(data: Dataset, device: str) -> Dict[str, Any]:
    dataset = dataset_identity(data)
    return {"dataset": dataset["label"], "dataset_path": dataset["path"], "dataset_fingerprint": dataset["fingerprint"],
            "relevance": "id", "device": str(resolve_device(device)), "git_commit": git_commit(),
            "versions": versions(),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _seps_fields(cfg: SepsConfig, checkpoint: str, processes_of: Optional[int] = None) -> Dict[str, Any]:
    """A SEPS row's fields; ``processes_of``: the processes its checkpoint trained in (None: this run's)."""
    return {"protocol": protocol_of(cfg), "seps_checkpoint": checkpoint, "seps_version": cfg.version,
            "selection": cfg.selection, "dense_text": cfg.dense_text, "seed": cfg.seed,
            "seps_settings": {**identity_dict(cfg), **processes(processes_of)}}


def train_seps_stage(data: Dataset, cfg: SepsConfig, opts: RunOptions, names: Sequence[str] = ("test",),
                     log: Log = print) -> List[Dict[str, Any]]:
    """Train SEPS on ``data``'s training split (reused when saved with the same identity), then score
    every pair of each database in ``names``."""
    check_has_tokens(data.path)  # before the run's folder, its lock and its log line
    check_words(data.path, ("train", "query", "retrieval") if "collection" in names else ("train", "query"))
    check_dense_text(data.path, cfg)
    note_labels_unused(data, log)
    paths = seps_paths(opts.out, dataset_identity(data), cfg)
    path, identity = paths["checkpoint"], paths["identity"]
    refuse_other_processes(lambda n: seps_paths(opts.out, dataset_identity(data), cfg, n)["checkpoint"],
                           current_group().world_size, opts, os.path.dirname(paths["dir"]))

    def load() -> Tuple[Any, Dict[str, Any]]:
        model, _, meta = load_seps(path)
        return model, meta

    fitted = reuse_or_fit(
        Stage("seps", path, paths["dir"], identity, dataset_identity(data)), opts, load=load,
        fit=lambda state, _: fit_seps(data.path, cfg, progress=opts.progress, state=state),
        save=lambda model, meta: save_seps(path, model, meta=meta), log=log)
    if not current_group().is_main:  # rank 0 scores and reports for all
        return []
    history = fitted.history
    rows = score_seps(data, fitted.model, cfg, path, names, opts.progress)
    for row in rows:
        row.update(train_time_s=round(fitted.seconds, 2), run=key_of(identity), epochs=cfg.epochs,
                   best_epoch=history["best_epoch"], epochs_run=len(history["loss"]))
        if history["best_epoch"] is not None:
            row["val_score"] = dict(history["validation"])[history["best_epoch"]]
    return rows


def score_seps(data: Dataset, model, cfg: SepsConfig, checkpoint: str, names: Sequence[str],
               progress: bool = False) -> List[Dict[str, Any]]:
    """``seps-full`` rows: every pair of each database scored by SEPS."""
    device = resolve_device(cfg.device)
    readers = _readers(data)
    rows = []
    for db in databases(readers["query"], readers["retrieval"], names):
        scores, seconds = database_scores(model, db, device, cfg.pair_chunk, progress)
        rows.append({**_common(data, cfg.device), "task": "seps", "stage": "seps-full", "candidates": None,
                     "database": db.name, **recall_rows(scores, db.txt_ids, db.img_ids, db.query_txt, db.query_img),
                     "score_seconds": round(seconds, 3), "pairs": scores.numel(), **_seps_fields(cfg, checkpoint)})
    return rows


def rerank_rows(data: Dataset, hash_checkpoint: str, seps_checkpoint: Optional[str], candidates: Sequence[int],
                names: Sequence[str] = DATABASES, full: bool = False, device: str = "auto",
                progress: bool = False, log: Log = print,
                done: Optional[Callable[[List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
    """Two-stage search on each database: Hamming top-M of the hashing checkpoint, re-ranked by cosine and
    (with ``seps_checkpoint``) by SEPS, for every M in ``candidates``; ``full`` adds SEPS over every pair.
    ``done`` is given each database's rows as soon as they are scored (an interrupt keeps those)."""
    if seps_checkpoint is not None:
        check_words(data.path, ("query", "retrieval") if "collection" in names else ("query",))
    hasher, _, hash_cfg, hash_meta = load_model(hash_checkpoint, "hash", d_img=data.d_img, d_txt=data.d_txt)
    if "fused" in scored_protocols(hash_cfg.method):  # its codes see both modalities together
        raise ValueError(f"{hash_checkpoint}: method {hash_cfg.method!r} has no leak-free real-valued output to "
                         "re-rank by; use a checkpoint of a leak-free method (two-tower, distill, cca-itq)")
    readers = _readers(data, tokens=seps_checkpoint is not None)  # the Hamming and cosine stages read none
    note_labels_unused(data, log)
    dataset = dataset_identity(data)
    # a model trained on another file (whose training split may hold these queries) is said so, as evaluate says
    hash_on = trained_elsewhere(hash_meta, data, dataset, hash_checkpoint, "re-ranked", log)
    seps, cfg, seps_in, seps_on = None, None, None, None
    if seps_checkpoint is not None:
        q = readers["query"]
        seps, cfg, meta = load_seps(seps_checkpoint, d_img=q.d_img, d_txt=q.d_txt, n_image_tokens=q.n_image_tokens)
        seps_in = trained_in(meta)
        seps_on = trained_elsewhere(meta, data, dataset, seps_checkpoint, "re-ranking", log)
    rows = []
    common = {**_common(data, device), "task": "rerank", "hash_checkpoint": hash_checkpoint, "n_bits": hash_cfg.n_bits,
              "method": hash_cfg.method, "hash_settings": identity_dict(hash_cfg), "protocol": "unimodal",
              **({"trained_on": hash_on} if hash_on else {})}
    # a SEPS row: its SEPS model's file too, and that file as the row's trained_on where the hashing model's is this
    seps_extra = {**({"seps_trained_on": seps_on} if seps_on else {}),
                  **({"trained_on": seps_on} if seps_on and not hash_on else {})}
    for db in databases(readers["query"], readers["retrieval"], names):
        first = len(rows)
        log(f"{db.name} database: {len(db.img_ids)} images, {len(db.txt_ids)} captions")
        rr = Reranking(db, data, hasher, seps, device=str(resolve_device(device)), progress=progress)
        extra = {"database": db.name, "store_bytes_per_item": rr.store_bytes(), "store_seconds": round(rr.store_seconds, 2)}
        stages = ["hamming", "cosine-rerank"] + (["seps-rerank"] if seps is not None else [])
        for m in candidates:
            for stage in stages:
                row = {**common, **extra, **rr.run(stage, m)}
                if stage.startswith("seps"):
                    row.update(_seps_fields(cfg, seps_checkpoint, seps_in), **seps_extra)
                rows.append(row)
        if full and seps is not None:
            rows.append({**common, **extra, **rr.run("seps-full", 0), **_seps_fields(cfg, seps_checkpoint, seps_in),
                         **seps_extra})
        if done is not None:
            done(rows[first:])
    return rows


def format_stages(rows: List[Dict[str, Any]]) -> str:
    """A plain-text table of stage rows (R@K in %, the first stage's ceiling, latency per query)."""
    width = max([14] + [shown_width(r["dataset"]) + 2 for r in rows])
    lines = [f"{'dataset':<{width}}{'database':<11}{'stage':<15}{'M':>5}{'I->T R@1/5/10':>18}{'T->I R@1/5/10':>18}"
             f"{'rSum':>7}{'R@M I->T/T->I':>15}{'score ms p50 I->T/T->I':>24}"]
    for r in rows:
        recall = ["/".join(f"{r[key][rank]:.1f}" for rank in ("1", "5", "10")) for key in ("recall_i2t", "recall_t2i")]
        ceiling = (f"{r['recall_at_m_i2t']:.1f}/{r['recall_at_m_t2i']:.1f}" if "recall_at_m_i2t" in r else "-")
        latency = r.get("latency_ms") or {}
        score = ("/".join(f"{latency[d]['score']['p50']:.2f}" for d in ("i2t", "t2i"))
                 if latency and "score" in latency.get("i2t", {}) else "-")
        stage = r["stage"] + (" LEAKS" if r.get("protocol") == "dense-text-leak" else "")
        lines.append(f"{pad(r['dataset'], width)}{r['database']:<11}{stage:<15}{r.get('candidates') or '-':>5}{recall[0]:>18}"
                     f"{recall[1]:>18}{r['rsum']:>7.1f}{ceiling:>15}{score:>24}")
    lines.append("  caption protocol of docs/reference.md §7 (relevance = same id), R@K in %; test: the query split as "
                 "database; collection: query and retrieval together")
    lines.append("  unimodal: each side from its own modality; M: Hamming candidates re-ranked (R@M: the first stage's "
                 "ceiling)")
    lines.append("  ties by database index: the lists the search returns (the Hamming stage's first M, in that order, "
                 "are what the re-ranking stages re-order); no tie-aware twins")
    fewer = {(r["database"], r["candidates"], r[f"candidates_{d}"]) for r in rows for d in ("i2t", "t2i")
             if r.get("candidates") and r.get(f"candidates_{d}", r["candidates"]) < r["candidates"]}
    for database, m, n in sorted(fewer):  # -m 1000 of a database of 100 re-ranks the 100, as its rows record
        lines.append(f"  M {m} on the {database} database: its {n} items of a modality are all the candidates")
    if any(r.get("protocol") == "dense-text-leak" for r in rows):
        lines.append("  " + LEAK_NOTE)
    return "\n".join(lines)
