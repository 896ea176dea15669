"""SEPS scoring on token features: states, pairs, every pair of a database, and the databases of §7.

The model is :class:`ucmfh.seps.model.SEPS`; the tokens are read by :class:`ucmfh.data.tokens.Tokens`.
Scoring a database computes each image's state once (:func:`image_states`), each chunk of captions'
state once, and the pairs of an image chunk × caption chunk in one :meth:`SEPS.grid` call, so memory
is bounded by ``cfg.pair_chunk`` pairs. R@K comes from :mod:`ucmfh.metrics.captions`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from ucmfh.data.tokens import Tokens, check_dense_of_images
from ucmfh.metrics.captions import DATABASES, database_rows, recall_from_scores
from ucmfh.seps.model import SEPS, State
from ucmfh.utils import evaluating, to_device

RANKS = (1, 5, 10)


@dataclass
class SplitIds:
    """A split as a database reads it where no token is read (the Hamming and cosine stages of
    :mod:`ucmfh.two_stage`, on pooled features): its name and its ids, as a :class:`Tokens` reader gives them."""

    split: str
    ids: np.ndarray

    @property
    def n_items(self) -> int:
        return len(self.ids)


@dataclass
class Side:
    """Items of a token reader, in order (one side of a database: its images or its captions); of a
    :class:`SplitIds` where no token is read."""

    tokens: Union[Tokens, SplitIds]
    items: np.ndarray

    def __len__(self) -> int:
        return len(self.items)

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        for start in range(0, len(self.items), size):
            yield self.items[start:start + size]


def _dense(model: SEPS, tokens: Tokens, items: np.ndarray, device: torch.device,
           where: str) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    if not (model.dense and model.cfg.dense_text == where):
        return None, None
    check_dense_of_images(tokens.path, tokens.attrs, model.cfg.dense_text)  # a file scored apart from its training
    words, mask = tokens.texts(items, dense=True)
    return to_device(words, device), to_device(mask, device, keep_host=True)


def image_inputs(model: SEPS, tokens: Tokens, items: np.ndarray, device: torch.device) -> Tuple:
    """What :meth:`SEPS.encode_images` takes for ``items``: their images' tokens, and their own dense
    text when used, read and on their way to ``device``."""
    return (to_device(tokens.images(items), device), *_dense(model, tokens, items, device, "image"))


def text_inputs(model: SEPS, tokens: Tokens, items: np.ndarray, device: torch.device) -> Tuple:
    """What :meth:`SEPS.encode_texts` takes for ``items``: their words and mask (and, in the leaking
    reproduction mode, their image's dense text), read and on their way to ``device``."""
    words, mask = tokens.texts(items)  # the masks keep their host copy: SEPS.grid plans its chunks from it
    return (to_device(words, device), to_device(mask, device, keep_host=True),
            *_dense(model, tokens, items, device, "leak"))


def encode_images(model: SEPS, tokens: Tokens, items: np.ndarray, device: torch.device) -> State:
    """The per-image state of ``items`` (their images' tokens, and their own dense text when used)."""
    return model.encode_images(*image_inputs(model, tokens, items, device))


def encode_texts(model: SEPS, tokens: Tokens, items: np.ndarray, device: torch.device) -> State:
    """The per-caption state of ``items`` (and, in the leaking reproduction mode, their image's dense text)."""
    return model.encode_texts(*text_inputs(model, tokens, items, device))


def cat_states(states: Sequence[State]) -> State:
    """Concatenate states along their first axis, padding word axes to the longest."""
    out = {}
    for key in states[0]:
        parts = [s[key] for s in states]
        if parts[0].dim() >= 2 and (key.startswith("words_") or key.startswith("mask_")):
            width = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, width - p.shape[1])) for p in parts]
        out[key] = torch.cat(parts)
    return out


def take(state: State, index: torch.Tensor) -> State:
    """The rows ``index`` of a state."""
    return {key: value[index] for key, value in state.items()}


@torch.no_grad()
def score_candidates(model: SEPS, query: State, candidates: State, query_modality: str) -> torch.Tensor:
    """SEPS scores of one query against its candidates of the other modality (a re-ranker's step).

    Shape: ``query``: the state of one image (``query_modality='img'``) or one caption (``'txt'``);
    ``candidates``: the states of M captions or M images -> [M].
    """
    if query_modality == "img":
        return model.grid(query, candidates)[0][:, 0]  # [M captions, 1 image]
    if query_modality == "txt":
        return model.grid(candidates, query)[0][0]  # [1 caption, M images]
    raise ValueError(f"query_modality must be 'img' or 'txt', got {query_modality!r}")


@torch.no_grad()
def image_states(model: SEPS, side: Side, device: torch.device, batch: int = 128, progress: bool = False) -> State:
    """The state of every image of ``side``, computed once (the store a re-ranker keeps per image); the model is
    scored on ``device`` in eval mode, and left where and as it was (:func:`ucmfh.utils.evaluating`)."""
    with evaluating(model, device):
        return cat_states([encode_images(model, side.tokens, items, device)
                           for items in tqdm(list(side.chunks(batch)), desc="SEPS images", disable=not progress)])


@torch.no_grad()
def text_states(model: SEPS, side: Side, device: torch.device, batch: int = 512, progress: bool = False) -> State:
    """The state of every caption of ``side`` (padded to the longest); the model left as it was."""
    with evaluating(model, device):
        return cat_states([encode_texts(model, side.tokens, items, device)
                           for items in tqdm(list(side.chunks(batch)), desc="SEPS captions", disable=not progress)])


@torch.no_grad()
def score_matrix(model: SEPS, images: State, texts: Side, device: torch.device, pair_chunk: int,
                 progress: bool = False) -> torch.Tensor:
    """SEPS scores of every (caption, image) pair. Shape: -> [n_texts, n_images] float32 on the CPU. The model is
    left where and as it was."""
    n_img = images["basis"].shape[0]
    text_batch = max(1, min(len(texts), pair_chunk // max(1, min(n_img, pair_chunk))))
    image_batch = max(1, pair_chunk // text_batch)
    out = torch.empty(len(texts), n_img)
    start = 0
    with evaluating(model, device):
        for items in tqdm(list(texts.chunks(text_batch)), desc="SEPS pairs", disable=not progress):
            txt = encode_texts(model, texts.tokens, items, device)
            for i in range(0, n_img, image_batch):
                out[start:start + len(items), i:i + image_batch] = model.grid(
                    take(images, torch.arange(i, min(i + image_batch, n_img), device=device)), txt)[0].float().cpu()
            start += len(items)
    return out


def recall_rows(scores: torch.Tensor, txt_ids: torch.Tensor, img_ids: torch.Tensor,
                query_txt: torch.Tensor, query_img: torch.Tensor) -> Dict[str, object]:
    """Both directions from one [texts, images] score matrix: the images ``query_img`` (rows of the
    image axis) query the texts, the captions ``query_txt`` query the images."""
    i2t = recall_from_scores(scores[:, query_img].T, img_ids[query_img], txt_ids)
    t2i = recall_from_scores(scores[query_txt], txt_ids[query_txt], img_ids)
    return {"recall_i2t": i2t, "recall_t2i": t2i, "rsum": sum(i2t.values()) + sum(t2i.values())}


def evaluate_pairs(model: SEPS, images: Side, texts: Side, device: torch.device, pair_chunk: int,
                   progress: bool = False) -> Dict[str, object]:
    """R@1/5/10 and rSum of both directions, every pair scored: ``images`` (one item per image) query
    ``texts`` and the reverse."""
    scores = score_matrix(model, image_states(model, images, device), texts, device, pair_chunk, progress)
    img_ids = torch.from_numpy(images.tokens.ids[images.items])
    txt_ids = torch.from_numpy(texts.tokens.ids[texts.items])
    return recall_rows(scores, txt_ids, img_ids, torch.arange(len(texts)), torch.arange(len(images)))


# ---------------------------------------------------------------- the databases of §7

@dataclass
class Database:
    """One database of §7 with token readers.

    ``texts`` and ``images`` (one item per id) are read in their order, split by split; ``txt_order``
    and ``img_order`` then put the axes in the database's order (§7: the query split, or query ∪
    retrieval in id order), in which ``txt_ids``, ``img_ids`` and the query rows are given.
    """

    name: str
    texts: List[Side]
    images: List[Side]
    txt_order: torch.Tensor
    img_order: torch.Tensor
    txt_ids: torch.Tensor
    img_ids: torch.Tensor
    query_txt: torch.Tensor  # rows of the text axis that are queries (every query caption)
    query_img: torch.Tensor  # rows of the image axis that are queries (the unique query images)


def _sides(query: Union[Tokens, SplitIds], retrieval: Union[Tokens, SplitIds],
           rows: np.ndarray) -> Tuple[List[Side], torch.Tensor]:
    """Database rows (:func:`ucmfh.metrics.captions.database_rows`) as the sides that read them, split by
    split in ascending rows, and the order that puts what they read in the database's order."""
    n = query.n_items
    read = np.sort(rows)
    sides = [Side(query, read[read < n])]
    if (read >= n).any():
        sides.append(Side(retrieval, read[read >= n] - n))
    return sides, torch.from_numpy(np.searchsorted(read, rows))


def databases(query: Union[Tokens, SplitIds], retrieval: Union[Tokens, SplitIds],
              names: Sequence[str] = DATABASES) -> List[Database]:
    """The ``test`` and ``collection`` databases of §7 over the query and retrieval readers (or their
    :class:`SplitIds`, for the stages that read no token)."""
    ids = np.concatenate([query.ids, retrieval.ids])
    out = []
    for name in names:
        txt, img = database_rows(name, query.ids, retrieval.ids)
        texts, txt_order = _sides(query, retrieval, txt)
        images, img_order = _sides(query, retrieval, img)
        out.append(Database(name, texts, images, txt_order, img_order, torch.from_numpy(ids[txt]),
                            torch.from_numpy(ids[img]), torch.from_numpy(np.flatnonzero(txt < query.n_items)),
                            torch.from_numpy(np.flatnonzero(img < query.n_items))))
    return out


def database_scores(model: SEPS, db: Database, device: torch.device, pair_chunk: int,
                    progress: bool = False) -> Tuple[torch.Tensor, float]:
    """Every pair of a database scored: [texts, images], and the seconds it took."""
    start = time.perf_counter()
    images = cat_states([image_states(model, side, device, progress=progress) for side in db.images])
    scores = torch.cat([score_matrix(model, images, side, device, pair_chunk, progress) for side in db.texts])
    return scores[db.txt_order][:, db.img_order], time.perf_counter() - start
