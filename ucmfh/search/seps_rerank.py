"""Re-ranking an index's Hamming candidates by SEPS on token features (docs/search.md, docs/seps.md).

An indexed item keeps its origin (``Index.origins``: the collection file, the group and the row it
was read from); its image or word tokens (docs/reference.md §9) are read from there, by row, with
:class:`ucmfh.data.tokens.Tokens`. A query's tokens come from the HDF5 query file it was read from.
Scoring is :func:`ucmfh.seps.scoring.score_candidates`, the step of ``ucmfh rerank``'s re-ranker: one query
against its M candidates, one :meth:`SEPS.grid` call. The candidates of consecutive queries are encoded
once for all of them (bounded: ``budget`` distinct candidate states at a time).

Refused, each in one line naming the file and the dataset: a collection file changed since the build
(size or modification time differ from those recorded), token widths other than the checkpoint's,
queries without tokens (``.npy``, ``--text``/``--image``), an index built before items kept their origin.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ucmfh.checkpoint import load_seps
from ucmfh.data.format import DataError
from ucmfh.data.tokens import IMAGE_TOKENS, Tokens
from ucmfh.seps.model import SEPS, State
from ucmfh.search.collection import Queries
from ucmfh.search.folder import NAMES
from ucmfh.search.index import Index
from ucmfh.search.shards import Shards
from ucmfh.seps.scoring import cat_states, encode_images, encode_texts, score_candidates, take
from ucmfh.utils import resolve_device

_ENCODE_CHUNK = 256  # items whose tokens are encoded at a time


@dataclass
class Matcher:
    """A SEPS checkpoint loaded for re-ranking: the model, its file and its token shapes."""

    model: SEPS
    path: str
    device: torch.device
    d_img: int
    d_txt: int
    n_image_tokens: int
    image_cls: bool


def load_matcher(path: str, device: str = "cpu") -> Matcher:
    """Load a ``ucmfh train-seps`` checkpoint for re-ranking (on ``device``)."""
    path = os.fspath(path)
    model, _, _ = load_seps(path)
    device_ = resolve_device(device)
    return Matcher(model.to(device_).eval(), path, device_, model.img_proj.in_features, model.txt_proj.in_features,
                   model.n_patches + int(model.image_cls), bool(model.image_cls))


def _group_name(group: str) -> str:
    return group.strip("/") or "/"


def check_tokens(matcher: Matcher, tokens: Tokens, group: str) -> None:
    """Refuse token features of other shapes than the SEPS checkpoint was trained on."""
    where = f"{tokens.path}: {group.rstrip('/')}"
    have = (tokens.n_image_tokens, tokens.d_img)
    want = (matcher.n_image_tokens, matcher.d_img)
    if have != want:
        raise DataError(f"{where}/{IMAGE_TOKENS}: {have[0]} tokens of width {have[1]} per image, the SEPS "
                        f"checkpoint {matcher.path} takes {want[0]} of width {want[1]}")
    if tokens.d_txt != matcher.d_txt:
        raise DataError(f"{where}/text_tokens: word tokens of width {tokens.d_txt}, the SEPS checkpoint "
                        f"{matcher.path} takes {matcher.d_txt}")
    cls = bool(tokens.attrs.get("image_tokens_cls", False))
    if cls != matcher.image_cls:
        raise DataError(f"{tokens.path}: root attribute image_tokens_cls is {cls}, the SEPS checkpoint "
                        f"{matcher.path} was trained with {matcher.image_cls}")


def check_unchanged(place: Dict[str, Any], index_path: Optional[str]) -> None:
    """Refuse a collection file whose size or modification time differ from those recorded at build."""
    path = place["path"]
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: the collection the index {index_path} was built from is gone "
                                "(its token features re-rank the results)")
    stat = os.stat(path)
    if (stat.st_size, stat.st_mtime_ns) != (place["size"], place["mtime_ns"]):
        raise DataError(f"{path}: changed since the index {index_path} was built from it (size {stat.st_size} "
                        f"bytes, recorded {place['size']}; or its modification time); its rows may no longer "
                        "be the indexed items: build the index again")


def _encode(matcher: Matcher, tokens: Tokens, rows: np.ndarray, modality: str) -> State:
    encode = encode_images if modality == "img" else encode_texts
    return encode(matcher.model, tokens, rows, matcher.device)


def _batches(keys: np.ndarray, budget: int) -> List[Tuple[int, int]]:
    """Consecutive runs of queries whose candidates (rows of ``keys`` [Q, M]) number at most ``budget``
    distinct items (a query alone may exceed it): queries that share candidates share their encoding."""
    out, start, seen = [], 0, set()
    for i, row in enumerate(keys.tolist()):
        grown = seen.union(row)
        if i > start and len(grown) > budget:
            out.append((start, i))
            start, grown = i, set(row)
        seen = grown
    out.append((start, len(keys)))
    return out


@torch.no_grad()
def seps_scores(
    index: Union[Index, Shards],
    modality: str,
    positions: np.ndarray,
    queries: Queries,
    matcher: Matcher,
    budget: int = 2048,
) -> np.ndarray:
    """SEPS scores of each query against its candidates, the items of ``modality`` at ``positions``.

    Shape: positions [Q, M] int64 -> [Q, M] float64. Consecutive queries are taken together while their
    candidates number at most ``budget`` distinct items, each encoded once (an image's state: 114 kB for
    49 patches at C = 512, so 2,048 of them ~ 230 MB).
    """
    if queries.modality == modality:
        raise ValueError(f"SEPS scores image–text pairs; {NAMES[modality]} queries against {NAMES[modality]} "
                         "items cannot be re-ranked by it")
    if queries.path is None or queries.rows is None:
        raise ValueError(f"{queries.source}: re-ranking by SEPS needs the queries' token features, and these "
                         "queries have none; read them from an HDF5 file with token datasets (docs/reference.md §9)")
    n_q, m = positions.shape
    out = np.zeros((n_q, m), dtype=np.float64)
    if m == 0 or n_q == 0:
        return out
    places, place, row = index.origins(modality, positions)
    for p in places:
        check_unchanged(p, index.path)
    with contextlib.ExitStack() as stack:
        # a search reads the rows of its queries and candidates alone: no scan of every value (2 s on flickr8k1000)
        query_tokens = stack.enter_context(Tokens(queries.path, _group_name(queries.group), check_values=False))
        check_tokens(matcher, query_tokens, queries.group)
        readers = []
        for p in places:
            reader = stack.enter_context(Tokens(p["path"], _group_name(p["group"]), check_values=False))
            check_tokens(matcher, reader, p["group"])
            readers.append(reader)
        span = int(row.max()) + 1
        keys = (place * span + row).reshape(n_q, m)  # one key per distinct item
        for a, b in _batches(keys, budget):
            # each distinct candidate of these queries once: (place, row) -> its state's row
            unique, inverse = np.unique(keys[a:b], return_inverse=True)
            u_place, u_row = np.divmod(unique, span)
            states, order = [], []
            for pl in np.unique(u_place):
                which = np.flatnonzero(u_place == pl)
                for c in range(0, len(which), _ENCODE_CHUNK):  # bounded token tensors
                    states.append(_encode(matcher, readers[pl], u_row[which[c:c + _ENCODE_CHUNK]], modality))
                order.append(which)
            # the states in the order of ``unique``
            candidates = take(cat_states(states), torch.from_numpy(np.argsort(np.concatenate(order))).to(matcher.device))
            query_states = cat_states([_encode(matcher, query_tokens, queries.rows[c:min(c + _ENCODE_CHUNK, b)],
                                               queries.modality) for c in range(a, b, _ENCODE_CHUNK)])
            inverse = torch.from_numpy(inverse.reshape(b - a, m)).to(matcher.device)
            for i in range(b - a):
                scores = score_candidates(matcher.model, take(query_states, torch.tensor([i], device=matcher.device)),
                                          take(candidates, inverse[i]), queries.modality)
                out[a + i] = scores.double().cpu().numpy()
    return out
