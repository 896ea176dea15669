"""Intervals of a difference between methods: the paired bootstrap, the per-query side files, ``ucmfh compare``."""
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.app.per_query import load_per_query, per_query_path
from ucmfh.metrics.intervals import paired_bootstrap, verdict


def test_the_interval_of_a_mean_difference_matches_the_normal_one():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, size=(1, 2000))
    got = paired_bootstrap([d], resamples=4000, seed=1)
    half = 1.96 * d.std(ddof=1) / math.sqrt(d.shape[1])
    assert got["mean"] == pytest.approx(d.mean())
    assert got["low"] == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert got["high"] == pytest.approx(d.mean() + half, abs=0.15 * half)
    assert verdict(got) == "ahead" and verdict({"low": -1, "high": -0.1}) == "behind"
    assert verdict({"low": -0.1, "high": 0.2}) == "level"
    assert paired_bootstrap([d], resamples=500, seed=3) == paired_bootstrap([d], resamples=500, seed=3)


def test_seeds_that_disagree_widen_the_interval_and_parts_add_up():
    rng = np.random.default_rng(1)
    queries = rng.normal(0.0, 1.0, size=500)
    agree = np.stack([queries, queries, queries])
    disagree = agree + np.array([[-0.5], [0.0], [0.5]])  # the seeds differ by more than the query noise
    narrow = paired_bootstrap([agree], resamples=2000)
    wide = paired_bootstrap([disagree], resamples=2000)
    assert wide["high"] - wide["low"] > 2 * (narrow["high"] - narrow["low"])
    both = paired_bootstrap([agree, agree + 1.0], resamples=2000)
    assert both["mean"] == pytest.approx(2 * agree.mean() + 1.0)
    with pytest.raises(ValueError, match="same number of seeds"):
        paired_bootstrap([agree, agree[:2]])


def test_clusters_are_resampled_whole_and_one_draw_serves_every_part():
    """A caption set's five captions of one image were resampled apart, as five independent queries: a 95%
    interval covered 66% in simulation (scripts/bootstrap_coverage.py). Clusters are resampled whole: a cluster
    of copies weighs as one query; singleton clusters are the queries' own bootstrap; one draw serves both parts."""
    rng = np.random.default_rng(2)
    images = rng.normal(0.1, 1.0, size=(2, 300))  # two seeds
    captions = np.repeat(images, 5, axis=1)
    of = np.repeat(np.arange(300), 5)
    def span(interval):
        return [interval["mean"], interval["low"], interval["high"]]

    as_images = paired_bootstrap([images], resamples=1000, seed=4)
    assert span(paired_bootstrap([captions], resamples=1000, seed=4, clusters=[of])) == pytest.approx(span(as_images))
    apart = paired_bootstrap([captions], resamples=1000, seed=4)  # too narrow: five copies counted as five
    assert apart["high"] - apart["low"] < 0.6 * (as_images["high"] - as_images["low"])
    singletons = paired_bootstrap([images], resamples=1000, seed=4, clusters=[np.arange(300)])
    assert span(singletons) == pytest.approx(span(as_images))
    # I→T (an image) and T→I (its captions) drawn together: the two parts of rSum move as one
    both = paired_bootstrap([images, captions], resamples=1000, seed=4, clusters=[np.arange(300), of])
    assert both["mean"] == pytest.approx(2 * images.mean())
    assert both["high"] - both["low"] == pytest.approx(2 * (as_images["high"] - as_images["low"]), rel=1e-9)
    with pytest.raises(ValueError, match="clusters must give each part's queries a cluster"):
        paired_bootstrap([captions], clusters=[of[:-1]])


def test_compare_pairs_each_query_with_itself_which_can_change_the_verdict(tmp_path):
    """A hand-made cell: two-tower scores every query 0.02 above cca-itq (MAP I->T) or 0.02 below (MAP T->I),
    give or take 0.002, on queries whose scores spread over [0, 1]. Paired by query the difference is clearly
    ahead (behind); the same scores unpaired would be level, as a bootstrap of queries drawn apart shows."""
    rng = np.random.default_rng(0)
    n = 200
    base = {"ap_i2t": rng.permutation(np.linspace(0.0, 0.96, n)), "ap_t2i": rng.permutation(np.linspace(0.02, 1.0, n))}
    other = {"ap_i2t": base["ap_i2t"] + 0.02 + rng.uniform(-0.002, 0.002, n),
             "ap_t2i": base["ap_t2i"] - 0.02 + rng.uniform(-0.002, 0.002, n)}
    rows = []
    for method, scores in (("cca-itq", base), ("two-tower", other)):
        path = tmp_path / f"{method}.queries.npz"
        np.savez(path, **{f"unimodal/-/{name}": values.astype(np.float32) for name, values in scores.items()})
        rows.append({"task": "hashing", "method": method, "run": method, "dataset": "hand",
                     "dataset_fingerprint": "0" * 64, "n_bits": 16, "protocol": "unimodal", "database": None,
                     "k": 50, "seed": 2023, "per_query": str(path)})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json",
                                      "--resamples", "1000"])
    assert shown.exit_code == 0, shown.output
    lines = {x["figure"]: x for x in map(json.loads, shown.output.splitlines())}
    assert set(lines) == {"MAP I->T", "MAP T->I"}
    for figure, name, sign in (("MAP I->T", "ap_i2t", 1), ("MAP T->I", "ap_t2i", -1)):
        d, x = lines[figure]["difference"], lines[figure]
        expected = (other[name].astype(np.float32) - base[name].astype(np.float32)).astype(np.float64)
        assert x["cca-itq"] == pytest.approx(base[name].astype(np.float32).mean(), abs=1e-6)
        # under keys of their own too, and the figure as the rows name it (a script had to look up d[d["base"]])
        assert (x["base_value"], x["other_value"]) == (x["cca-itq"], x["two-tower"])
        assert x["field"] == {"MAP I->T": "map_i2t_expected", "MAP T->I": "map_t2i_expected"}[figure]
        assert d["mean"] == pytest.approx(expected.mean(), abs=1e-6) and d["queries"] == [n]
        assert x["verdict"] == ("ahead" if sign > 0 else "behind")
        assert 0.019 < sign * d["low"] < 0.021 and 0.019 < sign * d["high"] < 0.021  # paired: +-0.002 a query
        apart = paired_bootstrap([other[name][None, rng.permutation(n)] - base[name][None]], resamples=1000)
        assert verdict(apart) == "level"  # the same scores, unpaired
    # the table says what its intervals cover: one seed a cell, queries alone (not another training run); a
    # seed one method alone was scored with is said to be left out
    results.write_text("".join(json.dumps(row) + "\n" for row in rows + [{**rows[0], "seed": 2024, "run": "c24"}]))
    table = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples",
                                      "200"])
    assert table.exit_code == 0, table.output
    assert "bootstrap over queries (one seed a cell: not over training runs)" in table.output
    assert "seeds 2024: scored for one of the two methods alone in some cells, left out" in table.output
    results.write_text(json.dumps({**rows[0], "seed": 2024}) + "\n" + json.dumps(rows[1]) + "\n")
    unpaired = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert unpaired.exit_code == 2 and "Traceback" not in unpaired.output, unpaired.output  # was a TypeError
    assert "no cell has rows of cca-itq and two-tower of one seed (seeds: cca-itq 2024; two-tower 2023)" \
        in unpaired.output
    # a second dataset of both whose seeds differ (a baseline at seed 0, as docs/evaluation.md scores CCA-ITQ,
    # beside the default's 2023) vanished from the table without a word
    other_set = [{**row, "dataset": "other", "dataset_fingerprint": "1" * 64, "run": row["run"] + "-o",
                  "seed": 0 if row["method"] == "cca-itq" else 2023} for row in rows]
    results.write_text("".join(json.dumps(row) + "\n" for row in rows + other_set))
    both = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples",
                                     "200"])
    assert both.exit_code == 0 and "hand" in both.stdout and "other" not in both.stdout, both.output
    assert both.stderr == ("left out, no seed scored by both: other  16 bits  unimodal (cca-itq seeds 0; two-tower "
                           "seeds 2023)\n")


@pytest.mark.parametrize("results_at", ["r.jsonl", "runs/results.jsonl"])
def test_rows_of_another_folder_are_compared_from_here_with_their_lengths_in_order(tmp_path, monkeypatch, results_at):
    """A grid run in one folder writes its files' paths relative to it; compare from another folder, given that
    grid's results file (in the folder or in its runs/), finds them; cells are listed 16 bits before 128."""
    there = tmp_path / "there"
    (there / "runs").mkdir(parents=True)
    rows = []
    for n_bits in (128, 16):
        for method, shift in (("cca-itq", 0.0), ("two-tower", 0.1)):
            name = f"runs/{method}{n_bits}.queries.npz"
            np.savez(there / name, **{f"unimodal/-/ap_{d}": np.linspace(0, 0.8, 50, dtype=np.float32) + shift
                                      for d in ("i2t", "t2i")})
            rows.append({"task": "hashing", "method": method, "run": f"{method}{n_bits}", "dataset": "hand",
                         "dataset_fingerprint": "0" * 64, "n_bits": n_bits, "protocol": "unimodal",
                         "database": None, "k": 50, "seed": 2023, "per_query": name})
    results = there / results_at
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json",
                                      "--resamples", "200"])
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.output.splitlines()]
    assert [x["n_bits"] for x in lines] == [16, 16, 128, 128]
    assert all(x["difference"]["mean"] == pytest.approx(0.1, abs=1e-6) for x in lines)


def _grid(tmp_path, path, methods, seeds="2023,1", extra=()):
    results = tmp_path / "r.jsonl"
    epochs = [] if methods == "cca-itq" else ["--epochs", "2"]  # a grid of closed-form fits only refuses --epochs
    argv = ["grid", "-d", path, "-b", "16", "--methods", methods, "--seeds", seeds, *epochs,
            "--out", str(tmp_path / "runs"), "--results", str(results), "--table", str(tmp_path / "t"),
            "--device", "cpu", "--quiet", *extra]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    return results, [json.loads(line) for line in results.read_text().splitlines()]


def test_compare_pairs_the_per_query_scores_of_two_methods_on_a_caption_set(tmp_path):
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    path = caption_file(tmp_path / "captions.h5", n_retrieval=60)
    results, rows = _grid(tmp_path, path, "cca-itq,two-tower")
    for row in rows:  # every row points at its side file, which holds the tie-aware per-query scores
        scores = load_per_query(row)
        arrays = {f"{row['protocol']}/{row['database']}/{name}": values for name, values in scores.items()}
        other = next(r for r in rows if r is not row and r["checkpoint"] == row["checkpoint"])
        arrays.update({f"{other['protocol']}/{other['database']}/{name}": values
                       for name, values in load_per_query(other).items()})
        assert row["per_query"] == per_query_path(row["checkpoint"], row["dataset_fingerprint"], arrays)
        assert set(scores) == {"ap_i2t", "ap_t2i", "hits_i2t", "hits_t2i", "image_t2i"}
        # each T→I query's image, numbered as the I→T queries: the captions of one image are resampled together
        assert len(scores["image_t2i"]) == len(scores["ap_t2i"]) == 3 * len(scores["ap_i2t"])
        assert scores["image_t2i"].tolist() == np.repeat(np.arange(len(scores["ap_i2t"])), 3).tolist()
        assert 100 * scores["hits_i2t"][:, 0].mean() == pytest.approx(row["recall_i2t_expected"]["1"], abs=1e-4)
        assert scores["ap_t2i"].mean() == pytest.approx(row["map_t2i_expected"], abs=1e-6)
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json",
                                      "--resamples", "500"])
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.output.splitlines()]
    assert {(x["database"], x["figure"]) for x in lines} == {
        (d, f) for d in ("test", "collection") for f in ("R@1 I->T", "R@1 T->I", "rSum", "MAP I->T", "MAP T->I")}
    for x in lines:
        mine = {r["method"]: r for r in rows if r["database"] == x["database"] and r["seed"] == 2023}
        assert x["seeds"] == [1, 2023]
        if x["figure"] == "rSum":
            means = {m: np.mean([r["rsum_expected"] for r in rows if r["method"] == m and r["database"] == x["database"]])
                     for m in mine}
            assert x["two-tower"] - x["cca-itq"] == pytest.approx(means["two-tower"] - means["cca-itq"], abs=1e-3)
        d = x["difference"]
        assert d["low"] <= d["mean"] <= d["high"] and x["verdict"] == verdict(d)
    table = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results),
                                      "--resamples", "500"])
    assert table.exit_code == 0 and "difference [95% interval]" in table.output and "rSum" in table.output
    # what the intervals do not cover, said under the table (simulations measured it: docs/evaluation.md)
    assert "resample each caption as a query of its own" not in table.output  # images are resampled
    assert "2 seeds: the seed part of an interval reaches no further than the seeds scored" in table.output
    assert "10 intervals, each at 95% on its own" in table.output
    # the rows split over two results files (grids run side by side) compare as one file does
    lines_of = results.read_text().splitlines(keepends=True)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(lines_of[::2]))
    second.write_text("".join(lines_of[1::2]))
    split = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(first), "--results",
                                      str(second), "--json", "--resamples", "500"])
    assert split.exit_code == 0 and split.output == shown.output
    for path in {row["per_query"] for row in rows}:  # per-query scores of an older ucmfh: no images; said
        with np.load(path) as f:
            kept = {key: f[key] for key in f.files if not key.endswith("/image_t2i")}
        np.savez(path, **kept)
    older = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples",
                                      "500"])
    assert older.exit_code == 0 and "caption set scored before 2026-12-01: T→I and rSum resample each caption as a " \
        "query of its own" in older.output, older.output


def test_compare_says_what_is_missing(tmp_path, tiny_path):
    results, rows = _grid(tmp_path, tiny_path, "cca-itq", seeds="2023")
    runner = CliRunner()
    absent = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert absent.exit_code == 2 and "no cell has rows of both cca-itq and two-tower" in absent.output
    assert "methods there: cca-itq" in absent.output
    # a selection that leaves no row: said as such, with what the file holds (not "methods there: none")
    dataset = rows[0]["dataset"]
    for unmatched in (["--seed", "7"], ["-k", str(rows[0]["k"] + 1)]):  # -k: the cut-off the rows were scored at
        unselected = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), *unmatched])
        assert unselected.exit_code == 2 and unselected.output.strip().splitlines()[-1] == (
            f"Error: {results}: no hashing rows match -d/-b/-k/--protocol/--seed (there: tasks hashing; datasets "
            f"{dataset}; methods cca-itq; code lengths 16; protocols unimodal; seeds 2023)"), unselected.output
    same = runner.invoke(main, ["compare", "cca-itq", "cca-itq", "--results", str(results)])
    assert same.exit_code == 2 and "two different methods" in same.output
    # a row from before per-query scores were kept: named, with the command that writes them
    old = dict(rows[0], method="two-tower", run="old", checkpoint=str(tmp_path / "old" / "hash16.pt"))
    old.pop("per_query")
    with open(results, "a") as f:
        f.write(json.dumps(old) + "\n")
    before = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert before.exit_code == 2 and "no per-query scores" in before.output and "ucmfh evaluate -c" in before.output
    # several such runs are named at once (an audit of a study across an upgrade: one a call)
    with open(results, "a") as f:
        f.write(json.dumps({k: v for k, v in rows[0].items() if k != "per_query"}) + "\n")
    both = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert both.exit_code == 2 and both.output == (
        f"Error: 2 runs' rows have no per-query scores (scored before they were kept); score them again: "
        f"'ucmfh evaluate -c {rows[0]['checkpoint']}'; 'ucmfh evaluate -c {old['checkpoint']}'\n"), both.output
    with open(results) as f:  # the run of cca-itq scored again, as its command says
        kept = f.readlines()[:-1]
    with open(results, "w") as f:
        f.writelines(kept)
    # per-query scores of fewer queries than the other method's (a file of another query split): refused
    scores = load_per_query(rows[0])
    fewer = tmp_path / "fewer.npz"
    np.savez(fewer, **{f"{rows[0]['protocol']}/-/{name}": values[:-1] for name, values in scores.items()})
    means = {f"map_{name[3:]}_expected": float(values[:-1].mean()) for name, values in scores.items()}
    with open(results, "a") as f:
        f.write(json.dumps(dict(rows[0], method="two-tower", run="fewer", per_query=str(fewer), **means)) + "\n")
    n = len(scores["ap_i2t"])
    other = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert other.exit_code == 2, other.output
    assert other.output == f"Error: cca-itq and two-tower were scored on different queries ({n} and {n - 1})\n"
    # a file of that name without the scores (made otherwise): one line naming it, not a KeyError's traceback
    np.savez(fewer, x=np.zeros(3))
    damaged = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert damaged.exit_code == 2 and damaged.output.startswith(
        f"Error: {fewer}: not a file of per-query scores of run fewer (no 1-d numbers 'unimodal/-/ap_i2t')"), \
        damaged.output
    # NaN among the scores: its mean is NaN, which the row's figure check let pass, and the cell read 'nan [nan,
    # nan] level'
    np.savez(fewer, **{f"{rows[0]['protocol']}/-/{name}": np.where(np.arange(len(values) - 1) == 3, np.nan,
                                                                    values[:-1]) for name, values in scores.items()})
    nan = runner.invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert nan.exit_code == 2 and nan.output.startswith(
        f"Error: {fewer}: per-query scores of run fewer hold NaN or inf ('unimodal/-/ap_i2t')"), nan.output


def test_scoring_a_checkpoint_again_at_another_k_keeps_the_per_query_scores_an_earlier_row_names(tmp_path,
                                                                                                 tiny_path):
    """One side file per checkpoint and dataset was written over by `evaluate -c --k 5`: compare then read
    MAP@5's scores for a MAP@50 row, silently."""
    results, rows = _grid(tmp_path, tiny_path, "cca-itq", seeds="2023")
    before = {row["per_query"]: load_per_query(row) for row in rows}
    again = CliRunner().invoke(main, ["evaluate", "-c", rows[0]["checkpoint"], "-d", tiny_path, "--k", "5",
                                      "--results", str(results), "--device", "cpu", "--quiet"])
    assert again.exit_code == 0, again.output
    later = [json.loads(line) for line in results.read_text().splitlines()][len(rows):]
    assert later and all(row["k"] == 5 and row["per_query"] not in before for row in later)
    for row in rows:  # the earlier rows' files as they were, their means the rows' MAPs
        scores = load_per_query(row)
        assert all(np.array_equal(scores[name], before[row["per_query"]][name]) for name in scores)
        assert scores["ap_i2t"].mean() == pytest.approx(row["map_i2t_expected"], abs=1e-6)
    # a file of the older name, written over by a later scoring: refused in words, where it was read as the row's
    stale = dict(rows[0], per_query=later[0]["per_query"])
    with pytest.raises(ValueError, match=r"are not its row's .* replaced by a later scoring of another k"):
        load_per_query(stale)
    junk = tmp_path / "junk.npz"
    junk.write_text("not an archive")
    with pytest.raises(ValueError, match=r"junk.npz: not a file of per-query scores"):
        load_per_query(dict(rows[0], per_query=str(junk)))


def test_compare_pools_other_query_draws_of_the_same_items(tmp_path):
    """--pool: the datasets are query draws of the same items; a seed's queries are those of every draw it was
    scored on, and a seed missing from a draw is left out."""
    from conftest import caption_file  # noqa: PLC0415 - the shared tiny caption set

    draws = [caption_file(tmp_path / f"draw{i}.h5", rng=np.random.default_rng(i)) for i in (1, 2)]
    results = tmp_path / "r.jsonl"
    common = ["grid", "-b", "16", "--methods", "cca-itq,two-tower", "--epochs", "2", "--out", str(tmp_path / "runs"),
              "--results", str(results), "--table", str(tmp_path / "t"), "--device", "cpu", "--quiet"]
    for path, seeds in ((draws[0], "2023,1"), (draws[1], "2023")):  # seed 1: the first draw only
        done = CliRunner().invoke(main, [*common, "-d", path, "--seeds", seeds])
        assert done.exit_code == 0, done.output
    args = ["compare", "cca-itq", "two-tower", "--results", str(results), "--json", "--resamples", "300"]
    apart = [json.loads(line) for line in CliRunner().invoke(main, args + ["--seed", "2023"]).output.splitlines()]
    unnamed = CliRunner().invoke(main, args + ["--pool"])
    assert unnamed.exit_code == 2 and "--pool: name the query draws to pool with -d" in unnamed.output
    shown = CliRunner().invoke(main, args + ["--pool", "-d", "draw1", "-d", "draw2"])
    assert shown.exit_code == 0, shown.output
    pooled = [json.loads(line) for line in shown.output.splitlines()]
    assert len(apart) == 2 * len(pooled) and {tuple(x["seeds"]) for x in pooled} == {(2023,)}
    for x in pooled:
        per_draw = [y for y in apart if (y["database"], y["figure"]) == (x["database"], x["figure"])]
        assert len(per_draw) == 2 and x["dataset"] == "draw1+draw2"
        for method in ("cca-itq", "two-tower"):  # the draws have as many queries each: the mean of their means
            assert x[method] == pytest.approx(sum(y[method] for y in per_draw) / 2, abs=1e-9)
        assert x["difference"]["queries"] == [sum(y["difference"]["queries"][i] for y in per_draw)
                                              for i in range(len(x["difference"]["queries"]))]
    # datasets of other items are not draws of these: pooling them gave a cell, an interval and a verdict
    rows = [json.loads(line) for line in open(results)]
    other = [{**r, "dataset": "other", "dataset_fingerprint": "f" * 64, "n_database_txt": r["n_database_txt"] + 5}
             for r in rows if r["dataset"] == "draw2"]
    with open(results, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in other))
    mixed = CliRunner().invoke(main, args + ["--pool", "-d", "draw1", "-d", "other"])
    assert mixed.exit_code == 2 and "--pool: the datasets are not query draws of the same items" in mixed.output, \
        mixed.output


def test_a_results_file_without_hashing_rows_says_so(tmp_path):
    """A file of SEPS rows alone: 'no hashing rows match -d/-b/-k/--protocol/--seed (there: no rows)' blamed a
    selection the user never made, and said the file held nothing."""
    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps({"task": "seps", "dataset": "f", "method": "seps", "protocol": "unimodal",
                                   "seed": 1}) + "\n")
    result = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results)])
    assert result.exit_code == 2 and result.output.startswith(
        f"Error: {results}: no hashing rows to compare (there: tasks seps;"), result.output


def test_compare_two_settings_of_one_method_by_key_or_by_setting(tmp_path):
    """An ablation: two-tower with lr_head 0.001 (its default) and 0.01, seeds 1 and 2, on hand-made per-query
    scores. BASE and OTHER name each setting by the key 'ucmfh runs' shows or by the setting itself; the
    difference is the hand-computed one; sides that do not part the settings are refused in one line."""
    from ucmfh.app.runs import settings_key

    rng = np.random.default_rng(0)
    n = 120
    rows, scores = [], {}
    for lr in (0.001, 0.01):
        for seed in (1, 2):
            if lr == 0.001:  # the default's scores; 0.01 gains 0.05 a query I->T, give or take 0.01
                scores[lr, seed] = {"ap_i2t": rng.uniform(0, 0.9, n), "ap_t2i": rng.uniform(0, 1, n)}
            else:
                base = scores[0.001, seed]
                scores[lr, seed] = {"ap_i2t": base["ap_i2t"] + 0.05 + rng.uniform(-0.01, 0.01, n),
                                    "ap_t2i": rng.permutation(base["ap_t2i"])}
            path = tmp_path / f"{lr}-{seed}.npz"
            np.savez(path, **{f"unimodal/-/{k}": v.astype(np.float32) for k, v in scores[lr, seed].items()})
            rows.append({"task": "hashing", "method": "two-tower", "run": f"r{lr}-{seed}", "dataset": "hand",
                         "dataset_fingerprint": "0" * 64, "n_bits": 16, "protocol": "unimodal", "database": None,
                         "k": 50, "seed": seed, "per_query": str(path),
                         "settings": {"hash": {"method": "two-tower", "lr_head": lr, "betas": [0.5, 0.999],
                                               "loss_params": {"temperature": 0.3}, "n_bits": 16, "seed": seed,
                                               "supervised": False, "val_fraction": 0.0,  # a method parameter as text
                                               "method_params": {"temperatures": "0.3,0.1" if lr == 0.001 else
                                                                 "0.1"}}}})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    keys = {row["settings"]["hash"]["lr_head"]: settings_key(row) for row in rows}

    def run(*sides, json_out=True):
        return CliRunner().invoke(main, ["compare", *sides, "--results", str(results), "--resamples", "300",
                                         *(["--json"] if json_out else [])])

    by_setting = run("two-tower@hash.lr_head=0.001", "two-tower@hash.lr_head=0.01")
    assert by_setting.exit_code == 0, by_setting.output
    lines = {x["figure"]: x for x in map(json.loads, by_setting.output.splitlines())}
    for figure, name in (("MAP I->T", "ap_i2t"), ("MAP T->I", "ap_t2i")):
        expected = np.mean([scores[0.01, s][name].astype(np.float32) - scores[0.001, s][name].astype(np.float32)
                            for s in (1, 2)])
        assert lines[figure]["difference"]["mean"] == pytest.approx(expected, abs=1e-6)
        assert lines[figure]["seeds"] == [1, 2] and lines[figure]["base"] == "two-tower@hash.lr_head=0.001"
    assert lines["MAP I->T"]["verdict"] == "ahead"
    # the same runs by key (a prefix, as 'ucmfh runs' shows six digits), by several settings, and against the
    # method's every setting (its other setting alone is paired: a setting is not compared with itself)
    for sides in ((f"two-tower@{keys[0.001][:6]}", f"two-tower@{keys[0.01][:4]}"),
                  ("two-tower@hash.lr_head=0.001,hash.betas=[0.5,0.999]", "two-tower@hash.loss_params.temperature=0.3"
                   ",hash.lr_head=0.01"),
                  ("two-tower@hash.lr_head=0.001", "two-tower"),
                  # a setting kept as text, by its text (quoted where it holds a comma); 0 for 0.0
                  ('two-tower@hash.method_params.temperatures="0.3,0.1"',
                   "two-tower@hash.method_params.temperatures=0.1"),
                  ("two-tower@hash.val_fraction=0,hash.lr_head=0.001", "two-tower@hash.lr_head=0.01")):
        same = run(*sides)
        assert same.exit_code == 0, same.output
        assert [(x["figure"], x["difference"]) for x in map(json.loads, same.output.splitlines())] == \
            [(x["figure"], x["difference"]) for x in map(json.loads, by_setting.output.splitlines())]
    table = run("two-tower@hash.lr_head=0.001", "two-tower@hash.lr_head=0.01", json_out=False)
    assert table.exit_code == 0 and "two-tower@hash.lr_head=0.01 − two-tower@hash.lr_head=0.001" in table.output
    third = {**rows[0], "run": "third", "settings": {"hash": {**rows[0]["settings"]["hash"], "betas": [0.9, 0.999]}}}
    with open(results, "a") as f:  # a third setting: two-tower's every setting holds two that betas=[0.5,0.999] does
        f.write(json.dumps(third) + "\n")
    for sides, says in (
            (("two-tower", "two-tower@hash.loss_params.temperature=0.3"),
             "two-tower and two-tower@hash.loss_params.temperature=0.3 select runs of the same settings"),
            (("two-tower@hash.seed=1", "two-tower@hash.seed=2"), "seeds and code lengths by --seed and -b"),
            (("two-tower", "two-tower@hash.betas=[0.5,0.999]"), "both select the runs of settings"),
            (("two-tower@hash.lr_head=0.02", "two-tower"),
             "two-tower@hash.lr_head=0.02: no two-tower row has hash.lr_head=0.02 (its rows have 0.001, 0.01)"),
            (("two-tower@hash.lr_hed=1", "two-tower"), "BASE: 'hash.lr_hed' in 'two-tower@hash.lr_hed=1': hash "
                                                       "settings are method, "),
            (("two-tower@fusion.lr=1", "two-tower"), "no two-tower row has a setting fusion.lr"),
            (("two-tower@ffff", "two-tower"), "no two-tower row has settings key ffff... (its keys: "),
            (("two-tower", "two-tower@lr"), "OTHER: 'lr' in 'two-tower@lr' is neither a settings key"),
            (("two-tower", "two-tower"), "compare two different methods or settings"),
            (("two-tower@hash.supervised=0", "two-tower"), "no two-tower row has hash.supervised=0 (its rows have "
                                                           "false)"),  # 0 is not false
            (("two-tower@hash.val_fraction=0,hash.method_params.temperatures=0.1,hash.lr_head=0.001", "two-tower"),
             "no two-tower row has all of these settings at once"),  # each alone is some row's
            (("twotower@abcd", "twotower@hash.lr_head=1"), "no cell has rows of both twotower@abcd and "
                                                           "twotower@hash.lr_head=1 (methods there: two-tower")):
        refused = run(*sides)
        assert refused.exit_code == 2 and says in refused.output, (sides, refused.output)
        assert len(refused.output.strip().splitlines()) == 1 and "Traceback" not in refused.output


def test_a_parameter_that_was_a_hashing_setting_is_selected_as_listed():
    """'ucmfh methods' lists ucmfh's code_weight as a method parameter; rows keep it where it was a hashing setting
    (so that older runs keep their identity): ucmfh@hash.method_params.code_weight=0.5 matched no row."""
    from ucmfh.app.compare import parse_side

    row = {"method": "ucmfh", "settings": {"hash": {"method": "ucmfh", "code_weight": 0.5, "method_params": {}}}}
    side = parse_side("ucmfh@hash.method_params.code_weight=0.5", "BASE")
    assert side.conditions[0][0] == ("hash", "code_weight") and side.holds(row)
    assert not parse_side("ucmfh@hash.method_params.code_weight=0.9", "BASE").holds(row)


def _hand_rows(tmp_path, cells):
    """Rows of cca-itq and two-tower (two-tower 0.1 ahead on every query) for each (k, dataset, trained_on)."""
    rows = []
    for k, dataset, trained_on in cells:
        for method, shift in (("cca-itq", 0.0), ("two-tower", 0.1)):
            path = tmp_path / f"{method}-{k}-{dataset}-{trained_on}.npz"
            scores = {f"ap_{d}": np.linspace(0, 0.8, 40, dtype=np.float32) + shift for d in ("i2t", "t2i")}
            np.savez(path, **{f"unimodal/-/{name}": values for name, values in scores.items()})
            rows.append({"task": "hashing", "method": method, "run": f"{method}{k}{trained_on}", "dataset": dataset,
                         "dataset_fingerprint": dataset * 8, "n_bits": 16, "protocol": "unimodal",
                         "database": None, "k": k, "seed": 2023, "per_query": str(path),
                         **({"trained_on": {"label": "other", "fingerprint": "f" * 64}} if trained_on else {}),
                         **{f"map_{d}_expected": float(scores[f"ap_{d}"].mean()) for d in ("i2t", "t2i")}})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return results, rows


def test_cells_of_another_k_or_of_a_checkpoint_trained_elsewhere_stand_apart_and_say_so(tmp_path):
    """Cells of two k had identical labels in the table and the forest plot; a checkpoint trained on another file
    and scored on this one (evaluate -c -d) took the place of this file's run in its cell, without a word."""
    results, _ = _hand_rows(tmp_path, [(50, "hand", False), (100, "hand", False), (50, "hand", True)])
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--json",
                                      "--resamples", "200"])
    assert shown.exit_code == 0, shown.output
    cells = {(x["dataset"], x["k"]) for x in map(json.loads, shown.output.splitlines())}
    assert cells == {("hand", 50), ("hand", 100), ("hand (trained on other)", 50)}
    table = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples",
                                      "200"])
    header, *lines = table.output.splitlines()
    assert header.split()[:5] == ["dataset", "bits", "protocol", "database", "k"], table.output
    assert any(line.startswith("hand (trained on other)") for line in lines)
    assert {line.split()[4] for line in lines if line.startswith("hand  ")} == {"50", "100"}


def test_a_pool_of_draws_keeps_a_checkpoint_trained_elsewhere_apart(tmp_path):
    """Under --pool the key dropped what a row was trained on, and a checkpoint trained on another file (behind)
    replaced the draw's own run (ahead): the verdict flipped."""
    results, rows = _hand_rows(tmp_path, [(50, "hand", False), (50, "draw", False), (50, "hand", True)])
    for row in rows:  # the one trained elsewhere: two-tower behind, where the draws' own runs are ahead
        if row.get("trained_on") and row["method"] == "two-tower":
            np.savez(row["per_query"], **{f"unimodal/-/ap_{d}": np.linspace(0, 0.8, 40, dtype=np.float32) - 0.05
                                          for d in ("i2t", "t2i")})
            row.update({f"map_{d}_expected": float(np.linspace(0, 0.8, 40, dtype=np.float32).mean() - 0.05)
                        for d in ("i2t", "t2i")})
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    shown = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", "hand",
                                      "-d", "draw", "--pool", "--json", "--resamples", "200"])
    assert shown.exit_code == 0, shown.output
    verdicts = {(x["dataset"], x["figure"]): x["verdict"] for x in map(json.loads, shown.output.splitlines())}
    assert verdicts == {("draw+hand", "MAP I->T"): "ahead", ("draw+hand", "MAP T->I"): "ahead",
                        ("hand (trained on other)", "MAP I->T"): "behind",
                        ("hand (trained on other)", "MAP T->I"): "behind"}


def test_pooling_a_draw_without_rows_and_damaged_rows_are_said(tmp_path):
    results, rows = _hand_rows(tmp_path, [(50, "hand", False)])
    pooled = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "-d", "hand",
                                       "-d", "nosuchdraw", "--pool"])
    assert pooled.exit_code == 2 and "--pool: no rows of nosuchdraw (there: " in pooled.output, pooled.output
    damaged = [dict(rows[0], settings={"hash": "x"}, run="a"), dict(rows[0], dataset_fingerprint=["x"], run="b")]
    with open(results, "a") as f:
        f.write("".join(json.dumps(row) + "\n" for row in damaged))
    for command in (["compare", "cca-itq", "two-tower", "--resamples", "200"], ["runs"]):
        out = CliRunner().invoke(main, [*command, "--results", str(results)])
        assert out.exit_code == 0 and "Traceback" not in out.output, out.output  # skipped, and said


def test_sides_of_several_settings_are_said_compared_pair_by_pair_each_file_read_once(tmp_path, monkeypatch):
    """A lab's learning-rate sweep: three settings of each method make nine comparisons a cell, which compare made
    in silence (400 intervals in 150 s at five settings a side) and read each per-query file once per pair. It says
    the pairs up front; each file is read once."""
    import ucmfh.app.compare as compare_module

    rng = np.random.default_rng(1)
    rows = []
    for method in ("cca-itq", "two-tower"):
        for lr in (0.1, 0.01, 0.001):
            path = tmp_path / f"{method}-{lr}.npz"
            np.savez(path, **{f"unimodal/-/{k}": rng.uniform(0, 1, 40).astype(np.float32) for k in ("ap_i2t", "ap_t2i")})
            rows.append({"task": "hashing", "method": method, "run": f"{method}{lr}", "dataset": "hand",
                         "dataset_fingerprint": "0" * 64, "n_bits": 16, "protocol": "unimodal", "database": None,
                         "k": 50, "seed": 1, "per_query": str(path),
                         "settings": {"hash": {"method": method, "lr_head": lr, "n_bits": 16, "seed": 1}}})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    reads = []
    real = compare_module.load_per_query
    monkeypatch.setattr(compare_module, "load_per_query", lambda row: reads.append(row["per_query"]) or real(row))
    result = CliRunner().invoke(main, ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples",
                                       "200", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["9 comparisons in 1 cell(s): cca-itq with 3 settings, two-tower with 3, each "
                                          "pair compared; METHOD@KEY keeps one (keys: 'ucmfh runs')"]
    assert len(result.stdout.splitlines()) == 9 * 2 and sorted(reads) == sorted(row["per_query"] for row in rows)
    one = CliRunner().invoke(main, ["compare", "cca-itq@hash.lr_head=0.1", "two-tower@hash.lr_head=0.1", "--results",
                                    str(results), "--resamples", "200", "--json"])
    assert one.exit_code == 0 and not one.stderr and len(one.stdout.splitlines()) == 2


def test_a_run_beyond_its_method_s_defaults_is_said_beside_the_comparison(tmp_path):
    """docs/evaluation.md's own example: a grid of cca-itq and two-tower at --epochs 3, then compare: the table
    showed the default method behind CCA-ITQ, and nothing said it had run 3 of its 100 epochs. The table says
    each side's settings beyond its method's defaults on the dataset; --json rows carry them; defaults say
    nothing; the grid's markdown tables say them too."""
    from ucmfh.app.grid import markdown
    from ucmfh.app.identity import run_settings
    from ucmfh.methods.settings import stage_configs

    rng = np.random.default_rng(2)
    rows = []
    for method, given in (("cca-itq", {}), ("two-tower", {"epochs": 3})):
        fcfg, (hcfg,) = stage_configs(method, dataset="wiki", n_bits=16, seed=1, **given)
        path = tmp_path / f"{method}.npz"
        np.savez(path, **{f"unimodal/-/{k}": rng.uniform(0, 1, 30).astype(np.float32) for k in ("ap_i2t", "ap_t2i")})
        rows.append({"task": "hashing", "method": method, "run": method, "dataset": "wiki", "loss": hcfg.loss,
                     "dataset_fingerprint": "0" * 64, "n_bits": 16, "protocol": "unimodal", "database": None,
                     "k": 50, "seed": 1, "per_query": str(path), "map_i2t": 0.3, "map_t2i": 0.3,
                     "settings": run_settings(fcfg, hcfg, 1)})
    results = tmp_path / "r.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["compare", "cca-itq", "two-tower", "--results", str(results), "--resamples", "200"]
    table = CliRunner().invoke(main, argv)
    assert table.exit_code == 0 and table.stdout.splitlines()[-1] == (
        "settings beyond each method's defaults: two-tower hash.epochs=3"), table.output
    lines = [json.loads(line) for line in CliRunner().invoke(main, [*argv, "--json"]).stdout.splitlines()]
    assert {(x["base_beyond_defaults"] == [], x["other_beyond_defaults"] == ["hash.epochs=3"]) for x in lines} == {
        (True, True)}
    assert markdown(rows, ["cca-itq", "two-tower"], [16]).startswith(
        "Settings beyond each method's defaults, which the figures below are of: two-tower hash.epochs=3.\n")
    rows[1]["settings"]["hash"]["epochs"] = 100  # at its defaults: not a word
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    plain = CliRunner().invoke(main, argv)
    assert plain.exit_code == 0 and "beyond each method's defaults" not in plain.output
    assert not markdown(rows, ["cca-itq", "two-tower"], [16]).startswith("Settings beyond")


def test_an_interval_that_excludes_zero_is_shown_to_the_digit_that_says_so():
    """'R@1 T->I +0.9 [+0.0, +1.7] ahead' read as an interval touching zero: its low end was +0.03. An interval
    excluding zero is shown to the digit where its near end is not 0 (at most four more); a level one as before."""
    from ucmfh.app.compare import _format

    def result(figure, low, high, verdict_):
        return (("wiki", 16, "unimodal", None, 50, "a" * 6, "b" * 6),
                {"figure": figure, "seeds": [1], "unpaired_seeds": [], "x": 10.0, "y": 10.9, "verdict": verdict_,
                 "difference": {"mean": (low + high) / 2, "low": low, "high": high}})

    lines = _format([result("R@1 T->I", 0.03, 1.7, "ahead"), result("R@1 I->T", -1.7, -0.004, "behind"),
                     result("rSum", -0.02, 1.7, "level"), result("MAP I->T", 0.00001, 0.002, "ahead")],
                    "x", "y").splitlines()
    shown = [line.split()[-4:] for line in lines[1:5]]
    assert shown == [["+0.86", "[+0.03,", "+1.70]", "ahead"], ["-0.852", "[-1.700,", "-0.004]", "behind"],
                     ["+0.8", "[-0.0,", "+1.7]", "level"], ["+0.00101", "[+0.00001,", "+0.00200]", "ahead"]]
