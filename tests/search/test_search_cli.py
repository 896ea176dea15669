"""``ucmfh index`` and ``ucmfh search`` end to end on a tiny synthetic dataset; user errors in one line."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ucmfh.app.cli import main
from ucmfh.checkpoint import save_checkpoint
from ucmfh.config import HashConfig
from ucmfh.models.hashing import FeatureHasher
from ucmfh.search import Index
from ucmfh.search.index import UnfinishedIndex

from conftest import ROOT


@pytest.fixture()
def trained(tiny_path, tiny, tmp_path):
    torch.manual_seed(0)
    cfg = HashConfig(method="two-tower", n_bits=16, hidden=0)
    model = FeatureHasher(tiny.d_img, tiny.d_txt, cfg.n_bits, cfg.hidden, cfg.dropout)
    model.fit_feature_stats(tiny.train.img, tiny.train.txt)
    return save_checkpoint(tmp_path / "hash16.pt", model.eval(), None, cfg)


def test_index_then_search_table_json_html(tiny_path, tiny, trained, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ix"
    result = runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet", "--chunk-size", "100"])
    assert result.exit_code == 0, result.output
    n = len(tiny.query) + len(tiny.retrieval)
    assert f"added {n} images and {n} texts" in result.output
    result = runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"])
    assert "already indexed" in result.output and Index.load(out).count("txt") == n
    qid = int(tiny.query.ids[0])
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "--ids", str(qid), "-k", "4"])
    assert result.exit_code == 0, result.output
    assert f"query 0 (id {qid})  [image -> text]" in result.output and "relevant (shared label)" in result.output
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "3", "--json", "--modality", "image",
                                  "--query-modality", "text", "--rerank", "cosine", "--html", str(tmp_path / "p.html")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 3 * len(tiny.query) and {"query", "rank", "id", "distance", "cosine", "relevant"} <= set(rows[0])
    assert [r["rank"] for r in rows[:3]] == [1, 2, 3] and (tmp_path / "p.html").exists()
    # the page numbers its queries as the table and the JSON do
    page = (tmp_path / "p.html").read_text()
    assert f"<h2>Query 0 (id {int(tiny.query.ids[0])})</h2>" in page and rows[0]["query"] == 0
    # the JSON rows are the library's exact top-k: text queries of the query split against the indexed images
    index = Index.load(out)
    from ucmfh.search.build import Encoder

    logits = Encoder(trained).encode(tiny.query.txt.numpy(), "txt")
    d, p = index.search(logits, 30, "img")
    first = [r["position"] for r in rows[:3]]
    assert set(first) <= set(p[0])  # re-ranked among the 30 Hamming candidates
    # queries from an .npy file of features
    np.save(tmp_path / "q.npy", tiny.query.txt[:2].numpy())
    result = runner.invoke(main, ["search", str(out), "-q", str(tmp_path / "q.npy"), "-k", "5", "--json",
                                  "-m", "image"])
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["position"] for r in rows[:5]] == list(p[0, :5])


def test_a_search_printed_a_block_of_queries_at_a_time_prints_what_the_whole_search_did(tiny_path, tiny, trained,
                                                                                        tmp_path, monkeypatch):
    """Hits are searched, taken and printed a block of queries at a time (300,000 queries held 1.5 GB and printed
    nothing for a minute): blocks of 2 queries print the same table, JSON, page, figures and notes as one block."""
    from ucmfh.search import results as results_module

    runner = CliRunner()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    searches = [["-k", "4", "--metrics"], ["-k", "3", "--json", "--metrics", "--rerank", "cosine", "--candidates", "7"],
                ["-k", "5", "--backend", "mih", "--json", "-m", "image", "--query-modality", "text", "--metrics"]]

    def outputs():
        said = []
        for i, flags in enumerate(searches):
            page = tmp_path / f"{i}.html"  # written again by the second search (a page ucmfh wrote)
            result = runner.invoke(main, ["search", str(out), "-q", tiny_path, *flags, "--html", str(page)])
            assert result.exit_code == 0, result.output
            stderr = [line for line in result.stderr.splitlines() if "ms per query" not in line]
            said.append((result.stdout, stderr, page.read_text()))
        return said

    search_blocks = results_module.search_blocks

    def encoded_in_twos(index, encoder, queries, *args, block=None, **kwargs):
        encoder.batch_size = 2  # encoded alike in both searches, a float's last bit apart otherwise
        blocks = list(search_blocks(index, encoder, queries, *args, block=block, **kwargs))
        assert [b.first for b in blocks] == list(range(0, len(queries), block or 2))
        return iter(blocks)

    monkeypatch.setattr(results_module, "search_blocks",
                        lambda *args, **kwargs: encoded_in_twos(*args, block=10 ** 6, **kwargs))
    whole = outputs()
    monkeypatch.setattr(results_module, "search_blocks", encoded_in_twos)  # a block: the encoder's batch
    assert outputs() == whole
    assert "MAP@4" in whole[0][0] and '"query": 1,' in whole[1][0] and "mih: " in "\n".join(whole[2][1])


def test_more_hits_than_a_search_holds_are_refused_before_the_search(tiny_path, tiny, trained, tmp_path,
                                                                       monkeypatch):
    """1,000 queries × 76k hits, every one held until printed, ran a 23-GB machine out of memory after six
    minutes. Hits are printed a block of queries at a time, so the list may be long; what is held is refused
    beyond MAX_HITS before anything is encoded: a query's hits, or with --html every query's (one page)."""
    from ucmfh.app import search_cli

    runner = CliRunner()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    n_texts = Index.load(out).count("txt")
    monkeypatch.setattr(search_cli, "MAX_HITS", 5 * len(tiny.query) - 1)
    page = tmp_path / "page.html"
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "5", "--json", "--html", str(page)])
    assert result.exit_code == 2 and result.stdout == "" and not page.exists(), result.output
    assert (f"Invalid value for -k: {len(tiny.query)} queries × 5 hits = {5 * len(tiny.query)} hits on one --html "
            f"page, more than {5 * len(tiny.query) - 1}") in result.output
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "5", "--json"])  # printed as found
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 5 * len(tiny.query)
    monkeypatch.setattr(search_cli, "MAX_HITS", n_texts - 1)  # k beyond the items counts what there is
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", str(10 * n_texts), "--ids",
                                  ",".join(str(int(i)) for i in tiny.query.ids[:1]), "--json"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert f"Invalid value for -k: {n_texts} hits of a query, more than {n_texts - 1}" in result.output
    monkeypatch.setattr(search_cli, "MAX_HITS", 5 * len(tiny.query))
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "5", "--json", "--html", str(page)])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 5 * len(tiny.query) and page.exists()


def test_user_errors_are_one_line(tiny_path, tiny, trained, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    np.save(tmp_path / "bad.npy", np.ones((2, 5), dtype=np.float32))
    (tmp_path / "queries.txt").write_text("a dog on a beach\n")
    (tmp_path / "text.npy").write_text("a dog on a beach\n")
    cases = [
        (["search", str(out), "-q", str(tmp_path / "queries.txt")], "queries.txt: neither an .npy file nor an HDF5"),
        (["search", str(out), "-q", tiny_path, "-k", "0"], "-k"),
        (["search", str(out), "-q", tiny_path, "--ids", "3, 5,3"], "Invalid value for --ids: id 3 is given twice"),
        (["search", str(tmp_path / "nope"), "-q", tiny_path], "no such index folder"),
        (["search", str(out), "-q", str(tmp_path / "nope.h5")], "nope.h5: no such query file"),
        (["search", str(out), "-q", str(tmp_path / "bad.npy"), "--query-modality", "text"],
         "5-d text features, the checkpoint"),
        # a text named .npy: numpy said 'This file contains pickled (object) data' and how to load it unsafely
        (["search", str(out), "-q", str(tmp_path / "text.npy")], "text.npy: not an .npy array (no NumPy header)"),
        (["search", str(out), "-q", tiny_path, "--ids", "999999"], "no item with id 999999"),
        # a flag that would do nothing, a count of substrings the codes cannot be cut into (found after building)
        (["search", str(out), "-q", tiny_path, "--candidates", "30"], "--candidates goes with --rerank"),
        (["search", str(out), "-q", tiny_path, "-k", "10", "--rerank", "cosine", "--candidates", "3"],
         "--candidates: 3 candidates re-ranked for the top 10: at least -k"),
        (["search", str(out), "-q", tiny_path, "--backend", "mih", "--substrings", "100"],
         "--substrings: 100 substrings for 16-bit codes: at most 16 (a bit each)"),
        # "1 6" was read as 16, and "" as no query at all
        (["search", str(out), "-q", tiny_path, "--ids", "1 6"], "--ids: expected comma-separated integers, got '1 6'"),
        (["search", str(out), "-q", tiny_path, "--ids", ""], "--ids: expected comma-separated integers, got ''"),
        (["search", str(out), "--text", "a dog"], "not a CLIP model"),
        (["index", tiny_path, "-c", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "ix2")], "no such checkpoint"),
        (["index", str(tmp_path / "nope.h5"), "-c", trained, "-o", str(tmp_path / "ix2")], "no such collection file"),
        # an empty path named no file: ': no such checkpoint', or the current folder searched as INDEX
        (["index", tiny_path, "-c", "", "-o", str(tmp_path / "ix2")],
         "Invalid value for '--checkpoint' / '-c': an empty path; give the file to read"),
        (["search", "", "-q", tiny_path], "Invalid value for 'INDEX...': an empty path; give the folder to read"),
        (["search", str(out), "-q", ""], "Invalid value for '--queries' / '-q': an empty path; give the file to read"),
        (["search", str(out), "-q", tiny_path, "--rerank", "seps", "--seps", ""],
         "Invalid value for '--seps': an empty path"),
        (["search", str(out), "--text", " "], "Invalid value for --text: an empty caption"),
        (["evaluate", "--codes", ""], "Invalid value for '--codes': an empty path"),
        (["rerank", "-d", tiny_path, "-c", "", "--seps", trained], "Invalid value for '--checkpoint' / '-c': an empty"),
    ]
    for args, expected in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.output and "Traceback" not in result.output, (args, result.output)
    # an index made by another checkpoint is refused
    torch.manual_seed(1)
    cfg = HashConfig(method="two-tower", n_bits=16, hidden=0)
    other = save_checkpoint(tmp_path / "other.pt", FeatureHasher(tiny.d_img, tiny.d_txt, cfg.n_bits, cfg.hidden).eval(),
                            None, cfg)
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-c", other])
    assert result.exit_code == 2 and "made by checkpoint" in result.output
    # the checkpoint the index records, moved away: named, with the option that gives it
    os.replace(trained, tmp_path / "moved.pt")
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path])
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {out}: its checkpoint {trained} is gone; give it with --checkpoint\n"


def test_a_page_never_replaces_the_files_an_index_records(tiny_path, trained, tmp_path):
    """The checkpoint an index was built from and the collections built into it are inputs of every search of it
    (its codes, its re-ranking's tokens), named in the index and not on the command line: --html onto one of
    them, even with --overwrite, wrote a page over it (an audit's find)."""
    collection = tmp_path / "coll.h5"
    shutil.copy(tiny_path, collection)
    out = tmp_path / "ix"
    assert CliRunner().invoke(main, ["index", str(collection), "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    before = {path: path.read_bytes() for path in (collection, Path(trained))}
    for page, says in ((trained, "an input of this command (INDEX's checkpoint)"),
                       (str(collection), "an input of this command (INDEX's collections)")):
        result = CliRunner().invoke(main, ["search", str(out), "-q", tiny_path, "-k", "2", "--html", page,
                                           "--overwrite"])
        assert result.exit_code == 2 and result.output == f"Error: --html {page}: is {page}, {says}; not written " \
                                                          "over, even with --overwrite\n", result.output
    assert all(path.read_bytes() == data for path, data in before.items())


def test_training_again_keeps_the_checkpoint_an_index_was_built_from(tiny_path, tmp_path):
    """The same train-hash command again reuses its finished checkpoint (never retrains or replaces
    it), so the index built from it still searches; a checkpoint that did change is named as changed."""
    runner = CliRunner()
    train = ["train-hash", "-d", tiny_path, "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "r.jsonl"),
             "-b", "16", "--method", "cca-itq", "--device", "cpu", "--quiet"]
    first = runner.invoke(main, train)
    assert first.exit_code == 0, first.output
    [checkpoint] = [line.split(": ", 1)[1] for line in first.output.splitlines() if line.startswith("checkpoint: ")]
    before = open(checkpoint, "rb").read()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", checkpoint, "-o", str(out), "--quiet"]).exit_code == 0
    again = runner.invoke(main, train)  # no --resume
    assert again.exit_code == 0, again.output
    assert f"already trained, reused {checkpoint}" in again.output and open(checkpoint, "rb").read() == before
    search = ["search", str(out), "-q", tiny_path, "-k", "3"]
    assert runner.invoke(main, search).exit_code == 0
    # a checkpoint replaced under the same name: the refusal says what happened
    other = runner.invoke(main, [*train, "--seed", "5"])
    [replacement] = [line.split(": ", 1)[1] for line in other.output.splitlines() if line.startswith("checkpoint: ")]
    with open(checkpoint, "wb") as f:
        f.write(open(replacement, "rb").read())
    refused = runner.invoke(main, search)
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert f"made by checkpoint {checkpoint} (sha256 " in refused.output
    assert "which has changed since" in refused.output and "build a new index" in refused.output


def test_an_interrupted_index_is_refused_until_the_same_command_finishes_it(tiny_path, tiny, trained, tmp_path):
    """Ctrl-C (a real SIGINT) during 'ucmfh index' says how far it got and how to go on (exit 130);
    search refuses the unfinished folder in one line; the same command finishes it, and search then works."""
    out = tmp_path / "ix"
    argv = [sys.executable, "-m", "ucmfh", "index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*argv, "--chunk-size", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env)

    def committed() -> int:
        try:
            return json.loads((out / "index.json").read_text())["sources"][0]["done"]
        except (OSError, ValueError, LookupError):
            return 0

    end = time.monotonic() + 120
    while committed() < 1:
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    n = len(tiny.query) + len(tiny.retrieval)
    assert proc.returncode == 130, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"interrupted: {out} holds ") and f"of {n} rows of {tiny_path}" in line
    assert "run the same command" in line or "same command has continued" in line
    runner = CliRunner()
    refused = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "3"])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert f"{out}: unfinished: its build from {tiny_path} stopped at row " in refused.output
    assert f"of {n} (interrupted, or under way in another process)" in refused.output
    assert "let a build under way finish, or run the same 'ucmfh index' command again" in refused.output
    with pytest.raises(UnfinishedIndex, match="unfinished"):  # the library searched the rows built (an audit's find)
        opened = Index.load(out)
        opened.search(np.ones((1, opened.n_bits)), 3, "txt")
    done = runner.invoke(main, argv[3:])
    assert done.exit_code == 0 and "resumed at row" in done.output, done.output
    assert runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "3"]).exit_code == 0
    assert Index.load(out).count("txt") == n


def test_search_metrics_are_those_of_the_printed_hits(tiny_path, tiny, trained, tmp_path):
    """R@K and MAP@k of a search run, without hand-parsing its JSON; one line when relevance is unknown."""
    runner = CliRunner()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "10", "--json", "--metrics"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    rel = np.array([r["relevant"] for r in rows]).reshape(len(tiny.query), 10)
    ap = [sum(rel[q, :i + 1].sum() / (i + 1) for i in range(10) if rel[q, i]) / max(rel[q].sum(), 1)
          for q in range(len(rel))]
    [line] = [line for line in result.stderr.splitlines() if "(relevant: " in line]
    head, figures = line.split("): ", 1)
    assert head == f"{len(rel)} queries (relevant: shared label"
    from ucmfh.search.results import format_scores  # one: '1 queries' (an audit's)

    assert format_scores({"k": 10, "queries": 1, "relevance": "same id", "map@10": 0.5}) == \
        "1 query (relevant: same id): MAP@10 0.5000"
    shown = dict(figure.rsplit(" ", 1) for figure in figures.split(", "))
    assert list(shown) == ["R@1", "R@5", "R@10", "MAP@10"]
    for cut in (1, 5, 10):
        assert float(shown[f"R@{cut}"]) == pytest.approx(100 * rel[:, :cut].any(1).mean(), abs=0.051)
    assert float(shown["MAP@10"]) == pytest.approx(np.mean(ap), abs=5e-5)
    assert "items at one distance by their position in the index" in result.stderr  # not the tie-aware figures
    # the file indexed whole holds each query's own pair (its /query split first: query row i at position i),
    # which its labels make relevant: said, as the field's figures never find it
    positions = np.array([r["position"] for r in rows]).reshape(len(tiny.query), 10)
    own = int((positions == np.arange(len(tiny.query))[:, None]).any(axis=1).sum())
    assert own > 0 and (f"{own} of the {len(rel)} queries find their own item (its pair in /query) among the hits"
                        in result.stderr), result.stderr
    part = tmp_path / "retrieval-only"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(part), "--split", "retrieval",
                                "--quiet"]).exit_code == 0
    alone = runner.invoke(main, ["search", str(part), "-q", tiny_path, "-k", "10", "--metrics"])
    assert alone.exit_code == 0 and "(relevant: shared label)" in alone.output and "own item" not in alone.output
    np.save(tmp_path / "q.npy", tiny.query.txt[:2].numpy())  # features alone: nothing to judge relevance by
    bare = runner.invoke(main, ["search", str(out), "-q", str(tmp_path / "q.npy"), "-m", "image", "--metrics"])
    assert bare.exit_code == 2 and bare.output.startswith("Error: --metrics: no relevance to score by: the queries "
                                                          "and the indexed items need labels (of the same classes), "
                                                          "or ids")


def test_validate_accepts_a_search_collection(tmp_path):
    """'ucmfh validate' on a collection to index says what it is, instead of '/train: missing group'."""
    import h5py

    path = tmp_path / "coll.h5"
    with h5py.File(path, "w") as f:
        f["image"], f["text"] = np.ones((5, 4), dtype=np.float32), np.ones((5, 3), dtype=np.float32)
        f["ids"] = np.arange(5)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0 and result.output == (
        f"{path}: a valid search collection for 'ucmfh index' (not a training dataset: no /train): 5 rows in /; "
        "image 4-d, text 3-d; ids\n")
    with h5py.File(path, "a") as f:  # a NaN: 'ucmfh index' refuses it, so validate does not call it valid
        f["text"][3, 1] = np.nan
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "text: 1 non-finite values in rows 0..4 (first: NaN at row 3, column 1)" in \
        result.output
    with h5py.File(path, "a") as f:  # labels of 2: the same ('validate' called the file valid, 'index' refused it)
        f["text"][3, 1] = 0.0
        f["labels"] = np.eye(5, 3, dtype=np.uint8) * 2
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and result.output == \
        f"Error: {path}: /labels: labels must be multi-hot 0/1 values (row 0 has 2)\n"
    with h5py.File(path, "a") as f:  # features at the root: the collection's own problem, not '/train: missing'
        del f["labels"]
        f.create_dataset("text_raw", data=["a caption"] * 4, dtype=h5py.string_dtype())
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and result.output == f"Error: {path}: /text_raw: 4 rows, /image has 5\n"
    # captions that are not UTF-8: 'validate' called the file valid, 'index' then refused it without a row
    with h5py.File(path, "a") as f:
        del f["text_raw"]
        f["text_raw"] = np.array([b"ok", b"ok", b"\xed\xa0\x80 a surrogate", b"\xff", b"x"], dtype="S20")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and result.output == \
        f"Error: {path}: /text_raw: row 2: not UTF-8 text (invalid continuation byte, byte 0)\n"
    with h5py.File(path, "a") as f:
        del f["image"], f["text"], f["text_raw"]
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and result.output == f"Error: {path}: /train: missing group (the file has: ['ids'])\n"


def hits(result):
    """The JSON rows of a search, by query: [[(id, position), ...], ...]."""
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    by_query = {}
    for row in rows:
        by_query.setdefault(row["query"], []).append((row["id"], row["position"]))
    return [by_query[q] for q in sorted(by_query)]


def test_one_index_folder_named_twice_is_refused(tiny_path, tiny, trained, tmp_path, monkeypatch):
    """'search IDX IDX/' returned every hit twice (and lowered R@5); now one line naming the folder. Two
    folders of different groups are still searched as one: k hits per query, each item once."""
    runner = CliRunner()
    out = tmp_path / "ix"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    for spellings in ([str(out), str(out)], [str(out), f"{out}/"], ["ix", str(out)]):
        result = runner.invoke(main, ["search", *spellings, "-q", tiny_path, "-k", "5", "--json"])
        assert result.exit_code == 2 and result.output == (
            f"Error: {out}: index folder named twice (as '{spellings[0]}' and '{spellings[1]}'); its items would be "
            "searched twice and every hit returned twice\n"), result.output
    one = runner.invoke(main, ["search", str(out), "-q", tiny_path, "-k", "5", "--json"])
    for split in ("query", "retrieval"):
        assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", split, "--split", split,
                                    "--quiet"]).exit_code == 0
    two = runner.invoke(main, ["search", "query", "retrieval", "-q", tiny_path, "-k", "5", "--json"])
    assert two.exit_code == 0, two.output
    found = hits(two)
    assert len(found) == len(tiny.query) and all(len(h) == 5 and len(set(h)) == 5 for h in found)
    assert found == hits(one)  # the same ids at the same positions as one index of both groups


def test_indexing_a_group_again_adds_nothing(tiny_path, tiny, trained, tmp_path):
    """'index' again with --split query or --split train (groups indexed already) added their items again;
    now it says so and the index keeps its rows; the hits of a search never repeat an item."""
    runner = CliRunner()
    out = str(tmp_path / "ix")
    n = len(tiny.query) + len(tiny.retrieval)
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", out, "--quiet"]).exit_code == 0
    for split, why in (("query", "it is indexed already"), ("train", "its items are those of /retrieval")):
        result = runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", out, "--split", split, "--quiet"])
        assert result.exit_code == 0, result.output
        assert result.output.splitlines()[:2] == [
            f"{out}: /{split} of {tiny_path} is not added again: {why}",
            f"{out}: {tiny_path} is already indexed ({len(getattr(tiny, split))} rows); nothing added"]
        index = Index.load(out)
        assert index.count("img") == index.count("txt") == n and len(index.sources) == 1
    result = runner.invoke(main, ["search", out, "-q", tiny_path, "-k", "10", "--json"])
    assert all(len(set(h)) == 10 for h in hits(result))
    # query first, then the default: retrieval alone is added
    grown = str(tmp_path / "grown")
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", grown, "--split", "query",
                                "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", grown, "--quiet"])
    assert f"{grown}: /query of {tiny_path} is not added again: it is indexed already" in result.output
    assert f"added {len(tiny.retrieval)} images and {len(tiny.retrieval)} texts" in result.output
    assert Index.load(grown).count("txt") == n


def test_every_index_folder_must_share_the_extraction(tiny_path, tiny, trained, tmp_path):
    """'search A B' checked A alone: B, of features by another extractor, was mixed in. Now one line naming
    both folders and where the two descriptions differ (not one common prefix)."""
    import h5py
    import shutil

    other = tmp_path / "other.h5"
    shutil.copy(tiny_path, other)
    with h5py.File(other, "a") as f:
        described = f.attrs["image_feature"]
        f.attrs["image_feature"] = described.replace("L2-normalised", "not normalised")
    runner = CliRunner()
    for name, path in (("A", tiny_path), ("B", str(other))):
        assert runner.invoke(main, ["index", path, "-c", trained, "-o", str(tmp_path / name), "--quiet"]).exit_code == 0
    result = runner.invoke(main, ["search", str(tmp_path / "A"), str(tmp_path / "B"), "-q", tiny_path])
    assert result.exit_code == 2 and result.output == (
        f"Error: {tmp_path / 'B'}: its image features were made by '…class+item latent, not normalised', but "
        f"those of {tmp_path / 'A'} by '…class+item latent, L2-normalised'; indexes searched as one must share "
        "their extractors\n")
    alone = runner.invoke(main, ["search", str(tmp_path / "B"), "-q", tiny_path, "-m", "image",
                                 "--query-modality", "image"])
    assert alone.exit_code == 2 and alone.output == (
        f"Error: {tiny_path}:/query: its image features were made by '…class+item latent, L2-normalised', but "
        "the index's by '…class+item latent, not normalised'; codes of features of different extractors are not "
        "comparable\n")


def test_hits_of_another_collection_are_never_relevant(tiny_path, tiny, trained, tmp_path):
    """Two index folders of two collection files that number and label their items alike: a hit of the other
    file is not relevant to the queries, whatever its id or labels; queries of a third file are not judged."""
    import shutil

    import h5py

    runner = CliRunner()
    files = {}
    for name in ("other", "third"):
        files[name] = tmp_path / f"{name}.h5"
        shutil.copy(tiny_path, files[name])
        with h5py.File(files[name], "a") as f:  # the same items, another file
            f.attrs["copy"] = name
    for folder, collection in (("own", tiny_path), ("other", files["other"])):
        result = runner.invoke(main, ["index", str(collection), "-c", trained, "-o", str(tmp_path / folder), "--quiet"])
        assert result.exit_code == 0, result.output
    searched = [str(tmp_path / "own"), str(tmp_path / "other")]
    result = runner.invoke(main, ["search", *searched, "-q", tiny_path, "-k", "10", "--json", "--metrics"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    own = Index.load(str(tmp_path / "own")).count("txt")
    others = [r for r in rows if r["position"] >= own]
    assert others and not any(r["relevant"] for r in others)  # before: relevant by their shared labels
    assert any(r["relevant"] for r in rows if r["position"] < own)
    assert "(relevant: shared label, in the queries' collection)" in result.stderr
    third = runner.invoke(main, ["search", *searched, "-q", str(files["third"]), "-k", "10", "--metrics"])
    assert third.exit_code == 2 and third.output == (
        "Error: --metrics: no relevance to score by: the index's text items come from 2 collection files, each "
        "numbering and labelling its items its own way, and the queries are read from none of them; query from one "
        "of them, or index the queries' file\n")


def test_queries_of_no_file_of_a_grown_index_are_refused_metrics_before_the_search(tiny_path, trained, tmp_path,
                                                                                 monkeypatch):
    """An index fed batch by batch: '--metrics' of queries from a file it does not hold worked while its hits came
    from one file, then failed after the whole search (93 s at 5 million items) once they came from two. Such
    queries are refused before the search, whichever files the hits would come from, for an index that records
    its sources' modalities and for an older one (its items' origins read); queries of one of its files are
    judged, and a one-file index as it is."""
    import shutil

    import h5py

    import ucmfh.search.results as results_module
    from ucmfh.search.folder import MANIFEST
    from ucmfh.search.results import collection_files

    runner = CliRunner()
    batch = tmp_path / "batch.h5"
    shutil.copy(tiny_path, batch)
    with h5py.File(batch, "a") as f:  # a later batch: other items, other ids
        for split in ("query", "retrieval", "train"):
            f[f"{split}/ids"][...] = f[f"{split}/ids"][...] + 1_000_000
    index = tmp_path / "index"
    assert runner.invoke(main, ["index", tiny_path, "-c", trained, "-o", str(index), "--split", "retrieval",
                                "--quiet"]).exit_code == 0
    queries = tmp_path / "queries.h5"
    shutil.copy(tiny_path, queries)
    one = runner.invoke(main, ["search", str(index), "-q", str(queries), "-k", "5", "--metrics"])
    assert one.exit_code == 0 and "(relevant: shared label)" in one.output, one.output  # one file: judged as it is
    assert runner.invoke(main, ["index", str(batch), "-c", trained, "-o", str(index), "--split", "retrieval",
                                "--quiet"]).exit_code == 0
    assert collection_files(Index.load(str(index)), "text") == [os.path.realpath(p) for p in (tiny_path, batch)]
    manifest = index / MANIFEST
    older = json.loads(manifest.read_text())
    for source in older["sources"]:
        del source["modalities"]
    searched = []
    real = results_module.Index.search
    monkeypatch.setattr(results_module.Index, "search", lambda *a, **kw: searched.append(1) or real(*a, **kw))
    for recorded in (True, False):
        if not recorded:  # an index built before sources recorded their modalities
            manifest.write_text(json.dumps(older))
            assert collection_files(Index.load(str(index)), "text") == [os.path.realpath(p) for p in (tiny_path, batch)]
        refused = runner.invoke(main, ["search", str(index), "-q", str(queries), "-k", "5", "--metrics"])
        assert refused.exit_code == 2 and refused.output.startswith(
            "Error: --metrics: no relevance to score by: the index's text items come from 2 collection files"), \
            refused.output
        assert not searched
        judged = runner.invoke(main, ["search", str(index), "-q", tiny_path, "-k", "5", "--metrics"])
        assert judged.exit_code == 0 and "(relevant: shared label, in the queries' collection)" in judged.output
        assert searched
        searched.clear()


def test_index_refuses_what_validate_refuses_before_making_anything(tiny_path, trained, tmp_path):
    """index read dataset files through checks of its own: a split lacking a dataset its later split has gave a
    traceback and left a folder that refused every later build; a dangling link, a traceback; query ids that
    repeat retrieval ids dropped retrieval images without a word; uint64 ids past int64 became one image. A
    dataset file now meets validate's checks first, and a collection file (no train split) open_collection's,
    both in one line, with no folder made."""
    import shutil

    import h5py

    def broken(name, change):
        path = tmp_path / f"{name}.h5"
        shutil.copy(tiny_path, path)
        with h5py.File(path, "r+") as f:
            change(f)
        return path

    def replace(f, name, value):
        del f[name]
        f[name] = value

    cases = [
        (broken("missing", lambda f: f.__delitem__("query/image")), "/query/image: missing dataset"),
        (broken("link", lambda f: replace(f, "query/text", h5py.SoftLink("/nowhere"))),
         "/query/text: a link to /nowhere, which is not there"),
        (broken("overlap", lambda f: replace(f, "query/ids", f["retrieval/ids"][: len(f["query/ids"])])),
         "ids also appear in /retrieval/ids"),
        (broken("huge", lambda f: replace(f, "query/ids", f["query/ids"][()].astype(np.uint64) + np.uint64(2**63))),
         "does not fit int64"),
    ]

    def collection_without(path, name):  # the query and retrieval groups alone: a collection file
        with h5py.File(path, "r+") as f:
            del f["train"]
            if name:
                del f[name]
        return path

    cases += [
        (collection_without(broken("coll-missing", lambda f: None), "query/image"),
         "/retrieval: has ['ids', 'image', 'labels', 'text'], an earlier group ['ids', 'labels', 'text']"),
        (collection_without(broken("coll-link", lambda f: replace(f, "retrieval/text", h5py.SoftLink("/none"))), None),
         "/retrieval/text: unreadable"),
        (collection_without(broken("coll-huge", lambda f: replace(
            f, "query/ids", f["query/ids"][()].astype(np.uint64) + np.uint64(2**63))), None), "do not fit int64"),
    ]
    for path, says in cases:
        out = tmp_path / f"ix-{path.stem}"
        result = CliRunner().invoke(main, ["index", str(path), "-c", trained, "-o", str(out), "--quiet"])
        assert result.exit_code == 2 and "Traceback" not in result.output, (path.stem, result.output)
        lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert len(lines) == 1 and says in lines[0] and str(path) in lines[0], (path.stem, result.output)
        assert not out.exists(), path.stem


def test_an_index_whose_manifest_lost_its_code_length_says_so(tiny_path, trained, tmp_path):
    """A manifest's n_bits changed (16 to 64 bits: one 64-bit word a code either way) sent a command-line user to
    a Python call ('features are encoded first: ucmfh.search.Encoder(...)')."""
    import json as json_module

    out = tmp_path / "ix"
    assert CliRunner().invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    manifest = json_module.loads((out / "index.json").read_text())
    manifest["n_bits"] = 64
    (out / "index.json").write_text(json_module.dumps(manifest))
    said = CliRunner().invoke(main, ["search", str(out), "-q", tiny_path, "-k", "3", "-m", "text"])
    assert said.exit_code == 2, said.output
    assert f"{out}: holds 64-bit codes, but the checkpoint that made it, " in said.output
    assert "makes 16-bit codes: its manifest has been changed or damaged; build the index again" in said.output
    # a manifest edited by hand: its fields of another type, or missing, said of the file in one line
    for damage, says in ((lambda m: m.update(n_bits="x"), "n_bits must be a whole number, got str 'x'"),
                         (lambda m: m.pop("modalities"), "no 'modalities'"),
                         (lambda m: m.update(n_bits=0), "n_bits must be in 1 .. 65535, got 0")):
        damaged = json_module.loads(json_module.dumps(manifest))
        damage(damaged)
        (out / "index.json").write_text(json_module.dumps(damaged))
        for args in (["search", str(out), "-q", tiny_path], ["index", tiny_path, "-c", trained, "-o", str(out)]):
            said = CliRunner().invoke(main, args)
            assert said.exit_code == 2 and said.output == f"Error: {out / 'index.json'}: damaged ({says}); build the " \
                                                          "index again\n", (args, said.output)


def test_a_collection_file_with_a_group_named_train_is_not_taken_for_a_dataset_file(tiny_path, trained, tmp_path):
    """A collection file's groups may have any names: one named train, beside another, was run through the
    dataset format's checks and refused ('/query: missing group')."""
    import h5py

    path = tmp_path / "coll.h5"
    with h5py.File(tiny_path, "r") as source, h5py.File(path, "w") as f:
        for group, split in (("train", "query"), ("more", "retrieval")):
            for name in ("image", "text", "ids"):
                f[f"{group}/{name}"] = source[f"{split}/{name}"][()]
    result = CliRunner().invoke(main, ["index", str(path), "-c", trained, "-o", str(tmp_path / "ix"), "--split",
                                       "train", "--quiet"])
    assert result.exit_code == 0 and "added" in result.output, result.output


def test_a_k_beyond_the_index_lists_every_item_and_says_so(tiny_path, tiny, trained, tmp_path):
    out = tmp_path / "ix"
    assert CliRunner().invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    n = Index.load(str(out)).count("txt")
    first = int(tiny.query.ids[0])
    result = CliRunner().invoke(main, ["search", str(out), "-q", tiny_path, "--ids", str(first), "-k", str(n + 5),
                                       "--json"])
    assert result.exit_code == 0, result.output
    assert f"note: -k {n + 5} is more than the {n} text items of the index; each query lists them all" in result.stderr
    assert len(result.stdout.splitlines()) == n
    texts = tmp_path / "texts.h5"  # an index of texts alone, searched for images: the refusal alone, no note
    with h5py.File(tiny_path, "r") as source, h5py.File(texts, "w") as f:
        f.attrs["text_feature"] = source.attrs["text_feature"]
        f["text"] = source["retrieval/text"][:20]
    assert CliRunner().invoke(main, ["index", str(texts), "-c", trained, "-o", str(tmp_path / "t"), "--quiet"]
                              ).exit_code == 0
    result = CliRunner().invoke(main, ["search", str(tmp_path / "t"), "-q", tiny_path, "--ids", str(first), "-k", "3",
                                       "-m", "image"])
    assert result.exit_code == 2 and result.output == f"Error: {tmp_path / 't'}: holds no image items to search\n"
