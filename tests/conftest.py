"""Shared by every test folder: tiny synthetic datasets, small model settings, the helpers several test
files use (the interrupting progress bar, caption and token sets), the guards every test runs under; all CPU."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import List, Optional

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ucmfh.config import FusionConfig, HashConfig, SepsConfig
from ucmfh.data.h5 import load_dataset
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.data.writer import write_dataset
from ucmfh.methods import hash_config

ROOT = Path(__file__).resolve().parents[1]  # the checkout: tests/ is one folder below it
SHARED_DATA = ROOT.parent / "shared" / "data"
SCRIPTS = ROOT / "scripts"

TINY = SyntheticSpec(n_query=80, n_retrieval=600, n_train=400, n_classes=24, mean_extra_labels=1.0,
                     d_img=48, d_txt=32, d_latent=16, noise=1.0, item_scale=0.5)
# image and text features of one width, as CLIP's are (512 and 512): a text hashed by the image head (or an
# image by the text head) shows by value there, where with TINY's widths it could only break a shape
TINY_EQUAL = dataclasses.replace(TINY, d_txt=TINY.d_img)


def load_script(name: str) -> ModuleType:
    """A script of scripts/ (``name`` without .py) imported as a module, for its functions."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Plain-float helpers of the loop-level transcriptions of released code (tests/methods/test_method_*.py)
def cli_commands(group=None, prefix: tuple = ()):
    """Every command of ``ucmfh``, a group's too: (its name as typed, e.g. 'convert pkl', the command)."""
    import click

    from ucmfh.app.cli import main

    group = main if group is None else group
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if isinstance(command, click.Group):
            yield from cli_commands(command, prefix + (name,))
        else:
            yield " ".join(prefix + (name,)), command


def unit(v: List[float]) -> List[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def dot(a: List[float], b: List[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def float_rows(x: torch.Tensor) -> List[List[float]]:
    """A tensor's rows as lists of Python floats (float64)."""
    return [[float(v) for v in row] for row in x.double()]


def small_fusion(**kw) -> FusionConfig:
    """A fusion encoder small enough for CPU tests."""
    base = dict(d_model=64, n_heads=4, d_ff=128, epochs=2, batch_size=64, lr=1e-3, device="cpu")
    return FusionConfig(**{**base, **kw})


def small_hash(**kw) -> HashConfig:
    base = dict(n_bits=16, hidden=128, epochs=2, batch_size=64, lr_fusion=1e-3, device="cpu")
    return HashConfig(**{**base, **kw})


def method_config(name: str, **kw) -> HashConfig:
    """A small config of method ``name`` for tiny data (the settings it has no use for left out); its own
    parameters stay its defaults."""
    return hash_config(name, drop_unused=True, **{"n_bits": 16, "hidden": 32, "epochs": 3, "batch_size": 64,
                                                  "device": "cpu", "val_fraction": 0.2, "patience": 0, **kw})


class StopAfter:
    """A progress bar that sends this process SIGINT (or ``signum``) after ``epochs`` epochs (a Ctrl-C at a
    known moment) and records the epoch each run starts at, the epoch the run is in (``epoch``, from 1) and
    whether its last bar was closed (``closed``)."""

    def __init__(self, epochs: Optional[int], signum: int = signal.SIGINT):
        self.epochs, self.signum = epochs, signum
        self.starts = []
        self.bar = None
        self.closed = False

    @property
    def epoch(self) -> int:
        return self.bar.n + 1

    def __call__(self, *args, **kwargs):
        outer = self
        self.starts.append(kwargs.get("initial", 0))

        class Bar:
            def __init__(self):
                self.n = kwargs.get("initial", 0)
                outer.bar, outer.closed = self, False

            def update(self, k):
                self.n += k
                if self.n == outer.epochs:
                    os.kill(os.getpid(), outer.signum)

            def set_postfix(self, **_):
                pass

            def close(self):
                outer.closed = True

        return Bar()


class AtFirstEpoch:
    """A progress bar (``trainer.tqdm``) that calls :meth:`first_epoch_ended` once, at the end of a run's first
    epoch (its training loop's signal handling in place); nothing else."""

    def __init__(self, *args, **kwargs):
        self.n = kwargs.get("initial", 0)

    def update(self, k):
        self.n += k
        if self.n == 1:
            self.first_epoch_ended()

    def first_epoch_ended(self):
        raise NotImplementedError

    def set_postfix(self, **_):
        pass

    def close(self):
        pass


class SigtermFromAThread(AtFirstEpoch):
    """For two training runs in threads of this process (grid cells or a run's candidates side by side): holds
    each at the end of its first epoch until both are there, then has one send SIGTERM to the process (its main
    thread hears it), and holds each until the stop has been passed on to its training loop
    (:func:`ucmfh.signals.stop_threads`)."""

    barrier = threading.Barrier(2, timeout=60)

    def first_epoch_ended(self):
        from ucmfh import signals

        if self.barrier.wait() == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not all(flag["signal"] for _, flag in signals._IN_THREADS.values()) and time.monotonic() < deadline:
            time.sleep(0.01)


# Caption sets (docs/reference.md §7) and token sets (§9), for the tests of captions, SEPS and search
def caption_file(path, rng=None, n_query=8, n_retrieval=40, labels=False):
    """A tiny caption set: 3 captions per image, relevance by id (no labels unless ``labels``); the same file at
    every call unless ``rng`` is given (a generator as the default was one for the whole session, so a file's
    numbers hung on the tests run before it in that process)."""
    rng = np.random.default_rng(0) if rng is None else rng
    latent = rng.normal(size=(n_query + n_retrieval, 8))
    a, b = rng.normal(size=(8, 12)), rng.normal(size=(8, 10))

    def split(images):
        ids = np.repeat(images, 3)
        img = np.repeat(latent[images] @ a, 3, axis=0)
        txt = latent[ids] @ b + 0.3 * rng.normal(size=(len(ids), 10))
        arrays = {"image": img, "text": txt, "ids": ids}
        if labels:
            arrays["labels"] = np.eye(2)[ids % 2]  # two classes: one for all scores every ranking 1 (refused)
        return arrays

    query, retrieval = np.arange(n_query), np.arange(n_query, n_query + n_retrieval)
    return write_dataset(path, {"train": split(retrieval), "query": split(query), "retrieval": split(retrieval)},
                         {"name": "captions"})


T, D_IMG, D_TXT = 8, 16, 12


def token_splits(seed: int = 0, images=(12, 40), captions: int = 2, dense: bool = False, cls: bool = False):
    """A caption set with tokens: each image's concept sits on 2 of its patches and in 2 words of each caption."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(8, D_IMG)), rng.normal(size=(8, D_TXT))
    out, next_id = {}, 0
    for split, n_img in zip(("query", "retrieval"), images):
        ids = np.repeat(np.arange(next_id, next_id + n_img), captions)
        next_id += n_img
        concept = rng.normal(size=(n_img, 8))
        img_tok = rng.normal(scale=0.5, size=(n_img, T, D_IMG))
        where = rng.integers(int(cls), T, size=(n_img, 2))
        for i in range(n_img):
            img_tok[i, where[i]] += concept[i] @ a
        img_tok = np.repeat(img_tok, captions, axis=0)
        lengths = rng.integers(3, 7, size=len(ids))
        words = []
        for item, length in enumerate(lengths):
            w = rng.normal(scale=0.5, size=(length, D_TXT))
            w[:2] += concept[ids[item] - ids[0]] @ b
            words.append(w)
        arrays = {
            "image": img_tok.mean(axis=1), "ids": ids,
            "text": np.stack([w.mean(axis=0) for w in words]),
            "image_tokens": img_tok, "text_tokens": np.concatenate(words),
            "text_offsets": np.concatenate([[0], np.cumsum(lengths)]),
        }
        if dense:  # a description of each item's image: its concept in every word
            d_len = np.full(len(ids), 4)
            arrays["dense_text_tokens"] = np.concatenate(
                [np.tile(concept[i - ids[0]] @ b, (4, 1)) + rng.normal(scale=0.1, size=(4, D_TXT)) for i in ids])
            arrays["dense_text_offsets"] = np.concatenate([[0], np.cumsum(d_len)])
        out[split] = arrays
    out["train"] = out["retrieval"]
    return out


def small_seps(**kw) -> SepsConfig:
    """A SEPS model small enough for CPU tests."""
    base = dict(embed_dim=32, epochs=4, batch_size=32, lr=3e-3, device="cpu", val_fraction=0.2, patience=0,
                pair_chunk=256)
    return SepsConfig(**{**base, **kw})


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    return make_synthetic(tmp_path_factory.mktemp("data") / "tiny.h5", TINY)


@pytest.fixture(scope="session")
def tiny(tiny_path):
    return load_dataset(tiny_path)


@pytest.fixture(scope="session")
def tiny_equal(tmp_path_factory):
    """TINY with text features as wide as the image features (48 and 48)."""
    return load_dataset(make_synthetic(tmp_path_factory.mktemp("data") / "tiny_equal.h5", TINY_EQUAL))


def _threads_each() -> int:
    """Torch threads for each test: OMP_NUM_THREADS where the caller set it, else two (the CI machine's cores)
    shared among pytest-xdist's workers (``-n``): one each on two cores run by two workers."""
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, min(2, os.cpu_count() or 1) // workers)


if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    # a worker's subprocesses (front doors, torchrun) share the cores too: threads a core and more would wait
    os.environ["OMP_NUM_THREADS"] = str(_threads_each())


@pytest.fixture(autouse=True)
def _threads():
    """Every test runs with :func:`_threads_each` torch threads."""
    torch.set_num_threads(_threads_each())
    yield


def runs_a_front_door(argv) -> bool:
    """Whether a subprocess's command line runs one of ucmfh's front doors: ``python -m ucmfh``, demo.py, or a
    script of scripts/."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        return False  # a shell line or a bare program: none of the tests' CLI calls
    argv = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv]
    if argv[1:3] == ["-m", "ucmfh"]:
        return True
    return len(argv) > 1 and argv[0] == sys.executable and argv[1].endswith(".py") and (
        Path(argv[1]).name == "demo.py" or Path(argv[1]).resolve().parent == SCRIPTS)


def no_traceback(output, argv) -> None:
    """Fail the test where a command's output holds a Python traceback: an error the CLI did not turn into
    its one line (exit 2)."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    if text and "Traceback (most recent call last)" in text:
        pytest.fail(f"{' '.join(map(str, argv))} crashed (a traceback, not a one-line error):\n{text[-3000:]}",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _no_crash_passes(request):
    """No test passes on a crash: a command run by click's CliRunner that ends in an exception
    other than SystemExit (a traceback and exit 1 for a user) fails the test, and so does a traceback in
    the output of a front door run as a subprocess (:func:`no_traceback`). A test of a crash on purpose says
    so with ``@pytest.mark.crash_ok``."""
    if request.node.get_closest_marker("crash_ok"):
        yield
        return
    invoke = CliRunner.invoke

    def guarded_invoke(self, cli, args=None, *a, **kw):
        result = invoke(self, cli, args, *a, **kw)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            shown = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else repr(result.exception)
            pytest.fail(f"{getattr(cli, 'name', cli)} {args}: raised {type(result.exception).__name__} instead of "
                        f"a one-line error (exit 2):\n{shown}\n{result.output[-2000:]}", pytrace=False)
        return result

    communicate = subprocess.Popen.communicate

    def guarded_communicate(self, *a, **kw):
        out, err = communicate(self, *a, **kw)
        if runs_a_front_door(self.args):
            no_traceback(err, self.args)
            no_traceback(out, self.args)
        return out, err

    with pytest.MonkeyPatch.context() as patch:  # not the test's monkeypatch: its undo() keeps the guard
        patch.setattr(CliRunner, "invoke", guarded_invoke)
        patch.setattr(subprocess.Popen, "communicate", guarded_communicate)
        yield


GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


@pytest.fixture(autouse=True)
def _signal_handlers_put_back():
    """A test leaves SIGINT, SIGTERM and SIGALRM as it found them. One left behind changes every later test of
    its process: a handler that only sets a stale flag made a later test's signal do nothing, and demo.py, run
    there as a script with the pytest worker's command line, trained UCMFH's whole default job in the checkout."""
    before = {s: signal.getsignal(s) for s in GUARDED_SIGNALS}
    yield
    left = {s: h for s, h in ((s, signal.getsignal(s)) for s in GUARDED_SIGNALS) if h != before[s]}
    for s in left:
        signal.signal(s, before[s])
    assert not left, f"the test left signal handlers changed: {', '.join(signal.Signals(s).name for s in left)}"


CHECKOUT_OUTPUTS = [ROOT / "runs", ROOT / "data"]


def _outputs_state():
    return {str(p): p.stat().st_mtime_ns for root in CHECKOUT_OUTPUTS if root.exists() for p in root.glob("*")}


@pytest.fixture(autouse=True)
def _nothing_written_to_the_checkout():
    """A test writes in its temporary folder only: a command run without --results or --out would add
    to the checkout's runs/."""
    before = _outputs_state()
    yield
    after = _outputs_state()
    assert after == before, f"the test wrote in the checkout: {sorted(set(after.items()) ^ set(before.items()))[:3]}"


def shared_file(name: str) -> str:
    """A dataset of ../shared/data, or a skip that says why it is absent."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present: the shared real datasets exist only beside the project's CI checkout")
    return str(path)


@pytest.fixture()
def read_only_dir(tmp_path):
    """A folder nothing can be created in, root included: mode 0555, or for root the immutable attribute
    (``chattr +i``, the ``Operation not permitted`` a user meets on such a folder); a skip where neither holds."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    immutable = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    if immutable:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("root without chattr +i: no folder is read-only to this process")
    else:
        folder.chmod(0o555)
    try:
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def dead_pid() -> int:
    """A pid no process has (for temporary files left by a killed writer): above the kernel's largest pid
    where Linux says which that is (an ended child's pid could be reused before the test looks)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read()) + 1
    except OSError:  # pragma: no cover - not Linux
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        return child.pid


def pytest_configure(config):
    config.addinivalue_line("markers", "torch_path: tests an internal of the metrics' torch path only")
    config.addinivalue_line("markers", "crash_ok: a CLI command of this test may end in an exception (no guard)")
    config.addinivalue_line("markers", "slow: over half a minute on the 2-core CI machine; run with --slow")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow")


def pytest_collection_modifyitems(config, items):
    """The default suite stays under 5 minutes on 2 cores: tests marked slow run with --slow only."""
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with python -m pytest tests --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
