"""Caption sets (docs/reference.md §7): several captions per image, relevance "same id".

Image→text queries are the unique query images (the first row of each id);
text→image queries are all query captions. Two databases, both reported:

* ``test``: the query split itself (the Flickr/COCO "1K test" protocol);
* ``collection``: query ∪ retrieval in id order (stable), the whole collection.

The database side is deduplicated by id where it holds images. Metrics:
Recall@1/5/10 in % (a query scores at K if any item with its id is among its
first K), rSum (the six recalls added), and MAP@K by id. Ties by database index, or with
``ties="expected"`` the exact mean over every order of tied items (:mod:`ucmfh.metrics.ties`).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ucmfh.data.format import first_of_each_id
from ucmfh.metrics.arguments import (DEFAULT_K, TIES, ArrayLike, Ranking, Ties, as_tensors, check_choice,
                                     check_ids)
from ucmfh.metrics.ap import mean, mean_columns
from ucmfh.metrics.ranking import scores_by_rule
from ucmfh.metrics.topk import first_k

DATABASES = ("test", "collection")
RANKS = (1, 5, 10)  # the recalls a caption set reports, R@1/5/10 (docs/reference.md §7)


def database_rows(name: str, query_ids: np.ndarray, retrieval_ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The rows of a caption set's database (docs/reference.md §7), in its order: its texts (every
    caption) and its images (the first row of each id). Rows are numbered across the query split, then
    the retrieval split (retrieval row r is ``len(query_ids) + r``). ``test``: the query split;
    ``collection``: query ∪ retrieval in id order, stable, so each id keeps its captions' order.
    Shape: ids [Q], [R] -> texts [T], images [I] int64."""
    if name == "test":
        txt, ids = np.arange(len(query_ids)), np.asarray(query_ids)
    elif name == "collection":
        ids = np.concatenate([query_ids, retrieval_ids])
        txt = np.argsort(ids, kind="stable")
        ids = ids[txt]
    else:
        raise ValueError(f"database must be one of {DATABASES}, got {name!r}")
    return txt.astype(np.int64), txt[first_of_each_id(ids)].astype(np.int64)


def image_of_each_caption(query_ids: np.ndarray) -> np.ndarray:
    """Each T→I query's (each caption's) image, numbered as the I→T queries are: the first row of each id, in
    order (:func:`caption_set_rows`), so that a bootstrap resamples the captions of one image together
    (:mod:`ucmfh.metrics.intervals`). Shape: [Q] -> [Q] int64."""
    ids = np.asarray(query_ids)
    first = ids[first_of_each_id(ids)]  # the I→T queries' ids, in their order
    order = np.argsort(first)
    return order[np.searchsorted(first, ids, sorter=order)].astype(np.int64)


def _take(query: torch.Tensor, retrieval: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Rows numbered across query then retrieval (:func:`database_rows`); no copy of retrieval for ``test``."""
    index = torch.from_numpy(rows).to(query.device)
    if len(rows) == 0 or rows.max() < len(query):
        return query[index]
    return torch.cat([query, retrieval.to(query.device)])[index]


def database(
    name: str,
    query: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    retrieval: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> Dict[str, torch.Tensor]:
    """Database ``name`` (:data:`DATABASES`) from (img, txt, ids) of the query and retrieval splits (the
    retrieval split is not read for ``test``): ``img``, ``img_ids`` (one row per id), ``txt``, ``txt_ids``
    (every caption)."""
    (q_img, q_txt, q_ids), (r_img, r_txt, r_ids) = query, retrieval
    txt, img = database_rows(name, q_ids.cpu().numpy(), r_ids.cpu().numpy())
    return {"img": _take(q_img, r_img, img), "img_ids": _take(q_ids, r_ids, img),
            "txt": _take(q_txt, r_txt, txt), "txt_ids": _take(q_ids, r_ids, txt)}


def databases(
    query: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    retrieval: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> Dict[str, Dict[str, torch.Tensor]]:
    """Both databases (:func:`database`), by name."""
    return {name: database(name, query, retrieval) for name in DATABASES}


def recall_of_lists(lists: torch.Tensor, query_ids: torch.Tensor, db_ids: torch.Tensor,
                    ranks: Sequence[int] = RANKS) -> Dict[str, float]:
    """Recall@R in % of ranked lists: the share of queries with a true match (the same id) among their
    first R. Shape: lists [Q, M] database rows, best first; query_ids [Q]; db_ids [N]."""
    hit = db_ids[lists] == query_ids[:, None]
    return {str(r): hit[:, :r].any(dim=1).sum().item() * 100.0 / max(len(hit), 1) for r in ranks}


def recall_from_scores(scores: torch.Tensor, query_ids: torch.Tensor, db_ids: torch.Tensor,
                       ranks: Sequence[int] = RANKS) -> Dict[str, float]:
    """Recall@R in % from a score matrix (higher first, ties by database index). Shape: [Q, N], [Q], [N]."""
    order = first_k(scores, max(ranks))[1]  # a stable descending sort's first columns, without the sort
    return recall_of_lists(order, query_ids, db_ids, ranks)


def evaluate_caption_set(
    query_img: ArrayLike,
    query_txt: ArrayLike,
    query_ids: ArrayLike,
    retrieval_img: ArrayLike,
    retrieval_txt: ArrayLike,
    retrieval_ids: ArrayLike,
    *,
    k: int = DEFAULT_K,
    ranks: Sequence[int] = RANKS,
    ranking: Ranking = "hamming",
    ties: Ties = "index",
    per_query: bool = False,
    recall: bool = True,
) -> Dict[str, Dict[str, object]]:
    """Both directions on both databases. Shape: codes or embeddings [N, d]; ids [N] int64.

    Returns ``{"test": row, "collection": row}``, each row with ``recall_i2t`` and
    ``recall_t2i`` (``{"1": %, "5": %, "10": %}``), ``rsum``, ``map_i2t``, ``map_t2i``
    (MAP@k by id), ``ties`` and the numbers of queries and database items. With ``per_query``,
    each row also holds ``per_query``: the scores the means are taken over, ``ap_i2t`` [Q_img],
    ``ap_t2i`` [Q_txt] (AP@k by id) and ``hits_i2t`` [Q_img, len(ranks)], ``hits_t2i`` (a true
    match among the first R: 0/1, or its probability with ``ties="expected"``), float64 tensors.
    ``recall=False``: MAP alone, no recall, rSum nor hits (what a validation score needs).
    """
    check_choice("ties", ties, TIES)
    return caption_set_rows((query_img, query_txt, query_ids), (retrieval_img, retrieval_txt, retrieval_ids), k=k,
                            ranks=ranks, ranking=ranking, rules=(ties,), per_query=per_query, recall=recall)[ties]


def caption_set_rows(
    query: Tuple[ArrayLike, ArrayLike, ArrayLike], retrieval: Tuple[ArrayLike, ArrayLike, ArrayLike], *, k: int,
    ranks: Sequence[int], ranking: Ranking, rules: Sequence[Ties], per_query: bool, recall: bool,
    on_queries: Optional[Callable[[int], None]] = None,
) -> Dict[str, Dict[str, Dict[str, object]]]:
    """:func:`evaluate_caption_set`'s rows of the (img, txt, ids) of the query and retrieval splits under each tie
    rule of ``rules``, ``{rule: {database: row}}``, from one ranking of each direction and database
    (:func:`ucmfh.metrics.ranking.scores_by_rule`, which tells ``on_queries`` of each chunk of queries ranked: in
    all, the distinct query images and the query captions, once per database)."""
    query_img, query_txt, query_ids, retrieval_img, retrieval_txt, retrieval_ids = as_tensors(*query, *retrieval)
    check_ids(query_img, retrieval_img, query_ids, retrieval_ids)  # the collection database is built from them:
    check_ids(query_txt, retrieval_txt, query_ids, retrieval_ids)  # ids of another length would shrink it
    queries = torch.from_numpy(first_of_each_id(query_ids.cpu().numpy())).to(query_ids.device)
    q_img, q_img_ids = query_img[queries], query_ids[queries]
    out: Dict[str, Dict[str, Dict[str, object]]] = {rule: {} for rule in rules}
    for name, db in databases((query_img, query_txt, query_ids), (retrieval_img, retrieval_txt, retrieval_ids)).items():
        kw = dict(by_id=True, k=k, ranks=ranks if recall else (), ranking=ranking, rules=rules, on_queries=on_queries)
        i2t = scores_by_rule(q_img, db["txt"], q_img_ids, db["txt_ids"], **kw)
        t2i = scores_by_rule(query_txt, db["img"], query_ids, db["img_ids"], **kw)
        for rule in rules:
            scores = {"ap_i2t": i2t[rule]["ap"], "ap_t2i": t2i[rule]["ap"]}
            row = {"database": name, "k": k, "ties": rule,
                   "map_i2t": mean(scores["ap_i2t"]), "map_t2i": mean(scores["ap_t2i"])}
            if recall:
                scores["hits_i2t"], scores["hits_t2i"] = i2t[rule]["hits"], t2i[rule]["hits"]
                row["recall_i2t"] = dict(zip(map(str, ranks), mean_columns(scores["hits_i2t"], scale=100.0)))
                row["recall_t2i"] = dict(zip(map(str, ranks), mean_columns(scores["hits_t2i"], scale=100.0)))
                row["rsum"] = sum(row["recall_i2t"].values()) + sum(row["recall_t2i"].values())
            out[rule][name] = {**row, "n_queries_i2t": int(q_img.shape[0]), "n_queries_t2i": int(query_txt.shape[0]),
                               "n_database_txt": int(db["txt"].shape[0]), "n_database_img": int(db["img"].shape[0])}
            if per_query:
                out[rule][name]["per_query"] = scores
    return out
