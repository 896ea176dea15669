"""FAISS backends of ``ucmfh search`` (approximate, never the default), against the exact search."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from test_search_cli import trained  # noqa: F401 - a fixture
from ucmfh.app.cli import main
from ucmfh.config import BackendConfig
from ucmfh.search import Index
from ucmfh.search.approx import faiss_index, recall
from ucmfh.search.shards import Shards

try:
    import faiss  # noqa: F401

    HAVE_FAISS = True
except ImportError:
    HAVE_FAISS = False
needs_faiss = pytest.mark.skipif(not HAVE_FAISS, reason="faiss-cpu not installed (the optional extra 'faiss')")


def pm1(rng, n, bits):
    return np.where(rng.random((n, bits)) < 0.5, -1, 1).astype(np.int8)


def true_distances(index: Index, queries: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Hamming distances of each query to the items at ``positions``, by unpacking the stored codes."""
    bits = np.unpackbits(index.codes("txt").view(np.uint8), axis=1)[:, : index.n_bits]
    q = (queries > 0).astype(np.uint8)
    return (bits[positions] != q[:, None, :]).sum(axis=2)


@needs_faiss
@pytest.mark.parametrize("bits", [64, 24])
def test_ivf_probing_every_list_gives_the_exact_distances(bits):
    rng = np.random.default_rng(0)
    r, q = pm1(rng, 4000, bits), pm1(rng, 40, bits)
    r[100:130] = r[5]  # ties
    index = Index(bits)
    index.add("txt", r)
    cfg = BackendConfig(backend="faiss-ivf", nlist=20, nprobe=20)
    for k in (1, 10, 100):
        ed, ep = index.search(q, k, "txt")
        ad, ap = index.search(q, k, "txt", backend=cfg)
        assert np.array_equal(ad, ed)
        assert np.array_equal(true_distances(index, q, ap), ad)
        assert all(len(set(row)) == k for row in ap)
        assert recall((ad, ap), (ed, ep))["distances"] == 1.0
    # fewer lists probed: an approximation, never better than exact
    ed, _ = index.search(q, 10, "txt")
    ad, ap = index.search(q, 10, "txt", backend=BackendConfig(backend="faiss-ivf", nlist=20, nprobe=1))
    found = ap >= 0
    assert (ad >= ed).all() and (ad[~found] == bits + 1).all()
    assert np.array_equal(true_distances(index, q, np.where(found, ap, 0))[found], ad[found])


@needs_faiss
def test_hnsw_results_are_valid_and_its_recall_is_reported():
    rng = np.random.default_rng(1)
    r, q = pm1(rng, 5000, 64), pm1(rng, 30, 64)
    index = Index(64)
    index.add("txt", r)
    exact = index.search(q, 10, "txt")
    d, p = index.search(q, 10, "txt", backend=BackendConfig(backend="faiss-hnsw", ef_search=128))
    assert p.shape == (30, 10) and (p >= 0).all() and (p < 5000).all()
    assert all(len(set(row)) == 10 for row in p)
    assert np.array_equal(true_distances(index, q, p), d)
    assert (np.diff(d, axis=1) >= 0).all()
    assert (d >= exact[0]).all()  # the r-th approximate distance is never below the exact r-th
    found = recall((d, p), exact)
    assert 0.5 <= found["ids"] <= 1.0 and 0.5 <= found["distances"] <= 1.0, found


@needs_faiss
def test_a_search_s_threads_leave_faiss_s_as_they_were():
    """--threads 1 (``threads=1``) set FAISS's OpenMP threads for the rest of the process: a library user's later
    FAISS work ran on one thread (the library audit's)."""
    rng = np.random.default_rng(2)
    index = Index(64)
    index.add("txt", pm1(rng, 500, 64))
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(3)
    try:
        for backend in ("faiss-hnsw", "faiss-ivf"):  # a build, then a search, each with threads of its own
            index.search(pm1(rng, 5, 64), 5, "txt", backend=BackendConfig(backend=backend), threads=1)
            assert faiss.omp_get_max_threads() == 3, backend
    finally:
        faiss.omp_set_num_threads(before)


@needs_faiss
def test_the_faiss_index_is_cached_in_the_folder_and_rebuilt_when_the_index_grows(tmp_path):
    rng = np.random.default_rng(2)
    index = Index(64)
    index.add("txt", pm1(rng, 3000, 64))
    index.save(tmp_path / "ix")
    cfg = BackendConfig(backend="faiss-ivf", nlist=16, nprobe=16)
    assert faiss_index(Index.load(tmp_path / "ix"), "txt", cfg)[1] == "built"
    files = sorted(os.listdir(tmp_path / "ix" / "faiss"))
    assert files == ["txt.ivf-nlist16.faiss", "txt.ivf-nlist16.faiss.lock"]
    reopened = Index.load(tmp_path / "ix")
    assert faiss_index(reopened, "txt", cfg)[1] == "cached"
    reopened.add("txt", pm1(rng, 500, 64))  # appended to the folder
    built, how = faiss_index(reopened, "txt", cfg)
    assert how == "built" and built.ntotal == 3500
    q = pm1(rng, 5, 64)
    assert np.array_equal(reopened.search(q, 20, "txt", backend=cfg)[0], reopened.search(q, 20, "txt")[0])
    # other settings: another file, the stale one removed
    faiss_index(Index.load(tmp_path / "ix"), "txt", BackendConfig(backend="faiss-ivf", nlist=8))
    assert sorted(os.listdir(tmp_path / "ix" / "faiss")) == ["txt.ivf-nlist8.faiss", "txt.ivf-nlist8.faiss.lock"]


@needs_faiss
def test_shards_map_faiss_positions_back_to_global_ones(tmp_path):
    rng = np.random.default_rng(3)
    r, q = pm1(rng, 3000, 64), pm1(rng, 10, 64)
    whole, a, b = Index(64), Index(64), Index(64)
    whole.add("txt", r)
    a.add("txt", r[:1000])
    b.add("txt", r[1000:])
    cfg = BackendConfig(backend="faiss-ivf", nlist=10, nprobe=10)
    d, p = Shards([a, b]).search(q, 15, "txt", backend=cfg)
    assert np.array_equal(d, whole.search(q, 15, "txt")[0])
    assert np.array_equal(true_distances(whole, q, p), d)


@pytest.fixture()
def cli_index(tiny_path, trained, tmp_path):
    out = tmp_path / "ix"
    assert CliRunner().invoke(main, ["index", tiny_path, "-c", trained, "-o", str(out), "--quiet"]).exit_code == 0
    return str(out)


@needs_faiss
def test_cli_backends(tiny_path, cli_index):
    runner = CliRunner()
    base = ["search", cli_index, "-q", tiny_path, "-k", "5", "--json", "-m", "text"]
    exact = runner.invoke(main, base)
    assert exact.exit_code == 0, exact.output
    n = Index.load(cli_index).count("txt")
    ivf = runner.invoke(main, [*base, "--backend", "faiss-ivf", "--nlist", "8", "--nprobe", "8", "--recall"])
    assert ivf.exit_code == 0, ivf.output
    rows = [[json.loads(line) for line in r.stdout.splitlines()] for r in (exact, ivf)]
    assert [x["distance"] for x in rows[0]] == [x["distance"] for x in rows[1]]
    assert "faiss-ivf recall@5 against exact search:" in ivf.output and "1.0000 of the distances" in ivf.output
    hnsw = runner.invoke(main, [*base, "--backend", "faiss-hnsw", "--ef-search", "32", "--recall"])
    assert hnsw.exit_code == 0 and "faiss-hnsw recall@5" in hnsw.output, hnsw.output
    # re-ranked: the recall of the candidates searched (--candidates), which the index's items may cut
    for candidates, depth in ((8, 8), (n + 5, n)):
        deep = runner.invoke(main, [*base, "--backend", "faiss-hnsw", "--recall", "--rerank", "cosine",
                                    "--candidates", str(candidates)])
        assert deep.exit_code == 0 and f"faiss-hnsw recall@{depth} against" in deep.output, deep.output
    assert os.path.exists(os.path.join(cli_index, "faiss", "txt.ivf-nlist8.faiss")) and n > 8
    wrong = runner.invoke(main, [*base, "--nprobe", "4"])
    assert wrong.exit_code == 2 and "--nprobe does not apply to --backend exact" in wrong.output
    # more lists than items: cut to the items, as before, and now said
    many = runner.invoke(main, [*base, "--backend", "faiss-ivf", "--nlist", str(n + 1), "--nprobe", str(n + 1)])
    assert many.exit_code == 0 and f"faiss-ivf: --nlist {n + 1} is more lists than the {n} items searched; {n} " \
                                   "lists" in many.stderr, many.stderr
    # every item asked for from one list of eight: what to do is said in the backend's own terms
    few = runner.invoke(main, [*base[:4], "-k", str(n), *base[6:], "--backend", "faiss-ivf", "--nlist", "8",
                               "--nprobe", "1"])
    assert few.exit_code == 2 and few.output.splitlines()[-1].endswith(
        "; ask for fewer, search exactly (the exact backend) or with more lists visited (nprobe, now 1)"), few.output


def test_without_faiss_the_backends_are_one_line(tiny_path, cli_index, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss raises ImportError
    out = CliRunner().invoke(main, ["search", cli_index, "-q", tiny_path, "--backend", "faiss-hnsw"])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert out.output.strip().splitlines() == ["Error: the FAISS backends need faiss-cpu: pip install 'ucmfh[faiss]'"]
