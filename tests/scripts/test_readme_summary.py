"""The README's results summary is what scripts/readme_summary.py writes from docs/quality.md, and the
README, the docs and the code's comments name only docs that exist."""
import importlib.util
import re

from conftest import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("readme_summary", ROOT / "scripts" / "readme_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_summary_is_generated_from_docs_quality():
    script = _script()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    expected = script.replace_block(readme, script.summary((ROOT / "docs" / "quality.md").read_text(encoding="utf-8")))
    assert readme == expected, "README.md's summary differs from docs/quality.md: run python scripts/readme_summary.py"
    assert script.main(["--check"]) == 0


def test_the_summary_reads_means_from_the_tables():
    script = _script()
    quality = "\n".join([
        "| 64 bits | seeds | R@1 I→T | R@1 T→I | rSum |", "|---|---|---|---|---|",
        "| **`two-tower`** | 3 | **16.6 ± 1.2** | **13.9 ± 1.0** | **213.7 ± 7.9** |",
        "| `jdsh` | 3 | 11.1 ± 0.7 | 8.7 ± 0.2 | 158.9 ± 2.9 |", "",
        "**mirflickr730**, `unimodal`, tie-aware MAP@50 I→T / T→I", "",
        "| method | 16 bits | 32 bits | 64 bits |", "|---|---|---|---|",
        "| **`two-tower`** (default) | 1 | 2 | 0.820 ± 0.002 / 0.752 ± 0.005 |",
        "| `jdsh` | 1 | 2 | 0.774 ± 0.009 / 0.729 ± 0.013 |", "",
        "**wiki**, `unimodal`, tie-aware MAP@50 I→T / T→I", "",
        "| method | 16 bits | 32 bits | 64 bits |", "|---|---|---|---|",
        "| **`two-tower`** (default) | 1 | 2 | 0.251 ± 0.010 / 0.632 ± 0.010 |",
        "| `jdsh` | 1 | 2 | 0.257 ± 0.007 / 0.425 ± 0.012 |",
    ])
    rows = script.summary(quality).splitlines()[2:]
    assert rows == ["| **`two-tower`** (default) | 16.6 / 13.9 (213.7) | 0.820 / 0.752 | 0.251 / 0.632 |",
                    "| `jdsh` | 11.1 / 8.7 (158.9) | 0.774 / 0.729 | 0.257 / 0.425 |"]


def test_the_readme_is_a_front_page_that_keeps_the_ci_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    ci_command = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("pip install")]
    assert ci_command and all(line in readme.splitlines() for line in ci_command)


def test_every_file_the_readme_and_docs_name_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    code = [ROOT / "demo.py", ROOT / "setup.py",
            *sorted(path for folder in ("ucmfh", "scripts", "tests") for path in (ROOT / folder).rglob("*.py"))]
    missing = []
    for page in pages + code:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)", text) if page.suffix == ".md" else []:  # links, from the page
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: ]({target})")
        for target in re.findall(r"(?<![\w./])(docs/[\w./-]*\w)", text):  # the docs' own paths, from the root
            if not (ROOT / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "\n".join(missing)
