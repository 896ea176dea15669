"""Plots of evaluation results: precision–recall by Hamming radius and precision@K.

matplotlib is an optional extra (``pip install ucmfh[plot]``), imported only here
and only when a plot is drawn.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
import weakref
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ucmfh.files import atomic_file


GLYPH_WARNING = r"Glyph \d+ .* missing from (current )?font"  # matplotlib < 3.9 says 'current'


def require_matplotlib():
    """matplotlib, or ``ImportError`` in one line naming the extra ``ucmfh[plot]`` where it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib, an optional extra: pip install 'ucmfh[plot]' (or pip install matplotlib)"
        ) from None
    return matplotlib


@contextlib.contextmanager
def drawing() -> Iterator[None]:
    """ucmfh's matplotlib settings for the figures drawn and saved inside the block, and no longer.

    pyplot is not used (:func:`subplots` makes a figure of its own on an Agg canvas), so a notebook that draws
    ucmfh's figures keeps its backend, its open figures, its rcParams and its warning filters as they were.
    Inside: an SVG's ids are not drawn at random (the same figure, the same bytes); names are drawn as they are,
    where a '$' in a dataset or method name began mathtext (a name in italics, or "Unknown symbol"); and a
    character the font lacks, a warning at each drawing of it (140 lines for one CJK name), is said once a figure
    instead, by :func:`save_figure`."""
    matplotlib = require_matplotlib()
    settings = {"svg.hashsalt": "ucmfh", "text.parse_math": False}
    with matplotlib.rc_context({k: v for k, v in settings.items() if k in matplotlib.rcParams}), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GLYPH_WARNING)
        yield


def subplots(*args, figsize: Tuple[float, float], **kwargs):
    """A figure of its own (not pyplot's: nothing to close) on an Agg canvas, and its ``subplots(*args,
    **kwargs)``; drawn and saved inside :func:`drawing`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(*args, **kwargs)


_NAMES = {"i2t": "I→T", "t2i": "T→I"}


Runs = Union[Dict[str, object], Sequence[Tuple[str, Dict[str, object]]]]


def _runs(results: Runs) -> List[Tuple[str, Dict[str, object]]]:
    """One evaluation's results as the one unnamed run, or several ``(label, results)``."""
    return [("", results)] if isinstance(results, dict) else list(results)


def curve_labels(runs: Sequence[Tuple[str, Dict[str, object]]]) -> List[Tuple[str, Dict[str, object]]]:
    """Several runs' results by path, labelled for a figure: each run's method and code length (a codes file's
    attributes, :func:`ucmfh.metrics.evaluate_codes_file`), or its file's name where those do not tell two apart."""
    def label(path: str, results: Dict[str, object]) -> str:
        settings = results.get("settings", {})
        method = settings.get("attrs", {}).get("method")
        return f"{method} {settings['n_bits']} bits" if method and "n_bits" in settings else os.path.basename(path)

    labels = [label(path, results) for path, results in runs]
    return [(text if labels.count(text) == 1 else os.path.basename(path), results)
            for text, (path, results) in zip(labels, runs)]


def _draw(runs: List[Tuple[str, Dict[str, object]]], points, what: str, configure) -> object:
    """The figure of ``runs``: one evaluation's two directions on one axes, or, for several runs, one axes
    per direction (I→T, T→I) with a line per run in its own colour and one legend beside them.
    ``points(results, name)`` gives a direction's (x, y), or None where the results have none;
    ``configure(ax)`` sets an axes' scales and labels. Precision runs from 0 to a little above the highest
    point drawn (at most 1): a caption set's precision of a few per cent is not a line along the floor."""
    if len(runs) == 1:
        fig, ax = subplots(figsize=(5, 4))
        results = runs[0][1]
        for name, direction in _NAMES.items():
            xy = points(results, name)
            if xy:
                ax.plot(*xy, marker=".", label=direction)
        ax.set_title(_title(runs, what))
        configure(ax)
        _fit_precision([ax])
        ax.legend()
        return fig
    fig, axes = subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, (name, direction) in zip(axes, _NAMES.items()):
        for i, (label, results) in enumerate(runs):
            xy = points(results, name)
            if xy:
                ax.plot(*xy, marker=".", color=f"C{i % 10}", label=label)
        ax.set_title(_title(runs, f"{what}, {direction}"))
        configure(ax)
    _fit_precision(axes)
    axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def precision_top(highest: float) -> float:
    """The top of a precision axis whose highest point is ``highest``: 10 % above it, up to the next 0.05,
    at most 1 (1 when nothing is drawn)."""
    return 1.0 if highest <= 0 else min(1.0, math.ceil(highest * 1.1 * 20 - 1e-9) / 20)


def _fit_precision(axes) -> None:
    highest = max((float(max(line.get_ydata(), default=0.0)) for ax in axes for line in ax.get_lines()), default=0.0)
    for ax in axes:
        ax.set_ylim(0, precision_top(highest))


def plot_pr_curve(results: Runs, path: str) -> str:
    """Precision–recall by Hamming radius, both directions, from :func:`evaluate_codes` results: of one
    evaluation, or of several runs on one figure (``[(label, results), ...]``: methods at one length)."""
    return _pr_curve(results, [path])[0]


def _pr_curve(results: Runs, paths: Sequence[str]) -> List[str]:
    """:func:`plot_pr_curve`'s figure, drawn once and written to each of ``paths``."""
    def points(res, name):
        curve = res.get(name, {}).get("pr_curve")
        return (curve["recall"], curve["precision"]) if curve else None

    def configure(ax):
        ax.set_xlabel("recall")
        ax.set_ylabel("precision")
        ax.set_xlim(0, 1.02)  # a point at recall 1 whole, not cut by the frame
        ax.grid(alpha=0.3)

    return _save(lambda: _draw(_runs(results), points, "precision–recall by Hamming radius", configure), paths)


def plot_precision_at_k(results: Runs, path: str) -> str:
    """Precision@K curves, both directions, from :func:`evaluate_codes` results: of one evaluation, or of
    several runs on one figure (``[(label, results), ...]``).

    Only K <= N (a direction's ``n_database``, a caption set's, else ``settings["n_retrieval"]``) is drawn:
    beyond N the metric counts K as N
    and repeats P@N, which is drawn once, at K = N. The tie-aware curve where the results have
    it (``precision_expected``), else the one with ties by index.
    """
    return _precision_at_k(results, [path])[0]


def _precision_at_k(results: Runs, paths: Sequence[str]) -> List[str]:
    """:func:`plot_precision_at_k`'s figure, drawn once and written to each of ``paths``."""
    def points(res, name):
        pk = res.get(name, {}).get("precision_at_k")
        n = res.get(name, {}).get("n_database", res.get("settings", {}).get("n_retrieval"))
        return _up_to(pk["k"], pk.get("precision_expected", pk["precision"]), n) if pk else None

    def configure(ax):
        from matplotlib import ticker

        ax.set_xscale("log")
        # K as a plain number: the log axis' own labels are mathtext ($10^{2}$), drawn as raw text where a '$' in
        # a name must not begin mathtext (drawing())
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("K (retrieved items)")
        ax.set_ylabel("precision@K")
        ax.grid(alpha=0.3)

    runs = _runs(results)
    tie_aware = all("precision_expected" in res.get(name, {}).get("precision_at_k", {"precision_expected": 0})
                    for _, res in runs for name in _NAMES)
    what = "precision@K, " + ("tie-aware" if tie_aware else "ties broken by database index")
    return _save(lambda: _draw(runs, points, what, configure), paths)


def _up_to(ks: List[int], values: List[float], n: Optional[int]) -> Tuple[List[int], List[float]]:
    """The points (min(K, n), value) of a curve over K, each x once (the first K that gives it)."""
    xs: List[int] = []
    ys: List[float] = []
    for k, v in zip(ks, values):
        x = k if n is None else min(k, n)
        if x not in xs:
            xs.append(x)
            ys.append(v)
    return xs, ys


# a figure is written as both: a PNG to look at, an SVG for a paper
SUFFIXES = (".png", ".svg")


def figure_prefix(prefix: str) -> str:
    """A --plot PREFIX as given, less a figure's extension where it ends in one (``--plot figs/length.png`` wrote
    ``figs/length.png_wiki_map_i2t.png``), as a grid's --table PATH.md is taken as PATH."""
    stem, extension = os.path.splitext(prefix)
    return stem if extension.lower() in SUFFIXES and os.path.basename(stem) else prefix


def figure_start(prefix: str) -> str:
    """What the names of the figures of a --plot PREFIX follow: ``PREFIX_`` (less a figure's extension,
    :func:`figure_prefix`), or a folder's path where the prefix ends in a separator or is a folder (``--plot
    figs/`` and, ``figs`` being a folder, ``--plot figs`` write ``figs/wiki_map_i2t.png``, where they wrote
    ``figs/_wiki_map_i2t.png`` and ``figs_wiki_map_i2t.png`` beside the folder)."""
    if prefix.endswith(("/", os.sep)):
        return prefix
    return os.path.join(prefix, "") if os.path.isdir(prefix) else figure_prefix(prefix) + "_"


def plot_curves(results: Runs, prefix: str) -> List[str]:
    """Write the precision–recall figure (of Hamming results) and the precision@K one, each as ``pr`` and ``pk``
    after :func:`figure_start` of ``prefix``, in each of :data:`SUFFIXES`; return the paths. ``results``: one
    evaluation's, or several runs' ``[(label, results), ...]``, each figure then a panel per direction and a
    line per run."""
    runs, start = _runs(results), figure_start(prefix)
    paths = []
    if any("pr_curve" in res.get(name, {}) for _, res in runs for name in _NAMES):
        paths += _pr_curve(runs, [f"{start}pr{suffix}" for suffix in SUFFIXES])
    paths += _precision_at_k(runs, [f"{start}pk{suffix}" for suffix in SUFFIXES])
    return paths


def _title(runs: List[Tuple[str, Dict[str, object]]], what: str) -> str:
    """``what``, and on a second line the dataset, protocol, database (a caption set's) and code length the runs
    share, where known."""
    shared = None
    for _, results in runs:
        settings = results.get("settings", {})
        attrs = settings.get("attrs", {}) if isinstance(settings, dict) else {}
        parts = [str(attrs[key]) for key in ("dataset", "protocol") if key in attrs]
        if settings.get("database") is not None:
            parts.append(f"database {settings['database']}")
        if "n_bits" in settings:
            parts.append(f"{settings['n_bits']} bits")
        shared = parts if shared is None else [p for p in shared if p in parts]
    return what + ("\n" + ", ".join(shared) if shared else "")


def figure_kind(path: str) -> str:
    """The kind of figure file ``path`` is written as (:data:`ucmfh.files.MARKS`): SVG by its suffix, else PNG."""
    return "figure-svg" if path.lower().endswith(".svg") else "figure"


def save_figure(fig, path: str, tight: bool = False) -> str:
    """Write ``fig`` to ``path`` atomically, as SVG or PNG by its suffix, with ucmfh's mark
    (:data:`ucmfh.files.MARKS`: the PNG's Software chunk, the SVG's creator; no date, so it is reproducible).
    A PNG is written with a palette of 256 colours (:func:`_palette_png`). ``tight``: the page fitted to what
    is drawn (a legend beside the axes is not cut off however long its labels)."""
    fit = {"bbox_inches": "tight"} if tight else {}
    missing = missing_glyphs(fig) if fig not in _GLYPHS_SAID else []
    if missing:  # once a figure, not once a file of it (its PNG and its SVG)
        _GLYPHS_SAID.add(fig)
        warnings.warn(f"{path}: {len(missing)} character{'s' * (len(missing) > 1)} of its text "
                      f"{'have' if len(missing) > 1 else 'has'} no glyph in matplotlib's font, drawn as a box: "
                      f"{' '.join(missing[:10])}{' …' if len(missing) > 10 else ''}", stacklevel=2)
    with atomic_file(path) as tmp:
        if figure_kind(path) == "figure-svg":
            fig.savefig(tmp, format="svg", metadata={"Creator": "ucmfh", "Date": None}, **fit)
        else:
            rendered = io.BytesIO()
            fig.savefig(rendered, dpi=120, format="png", **fit)
            _palette_png(rendered, tmp)
    return path


_GLYPHS_SAID: "weakref.WeakSet" = weakref.WeakSet()  # figures whose missing glyphs were said


def missing_glyphs(fig) -> List[str]:
    """The characters of ``fig``'s visible text that its fonts have no glyph for (each once, in order)."""
    from matplotlib.font_manager import findfont, get_font
    from matplotlib.text import Text

    missing: Dict[str, None] = {}
    for text in fig.findobj(Text):
        chars = {c for c in text.get_text() if not c.isspace()}
        if not chars or not text.get_visible():
            continue
        font = get_font(findfont(text.get_fontproperties()))
        missing.update((c, None) for c in sorted(chars) if font.get_char_index(ord(c)) == 0)
    return list(missing)


def _palette_png(rendered: io.BytesIO, path: str) -> None:
    """matplotlib's PNG (``rendered``) again with a palette of 256 colours (median cut), not dithered: a
    figure's flat colours and the anti-aliased edges of its lines, at a third of the size (figures are
    committed to docs/), marked ``Software: ucmfh``."""
    from PIL import Image, PngImagePlugin

    image = Image.open(rendered).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                                         dither=Image.Dither.NONE)
    info = PngImagePlugin.PngInfo()
    info.add_text("Software", "ucmfh")
    image.save(path, format="PNG", optimize=True, pnginfo=info)


def _save(draw, paths: Sequence[str]) -> List[str]:
    """The figure ``draw()`` makes, laid out and written to each of ``paths``."""
    with drawing():
        fig = draw()
        fig.tight_layout()
        fit_titles(fig)
        for path in paths:
            save_figure(fig, path)
    return list(paths)


def fit_titles(fig) -> None:
    """Shrink a title that runs past the figure's edges (a long dataset name) so that it fits
    where it stands, centred over its axes; then lay out again."""
    renderer = fig.canvas.get_renderer()
    shrunk = False
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        centre = (box.x0 + box.x1) / 2
        room = 2 * min(centre - fig.bbox.x0, fig.bbox.x1 - centre) * 0.96
        if box.width > room:
            ax.title.set_fontsize(ax.title.get_fontsize() * room / box.width)
            shrunk = True
    if shrunk:
        fig.tight_layout()
