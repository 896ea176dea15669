"""The layers of docs/architecture.md, checked on the source: what may import what."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import ROOT

PACKAGE = ROOT / "ucmfh"
APP = PACKAGE / "app"
# the source tree beside the tests is read: a copy of the tests beside an installed package alone has none
pytestmark = pytest.mark.skipif(not PACKAGE.is_dir(), reason=f"no ucmfh source tree at {PACKAGE} to read")


def _modules() -> Iterator[Tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(tree: ast.Module) -> Iterator[Tuple[str, Tuple[str, ...], int]]:
    """(module, imported names, line) of every import, relative ones resolved enough to name ucmfh."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, tuple(a.name for a in node.names), node.lineno


def _is_library(path: Path) -> bool:
    return APP not in path.parents and path.name != "__main__.py"


def test_the_library_never_imports_the_app():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path, tree in _modules() if _is_library(path)
           for module, names, line in _imports(tree)
           if module.startswith("ucmfh.app") or (module == "ucmfh" and "app" in names)]
    assert not bad, bad


def test_no_library_module_imports_click():
    """The command line is the app's: the library raises plain errors (a ``SettingError`` names its setting)."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
           for path, tree in _modules() if _is_library(path)
           for module, _, line in _imports(tree) if module.split(".")[0] == "click"]
    assert not bad, bad


# what a method can do, read by the library alone (ucmfh.methods.settings answers the front doors' questions:
# the protocols it is scored under, its loss, the settings it has no use for)
CAPABILITIES = ("leak_free", "takes_loss", "uses_fusion", "shares_fusion_options", "closed_form", "graphable",
                "eager_because")


def test_the_front_doors_ask_the_library_not_the_registrys_flags():
    files = [*sorted(APP.rglob("*.py")), PACKAGE.parent / "demo.py"]
    bad = [f"{path.relative_to(PACKAGE.parent)}:{number} reads {flag}"
           for path in files for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           for flag in CAPABILITIES if re.search(rf"\b{flag}\b", line)]
    assert not bad, bad


def test_only_the_app_reads_the_environment():
    bad = []
    for path, tree in _modules():
        if not _is_library(path):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} reads os.{node.attr}")
    assert not bad, bad


def test_no_private_name_is_imported_across_modules():
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} from {module}"
           for path, tree in _modules()
           for module, names, line in _imports(tree) if module.startswith("ucmfh")
           for name in names
           # a compiled extension module of the package is imported by its (private) file name
           if name.startswith("_") and not (PACKAGE / module.split(".", 1)[1].replace(".", "/")).joinpath(
               name).with_suffix(".c").exists()]
    assert not bad, bad


# ------------------------------------------------------------------ the layer table of docs/architecture.md

DOC = PACKAGE.parent / "docs" / "architecture.md"


def _module_names() -> Dict[str, Path]:
    """Dotted names relative to the package (``search.index``; a package's ``__init__`` by its own name,
    the top one as ``__init__``) -> file."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _layer_table() -> List[Tuple[str, List[str]]]:
    """(layer, module names) of the table "| layer | modules |", top row first."""
    rows, inside = [], False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.replace(" ", "") == "|layer|modules|":
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            layer, modules = [cell.strip() for cell in line.strip("|").split("|")]
            rows.append((layer, re.findall(r"`([^`]+)`", modules)))
        elif inside and not line.startswith("|"):
            break
    assert rows, f"{DOC}: no '| layer | modules |' table"
    return rows


def _rank_of(name: str, table: List[Tuple[str, List[str]]]) -> Optional[int]:
    """The row (0 = top) of the longest listed name that is ``name`` or a package holding it."""
    best = None
    for rank, (_, modules) in enumerate(table):
        for listed in modules:
            if (name == listed or name.startswith(listed + ".")) and (best is None or len(listed) > len(best[1])):
                best = (rank, listed)
    return None if best is None else best[0]


def _package_imports(name: str, path: Path, names: Dict[str, Path]) -> Iterator[Tuple[str, int]]:
    """The package's modules that ``name`` imports (``from P import m`` of a module m imports P.m; of a
    name, P itself), lazy imports included."""
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package != "__init__" else []
                module = ".".join(["ucmfh", *base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            subs = [f"{module}.{a.name}" for a in node.names
                    if not _is_compiled(f"{module}.{a.name}")]  # the kernels: C, importing nothing
            if not subs:
                continue
            targets = [s for s in subs if s[len("ucmfh."):] in names]
            if len(targets) < len(subs):
                targets.append(module)
        else:
            continue
        for target in targets:
            if target == "ucmfh":
                target = "ucmfh.__init__"
            if target.startswith("ucmfh.") and target[len("ucmfh."):] in names:
                yield target[len("ucmfh."):], node.lineno


def _is_compiled(dotted: str) -> bool:
    return dotted.startswith("ucmfh.") and (PACKAGE / dotted[len("ucmfh."):].replace(".", "/")).with_suffix(".c").exists()


def test_every_module_has_a_layer_in_the_table():
    table, names = _layer_table(), _module_names()
    assert not [n for n in names if _rank_of(n, table) is None]
    listed = [m for _, modules in table for m in modules]
    assert not [m for m in listed if not any(n == m or n.startswith(m + ".") for n in names)], "listed, not in the code"


def test_imports_go_down_the_layer_table():
    table, names = _layer_table(), _module_names()
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} ({table[_rank_of(name, table)][0]}) imports "
           f"ucmfh.{target} ({table[_rank_of(target, table)][0]})"
           for name, path in names.items()
           for target, line in _package_imports(name, path, names)
           if _rank_of(target, table) < _rank_of(name, table)]
    assert not bad, bad


def test_no_import_circle():
    names = _module_names()
    graph = {name: {t for t, _ in _package_imports(name, path, names) if t != name} for name, path in names.items()}
    # a circle is a module that reaches itself: depth-first search with the path on a stack
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    circles = []

    def visit(node: str, path: List[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not circles, circles


def test_the_command_starts_without_the_libraries_only_some_commands_need():
    """scikit-learn alone added ~1 s to every `ucmfh` start (and to each torchrun rank); the libraries one
    method or command needs are imported where it runs. Every command's module is imported here, as the group
    imports the one that runs."""
    heavy = ("sklearn", "matplotlib", "faiss", "transformers", "PIL", "tensorboard")
    code = ("import sys\nfrom ucmfh.app.cli import COMMANDS, main\nfor name in COMMANDS:\n"
            "    assert main.get_command(None, name) is not None\n"
            f"print(*sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_the_commands_that_read_results_codes_or_an_index_start_without_torch():
    """`compare --help` took 3.3 s where `runs --help` took 0.3: the settings' stages came from a module that
    imports the methods, and torch with them. Listing runs, comparing them and searching an index need
    neither."""
    code = ("import sys\nfrom ucmfh.app.cli import main\nfor name in ('runs', 'compare', 'index', 'search'):\n"
            "    main.get_command(None, name)\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
