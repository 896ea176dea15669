"""What an install or a source distribution is made of (setup.py, MANIFEST.in)."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a virtual environment of Python 3.12 or later holds no setuptools until a build asks for it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="runs setup.py")


def test_a_build_ships_no_module_removed_since_an_earlier_build(tmp_path):
    """``pip install .`` builds in the checkout's build/lib: a module removed or renamed since an earlier build
    there was still copied into the wheel, and imported (an audit's)."""
    tmp_path = tmp_path / "build[1]"  # a folder whose name is a glob pattern too
    ghost = tmp_path / "ucmfh" / "_removed_since.py"
    ghost.parent.mkdir(parents=True)
    ghost.write_text("x = 1\n")
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    assert not ghost.exists()
    assert (tmp_path / "ucmfh" / "__init__.py").is_file() and (tmp_path / "ucmfh" / "app" / "cli.py").is_file()


def test_a_source_distribution_is_the_project_not_what_runs_leave_beside_it(tmp_path):
    """MANIFEST.in grafts tests/, docs/ and scripts/: the lock files, checkpoints, datasets and figures drawn again
    that runs leave there went into an sdist built from a used checkout (an audit's)."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "runs", "data",
                                                              "gpu-*", "*.egg-info", "__pycache__", "*.so"))
    # (folder, file): not paths the docs would name (tests/scripts/test_readme_summary.py looks for those)
    left = ["/".join(parts) for parts in (("docs", ".figures.lock"), ("docs", "results", ".small.jsonl.lock"),
                                          ("scripts", "bench.jsonl.lock"), ("tests", "model.pt"),
                                          ("tests", "scratch", "out.h5"), ("docs", "figures", "new.svg"),
                                          ("docs", "figures", "sub", "deep.svg"), ("tests", ".model.pt.tmp12.host"),
                                          ("docs", "results", "hash16.queries-abc.npz"))]
    for path in left:
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text("left by a run")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=copy, check=True,
                   capture_output=True)
    [sdist] = (tmp_path / "dist").iterdir()
    with tarfile.open(sdist) as archive:
        shipped = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert not shipped & set(left)
    project = ["README.md", "demo.py", "setup.py", "ucmfh/metrics/_hamming.c", "ucmfh/app/cli.py", ".ci/run",
               "tests/conftest.py", "scripts/planted_bugs.py", "docs/methods.md", "docs/results/flickr8k.jsonl",
               *(f"docs/figures/{png.name}" for png in (ROOT / "docs" / "figures").glob("*.png"))]
    assert not [path for path in project if path not in shipped]
