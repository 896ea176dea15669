"""All retrieval metrics for both directions (I→T, T→I) as one JSON-able dict."""
from __future__ import annotations

import inspect
import json
import os
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from ucmfh.config import EXPECTED
from ucmfh.metrics.arguments import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_K,
    DEFAULT_RETRIEVAL_CHUNK_SIZE,
    ArrayLike,
    Empty,
    Ranking,
    as_tensors,
    check_ids,
)
from ucmfh.metrics.collapse import distinct_codes
from ucmfh.metrics.captions import DATABASES
from ucmfh.metrics.captions import database as caption_database
from ucmfh.metrics.radius import pr_curve_hamming
from ucmfh.metrics.ranking import map_at_k, precision_recall_at_k, recall_at_ranks
from ucmfh.metrics.relevance import id_match_counts
from ucmfh.utils import resolve_device

DEFAULT_KS = (1, 5, 10, 20, 50, 100, 200, 500, 1000)
DIRECTIONS = {"i2t": ("img", "txt"), "t2i": ("txt", "img")}
ORDER = {"hamming": "Hamming distance ascending", "cosine": "cosine similarity descending"}
NO_ID_MATCH = "not computed: no query id occurs in the retrieval set"


def evaluate_direction(
    query: ArrayLike,
    retrieval: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    query_ids: Optional[ArrayLike] = None,
    retrieval_ids: Optional[ArrayLike] = None,
    *,
    k: int = DEFAULT_K,
    ks: Sequence[int] = DEFAULT_KS,
    ranks: Sequence[int] = (1, 5, 10),
    radius: int = 2,
    map_all: bool = True,
    empty: Empty = "zero",
    ranking: Ranking = "hamming",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    retrieval_chunk_size: int = DEFAULT_RETRIEVAL_CHUNK_SIZE,
    expected: bool = True,
) -> Dict[str, object]:
    """Every metric of one direction, as a JSON-able dict; tensors or numpy arrays in.

    Keys: ``map@{k}``, ``map@all`` (with ``map_all``), ``precision_at_k``; for Hamming
    ranking ``pr_curve`` and ``precision_within_radius_{radius}``; with ids,
    ``recall_at_ranks`` ({"1": …, "5": …, "10": …}). Ties by retrieval index; with
    ``expected`` each ranked metric also has its tie-aware twin (the mean over every order of
    tied items, :mod:`ucmfh.metrics.ties`): ``map@{k}_expected``, ``map@all_expected``,
    ``precision_at_k["precision_expected"]`` and ``["recall_expected"]``,
    ``recall_at_ranks_expected`` (the radius metrics take whole distances: no ties to break).
    Recall@ranks by id means
    something only where a query's id can occur in the retrieval set: when no
    query id occurs there (e.g. a labelled set whose ids number items), the key
    is left out and ``recall_at_ranks_note`` says why instead.
    """
    out: Dict[str, object] = {}
    for step in _direction_steps(query, retrieval, query_labels, retrieval_labels, query_ids, retrieval_ids, k=k,
                                 ks=ks, ranks=ranks, radius=radius, map_all=map_all, empty=empty, ranking=ranking,
                                 chunk_size=chunk_size, retrieval_chunk_size=retrieval_chunk_size, expected=expected):
        step(out)
    return out


# evaluate_direction's options and their defaults: what evaluate_codes and the others take as ``options``
DIRECTION_OPTIONS = {name: p.default for name, p in inspect.signature(evaluate_direction).parameters.items()
                     if p.kind == p.KEYWORD_ONLY}
Step = Callable[[Dict[str, object]], None]


def _direction_steps(query: ArrayLike, retrieval: ArrayLike, query_labels: ArrayLike, retrieval_labels: ArrayLike,
                     query_ids: Optional[ArrayLike], retrieval_ids: Optional[ArrayLike], *, k: int,
                     ks: Sequence[int], ranks: Sequence[int], radius: int, map_all: bool, empty: Empty,
                     ranking: Ranking, chunk_size: int, retrieval_chunk_size: int, expected: bool) -> List[Step]:
    """:func:`evaluate_direction`'s work as its passes over the queries (a ranking each, or the Hamming radius
    curve), each a function writing its keys into the result: counted before the first runs, a progress bar's
    total (:func:`_run_directions`)."""
    query, retrieval, query_labels, retrieval_labels, query_ids, retrieval_ids = as_tensors(
        query, retrieval, query_labels, retrieval_labels, query_ids, retrieval_ids
    )
    kw = dict(empty=empty, ranking=ranking, retrieval_chunk_size=retrieval_chunk_size)
    rules = {"": "index", EXPECTED: "expected"} if expected else {"": "index"}
    ks = list(ks)
    steps: List[Step] = []
    for cut, name in ((k, str(k)), *(((None, "all"),) if map_all else ())):
        for twin, ties in rules.items():
            def map_step(out, cut=cut, name=name, twin=twin, ties=ties):
                out[f"map@{name}{twin}"] = map_at_k(query, retrieval, query_labels, retrieval_labels, cut, chunk_size,
                                                   **kw, ties=ties)
            steps.append(map_step)
    for twin, ties in rules.items():
        def precision_step(out, twin=twin, ties=ties):
            precision, recall = precision_recall_at_k(query, retrieval, query_labels, retrieval_labels, ks,
                                                      chunk_size, **kw, ties=ties)
            out.setdefault("precision_at_k", {"k": ks}).update({f"precision{twin}": precision, f"recall{twin}": recall})
        steps.append(precision_step)
    if ranking == "hamming":
        def curve_step(out):
            curve = pr_curve_hamming(
                query, retrieval, query_labels, retrieval_labels, chunk_size,
                empty=empty, retrieval_chunk_size=retrieval_chunk_size,
            )
            out["pr_curve"] = curve
            out[f"precision_within_radius_{radius}"] = curve["precision"][min(radius, len(curve["radius"]) - 1)]
        steps.append(curve_step)
    if query_ids is not None and retrieval_ids is not None:
        check_ids(query, retrieval, query_ids, retrieval_ids)
        if bool((id_match_counts(query_ids.long(), retrieval_ids.long()) > 0).any()):
            for twin, ties in rules.items():
                def recall_step(out, twin=twin, ties=ties):
                    values = recall_at_ranks(query, retrieval, query_ids, retrieval_ids, ranks, chunk_size, **kw,
                                             ties=ties)
                    out[f"recall_at_ranks{twin}"] = {str(r): v for r, v in zip(ranks, values)}
                steps.append(recall_step)
        else:
            steps.append(lambda out: out.update(recall_at_ranks_note=NO_ID_MATCH))
    return steps


def evaluate_codes(
    query_img: ArrayLike,
    query_txt: ArrayLike,
    retrieval_img: ArrayLike,
    retrieval_txt: ArrayLike,
    query_labels: ArrayLike,
    retrieval_labels: ArrayLike,
    query_ids: Optional[ArrayLike] = None,
    retrieval_ids: Optional[ArrayLike] = None,
    *,
    progress: bool = False,
    **options,
) -> Dict[str, object]:
    """All metrics for I→T (image queries vs text retrieval) and T→I.

    Shape: codes [Q or N, n_bits] ±1 (or packed uint8, or real-valued with
    ``ranking="cosine"``); labels [Q or N, C]; ids [Q or N] or None; tensors or
    numpy arrays. ``options`` are those of :func:`evaluate_direction` (k, ks,
    ranks, radius, map_all, empty, ranking, chunk_size, retrieval_chunk_size, expected). ``progress``: a bar of
    the passes over the queries (a ranking each).

    Returns ``{"settings": {...}, "i2t": {...}, "t2i": {...}}``, JSON-able;
    ``settings["ranking"]`` is ``"hamming"`` or ``"cosine"``, ``settings["order"]``
    says it in words.
    """
    _check_options(options)
    query_img, query_txt, retrieval_img, retrieval_txt, query_labels, retrieval_labels, query_ids, retrieval_ids = (
        as_tensors(query_img, query_txt, retrieval_img, retrieval_txt, query_labels, retrieval_labels,
                   query_ids, retrieval_ids)
    )
    codes = {"query": {"img": query_img, "txt": query_txt}, "retrieval": {"img": retrieval_img, "txt": retrieval_txt}}
    sides = {name: (codes["query"][q_mod], codes["retrieval"][r_mod], query_labels, retrieval_labels, query_ids,
                    retrieval_ids) for name, (q_mod, r_mod) in DIRECTIONS.items()}
    result = _run_directions(sides, options, progress)
    return {"settings": _settings(options, query_img.shape[0], retrieval_img.shape[0]), **result}


def _run_directions(sides: Dict[str, tuple], options: Dict[str, object], progress: bool) -> Dict[str, dict]:
    """:func:`evaluate_direction` of each direction's ``sides`` (its arguments), every pass of both planned first;
    with ``progress`` a bar of those passes (each a ranking of every query: seconds at 100,000 items, where
    ``evaluate --codes`` said nothing for all of them)."""
    plans = {name: _direction_steps(*args, **{**DIRECTION_OPTIONS, **options}) for name, args in sides.items()}
    result: Dict[str, dict] = {name: {} for name in plans}
    with tqdm(total=sum(map(len, plans.values())), unit="pass", disable=not progress, leave=False) as bar:
        for name, steps in plans.items():
            bar.set_description(f"scoring {name.replace('2', '->').upper()}")
            for step in steps:
                step(result[name])
                bar.update()
    return result


def _check_options(options: Dict[str, object], own: Sequence[str] = ()) -> None:
    """``TypeError`` for an option :func:`evaluate_direction` does not take (nor ``own``, the caller's): its own
    TypeError named evaluate_direction, not the function called."""
    known = list(DIRECTION_OPTIONS)
    unknown = sorted(set(options) - set(known) - set(own))
    if unknown:
        raise TypeError(f"unknown option {unknown[0]!r}; the options are {', '.join([*own, *known])}")


def _settings(options: Dict[str, object], n_query: int, n_retrieval: int) -> Dict[str, object]:
    ranking = options.get("ranking", "hamming")
    return {
        "k": options.get("k", DEFAULT_K),
        "empty": options.get("empty", "zero"),
        "ranking": ranking,
        "n_query": int(n_query),
        "n_retrieval": int(n_retrieval),
        "order": ORDER[ranking],
        "ties": "retrieval index ascending" + ("; *_expected: the mean over every order of tied items"
                                               if options.get("expected", True) else ""),
    }


def evaluate_caption_codes(query_img: ArrayLike, query_txt: ArrayLike, query_ids: ArrayLike,
                           retrieval: Optional[Sequence[ArrayLike]] = None, *, database: str = "test",
                           progress: bool = False, **options) -> Dict[str, object]:
    """All metrics of a caption set's codes for I→T and T→I on one of its databases (docs/reference.md §7):
    ``test``, the query split, or ``collection``, query ∪ retrieval (``retrieval``: the retrieval split's
    ``(img, txt, ids)``). Each query image once per id (its first row) against every caption of the
    database, and each query caption against its images (one per id); relevance "same id". The metrics are
    :func:`evaluate_direction`'s, with one label per id of the query split (a database item of another id
    has none: it is never relevant), so MAP@k, precision@K and the precision-recall curve are by id, and
    ``recall_at_ranks`` is R@1/5/10 by id as fractions. ``options`` and ``progress`` as :func:`evaluate_codes`.

    Shape: codes [Q or R, n_bits]; ids [Q or R]. Returns ``{"settings": {...}, "i2t": {...}, "t2i": {...}}``,
    ``settings["database"]`` the database's name.
    """
    _check_options(options)
    if database not in DATABASES:
        raise ValueError(f"database must be one of {DATABASES}, got {database!r}")
    if database == "collection" and retrieval is None:
        raise ValueError("the collection database needs the retrieval split's codes and ids")
    query_img, query_txt, query_ids = as_tensors(query_img, query_txt, query_ids)
    queries = (query_img, query_txt, query_ids)
    test = caption_database("test", queries, queries)  # its images, once per id, are the image queries
    db = test if database == "test" else caption_database(database, queries, as_tensors(*retrieval))
    img, img_ids = test["img"], test["img_ids"]
    classes = query_ids.unique()

    def one_hot(ids: torch.Tensor) -> torch.Tensor:  # [N, ids of the query split]: "same id" as a shared label
        return (ids[:, None] == classes[None, :]).to(torch.uint8)

    directions = {"i2t": (img, db["txt"], img_ids, db["txt_ids"]), "t2i": (query_txt, db["img"], query_ids,
                                                                            db["img_ids"])}
    result = _run_directions({name: (q, r, one_hot(q_ids), one_hot(r_ids), q_ids, r_ids)
                              for name, (q, r, q_ids, r_ids) in directions.items()}, options, progress)
    for name, (_, r, _, _) in directions.items():
        result[name]["n_database"] = int(r.shape[0])  # the P@K figure stops there
    settings = _settings(options, query_txt.shape[0], db["txt"].shape[0])
    settings.update(database=database, relevance="same id", n_query_img=int(len(img)),
                    n_database_img=int(db["img"].shape[0]))
    return {"settings": settings, **result}


def evaluate_codes_file(
    path: Union[str, "os.PathLike[str]"],
    k: int = DEFAULT_K,
    *,
    device: Union[str, torch.device] = "cpu",
    database: Optional[str] = None,
    progress: bool = False,
    **options,
) -> Dict[str, object]:
    """Load a codes file (:func:`ucmfh.codes.save_codes`) and return :func:`evaluate_codes` of it, or for a
    caption set :func:`ucmfh.metrics.report.evaluate_caption_codes` on ``database`` (default ``test``; a labelled
    set has none).

    The file's attributes (protocol, dataset, …) and ``n_bits`` are copied to
    ``result["settings"]``. ``device`` is where the metrics are computed; ``progress``: a bar of the passes over
    the queries (a ranking each).
    """
    from ucmfh.codes import load_codes

    _check_options(options)  # before the file is read
    codes = load_codes(path)
    if database is not None and not codes.caption_set:
        raise ValueError(f"{os.fspath(path)}: codes of a labelled set, which has one database; a database "
                         f"({database!r}) is a caption set's choice")
    dev = resolve_device(device)  # 'bogus': a line naming it, where torch's listed its every device type

    def get(group: str, modality: str) -> torch.Tensor:
        return codes.codes(group, modality).to(dev)

    ids = {g: (None if codes.ids[g] is None else codes.ids[g].to(dev)) for g in ("query", "retrieval")}
    if codes.caption_set:
        retrieval = None
        if database == "collection":
            retrieval = (get("retrieval", "img"), get("retrieval", "txt"), ids["retrieval"])
        result = evaluate_caption_codes(get("query", "img"), get("query", "txt"), ids["query"], retrieval,
                                        database=database or "test", k=k, progress=progress, **options)
    else:
        result = evaluate_codes(
            get("query", "img"), get("query", "txt"), get("retrieval", "img"), get("retrieval", "txt"),
            codes.labels["query"].to(dev), codes.labels["retrieval"].to(dev), ids["query"], ids["retrieval"],
            k=k, progress=progress, **options,
        )
    # the codes of each side, distinct: a collapsed side's scores are a near-random order's (metrics.collapse),
    # counted on the packed codes as read (one per code as ±1), not unpacked and copied to the device again
    packed, held = codes.packed, codes.ids
    distinct = distinct_codes(packed[("retrieval", "img")], packed[("retrieval", "txt")], held["retrieval"],
                              n_bits=codes.n_bits, query=(packed[("query", "img")], packed[("query", "txt")],
                                                          held["query"]))
    result["settings"].update(path=os.fspath(path), n_bits=codes.n_bits, attrs=_jsonable(codes.attrs),
                              distinct_codes=distinct)
    return result


def codes_file_row(metrics: Dict[str, object]) -> Dict[str, object]:
    """One flat results row (as appended to results.jsonl) from :func:`evaluate_codes_file` output."""
    settings = metrics["settings"]
    attrs = settings.get("attrs", {})
    k = settings["k"]
    row = {
        "task": "codes",
        "codes": None if settings.get("path") is None else os.path.abspath(settings["path"]),
        "dataset": attrs.get("dataset", "-"),
        "protocol": attrs.get("protocol", "unknown"),
        "method": attrs.get("method", "-"),
        "loss": None if attrs.get("loss", "-") == "-" else attrs["loss"],  # none of its own: null, as training rows
        "n_bits": settings.get("n_bits"),
        "k": k,
        **({"distinct_codes": settings["distinct_codes"]} if "distinct_codes" in settings else {}),
        "map_i2t": metrics["i2t"][f"map@{k}"],
        "map_t2i": metrics["t2i"][f"map@{k}"],
        **{f"map_{d}{EXPECTED}": metrics[d][f"map@{k}{EXPECTED}"] for d in ("i2t", "t2i")
           if f"map@{k}{EXPECTED}" in metrics[d]},
    }
    # the model the codes are of, and the dataset file encoded, as 'ucmfh encode' records them: rows of two models
    # are never taken for seeds of one, nor codes of two files for one measurement
    for name in ("seed", "checkpoint", "run", "dataset_path", "dataset_fingerprint"):
        if attrs.get(name) is not None:
            row[name] = attrs[name]
    for name in ("settings", "trained_on"):  # ucmfh's JSON of a mapping: the stages' settings, the file trained on
        value = attrs.get(name)
        try:  # a file of another writer may hold anything there
            value = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            value = None
        if isinstance(value, dict):
            row[name] = value
    if settings.get("database") is not None:  # a caption set's: R@K in % and rSum, as training rows hold them
        row["database"] = settings["database"]
        for twin in ("", EXPECTED):
            if f"recall_at_ranks{twin}" in metrics["i2t"]:
                for d in ("i2t", "t2i"):
                    row[f"recall_{d}{twin}"] = {r: 100.0 * v for r, v in metrics[d][f"recall_at_ranks{twin}"].items()}
                row[f"rsum{twin}"] = sum(sum(row[f"recall_{d}{twin}"].values()) for d in ("i2t", "t2i"))
    return row


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
