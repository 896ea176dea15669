"""A static results page: per query, its top-k thumbnails (image paths) or captions, distances, relevance."""
from __future__ import annotations

import html
import os
import pathlib
import urllib.parse
from typing import List, Optional

from ucmfh.files import MARKS, PathLike, write_text_atomic
from ucmfh.printable import printable
from ucmfh.search.results import NAMES, Results, in_folder_of

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; overflow-wrap: anywhere; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin: 1.4em 0 .4em; }
.hits { display: flex; flex-wrap: wrap; gap: .6em; }
.hit { width: 180px; border: 2px solid #ccc; border-radius: 6px; padding: .4em; font-size: .85em; }
.hit.relevant { border-color: #2a9d3a; background: #effaf0; }
.hit img { width: 100%; height: 120px; object-fit: cover; display: block; background: #eee; }
.meta { color: #555; font-size: .8em; margin-bottom: .3em; }
.mark { color: #2a9d3a; font-weight: bold; }
.note { color: #555; font-size: .85em; }
"""


def _src(path: str, page_dir: str) -> str:
    """An image path as a link from the page to that file: relative where it can be, else a file URI; each part
    percent-encoded, so that a path is never read as another URL (``javascript:alert(1)``, ``data:…``,
    ``http:/host/…`` became live links) nor as another file (``a%20b.jpg``, ``q?x=1#f.jpg``)."""
    absolute = os.path.abspath(path)
    try:
        return urllib.parse.quote(pathlib.PurePath(os.path.relpath(absolute, page_dir)).as_posix(), safe="/")
    except ValueError:  # another drive (Windows)
        return pathlib.Path(absolute).as_uri()


def render_html(results: Results, title: str = "ucmfh search", page_dir: str = ".") -> str:
    """The page as a string (self-contained: inline style, no script)."""
    q = results.queries
    e = _text
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
           f"<meta name='viewport' content='width=device-width, initial-scale=1'>{MARKS['page'].decode()}"
           f"<title>{e(title)}</title>",
           f"<style>{_STYLE}</style></head><body>", f"<h1>{e(title)}</h1>",
           f"<p class='note'>{len(q)} {NAMES[q.modality]} quer{'y' if len(q) == 1 else 'ies'} against "
           f"{NAMES[results.modality]} items; "
           f"ranked by Hamming distance{', re-ranked by cosine' if results.cosine is not None else ''}"
           f"{', re-ranked by SEPS' if results.seps is not None else ''}"
           f"{'; relevant: ' + e(results.relevance) + ' (green)' if results.relevance else ''}.</p>"]
    for i in range(results.positions.shape[0]):
        head = f"Query {results.first + i}" + (f" (id {q.ids[i]})" if q.ids is not None else "")
        out.append(f"<section class='query'><h2>{e(head)}</h2>")
        if q.text is not None:
            out.append(f"<p class='qtext'>{e(q.text[i])}</p>")
        elif q.paths is not None:
            out.append(f"<div class='hit'>{_image(in_folder_of(q.path, q.paths[i]), page_dir, 'query')}</div>")
        elif q.paired_text is not None:  # no image to show: what the image is, by the text paired with it
            out.append(f"<p class='qtext'><i>its paired text:</i> {e(q.paired_text[i])}</p>")
        out.append("<div class='hits'>")
        for r in range(results.positions.shape[1]):
            relevant = results.relevant is not None and bool(results.relevant[i, r])
            meta = f"#{r + 1} · id {results.ids[i, r]} · distance {results.distances[i, r]}"
            if results.cosine is not None:
                meta += f" · cos {results.cosine[i, r]:.3f}"
            if results.seps is not None:
                meta += f" · SEPS {results.seps[i, r]:.3f}"
            body = ""
            shown = results.shown[i][r]
            if shown is not None and results.modality == "img":
                body = _image(_hit_file(results, i, r), page_dir, f"id {results.ids[i, r]}")
            elif shown is not None:
                body = f"<div class='caption'>{e(shown)}</div>"
            elif results.described is not None and results.described[i][r] is not None:  # no image: a text of its id
                body = f"<div class='caption'><i>a text of its id:</i> {e(results.described[i][r])}</div>"
            mark = "<span class='mark'>✓ relevant</span>" if relevant else ""
            out.append(f"<div class='hit{' relevant' if relevant else ''}'><div class='meta'>{e(meta)} {mark}</div>"
                       f"{body}</div>")
        out.append("</div></section>")
    out.append("</body></html>")
    return "\n".join(out)


def _text(text: object) -> str:
    """Text of the user's data as the page shows it: escaped, its control characters written as the terminal
    writes them (a caption's U+202E turned what followed it, 'gpj.exe' read as 'exe.jpg')."""
    return html.escape(printable(str(text)))


def _image(path: str, page_dir: str, alt: str) -> str:
    """An image of the page, or where its file is not found from here, its path said (a broken link said nothing)."""
    if not os.path.exists(path):
        return f"<div class='caption'><i>image file not found:</i> {_text(path)}</div>"
    return f"<img src='{html.escape(_src(path, page_dir))}' alt='{_text(alt)}'>"


def _hit_file(results: Results, i: int, r: int) -> str:
    """The image file of query ``i``'s hit ``r``: its path as its collection file means it, or as stored."""
    return results.files[i][r] if results.files is not None else results.shown[i][r]


def missing_images(results: Results) -> List[str]:
    """The image files of a page of ``results`` (queries' and hits') that are not found from here, each once."""
    q = results.queries
    paths = [in_folder_of(q.path, path) for path in q.paths] if q.text is None and q.paths is not None else []
    if results.modality == "img":
        for i, row in enumerate(results.shown):
            paths += [_hit_file(results, i, r) for r, shown in enumerate(row) if shown is not None]
    return [path for path in dict.fromkeys(paths) if not os.path.exists(path)]


def write_html(path: PathLike, results: Results, title: Optional[str] = None) -> str:
    """Write the results page atomically; image links are relative to the page's folder."""
    path = os.fspath(path)
    page_dir = os.path.dirname(os.path.abspath(path))
    return write_text_atomic(path, render_html(results, title or "ucmfh search", page_dir))
