"""Packed codes, the codes file, and its evaluation."""
from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import torch

from ucmfh.codes import load_codes, pack_codes, save_codes, unpack_codes
from ucmfh.data.h5 import DataError
from ucmfh.metrics import evaluate_codes, evaluate_codes_file, map_at_k, top_k


def pm1(g, *shape):
    return torch.where(torch.rand(*shape, generator=g) > 0.5, 1.0, -1.0)


@pytest.mark.parametrize("n_bits", [1, 8, 13, 64])
def test_pack_unpack_round_trip(n_bits):
    codes = pm1(torch.Generator().manual_seed(n_bits), 11, n_bits)
    packed = pack_codes(codes)
    assert packed.dtype == np.uint8 and packed.shape == (11, (n_bits + 7) // 8)
    assert torch.equal(unpack_codes(packed, n_bits), codes)
    assert torch.equal(unpack_codes(torch.from_numpy(packed), n_bits), codes)


def test_pack_bit_order_and_sign_zero():
    packed = pack_codes(torch.tensor([[1.0, -1, -1, -1, -1, -1, -1, 0.0, 1]]))
    assert packed.tolist() == [[0b10000001, 0b10000000]]  # sign(0) = +1


def test_packed_distances_equal_sign_differences():
    """Packed bytes XOR-ed and counted by numpy, and the metrics' packed path, give the number of
    differing signs of the ±1 codes (21 bits: 3 padding bits in the last byte)."""
    g = torch.Generator().manual_seed(0)
    a, b = pm1(g, 7, 21), pm1(g, 9, 21)
    pa, pb = pack_codes(a), pack_codes(b)
    expected = np.array([[int((x != y).sum()) for y in b] for x in a])
    by_numpy = np.unpackbits(pa[:, None, :] ^ pb[None, :, :], axis=-1).sum(axis=-1)
    assert np.array_equal(by_numpy, expected)
    dist, idx = top_k(torch.from_numpy(pa), torch.from_numpy(pb), 9)
    assert np.array_equal(np.sort(idx.numpy(), axis=1), np.tile(np.arange(9), (7, 1)))
    assert np.array_equal(np.take_along_axis(expected, idx.numpy(), axis=1), dist.numpy())


def labelled(multi_hot: torch.Tensor) -> torch.Tensor:
    """Multi-hot labels with at least one label a row (a row of none is refused, as in a dataset file): a row
    without one gets its first class."""
    multi_hot = multi_hot.to(torch.uint8)
    multi_hot[multi_hot.sum(dim=1) == 0, 0] = 1
    return multi_hot


def make_file_inputs(seed=0, n_query=12, n_retrieval=40, n_bits=12, n_classes=4, ids=True):
    g = torch.Generator().manual_seed(seed)
    data = dict(
        query_img=pm1(g, n_query, n_bits), query_txt=pm1(g, n_query, n_bits),
        retrieval_img=pm1(g, n_retrieval, n_bits), retrieval_txt=pm1(g, n_retrieval, n_bits),
        query_labels=labelled(torch.rand(n_query, n_classes, generator=g) < 0.4),
        retrieval_labels=labelled(torch.rand(n_retrieval, n_classes, generator=g) < 0.4),
    )
    if ids:
        data["query_ids"] = torch.arange(n_query)
        data["retrieval_ids"] = torch.arange(n_retrieval) % (n_query + 2)
    return data


def test_codes_file_round_trip(tmp_path):
    data = make_file_inputs()
    path = tmp_path / "codes.h5"
    save_codes(path, **data, attrs={"protocol": "unimodal", "dataset": "toy", "classes": ["a", "b"], "epoch": 3})
    assert [p.name for p in tmp_path.iterdir()] == ["codes.h5"]  # no temporary left behind
    codes = load_codes(path)
    assert codes.n_bits == 12
    assert codes.attrs == {"protocol": "unimodal", "dataset": "toy", "classes": ["a", "b"], "epoch": 3}
    for group in ("query", "retrieval"):
        for modality in ("img", "txt"):
            assert torch.equal(codes.codes(group, modality), data[f"{group}_{modality}"])
        assert torch.equal(codes.labels[group], data[f"{group}_labels"])
        assert torch.equal(codes.ids[group], data[f"{group}_ids"])


def test_evaluate_codes_file_matches_direct_metrics(tmp_path):
    data = make_file_inputs(1)
    path = tmp_path / "codes.h5"
    save_codes(path, **data, attrs={"protocol": "fused"})
    result = evaluate_codes_file(path, k=5)
    json.dumps(result)  # JSON-able
    assert result["settings"]["attrs"] == {"protocol": "fused"}
    assert result["i2t"]["map@5"] == map_at_k(data["query_img"], data["retrieval_txt"], data["query_labels"],
                                              data["retrieval_labels"], k=5)
    assert result["t2i"]["map@all"] == map_at_k(data["query_txt"], data["retrieval_img"], data["query_labels"],
                                                data["retrieval_labels"], k=None)
    assert result["i2t"]["map@5_expected"] == map_at_k(data["query_img"], data["retrieval_txt"], data["query_labels"],
                                                       data["retrieval_labels"], k=5, ties="expected")
    direct = evaluate_codes(**data, k=5)
    for name in ("i2t", "t2i"):  # every ranked metric beside its tie-aware twin; radius metrics have no ties
        assert set(result[name]) == {"map@5", "map@all", "precision_at_k", "pr_curve", "precision_within_radius_2",
                                     "recall_at_ranks", "map@5_expected", "map@all_expected", "recall_at_ranks_expected"}
        assert set(result[name]["precision_at_k"]) == {"k", "precision", "recall", "precision_expected",
                                                       "recall_expected"}
        assert result[name] == direct[name]
        assert len(result[name]["pr_curve"]["radius"]) == 13


def test_evaluate_without_ids_and_cosine():
    data = make_file_inputs(2, ids=False)
    result = evaluate_codes(**data, k=5)
    assert "recall_at_ranks" not in result["i2t"]
    real = {k: (v + 0.1 * torch.randn(v.shape) if "labels" not in k else v) for k, v in data.items()}
    cos = evaluate_codes(**real, k=5, ranking="cosine")
    assert "pr_curve" not in cos["t2i"]
    assert cos["settings"]["ranking"] == "cosine" and cos["settings"]["order"] == "cosine similarity descending"
    assert result["settings"]["ranking"] == "hamming" and result["settings"]["order"] == "Hamming distance ascending"
    assert "similarity" not in cos["settings"]


def test_a_codes_file_s_progress_bar_steps_each_pass_over_the_queries_to_its_total(tmp_path, monkeypatch):
    """'evaluate --codes' said nothing for the 12 s it ranked 5,000 queries against 100,000 items, 14 times: its bar
    steps once a pass (a ranking of every query, or the radius curve), ends at its total, and the scores are those
    without it; for labelled codes with ids or none, cosine rankings and a caption set's databases."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main
    from ucmfh.metrics import report
    from ucmfh.metrics.report import evaluate_caption_codes

    bars = []

    class Bar:
        def __init__(self, total=None, disable=False, **kwargs):
            self.total, self.steps, self.said = total, 0, []
            if not disable:
                bars.append(self)

        def set_description(self, text):
            self.said.append((text, self.steps))

        def update(self, n=1):
            self.steps += n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(report, "tqdm", Bar)
    data = make_file_inputs(3)
    captions = {**make_file_inputs(4), "query_labels": None, "retrieval_labels": None}
    captions["retrieval_ids"] = captions["retrieval_ids"] + 100
    caption_query = (captions["query_img"], captions["query_txt"], captions["query_ids"])
    caption_retrieval = (captions["retrieval_img"], captions["retrieval_txt"], captions["retrieval_ids"])
    cosine = {name: value + 0.1 if name.endswith(("img", "txt")) else value for name, value in data.items()}
    unlabelled_ids = {**data, "query_ids": None, "retrieval_ids": None}
    cases = [  # (scoring, its passes a direction: MAP@k, MAP@all, P@K, each with its tie-aware twin, then ...)
        (lambda **kw: evaluate_codes(**data, k=5, **kw), 2 * 3 + 1 + 2),  # the radius curve, R@K and its twin
        (lambda **kw: evaluate_codes(**unlabelled_ids, k=5, **kw), 2 * 3 + 1),
        (lambda **kw: evaluate_codes(**cosine, k=5, ranking="cosine", **kw), 2 * 3 + 2),  # no radius curve
        (lambda **kw: evaluate_codes(**data, k=5, map_all=False, expected=False, **kw), 2 + 1 + 1),
        (lambda **kw: evaluate_caption_codes(*caption_query, k=5, **kw), 2 * 3 + 1 + 2),
        (lambda **kw: evaluate_caption_codes(*caption_query, caption_retrieval, database="collection", k=5, **kw),
         2 * 3 + 1 + 2),
    ]
    for score, passes in cases:
        bars.clear()
        shown = score(progress=True)
        assert [(bar.total, bar.steps) for bar in bars] == [(2 * passes, 2 * passes)]
        assert bars[0].said == [("scoring I->T", 0), ("scoring T->I", passes)]
        assert shown == score() and not bars[1:]  # the same scores; no bar unless asked
    labelled = save_codes(tmp_path / "codes.h5", **data, attrs={"protocol": "unimodal"})
    caption_set = save_codes(tmp_path / "captions.h5", **captions, attrs={"protocol": "unimodal"})
    whole = 2 * (2 * 3 + 1 + 2)
    for quiet, shown in (([], [(whole, whole)] * 2), (["--quiet"], [])):
        bars.clear()
        ran = CliRunner().invoke(main, ["evaluate", "--codes", str(labelled), "--codes", str(caption_set),
                                        "--results", "", *quiet])
        assert ran.exit_code == 0 and [(bar.total, bar.steps) for bar in bars] == shown, ran.output


def test_recall_at_ranks_left_out_when_no_query_id_occurs(tmp_path):
    """A labelled set whose ids only number the items: Recall@ranks by id would be 0.0 by
    construction, so it is not reported; a note says why."""
    data = make_file_inputs(6)
    data["retrieval_ids"] = torch.arange(40) + 1000  # no query id (0 .. 11) occurs here
    path = tmp_path / "codes.h5"
    save_codes(path, **data, attrs={"protocol": "unimodal"})
    for result in (evaluate_codes(**data, k=5), evaluate_codes_file(path, k=5)):
        for name in ("i2t", "t2i"):
            assert "recall_at_ranks" not in result[name]
            assert result[name]["recall_at_ranks_note"] == "not computed: no query id occurs in the retrieval set"
    one_match = {**data, "retrieval_ids": torch.cat([torch.tensor([3]), data["retrieval_ids"][1:]])}
    assert set(evaluate_codes(**one_match, k=5)["i2t"]["recall_at_ranks"]) == {"1", "5", "10"}


def saved_figures(monkeypatch):
    """Record every figure the plots save, with its axes' title extents and its own box in pixels,
    measured right after saving (after the layout, before the figure is closed)."""
    from matplotlib.figure import Figure

    figures = []
    savefig = Figure.savefig

    def record(fig, *args, **kwargs):
        savefig(fig, *args, **kwargs)
        renderer = fig.canvas.get_renderer()
        titles = [(ax.get_title(), ax.title.get_window_extent(renderer)) for ax in fig.axes]
        figures.append((fig, titles, fig.bbox.frozen()))

    monkeypatch.setattr(Figure, "savefig", record)
    return figures


def test_plot_titles_fit_in_the_figure(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from ucmfh.metrics.plots import plot_curves

    figures = saved_figures(monkeypatch)
    result = evaluate_codes(**make_file_inputs(3), k=5)
    datasets = ["mirflickr25k", "nuswide_clip_vitl14_336px_top21_with_a_long_descriptive_name"]
    for dataset in datasets:
        result["settings"].update(n_bits=128, attrs={"dataset": dataset, "protocol": "unimodal"})
        plot_curves(result, str(tmp_path / "curves"))
    assert len(figures) == 8  # each figure as PNG and SVG
    for (_, [(title, box)], inside), dataset in zip(figures, [d for d in datasets for _ in "prpr"]):
        assert title.startswith(("precision–recall", "precision@K"))
        assert dataset in title and "unimodal" in title and "128 bits" in title
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, (
            title, box, inside)


def test_precision_at_k_plot_stops_at_the_retrieval_set_size(tmp_path, monkeypatch):
    """With N = 40 items, P@K for K = 50 … 1000 is P@40 repeated: only K <= N is drawn."""
    pytest.importorskip("matplotlib")
    from ucmfh.metrics.plots import plot_precision_at_k

    figures = saved_figures(monkeypatch)
    result = evaluate_codes(**make_file_inputs(3), k=5)
    n = result["settings"]["n_retrieval"]
    assert n == 40 and max(result["i2t"]["precision_at_k"]["k"]) > n
    plot_precision_at_k(result, str(tmp_path / "pk.png"))
    [(fig, _, _)] = figures
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    for line, name in zip(lines, ("i2t", "t2i")):
        x, y = list(line.get_xdata()), list(line.get_ydata())
        assert max(x) == n and x == sorted(set(x))
        pk = result[name]["precision_at_k"]
        beyond = next(i for i, k in enumerate(pk["k"]) if k > n)  # its value is P@N
        drawn = pk["precision_expected"]  # the tie-aware curve
        assert y == [p for k, p in zip(pk["k"], drawn) if k <= n] + [drawn[beyond]]
    # K's labels are numbers: with mathtext off (names drawn as they are), the log axis drew '$\mathdefault{10^{1}}$'
    labels = [label.get_text() for label in fig.axes[0].get_xticklabels() if label.get_text()]
    assert labels and all(float(label.replace(",", "")) > 0 for label in labels), labels


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from ucmfh.metrics.plots import plot_curves

    result = evaluate_codes(**make_file_inputs(3), k=5)
    paths = plot_curves(result, str(tmp_path / "curves"))
    assert [p.rsplit("_", 1)[1] for p in paths] == ["pr.png", "pr.svg", "pk.png", "pk.svg"]  # as runs --plot's
    from matplotlib.image import imread

    for p in paths:
        if p.endswith(".svg"):
            assert b"<dc:title>ucmfh</dc:title>" in open(p, "rb").read(4096)
            continue
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        pixels = imread(p)[..., :3]
        ink = (pixels.min(axis=2) < 0.9).mean()  # not white: axes, labels and the curves
        coloured = (pixels.max(axis=2) - pixels.min(axis=2) > 0.2).mean()  # the curves (the axes are grey)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 200 and 0.01 < ink < 0.5 and coloured > 0.001, (p, ink, coloured)


def test_a_figure_drawn_from_a_notebook_leaves_its_matplotlib_as_it_was(tmp_path):
    """ucmfh's figures drawn where the caller uses matplotlib (a notebook): its backend, its open figures, its
    rcParams and its warning filters are as they were. pyplot() switched the backend to Agg (a notebook's
    figures no longer shown), set rcParams for good and added a warning filter at each figure."""
    import warnings

    pytest.importorskip("matplotlib")
    import matplotlib
    import matplotlib.pyplot as plt

    from ucmfh.metrics.plots import plot_curves

    matplotlib.use("svg")  # a backend of the caller's, not Agg
    mine = plt.figure()  # and a figure of theirs, open
    rc, backend, filters = dict(matplotlib.rcParams), matplotlib.get_backend(), list(warnings.filters)
    try:
        result = evaluate_codes(**make_file_inputs(3), k=5)
        result["settings"].update(n_bits=16, attrs={"dataset": "$5 photos", "protocol": "unimodal"})
        paths = plot_curves(result, str(tmp_path / "curves"))
        assert matplotlib.get_backend() == backend and plt.get_fignums() == [mine.number]
        assert dict(matplotlib.rcParams) == rc and warnings.filters == filters
        svg = open(paths[1], encoding="utf-8").read()
        assert "$5 photos" in svg  # drawn as it is, not begun as mathtext, with the settings inside
        plot_curves(result, str(tmp_path / "again"))
        assert (tmp_path / "again_pr.svg").read_text(encoding="utf-8") == svg  # its ids not drawn at random
    finally:
        plt.close(mine)
        matplotlib.use("agg")


def test_a_caption_sets_codes_file_has_ids_and_no_labels(tmp_path):
    """A caption set's codes (relevance by id, no labels) round-trip; without ids, or with labels on one side
    alone, they are refused before a file is written."""
    data = {**make_file_inputs(), "query_labels": None, "retrieval_labels": None}
    with pytest.raises(ValueError, match=r"captions.h5: query_ids: 12 ids also appear in /retrieval/ids \(first: 0\); "
                                         "query and retrieval must be disjoint"):  # the query items found as themselves
        save_codes(tmp_path / "captions.h5", **data)
    data["retrieval_ids"] = data["retrieval_ids"] + 100
    path = save_codes(tmp_path / "captions.h5", **data)
    codes = load_codes(path)
    assert codes.caption_set and codes.labels == {"query": None, "retrieval": None}
    with h5py.File(path, "r") as f:
        assert "labels" not in f["query"] and "labels" not in f["retrieval"]
    for group in ("query", "retrieval"):
        assert torch.equal(codes.ids[group], data[f"{group}_ids"])
    assert not load_codes(save_codes(tmp_path / "labelled.h5", **make_file_inputs())).caption_set
    with pytest.raises(ValueError, match="needs query_ids and retrieval_ids"):
        save_codes(tmp_path / "x.h5", **{**data, "query_ids": None, "retrieval_ids": None})
    with pytest.raises(ValueError, match="give both query_labels and retrieval_labels, or neither"):
        save_codes(tmp_path / "x.h5", **{**make_file_inputs(), "query_labels": None})
    assert not (tmp_path / "x.h5").exists()


def test_the_precision_axis_fits_the_curves():
    """Up to 10 % above the highest point, at the next 0.05, never past 1: a caption set's PR curves of a
    few per cent fill the figure instead of lying along its floor."""
    from ucmfh.metrics.plots import precision_top

    assert [precision_top(v) for v in (0.113, 0.0, 0.8, 0.95, 1.0, 0.05)] == [0.15, 1.0, 0.9, 1.0, 1.0, 0.1]


def test_save_rejects_bad_inputs(tmp_path):
    data = make_file_inputs()
    # without overwrite, a file there is refused first: it was said after the work, as written by another process
    (tmp_path / "there.h5").write_bytes(b"mine")
    with pytest.raises(FileExistsError, match=r"there\.h5: exists; not replaced$"):
        save_codes(tmp_path / "there.h5", **data, overwrite=False)
    (tmp_path / "there.h5").unlink()
    with pytest.raises(ValueError, match="query_txt"):
        save_codes(tmp_path / "x.h5", **{**data, "query_txt": data["query_txt"][:, :5]})
    with pytest.raises(ValueError, match="retrieval"):
        save_codes(tmp_path / "x.h5", **{**data, "retrieval_labels": data["retrieval_labels"][:3]})
    with pytest.raises(ValueError, match="uint8"):
        save_codes(tmp_path / "x.h5", **{**data, "query_img": torch.from_numpy(pack_codes(data["query_img"]))})
    # codes of 0 and 1 were stored as every bit set (an audit's: 200 random codes became one, scored at chance)
    zero_one = {name: (value > 0).float() for name, value in data.items() if name.endswith(("_img", "_txt"))}
    with pytest.raises(ValueError, match=r"x\.h5: query_img: codes of 0 and 1, .* give ±1 codes \(2 \* codes - 1\)$"):
        save_codes(tmp_path / "x.h5", **{**data, **zero_one})
    # files load_codes refuses (0 bits) or the kernels cannot score (over 65,535 bits) are not written
    for width in (0, 65536):
        wide = {name: np.ones((len(value), width), np.float32) for name, value in zero_one.items()}
        with pytest.raises(ValueError, match=rf"query_img: codes of {width} bits; a code has 1 to 65,535 bits$"):
            save_codes(tmp_path / "x.h5", **{**data, **wide})
    # labels load_codes refuses (a row of no label, values other than 0/1) were written, then refused at scoring
    for row, value, said in ((0, 0, r"1 rows have no label \(first: row 0\)"), (1, 2, "values other than 0 and 1")):
        labels = torch.as_tensor(data["query_labels"]).clone()
        labels[row] = value
        with pytest.raises(ValueError, match=rf"x\.h5: query_labels: {said}"):
            save_codes(tmp_path / "x.h5", **{**data, "query_labels": labels})
    # what load_codes refuses, or what would be scored wrong, written without a word (an audit's): ids of 0.5 as
    # 0 (merging items), NaN codes as -1 bits, a protocol of another name, a group of no rows
    halves = torch.arange(len(data["query_ids"])) / 2
    with pytest.raises(ValueError, match=r"x\.h5: query_ids: ids must be integers, got float32$"):
        save_codes(tmp_path / "x.h5", **{**data, "query_ids": halves})
    nan = torch.as_tensor(data["retrieval_txt"]).clone()
    nan[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"x\.h5: retrieval_txt: non-finite values \(first: row 3\), which have no "
                                         r"sign$"):
        save_codes(tmp_path / "x.h5", **{**data, "retrieval_txt": nan})
    with pytest.raises(ValueError, match=r"x\.h5: attrs: 'protocol' is 'both', expected one of unimodal, fused$"):
        save_codes(tmp_path / "x.h5", **data, attrs={"protocol": "both"})
    empty = {name: value[:0] for name, value in data.items() if name.startswith("query_")}
    with pytest.raises(ValueError, match=r"x\.h5: query: no rows$"):
        save_codes(tmp_path / "x.h5", **{**data, **empty})
    assert not list(tmp_path.iterdir())
    saved = save_codes(tmp_path / "ok.h5", **data)
    with pytest.raises(ValueError, match=r"device 'bogus': unknown"):  # torch's listed every device type it knows
        evaluate_codes_file(saved, device="bogus")
    with pytest.raises(TypeError, match=r"unknown option 'bogus'; the options are k, ks, "):  # evaluate_direction's
        evaluate_codes_file(saved, bogus=1)


def _replace(f, name, value):
    del f[name]
    f[name] = value


@pytest.mark.parametrize(
    "corrupt,where,problem",
    [
        (lambda f: f.attrs.__setitem__("format", "other"), "/", "format"),
        (lambda f: f.attrs.__delitem__("n_bits"), "/", "n_bits"),
        (lambda f: f["query"].__delitem__("txt"), "/query/txt", "missing dataset"),
        (lambda f: f.__delitem__("retrieval"), "/retrieval", "missing group"),
        (lambda f: (f["query"].__delitem__("img"), f["query"].create_dataset("img", data=np.zeros((12, 3), np.uint8))),
         "/query/img", "shape"),
        # the images cut short: they are to blame, not the texts
        (lambda f: (f["query"].__delitem__("img"), f["query"].create_dataset("img", data=np.zeros((2, 2), np.uint8))),
         "/query/img", "2 rows, /query/ids has"),
        (lambda f: f.attrs.__setitem__("n_bits", "abc"), "/", "attribute 'n_bits' is 'abc', not a whole number"),
        (lambda f: f.attrs.__setitem__("n_bits", 9.5), "/", "attribute 'n_bits' is 9.5, not a whole number"),  # was 9
        (lambda f: f.attrs.__setitem__("n_bits", 70000), "/", "n_bits must be in 1 .. 65535, got 70000"),
        (lambda f: f["retrieval"]["txt"].__setitem__((0, 1), 0xFF), "/retrieval/txt", "padding"),
        (lambda f: f["query"]["labels"].__setitem__((0, 0), 2), "/query/labels", "values"),
        (lambda f: f["query"].__delitem__("ids"), "/query/ids", "only one group"),
        (lambda f: f["query"].__delitem__("labels"), "/query/labels", "only one group"),
        (lambda f: (f["query"].__delitem__("labels"), f["query"].__delitem__("ids")), "/query/labels",
         "missing dataset (and no ids"),
        # an empty query split was a traceback; rows of no label, a row of MAP 0 said of the method; a protocol
        # of another name, written into every row
        (lambda f: [_replace(f, f"query/{name}", f["query"][name][:0]) for name in list(f["query"])], "/query",
         "no rows"),
        (lambda f: f["query"]["labels"].__setitem__(0, 0), "/query/labels", "1 rows have no label (first: row 0)"),
        (lambda f: f.attrs.__setitem__("protocol", "foo"), "/", "attribute 'protocol' is 'foo', expected one of"),
        # a file of a later ucmfh; ids as a dataset's: >= 0, and a caption set's query ids none of its database's
        (lambda f: f.attrs.__setitem__("version", 99), "/", "attribute 'version' is 99: this ucmfh reads codes files "
                                                            "of version 1 to 1 (one of a later ucmfh: upgrade it)"),
        (lambda f: f["query"]["ids"].__setitem__(1, -1), "/query/ids", "1 negative ids (first: -1 at row 1); ids "
                                                                       "must be >= 0"),
        (lambda f: [f[group].__delitem__("labels") for group in ("query", "retrieval")], "/query/ids",
         "12 ids also appear in /retrieval/ids (first: 0); query and retrieval must be disjoint"),
        # a group where a dataset belongs ended in an AttributeError traceback; a scalar of ids was said as the
        # codes' rows against -1; a version of text, shown as a number (an audit's)
        (lambda f: (f["query"].__delitem__("txt"), f["query"].create_group("txt")), "/query/txt",
         "expected a dataset, found a group"),
        (lambda f: (f["query"].__delitem__("ids"), f["query"].create_group("ids")), "/query/ids",
         "expected a dataset, found a group"),
        (lambda f: _replace(f, "query/ids", 3), "/query/ids", "expected one row an item, got a scalar"),
        (lambda f: f.attrs.__setitem__("version", "1"), "/", "attribute 'version' is '1': this ucmfh reads"),
    ],
)
def test_load_errors_name_file_dataset_problem(tmp_path, corrupt, where, problem):
    path = tmp_path / "codes.h5"
    save_codes(path, **make_file_inputs(), attrs={})
    with h5py.File(path, "a") as f:
        corrupt(f)
    with pytest.raises(DataError) as err:
        load_codes(path)
    message = str(err.value)
    assert str(path) in message and f"{where}:" in message and problem in message


def test_load_not_hdf5(tmp_path):
    path = tmp_path / "codes.h5"
    path.write_text("not hdf5")
    with pytest.raises(DataError, match="not a readable codes file: not HDF5"):
        load_codes(path)
    with pytest.raises(FileNotFoundError):
        load_codes(tmp_path / "missing.h5")


def test_a_codes_file_without_its_format_is_said_to_lack_it_by_validate_too(tmp_path):
    """validate said '/train: missing group' of a codes file written by hand without its format attribute, where
    evaluate --codes names the attribute (an audit's)."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    path = save_codes(tmp_path / "codes.h5", **make_file_inputs())
    with h5py.File(path, "a") as f:
        del f.attrs["format"]
    for argv in (["validate", str(path)], ["evaluate", "--codes", str(path), "--results", ""]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 2 and result.output == (
            f"Error: {path}: /: attribute 'format' is None, expected 'ucmfh-codes'\n"), result.output


def test_a_dataset_file_given_as_codes_is_said_to_be_one(tiny_path):
    """It said "/: attribute 'format' is None, expected 'ucmfh-codes'"."""
    with pytest.raises(DataError, match=r"a dataset file, not a codes file \('ucmfh encode' writes those\); score a "
                                        r"checkpoint on it with 'ucmfh evaluate -c CHECKPOINT -d FILE'$"):
        load_codes(tiny_path)


def test_cli_evaluate_codes(tmp_path):
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    path = tmp_path / "codes.h5"
    save_codes(path, **make_file_inputs(5), attrs={"protocol": "unimodal", "dataset": "toy"})
    results, metrics = tmp_path / "results.jsonl", tmp_path / "metrics.json"
    runner = CliRunner()
    out = runner.invoke(main, ["evaluate", "--codes", str(path), "--k", "5", "--device", "cpu",
                               "--results", str(results), "--metrics-out", str(metrics)])
    assert out.exit_code == 0, out.output
    expected = evaluate_codes_file(path, k=5)
    assert json.loads(metrics.read_text())["t2i"] == json.loads(json.dumps(expected["t2i"]))
    row = json.loads(results.read_text().splitlines()[-1])
    assert row["map_i2t"] == expected["i2t"]["map@5"] and row["protocol"] == "unimodal" and row["n_bits"] == 12
    assert "unimodal" in out.output
    # a folder as --plot PREFIX holds the figures, as runs --plot's does (it wrote figs/_pr.png, then was refused);
    # a PREFIX ending in .png is a prefix (it wrote curves.png_pr.png); each figure as PNG and SVG
    (tmp_path / "figs").mkdir()
    for given in (str(tmp_path / "figs") + "/", str(tmp_path / "figs"), str(tmp_path / "curves.png")):
        drawn = runner.invoke(main, ["evaluate", "--codes", str(path), "--plot", given, "--results", ""])
        assert drawn.exit_code == 0, drawn.output
    figures = [f"{kind}.{suffix}" for kind in ("pr", "pk") for suffix in ("png", "svg")]
    assert sorted(os.listdir(tmp_path / "figs")) == sorted(figures)
    assert sorted(p.name for p in tmp_path.glob("curves*")) == sorted(f"curves_{name}" for name in figures)
    both = runner.invoke(main, ["evaluate", "--codes", str(path), "-c", "x.pt"])
    assert both.exit_code == 2 and "exactly one of --checkpoint and --codes" in both.output
    labelled = runner.invoke(main, ["evaluate", "--codes", str(path), "--database", "collection", "--results", ""])
    assert labelled.exit_code == 2 and "codes of a labelled set, which has one database" in labelled.output
    assert len(labelled.output.strip().splitlines()) == 1
    checkpoint = runner.invoke(main, ["evaluate", "-c", "x.pt", "--database", "test"])
    assert checkpoint.exit_code == 2 and "--database goes with --codes" in checkpoint.output
    broken = tmp_path / "broken.h5"
    broken.write_text("x")
    bad = runner.invoke(main, ["evaluate", "--codes", str(broken), "--results", ""])
    assert bad.exit_code == 2 and "not a readable codes file: not HDF5" in bad.output and "Traceback" not in bad.output
    # a dataset or a protocol given with a codes file was ignored without a word (the file holds its own)
    for flag, value in (("-d", "wiki"), ("--protocol", "fused")):
        ignored = runner.invoke(main, ["evaluate", "--codes", str(path), flag, value, "--results", ""])
        assert ignored.exit_code == 2 and ignored.output.endswith("goes with --checkpoint: a codes file holds the codes "
                                                                  "of its dataset, under its protocol\n")
    # the curves of one figure are of one dataset (its title names one)
    other = tmp_path / "other.h5"
    save_codes(other, **make_file_inputs(5), attrs={"protocol": "unimodal", "dataset": "wiki"})
    mixed = runner.invoke(main, ["evaluate", "--codes", str(path), "--codes", str(other), "--plot", str(tmp_path / "m"),
                                 "--results", ""])
    assert mixed.exit_code == 2 and mixed.output.endswith(f"--codes {other}: codes of dataset 'wiki', but {path}'s are "
                                                          "of 'toy'; the curves of one figure share a dataset\n")
    assert not list(tmp_path.glob("m_*"))
    # ... and of one file of that name (told apart by fingerprint), and one protocol (a fused curve is not to be
    # read against cross-modal ones)
    # (a file without a fingerprint, written before they were kept, by its name alone)
    printed = tmp_path / "printed.h5"
    save_codes(printed, **make_file_inputs(5), attrs={"protocol": "unimodal", "dataset": "toy",
                                                      "dataset_fingerprint": "cd" * 32})
    for attrs, said in (({"protocol": "unimodal", "dataset": "toy", "dataset_fingerprint": "ab" * 32},
                         "codes of dataset 'toy' [abababab], but"),
                        ({"protocol": "fused", "dataset": "toy"}, "codes of protocol 'fused', but")):
        other.unlink()
        save_codes(other, **make_file_inputs(5), attrs=attrs)
        mixed = runner.invoke(main, ["evaluate", "--codes", str(printed), "--codes", str(other), "--plot",
                                     str(tmp_path / "m"), "--results", ""])
        assert mixed.exit_code == 2 and f"--codes {other}: {said}" in mixed.output, mixed.output
    assert not list(tmp_path.glob("m_*"))


def test_several_runs_curves_on_one_figure_are_each_run_s_own(tmp_path, monkeypatch):
    """evaluate --codes A --codes B --plot: one PR and one P@K figure, a line per run and direction, each line the
    curve that run's own evaluation gives; labelled by method and length, by file where those repeat."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    paths = []
    for seed, method in ((1, "two-tower"), (2, "cca-itq"), (3, "cca-itq")):
        paths.append(tmp_path / f"{method}-{seed}.h5")
        save_codes(paths[-1], **make_file_inputs(seed), attrs={"protocol": "unimodal", "dataset": "toy",
                                                               "method": method})
    figures = saved_figures(monkeypatch)
    argv = ["evaluate", "-k", "5", "--device", "cpu", "--results", "", "--plot", str(tmp_path / "cmp")]
    out = CliRunner().invoke(main, argv + [a for p in paths for a in ("--codes", str(p))])
    assert out.exit_code == 0, out.output
    [(pr, pr_titles, _), pr_svg, (pk, pk_titles, _), pk_svg] = figures  # each figure as PNG, then SVG
    assert [[t for t, _ in svg[1]] for svg in (pr_svg, pk_svg)] == [[t for t, _ in png] for png in (pr_titles,
                                                                                                   pk_titles)]
    for title, _ in pr_titles + pk_titles:  # a panel per direction, each naming what the runs share
        assert "toy, unimodal, 12 bits" in title
    assert [t.split("\n")[0] for t, _ in pr_titles] == [f"precision–recall by Hamming radius, {d}" for d in ("I→T", "T→I")]
    labels = ["two-tower 12 bits", "cca-itq-2.h5", "cca-itq-3.h5"]
    for fig, key in ((pr, "pr_curve"), (pk, "precision_at_k")):
        panels = [ax.get_lines() for ax in fig.axes]
        assert [[line.get_label() for line in lines] for lines in panels] == [labels, labels]
        assert [line.get_color() for line in panels[0]] == [line.get_color() for line in panels[1]]  # a run's colour
        for i, path in enumerate(paths):
            own = evaluate_codes_file(path, k=5)
            for line, name in zip((panels[0][i], panels[1][i]), ("i2t", "t2i")):
                curve = own[name][key]
                if key == "pr_curve":
                    want = curve["recall"], curve["precision"]
                else:  # K up to N = 40, then P@N once at K = N (tie-aware)
                    beyond = next(j for j, k in enumerate(curve["k"]) if k > 40)
                    drawn = curve["precision_expected"]
                    want = ([k for k in curve["k"] if k <= 40] + [40],
                            [v for k, v in zip(curve["k"], drawn) if k <= 40] + [drawn[beyond]])
                assert list(line.get_xdata()) == pytest.approx(want[0])
                assert list(line.get_ydata()) == pytest.approx(want[1])
    metrics = CliRunner().invoke(main, argv + ["--codes", str(paths[0]), "--codes", str(paths[1]),
                                               "--metrics-out", str(tmp_path / "m.json")])
    assert metrics.exit_code == 2 and "--metrics-out goes with one --codes" in metrics.output


def test_codes_rows_are_rows_of_their_model(tmp_path, tiny_path, monkeypatch):
    """'evaluate --codes' rows carry the run, seed, checkpoint and settings 'encode' records: two models of one
    seed were summarised as two seeds of one setting (mean ± std of different models), and a file of the same
    name scored from another folder replaced the first's row."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main
    from ucmfh.app.runs import read_results, summarize

    runner = CliRunner()
    common = ["-d", tiny_path, "--method", "two-tower", "-b", "16", "--epochs", "1", "--set", "hash.hidden=0",
              "--device", "cpu", "--quiet", "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "train.jsonl")]
    for lr in ("1e-3", "1e-2"):
        assert runner.invoke(main, ["train-hash", *common, "--set", f"hash.lr_head={lr}"]).exit_code == 0
    results = str(tmp_path / "codes.jsonl")
    trained = {json.loads(line)["checkpoint"]: json.loads(line) for line in open(tmp_path / "train.jsonl")}
    for i, checkpoint in enumerate(trained):
        folder = tmp_path / f"f{i}"
        folder.mkdir()
        monkeypatch.chdir(folder)  # the same file name in two folders
        assert runner.invoke(main, ["encode", "-c", checkpoint, "-o", "c.h5", "-d", tiny_path]).exit_code == 0
        out = runner.invoke(main, ["evaluate", "--codes", "c.h5", "--results", results])
        assert out.exit_code == 0 and f"results appended to {results}" in out.output, out.output
    rows = read_results([results])
    assert len(rows) == 2 and {r["codes"] for r in rows} == {str(tmp_path / f"f{i}" / "c.h5") for i in (0, 1)}
    for row in rows:
        assert (row["seed"], row["run"], row["settings"]) == tuple(trained[row["checkpoint"]][k]
                                                                  for k in ("seed", "run", "settings"))
    assert sorted(entry["n_seeds"] for entry in summarize(rows)) == [1, 1]  # two models, not two seeds of one


def test_codes_rows_of_one_model_on_two_files_are_two_measurements_and_a_foreign_settings_attr_is_left_out(tmp_path):
    """Rows were matched by the model's run alone: its codes of two datasets replaced each other in 'ucmfh runs'.
    A codes file of another writer whose ``settings`` attribute is not ucmfh's JSON is scored, without it."""
    from ucmfh.app.runs import latest
    from ucmfh.metrics import codes_file_row

    rows = []
    for name, settings in (("a.h5", '{"hash": {"n_bits": 12}}'), ("b.h5", "my own notes")):
        path = tmp_path / name
        save_codes(path, **make_file_inputs(5), attrs={"protocol": "unimodal", "dataset": name, "run": "r1",
                                                       "settings": settings})
        rows.append(codes_file_row(evaluate_codes_file(path, k=5)))
    assert rows[0]["settings"] == {"hash": {"n_bits": 12}} and "settings" not in rows[1]
    assert len(latest(rows)) == 2


def test_codes_rows_of_an_older_ucmfh_are_each_a_setting_of_their_own():
    """Rows of 'evaluate --codes' that record no model (an older ucmfh's: no method, seed, run or settings) were
    averaged by 'ucmfh runs' as seeds of one setting: CCA-ITQ's codes and DJSRH's as '0.2071 ± 0.0548' (an
    audit's). Each codes file is now its own entry; rows that record their model group by it, as before."""
    from ucmfh.app.runs import summarize

    old = [{"task": "codes", "codes": f"/x/{name}.h5", "dataset": "wiki", "protocol": "unimodal", "method": "-",
            "loss": None, "n_bits": 16, "k": 50, "map_i2t": score, "map_t2i": score}
           for name, score in (("c_cca", 0.2458), ("c_djsrh", 0.1683))]
    assert sorted(entry["map_i2t_mean"] for entry in summarize(old)) == [0.1683, 0.2458]
    recorded = [{**row, "run": f"r{seed}", "seed": seed, "method": "two-tower",
                 "settings": {"hash": {"n_bits": 16}}} for seed, row in enumerate(old)]
    [entry] = summarize(recorded)
    assert entry["n_seeds"] == 2


def test_one_codes_file_named_twice_is_refused(tmp_path):
    """--codes c.h5 --codes c.h5 appended two rows of one measurement, read as two runs."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    path = tmp_path / "codes.h5"
    save_codes(path, **make_file_inputs(), attrs={"protocol": "unimodal"})
    results = tmp_path / "r.jsonl"
    refused = CliRunner().invoke(main, ["evaluate", "--codes", str(path), "--codes", f"{tmp_path}/./codes.h5",
                                        "--results", str(results)])
    assert refused.exit_code == 2 and f"--codes {path}: given twice" in refused.output, refused.output
    assert not results.exists()


def test_validate_says_what_a_codes_file_is_or_what_is_wrong_with_it(tmp_path):
    """'ucmfh validate' of a codes file said it lacked /train, as of a broken dataset: it is checked as
    'evaluate --codes' reads it, and said to be one; a damaged codes file is one line naming its problem."""
    from click.testing import CliRunner

    from ucmfh.app.cli import main

    path = tmp_path / "c.h5"
    save_codes(path, **make_file_inputs(), attrs={"protocol": "unimodal"})
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and result.output == (
        f"{path}: a valid codes file of 'ucmfh encode' (not a training dataset): 12 bits, labelled; query 12, "
        f"retrieval 40; 'ucmfh evaluate --codes {path}' scores it\n")
    with h5py.File(path, "r+") as f:
        del f["retrieval/txt"]
    damaged = CliRunner().invoke(main, ["validate", str(path)])
    assert damaged.exit_code == 2 and len(damaged.output.splitlines()) == 1 and "retrieval" in damaged.output
    assert "/train" not in damaged.output
