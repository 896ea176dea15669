"""Shared fixtures: tiny synthetic datasets and small model settings, all CPU."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import List

import pytest
import torch
from click.testing import CliRunner

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import load_dataset
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

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


# Plain-float helpers of the loop-level transcriptions of released code (tests/test_method_*.py)
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


@pytest.fixture(autouse=True)
def _threads():
    """Two torch threads per test (the CI machine's cores), or OMP_NUM_THREADS where the caller set it."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or min(2, os.cpu_count() or 1)))
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


CHECKOUT_OUTPUTS = [Path(__file__).resolve().parents[1] / "runs", Path(__file__).resolve().parents[1] / "data"]


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
