"""Tie-aware metrics (ties="expected"): the exact mean over every order of tied items.

Checked three ways against independent transcriptions: exhaustively over every order on tiny
cases, within 3 standard errors of 20,000 random tie orders on larger ones, and equal to
ties="index" where no score repeats. Both backends, both rankings, labels and ids.
"""
import itertools

import numpy as np
import pytest
import torch

from ucmfh.metrics import (
    backend,
    evaluate_caption_set,
    map_at_k,
    map_at_k_by_id,
    precision_recall_at_k,
    recall_at_ranks,
)
from ucmfh.metrics.histograms import iter_hamming_histograms
from ucmfh.metrics.native import native_kernels
from ucmfh.metrics.ties import expected_average_precision, expected_hits, hit_probability, iter_cosine_groups
from ucmfh.similarity import cosine_similarity_float64

BACKENDS = ["torch"] + (["native"] if native_kernels() else [])


def ap_at(rel, k):
    """AP@k of one ranked relevance list, as docs/reference.md §6 writes it."""
    hits, total = 0, 0.0
    for position, relevant in enumerate(rel[:k], 1):
        if relevant:
            hits += 1
            total += hits / position
    return total / hits if hits else 0.0


def every_order(groups):
    """Every distinct ranked relevance list of groups [(items, relevant)], each equally likely."""
    per_group = [[tuple(int(i in chosen) for i in range(n)) for chosen in itertools.combinations(range(n), r)]
                 for n, r in groups]
    for lists in itertools.product(*per_group):
        yield [x for g in lists for x in g]


def pm1(n, bits, generator):
    return torch.randint(0, 2, (n, bits), generator=generator).float() * 2 - 1


@pytest.mark.parametrize("seed", range(60))
def test_group_formulas_equal_the_mean_over_every_order(seed):
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(rng.integers(1, 5)):
        n = int(rng.integers(0, 6))
        groups.append((n, int(rng.integers(0, n + 1))))
    total = sum(n for n, _ in groups)
    if total == 0:
        groups.append((1, 1))
        total = 1
    n = torch.tensor([[g[0] for g in groups]])
    r = torch.tensor([[g[1] for g in groups]])
    orders = list(every_order(groups))
    for k in sorted({1, 2, 3, 5, total}):
        assert expected_average_precision(n, r, k).item() == pytest.approx(
            np.mean([ap_at(o, k) for o in orders]), abs=1e-12)
        assert expected_hits(n, r, [k]).item() == pytest.approx(np.mean([sum(o[:k]) for o in orders]), abs=1e-12)
        assert hit_probability(n, r, [k]).item() == pytest.approx(np.mean([any(o[:k]) for o in orders]), abs=1e-12)
    assert expected_average_precision(n, r, None).item() == pytest.approx(
        np.mean([ap_at(o, total) for o in orders]), abs=1e-12)


def mean_over_database_orders(metric, q, r, r_side):
    """The mean of ``metric(q, r[p], r_side[p])`` over every order p of a tiny database."""
    values = [np.asarray(metric(q, r[list(p)], r_side[list(p)]), dtype=np.float64)
              for p in itertools.permutations(range(r.shape[0]))]
    return np.mean(values, axis=0)


@pytest.mark.parametrize("name", BACKENDS)
def test_public_metrics_equal_the_mean_over_every_database_order(name):
    g = torch.Generator().manual_seed(3)
    q, r = pm1(5, 3, g), pm1(6, 3, g)  # 3 bits: 4 distances for 6 items, so ties everywhere
    ql = torch.randint(0, 2, (5, 3), generator=g)
    rl = torch.randint(0, 2, (6, 3), generator=g)
    qi, ri = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 0, 1, 2, 2, 2])
    with backend(name):
        for k in (1, 3, None):
            expected = mean_over_database_orders(lambda a, b, c: map_at_k(a, b, ql, c, k), q, r, rl)
            assert map_at_k(q, r, ql, rl, k, ties="expected") == pytest.approx(expected, abs=1e-12)
        curve = mean_over_database_orders(lambda a, b, c: precision_recall_at_k(a, b, ql, c, (1, 2, 4)), q, r, rl)
        assert np.allclose(precision_recall_at_k(q, r, ql, rl, (1, 2, 4), ties="expected"), curve, atol=1e-12)
        recall = mean_over_database_orders(lambda a, b, c: recall_at_ranks(a, b, qi, c, (1, 2, 5)), q, r, ri)
        assert np.allclose(recall_at_ranks(q, r, qi, ri, (1, 2, 5), ties="expected"), recall, atol=1e-12)
        by_id = mean_over_database_orders(lambda a, b, c: map_at_k_by_id(a, b, qi, c, 3), q, r, ri)
        assert map_at_k_by_id(q, r, qi, ri, 3, ties="expected") == pytest.approx(by_id, abs=1e-12)


def test_cosine_ties_equal_the_mean_over_every_database_order():
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-1, 2, (4, 2), generator=g).float()
    r = torch.randint(-1, 2, (6, 2), generator=g).float()  # small integers: many equal cosines
    ql, rl = torch.randint(0, 2, (4, 3), generator=g), torch.randint(0, 2, (6, 3), generator=g)
    ql[:, 0] = 1
    for k in (2, 4, None):
        expected = mean_over_database_orders(lambda a, b, c: map_at_k(a, b, ql, c, k, ranking="cosine"), q, r, rl)
        assert map_at_k(q, r, ql, rl, k, ranking="cosine", ties="expected") == pytest.approx(expected, abs=1e-12)
    qi, ri = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 1, 2, 3, 3])
    recall = mean_over_database_orders(lambda a, b, c: recall_at_ranks(a, b, qi, c, (1, 3), ranking="cosine"),
                                       q, r, ri)
    assert np.allclose(recall_at_ranks(q, r, qi, ri, (1, 3), ranking="cosine", ties="expected"), recall, atol=1e-12)


@pytest.mark.parametrize("sparse", [True, False], ids=["its items' relevance", "the block's"])
@pytest.mark.parametrize("by_id", [False, True])
def test_cosine_groups_the_same_for_every_block_of_retrieval_items(by_id, sparse, monkeypatch):
    """The run at the k-th similarity is counted in the pass that finds the lists: blocks whose own k-th is
    the final one, blocks below it, short last blocks. Against counts over the whole similarity matrix. On the
    CPU the items at a block's k-th alone are judged relevant or not, where they are few (SPARSE_TIES a query),
    else the whole block is (and on a GPU)."""
    from ucmfh.metrics import ties

    monkeypatch.setattr(ties, "SPARSE_TIES", ties.SPARSE_TIES if sparse else 0)
    judged, whole_block = [], ties._block_relevance
    monkeypatch.setattr(ties, "_block_relevance", lambda *a: judged.append(a) or whole_block(*a))
    g = torch.Generator().manual_seed(11)
    q = torch.randint(-1, 2, (9, 3), generator=g).float()
    r = torch.randint(-1, 2, (40, 3), generator=g).float()  # 26 distinct rows: long runs of one cosine
    if by_id:
        q_side, r_side = torch.randint(0, 5, (9,), generator=g), torch.randint(0, 5, (40,), generator=g)
        relevant = q_side[:, None] == r_side[None, :]
    else:
        q_side, r_side = torch.randint(0, 2, (9, 4), generator=g), torch.randint(0, 2, (40, 4), generator=g)
        relevant = (q_side @ r_side.T) > 0
    sim = cosine_similarity_float64(q, r)
    for k in (1, 3, 8, 17, 39, 40):
        kth = sim.sort(dim=1, descending=True).values[:, k - 1 : k]
        first = None
        for block in (1, 3, 7, 16, 40, 64):
            for chunk in (2, 9):
                parts = list(iter_cosine_groups(q, r, q_side, r_side, by_id, k, chunk, block))
                items = torch.cat([p[1] for p in parts])
                relevant_items = torch.cat([p[2] for p in parts])
                if first is None:
                    first = (items, relevant_items)
                assert torch.equal(items, first[0]) and torch.equal(relevant_items, first[1]), (k, block, chunk)
        last = (first[0] > 0).long().cumsum(dim=1).argmax(dim=1, keepdim=True)  # the last non-empty group
        assert torch.equal(first[0].gather(1, last)[:, 0], (sim == kth).sum(dim=1)), k
        assert torch.equal(first[1].gather(1, last)[:, 0], ((sim == kth) & relevant).sum(dim=1)), k
    assert bool(judged) != sparse  # 40 items: never more than 64 a query at a block's k-th


def random_order_ap(distance, relevant, k, draws, rng):
    """AP@k of one query under ``draws`` random tie orders, in numpy: sort by (distance, random key)."""
    keys = distance[None, :] + rng.random((draws, distance.shape[0])) * 0.5  # ties broken at random
    ranked = relevant[np.argsort(keys, axis=1)][:, :k]
    hits = np.cumsum(ranked, axis=1)
    terms = np.where(ranked, hits / np.arange(1, k + 1), 0.0)
    found = ranked.sum(axis=1)
    return np.where(found > 0, terms.sum(axis=1) / np.maximum(found, 1), 0.0)


@pytest.mark.parametrize("name", BACKENDS)
def test_expected_ap_within_three_standard_errors_of_random_tie_orders(name):
    g = torch.Generator().manual_seed(5)
    rng = np.random.default_rng(5)
    q, r = pm1(6, 8, g), pm1(400, 8, g)
    ql, rl = torch.randint(0, 2, (6, 5), generator=g), torch.randint(0, 2, (400, 5), generator=g)
    with backend(name):
        from ucmfh.metrics import average_precision_at_k

        exact = average_precision_at_k(q, r, ql, rl, 20, ties="expected").numpy()
        index = average_precision_at_k(q, r, ql, rl, 20).numpy()
    distance = ((8 - q @ r.T) / 2).numpy()
    relevant = ((ql.float() @ rl.float().T) > 0).numpy()
    moved = False
    for i in range(6):
        sample = random_order_ap(distance[i], relevant[i], 20, 20_000, rng)
        se = sample.std(ddof=1) / np.sqrt(sample.size)
        assert abs(exact[i] - sample.mean()) <= 3 * se + 1e-12, (i, exact[i], sample.mean(), se)
        moved |= abs(index[i] - exact[i]) > 10 * se
    assert moved  # the tie order matters on these data: the check above is not index order in disguise


@pytest.mark.parametrize("name", BACKENDS)
def test_without_repeated_scores_expected_equals_index_order(name):
    g = torch.Generator().manual_seed(6)
    q, r = torch.randn(30, 16, generator=g), torch.randn(200, 16, generator=g)
    ql, rl = torch.randint(0, 2, (30, 4), generator=g), torch.randint(0, 2, (200, 4), generator=g)
    for k in (1, 10, None):
        assert map_at_k(q, r, ql, rl, k, ranking="cosine", ties="expected") == pytest.approx(
            map_at_k(q, r, ql, rl, k, ranking="cosine"), abs=1e-12)
    # Hamming: every item at its own distance (8 bits, 9 items at distances 0..8 from the query)
    codes = torch.ones(9, 8)
    for d in range(9):
        codes[d, :d] = -1
    labels = torch.randint(0, 2, (9, 3), generator=g)
    query, query_labels = torch.ones(1, 8), torch.ones(1, 3, dtype=torch.int64)
    with backend(name):
        for k in (1, 4, None):
            assert map_at_k(query, codes, query_labels, labels, k, ties="expected") == pytest.approx(
                map_at_k(query, codes, query_labels, labels, k), abs=1e-12)


@pytest.mark.skipif(not native_kernels(), reason="the compiled kernels are not built")
def test_cut_histograms_are_exact_up_to_the_cut_and_both_backends_agree():
    g = torch.Generator().manual_seed(7)
    q, r = pm1(40, 12, g), pm1(3000, 12, g)
    ql, rl = torch.randint(0, 2, (40, 6), generator=g), torch.randint(0, 2, (3000, 6), generator=g)
    with backend("native"):
        full = list(iter_hamming_histograms(q, r, ql, rl))
        for k in (1, 7, 50, 2999):
            for (_, a_full, r_full), (_, a_cut, r_cut) in zip(full, iter_hamming_histograms(q, r, ql, rl, k=k)):
                before = a_full.cumsum(dim=1) - a_full
                needed = before < k  # groups up to and including the one holding the k-th item
                assert torch.equal(a_cut[needed], a_full[needed]) and torch.equal(r_cut[needed], r_full[needed])
    for k in (1, 50, None):
        values = []
        for name in BACKENDS:
            with backend(name):
                values.append(map_at_k(q, r, ql, rl, k, ties="expected"))
        assert max(values) - min(values) < 1e-12


def test_caption_set_both_databases_take_ties():
    g = torch.Generator().manual_seed(8)
    ids = torch.arange(20).repeat_interleave(3)
    img, txt = pm1(60, 4, g), pm1(60, 4, g)  # 4 bits: heavy ties
    split = 30
    kw = dict(k=5, ranks=(1, 5))
    index = evaluate_caption_set(img[:split], txt[:split], ids[:split], img[split:], txt[split:], ids[split:], **kw)
    exact = evaluate_caption_set(img[:split], txt[:split], ids[:split], img[split:], txt[split:], ids[split:],
                                 ties="expected", **kw)
    for database in ("test", "collection"):
        row = exact[database]
        assert row["ties"] == "expected" and index[database]["ties"] == "index"
        db_txt = txt[:split] if database == "test" else torch.cat([txt[:split], txt[split:]])
        db_ids = ids[:split] if database == "test" else torch.cat([ids[:split], ids[split:]])
        order = torch.from_numpy(np.argsort(db_ids.numpy(), kind="stable"))
        queries = torch.arange(0, split, 3)
        direct = recall_at_ranks(img[queries], db_txt[order], ids[queries], db_ids[order], (1, 5), ties="expected")
        assert [row["recall_i2t"]["1"], row["recall_i2t"]["5"]] == pytest.approx([100 * v for v in direct])
    assert exact["test"]["rsum"] != index["test"]["rsum"]


@pytest.mark.parametrize("ranking", ["cosine", "hamming"])
@pytest.mark.parametrize("by_id", [False, True])
@pytest.mark.parametrize("k", [3, 12, 200])
def test_one_ranking_gives_every_figure_of_both_tie_rules(ranking, by_id, k, monkeypatch):
    """scores_by_rule ranks each query chunk once for AP@k and the hits at R under both rules (a Hamming ranking:
    its groups once for both tie-aware figures): the figures of the functions that rank for one each, to the bit
    (cut-offs below, inside and past the ranks; long runs of ties)."""
    import ucmfh.metrics.ranking as ranking_module
    import ucmfh.metrics.ties as ties_module
    from ucmfh.metrics.ranking import average_precision_at_k, average_precision_by_id, hits_at_ranks, scores_by_rule

    g = torch.Generator().manual_seed(k)
    if ranking == "cosine":  # few distinct directions: runs of equal cosine
        q, r = torch.randint(-2, 3, (23, 3), generator=g).float(), torch.randint(-2, 3, (90, 3), generator=g).float()
    else:  # 4 bits: 5 distances
        q, r = pm1(23, 4, g), pm1(90, 4, g)
    if by_id:
        q_side, r_side = torch.randint(0, 9, (23,), generator=g), torch.randint(0, 9, (90,), generator=g)
        ranks = (1, 5, 10)
    else:
        q_side, r_side = torch.randint(0, 2, (23, 3), generator=g), torch.randint(0, 2, (90, 3), generator=g)
        ranks = ()
    chunks = dict(chunk_size=8, retrieval_chunk_size=32)
    passes = []
    for module, name in ((ties_module, "cosine_top_k_chunk"), (ranking_module, "iter_hamming_groups")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, **kw: passes.append(1) or real(*a, **kw))
    got = scores_by_rule(q, r, q_side, r_side, by_id=by_id, k=k, ranks=ranks, ranking=ranking,
                         rules=("index", "expected"), **chunks)
    # cosine: one ranking of each of the three query chunks, for both rules and every figure; Hamming: one pass of
    # groups for the tie-aware figures
    assert len(passes) == (3 if ranking == "cosine" else 1)
    monkeypatch.undo()
    ap = average_precision_by_id if by_id else average_precision_at_k
    for rule in ("index", "expected"):
        assert torch.equal(got[rule]["ap"], ap(q, r, q_side, r_side, k, ranking=ranking, ties=rule, **chunks)), rule
        if by_id:
            want = hits_at_ranks(q, r, q_side, r_side, ranks, ranking=ranking, ties=rule, **chunks)
            assert torch.equal(got[rule]["hits"], want), rule
        else:
            assert "hits" not in got[rule]


def test_ties_must_be_index_or_expected():
    q = torch.ones(2, 4)
    with pytest.raises(ValueError, match="ties must be one of"):
        map_at_k(q, q, torch.ones(2, 1), torch.ones(2, 1), 1, ties="random")


def test_the_one_ranking_s_edges():
    """No groups: no hit (argmax over no group raised); no tie rule, or ranks 0, refused rather than nothing."""
    from ucmfh.metrics.ranking import scores_by_rule

    assert torch.equal(hit_probability(torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, 0, dtype=torch.long),
                                       [1, 5]), torch.zeros(3, 2, dtype=torch.float64))
    q, r = torch.ones(2, 4), torch.ones(5, 4)
    ids_q, ids_r = torch.tensor([0, 1]), torch.tensor([0, 1, 1, 2, 0])
    with pytest.raises(ValueError, match="rules must name one tie rule at least"):
        scores_by_rule(q, r, ids_q, ids_r, by_id=True, rules=())
    with pytest.raises(ValueError, match="ranks must be a non-empty list"):
        scores_by_rule(q, r, ids_q, ids_r, by_id=True, ranks=0)
