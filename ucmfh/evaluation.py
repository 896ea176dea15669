"""Encode the query and retrieval sets under a protocol and score both directions (docs/reference.md §3, §6)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ucmfh.config import EXPECTED, PROTOCOLS
from ucmfh.data.format import first_of_each_id
from ucmfh.data.h5 import Dataset, Split
from ucmfh.data.stream import Features
from ucmfh.metrics.ap import mean
from ucmfh.metrics.arguments import DEFAULT_K, TIES, Ranking, Ties, check_choice
from ucmfh.metrics.captions import RANKS, caption_set_rows, image_of_each_caption
from ucmfh.metrics.collapse import distinct_codes
from ucmfh.metrics.ranking import scores_by_rule
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.similarity import sign_codes
from ucmfh.utils import check_argument, evaluating, resolve_device, to_device, wrong_argument


@torch.no_grad()
def _encode(
    fn: Callable[..., Tuple[torch.Tensor, ...]],
    columns: Sequence[Features],
    device: torch.device,
    batch_size: int,
    desc: str,
    progress: bool,
) -> Tuple[torch.Tensor, ...]:
    """Apply ``fn`` to the rows of ``columns`` (equal lengths) in batches, each output concatenated;
    every row is encoded (no drop_last)."""
    outputs = []
    for start in tqdm(range(0, len(columns[0]), batch_size), desc=desc, unit="batch", disable=not progress,
                      leave=False):
        outputs.append(fn(*(to_device(column[start : start + batch_size], device) for column in columns)))
    return tuple(torch.cat(parts) for parts in zip(*outputs))


def _by_modality(
    pair: Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]],
    image: Callable[[torch.Tensor], torch.Tensor],
    text: Callable[[torch.Tensor], torch.Tensor],
    split: Split, protocol: str, device: torch.device, batch_size: int, desc: str, progress: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``pair(img, txt)`` of every item; under ``unimodal`` in a caption set (in memory), ``image`` of one
    row per id and ``text`` of every row instead: the same outputs, an image encoded once, not once per
    caption (equal ids are the same image, docs/reference.md §1; a caption set's scores read the first
    row of each id, :func:`ucmfh.metrics.captions.evaluate_caption_set`)."""
    if protocol != "unimodal" or split.ids is None or split.labels is not None or split.streamed:
        return _encode(pair, (split.img, split.txt), device, batch_size, desc, progress)
    ids = split.ids.cpu()
    first = torch.from_numpy(first_of_each_id(ids.numpy()))
    known, order = ids[first].sort()
    place = order[torch.searchsorted(known, ids)]  # each row's id among the first rows
    img, = _encode(lambda x: (image(x),), (split.img[first],), device, batch_size, desc, progress)
    txt, = _encode(lambda x: (text(x),), (split.txt,), device, batch_size, desc, progress)
    return img[place.to(img.device)], txt


def check_hasher(where: str, model: object) -> None:
    """Refuse anything but a hashing model (one with ``head_outputs``) at a public entry point (``TypeError``)."""
    if not (isinstance(model, nn.Module) and hasattr(model, "head_outputs")):
        raise wrong_argument(where, "model", model, "a hashing model",
                         "ucmfh.fit_hashing, or ucmfh.load_model(path, 'hash')")


def checked_features(where: str, split: Split, batch_size: int) -> Split:
    """A split a caller made, as the encoders take it (:meth:`~ucmfh.data.h5.Split.checked`), and a positive
    ``batch_size`` checked (``ValueError``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{where}: batch_size must be a positive whole number, got {batch_size!r}")
    return split.checked(where)


def checked_scored(where: str, data: Dataset, model: nn.Module) -> Dataset:
    """``data``'s query and retrieval splits as the encoders take them (:meth:`~ucmfh.data.h5.Split.checked`)
    and of the widths ``model`` takes (:func:`check_widths`), checked once for every protocol scored (the public
    encoders checked them again for each), a refusal named by the entry point (``where``) and the split."""
    data = replace(data, query=data.query.checked(where, "data.query"),
                   retrieval=data.retrieval.checked(where, "data.retrieval"))
    for split in (data.query, data.retrieval):
        check_widths(where, model, split)
    return data


def check_widths(where: str, model: nn.Module, split: Split) -> None:
    """Refuse a split of other feature widths than the model takes (``ValueError``), where a model says them
    (``d_img``/``d_txt``, of its fusion encoder for UCMFH's): torch's own refusal, deep inside the first layer,
    named neither ('The size of tensor a (1280) must match ...')."""
    fusion = getattr(model, "fusion", None)
    owner = model if fusion is None else fusion  # a module's truth is its length where it has one
    widths = getattr(owner, "d_img", None), getattr(owner, "d_txt", None)
    given = split.img.shape[1], split.txt.shape[1]
    if None not in widths and tuple(widths) != given:
        raise ValueError(f"{where}: the model takes {widths[0]}-d image and {widths[1]}-d text features, the split "
                         f"has {given[0]}-d and {given[1]}-d (features of another dataset or extractor?)")


def head_outputs_split(
    model: CrossModalHasher, split: Split, protocol: str = "unimodal", device: str = "auto",
    batch_size: int = 4096, progress: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Real-valued (pre-sign) image and text head outputs of every item: the codes before their sign.

    Shape: -> two [N, n_bits] on ``device``."""
    check_hasher("encode_split", model)
    check_argument("encode_split", "split", split, Split, "a split of ucmfh.load_dataset(path): .query, .retrieval")
    split = checked_features("encode_split", split, batch_size)
    check_widths("encode_split", model, split)
    _protocols(protocol)
    return outputs_of(model, split, protocol, resolve_device(device), batch_size, progress)


def outputs_of(model: CrossModalHasher, split: Split, protocol: str, device: torch.device, batch_size: int = 4096,
               progress: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`head_outputs_split` without its checks of the arguments, for a split already checked (a loaded
    dataset's, a validation part of one: scored every epoch, where a scan for NaN of every feature costs as much
    as a good part of the encoding)."""
    with evaluating(model, device):
        return _by_modality(lambda i, t: model.head_outputs(i, t, protocol),
                            lambda x: model.modality_logits(x, "img"), lambda x: model.modality_logits(x, "txt"),
                            split, protocol, device, batch_size, f"head outputs ({protocol})", progress)


def codes_of(model: CrossModalHasher, split: Split, protocol: str, device: torch.device, batch_size: int = 4096,
             progress: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode_split` without its checks (:func:`outputs_of`)."""
    return _signs(outputs_of(model, split, protocol, device, batch_size, progress))


def _signs(outputs: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    return sign_codes(outputs[0]), sign_codes(outputs[1])


def encode_split(
    model: torch.nn.Module, split: Split, protocol: str = "unimodal", device: str = "auto",
    batch_size: int = 4096, progress: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """±1 image and text codes of every item of a split (the model's ``codes``: the signs of its head
    outputs): ``img, txt = encode_split(model, data.query)``. ``model``: a hashing model of any method, as
    :func:`ucmfh.fit_hashing` and :func:`ucmfh.load_model` return it. Shape: -> two [N, n_bits] on ``device``."""
    return _signs(head_outputs_split(model, split, protocol, device, batch_size, progress))


def embed_split(
    fusion: FusionEncoder, split: Split, protocol: str, device: str = "auto",
    batch_size: int = 4096, progress: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Real-valued image and text embeddings of every item of a split. Shape: -> two [N, d_model]."""
    check_argument("embed_split", "fusion", fusion, FusionEncoder,
                   "ucmfh.fit_fusion, or ucmfh.load_model(path, 'fusion')")
    check_argument("embed_split", "split", split, Split, "a split of ucmfh.load_dataset(path): .query, .retrieval")
    split = checked_features("embed_split", split, batch_size)
    check_widths("embed_split", fusion, split)
    _protocols(protocol)
    return embeddings_of(fusion, split, protocol, resolve_device(device), batch_size, progress)


def embeddings_of(fusion: FusionEncoder, split: Split, protocol: str, device: torch.device, batch_size: int = 4096,
                  progress: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`embed_split` without its checks (:func:`outputs_of`)."""
    with evaluating(fusion, device):
        return _by_modality(lambda i, t: fusion.embed(i, t, protocol), fusion.encode_img, fusion.encode_txt, split,
                            protocol, device, batch_size, f"embed ({protocol})", progress)


def score_both_directions(
    query: Tuple[torch.Tensor, torch.Tensor],
    retrieval: Tuple[torch.Tensor, torch.Tensor],
    query_labels: torch.Tensor,
    retrieval_labels: torch.Tensor,
    k: int = DEFAULT_K,
    ranking: Ranking = "hamming",
    ties: Ties = "index",
) -> Dict[str, float]:
    """MAP@k image→text (image queries against text retrieval items) and text→image.

    ``ranking``: ``"hamming"`` for ±1 codes, ``"cosine"`` for real-valued embeddings; ``ties``:
    see :mod:`ucmfh.metrics.ties`.
    """
    check_choice("ties", ties, TIES)
    return {f"map_{d}": mean(ap) for d, ap in _average_precisions(query, retrieval, query_labels, retrieval_labels,
                                                                   k, ranking, (ties,))[ties].items()}


def _average_precisions(query, retrieval, query_labels, retrieval_labels, k: int, ranking: Ranking,
                        rules: Sequence[Ties], on_queries: Optional[Callable[[int], None]] = None,
                        ) -> Dict[str, Dict[str, torch.Tensor]]:
    """AP@k of every query, both directions, under each tie rule of ``rules``: {rule: {"i2t": [Q], "t2i": [Q]}}
    float64, from one ranking of each direction (:func:`ucmfh.metrics.ranking.scores_by_rule`)."""
    kw = dict(by_id=False, k=k, ranking=ranking, rules=rules, on_queries=on_queries)
    i2t = scores_by_rule(query[0], retrieval[1], query_labels, retrieval_labels, **kw)
    t2i = scores_by_rule(query[1], retrieval[0], query_labels, retrieval_labels, **kw)
    return {rule: {"i2t": i2t[rule]["ap"], "t2i": t2i[rule]["ap"]} for rule in rules}


def _protocols(protocols: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """The protocols asked for, one given as itself (``"unimodal"``) or several; an unknown one is refused."""
    protocols = (protocols,) if isinstance(protocols, str) else tuple(protocols)
    bad = [p for p in protocols if p not in PROTOCOLS]
    if bad:
        raise ValueError(f"unknown protocol(s) {bad}; choose from {PROTOCOLS}")
    if not protocols:  # no rows, where a caller asked for scores
        raise ValueError(f"no protocol given; choose from {PROTOCOLS}")
    return protocols


def score_splits(
    query: Tuple[torch.Tensor, torch.Tensor],
    retrieval: Tuple[torch.Tensor, torch.Tensor],
    data: Dataset,
    k: int = DEFAULT_K,
    ranking: Ranking = "hamming",
    expected: bool = False,
    per_query: bool = False,
    recall: bool = True,
    on_queries: Optional[Callable[[int], None]] = None,
) -> List[Dict[str, object]]:
    """Scores of encoded query and retrieval splits: one row, or one per database of a caption set.

    Labelled data: MAP@k by shared label (docs/reference.md §6). Caption sets
    (no labels): the ``test`` and ``collection`` databases of §7, each with
    Recall@1/5/10 in %, rSum and MAP@k by id. Ties by retrieval index; with ``expected``
    each score also has its tie-aware twin, the mean over every order of tied items
    (``map_i2t_expected``, ``recall_i2t_expected``, ``rsum_expected``, …; :mod:`ucmfh.metrics.ties`).
    With ``per_query`` each row also holds ``per_query``, the per-query scores its means are taken
    over (tie-aware with ``expected``): ``ap_i2t``, ``ap_t2i`` and, for a caption set, ``hits_i2t``,
    ``hits_t2i`` [Q, 3] (R@1/5/10) and ``image_t2i`` (:func:`~ucmfh.metrics.captions.image_of_each_caption`),
    float32 numpy arrays. ``recall=False``: a caption set's rows without
    recall and rSum (MAP alone: a validation score). ``on_queries`` is told how many queries were ranked as each
    chunk of them is done, :func:`ranked_queries` in all.
    """
    by_rule = _score_splits(query, retrieval, data, k, ranking, ("index", "expected") if expected else ("index",),
                            recall, on_queries)
    rows = by_rule["index"]
    if expected:
        for row, twin in zip(rows, by_rule["expected"]):
            row.update({f"{key}{EXPECTED}": value for key, value in twin.items() if key.startswith(_METRICS)})
            row["per_query"] = twin["per_query"]
    # a caption set's: each T→I query's image, with the scores (compare resamples an image's captions together)
    images = image_of_each_caption(data.query.ids.cpu().numpy()) if per_query and data.caption_set else None
    for row in rows:
        scores = row.pop("per_query")
        if per_query:
            if images is not None:
                scores = {**scores, "image_t2i": torch.from_numpy(images)}
            # scores as float32, each caption's image as the int64 it is (float32 for a while; compare reads both)
            row["per_query"] = {name: (values.float() if values.is_floating_point() else values).cpu().numpy()
                                for name, values in scores.items()}
    return rows


def ranked_queries(data: Dataset) -> int:
    """How many queries one ranking of :func:`score_splits` ranks: each query item in both directions, or in a
    caption set, its distinct query images and its query captions once per database (``test``, ``collection``)."""
    if not data.caption_set:
        return 2 * len(data.query)
    return 2 * (len(first_of_each_id(data.query.ids.cpu().numpy())) + len(data.query))


def _score_splits(query, retrieval, data: Dataset, k: int, ranking: Ranking, rules: Sequence[Ties],
                  recall: bool = True, on_queries: Optional[Callable[[int], None]] = None,
                  ) -> Dict[str, List[Dict[str, object]]]:
    """Each tie rule's rows, ``{rule: rows}``, each row with its ``per_query`` scores (tensors), from one ranking
    of each direction (and database)."""
    if not data.caption_set:
        by_rule = _average_precisions(query, retrieval, data.query.labels, data.retrieval.labels, k, ranking, rules,
                                      on_queries)
        return {rule: [{"k": k, **{f"map_{d}": mean(values) for d, values in ap.items()},
                        "per_query": {f"ap_{d}": values for d, values in ap.items()}}] for rule, ap in by_rule.items()}
    by_rule = caption_set_rows((*query, data.query.ids), (*retrieval, data.retrieval.ids), k=k, ranks=RANKS,
                               ranking=ranking, rules=rules, per_query=True, recall=recall, on_queries=on_queries)
    return {rule: [{key: value for key, value in row.items() if key != "ties"} for row in rows.values()]
            for rule, rows in by_rule.items()}


_METRICS = ("map_", "recall_", "rsum")  # the score keys of a row (the rest describe it)


def evaluate_hashing(
    model: torch.nn.Module, data: Dataset, protocols: Optional[Sequence[str]] = None,
    k: int = DEFAULT_K, device: str = "auto", progress: bool = False, real_valued: bool = False, per_query: bool = False,
) -> List[Dict[str, object]]:
    """Hamming-ranking scores of both directions, one row per protocol (and database of a caption set), of
    ``model``, a hashing model of any method (:func:`encode_split`). ``protocols``: by default both where the
    model has a fused view (UCMFH's, on its fusion encoder), else
    ``unimodal`` alone (a leak-free model's codes are the same under both: one row, as ``train-hash`` writes).

    With ``real_valued`` each row also holds ``real_valued``: the same scores of the heads'
    real-valued outputs ranked by cosine, what the codes lose to their sign (docs/reference.md §5).
    With ``per_query``, the codes' tie-aware per-query scores too (:func:`score_splits`). Each row holds
    ``distinct_codes`` (:func:`distinct_codes`): a model whose codes collapsed scores a random order's level.
    """
    check_hasher("evaluate_hashing", model)
    check_argument("evaluate_hashing", "data", data, Dataset, "ucmfh.load_dataset(path)")
    k = _checked_k("evaluate_hashing", k)
    data = checked_scored("evaluate_hashing", data, model)
    if protocols is None:
        protocols = PROTOCOLS if hasattr(model, "fusion") else ("unimodal",)
    protocols = _protocols(protocols)
    device = resolve_device(device)
    rows = []
    for protocol in protocols:  # one forward pass: the codes are the signs of the head outputs
        query = outputs_of(model, data.query, protocol, device, progress=progress)
        retrieval = outputs_of(model, data.retrieval, protocol, device, progress=progress)
        codes, query_codes = _signs(retrieval), _signs(query)
        # the queries ranked, a chunk at a time: the heads' outputs ranked by cosine took 36 s of 48 at 5,000
        # queries × 100,000 items, with a bar of two steps (rankings) standing at the first
        with tqdm(total=ranked_queries(data) * (1 + bool(real_valued)), desc=f"scoring ({protocol})", unit="query",
                  disable=not progress, leave=False) as bar:
            scores = score_splits(query_codes, codes, data, k, expected=True, per_query=per_query,
                                  on_queries=bar.update)
            if real_valued:
                for row, real in zip(scores, score_splits(query, retrieval, data, k, "cosine", expected=True,
                                                          on_queries=bar.update)):
                    row["real_valued"] = {key: value for key, value in real.items() if key.startswith(_METRICS)}
        distinct = distinct_codes(*codes, data.retrieval.ids, query=(*query_codes, data.query.ids))
        rows += [{"protocol": protocol, **row, "distinct_codes": distinct} for row in scores]
    return rows


def _checked_k(where: str, k: object) -> int:
    """``k`` as an int (numpy's integers too, as every metric takes them); ``TypeError`` naming ``where`` for
    another type."""
    k = int(k) if isinstance(k, np.integer) else k
    check_argument(where, "k", k, int)
    return k


def evaluate_fusion(
    fusion: FusionEncoder, data: Dataset, protocols: Sequence[str] = PROTOCOLS,
    k: int = DEFAULT_K, device: str = "auto", progress: bool = False,
) -> List[Dict[str, object]]:
    """Cosine-ranking scores of the real-valued fusion embeddings, one row per protocol (and database)."""
    check_argument("evaluate_fusion", "fusion", fusion, FusionEncoder,
                   "ucmfh.fit_fusion, or ucmfh.load_model(path, 'fusion')")
    check_argument("evaluate_fusion", "data", data, Dataset, "ucmfh.load_dataset(path)")
    k = _checked_k("evaluate_fusion", k)
    data = checked_scored("evaluate_fusion", data, fusion)
    protocols = _protocols(protocols)
    device = resolve_device(device)
    rows = []
    for protocol in protocols:
        query = embeddings_of(fusion, data.query, protocol, device, progress=progress)
        retrieval = embeddings_of(fusion, data.retrieval, protocol, device, progress=progress)
        with tqdm(total=ranked_queries(data), desc=f"scoring ({protocol})", unit="query", disable=not progress,
                  leave=False) as bar:
            rows += [{"protocol": protocol, **row}
                     for row in score_splits(query, retrieval, data, k, "cosine", expected=True, on_queries=bar.update)]
    return rows


def random_codes_scores(data: Dataset, n_bits: int, k: int = DEFAULT_K, seed: int = 0) -> List[Dict[str, object]]:
    """:func:`score_splits` of uniformly random ±1 codes: the floor a trained model must clear."""
    generator = torch.Generator().manual_seed(seed)

    def draw(n: int) -> torch.Tensor:
        return torch.randint(0, 2, (n, n_bits), generator=generator).float() * 2 - 1

    query = (draw(len(data.query)), draw(len(data.query)))
    retrieval = (draw(len(data.retrieval)), draw(len(data.retrieval)))
    return score_splits(query, retrieval, data, k)


def random_codes_map(data: Dataset, n_bits: int, k: int = DEFAULT_K, seed: int = 0) -> Dict[str, float]:
    """MAP@k of uniformly random ±1 codes (labelled data; see :func:`random_codes_scores`)."""
    if data.caption_set:
        raise ValueError("a caption set has one floor per database: use random_codes_scores")
    row = random_codes_scores(data, n_bits, k, seed)[0]
    return {"map_i2t": row["map_i2t"], "map_t2i": row["map_t2i"]}
