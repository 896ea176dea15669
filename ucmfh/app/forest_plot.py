"""A forest plot of ``ucmfh compare``'s paired differences (``ucmfh compare BASE OTHER --plot PATH``).

One row per cell and figure, as the table prints them: OTHER − BASE as a point, its 95% interval as a
horizontal bar, coloured and marked by verdict (ahead / level / behind), and a vertical line at zero.
The figures have different scales (a MAP in [0, 1], an R@1 in %, an rSum a sum of six recalls in %), so
the rows are drawn in one panel per kind of figure, stacked in the one file PATH names, each panel with
its own axis: one file keeps ``--plot PATH`` a single output.

What is drawn is computed apart from the drawing (:func:`forest_panels`: plain data), so it can be
checked against ``compare --json`` row by row.
"""
from __future__ import annotations

import textwrap
from typing import Any, Dict, List, Sequence, Tuple

from ucmfh.app.outputs import check_figures

# the kind of a figure (the first word of its name) -> the axis label of its panel (MAP's with its k, where the
# rows share one); every figure compare pairs is tie-aware
KINDS = {"MAP": "MAP{k} difference (tie-aware)", "R@1": "R@1 difference (% points, tie-aware)",
         "rSum": "rSum difference (% points, tie-aware)"}
STYLES = {"ahead": ("tab:green", "^"), "level": ("tab:gray", "o"), "behind": ("tab:red", "v")}


def check_plot_path(path: str, overwrite: bool = False, flag: str = "--plot") -> None:
    """Refuse, before any work, a figure that could not be written or would replace a file ucmfh did not
    write as a figure (without ``overwrite``), naming ``flag``."""
    check_figures(flag, [path], overwrite)
    if not path.lower().endswith((".png", ".svg")):  # any other name held PNG bytes (a .pdf of PNG data)
        raise ValueError(f"{flag} {path}: a figure is written as PNG or SVG: end its name in .png or .svg")


def forest_panels(rows: Sequence[Tuple[Sequence[str], Dict[str, Any]]]) -> Dict[str, Any]:
    """A forest plot as plain data, from ``(cell, compare result)`` pairs in the table's order
    (:func:`ucmfh.app.compare.compare_cell` results, each with its cell as the table's columns say it:
    dataset, bits, protocol, ...). ``shared``: the cell's words every row has (said once, in the title: a
    dataset's long name on every row left no room for the rest); ``panels``, each: ``kind`` (``MAP``,
    ``R@1``, ``rSum``), ``xlabel`` and ``rows`` (each: ``label``, the cell's other words and the figure,
    ``figure``, ``mean``, ``low``, ``high``, ``verdict``), in the order of :data:`KINDS` and, within a panel,
    the table's. A result's ``k`` (its cell's MAP@k), where given, names MAP's axis when the panel's rows share
    it."""
    shared = [part for part in rows[0][0] if all(part in cell for cell, _ in rows[1:])] if rows else []
    panels: Dict[str, Dict[str, Any]] = {}
    ks: Dict[str, set] = {}
    for cell, result in rows:
        kind = result["figure"].split()[0]
        panel = panels.setdefault(kind, {"kind": kind, "rows": []})
        ks.setdefault(kind, set()).add(result.get("k"))
        d = result["difference"]
        label = "  ".join([*(part for part in cell if part not in shared), result["figure"]])
        panel["rows"].append({"label": label, "figure": result["figure"],
                              "mean": d["mean"], "low": d["low"], "high": d["high"], "verdict": result["verdict"]})
    for kind, panel in panels.items():
        k = next(iter(ks[kind])) if len(ks[kind]) == 1 else None
        panel["xlabel"] = KINDS.get(kind, f"{kind} difference").format(k="" if k is None else f"@{k}")
    order = list(KINDS)
    return {"shared": shared, "panels": sorted(panels.values(), key=lambda p: (
        order.index(p["kind"]) if p["kind"] in order else len(order), p["kind"]))}


# a row's label longer than this is drawn on two lines or more, not pushed past the figure's edge
LABEL_WIDTH = 48


def wrapped(label: str) -> List[str]:
    """A row's label in lines of :data:`LABEL_WIDTH` at the most, broken between its parts (two spaces apart:
    'MAP I->T' kept whole), a part longer than a line broken where it must be."""
    lines: List[str] = []
    for part in label.split("  "):
        if lines and len(lines[-1]) + 2 + len(part) <= LABEL_WIDTH:
            lines[-1] += "  " + part
        else:
            lines.extend(textwrap.wrap(part, LABEL_WIDTH, break_on_hyphens=False) or [part])
    return lines


def draw_forest(forest: Dict[str, Any], path: str, title: str) -> str:
    """Draw :func:`forest_panels` to ``path`` (PNG, or SVG where it ends in ``.svg``), atomically, with
    ucmfh's mark, the words every row shares after ``title``; return it. matplotlib is imported here
    (``ImportError`` naming ``ucmfh[plot]``)."""
    from ucmfh.metrics.plots import drawing, fit_titles, save_figure, subplots

    panels = forest["panels"]
    if forest["shared"]:
        title += " (" + ", ".join(forest["shared"]) + ")"
    # in inches: a row as tall as its panel's longest label, and room for the axis below it
    heights = [len(p["rows"]) * max(0.32, 0.16 * max(len(wrapped(row["label"])) for row in p["rows"])) + 0.5
               for p in panels]
    with drawing():
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator

        fig, axes = subplots(len(panels), 1, figsize=(8, 0.9 + sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
        for ax, panel in zip(axes[:, 0], panels):
            rows = panel["rows"]
            ys = list(range(len(rows)))[::-1]  # the table's first row at the top
            for y, row in zip(ys, rows):
                colour, marker = STYLES.get(row["verdict"], ("black", "s"))
                ax.hlines(y, row["low"], row["high"], color=colour, linewidth=2)
                ax.plot([row["mean"]], [y], marker=marker, color=colour, markersize=7, linestyle="none")
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_yticks(ys)
            ax.set_yticklabels(["\n".join(wrapped(row["label"])) for row in rows], fontsize=8)
            ax.set_ylim(-0.75, len(rows) - 0.25)
            ax.set_xlabel(panel["xlabel"], fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6))  # wide signed labels: fewer ticks, none touching
            ax.grid(axis="x", alpha=0.3)
        handles = [Line2D([], [], color=c, marker=m, linestyle="-", label=v) for v, (c, m) in STYLES.items()]
        axes[0, 0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                          title="verdict", title_fontsize=7)  # beside the rows, never over one
        axes[0, 0].set_title(textwrap.fill(title, 80), fontsize=10)  # on two lines rather than cut at the edge
        fig.tight_layout()
        fit_titles(fig)
        save_figure(fig, path, tight=True)  # the labels and the legend beside the rows whole, however long
    return path
