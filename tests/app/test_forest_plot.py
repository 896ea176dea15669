"""``ucmfh compare --plot PATH``: a forest plot of the paired differences, checked by its data, not its pixels."""
import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import ucmfh.app.forest_plot as forest_plot
from ucmfh.app.cli import main


def _results(tmp_path):
    """Hand-made rows with per-query files, as test_compare's pairing test makes them: a labelled set at 16 and
    32 bits (MAP) and a caption set (R@1, rSum and MAP), cca-itq and two-tower, seeds 1 and 2; two-tower
    ahead at 16 bits, behind at 32, level on the captions."""
    rng = np.random.default_rng(0)
    n, rows = 120, []
    for dataset, database, n_bits, shift in (("hand", None, 16, 0.05), ("hand", None, 32, -0.05),
                                             ("caps", "test", 16, 0.0)):
        for seed in (1, 2):
            base = {"ap_i2t": rng.uniform(0, 1, n), "ap_t2i": rng.uniform(0, 1, n)}
            if database:
                base.update(hits_i2t=rng.integers(0, 2, (n, 3)), hits_t2i=rng.integers(0, 2, (n, 3)))
            other = {k: (v + shift + rng.normal(0, 0.01, n) if k.startswith("ap") else rng.permutation(v))
                     for k, v in base.items()}
            for method, scores in (("cca-itq", base), ("two-tower", other)):
                path = tmp_path / f"{method}-{dataset}-{n_bits}-{seed}.npz"
                np.savez(path, **{f"unimodal/{database or '-'}/{k}": v.astype(np.float32) for k, v in scores.items()})
                rows.append({"task": "hashing", "method": method, "run": path.stem, "dataset": dataset,
                             "dataset_fingerprint": dataset * 16, "n_bits": n_bits, "protocol": "unimodal",
                             "database": database, "k": 50, "seed": seed, "per_query": str(path)})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return results


def test_the_plotted_rows_are_compare_json_differences_and_intervals(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    results = _results(tmp_path)
    drawn = []
    draw = forest_plot.draw_forest
    monkeypatch.setattr(forest_plot, "draw_forest", lambda panels, *a: (drawn.append(panels), draw(panels, *a))[1])
    plot = tmp_path / "forest.png"
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json",
                                      "--resamples", "300", "--plot", str(plot)])
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.stdout.splitlines()]  # stdout: JSON only; 'wrote' is on stderr
    [forest] = drawn
    panels = forest["panels"]
    assert forest["shared"] == ["unimodal"]  # said once, in the title: every row's
    assert [p["kind"] for p in panels] == ["MAP", "R@1", "rSum"]  # one panel per scale
    assert [p["xlabel"] for p in panels] == ["MAP@50 difference (tie-aware)", "R@1 difference (% points, tie-aware)",
                                             "rSum difference (% points, tie-aware)"]
    for panel in panels:
        mine = [x for x in lines if x["figure"].split()[0] == panel["kind"]]  # the table's order within a panel
        assert len(panel["rows"]) == len(mine) > 0
        for row, x in zip(panel["rows"], mine):
            assert row["figure"] == x["figure"] and row["verdict"] == x["verdict"]
            assert (row["mean"], row["low"], row["high"]) == tuple(x["difference"][k] for k in ("mean", "low", "high"))
            where = f"{x['dataset']}  {x['n_bits']} bits" + (f"  {x['database']}" if x["database"] else "")
            assert row["label"] == f"{where}  {x['figure']}"
    verdicts = {(x["n_bits"], x["dataset"], x["figure"]): x["verdict"] for x in lines}
    assert verdicts[(16, "hand", "MAP I->T")] == "ahead" and verdicts[(32, "hand", "MAP T->I")] == "behind"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"Software\x00ucmfh" in plot.read_bytes()[:4096]
    assert shown.stderr.strip() == f"wrote {plot}"
    # written again over its own figure; an SVG where the path says so, with its mark
    again = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results),
                                      "--resamples", "100", "--plot", str(plot)])
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines()[-1] == f"wrote {plot}"  # on stdout, as every command's figure (an audit's)
    svg = tmp_path / "forest.svg"
    done = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", "hand",
                                     "--resamples", "100", "--plot", str(svg)])
    assert done.exit_code == 0, done.output
    assert b"<dc:title>ucmfh</dc:title>" in svg.read_bytes()[:4096]
    drawn_once = svg.read_bytes()
    assert CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", "hand",
                                     "--resamples", "100", "--plot", str(svg)]).exit_code == 0
    assert svg.read_bytes() == drawn_once  # the same figure, the same bytes (no ids drawn at random)
    assert sorted(p.name for p in tmp_path.glob("forest*")) == ["forest.png", "forest.svg"]  # no temporary left


def test_what_every_row_shares_is_said_once_and_a_long_label_is_wrapped_not_cut(tmp_path, monkeypatch):
    """A dataset's long name on every row (its dataset, bits, protocol, database and figure) pushed the labels past
    the figure's left edge and the legend past its right: the 16- and 32-bit rows could not be told apart. The
    words every row shares go to the title; a long label is wrapped; the file holds the labels and legend whole."""
    pytest.importorskip("matplotlib")
    long_name = "a_very_long_dataset_name_for_checking_label_layout_0123456789_0123456789_end"
    text = _results(tmp_path).read_text().replace('"hand"', json.dumps(long_name))
    results = tmp_path / "long.jsonl"
    results.write_text(text)
    drawn = []
    draw = forest_plot.draw_forest
    monkeypatch.setattr(forest_plot, "draw_forest", lambda forest, *a: (drawn.append((forest, a)), draw(forest, *a))[1])
    plot = tmp_path / "forest.png"
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", long_name,
                                      "--resamples", "100", "--plot", str(plot)])
    assert shown.exit_code == 0, shown.output
    [(forest, (_, title))] = drawn
    assert forest["shared"] == [long_name, "unimodal"]
    assert [row["label"] for row in forest["panels"][0]["rows"]] == [
        "16 bits  MAP I->T", "16 bits  MAP T->I", "32 bits  MAP I->T", "32 bits  MAP T->I"]
    from PIL import Image

    import ucmfh.metrics.plots as plots

    captured = []
    save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, *a, **kw: captured.append(fig) or save(fig, *a, **kw))
    assert CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", long_name,
                                     "--resamples", "100", "--plot", str(plot)]).exit_code == 0
    [fig] = captured
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # in inches: what is drawn, labels, title and legend
    width, height = Image.open(plot).size
    assert width >= box.width * 120 and height >= box.height * 120  # the file holds all of it (and a margin)
    for text in fig.findobj(lambda a: hasattr(a, "get_text") and a.get_text()):
        assert max(map(len, text.get_text().splitlines())) <= 100, text.get_text()


def test_a_file_of_the_users_at_path_is_kept_without_overwrite(tmp_path):
    pytest.importorskip("matplotlib")
    results = _results(tmp_path)
    plot = tmp_path / "mine.png"
    plot.write_bytes(b"a picture of the user's")
    args = ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", "hand", "--resamples", "100",
            "--plot", str(plot)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and refused.stdout == ""  # refused before the work: no table either
    assert refused.output.startswith("Error: --plot ") and "pass --overwrite to replace it" in refused.output
    assert plot.read_bytes() == b"a picture of the user's"
    replaced = CliRunner().invoke(main, args + ["--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert b"Software\x00ucmfh" in plot.read_bytes()[:4096]
    folder = CliRunner().invoke(main, args[:-1] + [str(tmp_path)])
    assert folder.exit_code == 2 and "is a directory" in folder.output
    pdf = CliRunner().invoke(main, args[:-1] + [str(tmp_path / "forest.pdf")])  # it held PNG bytes
    assert pdf.exit_code == 2 and pdf.output == (f"Error: --plot {tmp_path / 'forest.pdf'}: a figure is written as PNG "
                                                 "or SVG: end its name in .png or .svg\n")
    assert not (tmp_path / "forest.pdf").exists()


def test_a_missing_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    results = _results(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    result = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results),
                                       "--plot", str(tmp_path / "forest.png")])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()  # said before the work: no table printed
    assert "ucmfh[plot]" in line and "Traceback" not in result.output
    assert not list(tmp_path.glob("forest*"))
