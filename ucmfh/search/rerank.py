"""The re-ranking step: a first stage's candidates ordered by a finer score, the top k kept.

One step serves ``ucmfh search --rerank`` (:mod:`ucmfh.search.results`) and the measurement of
two-stage retrieval, ``ucmfh rerank`` (:class:`ucmfh.two_stage.Reranking`, docs/seps.md), so that
what the docs measure is what a user runs. The scores are the cosine of the real-valued head
outputs an index keeps (:data:`ucmfh.search.index.EMBEDDING_DTYPE`, compared in float64), or the SEPS matcher's
(:mod:`ucmfh.search.seps_rerank`, :func:`ucmfh.seps.scoring.score_candidates`). numpy only.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

RERANKS = ("cosine", "seps")


def cosine_scores(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Cosine of each query with each of its candidates, in float64.

    Shape: queries [Q, E] (the query's head outputs); candidates [Q, M, E] (the embeddings kept for
    its M candidates) -> [Q, M].
    """
    emb = np.asarray(candidates, dtype=np.float64)
    q = np.asarray(queries, dtype=np.float64)
    score = np.einsum("qme,qe->qm", emb, q)
    score /= np.maximum(np.linalg.norm(emb, axis=2) * np.linalg.norm(q, axis=1)[:, None], 1e-12)
    return score


def rerank(scores: np.ndarray, positions: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Each query's candidates by score, highest first, ties by position ascending (docs/reference.md
    §6); the first k kept.

    Shape: scores, positions [Q, M] -> (order [Q, min(k, M)] into the candidate axis, the scores in it).
    """
    order = np.lexsort((positions, -scores), axis=1)[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)
