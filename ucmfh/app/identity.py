"""A run's identity: the dataset file's content (a SHA-256 fingerprint; its resolved path is recorded
beside it) plus every setting that changes the result (:func:`ucmfh.config.identity_dict`: all but the
device, and a setting added later at the value earlier runs had). Runs live in folders named by it::

    OUT/DATASET-FP/                    one dataset file's content (FP: its fingerprint)
      LOSS-seedSEED-KEY/               a fusion stage: fusion.pt, identity.json
        hash-KEY/                      hashing settings on it: hash16.pt, hash64.pt, identity.json
      METHOD-seedSEED-KEY/             a method without a fusion stage: hash16.pt, ..., identity.json

Two files with the same name never share a folder; two runs that differ in any setting, or in the number of
processes they train in (:func:`processes`, in each stage's settings), never share a checkpoint. Result rows
carry the dataset's path and fingerprint, the settings and the run key.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from ucmfh.config import FusionConfig, HashConfig, identity_dict
from ucmfh.files import fingerprint
from ucmfh.printable import printable

if TYPE_CHECKING:
    from ucmfh.data.h5 import Dataset


def dataset_label(path: str) -> str:
    """What tables call a dataset: its file's stem (what ``-d NAME`` names), its control characters escaped."""
    return printable(os.path.splitext(os.path.basename(path))[0])


def dataset_identity(data: Union[Dataset, str, os.PathLike]) -> Dict[str, str]:
    """The dataset part of a run's identity: label, resolved path, content fingerprint, of a loaded dataset or of
    a dataset file's path (the file is not read as a dataset: a finished grid loads none to print its table)."""
    path = os.fspath(data) if isinstance(data, (str, os.PathLike)) else data.path
    if path is None:
        raise ValueError("a run needs a dataset read from a file (its fingerprint is part of the run's identity)")
    from ucmfh.data.h5 import validate_file

    if not os.path.isfile(path):  # a pipe's fingerprint waited for ever: said as validation says what it is
        validate_file(path)
    try:
        digest = fingerprint(path)
    except OSError:  # unreadable (permissions): said as validation says it, not as a bare errno
        validate_file(path)
        raise
    return {"label": dataset_label(path), "path": os.path.realpath(path), "fingerprint": digest}


def hash_settings(cfg: HashConfig) -> Dict[str, Any]:
    """The settings of a hashing config that change its result (:func:`ucmfh.config.identity_dict`), with its
    method's ``version`` where the method has one (a method of another package, docs/methods.md)."""
    from ucmfh.methods import build_method

    version = build_method(cfg.method).version
    return {**identity_dict(cfg), "method_version": version} if version else identity_dict(cfg)


def current_group():
    """:func:`ucmfh.distributed.current_group`, imported when asked: reading results (``ucmfh runs``) needs no
    torch."""
    from ucmfh import distributed

    return distributed.current_group()


def processes(n: Optional[int] = None) -> Dict[str, int]:
    """The number of processes a run trains in (``n``; default this run's), as each stage's settings in its
    identity hold it: several processes draw other dropout masks than one (docs/distributed.md), so a run of
    N > 1 is another run; one process's settings say nothing (the runs made before it keep their keys)."""
    n = current_group().world_size if n is None else int(n)
    return {"processes": n} if n > 1 else {}


def run_settings(fusion_cfg: Optional[FusionConfig], hash_cfg: Optional[HashConfig], trained_in: int
                 ) -> Dict[str, Any]:
    """A run's settings as its identity and rows hold them: each stage's (None: no such stage) with the number
    of processes it trains in beyond one (:func:`processes`)."""
    beyond_one = processes(trained_in)
    return {"fusion": None if fusion_cfg is None else {**identity_dict(fusion_cfg), **beyond_one},
            "hash": None if hash_cfg is None else {**hash_settings(hash_cfg), **beyond_one}}


def trained_in(meta: Any) -> int:
    """The processes a checkpoint was trained in, as its meta records it (1 where it does not: a checkpoint of a
    library caller, or of before the count was kept)."""
    n = meta.get("world_size") if isinstance(meta, dict) else None
    return n if isinstance(n, int) and n >= 1 else 1


def key_of(value: Any) -> str:
    """A short stable key of a JSON-able value (SHA-256 of its canonical JSON, 12 hex digits)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def dataset_folder(out: str, dataset: Dict[str, str], run_folder: str) -> str:
    """``OUT/LABEL-FP``, the folder of a dataset file's runs; where ``run_folder`` (a run's folder in it) is not
    there but is in a folder of the same content under another name (the file renamed or copied since that run
    trained), that one: a run's identity is the content, not the name. A new run goes under the file's name."""
    fp = dataset["fingerprint"]
    mine = os.path.join(out, f"{dataset['label']}-{fp[:8]}")
    if os.path.isdir(os.path.join(mine, run_folder)):
        return mine
    for other in sorted(glob.glob(os.path.join(glob.escape(out), f"*-{fp[:8]}"))):
        if os.path.isdir(os.path.join(other, run_folder)) and _recorded_fingerprint(other, run_folder) in (fp, None):
            return other
    return mine


def _recorded_fingerprint(folder: str, run_folder: str) -> Optional[str]:
    """The dataset fingerprint a run folder's ``identity.json`` records (its whole, where 8 characters of it named
    the folder), or None where it records none."""
    try:
        with open(os.path.join(folder, run_folder, "identity.json"), encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return None
    return recorded.get("dataset_fingerprint") if isinstance(recorded, dict) else None


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
    trained_in: Optional[int] = None  # the processes it trains in (a checkpoint's, scored); None: this run's

    def __post_init__(self) -> None:
        from ucmfh.methods.settings import trains_fusion

        if self.trained_in is None:
            self.trained_in = current_group().world_size
        if self.hash_cfg is not None and not trains_fusion(self.hash_cfg.method):
            self.fusion_cfg = None  # not part of this run: its method trains no fusion encoder

    @property
    def dataset_dir(self) -> str:
        """The folder of the dataset file's runs (:func:`dataset_folder`): the one holding this run."""
        top = self.fusion_folder if self.fusion_cfg is not None else self.hash_folder
        return dataset_folder(self.out, self.dataset, top)

    @property
    def fusion_identity(self) -> Dict[str, Any]:
        return {"dataset_fingerprint": self.dataset["fingerprint"], "fusion": self.settings()["fusion"]}

    @property
    def hash_identity(self) -> Dict[str, Any]:
        if self.fusion_cfg is None:
            return {"dataset_fingerprint": self.dataset["fingerprint"], "hash": self.settings()["hash"]}
        return {**self.fusion_identity, "hash": self.settings()["hash"]}

    @property
    def fusion_folder(self) -> str:
        """The fusion stage's folder name (in :attr:`dataset_dir`)."""
        cfg = self.fusion_cfg
        return f"{cfg.loss}-seed{cfg.seed}-{key_of(self.fusion_identity)[:8]}"

    @property
    def fusion_dir(self) -> str:
        return os.path.join(self.dataset_dir, self.fusion_folder)

    @property
    def hash_dir_identity(self) -> Dict[str, Any]:
        """What the hashing folder's runs share: all but the code length, which names each checkpoint."""
        settings = {k: v for k, v in self.settings()["hash"].items() if k != "n_bits"}
        return {**self.hash_identity, "hash": settings}

    @property
    def hash_folder(self) -> str:
        """The hashing stage's folder name: in :attr:`dataset_dir` for a method without a fusion stage, else in
        its fusion stage's folder."""
        key = key_of(self.hash_dir_identity["hash"])[:8]
        return f"{self.hash_cfg.method}-seed{self.hash_cfg.seed}-{key}" if self.fusion_cfg is None else f"hash-{key}"

    @property
    def hash_dir(self) -> str:
        return os.path.join(self.dataset_dir if self.fusion_cfg is None else self.fusion_dir, self.hash_folder)

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
        return run_settings(self.fusion_cfg, self.hash_cfg, self.trained_in)


@dataclass
class RunOptions:
    """How a run is carried out (none of it changes the result)."""

    out: str = "runs"
    resume: bool = False  # continue interrupted stages; reuse finished ones
    save_interval: float = 120.0  # seconds between saves of the training state
    progress: bool = True
    always_resumes: bool = False  # a grid: resuming is its way, so a fresh start is not news
    tensorboard: Optional[str] = None  # a folder of TensorBoard curves, one run folder in it per run (--tensorboard)
    # on a GPU, each full batch's step replayed from a captured CUDA graph: None where it can be (the default),
    # True asked for (--cuda-graph: a note where a step runs eagerly), False never (--no-cuda-graph)
    cuda_graph: Optional[bool] = None
    # the candidates a run chooses between on validation trained at once, in threads (--candidates-side-by-side)
    candidates_side_by_side: bool = False


@functools.lru_cache(maxsize=1)
def git_commit() -> Optional[str]:
    """The commit of the ucmfh source tree, when it is a git checkout of its own (asked once per process): not
    the commit of a repository that merely holds an installed copy (a project's ``.venv``), whose HEAD is the
    project's; marked '+dirty' where its ucmfh/ holds uncommitted changes. An installed copy has the commit pip
    recorded of it when it was installed from a git URL (:func:`installed_commit`)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../ucmfh
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=package, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return installed_commit(package)
    lines = out.stdout.splitlines()  # a path may hold spaces
    if out.returncode != 0 or len(lines) != 2:
        return installed_commit(package)
    top, commit = lines
    if os.path.realpath(top) != os.path.realpath(os.path.dirname(package)):  # ucmfh/ is not at its top
        return installed_commit(package)
    return (commit + _edited(top, package)) if commit else None


def _edited(top: str, package: str) -> str:
    """'+dirty' where the checkout's ucmfh/ differs from its HEAD (git describe's mark): rows of an edited copy
    named the commit alone, as if they were that commit's figures; '' otherwise, or where git cannot tell."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", package], cwd=top,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return "+dirty" if out.returncode == 0 and out.stdout.strip() else ""


def installed_commit(package: str) -> Optional[str]:
    """The commit of an installed ucmfh whose ``package`` folder is the one imported, as pip recorded it when it
    was installed from a git URL (``pip install git+https://…``: its ``direct_url.json``, PEP 610), or None (an
    install from a folder or an index, which names no commit): rows of an installed copy said 0.1.0 alone."""
    from importlib import metadata

    try:
        dist = metadata.distribution("ucmfh")
        if os.path.realpath(str(dist.locate_file("ucmfh"))) != os.path.realpath(package):
            return None  # another copy than the one imported (a checkout run beside an installed copy)
        commit = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info", {}).get("commit_id")
    except (metadata.PackageNotFoundError, OSError, ValueError, AttributeError):
        return None
    return commit if isinstance(commit, str) and commit.isalnum() else None


# the libraries whose release decides a result (scikit-learn's PCA moved cca-itq's codes at 1.5)
RESULT_LIBRARIES = ("torch", "numpy", "scipy", "scikit-learn")


@functools.lru_cache(maxsize=1)
def versions() -> Dict[str, Optional[str]]:
    """The releases a result row was made with: ucmfh's installed one (the one record of an installed copy, whose
    ``git_commit`` is None; None for a checkout run uninstalled, which ``git_commit`` names), Python's and
    RESULT_LIBRARIES' (None: not installed), read without importing them."""
    import platform
    from importlib import metadata

    def installed(name: str) -> Optional[str]:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"ucmfh": installed("ucmfh"), "python": platform.python_version(),
            **{name: installed(name) for name in RESULT_LIBRARIES}}
