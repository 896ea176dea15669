"""``ucmfh runs --plot``: the figures of a score against code length hold the summary's values."""
from __future__ import annotations

import shutil
import sys

import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.app.length_plot import (check_figure_paths, draw_length_figures, legend_order, legend_title,
                                   length_figures)
from ucmfh.app.runs import headline, summarize, variant_of
from ucmfh.files import MARKS, append_jsonl, check_replaceable, read_jsonl


def _row(method: str, n_bits: int, seed: int, i2t: float, **kw) -> dict:
    return {"dataset": "wiki", "dataset_fingerprint": "f", "task": "hashing", "method": method, "loss": None,
            "n_bits": n_bits, "protocol": "unimodal", "k": 50, "seed": seed, "run": f"{method}{n_bits}-{seed}",
            "settings": {"fusion": None, "hash": {"seed": seed, "n_bits": n_bits, "method": method}},
            "map_i2t": i2t, "map_t2i": i2t + 0.1, "map_i2t_expected": i2t - 0.01, "map_t2i_expected": i2t + 0.09,
            "random_map_i2t": 0.1 + n_bits / 1000 + seed / 100, "random_map_t2i": 0.2, **kw}


def _caption(n_bits: int, seed: int, database: str, r1: float) -> dict:
    return {**_row("two-tower", n_bits, seed, 0.3), "dataset": "coco/5k", "dataset_fingerprint": "g",
            "database": database, "recall_i2t": {"1": r1}, "recall_t2i": {"1": r1 / 2}}


def _recalls(n_bits: int, seed: int, database: str) -> dict:
    """A caption row with every R@K, both ways (tie-aware twins a point lower), rSum and their random twins."""
    i2t = {"1": 5.0 + seed + n_bits / 16, "5": 15.0 + seed, "10": 25.0 + seed}
    t2i = {k: v / 2 for k, v in i2t.items()}
    return {**_row("two-tower", n_bits, seed, 0.3), "dataset": "f8k", "dataset_fingerprint": "h", "database": database,
            "recall_i2t": i2t, "recall_t2i": t2i, "recall_i2t_expected": {k: v - 1 for k, v in i2t.items()},
            "recall_t2i_expected": {k: v - 1 for k, v in t2i.items()}, "rsum": sum(i2t.values()) + sum(t2i.values()),
            "rsum_expected": sum(i2t.values()) + sum(t2i.values()) - 6, "random_rsum": 1.0 + seed,
            "random_recall_i2t": {"1": 0.1 * seed, "5": 0.5, "10": 1.0}, "random_recall_t2i": {"1": 0.2, "5": 0.6,
                                                                                            "10": 1.2 * seed}}


ROWS = [_row(m, b, s, 0.2 + b / 500 + s / 50 + (m == "cca-itq") / 20)
        for m in ("two-tower", "cca-itq") for b in (16, 32, 64) for s in (1, 2, 3)]
ROWS += [_row("two-tower", 128, 1, 0.5)]  # one seed: std 0
ROWS += [{**_row("ucmfh", 0, 1, 0.0), "task": "fusion", "n_bits": None, "run": "f"}]  # no code length: not drawn
ROWS += [_caption(b, s, db, 10.0 * s + b / 8) for b in (16, 32) for s in (1, 2) for db in ("test", "collection")]


def test_every_point_is_the_summary_s_mean_and_std():
    groups = summarize(ROWS)
    figures = length_figures(groups)
    names = [f["name"] for f in figures]
    assert names == ["coco-5k_r1_i2t_collection", "coco-5k_r1_t2i_collection", "coco-5k_r1_i2t_test",
                     "coco-5k_r1_t2i_test", "wiki_map_i2t", "wiki_map_t2i"]
    checked = 0
    for figure in figures:
        field = figure["field"]
        entries = [g for g in groups if g["dataset"] == figure["dataset"] and g["n_bits"] is not None
                   and g["database"] == figure["database"]]
        assert sorted(line["label"] for line in figure["lines"]) == sorted({variant_of(g) for g in entries})
        for line in figure["lines"]:
            mine = sorted((g for g in entries if variant_of(g) == line["label"]), key=lambda g: g["n_bits"])
            assert line["n_bits"] == [g["n_bits"] for g in mine]
            shown = [headline(g, field) for g in mine]
            assert line["fields"] == shown
            assert line["mean"] == [g[f"{s}_mean"] for g, s in zip(mine, shown)]
            assert line["std"] == [g[f"{s}_std"] for g, s in zip(mine, shown)]
            assert line["n_seeds"] == [g["n_seeds"] for g in mine]
            checked += len(mine)
        if figure["database"] is None:  # the tie-aware figure leads; random codes are the reference
            assert all(f == field + "_expected" for line in figure["lines"] for f in line["fields"])
            by_bits = {}
            for g in entries:
                by_bits.setdefault(g["n_bits"], []).append(g[f"random_{field}_mean"])
            assert figure["reference"] == {"n_bits": sorted(by_bits),
                                           "mean": [sum(v) / len(v) for _, v in sorted(by_bits.items())]}
            assert figure["ylabel"] == ("MAP@50 I→T" if field == "map_i2t" else "MAP@50 T→I")
        else:
            assert figure["reference"] is None and figure["ylabel"].startswith("R@1")
    assert checked == 2 * 7 + 4 * 2
    two_tower = next(line for line in figures[-2]["lines"] if line["label"] == "two-tower")
    assert two_tower["n_bits"] == [16, 32, 64, 128] and two_tower["std"][-1] == 0.0
    assert two_tower["std"][0] == pytest.approx(0.02)  # sample std of 3 seeds 0.02 apart


def test_a_caption_set_has_a_figure_for_each_recall_and_rsum_with_the_summary_s_values():
    rows = [_recalls(b, s, "test") for b in (16, 64) for s in (1, 2)]
    groups = summarize(rows)
    figures = {f["field"]: f for f in length_figures(groups)}
    assert sorted(figures) == sorted(["r1_i2t", "r1_t2i", "r5_i2t", "r5_t2i", "r10_i2t", "r10_t2i", "rsum"])
    for field, figure in figures.items():
        line, = figure["lines"]
        assert line["fields"] == [field + "_expected"] * 2  # the tie-aware figure leads
        k, direction = (field[1:].split("_") if field != "rsum" else (None, None))
        expected = [sum((r["rsum_expected"] if field == "rsum" else r[f"recall_{direction}_expected"][k])
                        for r in rows if r["n_bits"] == b) / 2 for b in (16, 64)]
        assert line["mean"] == pytest.approx(expected)
        # random codes' line on every figure (it was on rSum's alone: the rows kept no random R@K)
        floor = {"rsum": 2.5, "r1_i2t": 0.15, "r5_i2t": 0.5, "r10_i2t": 1.0, "r1_t2i": 0.2, "r5_t2i": 0.6,
                 "r10_t2i": 1.8}[field]
        assert figure["reference"] == {"n_bits": [16, 64], "mean": [pytest.approx(floor)] * 2}
    assert figures["r5_t2i"]["ylabel"] == "R@5 T→I (%)" and figures["rsum"]["name"] == "f8k_rsum_test"
    # the title names what every point shares: the protocol, tie-aware, the database
    assert figures["rsum"]["title"].splitlines()[1] == "f8k, unimodal, tie-aware, database test"
    plain = {(f["field"], f["name"]): f for f in length_figures(summarize(
        [{**r, "protocol": p, "rsum_expected": None} for r in rows for p in ("unimodal", "fused")]))}
    # a figure per protocol, each named so
    assert plain["rsum", "f8k_rsum_test_fused"]["title"].splitlines()[1] == "f8k, fused, database test"
    assert plain["rsum", "f8k_rsum_test_unimodal"]["title"].splitlines()[1] == "f8k, unimodal, database test"


def test_the_legend_lists_the_lines_as_they_end_on_the_right():
    def line(label, n_bits, mean):
        return {"label": label, "n_bits": n_bits, "mean": mean}
    lines = [line("a", [16, 64], [0.9, 0.5]), line("b", [16, 64], [0.1, 0.7]), line("c", [16, 32], [0.9, 0.95]),
             line("d", [16, 64], [0.2, 0.7])]
    # highest first at the longest length drawn (ties by label); a line that stops short after those that go on
    assert [x["label"] for x in legend_order(lines)] == ["b", "d", "a", "c"]


def test_the_legend_says_what_the_error_bars_are_or_that_there_are_none():
    def figure(*seeds):
        return {"lines": [{"n_seeds": list(s)} for s in seeds]}
    assert legend_title(figure([1, 1], [1])) == "one seed per point (no error bars)"
    assert legend_title(figure([3, 3], [3])) == "error bars: std over seeds"
    assert legend_title(figure([3, 1], [3])) == "error bars: std over seeds (none where one seed)"


def test_figures_are_written_as_png_and_svg_with_ucmfh_s_mark(tmp_path):
    pytest.importorskip("matplotlib")
    figures = length_figures(summarize(ROWS[:6]))
    prefix = str(tmp_path / "out" / "fig")
    paths = draw_length_figures(figures, prefix)
    assert paths == [prefix + s for s in ("_wiki_map_i2t.png", "_wiki_map_i2t.svg", "_wiki_map_t2i.png",
                                          "_wiki_map_t2i.svg")]
    for path in paths:
        head = open(path, "rb").read(4096)
        kind = "figure" if path.endswith(".png") else "figure-svg"
        assert MARKS[kind] in head
        check_replaceable(path, kind)
    assert open(paths[0], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    assert Image.open(paths[0]).mode == "P"  # a palette: a third of matplotlib's RGBA size (docs/ commits them)
    check_figure_paths(prefix, figures)  # ucmfh's own figures are written again
    (tmp_path / "out" / "fig_wiki_map_t2i.svg").write_text("<svg>mine</svg>")
    with pytest.raises(FileExistsError, match="^--plot .*fig_wiki_map_t2i.svg: exists without the mark of a figure"):
        check_figure_paths(prefix, figures)
    check_figure_paths(prefix, figures, overwrite=True)


def test_runs_plot_draws_the_selected_runs(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "r.jsonl"
    append_jsonl(results, ROWS)
    prefix = tmp_path / "fig"
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "wiki", "--method", "cca-itq",
                                       "--plot", str(prefix)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"wrote {prefix}_wiki_map_{d}.{e}" for d in ("i2t", "t2i")
                                          for e in ("png", "svg")]
    assert sorted(p.name for p in tmp_path.glob("fig_*")) == sorted(
        f"fig_wiki_map_{d}.{e}" for d in ("i2t", "t2i") for e in ("png", "svg"))
    (tmp_path / "fig_wiki_map_i2t.png").write_bytes(b"a picture of the user's")
    refused = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "wiki", "--plot", str(prefix)])
    assert refused.exit_code == 2 and "pass --overwrite to replace it" in refused.output
    assert (tmp_path / "fig_wiki_map_i2t.png").read_bytes() == b"a picture of the user's"
    nothing = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "nus", "--plot", str(prefix)])
    assert nothing.exit_code == 2 and "nothing drawn" in nothing.output
    both = CliRunner().invoke(main, ["runs", "--results", str(results), "--json", "--plot", str(prefix)])
    assert both.exit_code == 2 and "--plot does not go with --json" in both.output
    path = CliRunner().invoke(main, ["runs", "--results", str(results), "--json", "--checkpoint"])  # --json was ignored
    assert path.exit_code == 2 and "--json does not go with --checkpoint" in path.output
    # a prefix ending in a separator is a folder: figs/wiki_map_i2t.png, where it wrote figs/_wiki_map_i2t.png
    (tmp_path / "figs").mkdir()
    folder = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "wiki", "--method", "cca-itq",
                                       "--plot", f"{tmp_path / 'figs'}/"])
    assert folder.exit_code == 0, folder.output
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == sorted(
        f"wiki_map_{d}.{e}" for d in ("i2t", "t2i") for e in ("png", "svg"))
    # and so is a folder named without one (its figures were written beside it: figs_wiki_map_i2t.png)
    shutil.rmtree(tmp_path / "figs")
    (tmp_path / "figs").mkdir()
    folder = CliRunner().invoke(main, ["runs", "--results", str(results), "-d", "wiki", "--method", "cca-itq",
                                       "--plot", str(tmp_path / "figs")])
    assert folder.exit_code == 0, folder.output
    assert len(list((tmp_path / "figs").iterdir())) == 4 and not list(tmp_path.glob("figs_*"))


def test_a_name_in_another_script_names_its_files_and_its_missing_glyphs_are_said_once(tmp_path):
    """A dataset named in Chinese had files named 'x_map_i2t.png' (two such datasets 'x' and 'x-2', numbered as
    the filters found them), and each character the font lacks was a warning at each drawing of it (140 lines)."""
    pytest.importorskip("matplotlib")
    results = tmp_path / "r.jsonl"
    append_jsonl(results, [{**row, "dataset": "花卉数据集"} for row in ROWS if row["method"] == "cca-itq"])
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "--plot", f"{tmp_path}/"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"wrote {tmp_path}/花卉数据集_map_{d}.{e}" for d in ("i2t", "t2i")
                                          for e in ("png", "svg")]
    said = result.stderr.splitlines()
    assert said == [f"warning: {tmp_path}/花卉数据集_map_{d}.png: 5 characters of its text have no glyph in "
                    "matplotlib's font, drawn as a box: 卉 据 数 花 集" for d in ("i2t", "t2i")]  # once a figure


def test_a_missing_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    results = tmp_path / "r.jsonl"
    append_jsonl(results, ROWS)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "--plot", str(tmp_path / "fig")])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert "ucmfh[plot]" in line and "Traceback" not in result.output
    assert not list(tmp_path.glob("fig*"))


def test_grid_plot_draws_the_figures_runs_draws_of_its_rows(tmp_path, tiny_path, monkeypatch):
    """grid --plot: the figures of the grid's own rows, the same points as runs --plot of its results file;
    a file of the user's where a figure of the grid may go is refused before any cell trains, and one no figure
    is named as (evaluate's PREFIX_pr.png) is left alone, where it was refused too."""
    pytest.importorskip("matplotlib")
    import ucmfh.app.length_plot as length_plot

    drawn = []
    draw = length_plot.draw_length_figures
    monkeypatch.setattr(length_plot, "draw_length_figures", lambda figures, prefix: drawn.append(figures)
                        or draw(figures, prefix))
    results = tmp_path / "r.jsonl"
    argv = ["grid", "-d", tiny_path, "--methods", "two-tower,cca-itq", "-b", "8", "-b", "16", "--epochs", "1",
            "--set", "hash.hidden=16", "--device", "cpu", "--quiet", "--out", str(tmp_path / "runs"),
            "--results", str(results), "--table", str(tmp_path / "table"), "--plot", str(tmp_path / "g")]
    for name in ("g_pr.png", "g_mine.svg", "g_mine_map_i2t.png"):
        (tmp_path / name).write_bytes(b"a picture of the user's")
    refused = CliRunner().invoke(main, argv)
    assert refused.exit_code == 2 and refused.output.splitlines()[-1].startswith(
        f"Error: --plot {tmp_path / 'g_mine_map_i2t.png'}: exists without the mark of a figure ucmfh wrote") and \
        not results.exists()
    (tmp_path / "g_mine_map_i2t.png").unlink()
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "g_pr.png").read_bytes() == (tmp_path / "g_mine.svg").read_bytes() == b"a picture of the user's"
    (tmp_path / "g_pr.png").unlink()
    [figures] = drawn
    assert figures == length_figures(summarize(read_jsonl(results)))
    assert {line["label"] for figure in figures for line in figure["lines"]} == {"two-tower", "cca-itq"}
    assert sorted(p.name for p in tmp_path.glob("g_*.png")) == sorted(
        f"g_{figure['name']}.png" for figure in figures)
    # every point drawn is the figure the grid's table prints in that method's row and length's column
    table = (tmp_path / "table.md").read_text().split("\n\n")
    lead = next(part for part in table if part.startswith("| method | 8 bits | 16 bits |"))
    cells = {row.split(" | ")[0].strip("|` "): row.split(" | ")[1:3] for row in lead.splitlines()[2:]}
    checked = 0
    for figure in figures:
        side = 0 if figure["field"] == "map_i2t" else 1
        for line in figure["lines"]:
            for n_bits, mean in zip(line["n_bits"], line["mean"]):
                printed = cells[line["label"]][[8, 16].index(n_bits)].split(" / ")[side]
                assert printed == f"{mean:.3f}", (figure["name"], line["label"], n_bits)
                checked += 1
    assert checked == 2 * 2 * 2  # two directions, two methods, two lengths


def test_a_figure_holds_one_protocol_and_shows_its_whole_legend(tmp_path):
    """A figure of a unimodal and a fused method named neither protocol (each method had one, the title names
    one only where all share it): each protocol has figures of its own now, named so. Its legend was cut at the
    page's edge where labels run long."""
    rows = [_row("two-tower", b, 1, 0.3) for b in (16, 32)]
    rows += [{**_row("ucmfh", b, 1, 0.6), "protocol": "fused"} for b in (16, 32)]
    figures = length_figures(summarize(rows))  # a figure per protocol: fused is not read against cross-modal
    assert [f["name"] for f in figures] == ["wiki_map_i2t_fused", "wiki_map_i2t_unimodal", "wiki_map_t2i_fused",
                                            "wiki_map_t2i_unimodal"]
    assert [[line["label"] for line in f["lines"]] for f in figures] == [["ucmfh"], ["two-tower"], ["ucmfh"],
                                                                       ["two-tower"]]
    assert "fused" in figures[0]["title"] and "unimodal" in figures[1]["title"]
    figure = figures[1]
    figure["lines"].append({**figure["lines"][0], "label": "another"})
    pytest.importorskip("matplotlib")
    from PIL import Image

    widths = []
    for label in ("a", "a method of another package with a long name " * 2):
        figure["lines"][0]["label"] = label
        path = draw_length_figures([figure], str(tmp_path / label[:1]))[0]
        widths.append(Image.open(path).size[0])
    assert widths[1] > widths[0] + 200  # the page grows with the legend: nothing is cut off


def test_files_of_one_name_and_scores_at_another_k_get_figures_of_their_own():
    """Two files named alike were one line (16 bits of one, 32 of the other); MAP@50 and MAP@100 shared an axis
    labelled MAP@k, their random codes averaged; a rerank's index-order points sat unmarked beside tie-aware
    ones."""
    rows = [_row("cca-itq", 16, 1, 0.3), {**_row("cca-itq", 32, 1, 0.4), "dataset_fingerprint": "other" * 8},
            _row("two-tower", 16, 1, 0.3), {**_row("two-tower", 16, 1, 0.2, k=100), "run": "k100"}]
    figures = length_figures(summarize(rows))
    i2t = {f["name"]: f for f in figures if f["field"] == "map_i2t"}
    assert sorted(i2t) == ["wiki-f_map_i2t_k100", "wiki-f_map_i2t_k50", "wiki-otheroth_map_i2t"]
    assert i2t["wiki-otheroth_map_i2t"]["title"].endswith("wiki [otheroth], unimodal, tie-aware")
    assert [line["n_bits"] for line in i2t["wiki-otheroth_map_i2t"]["lines"]] == [[32]]
    assert i2t["wiki-f_map_i2t_k100"]["ylabel"] == "MAP@100 I→T"
    assert i2t["wiki-f_map_i2t_k100"]["reference"]["mean"] == [rows[3]["random_map_i2t"]]
    index_order = {**_row("two-tower", 16, 2, 0.3), "run": "x", "map_i2t_expected": None}
    index_order.pop("map_i2t_expected")
    labels = {line["label"] for f in length_figures(summarize([_row("cca-itq", 16, 1, 0.3), index_order]))
              if f["field"] == "map_i2t" for line in f["lines"]}
    assert labels == {"cca-itq", "two-tower (ties by index)"}


def test_a_plot_prefix_given_with_a_figure_s_extension_is_taken_without_it():
    """'--plot figs/length.png' wrote figs/length.png_wiki_map_i2t.png."""
    from ucmfh.metrics.plots import figure_prefix

    assert [figure_prefix(p) for p in ("figs/length.png", "figs/length.SVG", "figs/length", "figs/.png", "a.b")] == \
        ["figs/length", "figs/length", "figs/length", "figs/.png", "a.b"]


def test_every_line_of_a_crowded_figure_is_drawn_apart_and_the_crowd_is_said(tmp_path):
    """A lab's sweep: 25 settings of one method drew 25 lines in ten colours, a method and another of one colour
    in one figure, and a legend that read as either; every line now has a style of its own (colour, marker, dash),
    and 'runs --plot' says a figure of more than READABLE_LINES lines is hard to read and how to draw fewer."""
    pytest.importorskip("matplotlib")
    from ucmfh.app.length_plot import READABLE_LINES, crowded, line_styles

    styles = line_styles(90)
    assert len({tuple(sorted(style.items())) for style in styles[:80]}) == 80 and styles[80] == styles[0]
    rows = [{**_row("two-tower", b, 1, 0.3 + lr / 100), "run": f"r{lr}-{b}",
             "settings": {"fusion": None, "hash": {"seed": 1, "n_bits": b, "method": "two-tower", "lr_head": lr}}}
            for lr in range(25) for b in (16, 32)]
    results = tmp_path / "r.jsonl"
    append_jsonl(results, rows)
    figures = length_figures(summarize(read_jsonl(results)))
    assert {len(f["lines"]) for f in figures} == {25} and crowded(figures[:1]).startswith(
        f"1 figure(s) of more than {READABLE_LINES} lines (up to 25): hard to read")
    assert crowded([{**figures[0], "lines": figures[0]["lines"][:READABLE_LINES]}]) is None
    result = CliRunner().invoke(main, ["runs", "--results", str(results), "--plot", str(tmp_path / "fig")])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("2 figure(s) of more than 12 lines (up to 25): hard to read; -d, --method, -b or --method "
                             "METHOD@KEY draw fewer\n")
    from matplotlib import pyplot as plt  # the lines drawn: 25 styles, none twice

    drawn = []
    real = plt.Axes.errorbar
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(plt.Axes, "errorbar", lambda self, *a, **kw: drawn.append(
            (kw["color"], kw["marker"], kw["linestyle"])) or real(self, *a, **kw))
        draw_length_figures(figures[:1], str(tmp_path / "one"))
    assert len(drawn) == 25 and len(set(drawn)) == 25


def test_a_point_some_of_whose_seeds_collapsed_is_marked_as_the_tables_mark_it(tmp_path):
    """grid.md and 'ucmfh runs' mark with † a group some of whose seeds' codes collapsed (a near-random order's
    scores in its mean); its point on a figure was drawn like any other."""
    pytest.importorskip("matplotlib")
    from ucmfh.app.runs import COLLAPSE_MARK

    fell = {"img": [1, 2173], "txt": [900, 2173], "n_bits": 32}  # one modality's codes: one code for every item
    fell = {**fell, "n_bits": 64}
    rows = [{**row, "distinct_codes": fell} if (row["method"], row["n_bits"], row["seed"]) == ("two-tower", 64, 2)
            else row for row in ROWS[:9] if row["seed"] == 2]  # the highest point, one seed: its mark was on the frame
    figures = length_figures(summarize(rows))
    [line] = [line for line in figures[0]["lines"] if line["label"] == "two-tower"]
    assert line["n_bits"] == [16, 32, 64] and line["collapsed"] == [0, 0, 1]
    drawn = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.annotate
    marks = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.axes.Axes, "annotate", lambda ax, text, xy, **kw: drawn.append((text, xy)) or
                      marks.append((ax, real(ax, text, xy, **kw))) or marks[-1][1])
        draw_length_figures(figures, str(tmp_path / "fig"))
    assert drawn == [(COLLAPSE_MARK, (64, next(line["mean"][2] for line in figure["lines"]
                                               if line["label"] == "two-tower"))) for figure in figures]
    for ax, mark in marks:  # inside the axes, not on the frame (the point at the top of a figure's range)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        renderer = FigureCanvasAgg(ax.figure).get_renderer()  # closed: a canvas of its own to measure on
        inside, box = ax.get_window_extent(renderer), mark.get_window_extent(renderer)
        assert inside.y0 <= box.y0 and box.y1 <= inside.y1 and inside.x0 <= box.x0 and box.x1 <= inside.x1


def test_matplotlib_s_glyph_warnings_are_left_to_the_one_line_a_figure_in_either_wording():
    """matplotlib before 3.9 says 'missing from current font', later 'missing from font': the filter knew the
    later alone, and the older printed a warning at each drawing of each character (an audit's, on 3.6)."""
    import warnings

    pytest.importorskip("matplotlib")
    from ucmfh.metrics.plots import drawing

    with drawing(), warnings.catch_warnings(record=True) as said:
        for wording in ("missing from font", "missing from current font"):
            warnings.warn(f"Glyph 33457 (\\N{{CJK UNIFIED IDEOGRAPH-82B1}}) {wording}.", UserWarning)
    assert said == []
