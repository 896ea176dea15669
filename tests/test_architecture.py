"""The layers of docs/architecture.md, checked on the source: what may import what."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

PACKAGE = Path(__file__).resolve().parents[1] / "ucmfh"
APP = PACKAGE / "app"


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
