"""Every metric against a slow, obviously-correct per-query Python loop (docs/reference.md §6)."""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
import torch

from ucmfh.codes import pack_codes
from ucmfh.metrics import (
    average_precision_at_k,
    backend,
    map_at_all,
    map_at_k,
    map_at_k_cosine,
    native_kernels,
    pr_curve_hamming,
    precision_at_k,
    precision_within_radius,
    recall_at_k,
    recall_at_ranks,
    top_k,
)
from ucmfh.metrics.topk import hamming_top_k_torch

# ------------------------------------------------------------ slow references


def ref_ranking(q, retrieval, ranking="hamming"):
    """Indices of the retrieval set in ranking order, by a plain Python sort."""
    q = q.tolist()
    rows = retrieval.tolist()
    if ranking == "hamming":
        keys = [(sum(a != b for a, b in zip(q, r)), j) for j, r in enumerate(rows)]
    else:
        inv_q = 1.0 / max(math.sqrt(sum(a * a for a in q)), 1e-300)
        keys = []
        for j, r in enumerate(rows):
            dot = sum(a * b for a, b in zip(q, r))
            inv_r = 1.0 / max(math.sqrt(sum(b * b for b in r)), 1e-300)
            keys.append((-(dot * inv_q * inv_r), j))
    return [j for _, j in sorted(keys)]


def ref_relevant(ql, rl):
    ql = ql.tolist()
    return [any(a and b for a, b in zip(ql, r)) for r in rl.tolist()]


def ref_ap(rel_ranked, k):
    hits, total = 0, 0.0
    for p, rel in enumerate(rel_ranked[:k], start=1):
        if rel:
            hits += 1
            total += hits / p
    return total / hits if hits else 0.0


def ref_mean(values, keep, empty):
    vals = [v for v, kp in zip(values, keep) if kp or empty == "zero"]
    return sum(vals) / len(vals) if vals else 0.0


def ref_per_query(query, retrieval, ql, rl, ranking="hamming"):
    """(ranked relevance, total relevant) of each query."""
    out = []
    for i in range(query.shape[0]):
        rel = ref_relevant(ql[i], rl)
        order = ref_ranking(query[i], retrieval, ranking)
        out.append(([rel[j] for j in order], sum(rel)))
    return out


def ref_map(query, retrieval, ql, rl, k, ranking="hamming", empty="zero"):
    k = retrieval.shape[0] if k is None else k
    per = ref_per_query(query, retrieval, ql, rl, ranking)
    return ref_mean([ref_ap(r, k) for r, _ in per], [t > 0 for _, t in per], empty)


# ------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True, params=["native", "torch"])
def each_backend(request):
    """Every test runs on both CPU paths: the compiled kernels and the torch (GPU) path."""
    if request.param == "native":
        if native_kernels() is None:
            if os.environ.get("UCMFH_REQUIRE_NATIVE") == "1":
                pytest.fail("UCMFH_REQUIRE_NATIVE=1 but ucmfh.metrics._hamming is not built")
            pytest.skip("the compiled Hamming kernels are not built")
        if request.node.get_closest_marker("torch_path"):
            pytest.skip("tests an internal of the torch path")
    with backend(request.param):
        yield request.param


def make_case(seed, n_query, n_retrieval, n_bits, n_classes=5, p_label=0.25):
    """Random codes with many Hamming ties and labels with some empty rows."""
    g = torch.Generator().manual_seed(seed)
    query = torch.where(torch.rand(n_query, n_bits, generator=g) > 0.5, 1.0, -1.0)
    retrieval = torch.where(torch.rand(n_retrieval, n_bits, generator=g) > 0.5, 1.0, -1.0)
    retrieval[1::7] = retrieval[0]  # exact duplicates: ties at every distance
    ql = (torch.rand(n_query, n_classes, generator=g) < p_label).to(torch.uint8)
    rl = (torch.rand(n_retrieval, n_classes, generator=g) < p_label).to(torch.uint8)
    ql[0] = 0  # a query with no relevant item
    rl[:, -1] = 0
    ql[1] = 0
    ql[1, -1] = 1  # labelled, but its class occurs nowhere in the retrieval set
    return query, retrieval, ql, rl


CASES = [(0, 17, 60, 8), (1, 23, 97, 16), (2, 9, 40, 16)]


# ---------------------------------------------------------------------- tests


def test_hand_computed_case():
    q = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1]])
    r = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, -1], [1, 1, 1, 1], [-1, -1, 1, 1], [1, -1, 1, 1]])
    ql = torch.tensor([[1, 0], [0, 0]], dtype=torch.uint8)
    rl = torch.tensor([[0, 1], [1, 0], [1, 1], [1, 0], [0, 1]], dtype=torch.uint8)
    # ranking of query 0: items 0 (d0, no), 2 (d0, yes), 1 (d1, yes), 4 (d1, no), 3 (d2, yes)
    dist, idx = top_k(q, r, 5)
    assert idx[0].tolist() == [0, 2, 1, 4, 3]
    assert dist[0].tolist() == [0, 0, 1, 1, 2]
    ap_all = (1 / 2 + 2 / 3 + 3 / 5) / 3
    ap_3 = (1 / 2 + 2 / 3) / 2
    assert average_precision_at_k(q, r, ql, rl, k=None).tolist() == pytest.approx([ap_all, 0.0], abs=1e-12)
    assert map_at_k(q, r, ql, rl, k=3) == pytest.approx(ap_3 / 2, abs=1e-12)
    assert map_at_k(q, r, ql, rl, k=3, empty="skip") == pytest.approx(ap_3, abs=1e-12)
    assert map_at_k(q, r, ql, rl, k=1) == 0.0
    assert map_at_all(q, r, ql, rl, empty="skip") == pytest.approx(ap_all, abs=1e-12)
    assert precision_at_k(q, r, ql, rl, ks=[2], empty="skip") == pytest.approx([1 / 2])
    assert recall_at_k(q, r, ql, rl, ks=[2, 3], empty="skip") == pytest.approx([1 / 3, 2 / 3])
    curve = pr_curve_hamming(q, r, ql, rl, empty="skip")
    assert curve["radius"] == [0, 1, 2, 3, 4]
    assert curve["precision"] == pytest.approx([0.5, 0.5, 0.6, 0.6, 0.6])
    assert curve["recall"] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])
    assert precision_within_radius(q, r, ql, rl, radius=1, empty="skip") == pytest.approx(0.5)
    # no query with a relevant item: a mean of none is refused, where it read 0.0
    none = torch.zeros_like(ql)
    for score in (lambda: map_at_k(q, r, none, rl, k=3, empty="skip"),
                  lambda: precision_at_k(q, r, none, rl, ks=[2], empty="skip"),
                  lambda: precision_within_radius(q, r, none, rl, radius=1, empty="skip")):
        with pytest.raises(ValueError, match=r"^empty='skip' leaves no query: none shares a label with a retrieval"):
            score()
    assert map_at_k(q, r, none, rl, k=3) == 0.0  # empty='zero': each such query scores 0, as the field's code does


@pytest.mark.parametrize("seed,n_query,n_retrieval,n_bits", CASES)
@pytest.mark.parametrize("k", [1, 7, 50, None, 1000])
def test_map_matches_reference(seed, n_query, n_retrieval, n_bits, k):
    query, retrieval, ql, rl = make_case(seed, n_query, n_retrieval, n_bits)
    for empty in ("zero", "skip"):
        expected = ref_map(query, retrieval, ql, rl, k, empty=empty)
        assert map_at_k(query, retrieval, ql, rl, k=k, empty=empty) == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("seed,n_query,n_retrieval,n_bits", CASES)
def test_top_k_matches_reference_ranking(seed, n_query, n_retrieval, n_bits):
    query, retrieval, _, _ = make_case(seed, n_query, n_retrieval, n_bits)
    _, idx = top_k(query, retrieval, n_retrieval)
    for i in range(n_query):
        assert idx[i].tolist() == ref_ranking(query[i], retrieval)


@pytest.mark.parametrize("k", [5, 50, None])
def test_identical_for_every_chunk_size(k):
    query, retrieval, ql, rl = make_case(3, 31, 150, 16)
    base = average_precision_at_k(query, retrieval, ql, rl, k=k, chunk_size=10_000, retrieval_chunk_size=10_000)
    for chunk, r_chunk in [(1, 1), (3, 7), (8, 64), (31, 149), (1000, 13)]:
        ap = average_precision_at_k(query, retrieval, ql, rl, k=k, chunk_size=chunk, retrieval_chunk_size=r_chunk)
        assert torch.equal(ap, base)
        assert map_at_k(query, retrieval, ql, rl, k=k, chunk_size=chunk, retrieval_chunk_size=r_chunk) == map_at_k(
            query, retrieval, ql, rl, k=k
        )


@pytest.mark.parametrize("k", [10, None])
def test_packed_bits_equal_pm1(k):
    query, retrieval, ql, rl = make_case(4, 20, 80, 13)  # 13 bits: padding in the last byte
    pq = torch.from_numpy(pack_codes(query))
    pr = torch.from_numpy(pack_codes(retrieval))
    assert torch.equal(
        average_precision_at_k(pq, pr, ql, rl, k=k, retrieval_chunk_size=9),
        average_precision_at_k(query, retrieval, ql, rl, k=k),
    )
    assert pr_curve_hamming(pq, pr, ql, rl)["precision"][:14] == pr_curve_hamming(query, retrieval, ql, rl)["precision"]


def cosine_case(seed, n_query=15, n_retrieval=70, dim=3):
    """Small integer vectors: exact duplicates and equal cosines between different vectors."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randint(-1, 2, (n_query, dim), generator=g).float()
    retrieval = torch.randint(-1, 2, (n_retrieval, dim), generator=g).float()
    _, _, ql, rl = make_case(seed, n_query, n_retrieval, 8)
    return query, retrieval, ql, rl


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [1, 9, None])
def test_cosine_matches_reference(seed, k):
    query, retrieval, ql, rl = cosine_case(seed)
    expected = ref_map(query, retrieval, ql, rl, k, ranking="cosine")
    for chunk, r_chunk in [(1024, 16384), (4, 6)]:
        got = map_at_k_cosine(query, retrieval, ql, rl, k=k, chunk_size=chunk, retrieval_chunk_size=r_chunk)
        assert got == pytest.approx(expected, abs=1e-10)
    _, idx = top_k(query, retrieval, 70, ranking="cosine", retrieval_chunk_size=8)
    for i in range(query.shape[0]):
        assert idx[i].tolist() == ref_ranking(query[i], retrieval, "cosine")


def permuted_ties(seed, dim=256, n_copies=12):
    """A constant query and retrieval items that are permutations of one random vector, between
    others: every copy has the same cosine with the query, but a float sum meets its terms in
    another order for each copy."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(dim, generator=g)
    copies = torch.stack([base[torch.randperm(dim, generator=g)] for _ in range(n_copies)])
    others = torch.randn(n_copies, dim, generator=g)
    retrieval = torch.stack([row for pair in zip(others, copies) for row in pair])  # copies at odd indices
    return torch.full((3, dim), 0.7), retrieval


def test_cosine_is_the_same_whatever_the_summation_order():
    """What a device or a block shape changes (the order of a dot product's sum) changes no bit."""
    from ucmfh.similarity import cosine_similarity_float64
    g = torch.Generator().manual_seed(0)
    query, retrieval = torch.randn(7, 300, generator=g), torch.randn(200, 300, generator=g)
    base = cosine_similarity_float64(query, retrieval)
    perm = torch.randperm(300, generator=g)
    assert torch.equal(cosine_similarity_float64(query[:, perm], retrieval[:, perm]), base)
    assert torch.equal(torch.cat([cosine_similarity_float64(query, retrieval[i:i + 7]) for i in range(0, 200, 7)], 1),
                       base)
    exact = torch.nn.functional.normalize(query.double(), dim=1) @ torch.nn.functional.normalize(retrieval.double(), dim=1).T
    assert (base - exact).abs().max() < 1e-6  # the rounding moves a cosine below a float32 input's precision


def test_cosine_ranking_rounds_each_retrieval_block_once_where_it_keeps_them(monkeypatch):
    """Every query chunk reads every block of retrieval items: their exact rows are made once a ranking (kept),
    or again for each chunk past KEEP_BYTES; the same lists either way."""
    import ucmfh.metrics.topk as topk

    made = []
    real = topk.exact_rows
    monkeypatch.setattr(topk, "exact_rows", lambda x: made.append(x.shape[0]) or real(x))
    g = torch.Generator().manual_seed(3)
    query, retrieval = torch.randn(9, 6, generator=g), torch.randn(40, 6, generator=g)
    kept = top_k(query, retrieval, 12, ranking="cosine", chunk_size=2, retrieval_chunk_size=7)
    assert sorted(made) == sorted([1, 2, 2, 2, 2] + [5, 7, 7, 7, 7, 7])  # 5 query chunks, 6 blocks, once each
    made.clear()
    monkeypatch.setattr(topk, "KEEP_BYTES", 0)
    again = top_k(query, retrieval, 12, ranking="cosine", chunk_size=2, retrieval_chunk_size=7)
    assert len(made) == 5 + 5 * 6
    assert torch.equal(kept[0], again[0]) and torch.equal(kept[1], again[1])


@pytest.mark.parametrize("levels", [2, 5, 1000])
def test_the_first_k_by_score_are_a_stable_descending_sort_s_first_k(levels):
    """The cosine ranking's selection (``topk`` twice, no sort of the row) against the sort it replaces: every row
    shape, ``k`` below, at and above the row's length, few score levels (long runs of ties across the k-th)."""
    from ucmfh.metrics.topk import first_k

    g = torch.Generator().manual_seed(levels)
    for _ in range(200):
        rows, m, k = (int(torch.randint(1, hi, (1,), generator=g)) for hi in (5, 40, 50))
        scores = torch.randint(0, levels, (rows, m), generator=g).double() / levels - 0.5
        got_scores, got_columns = first_k(scores, k)
        want_scores, want_columns = scores.sort(dim=1, descending=True, stable=True)
        assert torch.equal(got_scores, want_scores[:, :k]) and torch.equal(got_columns, want_columns[:, :k])


@pytest.mark.parametrize("chunk,r_chunk", [(1024, 16384), (1, 5), (2, 3)])
def test_cosine_ties_of_permuted_items_go_by_index(chunk, r_chunk):
    query, retrieval = permuted_ties(1)
    copies = list(range(1, retrieval.shape[0], 2))
    sim, idx = top_k(query, retrieval, retrieval.shape[0], ranking="cosine", chunk_size=chunk,
                     retrieval_chunk_size=r_chunk)
    for row_sim, row_idx in zip(sim, idx):
        at = [row_idx.tolist().index(j) for j in copies]
        assert at == list(range(at[0], at[0] + len(copies)))  # one run, in index order
        assert len(set(row_sim[at].tolist())) == 1
    labels = torch.ones(retrieval.shape[0], 1, dtype=torch.uint8)
    labels[copies] = 0  # the tied run holds every irrelevant item: the tie-aware figure sees one group
    ql = torch.ones(3, 1, dtype=torch.uint8)
    assert map_at_k_cosine(query, retrieval, ql, labels, k=20, chunk_size=chunk, retrieval_chunk_size=r_chunk) == \
        pytest.approx(map_at_k_cosine(query, retrieval, ql, labels, k=20))


@pytest.mark.parametrize("ranking", ["hamming", "cosine"])
@pytest.mark.parametrize("empty", ["zero", "skip"])
def test_precision_recall_at_k_match_reference(ranking, empty):
    if ranking == "hamming":
        query, retrieval, ql, rl = make_case(5, 19, 90, 8)
    else:
        query, retrieval, ql, rl = cosine_case(5, 19, 90)
    ks = [1, 3, 10, 90, 200]
    per = ref_per_query(query, retrieval, ql, rl, ranking)
    keep = [t > 0 for _, t in per]
    exp_p = [ref_mean([sum(r[:k]) / min(k, 90) for r, _ in per], keep, empty) for k in ks]
    exp_r = [ref_mean([sum(r[:k]) / t if t else 0.0 for r, t in per], keep, empty) for k in ks]
    kw = dict(empty=empty, ranking=ranking, chunk_size=4, retrieval_chunk_size=11)
    assert precision_at_k(query, retrieval, ql, rl, ks=ks, **kw) == pytest.approx(exp_p, abs=1e-12)
    assert recall_at_k(query, retrieval, ql, rl, ks=ks, **kw) == pytest.approx(exp_r, abs=1e-12)


@pytest.mark.parametrize("empty", ["zero", "skip"])
def test_pr_curve_and_radius_match_reference(empty):
    query, retrieval, ql, rl = make_case(6, 21, 77, 8)
    n_bits = 8
    precision = {r: [] for r in range(n_bits + 1)}
    recall = {r: [] for r in range(n_bits + 1)}
    keep = []
    for i in range(query.shape[0]):
        rel = ref_relevant(ql[i], rl)
        dist = [sum(a != b for a, b in zip(query[i].tolist(), row)) for row in retrieval.tolist()]
        total = sum(rel)
        keep.append(total > 0)
        for r in range(n_bits + 1):
            returned = [j for j in range(len(dist)) if dist[j] <= r]
            good = sum(rel[j] for j in returned)
            precision[r].append(good / len(returned) if returned else 0.0)
            recall[r].append(good / total if total else 0.0)
    curve = pr_curve_hamming(query, retrieval, ql, rl, empty=empty, chunk_size=5, retrieval_chunk_size=10)
    assert curve["precision"] == pytest.approx([ref_mean(precision[r], keep, empty) for r in curve["radius"]])
    assert curve["recall"] == pytest.approx([ref_mean(recall[r], keep, empty) for r in curve["radius"]])
    assert precision_within_radius(query, retrieval, ql, rl, radius=2, empty=empty) == pytest.approx(
        ref_mean(precision[2], keep, empty)
    )


@pytest.mark.parametrize("ranking", ["hamming", "cosine"])
def test_recall_at_ranks_matches_reference(ranking):
    if ranking == "hamming":
        query, retrieval, _, _ = make_case(7, 25, 100, 8)
    else:
        query, retrieval, _, _ = cosine_case(7, 25, 100)
    retrieval_ids = torch.arange(100) // 5  # 5 captions per image
    query_ids = torch.randint(0, 22, (25,), generator=torch.Generator().manual_seed(0))  # ids 20, 21 have no match
    for empty in ("zero", "skip"):
        hits = {r: [] for r in (1, 5, 10)}
        keep = []
        for i in range(25):
            order = ref_ranking(query[i], retrieval, ranking)
            match = [int(retrieval_ids[j]) == int(query_ids[i]) for j in order]
            keep.append(any(match))
            for r in hits:
                hits[r].append(1.0 if any(match[:r]) else 0.0)
        got = recall_at_ranks(query, retrieval, query_ids, retrieval_ids, ranking=ranking, empty=empty, chunk_size=6)
        assert got == pytest.approx([ref_mean(hits[r], keep, empty) for r in (1, 5, 10)])


def test_unstable_sort_trap():
    """A full-retrieval argsort without a tie rule can differ; ours equals a stable numpy sort."""
    query, retrieval, ql, rl = make_case(8, 40, 300, 8)
    dist = (8 - query.numpy() @ retrieval.numpy().T) / 2
    rel = (ql.numpy().astype(float) @ rl.numpy().T.astype(float)) > 0
    aps = []
    for i in range(40):
        order = np.argsort(dist[i], kind="stable")[:50]
        aps.append(ref_ap(rel[i][order].tolist(), 50))
    assert map_at_k(query, retrieval, ql, rl, k=50) == pytest.approx(float(np.mean(aps)), abs=1e-12)


def test_validation_errors():
    query, retrieval, ql, rl = make_case(9, 5, 20, 8)
    with pytest.raises(ValueError, match="width"):
        map_at_k(query, retrieval[:, :4], ql, rl)
    with pytest.raises(ValueError, match="labels"):
        map_at_k(query, retrieval, ql[:3], rl)
    with pytest.raises(ValueError, match="empty"):
        map_at_k(query, retrieval, ql, rl, empty="nan")
    with pytest.raises(ValueError, match="ranking"):
        map_at_k(query, retrieval, ql, rl, ranking="dot")
    # counts of another type failed deep inside ('float' object cannot be interpreted as an integer), or ran as
    # another count (True as k=1, 2.5 as 2); chunk sizes of 0 ran on the compiled kernels' path
    ids, rids = torch.arange(5), torch.arange(20) % 5
    for call, said in ((lambda: map_at_k(query, retrieval, ql, rl, k=2.5), "k must be an integer, got 2.5"),
                       (lambda: map_at_k(query, retrieval, ql, rl, k=True), "k must be an integer, got True"),
                       (lambda: top_k(query, retrieval, "5"), "k must be an integer, got '5'"),
                       (lambda: recall_at_ranks(query, retrieval, ids, rids, (1.5,)), "ranks must be an integer"),
                       (lambda: precision_within_radius(query, retrieval, ql, rl, radius=1.5),
                        "radius must be an integer, got 1.5")):
        with pytest.raises(TypeError, match=re.escape(said)):
            call()
    for name in BACKENDS:
        with backend(name):
            with pytest.raises(ValueError, match=r"chunk sizes must be >= 1, got 0 and 65536"):
                map_at_k(query, retrieval, ql, rl, chunk_size=0)
    with pytest.raises(ValueError, match=r"ks must be a non-empty list of positive integers, got 5"):
        precision_at_k(query, retrieval, ql, rl, ks=5)
    # any sequence of counts, a numpy array too (a check of the sequence's truth refused it)
    assert precision_at_k(query, retrieval, ql, rl, ks=np.array([1, 5])) == precision_at_k(query, retrieval, ql, rl,
                                                                                          ks=[1, 5])
    from ucmfh.metrics import map_at_k_by_id

    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):  # ties by index refused it, tie-aware scored 0
        map_at_k_by_id(query, retrieval, ids, rids, k=0, ties="expected")
    # one query's codes, 1-D, were read as as many queries as it has bits ("1 query labels for 5 queries"); a
    # list was refused without saying which argument
    with pytest.raises(ValueError, match=re.escape("query and retrieval must be 2-D, a row an item (one query: "
                                                   "codes[None]), got (8,) and (20, 8)")):
        map_at_k(query[0], retrieval, ql[:1], rl)
    with pytest.raises(TypeError, match="^argument 1 of 4: expected a torch tensor or a numpy array, got list$"):
        map_at_k(query.tolist(), retrieval, ql, rl)


BACKENDS = ["torch"] + (["native"] if native_kernels() else [])


def test_real_valued_codes_are_read_by_their_signs_on_every_backend():
    """Codes read by sign, 0 as +1 (docs/reference.md §5): the torch path (a GPU's) ranked real values by their
    dot products, the compiled kernels by their signs, two figures of one set of codes (an audit's find)."""
    rng = np.random.default_rng(4)
    q, r = rng.standard_normal((50, 16)).astype(np.float32), rng.standard_normal((300, 16)).astype(np.float32)
    q[:, :4], r[:, :4] = np.maximum(q[:, :4], 0), np.maximum(r[:, :4], 0)  # exact zeros: +1
    ql, rl = (rng.random((50, 4)) < 0.4).astype(np.uint8), (rng.random((300, 4)) < 0.4).astype(np.uint8)
    signs = [np.where(x >= 0, 1.0, -1.0).astype(np.float32) for x in (q, r)]
    for name in BACKENDS:
        with backend(name):
            for ties in ("index", "expected"):
                assert map_at_k(q, r, ql, rl, ties=ties) == map_at_k(*signs, ql, rl, ties=ties), (name, ties)
            assert torch.equal(top_k(q, r, 20)[0], top_k(*signs, 20)[0]), name


def test_labels_ids_and_codes_the_metrics_cannot_read_are_refused():
    """±1 labels made every item relevant on one backend; float ids were all read as id 0; NaN codes were read as
    -1 by one backend, by their dot products by the other, and crashed a third path (an audit's finds)."""
    query, retrieval, ql, rl = make_case(9, 5, 20, 8)
    for name in BACKENDS:
        with backend(name):
            with pytest.raises(ValueError, match=r"query labels: values other than 0 and 1"):
                map_at_k(query, retrieval, 2 * ql - 1, rl)
            with pytest.raises(ValueError, match=r"query ids must be integers, got float64"):
                recall_at_ranks(query, retrieval, np.arange(5) * 0.1, np.arange(20) * 0.1)
            bad = query.clone()
            bad[0, 0] = float("nan")
            for ties in ("index", "expected"):
                with pytest.raises(ValueError, match=r"query codes: non-finite values \(NaN or infinity\)"):
                    map_at_k(bad, retrieval, ql, rl, ties=ties)
    assert map_at_k(query, retrieval, ql.bool(), rl.bool()) == map_at_k(query, retrieval, ql, rl)  # bool labels read
    # labels of no class scored 0.0 on the torch path, where the kernels refused them in their own words; ids None
    # was an AttributeError
    for name in BACKENDS:
        with backend(name):
            for score in (map_at_k, pr_curve_hamming, precision_at_k):
                with pytest.raises(ValueError, match=r"have no classes \(C = 0\)"):
                    score(query, retrieval, ql[:, :0], rl[:, :0])
            with pytest.raises(TypeError, match=r"query_ids: None; relevance by id needs an id of each item"):
                recall_at_ranks(query, retrieval, None, np.arange(20))
            with pytest.raises(ValueError, match=r"labels must be \[N, C\] with the same C, got \(5,\)"):
                map_at_k(query, retrieval, ql[:, 0], rl, empty="skip")  # said of the codes, where one query: codes[None]
            with pytest.raises(TypeError, match=r"argument 1 of 4: complex values \(complex64\)"):
                map_at_k(query.numpy() + 0j, retrieval, ql, rl)  # their real parts were read


def test_packed_codes_of_a_chunk_without_matching_ids_score_as_pm1():
    """Tie-aware recall by id of packed codes crashed ('cannot reshape tensor of 0 elements') where a query chunk
    held no query whose id the retrieval set has."""
    q = np.packbits(np.array([[1, 1], [0, 1]], bool), axis=1)
    r = np.packbits(np.array([[0, 1], [1, 0]], bool), axis=1)
    pm1 = [np.where(np.unpackbits(x, axis=1)[:, :2] > 0, 1.0, -1.0) for x in (q, r)]
    for chunk in (1, 256):
        got = recall_at_ranks(q, r, np.array([2, 1]), np.array([1, 0]), (1,), chunk, ties="expected")
        assert got == recall_at_ranks(*pm1, np.array([2, 1]), np.array([1, 0]), (1,), chunk, ties="expected") == [0.5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_equals_cpu():
    query, retrieval, ql, rl = make_case(10, 50, 400, 16)
    for k in (10, None):
        cpu = average_precision_at_k(query, retrieval, ql, rl, k=k)
        gpu = average_precision_at_k(query.cuda(), retrieval.cuda(), ql.cuda(), rl.cuda(), k=k)
        assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.torch_path
@pytest.mark.parametrize("n_bits", [8, 16])
@pytest.mark.parametrize("k", [1, 5, 50])
def test_group_preselection_exact_with_ties(n_bits, k):
    """Blocks with more than k groups of 32 take the group-maximum path; padding at odd block sizes."""
    query, retrieval, _, _ = make_case(11 + n_bits, 6, 3000, n_bits)
    retrieval[2000:2600] = retrieval[5]  # a long run of equal codes across group boundaries
    expected = [ref_ranking(query[i], retrieval)[:k] for i in range(6)]
    for r_chunk in (3000, 1700, 999):
        _, idx = top_k(query, retrieval, k, chunk_size=4, retrieval_chunk_size=r_chunk)
        assert idx.tolist() == expected


@pytest.mark.torch_path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_bits", [8, 16, 128])
def test_every_score_dtype_is_exact(dtype, n_bits):
    """The matmul dtype is chosen per device (bf16 on CPUs with native bf16, fp16 on GPUs): all are exact."""
    query, retrieval, _, _ = make_case(20 + n_bits, 5, 2500, n_bits)
    retrieval[1000:1500] = retrieval[3]
    expected = [ref_ranking(query[i], retrieval)[:40] for i in range(5)]
    for r_chunk in (2500, 1000, 777):
        dist, idx = hamming_top_k_torch(query, retrieval, 40, r_chunk, dtype=dtype)
        assert idx.tolist() == expected
        assert dist.tolist() == [[int((query[i] != retrieval[j]).sum()) for j in row] for i, row in enumerate(expected)]


@pytest.mark.torch_path  # no ranking here: once is enough
def test_metrics_importable_from_the_package():
    import ucmfh
    import ucmfh.metrics

    for name in ucmfh._METRICS:
        assert getattr(ucmfh, name) is getattr(ucmfh.metrics, name)
    with pytest.raises(AttributeError):
        ucmfh.no_such_metric


@pytest.mark.torch_path  # no ranking here: once is enough
def test_what_the_docs_use_is_importable_from_the_package_and_loads_on_first_use():
    """``from ucmfh import Index, build_index, fit_hashing, load_model, ...``: each the object of its home module;
    ``import ucmfh`` alone imports neither torch nor a submodule."""
    import importlib
    import subprocess
    import sys

    import ucmfh

    for name, home in ucmfh._HOMES.items():
        assert getattr(ucmfh, name) is getattr(importlib.import_module(home), name), name
    assert set(ucmfh.__all__) == {"__version__", *ucmfh._HOMES}
    light = subprocess.run([sys.executable, "-c", "import sys, ucmfh; print('torch' in sys.modules, "
                            "sorted(m for m in sys.modules if m.startswith('ucmfh.')))"],
                           capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False []"


@pytest.mark.torch_path  # no ranking here: once is enough
@pytest.mark.parametrize("n_classes", [5, 62, 70])
def test_relevant_counts(n_classes):
    """Counted over distinct label vectors (one integer key up to 62 labels, rows beyond)."""
    from ucmfh.metrics import relevant_counts

    g = torch.Generator().manual_seed(n_classes)
    ql = (torch.rand(30, n_classes, generator=g) < 0.05).to(torch.uint8)
    rl = (torch.rand(500, n_classes, generator=g) < 0.05).to(torch.uint8)
    rl[::3] = rl[0]
    rl[:, n_classes - 1] = (torch.arange(500) % 2).to(torch.uint8)  # the highest label bit is used
    ql[:, n_classes - 1] = 1
    expected = [sum(ref_relevant(ql[i], rl)) for i in range(30)]
    assert relevant_counts(ql, rl).tolist() == expected
    # a block of queries at a time, of at most COUNT_BLOCK query–vector pairs: the same counts at every block
    import ucmfh.metrics.relevance as relevance

    products = []
    matmul = torch.Tensor.__matmul__
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "__matmul__", lambda a, b: products.append(  # [q, C] @ [C, P]: q * P pairs
            a.shape[0] * b.shape[-1] if b.dim() == 2 else 0) or matmul(a, b))
        for block in (1, 7, 40, 10**6):
            products.clear()
            patch.setattr(relevance, "COUNT_BLOCK", block)
            assert relevant_counts(ql, rl).tolist() == expected, block
            vectors = len(torch.unique(rl, dim=0))
            assert max(products) <= max(block, vectors), (block, products)  # a query's row at least
    # what map_at_k refuses, refused here too (0.5 was counted, another C failed inside a matrix product)
    with pytest.raises(ValueError, match=r"^query labels: values other than 0 and 1"):
        relevant_counts(ql * 0.5, rl)
    with pytest.raises(ValueError, match=r"^labels must be \[N, C\] with the same C"):
        relevant_counts(ql[:, 1:], rl)


# ------------------------------------------------------- numpy arrays as input


def every_public_metric(query, retrieval, ql, rl, query_ids, retrieval_ids, emb_query, emb_retrieval):
    """Each public metric of ucmfh.metrics, called once on the given inputs."""
    import ucmfh.metrics as m

    args = (query, retrieval, ql, rl)
    return {
        "map_at_k": m.map_at_k(*args, k=9),
        "map_at_all": m.map_at_all(*args, empty="skip"),
        "map_at_k_cosine": m.map_at_k_cosine(emb_query, emb_retrieval, ql, rl, k=9),
        "average_precision_at_k": m.average_precision_at_k(*args, k=None),
        "precision_at_k": m.precision_at_k(*args, ks=[1, 5, 40]),
        "recall_at_k": m.recall_at_k(*args, ks=[1, 5, 40]),
        "precision_recall_at_k": m.precision_recall_at_k(*args, ks=[3, 100]),
        "recall_at_ranks": m.recall_at_ranks(query, retrieval, query_ids, retrieval_ids),
        "map_at_k_by_id": m.map_at_k_by_id(query, retrieval, query_ids, retrieval_ids, k=9),
        "evaluate_caption_set": m.evaluate_caption_set(query, query, query_ids, retrieval, retrieval, retrieval_ids),
        "pr_curve_hamming": m.pr_curve_hamming(*args),
        "precision_within_radius": m.precision_within_radius(*args, radius=1),
        "top_k": m.top_k(query, retrieval, 12),
        "relevant_counts": m.relevant_counts(ql, rl),
        "evaluate_direction": m.evaluate_direction(*args, query_ids, retrieval_ids, k=9),
        "evaluate_codes": m.evaluate_codes(query, query, retrieval, retrieval, ql, rl, query_ids, retrieval_ids, k=9),
    }


def assert_same(a, b, where="result"):
    """Exactly equal, tensors included (same dtype, same values)."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.parametrize("codes", ["pm1", "packed"])
@pytest.mark.parametrize("label_dtype", [np.uint8, np.bool_, np.int64])
def test_numpy_inputs_give_the_tensor_results(codes, label_dtype):
    """FAISS and scikit-learn users hold numpy arrays: every public metric takes them and gives
    exactly what the same data as tensors give (top_k still returns tensors)."""
    query, retrieval, ql, rl = make_case(12, 13, 70, 13)
    emb_query, emb_retrieval, _, _ = cosine_case(12, 13, 70)
    query_ids, retrieval_ids = torch.arange(13) % 5, torch.arange(70) // 7
    if codes == "packed":
        query, retrieval = torch.from_numpy(pack_codes(query)), torch.from_numpy(pack_codes(retrieval))
    tensors = (query, retrieval, ql, rl, query_ids, retrieval_ids, emb_query, emb_retrieval)
    arrays = [t.numpy() for t in tensors]
    arrays[2], arrays[3] = arrays[2].astype(label_dtype), arrays[3].astype(label_dtype)
    expected = every_public_metric(*tensors)
    got = every_public_metric(*arrays)
    import ucmfh.metrics

    not_metrics = {"backend", "set_backend", "native_kernels", "codes_file_row", "evaluate_codes_file"}
    assert set(got) == set(ucmfh.metrics.__all__) - not_metrics
    assert_same(got, expected)
    assert all(isinstance(t, torch.Tensor) for t in got["top_k"])


@pytest.mark.torch_path  # no ranking here: once is enough
def test_numpy_arrays_are_shared_not_copied():
    """Arrays torch can view are shared (zero-copy); the others are copied once, without warnings."""
    import warnings

    from ucmfh.metrics.arguments import as_tensor

    codes = np.where(np.random.default_rng(0).random((6, 8)) > 0.5, 1.0, -1.0).astype(np.float32)
    for view in (codes, codes[:, ::2]):  # contiguous, and strided
        t = as_tensor(view)
        assert t.data_ptr() == view.__array_interface__["data"][0]
        assert np.array_equal(t.numpy(), view)
    read_only = codes.copy()
    read_only.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for awkward in (codes[::-1], read_only, codes.astype(">f4")):
            t = as_tensor(awkward)
            assert t.dtype == torch.float32 and np.array_equal(t.numpy(), awkward)
    tensor = torch.from_numpy(codes)
    assert as_tensor(tensor) is tensor and as_tensor(None) is None
    with pytest.raises(TypeError, match="numpy array"):
        as_tensor(codes.tolist())


def test_codes_of_zero_and_one_are_refused_not_read_as_all_bits_set():
    """0/1 (or bool) codes, the field's usual storage, read by sign would set every bit: every distance 0 and
    MAP at chance's, without a word (a library user's walk scored 0.5896 where the ±1 codes give 0.5720)."""
    import ucmfh
    from ucmfh.bits import as_words

    rng = np.random.default_rng(0)
    codes = np.where(rng.random((20, 16)) > 0.5, 1.0, -1.0).astype(np.float32)
    labels = (rng.random((20, 3)) > 0.5).astype(np.uint8)
    ucmfh.map_at_k(codes, codes, labels, labels)  # ±1: scored
    for bad in ((codes > 0).astype(np.float32), codes > 0, (codes > 0).astype(np.int8)):
        with pytest.raises(ValueError, match=r"query codes: codes of 0 and 1, .* give ±1 codes \(2 \* codes - 1\)"):
            ucmfh.map_at_k(bad, codes, labels, labels)
        with pytest.raises(ValueError, match="retrieval codes: codes of 0 and 1"):
            ucmfh.top_k(codes, torch.as_tensor(bad), 5)
        with pytest.raises(ValueError, match="image codes: codes of 0 and 1"):
            as_words(bad, 16, "image codes")
    # all 0 (a blank query's features): not called 'codes of 0 and 1', which it has no 1 of
    with pytest.raises(ValueError, match=r"^query codes: every value of the first rows is 0, where a bit is the "
                                         r"code's sign .* give ±1 codes or real values$"):
        ucmfh.map_at_k(np.zeros_like(codes), codes, labels, labels)
    # stored as uint8, 0/1 codes (or labels) would be read as packed bits: 8 a byte, 16 bits as 128
    zero_one = (codes > 0).astype(np.uint8)
    with pytest.raises(ValueError, match=r"^query codes: uint8 is read as packed bits .* every byte of the "
                                         r"first rows is 0 or 1.*packbits"):
        ucmfh.map_at_k(zero_one, zero_one, labels, labels)
    with pytest.raises(ValueError, match="retrieval codes: uint8 is read as packed bits"):
        ucmfh.map_at_k(np.packbits(codes > 0, axis=1), labels[:, :2], labels, labels)  # labels where codes go
    with pytest.raises(ValueError, match="image codes: uint8 is read as packed bits"):
        as_words(zero_one[:, :2], 16, "image codes")
    packed = np.packbits(codes > 0, axis=1)  # packed as asked: scored as the ±1 codes are
    # codes of no bits, or more than the kernels count: one refusal on every path (torch scored both; the
    # kernels said "bad sizes: nq=30 nr=30 words=0 n_bits=0")
    for width in (0, 70000):
        for path in ("torch", "auto"):
            with backend(path):
                wide = np.ones((3, width), np.float32)
                with pytest.raises(ValueError, match=rf"^query and retrieval codes: codes of {width} bits; a code has "
                                                     r"1 to 65,535 bits$"):
                    ucmfh.map_at_k(wide, wide, labels[:3], labels[:3])
    assert ucmfh.map_at_k(packed, packed, labels, labels) == ucmfh.map_at_k(codes, codes, labels, labels)
    assert as_words(np.zeros((4, 2), np.uint8), 16).sum() == 0  # all bits clear (a collapsed code) is no 0/1 code


def test_queries_of_an_id_the_database_lacks_are_left_out_alike_by_recall_and_map_by_id():
    """``empty="skip"`` leaves out a query whose id no retrieval item has, in R@K and in MAP@K by id alike (the
    latter took no ``empty``: a TypeError where map_at_k and recall_at_ranks take it); ``"zero"`` scores it 0."""
    from ucmfh.metrics import map_at_k_by_id

    g = torch.Generator().manual_seed(3)
    query = torch.randint(0, 2, (6, 16), generator=g) * 2 - 1
    retrieval = torch.randint(0, 2, (30, 16), generator=g) * 2 - 1
    ids, rids = torch.tensor([0, 1, 2, 3, 7, 9]), torch.arange(30) % 5  # ids 7 and 9 occur nowhere in retrieval
    kept = ids < 5
    for ties in ("index", "expected"):
        every = map_at_k_by_id(query, retrieval, ids, rids, k=10, ties=ties)
        skipped = map_at_k_by_id(query, retrieval, ids, rids, k=10, empty="skip", ties=ties)
        alone = map_at_k_by_id(query[kept], retrieval, ids[kept], rids, k=10, ties=ties)
        assert skipped == pytest.approx(alone, abs=1e-12) and every == pytest.approx(alone * 4 / 6, abs=1e-12)
        assert recall_at_ranks(query, retrieval, ids, rids, (1, 5), empty="skip", ties=ties) == pytest.approx(
            recall_at_ranks(query[kept], retrieval, ids[kept], rids, (1, 5), ties=ties), abs=1e-12)
    with pytest.raises(ValueError, match="empty"):
        map_at_k_by_id(query, retrieval, ids, rids, empty="drop")
