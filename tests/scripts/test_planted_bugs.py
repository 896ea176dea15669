"""scripts/planted_bugs.py's bookkeeping: every patch still applies to this tree, options and verdicts.
No test is run inside a test here: the script itself is run by hand, and takes minutes."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT, SCRIPTS

# the patches apply to the source tree beside the tests: a copy of the tests beside an installed package has none
pytestmark = pytest.mark.skipif(not (ROOT / "ucmfh").is_dir(), reason=f"no ucmfh source tree at {ROOT / 'ucmfh'}")



def _load():
    """The script as a module, registered in sys.modules (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location("planted_bugs", SCRIPTS / "planted_bugs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["planted_bugs"] = module
    spec.loader.exec_module(module)
    return module


planted = _load()


def test_every_old_text_occurs_exactly_once_in_its_file():
    planted.check_bugs(planted.BUGS, ROOT)  # raises, naming the bug, when the code moved on
    assert len({bug.name for bug in planted.BUGS}) == len(planted.BUGS)


def test_every_patch_changes_its_file_and_names_existing_tests():
    for bug in planted.BUGS:
        text = (ROOT / bug.file).read_text(encoding="utf-8")
        assert text.replace(bug.old, bug.new, 1) != text, bug.name
        for test in bug.tests:
            path, _, name = test.partition("::")
            assert (ROOT / path).is_file(), (bug.name, test)
            if name:
                assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(encoding="utf-8"), (bug.name, test)


def test_a_stale_patch_is_one_clear_error_naming_the_bug(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    twice = planted.Bug("twice", "a.py", "x = 1", "x = 2", "", ("tests/t.py",))
    with pytest.raises(planted.PlantError, match="'twice': its old text occurs 2 times in a.py"):
        planted.check_bugs([twice], tmp_path)
    with pytest.raises(planted.PlantError, match="unknown bug 'nope'"):
        planted.select(planted.BUGS, ["nope"])


def test_list_and_bad_options(tmp_path):
    script = str(SCRIPTS / "planted_bugs.py")
    listed = subprocess.run([sys.executable, script, "--list"], capture_output=True, text=True)
    assert listed.returncode == 0 and all(bug.name in listed.stdout for bug in planted.BUGS)
    for argv, message in ((["--only", "nope"], "unknown bug 'nope'"), (["--bogus"], "unrecognized arguments"),
                          (["--json", str(tmp_path / "no" / "x.json")], "--json")):
        bad = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stdout == "" and message in bad.stderr, (argv, bad.stderr)
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_verdicts_and_the_union_of_tests():
    outcome = planted.Outcome
    assert planted.verdict(outcome(1, 1.0, failed=["tests/a.py::t"])) == "caught"
    assert planted.verdict(outcome(1, 1.0, errors=["tests/a.py::t"])) == "caught"  # its fixture failed
    assert planted.verdict(outcome(0, 1.0)) == "not caught"
    assert planted.verdict(outcome(2, 1.0, errors=["tests/a.py"])) == "broken patch"  # collection failed
    assert planted.verdict(outcome(None, 1.0)) == "timeout"
    assert planted.verdict(outcome(5, 1.0)) == "error (pytest exit 5)"
    line = "FAILED tests/test_x.py::test_y[a - b] - AssertionError: 1 - 2"
    assert planted.SUMMARY.match(line)[2] == "tests/test_x.py::test_y[a - b]"
    bugs = [planted.Bug("a", "f", "o", "n", "", ("tests/t.py", "tests/u.py::x")),
            planted.Bug("b", "f", "o", "n", "", ("tests/t.py::y", "tests/u.py::x", "tests/v.py"))]
    assert planted.union_of_tests(bugs) == ["tests/t.py", "tests/u.py::x", "tests/v.py"]
    assert planted.module_of("ucmfh/models/fusion.py") == "ucmfh.models.fusion"
    assert planted.module_of("ucmfh/metrics/__init__.py") == "ucmfh.metrics" and planted.module_of("demo.py") is None
