"""The README's results summary, generated from the full tables of docs/quality.md.

One small table: every method at 64 bits, three seeds, tie-aware, `unimodal`: flickr8k's R@1 (and
rSum) from quality.md's 64-bit table, mirflickr730's and Wiki's MAP@50 from their three-seed tables
(the means; quality.md has the ± std and the intervals). It is written between the marker comments
of README.md, so the README cannot drift from the page it summarises (tests/scripts/test_readme_summary.py).

    python scripts/readme_summary.py           # rewrite the README's block
    python scripts/readme_summary.py --check   # exit 1 if the README's block is not what this writes
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"
FLICKR8K = "| 64 bits | seeds |"  # the header of quality.md's 64-bit flickr8k table
LABELLED = {"mirflickr730": "**mirflickr730**, `unimodal`, tie-aware MAP@50",  # the first line above each table
            "Wiki": "**wiki**, `unimodal`, tie-aware MAP@50"}


def _table(lines: list[str], start: int) -> list[list[str]]:
    """The rows (cells stripped, header and rule skipped) of the markdown table whose header is at ``start``."""
    rows = []
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _find(lines: list[str], prefix: str) -> int:
    """The first table header at or after the one line that starts with ``prefix``."""
    hits = [i for i, line in enumerate(lines) if line.strip().startswith(prefix)]
    if len(hits) != 1:
        raise ValueError(f"docs/quality.md: {len(hits)} lines start with {prefix!r}, expected one")
    i = hits[0]
    while not lines[i].strip().startswith("|"):
        i += 1
    return i


def _mean(cell: str) -> str:
    """'0.820 ± 0.002 / 0.752 ± 0.005' -> '0.820 / 0.752' (bold marks dropped)."""
    return " / ".join(part.split("±")[0].strip() for part in cell.replace("**", "").split(" / "))


def _method(cell: str) -> str:
    return cell.replace("**", "").replace("(default)", "").strip()


def summary(quality: str) -> str:
    """The README's table, from the text of docs/quality.md."""
    lines = quality.splitlines()
    labelled = {}
    for name, prefix in LABELLED.items():
        rows = _table(lines, _find(lines, prefix))
        labelled[name] = {_method(row[0]): _mean(row[3]) for row in rows}  # columns: method, 16, 32, 64 bits
    out = ["| method, 64 bits | flickr8k: R@1 I→T / T→I (rSum) | "
           + " | ".join(f"{name}: MAP@50 I→T / T→I" for name in LABELLED) + " |",
           "|---|---|" + "---|" * len(LABELLED)]
    for row in _table(lines, _find(lines, FLICKR8K)):
        method = _method(row[0])
        cells = [f"{_mean(row[2])} / {_mean(row[3])} ({_mean(row[4])})"] + [labelled[name][method] for name in LABELLED]
        name = f"**{method}** (default)" if method == "`two-tower`" else method
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def replace_block(readme: str, block: str) -> str:
    """``readme`` with the text between the markers replaced by ``block``."""
    head, sep, rest = readme.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"README.md: the markers {BEGIN} and {END} are missing")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if the README differs")
    args = parser.parse_args(argv)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    new = replace_block(readme, summary((ROOT / "docs" / "quality.md").read_text(encoding="utf-8")))
    if args.check:
        if new != readme:
            print("README.md: the summary differs from docs/quality.md; run python scripts/readme_summary.py",
                  file=sys.stderr)
            return 1
        return 0
    if new != readme:
        readme_path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
