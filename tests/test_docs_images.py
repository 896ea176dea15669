"""Every image the README and docs/ show is in the repository (a figure regenerated under another name, or
not committed, would leave a broken picture on the front page)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def test_every_image_a_page_shows_exists():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    shown = [(page, target) for page in pages for target in IMAGE.findall(page.read_text(encoding="utf-8"))
             if not target.startswith(("http://", "https://"))]
    assert len(shown) >= 8  # the README's figure, quality.md's six, search.md's page
    missing = [f"{page.relative_to(ROOT)}: {target}" for page, target in shown if not (page.parent / target).is_file()]
    assert not missing, missing
