"""What callers pass to the metrics: option types and defaults, checks, and conversions.

Codes are ±1 tensors [N, n_bits], or packed bits [N, n_bytes] uint8 (see
:mod:`ucmfh.codes`); embeddings (cosine ranking) are real-valued [N, d];
labels are multi-hot [N, C] (any integer or bool dtype); ids are integers [N].
The public metric functions take numpy arrays as well as tensors
(:func:`as_tensors`).
"""
from __future__ import annotations

from typing import Literal, Optional, Tuple

import numpy as np
import torch

from ucmfh.bits import check_n_bits, check_packed, check_signed
from ucmfh.codes import ArrayLike, unpack_codes
from ucmfh.similarity import sign_codes

Ranking = Literal["hamming", "cosine"]
"""Hamming distance ascending (±1 or packed codes), or cosine similarity descending (embeddings)."""
Empty = Literal["zero", "skip"]
"""A query with no relevant item in the retrieval set scores 0 and counts ("zero"), or is left out ("skip")."""
Ties = Literal["index", "expected"]
"""Order of tied items: by retrieval index ("index", reproducible, the field's), or the exact mean over
every order, all equally likely ("expected", :mod:`ucmfh.metrics.ties`)."""
TIES = ("index", "expected")

DEFAULT_K = 50  # MAP@50: the field's cut-off, the default of every metric, stage and command that takes k
DEFAULT_CHUNK_SIZE = 256
DEFAULT_RETRIEVAL_CHUNK_SIZE = 65536


def as_tensor(x: Optional[ArrayLike]) -> Optional[torch.Tensor]:
    """A tensor of ``x``: tensors and None pass through; a numpy array shares its memory
    (``torch.from_numpy``) unless torch cannot share it (negative strides, read-only,
    non-native byte order), and then it is copied once. Complex values are refused (``TypeError``: their real
    parts were read, a ComplexWarning aside)."""
    if x is None:
        return x
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise TypeError(f"expected a torch tensor or a numpy array, got {type(x).__name__}")
    if x.dtype.is_complex if isinstance(x, torch.Tensor) else np.iscomplexobj(x):
        raise TypeError(f"complex values ({str(x.dtype).replace('torch.', '')}); codes, labels and ids are real")
    if isinstance(x, torch.Tensor):
        return x
    if not x.flags.writeable or not x.dtype.isnative or any(s < 0 for s in x.strides):
        x = np.array(x, dtype=x.dtype.newbyteorder("="))
    return torch.from_numpy(x)


def as_tensors(*xs: Optional[ArrayLike]) -> Tuple[Optional[torch.Tensor], ...]:
    """:func:`as_tensor` of each argument, as a tuple; one of another type is named by its place (a metric's
    arguments come in this order: the query's, then the retrieval set's)."""
    out = []
    for place, x in enumerate(xs, 1):
        try:
            out.append(as_tensor(x))
        except TypeError as err:
            raise TypeError(f"argument {place} of {len(xs)}: {err}") from None
    return tuple(out)


def check_choice(name: str, value: str, choices: Tuple[str, ...]) -> None:
    """Raise ValueError naming the option unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_integer(name: str, value: object) -> None:
    """``TypeError`` naming ``name`` unless ``value`` is a whole number (True is no count, and 2.5 or '5' failed
    deep inside, or ran as 2)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")


def check_count(name: str, value: object, least: int = 1) -> None:
    """Refuse anything but a whole number >= ``least``: ``TypeError`` for another type, ``ValueError`` below
    ``least``; each names ``name``."""
    _check_integer(name, value)
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")


def check_chunks(chunk_size: int, retrieval_chunk_size: int) -> None:
    """Raise ValueError unless both chunk sizes are positive integers (TypeError for another type)."""
    _check_integer("chunk_size", chunk_size)
    _check_integer("retrieval_chunk_size", retrieval_chunk_size)
    if chunk_size < 1 or retrieval_chunk_size < 1:
        raise ValueError(f"chunk sizes must be >= 1, got {chunk_size} and {retrieval_chunk_size}")


def _check_rows(query: torch.Tensor, retrieval: torch.Tensor) -> None:
    """Codes or embeddings are 2-D, a row an item (one query of 16 bits, [16], was read as 16 queries)."""
    if query.ndim != 2 or retrieval.ndim != 2:
        raise ValueError(f"query and retrieval must be 2-D, a row an item (one query: codes[None]), got "
                         f"{tuple(query.shape)} and {tuple(retrieval.shape)}")


def check_pair(query: torch.Tensor, retrieval: torch.Tensor, ranking: str) -> None:
    """Validate a query/retrieval pair of codes or embeddings for ``ranking``."""
    check_choice("ranking", ranking, ("hamming", "cosine"))
    _check_rows(query, retrieval)
    if (query.dtype == torch.uint8) != (retrieval.dtype == torch.uint8):  # before the widths: 8 bits a byte
        packed = "query" if query.dtype == torch.uint8 else "retrieval"
        raise ValueError(f"query and retrieval must both be packed (uint8) or both ±1 codes; the {packed} codes are "
                         "packed, the others not")
    if query.shape[1] != retrieval.shape[1]:
        raise ValueError(f"query and retrieval differ in width: {query.shape[1]} and {retrieval.shape[1]}")
    if ranking == "cosine" and query.dtype == torch.uint8:
        raise ValueError("cosine ranking needs real-valued embeddings, got packed codes")
    if ranking == "hamming":  # one refusal on every path (the kernels' was of their own sizes; torch scored)
        check_n_bits(n_bits_of(query), "query and retrieval codes")
    elif query.shape[1] == 0:
        raise ValueError("query and retrieval embeddings have no dimensions (width 0)")
    check = check_packed if query.dtype == torch.uint8 else check_signed
    for codes, what in ((query, "query"), (retrieval, "retrieval")):
        if codes.is_floating_point() and not bool(torch.isfinite(codes).all()):  # NaN has no sign, nor a cosine
            raise ValueError(f"{what} {'codes' if ranking == 'hamming' else 'embeddings'}: non-finite values (NaN or "
                             "infinity)")
    if ranking == "hamming":
        check(query, "query codes")
        check(retrieval, "retrieval codes")
    if retrieval.shape[0] == 0:
        raise ValueError("the retrieval set is empty")
    if query.shape[0] == 0:  # a mean over no query, 0.0, read as a score
        raise ValueError("the query set is empty")


def check_labels(
    query: torch.Tensor, retrieval: torch.Tensor, query_labels: torch.Tensor, retrieval_labels: torch.Tensor
) -> None:
    """Validate labels [Q, C], [N, C] against codes [Q, ·], [N, ·]."""
    _check_rows(query, retrieval)
    ql, rl = query_labels, retrieval_labels
    _check_labels_given(ql, rl)
    if ql.shape[0] != query.shape[0] or rl.shape[0] != retrieval.shape[0]:
        raise ValueError(
            f"labels do not match the codes: {ql.shape[0]} query labels for {query.shape[0]} queries, "
            f"{rl.shape[0]} retrieval labels for {retrieval.shape[0]} items"
        )
    check_label_matrices(ql, rl)


def _check_labels_given(ql: Optional[torch.Tensor], rl: Optional[torch.Tensor]) -> None:
    if ql is None or rl is None:  # a caption set's split has labels None
        raise TypeError(f"{'query' if ql is None else 'retrieval'}_labels: None; labelled relevance needs multi-hot "
                        "labels [N, C]. A caption set has none (relevance is a shared id): use map_at_k_by_id, "
                        "recall_at_ranks or evaluate_caption_set")


def check_label_matrices(ql: torch.Tensor, rl: torch.Tensor) -> None:
    """Validate query and retrieval labels by themselves: [Q, C] and [N, C] of one C >= 1, of 0 and 1 alone
    (None refused: a caption set's)."""
    _check_labels_given(ql, rl)
    if ql.ndim != 2 or rl.ndim != 2 or ql.shape[1] != rl.shape[1]:
        raise ValueError(f"labels must be [N, C] with the same C, got {tuple(ql.shape)} and {tuple(rl.shape)}")
    if ql.shape[1] == 0:  # nothing relevant anywhere: 0.0 on the torch path, the kernels' own refusal on theirs
        raise ValueError("query_labels and retrieval_labels have no classes (C = 0); labels are multi-hot [N, C], "
                         "C >= 1")
    for labels, what in ((ql, "query"), (rl, "retrieval")):  # relevance is a shared 1: ±1 labels made all relevant
        if labels.dtype != torch.bool and not bool(((labels == 0) | (labels == 1)).all()):
            raise ValueError(f"{what} labels: values other than 0 and 1; labels are multi-hot (0/1) [N, C]")


def check_ids(
    query: torch.Tensor, retrieval: torch.Tensor, query_ids: torch.Tensor, retrieval_ids: torch.Tensor
) -> None:
    """Validate ids [Q], [N] against codes [Q, ·], [N, ·]."""
    _check_rows(query, retrieval)
    if query_ids is None or retrieval_ids is None:
        raise TypeError(f"{'query' if query_ids is None else 'retrieval'}_ids: None; relevance by id needs an id of "
                        "each item [N] (integers: a caption's image). Labelled data: use map_at_k, precision_at_k, "
                        "... with labels")
    if query_ids.shape != (query.shape[0],) or retrieval_ids.shape != (retrieval.shape[0],):
        raise ValueError(
            f"ids must be 1-D and match the codes: got {tuple(query_ids.shape)} for {query.shape[0]} "
            f"queries and {tuple(retrieval_ids.shape)} for {retrieval.shape[0]} items"
        )
    for ids, what in ((query_ids, "query"), (retrieval_ids, "retrieval")):  # 0.1 and 0.2 were both read as id 0
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"{what} ids must be integers, got {str(ids.dtype).replace('torch.', '')}")


def n_bits_of(codes: torch.Tensor) -> int:
    """Code length as ranked: packed codes count their padding bits, which add no distance."""
    return 8 * codes.shape[1] if codes.dtype == torch.uint8 else codes.shape[1]


def as_pm1(codes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """±1 float32 codes on ``device`` from ±1, real-valued (read by sign, 0 as +1: docs/reference.md §5) or packed
    codes. (Real values were ranked by their dot products on the torch path, a GPU's, where the compiled kernels
    read their signs: two figures for one set of codes.)"""
    codes = codes.to(device)
    if codes.dtype == torch.uint8:
        return unpack_codes(codes, 8 * codes.shape[1])
    return sign_codes(codes)
