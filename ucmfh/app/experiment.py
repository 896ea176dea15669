"""Whole runs for the front doors (``ucmfh`` and ``demo.py``): train or reuse each stage
(:mod:`ucmfh.app.stage`), score it, and make its result rows (:mod:`ucmfh.app.identity` names them)."""
from __future__ import annotations

import dataclasses
import datetime
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ucmfh.app.identity import (
    Run, RunOptions, dataset_identity, git_commit, key_of, run_settings, trained_in, versions,
)
from ucmfh.app.per_query import save_per_query
from ucmfh.app.stage import Log, Stage, reuse_or_fit
from ucmfh.checkpoint import CheckpointError, load_model, read_checkpoint, save_checkpoint, saved_number
from ucmfh.codes import save_codes
from ucmfh.config import PROTOCOLS, FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, queries_trained_on, relevance_warnings, rows_found_in
from ucmfh.distributed import current_group
from ucmfh.files import PathLike
from ucmfh.fusion_stage import fit_fusion
from ucmfh.methods import build_method, fit_hashing
from ucmfh.methods.settings import default_loss, scored_protocols
from ucmfh.metrics.arguments import DEFAULT_K
from ucmfh.metrics.collapse import collapse_warning
from ucmfh.models.fusion import FusionEncoder
from ucmfh.evaluation import encode_split, evaluate_fusion, evaluate_hashing, random_codes_scores
from ucmfh.signals import stopped_by
from ucmfh.utils import resolve_device

# the fields of a result row that differ between two runs of one setting: the clock's, and paths under each run's --out
VARYING = frozenset({"time", "train_time_s", "fusion_train_time_s", "score_seconds", "checkpoint", "per_query",
                     "train_threads", "fusion_train_threads"})


def _rows(
    scores: List[Dict[str, Any]], run: Run, task: str, seconds: float, scored: float, device: str, checkpoint: str,
    source: str, trained_on: Optional[Dict[str, str]] = None,
) -> List[Dict[str, Any]]:
    """Result rows of ``scores``, trained in ``seconds`` and scored in ``scored`` (one scoring gives every row its
    scores: each says its seconds); ``trained_on``: the dataset a checkpoint scored on another was trained on
    (its identity as the checkpoint records it), which the rows then carry and their run key holds: they
    are not the run of these settings trained on this dataset."""
    cfg = run.hash_cfg if task == "hashing" else run.fusion_cfg
    n_bits = run.hash_cfg.n_bits if task == "hashing" else None
    method = run.hash_cfg.method if task == "hashing" else "ucmfh"
    identity = run.hash_identity if task == "hashing" else run.fusion_identity
    if trained_on is not None:
        identity = {**identity, "trained_on": trained_on["fingerprint"]}
    common = {
        "dataset": run.dataset["label"], "dataset_path": run.dataset["path"],
        "dataset_fingerprint": run.dataset["fingerprint"], "task": task, "method": method,
        "loss": cfg.loss if default_loss(method) is not None else None,
        "n_bits": n_bits, "ranking": "hamming" if n_bits else "cosine", "seed": cfg.seed, "epochs": cfg.epochs,
        "run": key_of(identity), **({} if trained_on is None else {"trained_on": trained_on}),
        "settings": run.settings(),
        "train_time_s": round(seconds, 2), "score_seconds": round(scored, 2), "device": str(resolve_device(device)),
        "train_threads": _threads(checkpoint), "checkpoint": checkpoint,
        "source": source, "git_commit": git_commit(), "versions": versions(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return [{**common, **row} for row in scores]


def _threads(checkpoint: str) -> Optional[int]:
    """The CPU threads the checkpoint's stage trained with, as saved (None before they were): on a CPU another
    count sums in another order, and trains another model (docs/architecture.md, "Grids side by side")."""
    threads = saved_number(checkpoint, "threads")
    return None if threads is None else int(threads)


def _load(path: str, kind: str, data: Dataset) -> Tuple[Any, Dict[str, Any]]:
    """A saved fusion or hashing stage for :func:`reuse_or_fit`: the model and the checkpoint's meta."""
    model, _, _, meta = load_for(data, path, kind)
    return model, meta


def load_for(data: Dataset, path: str, kind: str, **expected: Any) -> tuple:
    """:func:`ucmfh.checkpoint.load_model` for ``data``'s features; a checkpoint made for other feature widths
    is refused naming the dataset file too."""
    try:
        return load_model(path, kind, d_img=data.d_img, d_txt=data.d_txt, **expected)
    except CheckpointError as err:
        if "feature dim" not in str(err):
            raise
        raise CheckpointError(f"{err} by {data.path}") from None


def load_or_train_fusion(data: Dataset, run: Run, opts: RunOptions, log: Log = print) -> Tuple[FusionEncoder, float]:
    """The run's fusion encoder: reused when saved with the same identity, else trained and saved.

    Returns the encoder and the seconds its training took (as saved, when reused), as a hashing stage's rows
    say theirs.
    """
    path, cfg = run.fusion_path, run.fusion_cfg
    fitted = reuse_or_fit(
        Stage("fusion encoder", path, run.fusion_dir, run.fusion_identity, run.dataset), opts,
        load=lambda: _load(path, "fusion", data),
        fit=lambda state, _: fit_fusion(data, cfg, progress=opts.progress, state=state),
        save=lambda model, meta: save_checkpoint(path, model, cfg, meta=meta),
        log=log, note=f", {cfg.epochs} epoch{'s' * (cfg.epochs != 1)}, loss {cfg.loss}")
    return fitted.model, fitted.seconds


def train_fusion_stage(
    data: Dataset, cfg: FusionConfig, opts: RunOptions, protocols: Sequence[str] = PROTOCOLS, k: int = DEFAULT_K,
    log: Log = print,
) -> List[Dict[str, Any]]:
    """Task 0: train (or reuse) the fusion encoder and score its embeddings by cosine ranking."""
    run = Run(opts.out, dataset_identity(data), cfg)
    fusion, seconds = load_or_train_fusion(data, run, opts, log)
    if not current_group().is_main:  # rank 0 scores and reports for all
        return []
    start = time.perf_counter()
    scores = evaluate_fusion(fusion, data, protocols, k, cfg.device, opts.progress)
    return _rows(scores, run, "fusion", seconds, time.perf_counter() - start, cfg.device, run.fusion_path, "train")


def trainings_line(cfg: HashConfig) -> Optional[str]:
    """A line as a run that trains several models begins (candidates chosen on the validation split, the default's
    two temperatures): how many trainings of up to how many epochs, where each progress bar shows one of them and
    its time (a bar's end was taken for the run's); None where the run trains one model."""
    names = list(build_method(cfg.method).choices(cfg))
    if len(names) < 2 or not cfg.val_fraction:
        return None
    epochs = f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    return (f"      {len(names)} candidates chosen on the validation split ({', '.join(names)}): {len(names)} "
            f"trainings of up to {epochs}" + (", then the chosen one trained again on the whole training split"
                                              if cfg.refit else "")
            + "; early stopping may end each sooner")


def train_hash_stage(
    data: Dataset, fusion_cfg: Optional[FusionConfig], hash_cfg: HashConfig, opts: RunOptions,
    protocols: Sequence[str] = PROTOCOLS, k: int = DEFAULT_K, log: Log = print,
) -> List[Dict[str, Any]]:
    """Task 1: train the hashing stage by ``hash_cfg.method``, save, score. Method 'ucmfh' trains
    hash heads on the run's fusion encoder (trained first if needed; with ``fusion_start='random'`` one of random
    weights built from ``fusion_cfg``, as UCMFH's release); the others ignore ``fusion_cfg``.

    A finished checkpoint of the same identity is scored again, never retrained or replaced (an index
    built from it stays valid), as a finished fusion stage is reused.
    """
    run = Run(opts.out, dataset_identity(data), fusion_cfg, hash_cfg)
    path = run.hash_path
    # what the method takes of its fusion stage: the trained encoder (trained first if needed), or its settings
    # alone (an encoder of random weights trained with the heads: no fusion stage trains)
    takes = build_method(hash_cfg.method).takes_fusion(hash_cfg) if run.fusion_cfg is not None else None
    plan = trainings_line(hash_cfg)

    def fit(state: Any, fusion: Any) -> Any:
        if plan:  # said once the training starts (after the checks that could refuse it)
            log(plan)
        return fit_hashing(data, hash_cfg, fusion, progress=opts.progress, state=state)

    fitted = reuse_or_fit(
        Stage(f"hashing {hash_cfg.n_bits} bits", path, run.hash_dir, run.hash_identity, run.dataset,
              run.hash_dir_identity), opts,
        load=lambda: _load(path, "hash", data),
        prepare=lambda: load_or_train_fusion(data, run, opts, log)[0] if takes == "encoder" else
        run.fusion_cfg if takes == "config" else None,
        fit=fit,
        save=lambda model, meta: save_checkpoint(path, model, run.fusion_cfg, hash_cfg, meta=meta), log=log)
    if not current_group().is_main:  # rank 0 scores and reports for all
        return []
    history = fitted.history
    rows = score_hash_model(fitted.model, data, run, path, fitted.seconds, protocols, k, opts.progress, "train")
    if takes == "encoder":  # the fusion stage it stands on trained too: the run's cost is both stages'
        fusion_seconds = saved_number(run.fusion_path, "seconds")
        # and its threads: the stage the thread count moves most (train_threads are the hashing stage's)
        fusion_threads = _threads(run.fusion_path)
        for row in rows:
            row["fusion_train_time_s"] = None if fusion_seconds is None else round(fusion_seconds, 2)
            row["fusion_train_threads"] = fusion_threads
    if history["best_epoch"] is not None:  # the epoch kept by validation, and its score
        chosen = dict(history["validation"])[history["best_epoch"]]
        for row in rows:
            row.update(best_epoch=history["best_epoch"], val_score=chosen, epochs_run=len(history["loss"]))
        distinct = {score for _, score in history["validation"]}
        if len(history["validation"]) > 1 and len(distinct) == 1:  # early stopping and the epoch kept decided nothing
            log(f"warning: validation scored {chosen:.4f} at each of its {len(history['validation'])} epochs: the "
                f"epoch kept ({history['best_epoch']}) was chosen by nothing (a validation split too small to tell "
                "epochs apart?)")
    if history.get("chosen"):  # a run that chose on validation: the candidate kept, and each one's score
        scores = ", ".join(f"{name} {score:.4f}" for name, score in history["choice_scores"].items())
        log(f"chosen on validation: {history['chosen']} "
            f"({'validation ' + scores if scores else 'no validation split to choose on: the first candidate'})")
        for row in rows:
            row.update(chosen=history["chosen"], choice_val_scores=history["choice_scores"])
        if len(history["choice_scores"]) > 1 and len(set(history["choice_scores"].values())) == 1:
            log(f"warning: the candidates scored alike on validation: {history['chosen']} was chosen by nothing")
    _say_collapsed(rows, log)
    if history.get("filled_bits") is not None:  # CCA-ITQ: fewer directions than bits asked
        log(f"note: {history['filled_bits']} of the {hash_cfg.n_bits} bits carry information (as many as the "
            f"features' directions after PCA); the other {hash_cfg.n_bits - history['filled_bits']} are +1 for every "
            "item and change no ranking")
        for row in rows:
            row.update(filled_bits=history["filled_bits"])
    if history.get("refit_epochs") is not None:  # the kept model: trained again on the whole training split
        log(f"refit: the chosen setting trained again for {history['refit_epochs']} epochs on the whole training "
            "split (validation items included); that model is kept")
        for row in rows:
            row.update(refit_epochs=history["refit_epochs"])
    return rows


def say_relevance(data: Dataset, log: Log) -> None:
    """A warning for labels under which some query items' scores say nothing of the codes
    (:func:`ucmfh.data.h5.relevance_warnings`), before a labelled set is trained or scored."""
    if not data.caption_set:
        for line in relevance_warnings(data.query.labels, data.retrieval.labels):
            log(f"warning: {data.path or data.name}: {line}")


def _say_collapsed(rows: List[Dict[str, Any]], log: Log) -> None:
    """A warning for each protocol whose codes collapsed (:func:`collapsed`)."""
    said = set()
    for row in rows:
        line = collapse_warning(row.get("distinct_codes") or {}, row["protocol"])
        if line and row["protocol"] not in said:
            said.add(row["protocol"])
            log(line)


def score_hash_model(
    model, data: Dataset, run: Run, checkpoint: str, seconds: float, protocols: Sequence[str] = PROTOCOLS,
    k: int = DEFAULT_K, progress: bool = False, source: str = "train", trained_on: Optional[Dict[str, str]] = None,
    keep_per_query: bool = True,
) -> List[Dict[str, Any]]:
    """The rows of a hashing model's scores; with ``keep_per_query``, its per-query scores in a file beside
    ``checkpoint`` that the rows name (:func:`ucmfh.app.per_query.save_per_query`; no rows kept, no file)."""
    hash_cfg = run.hash_cfg
    protocols = scored_protocols(hash_cfg.method, protocols)
    start = time.perf_counter()
    try:
        scores = evaluate_hashing(model, data, protocols, k, hash_cfg.device, progress, real_valued=True,
                                  per_query=True)
    except KeyboardInterrupt as err:  # said as 'interrupted' alone: how to go on, too
        raise stopped_by(f"{str(err) or 'interrupted'} while scoring {checkpoint}, which is saved; the same command "
                         "scores it again, without training it", getattr(err, "signum", None)) from None
    floors = {row.get("database"): row for row in random_codes_scores(data, hash_cfg.n_bits, k, seed=hash_cfg.seed)}
    for row in scores:
        floor = floors[row.get("database")]
        # a caption set's R@K too: its figures by code length draw the floor as MAP's and rSum's do
        row.update({f"random_{key}": floor[key] for key in ("map_i2t", "map_t2i", "rsum", "recall_i2t", "recall_t2i")
                    if key in floor})
    rows = _rows(scores, run, "hashing", seconds, time.perf_counter() - start, hash_cfg.device, checkpoint, source,
                 trained_on)
    if keep_per_query:
        save_per_query(rows, checkpoint)
    else:
        for row in rows:
            row.pop("per_query", None)
    return rows


def trained_elsewhere(meta: Dict[str, Any], data: Dataset, dataset: Dict[str, str], path: str, doing: str,
                      log: Log) -> Optional[Dict[str, Any]]:
    """The identity of the dataset file a checkpoint was trained on (its meta's), where that is not ``dataset``
    (``data``'s identity), with ``queries_trained_on`` where its training split holds ``data``'s query items; else
    None. Says so through ``log`` (``doing``: what is done with the checkpoint here, "scored", "encoded")."""
    trained_on = meta.get("dataset")
    if not isinstance(trained_on, dict) or trained_on.get("fingerprint") == dataset["fingerprint"]:
        return None  # not recorded (a checkpoint a library caller saved with meta of their own), or this file
    log(f"note: {path} was trained on {trained_on.get('path')}, {doing} here on {data.path}")
    seen, by = queries_trained_on(data.path, trained_on.get("path")), "their captions"
    if seen is None and trained_on.get("path") and os.path.isfile(trained_on["path"]):
        try:  # a labelled set (tags repeat), or files without captions: items copied whole, by their features
            seen, by = rows_found_in(data.path, "query", trained_on["path"], "train"), "their features"
        except (OSError, KeyError, ValueError):  # the other file changed or unreadable: nothing to say of it
            seen = None
    if seen and seen[0]:
        trained_on = {**trained_on, "queries_trained_on": seen}
        what = "rows (captions)" if data.caption_set and by == "their features" else "items"  # a row a caption
        log(f"warning: {seen[0]} of the {seen[1]} query {what} of {data.path} are {what} of the training split "
            f"of {trained_on.get('path')} (by {by}), which {path} was trained on: its scores here are inflated")
    return trained_on


def evaluate_checkpoint(
    data: Dataset, path: str, protocols: Sequence[str] = PROTOCOLS, k: int = DEFAULT_K,
    device: str = "auto", n_bits: Optional[int] = None, progress: bool = True, out: str = RunOptions.out,
    log: Log = print, keep_per_query: bool = True,
) -> List[Dict[str, Any]]:
    """Tasks 2/3: reload a fusion or hashing checkpoint and score it on ``data``. A checkpoint trained on
    another dataset file (the one it records) gives rows that say so (``trained_on``: that file's identity).
    ``keep_per_query``: write the per-query scores beside the checkpoint (where the rows are kept)."""
    kind = read_checkpoint(path)["kind"]
    model, fusion_cfg, hash_cfg, meta = load_for(data, path, kind, n_bits=n_bits)
    run = Run(out, dataset_identity(data), fusion_cfg, hash_cfg, trained_in=trained_in(meta))
    trained_on = trained_elsewhere(meta, data, run.dataset, path, "scored", log)
    if kind == "fusion":
        start = time.perf_counter()
        scores = evaluate_fusion(model, data, protocols, k, device, progress)
        return _rows(scores, run, "fusion", 0.0, time.perf_counter() - start, device, path, "evaluate", trained_on)
    run.hash_cfg = dataclasses.replace(hash_cfg, device=device)
    rows = score_hash_model(model, data, run, path, 0.0, protocols, k, progress, "evaluate", trained_on,
                            keep_per_query)
    _say_collapsed(rows, log)
    return rows


def encode_checkpoint(
    data: Dataset, checkpoint: str, out: PathLike, protocol: str = "unimodal",
    device: str = "auto", progress: bool = True, overwrite: bool = False, log: Log = print,
) -> str:
    """Write the query and retrieval codes of a hashing checkpoint to a codes file (packed bits), with what
    they are codes of: the model's run and settings, the dataset file encoded (its fingerprint) and, where the
    model was trained on another, that one (``trained_on``, as ``evaluate_checkpoint``'s rows hold it)."""
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out}: exists; not replaced")
    model, fusion_cfg, hash_cfg, meta = load_for(data, checkpoint, "hash")
    # a dataset of the library's, not read from a file: no file to name, nor to tell from the one trained on
    dataset = dataset_identity(data) if data.path else None
    trained_on = None if dataset is None else trained_elsewhere(meta, data, dataset, checkpoint, "encoded", log)
    query = encode_split(model, data.query, protocol, device, progress=progress)
    retrieval = encode_split(model, data.retrieval, protocol, device, progress=progress)
    return save_codes(
        out, query_img=query[0].cpu(), query_txt=query[1].cpu(),
        retrieval_img=retrieval[0].cpu(), retrieval_txt=retrieval[1].cpu(),
        query_labels=data.query.labels, retrieval_labels=data.retrieval.labels,
        query_ids=data.query.ids, retrieval_ids=data.retrieval.ids, overwrite=overwrite,
        attrs={"dataset": "dataset" if dataset is None else dataset["label"],
               **({} if dataset is None else {"dataset_path": dataset["path"],
                                              "dataset_fingerprint": dataset["fingerprint"]}),
               **({} if trained_on is None else {"trained_on": trained_on}),
               "protocol": protocol, "method": hash_cfg.method,
               "loss": hash_cfg.loss if default_loss(hash_cfg.method) is not None else "-",  # none of its own: '-'
               "checkpoint": os.path.abspath(checkpoint), "seed": hash_cfg.seed,
               # what its rows of 'evaluate --codes' are a measurement of: the run (key) and its settings
               **({"run": key_of(meta["identity"])} if isinstance(meta.get("identity"), dict) else {}),
               "settings": run_settings(fusion_cfg, hash_cfg, trained_in(meta))},
    )
