"""Whole runs for the front doors (``ucmfh`` and ``demo.py``): identity, train, save, score, record.

A run's identity is the dataset file's content (a SHA-256 fingerprint; its
resolved path is recorded beside it) plus every setting that changes the
result (:func:`ucmfh.config.identity_dict`: all but the device). Runs live in
folders named by it::

    OUT/DATASET-FP/                    one dataset file's content (FP: its fingerprint)
      LOSS-seedSEED-KEY/               a fusion stage: fusion.pt, identity.json
        hash-KEY/                      hashing settings on it: hash16.pt, hash64.pt, identity.json

A saved stage is reused only when the identity saved inside it equals the one
asked for, and the log says which was reused. Two files with the same name
never share a folder; two runs that differ in any setting never share a
checkpoint. Result rows carry the dataset's path and fingerprint, the
settings and the run key.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import glob
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ucmfh.app.per_query import save_per_query
from ucmfh.checkpoint import load_model, read_checkpoint, save_checkpoint
from ucmfh.codes import save_codes
from ucmfh.config import PROTOCOLS, REFERENCE_EPOCHS, FusionConfig, HashConfig, identity_dict
from ucmfh.data.h5 import Dataset
from ucmfh.data.synthetic import make_synthetic
from ucmfh.distributed import current_group
from ucmfh.files import PathLike, append_jsonl, remove_stale_temps, write_json_atomic
from ucmfh.models.fusion import FusionEncoder
from ucmfh.scoring import EXPECTED, encode_split, evaluate_fusion, evaluate_hashing, random_codes_scores
from ucmfh.methods import build_method, fit_hashing
from ucmfh.epochs import StateFile, candidate_name, discard_state, read_state, state_paths
from ucmfh.fusion_stage import fit_fusion
from ucmfh.utils import resolve_device

PROTOCOL_NOTES = {
    "unimodal": "cross-modal: image codes from images alone, text codes from texts alone",
    "fused": "UCMFH's protocol: every code also sees its item's paired modality (not cross-modal retrieval)",
}
Log = Callable[[str], None]


# ------------------------------------------------------------- the environment


def default_data_dir() -> str:
    """Where dataset names resolve to ``NAME.h5``: ``$UCMFH_DATA_DIR``, else ``data``."""
    return os.environ.get("UCMFH_DATA_DIR", "data")


def configure_from_env() -> None:
    """Apply the environment's settings to the library: ``UCMFH_NATIVE=0`` ranks on the torch path."""
    value = os.environ.get("UCMFH_NATIVE")
    if value is None:
        return
    from ucmfh.metrics import set_backend

    set_backend("torch" if value == "0" else "auto")


def torchrun_sizes() -> Tuple[int, int]:
    """``(WORLD_SIZE, LOCAL_WORLD_SIZE)`` of the environment torchrun sets (1, 1 outside it)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))


def join_process_group() -> None:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment): join the run's process group
    (gloo for CPU tensors, NCCL for CUDA ones), each rank on its own GPU (``LOCAL_RANK``), and
    silence the standard output of every rank but 0, which reports for all (docs/distributed.md)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    import atexit
    import sys

    import torch
    import torch.distributed as dist

    from ucmfh.distributed import use_local_gpu

    if not dist.is_initialized():
        use_local_gpu(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_leave_process_group)
    if dist.get_rank() > 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process


def _leave_process_group() -> None:
    """At exit: wait for the other ranks (rank 0 may still be scoring), then leave the group; a rank
    that leaves while another still uses the connection can abort it."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def default_epochs(dataset: str, epochs: Optional[int]) -> int:
    """``epochs``, else the reference code's for a known dataset name, else 100."""
    return epochs if epochs is not None else REFERENCE_EPOCHS.get(dataset_label(dataset), 100)


def protocols_of(protocol: str) -> Tuple[str, ...]:
    return PROTOCOLS if protocol == "both" else (protocol,)


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


# ---------------------------------------------------------------- run identity


def dataset_label(path: str) -> str:
    """What tables call a dataset: its file's stem (what ``-d NAME`` names)."""
    return os.path.splitext(os.path.basename(path))[0]


@functools.lru_cache(maxsize=32)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(functools.partial(f.read, 1 << 23), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(path: str) -> str:
    """SHA-256 of a file's bytes (cached per path, size and modification time within a process)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _file_sha256(real, st.st_size, st.st_mtime_ns)


def dataset_identity(data: Dataset) -> Dict[str, str]:
    """The dataset part of a run's identity: label, resolved path, content fingerprint."""
    if data.path is None:
        raise ValueError("a run needs a dataset read from a file (its fingerprint is part of the run's identity)")
    return {"label": dataset_label(data.path), "path": os.path.realpath(data.path), "fingerprint": fingerprint(data.path)}


def key_of(value: Any) -> str:
    """A short stable key of a JSON-able value (SHA-256 of its canonical JSON, 12 hex digits)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Run:
    """Where a run's stages live, and what identifies each.

    ``fusion_cfg`` is None for a hashing method without a fusion encoder: its run is the
    hashing stage alone, in ``OUT/DATASET-FP/METHOD-seedS-KEY/hashN.pt``.
    """

    out: str
    dataset: Dict[str, str]
    fusion_cfg: Optional[FusionConfig]
    hash_cfg: Optional[HashConfig] = None

    def __post_init__(self) -> None:
        if self.hash_cfg is not None and not build_method(self.hash_cfg.method).uses_fusion:
            self.fusion_cfg = None  # not part of this run: its method trains no fusion encoder

    @property
    def dataset_dir(self) -> str:
        return os.path.join(self.out, f"{self.dataset['label']}-{self.dataset['fingerprint'][:8]}")

    @property
    def fusion_identity(self) -> Dict[str, Any]:
        return {"dataset_fingerprint": self.dataset["fingerprint"], "fusion": identity_dict(self.fusion_cfg)}

    @property
    def hash_identity(self) -> Dict[str, Any]:
        if self.fusion_cfg is None:
            return {"dataset_fingerprint": self.dataset["fingerprint"], "hash": identity_dict(self.hash_cfg)}
        return {**self.fusion_identity, "hash": identity_dict(self.hash_cfg)}

    @property
    def fusion_dir(self) -> str:
        cfg = self.fusion_cfg
        return os.path.join(self.dataset_dir, f"{cfg.loss}-seed{cfg.seed}-{key_of(self.fusion_identity)[:8]}")

    @property
    def hash_dir_identity(self) -> Dict[str, Any]:
        """What the hashing folder's runs share: all but the code length, which names each checkpoint."""
        settings = {k: v for k, v in identity_dict(self.hash_cfg).items() if k != "n_bits"}
        return {**self.hash_identity, "hash": settings}

    @property
    def hash_dir(self) -> str:
        key = key_of(self.hash_dir_identity["hash"])[:8]
        if self.fusion_cfg is None:
            cfg = self.hash_cfg
            return os.path.join(self.dataset_dir, f"{cfg.method}-seed{cfg.seed}-{key}")
        return os.path.join(self.fusion_dir, f"hash-{key}")

    @property
    def fusion_path(self) -> str:
        return os.path.join(self.fusion_dir, "fusion.pt")

    @property
    def hash_path(self) -> str:
        return os.path.join(self.hash_dir, f"hash{self.hash_cfg.n_bits}.pt")

    @property
    def checkpoints(self) -> List[str]:
        """The checkpoint of each of the run's stages."""
        return ([] if self.fusion_cfg is None else [self.fusion_path]) + ([self.hash_path] if self.hash_cfg else [])

    def settings(self) -> Dict[str, Any]:
        return {"fusion": None if self.fusion_cfg is None else identity_dict(self.fusion_cfg),
                "hash": None if self.hash_cfg is None else identity_dict(self.hash_cfg)}


@dataclass
class RunOptions:
    """How a run is carried out (none of it changes the result)."""

    out: str = "runs"
    resume: bool = False  # continue interrupted stages; reuse finished ones
    save_interval: float = 120.0  # seconds between saves of the training state
    progress: bool = True
    always_resumes: bool = False  # a grid: resuming is its way, so a fresh start is not news


@functools.lru_cache(maxsize=1)
def git_commit() -> Optional[str]:
    """The commit of the ucmfh source tree, when it is a git checkout (asked once per process)."""
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
    scores: List[Dict[str, Any]], run: Run, task: str, seconds: float, device: str, checkpoint: str,
    source: str,
) -> List[Dict[str, Any]]:
    cfg = run.hash_cfg if task == "hashing" else run.fusion_cfg
    n_bits = run.hash_cfg.n_bits if task == "hashing" else None
    method = run.hash_cfg.method if task == "hashing" else "ucmfh"
    common = {
        "dataset": run.dataset["label"], "dataset_path": run.dataset["path"],
        "dataset_fingerprint": run.dataset["fingerprint"], "task": task, "method": method,
        "loss": cfg.loss if build_method(method).takes_loss else None,
        "n_bits": n_bits, "ranking": "hamming" if n_bits else "cosine", "seed": cfg.seed, "epochs": cfg.epochs,
        "run": key_of(run.hash_identity if task == "hashing" else run.fusion_identity),
        "settings": run.settings(),
        "train_time_s": round(seconds, 2), "device": str(resolve_device(device)), "checkpoint": checkpoint,
        "source": source, "git_commit": git_commit(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return [{**common, **row} for row in scores]


# ------------------------------------------------------------------- the stages


def _load_stage(path: str, kind: str, identity: Dict[str, Any], data: Dataset) -> tuple:
    """A saved stage, refused unless the identity inside it is the one asked for."""
    model, fusion_cfg, hash_cfg, meta = load_model(path, kind, d_img=data.d_img, d_txt=data.d_txt)
    if meta.get("identity") != identity:
        raise ValueError(f"{path}: holds a {kind} stage of another run (its identity differs from the one asked "
                         "for); not reused. Move it away or use another --out")
    return model, fusion_cfg, hash_cfg, meta


def _state_path(checkpoint: str) -> str:
    return os.path.splitext(checkpoint)[0] + ".state.pt"


def drop_leftover_state(checkpoint: str) -> None:
    """What a killed run may have left of a stage: temporary files of its writes, and a training
    state beside a finished checkpoint (the run died between saving one and removing the other)."""
    for path in (checkpoint, *state_paths(_state_path(checkpoint))):
        remove_stale_temps(path)
    if os.path.exists(checkpoint):
        discard_state(StateFile(_state_path(checkpoint)))


def _saved_states(checkpoint: str) -> List[str]:
    """The training states saved beside ``checkpoint``: its run's, or its candidates' (a run that chooses
    on validation, :meth:`ucmfh.methods.Method.choices`)."""
    return [path for path in state_paths(_state_path(checkpoint)) if os.path.exists(path)]


def _interrupted_at(checkpoint: str) -> str:
    """Where the states saved beside ``checkpoint`` stand: ``epoch 3 of 100``, or for the candidates of a
    run that chooses ``t0.3: finished, t0.1: epoch 3 of 100``."""
    where, own = [], _state_path(checkpoint)
    for path in _saved_states(checkpoint):
        saved = read_state(path, resolve_device("cpu"))
        epochs = saved["config"]["epochs"]
        at = "finished" if saved["epoch"] >= epochs else f"epoch {saved['epoch'] + 1} of {epochs}"
        where.append(at if path == own else f"{candidate_name(own, path)}: {at}")
    return ", ".join(where)


def _refuse_interrupted(checkpoint: str) -> None:
    saved = _saved_states(checkpoint)
    raise FileExistsError(f"{saved[0]}: an interrupted run of these settings is saved here "
                          f"({_interrupted_at(checkpoint)}); continue it with --resume, or delete "
                          f"{'the file' if len(saved) == 1 else 'the files'} to start over")


def check_interrupted(runs: Sequence[Run], opts: RunOptions) -> None:
    """Refuse to start over an interrupted run unless ``opts.resume``; call it before anything trains."""
    for run in runs:
        for checkpoint in run.checkpoints:
            if current_group().is_main:
                drop_leftover_state(checkpoint)
            if not opts.resume and _saved_states(checkpoint):
                _refuse_interrupted(checkpoint)


def state_for(checkpoint: str, opts: RunOptions, log: Log) -> StateFile:
    """The training state beside a checkpoint; an interrupted run is continued only with ``resume``."""
    if current_group().is_main:
        drop_leftover_state(checkpoint)
    state = StateFile(_state_path(checkpoint), opts.save_interval, opts.resume)
    saved = _saved_states(checkpoint)
    if saved:
        if not opts.resume:
            _refuse_interrupted(checkpoint)
        log(f"resuming {', '.join(saved)} at {_interrupted_at(checkpoint)}")
    elif opts.resume and not opts.always_resumes:
        log(f"nothing to resume at {state.path}; training from the start")
    return state


def saved_epochs(run: Run, kind: str) -> Dict[int, str]:
    """The saved checkpoints (``kind`` 'fusion' or 'hash') of runs that differ from ``run`` in their
    epochs alone, by epochs: what a user who trained with ``--epoch 20`` and evaluates without it has."""
    def without_epochs(identity: Dict[str, Any]) -> Dict[str, Any]:
        return {stage: {k: v for k, v in (identity.get(stage) or {}).items() if k != "epochs"}
                for stage in ("fusion", "hash")}

    if kind == "fusion":
        wanted, pattern = without_epochs(run.fusion_identity), os.path.join(run.dataset_dir, "*", "identity.json")
    else:
        wanted = without_epochs(run.hash_dir_identity)
        pattern = os.path.join(run.dataset_dir, "*", *(["hash-*"] if run.fusion_cfg is not None else []),
                               "identity.json")
    found = {}
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as f:
                identity = json.load(f)
        except (OSError, ValueError):
            continue
        checkpoint = os.path.join(os.path.dirname(path), "fusion.pt" if kind == "fusion" else
                                  os.path.basename(run.hash_path))
        if without_epochs(identity) == wanted and os.path.exists(checkpoint):
            found[(identity.get(kind) or {}).get("epochs")] = checkpoint
    return found


def write_identity(directory: str, identity: Dict[str, Any], dataset: Dict[str, str]) -> None:
    write_json_atomic(os.path.join(directory, "identity.json"), {**identity, "dataset": dataset})


def load_or_train_fusion(data: Dataset, run: Run, opts: RunOptions, log: Log = print) -> Tuple[FusionEncoder, float]:
    """The run's fusion encoder: reused when saved with the same identity, else trained and saved.

    Returns the encoder and the seconds spent training it (0 when reused).
    """
    path, identity = run.fusion_path, run.fusion_identity
    group = current_group()
    if os.path.exists(path):
        fusion, cfg, _, _ = _load_stage(path, "fusion", identity, data)
        if group.is_main:
            drop_leftover_state(path)
        log(f"fusion encoder: reused {path} (run {key_of(identity)}, {cfg.epochs} epochs, loss {cfg.loss})")
        return fusion, 0.0
    log(f"fusion encoder: training {path} (run {key_of(identity)})")
    state = state_for(path, opts, log)
    start = time.perf_counter()
    fusion, history = fit_fusion(data, run.fusion_cfg, progress=opts.progress, state=state)
    seconds = time.perf_counter() - start
    if group.is_main:
        write_identity(run.fusion_dir, identity, run.dataset)
        save_checkpoint(path, fusion, run.fusion_cfg, meta={
            "identity": identity, "dataset": run.dataset, "history": history.as_dict(), "seconds": seconds,
            "world_size": group.world_size})
        discard_state(state)
    group.barrier()  # every rank sees the checkpoint from here on
    return fusion, seconds


def train_fusion_stage(
    data: Dataset, cfg: FusionConfig, opts: RunOptions, protocols: Sequence[str] = PROTOCOLS, k: int = 50,
    log: Log = print,
) -> List[Dict[str, Any]]:
    """Task 0: train (or reuse) the fusion encoder and score its embeddings by cosine ranking."""
    run = Run(opts.out, dataset_identity(data), cfg)
    fusion, seconds = load_or_train_fusion(data, run, opts, log)
    if not current_group().is_main:  # rank 0 scores and reports for all
        return []
    scores = evaluate_fusion(fusion, data, protocols, k, cfg.device, opts.progress)
    return _rows(scores, run, "fusion", seconds, cfg.device, run.fusion_path, "train")


def train_hash_stage(
    data: Dataset, fusion_cfg: FusionConfig, hash_cfg: HashConfig, opts: RunOptions,
    protocols: Sequence[str] = PROTOCOLS, k: int = 50, log: Log = print,
) -> List[Dict[str, Any]]:
    """Task 1: train the hashing stage by ``hash_cfg.method``, save, score. Method 'ucmfh' trains
    hash heads on the run's fusion encoder (trained first if needed); the others ignore ``fusion_cfg``.

    A finished checkpoint of the same identity is scored again, never retrained or replaced (an index
    built from it stays valid), as a finished fusion stage is reused.
    """
    run = Run(opts.out, dataset_identity(data), fusion_cfg, hash_cfg)
    path, identity = run.hash_path, run.hash_identity
    group = current_group()
    if os.path.exists(path):
        model, _, _, meta = _load_stage(path, "hash", identity, data)
        if group.is_main:
            drop_leftover_state(path)
        log(f"hashing {hash_cfg.n_bits} bits: already trained, reused {path} (run {key_of(identity)})")
        seconds, history = meta.get("seconds", 0.0), meta["history"]
    else:
        fusion = None if run.fusion_cfg is None else load_or_train_fusion(data, run, opts, log)[0]
        state = state_for(path, opts, log)
        start = time.perf_counter()
        model, history = fit_hashing(data, hash_cfg, fusion, progress=opts.progress, state=state)
        seconds = time.perf_counter() - start
        history = history.as_dict()
        if group.is_main:
            write_identity(run.hash_dir, run.hash_dir_identity, run.dataset)
            save_checkpoint(path, model, run.fusion_cfg, hash_cfg, meta={
                "identity": identity, "dataset": run.dataset, "history": history, "seconds": seconds,
                "world_size": group.world_size})
            discard_state(state)
        group.barrier()
    if not group.is_main:  # rank 0 scores and reports for all
        return []
    rows = score_hash_model(model, data, run, path, seconds, protocols, k, opts.progress, "train")
    if history["best_epoch"] is not None:  # the epoch kept by validation, and its score
        chosen = dict(history["validation"])[history["best_epoch"]]
        for row in rows:
            row.update(best_epoch=history["best_epoch"], val_score=chosen, epochs_run=len(history["loss"]))
    if history.get("chosen"):  # a run that chose on validation: the candidate kept, and each one's score
        scores = ", ".join(f"{name} {score:.4f}" for name, score in history["choice_scores"].items())
        log(f"chosen on validation: {history['chosen']} "
            f"({'validation ' + scores if scores else 'no validation split to choose on: the first candidate'})")
        for row in rows:
            row.update(chosen=history["chosen"], choice_val_scores=history["choice_scores"])
    return rows


def score_hash_model(
    model, data: Dataset, run: Run, checkpoint: str, seconds: float, protocols: Sequence[str] = PROTOCOLS,
    k: int = 50, progress: bool = False, source: str = "train",
) -> List[Dict[str, Any]]:
    hash_cfg = run.hash_cfg
    if build_method(hash_cfg.method).leak_free:  # 'fused' would repeat 'unimodal'
        protocols = ("unimodal",)
    scores = evaluate_hashing(model, data, protocols, k, hash_cfg.device, progress, real_valued=True, per_query=True)
    floors = {row.get("database"): row for row in random_codes_scores(data, hash_cfg.n_bits, k, seed=hash_cfg.seed)}
    for row in scores:
        floor = floors[row.get("database")]
        row.update({f"random_{key}": floor[key] for key in ("map_i2t", "map_t2i", "rsum") if key in floor})
    rows = _rows(scores, run, "hashing", seconds, hash_cfg.device, checkpoint, source)
    save_per_query(rows, checkpoint)
    return rows


def evaluate_checkpoint(
    data: Dataset, path: str, protocols: Sequence[str] = PROTOCOLS, k: int = 50,
    device: str = "auto", n_bits: Optional[int] = None, progress: bool = True, out: str = "runs",
    log: Log = print,
) -> List[Dict[str, Any]]:
    """Tasks 2/3: reload a fusion or hashing checkpoint and score it on ``data``."""
    kind = read_checkpoint(path)["kind"]
    model, fusion_cfg, hash_cfg, meta = load_model(path, kind, d_img=data.d_img, d_txt=data.d_txt, n_bits=n_bits)
    run = Run(out, dataset_identity(data), fusion_cfg, hash_cfg)
    trained_on = (meta.get("dataset") or {}).get("fingerprint")
    if trained_on is not None and trained_on != run.dataset["fingerprint"]:
        log(f"note: {path} was trained on {meta['dataset'].get('path')}, scored here on {data.path}")
    if kind == "fusion":
        scores = evaluate_fusion(model, data, protocols, k, device, progress)
        return _rows(scores, run, "fusion", 0.0, device, path, "evaluate")
    run.hash_cfg = dataclasses.replace(hash_cfg, device=device)
    return score_hash_model(model, data, run, path, 0.0, protocols, k, progress, "evaluate")


def encode_checkpoint(
    data: Dataset, checkpoint: str, out: PathLike, protocol: str = "unimodal",
    device: str = "auto", progress: bool = True, overwrite: bool = False,
) -> str:
    """Write the query and retrieval codes of a hashing checkpoint to a codes file (packed bits)."""
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out}: exists; not replaced")
    if data.caption_set:
        raise ValueError(f"{data.path}: a caption set (no labels); codes files hold labels, so encode a labelled "
                         "set, or score the checkpoint with 'ucmfh evaluate -c'")
    model, fusion_cfg, hash_cfg, _ = load_model(checkpoint, "hash", d_img=data.d_img, d_txt=data.d_txt)
    query = encode_split(model, data.query, protocol, device, progress=progress)
    retrieval = encode_split(model, data.retrieval, protocol, device, progress=progress)
    return save_codes(
        out, query_img=query[0].cpu(), query_txt=query[1].cpu(),
        retrieval_img=retrieval[0].cpu(), retrieval_txt=retrieval[1].cpu(),
        query_labels=data.query.labels, retrieval_labels=data.retrieval.labels,
        query_ids=data.query.ids, retrieval_ids=data.retrieval.ids,
        attrs={"dataset": dataset_label(data.path or "dataset"), "protocol": protocol, "loss": hash_cfg.loss,
               "checkpoint": os.path.abspath(checkpoint), "seed": hash_cfg.seed},
    )


# --------------------------------------------------------------------- results


def append_results(path: PathLike, rows: List[Dict[str, Any]]) -> None:
    """Append result rows to a JSON-lines file (locked, one write per row: concurrent runs keep every row)."""
    append_jsonl(path, rows)


# the first columns of every line of format_table
HEAD = f"{'dataset':<14}{'task':<9}{'method':<11}{'loss':<10}{'bits':>5}  {'protocol':<9}"


def _head(r: Dict[str, Any]) -> str:
    return (f"{r['dataset']:<14}{r['task']:<9}{r.get('method') or 'ucmfh':<11}{r['loss'] or '-':<10}"
            f"{r['n_bits'] or '-':>5}  {r['protocol']:<9}")


def _lead(r: Dict[str, Any], key: str) -> Any:
    """A row's score as tables lead with it: the tie-aware twin where the row has one."""
    return r.get(key + EXPECTED, r[key])


def _caption_scores(r: Dict[str, Any], pick=_lead) -> str:
    recall = ["/".join(f"{pick(r, key)[rank]:.1f}" for rank in ("1", "5", "10")) for key in ("recall_i2t", "recall_t2i")]
    return f"{recall[0]:>18}{recall[1]:>18}{pick(r, 'rsum'):>7.1f}{pick(r, 'map_i2t'):>11.4f}{pick(r, 'map_t2i'):>7.4f}"


def _index_order(r: Dict[str, Any], key: str) -> Any:
    return r[key]


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A small plain-text table of result rows, with what each protocol (and database) means."""
    captions = [r for r in rows if "database" in r]
    labelled = [r for r in rows if "database" not in r]
    lines = []
    if labelled:
        real = any("real_valued" in r for r in labelled)
        tie_aware = any("map_i2t" + EXPECTED in r for r in labelled)
        lines.append(f"{HEAD}{'MAP@k':>6}{'I->T':>8}{'T->I':>8}" + (f"{'index I->T':>12}{'T->I':>8}" if tie_aware else "")
                     + (f"{'cosine I->T':>13}{'T->I':>8}" if real else ""))
        for r in labelled:
            index = f"{r['map_i2t']:>12.4f}{r['map_t2i']:>8.4f}" if "map_i2t" + EXPECTED in r else " " * 20 * tie_aware
            cosine = (f"{_lead(r['real_valued'], 'map_i2t'):>13.4f}{_lead(r['real_valued'], 'map_t2i'):>8.4f}"
                      if "real_valued" in r else "")
            lines.append(f"{_head(r)}{r['k']:>6}{_lead(r, 'map_i2t'):>8.4f}{_lead(r, 'map_t2i'):>8.4f}{index}{cosine}")
        floors = {(r["dataset"], r["n_bits"]): r for r in labelled if "random_map_i2t" in r}
        for (name, bits), r in floors.items():
            floor = {"dataset": name, "task": "random", "method": "-", "loss": None, "n_bits": bits, "protocol": "-"}
            lines.append(f"{_head(floor)}{r['k']:>6}{r['random_map_i2t']:>8.4f}{r['random_map_t2i']:>8.4f}")
    if captions:
        lines.append(f"{HEAD}{'database':<11}"
                     f"{'I->T R@1/5/10':>18}{'T->I R@1/5/10':>18}{'rSum':>7}{'MAP@k I->T':>11}{'T->I':>7}")
        for r in captions:
            floor = f" (random codes: rSum {r['random_rsum']:.1f})" if "random_rsum" in r else ""
            lines.append(f"{_head(r)}{r['database']:<11}{_caption_scores(r)}{floor}")
            if "rsum" + EXPECTED in r:
                lines.append(f"{'  (ties by database index)':<{len(HEAD)}}{r['database']:<11}"
                             f"{_caption_scores(r, _index_order)}")
            if "real_valued" in r:
                lines.append(f"{'  (cosine of the real-valued head outputs)':<{len(HEAD)}}{r['database']:<11}"
                             f"{_caption_scores(r['real_valued'])}")
        lines.append("  caption set (relevance = same id): image->text queries are the unique query images, "
                     "text->image queries every query caption; R@K in %")
        lines.append("  test: the query split as database; collection: query and retrieval together")
    if any("map_i2t" + EXPECTED in r for r in rows):
        lines.append("  scores: the mean over every order of tied items (tie-aware, docs/evaluation.md); index: "
                     "ties broken by database index, as the field's code does")
    if any("real_valued" in r for r in rows):
        lines.append("  cosine: the hash heads' real-valued outputs before the sign, ranked by cosine (what the "
                     "codes lose to their sign)")
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        lines.append(f"  {protocol}: {PROTOCOL_NOTES[protocol]}")
    return "\n".join(lines)


def report(rows: List[Dict[str, Any]], results: Optional[str], echo: Log = print) -> None:
    """Print rows as a table and append them to the results file (when one is given); nothing without rows
    (a rank other than 0 of a distributed run)."""
    if not rows:
        return
    echo(format_table(rows))
    if results:
        try:
            append_results(results, rows)
        except OSError as err:  # checked before the run (ucmfh.app.outputs); the disk may still fill up
            raise OSError(f"--results {results}: the rows above were not appended ({err.strerror or err}); the "
                          "checkpoints are saved, so the same command scores them again without training") from None
        echo(f"results appended to {results}")
