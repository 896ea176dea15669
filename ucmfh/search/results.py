"""Queries in, ranked items out: encode, search, optionally re-rank (cosine or SEPS), judge relevance, format."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ucmfh.config import APPROXIMATE_BACKENDS, BackendConfig, backend_config
from ucmfh.printable import printable
from ucmfh.search.build import Encoder, check_same_checkpoint, check_same_feature
from ucmfh.search.collection import Queries
from ucmfh.search.folder import NAMES, modality_name
from ucmfh.search.scan import check_k
from ucmfh.search.index import Index
from ucmfh.search.rerank import RERANKS, cosine_scores
from ucmfh.search.rerank import rerank as rerank_step
from ucmfh.search.shards import Shards


@dataclass
class Results:
    """The top-k items of each query. Shape: every array [Q, k'] with k' = min(k, items)."""

    queries: Queries
    modality: str  # what was searched
    distances: np.ndarray  # Hamming, int64
    positions: np.ndarray  # in the index (global over shards), int64
    ids: np.ndarray  # int64
    shown: List[List[Optional[str]]]  # caption or image path of each hit, when the index has them
    cosine: Optional[np.ndarray] = None  # re-ranking score, float64
    relevant: Optional[np.ndarray] = None  # bool, when relevance can be judged
    relevance: Optional[str] = None  # 'shared label' or 'same id'
    seps: Optional[np.ndarray] = None  # SEPS re-ranking score, float64
    seconds: Dict[str, float] = field(default_factory=dict)  # encode / search / rerank, all queries together
    backend: str = "exact"
    # an approximate backend's candidates against the exact ones ('ids', 'distances'), and how many ('depth')
    recall: Optional[Dict[str, float]] = None
    served: Optional[Dict[str, Any]] = None  # backend mih: queries served by multi-index hashing and by the scan
    # each hit's image file, a relative path resolved against its collection file's folder (the page's links)
    files: Optional[List[List[Optional[str]]]] = None
    # several index folders searched as one: the folder each hit is in (ids are an index's own: shards built from
    # files without ids number their items alike)
    shards: Optional[List[List[str]]] = None
    # by shared labels: how many queries find their own item among their hits (:func:`own_items_found`)
    own_found: Optional[int] = None
    # an image hit of an index without image paths: a text of its id there (a caption set's caption of that image, a
    # pair's text), which shows what the hit is (:func:`texts_of_ids`)
    described: Optional[List[List[Optional[str]]]] = None
    # the number of its first query among those searched: a block of :func:`search_blocks` (0: all of them)
    first: int = 0


RERANK_VALUES = 1 << 24  # candidates' embedding values re-ranked at a time: 128 MB in float64


def _cosine_in_blocks(index: Union[Index, Shards], modality: str, logits: np.ndarray,
                      positions: np.ndarray) -> np.ndarray:
    """:func:`cosine_scores` of each query's candidates, as many queries at a time as :data:`RERANK_VALUES`
    allows: every query's candidates at once took 80 MB a query at 70,000 candidates, and 500 queries ran a
    23-GB machine out of memory. Shape: logits [Q, E], positions [Q, M] -> [Q, M] float64."""
    n_q, m = positions.shape
    rows = max(1, RERANK_VALUES // max(1, m * logits.shape[1]))
    out = np.zeros((n_q, m), dtype=np.float64)
    for start in range(0, n_q, rows):
        out[start : start + rows] = cosine_scores(logits[start : start + rows],
                                                  index.take(modality, "embed", positions[start : start + rows]))
    return out


SEARCH_CANDIDATES = 1 << 22  # candidates found at a time (64 MB of distances + positions)


def _add_served(served: Dict[str, Any], block: Dict[str, Any], first: int) -> None:
    """Add what multi-index hashing and the scan served in a block of queries starting at query ``first`` to
    ``served``: counts summed, the scanned queries' indices shifted to the whole list's, what describes the index
    (its shards too small to probe) as the first block said it."""
    for name, value in block.items():
        if name == "scanned":
            served[name] = np.concatenate([served.get(name, np.zeros(0, dtype=np.int64)), first + np.asarray(value)])
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and name in served:
            served[name] += value
        else:
            served.setdefault(name, value)


def search_blocks(
    index: Union[Index, Shards],
    encoder: Encoder,
    queries: Queries,
    k: int,
    modality: str,
    rerank: Optional[str] = None,
    candidates: Optional[int] = None,
    device: str = "cpu",
    matcher: Optional[Any] = None,
    backend: Union[None, str, BackendConfig] = None,
    threads: Optional[int] = None,
    check_recall: bool = False,
    block: Optional[int] = None,
) -> Iterator[Results]:
    """The results of :func:`search_queries`, a block of ``block`` queries at a time (default: the encoder's
    ``batch_size``, whose multiples encode each query as the whole list does): each :class:`Results` holds the
    hits of ``queries.part(first, first + block)``, its ``first``, so that a long list of queries is searched,
    taken and printed without holding every hit (300,000 queries held 1.5 GB until the first line was printed).
    The arguments are checked when called, before any block is searched; no query: one empty block."""
    modality = modality_name(modality)
    k = check_k(k)
    check_same_checkpoint(index, encoder)
    check_same_feature(index, queries.modality, queries.feature, queries.source)
    encoder.check_dim(queries.features, queries.modality, queries.source)
    if index.count(modality) == 0:
        raise ValueError(f"{index.path}: holds no {NAMES[modality]} items to search")
    if rerank not in (None, *RERANKS):
        raise ValueError(f"rerank must be one of {RERANKS}, got {rerank!r}")
    if rerank == "cosine" and not index.has(modality, "embed"):
        lacking = next((s for s in getattr(index, "shards", [index])  # the folder without them, of several
                        if s.count(modality) and not s.has(modality, "embed")), index)
        raise ValueError(f"{lacking.path}: keeps no embeddings of its {NAMES[modality]} items; "
                         "build it with embeddings to re-rank by cosine")
    if rerank == "seps" and matcher is None:
        raise ValueError("re-ranking by SEPS needs a SEPS checkpoint")
    depth = k if rerank is None else (candidates if candidates is not None else 10 * k)
    if depth < k:
        raise ValueError(f"candidates must be >= k ({k}), got {depth}")
    block = encoder.batch_size if block is None else block
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a whole number >= 1, got {block!r}")
    config = backend_config(backend)
    return (_search_block(index, encoder, queries.part(first, first + block), first, depth, k, modality, rerank,
                          device, matcher, config, threads, check_recall)
            for first in range(0, max(len(queries), 1), block))  # no query: one empty search, as before


def _search_block(index: Union[Index, Shards], encoder: Encoder, queries: Queries, first: int, depth: int, k: int,
                  modality: str, rerank: Optional[str], device: str, matcher: Optional[Any], backend: BackendConfig,
                  threads: Optional[int], check_recall: bool) -> Results:
    """One block of :func:`search_blocks`: queries ``first`` onwards, encoded, searched, re-ranked and taken."""
    seconds = {}
    start = time.perf_counter()
    logits = encoder.encode(queries.features, queries.modality)
    seconds["encode"] = time.perf_counter() - start
    served: Dict[str, Any] = {}
    seconds.update(search=0.0, **({"rerank": 0.0} if rerank else {}))
    # re-ranked, a part of the block at a time, each keeping its top k: every query's candidates at once took 3.6 GB
    # at 100,000 candidates re-ranked by cosine (SEPS: its queries at once, their distinct candidates encoded once)
    rows = max(1, SEARCH_CANDIDATES // depth if rerank == "cosine" else len(logits))
    parts, recalls = [], []
    for at in range(0, max(len(logits), 1), rows):
        part = logits[at : at + rows]
        start = time.perf_counter()
        part_served: Dict[str, Any] = {}
        distances, positions = index.search(part, depth, modality, device, threads, backend, part_served)
        searched = positions.shape[1]  # the candidates: min(depth, items)
        _add_served(served, part_served, at)
        seconds["search"] += time.perf_counter() - start
        if backend.backend in APPROXIMATE_BACKENDS:
            missing = (positions < 0).any(axis=1)
            if missing.any():
                more = (f"a longer candidate list (ef_search, now {backend.ef_search})"
                        if backend.backend == "faiss-hnsw" else f"more lists visited (nprobe, now {backend.nprobe})")
                raise ValueError(f"{index.path}: {backend.backend} found fewer than {positions.shape[1]} items for "
                                 f"{int(missing.sum())} queries of a block of {len(missing)}; ask for fewer, search "
                                 f"exactly (the exact backend) or with {more}")
            if check_recall:
                from ucmfh.search.approx import recall as approx_recall

                recalls.append((len(part), approx_recall((distances, positions),
                                                         index.search(part, depth, modality, device, threads))))
        score = None
        if rerank is not None:
            start = time.perf_counter()
            if rerank == "cosine":
                score = _cosine_in_blocks(index, modality, part, positions)
            else:
                from ucmfh.search.seps_rerank import seps_scores

                score = seps_scores(index, modality, positions, queries, matcher)
            order, score = rerank_step(score, positions, k)
            distances, positions = (np.take_along_axis(a, order, axis=1) for a in (distances, positions))
            seconds["rerank"] += time.perf_counter() - start
        parts.append((distances, positions, score))
    distances, positions = (np.concatenate([part[i] for part in parts]) for i in (0, 1))
    score = np.concatenate([part[2] for part in parts]) if rerank is not None else None
    cosine, seps = (score, None) if rerank == "cosine" else (None, score)
    recall = None
    if recalls:  # the candidates compared: the top k, or those re-ranked; means over the block's queries
        recall = {name: math.fsum(n * r[name] for n, r in recalls) / max(1, len(logits)) for name in recalls[0][1]}
        recall["depth"] = searched
    ids = index.take(modality, "ids", positions)
    # a caption or a path where the hit has one (of shards, those that hold them)
    shown_column = next((name for name in ("text", "paths") if index.has(modality, name, anywhere=True)), None)
    flat = index.take(modality, shown_column, positions) if shown_column else [None] * positions.size
    width = positions.shape[1]
    shown = [list(flat[i * width : (i + 1) * width]) for i in range(positions.shape[0])]
    files = None
    if shown_column == "paths" and index.has(modality, "origin"):  # relative to the file they were read from
        places, place, _ = index.origins(modality, positions)
        resolved = [None if path is None else in_folder_of(places[int(where)]["path"], path)  # a shard without paths
                    for where, path in zip(place, flat)]
        files = [resolved[i * width : (i + 1) * width] for i in range(positions.shape[0])]
    relevant, relevance = None, None
    if queries.labels is not None and index.has(modality, "labels"):
        labels = index.take(modality, "labels", positions)  # [Q, k, C]
        if labels.shape[-1] == queries.labels.shape[1]:
            relevant = (labels & (queries.labels[:, None, :] != 0)).any(axis=2)
            relevance = "shared label"
    if relevant is None and queries.ids is not None:
        relevant = ids == queries.ids[:, None]
        relevance = "same id"
    if relevant is not None:
        relevant, relevance = _within_own_collection(index, modality, positions, queries, relevant, relevance)
    own_found = own_items_found(index, modality, positions, queries) if relevance and relevance.startswith(
        "shared label") else None
    shards = None
    if isinstance(index, Shards):
        folders = [str(s.path) for s in index.shards]
        shards = [[folders[s] for s in row] for row in index.shard_of(modality, positions)]
    described = None
    if modality == "img" and shown_column is None:  # an image hit shown by nothing: by a text of its id, if any
        texts = texts_of_ids(index, ids)
        described = None if texts is None else [texts[i * width : (i + 1) * width] for i in range(positions.shape[0])]
    return Results(queries, modality, distances, positions, ids, shown, cosine, relevant, relevance, seps, seconds,
                   backend.backend, recall, served if backend.backend == "mih" else None, files, shards, own_found,
                   described, first)


@dataclass
class Totals:
    """What the blocks of one search (:func:`search_blocks`) add up to, without their hits: the seconds of
    each stage, what multi-index hashing and the scan served, an approximate backend's recall, and the hits'
    relevance (bool [Q, k], a byte a hit), which :meth:`scores` judges."""

    queries: int = 0
    seconds: Dict[str, float] = field(default_factory=dict)
    served: Optional[Dict[str, Any]] = None
    relevant: List[np.ndarray] = field(default_factory=list)
    relevance: Optional[str] = None
    own_found: Optional[int] = None
    _recalls: List[Tuple[int, Dict[str, float]]] = field(default_factory=list, repr=False)

    def add(self, part: Results) -> None:
        """Count in the next block of queries."""
        for stage, s in part.seconds.items():
            self.seconds[stage] = self.seconds.get(stage, 0.0) + s
        if part.served is not None:
            self.served = {} if self.served is None else self.served
            _add_served(self.served, part.served, part.first)
        if part.recall is not None:
            self._recalls.append((len(part.positions), part.recall))
        if part.relevant is not None:
            self.relevant.append(part.relevant)
            self.relevance = part.relevance
        if part.own_found is not None:
            self.own_found = (self.own_found or 0) + part.own_found
        self.queries += len(part.positions)

    @property
    def recall(self) -> Optional[Dict[str, float]]:
        """An approximate backend's recall against exact search, a mean over every query of the blocks added
        (and how many candidates each compared, ``depth``); None without one."""
        if not self._recalls:
            return None
        n = max(1, sum(count for count, _ in self._recalls))
        last = self._recalls[-1][1]
        return {**{name: math.fsum(count * r[name] for count, r in self._recalls) / n for name in last
                   if name != "depth"}, "depth": last["depth"]}

    def scores(self, ks: Sequence[int] = (1, 5, 10)) -> Dict[str, Any]:
        """:func:`scores` of every query of the blocks added."""
        relevant = None
        if self.relevant and sum(len(r) for r in self.relevant) == self.queries:  # a block judged by none: none
            relevant = np.concatenate(self.relevant)
        return _scores(relevant, self.relevance, self.own_found, ks)


def search_queries(
    index: Union[Index, Shards],
    encoder: Encoder,
    queries: Queries,
    k: int,
    modality: str,
    rerank: Optional[str] = None,
    candidates: Optional[int] = None,
    device: str = "cpu",
    matcher: Optional[Any] = None,
    backend: Union[None, str, BackendConfig] = None,
    threads: Optional[int] = None,
    check_recall: bool = False,
) -> Results:
    """Encode ``queries`` with the index's checkpoint and return each one's top-k items of ``modality``.

    ``rerank='cosine'`` takes the ``candidates`` (default 10 k) nearest by Hamming distance and
    orders them by the cosine of the real-valued head outputs kept in the index; ``rerank='seps'``
    by the SEPS scores of ``matcher`` (:func:`ucmfh.search.seps_rerank.load_matcher`) on the token
    features of the queries' file and of the collections the items were built from. Ties by position.
    ``backend`` ``mih`` finds the same candidates by multi-index hashing (``served`` says which queries
    it served and which the scan did); a FAISS backend finds them approximately, and ``check_recall``
    then also runs the exact search and reports the candidates' recall against it. Every hit is held:
    :func:`search_blocks` gives them a block of queries at a time.
    """
    return merged(queries, search_blocks(index, encoder, queries, k, modality, rerank, candidates, device, matcher,
                                         backend, threads, check_recall))


def merged(queries: Queries, parts: Iterable[Results]) -> Results:
    """The blocks of :func:`search_blocks` (of ``queries``) as one :class:`Results`."""
    parts = list(parts)
    totals = Totals()
    for part in parts:
        totals.add(part)

    def joined(name: str) -> Any:
        values = [getattr(part, name) for part in parts]
        if any(value is None for value in values):
            return None
        return np.concatenate(values) if isinstance(values[0], np.ndarray) else [v for value in values for v in value]

    first = parts[0]
    return Results(queries, first.modality, joined("distances"), joined("positions"), joined("ids"), joined("shown"),
                   joined("cosine"), joined("relevant"), totals.relevance,
                   joined("seps"), totals.seconds, first.backend, totals.recall, totals.served, joined("files"),
                   joined("shards"), totals.own_found, joined("described"))


def texts_of_ids(index: Union[Index, Shards], ids: np.ndarray) -> Optional[List[Optional[str]]]:
    """For each of ``ids`` (any shape; flattened), the first text item of the index with that id (None where none
    has it): what an image hit is when the index keeps no path of it (a caption set's caption of that image, a
    labelled set's paired text). None where ids cannot tell: shards (each numbers its items its own way), an index
    without texts or ids, or one whose images and texts come from other files or several (ids are a file's own)."""
    if isinstance(index, Shards) or not index.count("txt") or not all(
            index.has(m, "ids") for m in ("img", "txt")) or not index.has("txt", "text"):
        return None
    files = {m: collection_files(index, m) for m in ("img", "txt")}
    if files["img"] != files["txt"] or (files["img"] is not None and len(files["img"]) != 1):
        return None
    text_ids = np.asarray(index.take("txt", "ids", np.arange(index.count("txt"))))
    flat = np.asarray(ids).ravel()
    # the texts of the hits' ids alone are sorted (every text's id, 25 million of them, was sorted a search)
    match = np.flatnonzero(np.isin(text_ids, flat))  # ascending: each id's first text comes first
    unique, first = np.unique(text_ids[match], return_index=True)
    first = match[first]
    if not len(unique):
        return [None] * len(flat)
    at = np.minimum(np.searchsorted(unique, flat), len(unique) - 1)
    found = unique[at] == flat
    texts = index.take("txt", "text", first[at[found]]) if found.any() else []
    out: List[Optional[str]] = [None] * len(flat)
    for where, text in zip(np.flatnonzero(found), texts):
        out[where] = text
    return out


def in_folder_of(collection: Optional[str], path: str) -> str:
    """An image path as the collection file that holds it means it: a relative one is relative to that file's
    folder (wherever the command runs); an absolute one, or one without a file, as it is."""
    if collection is None or os.path.isabs(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(collection)), path)


def collection_files(index: Union[Index, Shards], modality: str) -> Optional[List[str]]:
    """The collection files (real paths, each once, in build order) that the index's ``modality`` items were read
    from; None for an index that keeps no origins. Each source records its modalities since 2026-12-02; an older
    one's are read from its items' origins, a million at a time."""
    modality = modality_name(modality)
    if not index.has(modality, "origin"):
        return None
    files = []
    for shard in getattr(index, "shards", [index]):
        n = shard.count(modality)
        if not n:
            continue
        if all("modalities" in source for source in shard.sources):
            numbers = [i for i, source in enumerate(shard.sources) if modality in source["modalities"]]
        else:
            numbers = sorted({int(number) for start in range(0, n, ORIGINS_AT_ONCE) for number in np.unique(
                shard.take(modality, "origin", np.arange(start, min(start + ORIGINS_AT_ONCE, n)))[:, 0])})
        files += [os.path.realpath(shard.sources[number]["path"]) for number in numbers]
    return list(dict.fromkeys(files))


ORIGINS_AT_ONCE = 1 << 20  # items whose origins an older index's files are read from at a time


def relevance_problem(index: Union[Index, Shards], modality: str, queries: Queries) -> Optional[str]:
    """Why the hits of ``queries`` in the index's ``modality`` items cannot be judged relevant or not, or None: told
    before a search (``ucmfh search --metrics``), where it was found after it, and only once the hits of a growing
    index came from several of its files."""
    modality = modality_name(modality)
    labels = queries.labels is not None and index.has(modality, "labels") and \
        index.take(modality, "labels", np.zeros(0, dtype=np.int64)).shape[-1] == queries.labels.shape[1]
    if not labels and (queries.ids is None or not index.has(modality, "ids")):
        return ("no relevance to score by: the queries and the indexed items need labels (of the same classes), or "
                "ids")
    files = collection_files(index, modality)
    own = os.path.realpath(queries.path) if queries.path else None
    if files is not None and len(files) > 1 and own not in files:
        return (f"no relevance to score by: the index's {NAMES[modality]} items come from {len(files)} collection "
                "files, each numbering and labelling its items its own way, and the queries are read from none of "
                "them; query from one of them, or index the queries' file")
    return None


def _within_own_collection(index: Any, modality: str, positions: np.ndarray, queries: Queries,
                           relevant: np.ndarray, relevance: str) -> Tuple[Optional[np.ndarray], Optional[str]]:
    """Relevance judged where ids and labels mean the same: an index of several collection files numbers
    (and labels) each file's items its own way, so a hit of another file than the queries' is not relevant,
    whatever its id. An index of one file is judged as it is (the queries' file may be another export of the
    same items); one of several files when the queries' file is none of them cannot be judged (None), whichever
    files the hits happen to come from (:func:`relevance_problem`)."""
    files = collection_files(index, modality)
    if files is None or len(files) <= 1:  # an index built before items kept their origin: one collection or none
        return relevant, relevance
    own = os.path.realpath(queries.path) if queries.path else None
    if own not in files:
        return None, None
    places, place, _ = index.origins(modality, positions)
    from_own = np.array([os.path.realpath(p["path"]) == own for p in places])[place].reshape(relevant.shape)
    return relevant & from_own, f"{relevance}, in the queries' collection"


def own_items_found(index: Any, modality: str, positions: np.ndarray, queries: Queries) -> Optional[int]:
    """How many queries find their own item among their hits: the item of the query's row of the query's group
    and file (an image query's own text, a text query's own image), which shared labels make relevant, a hit the
    field's protocol (the query split against the retrieval split) never has: a file indexed whole holds its
    /query split. None where it cannot be told (queries not read from a file, an index without origins).
    Shape: positions [Q, k]."""
    if queries.path is None or queries.rows is None or not index.has(modality, "origin") or not positions.size:
        return None
    places, place, row = index.origins(modality, positions)
    own = os.path.realpath(queries.path)
    same = np.array([os.path.realpath(p["path"]) == own and p["group"] == queries.group for p in places])
    found = same[place] & (row == np.repeat(np.asarray(queries.rows), positions.shape[1]))
    return int(found.reshape(positions.shape).any(axis=1).sum())


def scores(results: Results, ks: Sequence[int] = (1, 5, 10)) -> Dict[str, Any]:
    """How well the queries were answered, from the hits' relevance: R@K in % (a relevant item among the
    first K, for each K in ``ks`` up to k) and MAP@k over the returned top k (each AP normalised by the
    relevant items among them, as ucmfh's MAP@k), means over the queries. ``ValueError`` when relevance
    cannot be judged (neither labels nor ids on both sides). Of a search's blocks: :meth:`Totals.scores`."""
    return _scores(results.relevant, results.relevance, results.own_found, ks)


def _scores(relevant: Optional[np.ndarray], relevance: Optional[str], own_found: Optional[int],
            ks: Sequence[int]) -> Dict[str, Any]:
    if relevant is None:
        raise ValueError("no relevance to score by: the queries and the indexed items need labels, or ids, and hits "
                         "of several collections are judged only when the queries come from one of them")
    rel = np.asarray(relevant, dtype=bool)
    k = rel.shape[1]
    out: Dict[str, Any] = {"queries": len(rel), "relevance": relevance, "k": k}
    for cut in ks:
        if cut <= k:
            out[f"recall@{cut}"] = 100.0 * math.fsum(rel[:, :cut].any(axis=1)) / max(len(rel), 1)
    hits = np.cumsum(rel, axis=1)
    ap = np.where(rel, hits / np.arange(1, k + 1), 0.0).sum(axis=1) / np.maximum(rel.sum(axis=1), 1)
    out[f"map@{k}"] = math.fsum(ap) / max(len(rel), 1)
    if own_found is not None:
        out["own_found"] = own_found
    return out


def format_scores(found: Dict[str, Any]) -> str:
    """One line of :func:`scores`."""
    k = found["k"]
    figures = [f"R@{key[7:]} {value:.1f}" for key, value in found.items() if key.startswith("recall@")]
    figures.append(f"MAP@{k} {found[f'map@{k}']:.4f}")
    queries = f"{found['queries']} quer{'y' if found['queries'] == 1 else 'ies'}"
    return f"{queries} (relevant: {found['relevance']}): {', '.join(figures)}"


def result_rows(results: Results) -> Iterator[List[Dict[str, Any]]]:
    """The JSON-able rows of each query in turn, one per hit: query, rank (1-based), id, distance, and what is
    known of it (with ``--backend mih``, ``searched_by``: ``mih`` or ``scan``). A query's rows are made as
    they are asked for, so a long list is written without holding every row."""
    q = results.queries
    column = "text" if results.modality == "txt" else "path"
    scanned = set(results.served["scanned"].tolist()) if results.served is not None else set()
    for i in range(results.positions.shape[0]):
        rows = []
        for r in range(results.positions.shape[1]):
            row: Dict[str, Any] = {"query": results.first + i, "rank": r + 1, "id": int(results.ids[i, r]),
                                   "position": int(results.positions[i, r]),
                                   "distance": int(results.distances[i, r])}
            if q.ids is not None:
                row["query_id"] = int(q.ids[i])
            if results.cosine is not None:
                row["cosine"] = round(float(results.cosine[i, r]), 6)
            if results.seps is not None:
                row["seps"] = round(float(results.seps[i, r]), 6)
            if results.shown[i][r] is not None:
                row[column] = results.shown[i][r]
            if results.described is not None and results.described[i][r] is not None:
                row["text_of_id"] = results.described[i][r]
            if results.shards is not None:
                row["index"] = results.shards[i][r]
            if results.relevant is not None:
                row["relevant"] = bool(results.relevant[i, r])
            if results.served is not None:
                row["searched_by"] = "scan" if i in scanned else "mih"
            rows.append(row)
        yield rows


def result_lines(results: Results, width: int = 72) -> Iterator[str]:
    """The plain-text table, a block of lines at a time: per query a heading and one line per hit (what the
    marks mean: :func:`legend`)."""
    q = results.queries
    for i in range(results.positions.shape[0]):
        head = f"query {results.first + i}"
        if q.ids is not None:
            head += f" (id {q.ids[i]})"
        described = q.describe(i)
        if described:
            head += f": {printable(described)}"
        lines = [f"{head}  [{NAMES[q.modality]} -> {NAMES[results.modality]}]"]
        cols = f"  {'rank':>4} {'id':>10} {'dist':>4}"
        if results.cosine is not None:
            cols += f" {'cosine':>7}"
        if results.seps is not None:
            cols += f" {'seps':>7}"
        if results.relevant is not None:
            cols += " rel"
        lines.append(cols + "  " + ("caption" if results.modality == "txt" else "path" if results.described is None
                                    else "a text of its id (the index keeps no image path)"))
        for r in range(results.positions.shape[1]):
            line = f"  {r + 1:>4} {results.ids[i, r]:>10} {results.distances[i, r]:>4}"
            if results.cosine is not None:
                line += f" {results.cosine[i, r]:>7.4f}"
            if results.seps is not None:
                line += f" {results.seps[i, r]:>7.4f}"
            if results.relevant is not None:
                line += "  * " if results.relevant[i, r] else "    "
            shown = results.shown[i][r] if results.described is None else results.described[i][r]
            if shown is not None:
                shown = printable(shown)
                shown = shown if len(shown) <= width else shown[: width - 1] + "…"
                line += "  " + shown
            lines.append(line.rstrip())
        yield "\n".join(lines)


def legend(relevance: Optional[str]) -> Optional[str]:
    """What :func:`result_lines`' mark means, printed after the table; None where no hit is judged."""
    return None if relevance is None else f"  * relevant ({relevance})"

