"""Plots of evaluation results: precision–recall by Hamming radius and precision@K.

matplotlib is an optional extra (``pip install ucmfh[plot]``), imported only here
and only when a plot is drawn.
"""
from __future__ import annotations

import os
from typing import Dict, List


def _pyplot():
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
    plt = _pyplot()
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
    """Precision@K curves, both directions, from :func:`evaluate_codes` results."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, label in _NAMES.items():
        pk = results.get(name, {}).get("precision_at_k")
        if pk:
            ax.plot(pk["k"], pk["precision"], marker=".", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("K (retrieved items)")
    ax.set_ylabel("precision@K")
    ax.set_title(_title(results, "precision@K"))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, plt, path)


def plot_curves(results: Dict[str, object], prefix: str) -> List[str]:
    """Write ``{prefix}_pr.png`` (if Hamming results) and ``{prefix}_pk.png``; return the paths."""
    paths = []
    if any("pr_curve" in results.get(name, {}) for name in _NAMES):
        paths.append(plot_pr_curve(results, f"{prefix}_pr.png"))
    paths.append(plot_precision_at_k(results, f"{prefix}_pk.png"))
    return paths


def _title(results: Dict[str, object], what: str) -> str:
    settings = results.get("settings", {})
    attrs = settings.get("attrs", {}) if isinstance(settings, dict) else {}
    parts = [str(attrs[key]) for key in ("dataset", "protocol") if key in attrs]
    if "n_bits" in settings:
        parts.append(f"{settings['n_bits']} bits")
    return what + (f" ({', '.join(parts)})" if parts else "")


def _save(fig, plt, path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
