"""Plots of evaluation results: precision–recall by Hamming radius and precision@K.

matplotlib is an optional extra (``pip install ucmfh[plot]``), imported only here
and only when a plot is drawn.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ucmfh.files import atomic_file


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend; ``ImportError`` in one line naming the extra
    ``ucmfh[plot]`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "plotting needs matplotlib, an optional extra: pip install 'ucmfh[plot]' (or pip install matplotlib)"
        ) from None
    return plt


_NAMES = {"i2t": "I→T", "t2i": "T→I"}


def plot_pr_curve(results: Dict[str, object], path: str) -> str:
    """Precision–recall by Hamming radius, both directions, from :func:`evaluate_codes` results."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, label in _NAMES.items():
        curve = results.get(name, {}).get("pr_curve")
        if curve:
            ax.plot(curve["recall"], curve["precision"], marker=".", label=label)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(_title(results, "precision–recall by Hamming radius"))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def plot_precision_at_k(results: Dict[str, object], path: str) -> str:
    """Precision@K curves, both directions, from :func:`evaluate_codes` results.

    Only K <= N (``settings["n_retrieval"]``) is drawn: beyond N the metric counts K as N
    and repeats P@N, which is drawn once, at K = N. The tie-aware curve where the results have
    it (``precision_expected``), else the one with ties by index.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    n = results.get("settings", {}).get("n_retrieval")
    for name, label in _NAMES.items():
        pk = results.get(name, {}).get("precision_at_k")
        if pk:
            ax.plot(*_up_to(pk["k"], pk.get("precision_expected", pk["precision"]), n), marker=".", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("K (retrieved items)")
    ax.set_ylabel("precision@K")
    ax.set_title(_title(results, "precision@K"))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


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


def plot_curves(results: Dict[str, object], prefix: str) -> List[str]:
    """Write ``{prefix}_pr.png`` (if Hamming results) and ``{prefix}_pk.png``; return the paths."""
    paths = []
    if any("pr_curve" in results.get(name, {}) for name in _NAMES):
        paths.append(plot_pr_curve(results, f"{prefix}_pr.png"))
    paths.append(plot_precision_at_k(results, f"{prefix}_pk.png"))
    return paths


def _title(results: Dict[str, object], what: str) -> str:
    """``what``, and on a second line the dataset, protocol and code length where known."""
    settings = results.get("settings", {})
    attrs = settings.get("attrs", {}) if isinstance(settings, dict) else {}
    parts = [str(attrs[key]) for key in ("dataset", "protocol") if key in attrs]
    if "n_bits" in settings:
        parts.append(f"{settings['n_bits']} bits")
    return what + ("\n" + ", ".join(parts) if parts else "")


def figure_kind(path: str) -> str:
    """The kind of figure file ``path`` is written as (:data:`ucmfh.files.MARKS`): SVG by its suffix, else PNG."""
    return "figure-svg" if path.lower().endswith(".svg") else "figure"


def save_figure(fig, path: str) -> str:
    """Write ``fig`` to ``path`` atomically, as SVG or PNG by its suffix, with ucmfh's mark
    (:data:`ucmfh.files.MARKS`: the PNG's Software chunk, the SVG's creator; no date, so it is reproducible)."""
    with atomic_file(path) as tmp:
        if figure_kind(path) == "figure-svg":
            fig.savefig(tmp, format="svg", metadata={"Creator": "ucmfh", "Date": None})
        else:
            fig.savefig(tmp, dpi=120, format="png", metadata={"Software": "ucmfh"})
    return path


def _save(fig, plt, path: str) -> str:
    fig.tight_layout()
    _fit_titles(fig)
    save_figure(fig, path)
    plt.close(fig)
    return path


def _fit_titles(fig) -> None:
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
