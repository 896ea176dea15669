"""Figures of a score against code length from :func:`ucmfh.app.runs.summarize` (``ucmfh runs --plot``).

One figure per dataset file, score, protocol and k (its name ends with the protocol where a dataset has two:
fused figures are not read against cross-modal ones; two files of one name told apart by fingerprint; MAP@50
and MAP@100 on figures of their own): MAP@k I→T and T→I of a labelled set; R@1, R@5 and R@10 I→T and T→I and
rSum of a caption set, per database; the headline figure of :mod:`ucmfh.app.runs` (the tie-aware one where the rows have it).
One line per method (its loss when not the method's default), the sample standard deviation over seeds
as error bars, CCA-ITQ (the linear baseline) as a black dash-dot line and random codes as a dashed one
where the rows scored them; the legend beside the axes lists the lines as they end on the right, and a
method keeps its style (colour, marker, dash) in every figure of one call. What is drawn is
computed apart from the drawing (:func:`length_figures`: plain data), so it can be checked against the
summary value by value.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ucmfh.app.runs import COLLAPSE_MARK, dataset_labels, headline, variant_of
from ucmfh.app.outputs import check_figures, check_outputs
from ucmfh.metrics.plots import SUFFIXES, figure_start

# a figure's score: (field, label); a labelled set's MAP, a caption set's R@1, R@5, R@10 in % and rSum
MAP_FIELDS = (("map_i2t", "MAP@{k} I→T"), ("map_t2i", "MAP@{k} T→I"))
RECALL_FIELDS = (*((f"r{k}_{d}", f"R@{k} {arrow} (%)") for k in (1, 5, 10) for d, arrow in (("i2t", "I→T"), ("t2i", "T→I"))),
                 ("rsum", "rSum (R@1+5+10, both directions)"))
# what tells two lines of one figure apart beyond the method, shown only where it varies
_QUALIFIERS = (("trained_on", "trained on {}"), ("task", "{}"), ("protocol", "{}"), ("stage", "{}"),
               ("k", "k={}"), ("settings_key", "settings {}"))
# the linear baseline, drawn as a reference line beside the methods
REFERENCE_METHODS = ("cca-itq",)
REFERENCE_STYLE = {"color": "black", "linestyle": "-.", "markerfacecolor": "white"}


def safe_name(text: str) -> str:
    """``text`` as a file-name part: letters and digits of any script, ``.``, ``_`` and ``-`` only (a name in
    another script was 'x', two such datasets 'x' and 'x-2', numbered as the filters found them)."""
    return re.sub(r"[^\w.-]+", "-", text).strip("-.") or "x"


def _line_key(entry: Dict[str, Any]) -> Tuple[Any, ...]:
    method = variant_of(entry) if entry.get("method") else entry.get("task")
    return (method, *(entry.get(name) for name, _ in _QUALIFIERS))


def length_figures(groups: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The figures of :func:`summarize` output ``groups``, as plain data; entries without a code length
    (fusion, SEPS) are left out. Each figure: ``name`` (for its files), ``dataset``, ``trained_on``,
    ``database``, ``field`` (``map_i2t``, ``r1_t2i`` ...), ``title``, ``ylabel``, ``n_bits`` (every code
    length drawn, ascending), ``lines`` (each: ``label``, ``n_bits``, ``mean``, ``std``, ``n_seeds`` and
    ``fields``, the summary's field of each point, its tie-aware twin where it has one) and ``reference``
    (random codes: ``n_bits`` and ``mean``, the mean over the figure's entries of each length; None when
    no entry has them)."""
    figures: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for entry in groups:
        if entry.get("n_bits") is None:
            continue
        fields = RECALL_FIELDS if entry.get("database") else MAP_FIELDS
        for field, label in fields:
            shown = headline(entry, field)
            if f"{shown}_mean" not in entry:
                continue
            # one figure per dataset file (two files of one name apart), protocol (fused figures are not to be
            # read against cross-modal ones) and k (MAP@50 and MAP@100 on one axis, their random codes averaged)
            key = (str(entry["dataset"]), str(entry.get("dataset_fingerprint") or ""), entry.get("trained_on") or "",
                   entry.get("database") or "", field, str(entry.get("protocol") or ""), _k(entry))
            figure = figures.setdefault(key, {"entries": [], "label": label})
            figure["entries"].append((entry, shown))
    several: Dict[tuple, set] = {}  # a figure's name says what its dataset has several of: protocols, k
    for dataset, fingerprint, trained, _, _, protocol, k in figures:
        several.setdefault((dataset, fingerprint, trained, "protocol"), set()).add(protocol)
        several.setdefault((dataset, fingerprint, trained, "k"), set()).add(k)
    labels = dataset_labels(groups)  # as every view names a file: 'syn [058e9011]' where two share a name
    out, names = [], set()
    for (dataset, fingerprint, trained, database, field, protocol, k), figure in sorted(figures.items()):
        first = figure["entries"][0][0]
        shown = labels[first["dataset"], first.get("dataset_fingerprint")]
        out.append(_figure(shown, trained or None, database or None, field, figure["label"], figure["entries"]))
        if len(several[dataset, fingerprint, trained, "protocol"]) > 1:
            out[-1]["name"] += f"_{safe_name(protocol)}"
        if len(several[dataset, fingerprint, trained, "k"]) > 1:
            out[-1]["name"] += f"_k{k}"
        name = out[-1]["name"]
        while out[-1]["name"] in names:  # two datasets whose names differ only in unsafe characters
            out[-1]["name"] = f"{name}-{len(names)}"
        names.add(out[-1]["name"])
    return out


def _k(entry: Dict[str, Any]) -> int:
    """The k of an entry's MAP@k (0 where it has none: R@K and rSum are the same at any k)."""
    return entry.get("k") if isinstance(entry.get("k"), int) and not entry.get("database") else 0


def _figure(dataset: str, trained: Optional[str], database: Optional[str], field: str, label: str,
            entries: List[Tuple[Dict[str, Any], str]]) -> Dict[str, Any]:
    keys = [_line_key(e) for e, _ in entries]
    # a qualifier is shown where one method's lines differ in it (methods differ in their settings anyway);
    # the protocol on every line wherever the figure holds more than one (every figure names its protocol)
    varying = [i for i, (name, _) in enumerate(_QUALIFIERS) if name != "trained_on" and (any(
        len({k[1 + i] for k in keys if k[0] == method}) > 1 for method in {k[0] for k in keys}) or (
        name == "protocol" and len({k[1 + i] for k in keys}) > 1))]
    mixed_ties = len({s.endswith("_expected") for _, s in entries}) > 1
    lines: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for entry, shown in sorted(entries, key=lambda x: (str(_line_key(x[0])), x[0]["n_bits"])):
        key = _line_key(entry)
        parts = [_QUALIFIERS[i][1].format(key[1 + i]) for i in varying if key[1 + i] is not None]
        if mixed_ties and not shown.endswith("_expected"):  # beside tie-aware lines (a rerank's stages)
            parts.append("(ties by index)")
        copy = 0  # same names, another dataset file: a line of its own
        while True:
            name = " ".join([str(key[0]), *parts]) + (f" ({copy + 1})" if copy else "")
            line = lines.setdefault((*key, copy), {"label": name, "n_bits": [], "mean": [], "std": [],
                                                   "n_seeds": [], "fields": [], "collapsed": []})
            if entry["n_bits"] not in line["n_bits"]:
                break
            copy += 1
        line["n_bits"].append(entry["n_bits"])
        line["mean"].append(entry[f"{shown}_mean"])
        line["std"].append(entry[f"{shown}_std"])
        line["n_seeds"].append(entry["n_seeds"])
        line["fields"].append(shown)
        line["collapsed"].append(entry.get("collapsed_seeds") or 0)  # marked COLLAPSE_MARK, as the tables mark it
    random: Dict[int, List[float]] = {}
    for entry, _ in entries:
        if f"random_{field}_mean" in entry:
            random.setdefault(entry["n_bits"], []).append(entry[f"random_{field}_mean"])
    reference = None if not random else {
        "n_bits": sorted(random), "mean": [sum(random[b]) / len(random[b]) for b in sorted(random)]}
    ks = {e.get("k") for e, _ in entries}
    ylabel = label.format(k=ks.pop() if len(ks) == 1 and None not in ks else "k")
    # what every line shares is said once, in the title: the protocol, and tie-aware figures (the mean over
    # every order of tied items) where each point is one
    protocols = {e.get("protocol") for e, _ in entries}
    shared = [*(protocols if len(protocols) == 1 and None not in protocols else ()),
              *(["tie-aware"] if all(s.endswith("_expected") for _, s in entries) else [])]
    where = ", ".join([dataset + (f" (trained on {trained})" if trained else ""), *shared,
                       *([f"database {database}"] if database else [])])
    name = "_".join(safe_name(p) for p in (dataset, *([f"from-{trained}"] if trained else []), field,
                                            *([database] if database else [])))
    return {"name": name, "dataset": dataset, "trained_on": trained, "database": database, "field": field,
            "title": f"{ylabel} by code length\n{where}", "ylabel": ylabel,
            "n_bits": sorted({b for line in lines.values() for b in line["n_bits"]}),
            "lines": list(lines.values()), "reference": reference}


def legend_order(lines: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``lines`` in the order they are drawn and listed: highest first at the longest code length each
    reaches, so the legend reads top to bottom as the lines end on the right."""
    return sorted(lines, key=lambda line: (-max(line["n_bits"]), -line["mean"][line["n_bits"].index(max(line["n_bits"]))],
                                           line["label"]))


def legend_title(figure: Dict[str, Any]) -> str:
    """What the error bars are, or that every point is one seed's (no bars to read)."""
    seeds = {n for line in figure["lines"] for n in line["n_seeds"]}
    if seeds == {1}:
        return "one seed per point (no error bars)"
    return "error bars: std over seeds" + ("" if 1 not in seeds else " (none where one seed)")


def collapsed_somewhere(figure: Dict[str, Any]) -> bool:
    """Whether a point of ``figure`` is of seeds whose codes collapsed (marked :data:`COLLAPSE_MARK`)."""
    return any(any(line.get("collapsed", ())) for line in figure["lines"])


def figure_paths(prefix: str, figure: Dict[str, Any]) -> List[str]:
    """The files one figure is written to: ``PREFIX_<name>.png`` and ``.svg`` (``FOLDER/<name>.*``)."""
    return [f"{figure_start(prefix)}{figure['name']}{suffix}" for suffix in SUFFIXES]


def check_figure_paths(prefix: str, figures: Sequence[Dict[str, Any]], overwrite: bool = False,
                       flag: str = "--plot") -> None:
    """Refuse, before drawing, a figure that could not be written or would replace a file that is not a
    figure ucmfh wrote (without ``overwrite``), naming ``flag`` as :func:`ucmfh.app.outputs.check_outputs`
    does."""
    check_figures(flag, [path for figure in figures for path in figure_paths(prefix, figure)], overwrite)


def check_prefix(prefix: str, overwrite: bool = False, flag: str = "--plot") -> None:
    """Refuse, before the work whose figures will be drawn, a ``prefix`` whose folder cannot be written or
    that a file of the user's already starts (``PREFIX_*.png``, ``.svg``: the figures' names are known only
    at the end), naming ``flag``."""
    if not prefix:
        raise ValueError(f"{flag}: an empty prefix; give the figures' path prefix (PREFIX_*.png)")
    check_outputs(folders={flag: os.path.dirname(os.path.abspath(figure_start(prefix) + "x"))})
    start = figure_start(prefix)
    taken = [path for suffix in SUFFIXES for path in glob.glob(glob.escape(start) + "*" + suffix)
             if _FIGURE_NAME.fullmatch(os.path.splitext(path[len(start):])[0])]  # not evaluate's PREFIX_pr.png
    check_figures(flag, sorted(taken), overwrite)


# the names of :func:`length_figures`: a score's field after the dataset (and the run it was trained on), then its
# database, protocol or k where they vary, and a number where two datasets' names are one
_FIGURE_NAME = re.compile(r".+_(" + "|".join(field for field, _ in (*MAP_FIELDS, *RECALL_FIELDS)) + r")(_.+)?(-\d+)?")


# the lines' styles: ten colours, then each again with another marker, then with another dash (80 apart)
MARKERS = ("o", "s", "^", "D")
LINESTYLES = ("-", "--")
# a figure with more lines than this is hard to read: said (:func:`crowded`), drawn all the same
READABLE_LINES = 12


def line_styles(n: int) -> List[Dict[str, str]]:
    """``n`` styles of lines, each other than the others up to 80 (colour, marker and dash), where ten colours
    repeated (a method and another of one colour in one figure)."""
    return [{"color": f"C{i % 10}", "marker": MARKERS[i // 10 % len(MARKERS)],
             "linestyle": LINESTYLES[i // (10 * len(MARKERS)) % len(LINESTYLES)]} for i in range(n)]


def crowded(figures: Sequence[Dict[str, Any]]) -> Optional[str]:
    """A line for figures of more than :data:`READABLE_LINES` lines (a lab's sweep in one results file), or None."""
    many = [figure for figure in figures if len(figure["lines"]) > READABLE_LINES]
    if not many:
        return None
    most = max(len(figure["lines"]) for figure in many)
    return (f"{len(many)} figure(s) of more than {READABLE_LINES} lines (up to {most}): hard to read; -d, --method, -b "
            f"or --method METHOD@KEY draw fewer")


def draw_length_figures(figures: Sequence[Dict[str, Any]], prefix: str) -> List[str]:
    """Draw each of :func:`length_figures` to ``PREFIX_<name>.png`` and ``.svg``, atomically, with
    ucmfh's mark; return the paths. matplotlib is imported here (``ImportError`` naming ``ucmfh[plot]``)."""
    from ucmfh.metrics.plots import drawing, save_figure, subplots

    paths = []
    # one style per line label across the figures of one call: a method keeps its style in each
    labels = sorted({line["label"] for figure in figures for line in figure["lines"]})
    styles = dict(zip(labels, line_styles(len(labels))))
    with drawing():
        for figure in figures:
            fig, ax = subplots(figsize=(7.5, 4))
            fig.subplots_adjust(left=0.1, right=0.7, bottom=0.13, top=0.86)  # the legend beside the axes
            for line in legend_order(figure["lines"]):
                style = {"marker": "o", **REFERENCE_STYLE} if line["label"].split(" ")[0] in REFERENCE_METHODS \
                    else styles[line["label"]]
                ax.errorbar(line["n_bits"], line["mean"], yerr=line["std"], capsize=3, label=line["label"], **style)
                for x, y, collapsed in zip(line["n_bits"], line["mean"], line.get("collapsed", ())):
                    if collapsed:  # some seeds' codes collapsed: a near-random order's scores in the mean
                        ax.annotate(COLLAPSE_MARK, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=11)
            if figure["reference"]:
                ref = figure["reference"]
                ax.plot(ref["n_bits"], ref["mean"], linestyle="--", marker="_", markersize=14, color="grey",
                        label="random codes")  # a mark: one code length is a single point, which a line does not draw
            if collapsed_somewhere(figure):  # room above the highest point for its mark, which sat on the frame
                ax.margins(y=0.12)
            ax.set_xscale("log", base=2)
            ax.set_xticks(figure["n_bits"])
            ax.set_xticklabels([str(b) for b in figure["n_bits"]])
            ax.minorticks_off()
            ax.set_xlabel("code length (bits)")
            ax.set_ylabel(figure["ylabel"])
            ax.set_title(figure["title"], fontsize=10)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()  # the random codes' plain line comes first: put it last
            order = sorted(range(len(labels)), key=lambda i: labels[i] == "random codes")
            title = legend_title(figure) + (f"\n{COLLAPSE_MARK}: codes collapsed in some seeds"
                                            if collapsed_somewhere(figure) else "")
            ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8,
                      title=title, title_fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      borderaxespad=0.0)
            for path in figure_paths(prefix, figure):
                paths.append(save_figure(fig, path, tight=True))  # the legend beside the axes, however long its labels
    return paths
