"""Two-stage search on a caption set: Hamming top-M from the hashing stage, then a re-ranker.

Stages (the ``stage`` of a result row):

* ``hamming``: the codes alone (ties by database index);
* ``cosine-rerank``: the M candidates re-ordered by the cosine of the hashing model's real-valued
  outputs before the sign (the pooled embeddings an index keeps; the cheap baseline);
* ``seps-rerank``: the M candidates re-ordered by SEPS;
* ``seps-full``: SEPS over every pair of the database (no first stage).

Every query runs alone, as a search does: ``search`` (the Hamming top-M of one query), ``fetch``
(the candidates' stored data: the word tokens of candidate captions, the precomputed SEPS state of
candidate images) and ``score`` (encoding the query's side and scoring its M pairs) are timed per
query. Re-ranking keeps the M candidates and orders them by the re-ranker's score, ties by database
index: the step of ``ucmfh search --rerank`` itself (:mod:`ucmfh.search.rerank`), on the float16
embeddings an index keeps; R@K for K ≤ M is read from that list; ``recall_at_m`` is the first stage's ceiling
(a relevant item among the M). All codes are ``unimodal``: each from its own modality.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ucmfh.data.h5 import Dataset
from ucmfh.metrics.captions import recall_of_lists
from ucmfh.metrics.topk import top_k
from ucmfh.models.hashing import FeatureHasher
from ucmfh.seps.model import SEPS, State
from ucmfh.seps.scoring import (RANKS, Database, cat_states, database_scores, encode_images, encode_texts, image_states,
                        recall_rows, score_candidates, take, text_states)
from ucmfh.search.index import EMBEDDING_DTYPE
from ucmfh.search.rerank import cosine_scores, rerank
from ucmfh.similarity import sign_codes

STAGES = ("hamming", "cosine-rerank", "seps-rerank", "seps-full")


def _per_axis(db: Database, data: Dataset, field: str) -> torch.Tensor:
    """A per-item tensor of the dataset (``img`` or ``txt``) on one axis of ``db``, in its order."""
    sides = db.images if field == "img" else db.texts
    order = db.img_order if field == "img" else db.txt_order
    return torch.cat([getattr(getattr(data, s.tokens.split), field)[torch.from_numpy(s.items)] for s in sides])[order]


def _quantiles(ms: List[float]) -> Dict[str, float]:
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))}


class Reranking:
    """The stages of one database for one hashing model and (optionally) one SEPS model.

    Args:
        db: the database (:func:`ucmfh.seps.scoring.databases`).
        data: the pooled features of the same file (``load_dataset``).
        hasher: a leak-free hashing model (:class:`FeatureHasher`).
        seps: the SEPS matcher, or None for the Hamming and cosine stages only: it is moved to ``device`` and
            kept in eval mode, as the hashing model is kept in eval mode, for the re-ranker's whole life (each
            query is encoded by it when asked).
    """

    def __init__(self, db: Database, data: Dataset, hasher: FeatureHasher, seps: Optional[SEPS] = None,
                 device: str = "cpu", progress: bool = False) -> None:
        self.db, self.hasher, self.seps = db, hasher.eval(), seps
        self.device = torch.device(device)
        if seps is not None:  # each query's tokens are encoded on the device, for the re-ranker's whole life
            seps.to(self.device).eval()
        self.progress = progress
        with torch.no_grad():
            img, txt = _per_axis(db, data, "img"), _per_axis(db, data, "txt")
            # the codes are the signs of the head outputs, as every score reads them (not the model's ``codes``,
            # which a method of another package may have replaced), and the outputs themselves as an index keeps
            # them, for the cosine stage
            real = hasher.head_outputs(img, txt, "unimodal")
            self.img_codes, self.txt_codes = (sign_codes(x) for x in real)
            self.img_real, self.txt_real = (x.cpu().numpy().astype(EMBEDDING_DTYPE) for x in real)
        # the re-ranker's stores: the SEPS state of every image and every caption, computed once
        self.img_store: Optional[State] = None
        self.txt_store: Optional[State] = None
        self.store_seconds = 0.0
        if seps is not None:
            start = time.perf_counter()
            self.img_store = take(cat_states([image_states(seps, s, self.device, progress=progress)
                                              for s in db.images]), db.img_order.to(self.device))
            self.txt_store = take(cat_states([text_states(seps, s, self.device, progress=progress)
                                              for s in db.texts]), db.txt_order.to(self.device))
            self.store_seconds = time.perf_counter() - start

    # ------------------------------------------------------------ the two directions, query by query

    def _query_state(self, direction: str, q: int) -> State:
        """A query's SEPS state, encoded from its tokens (a query is not in the store)."""
        sides, order = (self.db.images, self.db.img_order) if direction == "i2t" else (self.db.texts, self.db.txt_order)
        row = int(order[q])
        for side in sides:
            if row < len(side):
                encode = encode_images if direction == "i2t" else encode_texts
                return encode(self.seps, side.tokens, side.items[row:row + 1], self.device)
            row -= len(side)
        raise IndexError(q)

    def run(self, stage: str, m: int, ranks: Sequence[int] = RANKS) -> Dict[str, object]:
        """One stage with M candidates: both directions' recalls, the ceiling and the per-query timings."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        if stage.startswith("seps") and self.seps is None:
            raise ValueError(f"stage {stage!r} needs a SEPS model")
        if stage == "seps-full":
            return self._full(ranks)
        if m < max(ranks):  # R@10 of a list of 5 read as R@5
            raise ValueError(f"M = {m}: a list of {m} candidates has no R@{max(ranks)}; give M of {max(ranks)} or more")
        db = self.db
        out: Dict[str, object] = {"stage": stage, "candidates": m}
        timings = {}
        for direction, queries, q_codes, db_codes, q_ids, db_ids in (
            ("i2t", db.query_img, self.img_codes, self.txt_codes, db.img_ids, db.txt_ids),
            ("t2i", db.query_txt, self.txt_codes, self.img_codes, db.txt_ids, db.img_ids),
        ):
            lists, times = [], {"search": [], "fetch": [], "score": []}
            rescore = self._rescorer(stage, direction)
            for q in tqdm(queries.tolist(), desc=f"{stage} {direction}", disable=not self.progress):
                t0 = time.perf_counter()
                cand = top_k(q_codes[q:q + 1], db_codes, m, ranking="hamming")[1][0]
                t1 = time.perf_counter()
                if rescore is not None:
                    fetch_s, scores = rescore(q, cand)
                    order, _ = rerank(scores[None], cand.numpy()[None], m)
                    cand = cand[torch.from_numpy(order[0])]
                    times["fetch"].append(1000 * fetch_s)
                    times["score"].append(1000 * (time.perf_counter() - t1 - fetch_s))
                times["search"].append(1000 * (t1 - t0))
                lists.append(cand)
            ranked = torch.stack(lists)
            out[f"recall_{direction}"] = recall_of_lists(ranked, q_ids[queries], db_ids, ranks)
            # the first stage's ceiling: a hit anywhere among the M candidates
            out[f"recall_at_m_{direction}"] = recall_of_lists(ranked, q_ids[queries], db_ids, [m])[str(m)]
            out[f"candidates_{direction}"] = ranked.shape[1]  # M, or the whole database where it holds fewer
            timings[direction] = {k: _quantiles(v) for k, v in times.items() if v}
        out["rsum"] = sum(out["recall_i2t"].values()) + sum(out["recall_t2i"].values())
        out["latency_ms"] = timings
        return out

    def _rescorer(self, stage: str, direction: str) -> Optional[Callable[[int, torch.Tensor], Tuple[float, np.ndarray]]]:
        """``(query row, candidate rows) -> (fetch seconds, scores [M] float64)`` of a re-ranking stage: the
        scores ``ucmfh search --rerank`` orders by (:mod:`ucmfh.search.rerank`)."""
        if stage == "hamming":
            return None
        if stage == "cosine-rerank":
            q_real, db_real = (self.img_real, self.txt_real) if direction == "i2t" else (self.txt_real, self.img_real)

            def cosine(q: int, cand: torch.Tensor) -> Tuple[float, np.ndarray]:
                t0 = time.perf_counter()
                stored = db_real[cand.numpy()]
                return time.perf_counter() - t0, cosine_scores(q_real[q:q + 1], stored[None])[0]
            return cosine
        seps = self.seps

        @torch.no_grad()
        def by_seps(q: int, cand: torch.Tensor) -> Tuple[float, np.ndarray]:
            t0 = time.perf_counter()
            index = cand.to(self.device)
            stored = take(self.txt_store if direction == "i2t" else self.img_store, index)
            _synchronize(index.device)  # a GPU gathers asynchronously: its time is the fetch's, not the scoring's
            fetch_s = time.perf_counter() - t0
            query = self._query_state(direction, q)
            scores = score_candidates(seps, query, stored, "img" if direction == "i2t" else "txt")
            return fetch_s, scores.double().cpu().numpy()
        return by_seps

    def _full(self, ranks: Sequence[int]) -> Dict[str, object]:
        db = self.db
        scores, seconds = database_scores(self.seps, db, self.device, self.seps.cfg.pair_chunk, self.progress)
        row = recall_rows(scores, db.txt_ids, db.img_ids, db.query_txt, db.query_img)
        n_pairs = scores.numel()
        return {"stage": "seps-full", "candidates": None, **row, "score_seconds": seconds,
                "pairs": n_pairs, "ms_per_1000_pairs": 1000 * seconds / n_pairs * 1000}

    def store_bytes(self) -> Dict[str, float]:
        """Bytes per item of each store: codes, pooled embeddings, SEPS image state, caption word tokens."""
        out = {"codes": self.img_codes.shape[1] / 8,
               "pooled_float16": self.img_real.itemsize * self.img_real.shape[1]}
        for name, store in (("seps_image_state", self.img_store), ("seps_caption_state", self.txt_store)):
            if store is not None:
                n = store["mask_sparse" if "caption" in name else "basis"].shape[0]
                out[name + "_float32"] = sum(v.numel() * v.element_size() for v in store.values()) / n
        return out


def _synchronize(device: torch.device) -> None:
    """Wait for a CUDA device's queued work (a timer read right after a launch would miss it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
