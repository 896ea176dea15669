"""Token features in the HDF5 format (docs/reference.md §9): validation and a lazy reader.

Beside the pooled ``image`` / ``text`` of a split, a file may hold

* ``image_tokens`` [N, T, C_img] (patch or grid tokens; may be a virtual dataset),
* ``text_tokens`` [ΣL, C_txt] with ``text_offsets`` [N+1] int64 (CSR: item i owns rows
  ``text_offsets[i]:text_offsets[i+1]``),
* ``dense_text_tokens`` / ``dense_text_offsets``: long descriptions, the same CSR rule,
* ``text_raw`` [N] and ``text_words`` [ΣL]: strings.

Every split has a token dataset or none does; T and the widths agree between splits.
:func:`check_tokens` validates their layout and :func:`check_token_values` their values, in blocks (bounded
memory; a file's token values are scanned where they are read, not by every load); :class:`Tokens` reads the
rows asked for, from memory when the split's tokens fit ``max_memory_bytes`` and from the
file otherwise (sorted reads, as HDF5 wants).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Set, Tuple

import h5py
import numpy as np
import torch

from ucmfh.data.format import SPLITS, DataError, check_finite, check_utf8_column
from ucmfh.files import read_attrs

IMAGE_TOKENS = "image_tokens"
# (tokens, offsets) pairs, CSR
TEXT_SETS = {"text": ("text_tokens", "text_offsets"), "dense_text": ("dense_text_tokens", "dense_text_offsets")}
TOKEN_DATASETS = (IMAGE_TOKENS, *(name for pair in TEXT_SETS.values() for name in pair))
# the root attribute of a file with dense descriptions: what each was generated from (docs/reference.md §9), its
# item's image or its item's text; dense text is leak-free only where it is of the candidate image (§8, defect 1)
DENSE_FROM = "dense_text_from"
DENSE_SOURCES = {"image": "its item's image", "text": "its item's text"}
_CHECK_ROWS = 65536  # token rows (text) checked at a time
_CHECK_ITEMS = 256  # items (image tokens) checked at a time
DEFAULT_TOKEN_MEMORY = 2 << 30  # a split's tokens are read into memory below this many bytes
# HDF5 keeps a source dataset open for every mapping of a virtual dataset it has read through (about 26 kB
# each; one mapping per item in the §9 layout) until the virtual dataset is closed: long reads reopen it
# after this many items, bounding that memory (each reopen parses the mappings, about 3 us each)
_REOPEN_ITEMS = 8192


def _fail(path: str, where: str, problem: str) -> DataError:
    return DataError(f"{path}: {where}: {problem}")


def _dataset(path: str, group: h5py.Group, name: str, split: str) -> Optional[h5py.Dataset]:
    obj = group.get(name)
    if obj is not None and not isinstance(obj, h5py.Dataset):
        raise _fail(path, f"/{split}/{name}", "expected a dataset")
    if obj is not None:
        check_virtual_sources(path, f"/{split}/{name}", obj)
    return obj


def check_virtual_sources(path: str, where: str, dset: h5py.Dataset) -> None:
    """Refuse a virtual dataset (the §9 layout's ``image_tokens`` is one) whose source file or dataset is gone:
    HDF5 reads its rows as the fill value, zeros, without an error, and zeros pass every check of values. A
    source file is looked for as HDF5 does: by its name as stored, then beside ``path``. So is one of this file
    whose rows are the query split's where it is another split's, or another's where it is the query's (the
    layout's training and retrieval splits may share rows): the file check compares pooled features alone."""
    if not dset.is_virtual:
        return
    for file_name, dset_name in sorted({(s.file_name, s.dset_name) for s in dset.virtual_sources()}):
        opened = file_name != "."  # the source's own file, to close; else this one, open elsewhere
        split, source = where.strip("/").split("/")[0], dset_name.strip("/").split("/")[0]
        if not opened and "query" in (split, source) and split != source:
            raise _fail(path, where, f"a virtual dataset whose rows are {dset_name}'s: the query split's rows and "
                                     "another split's must be disjoint (a query item trained on inflates every score)")
        if not opened:
            holder, shown = dset.file, "this file"
        else:
            found = [p for p in (file_name, os.path.join(os.path.dirname(os.path.abspath(path)), file_name))
                     if os.path.isfile(p)]
            if not found:
                raise _fail(path, where, f"a virtual dataset whose source file {file_name} is not there (its rows "
                                         "would read as zeros)")
            holder, shown = h5py.File(found[0], "r"), found[0]
        try:
            if not isinstance(holder.get(dset_name), h5py.Dataset):
                raise _fail(path, where, f"a virtual dataset whose source {dset_name} in {shown} is not there (its "
                                         "rows would read as zeros)")
        finally:
            if opened:
                holder.close()


def _read(path: str, where: str, dset: h5py.Dataset, rows=slice(None)) -> np.ndarray:
    try:
        return dset[rows]
    except (OSError, ValueError, TypeError) as err:  # a damaged chunk, a virtual source that is gone
        raise _fail(path, where, f"unreadable data ({err})") from None


def _read_rows(path: str, where: str, group: h5py.Group, name: str, rows: np.ndarray) -> np.ndarray:
    """Sorted ``rows`` of ``group[name]``, read ``_REOPEN_ITEMS`` at a time, each time from a fresh handle."""
    first = _read(path, where, group[name], rows[:_REOPEN_ITEMS])
    if len(rows) <= _REOPEN_ITEMS:
        return first
    out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
    out[:len(first)] = first
    for start in range(_REOPEN_ITEMS, len(rows), _REOPEN_ITEMS):
        out[start:start + _REOPEN_ITEMS] = _read(path, where, group[name], rows[start:start + _REOPEN_ITEMS])
    return out


def _same_width(path: str, where: str, dims: Dict[str, tuple], key: str, split: str, value: tuple) -> None:
    previous = dims.setdefault(key, (split, value))
    if previous[1] != value:
        raise _fail(path, where, f"shape {value} per item, but /{previous[0]}/{key} has {previous[1]}")


def check_offsets(path: str, where: str, offsets: np.ndarray, n_items: int, n_rows: int) -> None:
    """The CSR rule: [N+1] integers, ``[0] = 0``, non-decreasing, ``[N] = ΣL`` (the token rows)."""
    if offsets.dtype.kind not in "iu":
        raise _fail(path, where, f"offsets must be integers, got {offsets.dtype}")
    if offsets.shape != (n_items + 1,):
        raise _fail(path, where, f"expected shape ({n_items + 1},) (items + 1), got {offsets.shape}")
    if offsets[0] != 0:
        raise _fail(path, where, f"the first offset must be 0, got {offsets[0]}")
    steps = np.diff(offsets.astype(np.int64))
    if (steps < 0).any():
        item = int(np.argmax(steps < 0))
        raise _fail(path, where, f"offsets not increasing: item {item} ends at {offsets[item + 1]}, "
                                 f"before it starts at {offsets[item]}")
    if offsets[-1] != n_rows:
        raise _fail(path, where, f"the last offset is {offsets[-1]}, but the token dataset has {n_rows} rows")


_FINITE: Set[Tuple[str, str, int, int]] = set()  # (file, split, size, mtime) whose token values were found finite


def check_token_values(path: str, group: h5py.Group, split: str) -> None:
    """The values of one split's token datasets finite, read in blocks (bounded memory); their layout is
    :func:`check_tokens`'. Run where tokens are read (:class:`Tokens`) and by ``ucmfh validate``, not by every
    load of a file whose pooled features alone are used (a scan of all its tokens: seconds to minutes); once
    a process for a file as it is (its size and modification time)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), split, stat.st_size, stat.st_mtime_ns)
    if key in _FINITE:
        return
    image = group.get(IMAGE_TOKENS)
    if image is not None:
        where = f"/{split}/{IMAGE_TOKENS}"
        for start in range(0, image.shape[0], _CHECK_ITEMS):
            if start and start % _REOPEN_ITEMS < _CHECK_ITEMS:
                image = group[IMAGE_TOKENS]
            block = _read(path, where, image, slice(start, start + _CHECK_ITEMS))
            bad = ~np.isfinite(block)
            if bad.any():
                item, token, col = np.argwhere(bad)[0]
                raise _fail(path, where, f"{int(bad.sum())} non-finite values (first: item {start + item}, "
                                         f"token {token}, column {col})")
    for tokens_name, _ in TEXT_SETS.values():
        tokens = group.get(tokens_name)
        if tokens is None:
            continue
        where = f"/{split}/{tokens_name}"
        for start in range(0, tokens.shape[0], _CHECK_ROWS):
            check_finite(_read(path, where, tokens, slice(start, start + _CHECK_ROWS)), f"{path}: {where}", start)
    _FINITE.add(key)


def check_tokens(path: str, group: h5py.Group, split: str, n_items: int, dims: Dict[str, tuple],
                 values: bool = True) -> List[str]:
    """Check one split's token datasets (if any): their layout, and with ``values`` that every value is
    finite (:func:`check_token_values`); ``dims`` collects shapes across splits.

    Returns the token datasets the split has.
    """
    present = []
    image = _dataset(path, group, IMAGE_TOKENS, split)
    if image is not None:
        where = f"/{split}/{IMAGE_TOKENS}"
        if image.ndim != 3 or image.shape[0] != n_items or 0 in image.shape:
            raise _fail(path, where, f"expected shape ({n_items}, T, C) with T, C > 0, got {image.shape}")
        if image.dtype.kind != "f":
            raise _fail(path, where, f"expected floating-point tokens, got {image.dtype}")
        _same_width(path, where, dims, IMAGE_TOKENS, split, image.shape[1:])
        present.append(IMAGE_TOKENS)
    widths = {}  # each text set's token width, in TEXT_SETS' order: the words', then the descriptions'
    for tokens_name, offsets_name in TEXT_SETS.values():
        tokens = _dataset(path, group, tokens_name, split)
        offsets = _dataset(path, group, offsets_name, split)
        if tokens is None and offsets is None:
            continue
        if tokens is None or offsets is None:
            have, lack = (tokens_name, offsets_name) if offsets is None else (offsets_name, tokens_name)
            raise _fail(path, f"/{split}/{lack}", f"missing dataset, but /{split}/{have} exists (they come in pairs)")
        where = f"/{split}/{tokens_name}"
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise _fail(path, where, f"expected shape (rows, C) with C > 0, got {tokens.shape}")
        if tokens.dtype.kind != "f":
            raise _fail(path, where, f"expected floating-point tokens, got {tokens.dtype}")
        _same_width(path, where, dims, tokens_name, split, tokens.shape[1:])
        other = next(iter(widths.items()), None)
        if other is not None and other[1] != tokens.shape[1]:  # SEPS projects both with the text's one layer
            raise _fail(path, where, f"{tokens.shape[1]}-d rows, but /{split}/{other[0]} has {other[1]}-d rows (a "
                                     "description's tokens are of the captions' extractor, C_txt)")
        widths[tokens_name] = tokens.shape[1]
        check_offsets(path, f"/{split}/{offsets_name}", _read(path, f"/{split}/{offsets_name}", offsets),
                      n_items, tokens.shape[0])
        present += [tokens_name, offsets_name]
    words = _dataset(path, group, "text_words", split)  # text_raw, one string an item: the split's own check
    if words is not None:
        where = f"/{split}/text_words"
        if "text_tokens" not in group:
            raise _fail(path, where, f"the word of each /{split}/text_tokens row, but there is no text_tokens dataset")
        if words.shape != (group["text_tokens"].shape[0],):
            raise _fail(path, where, f"expected shape ({group['text_tokens'].shape[0]},), got {words.shape}")
        if words.dtype.kind not in "OSU":  # §9: UTF-8 strings (float 'words' were valid)
            raise _fail(path, where, f"expected strings, got {words.dtype}")
        if values:
            check_utf8_column(words, f"{path}: {where}")
    if values:
        check_token_values(path, group, split)
    return present


def check_dense_source(path: str, attrs: Dict[str, object]) -> None:
    """A file with dense descriptions says what each was generated from (root attribute :data:`DENSE_FROM`): a
    file without it was valid, and its descriptions, of the captions or of the images, were taken for the
    images' by ``--dense-text image`` without a word."""
    source = attrs.get(DENSE_FROM)
    if source not in DENSE_SOURCES:
        given = "missing" if source is None else f"{source!r}"
        raise _fail(path, f"root attribute '{DENSE_FROM}'", f"{given}; a file with dense_text_tokens says what each "
                    "description was generated from: " + ", ".join(f"'{name}' ({what})" for name, what in
                                                                      DENSE_SOURCES.items()))


def check_dense_of_images(path: str, attrs: Dict[str, object], mode: str) -> None:
    """SEPS's dense text (``mode``: ``image`` or ``leak``, ``SepsConfig.dense_text``) gives an image a description of
    an image: refused where the file's descriptions were generated from something else (:data:`DENSE_FROM`)."""
    check_dense_source(path, attrs)
    source = attrs[DENSE_FROM]
    if source != "image":
        raise DataError(f"{path}: its dense descriptions were generated from {DENSE_SOURCES[source]} (root attribute "
                        f"'{DENSE_FROM}': {source!r}); dense_text={mode!r} takes descriptions of images")


def check_token_splits(path: str, present: Dict[str, List[str]]) -> None:
    """Every split has each token dataset or none does."""
    for name in TOKEN_DATASETS:
        having = [split for split in SPLITS if name in present[split]]
        if having and len(having) < len(SPLITS):
            missing = next(split for split in SPLITS if split not in having)
            raise _fail(path, f"/{missing}/{name}", f"missing dataset, but /{having[0]}/{name} exists: "
                                                    "either every split has it or none")


def require_tokens(path: str, group: h5py.Group, split: str) -> None:
    """A ``DataError`` naming the file and split unless ``group`` (that split) holds token features."""
    missing = [name for name in (IMAGE_TOKENS, "text_tokens", "text_offsets") if name not in group]
    if missing:
        raise DataError(f"{path}: /{split}: no token features ({', '.join(missing)} missing; "
                        "docs/reference.md §9, `ucmfh extract --tokens` writes them)")
    for name in (IMAGE_TOKENS, "text_tokens", "text_offsets"):
        _dataset(path, group, name, split)  # each a dataset, each virtual one's sources there


def check_has_tokens(path: str) -> None:
    """Say before any work starts, as :class:`Tokens` would on opening, that a file lacks token features or
    holds a value that is not finite among them."""
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            require_tokens(path, f[split], split)
            check_token_values(path, f[split], split)


def texts_without_words(path: str) -> Dict[str, Tuple[int, int]]:
    """Per split with word tokens, its texts that have none and all its texts: valid (§9), but SEPS scores such a
    text by nothing (every image alike to it)."""
    with h5py.File(path, "r") as f:
        return {split: (int((np.diff(f[split]["text_offsets"][()]) == 0).sum()), f[split]["text_offsets"].shape[0] - 1)
                for split in SPLITS if "text_offsets" in f[split]}


class Tokens:
    """Reads one split's tokens by item, lazily.

    ``images(rows)`` → [n, T, C_img] float32; ``texts(rows)`` → padded [n, L_max, C_txt] float32
    and a [n, L_max] bool mask of real rows (``dense=True``: the dense descriptions). Items that share
    an id are the same image (docs/reference.md §1), so with ``ids`` the image tokens are read and
    kept once per id. Below ``max_memory_bytes`` a split's tokens are read whole on first use. Opening scans the
    split's values (:func:`check_token_values`) unless ``check_values=False`` (a search reading a few rows).

    Example:
        >>> tok = Tokens("data/flickr8k1000.h5", "query")      # doctest: +SKIP
        >>> v = tok.images(np.arange(4)); words, mask = tok.texts(np.arange(4))  # doctest: +SKIP
    """

    def __init__(self, path: str, split: str, max_memory_bytes: int = DEFAULT_TOKEN_MEMORY,
                 check_values: bool = True) -> None:
        self.path, self.split = os.fspath(path), split
        self._file = h5py.File(self.path, "r")
        group = self._file[split]
        require_tokens(self.path, group, split)
        if check_values:  # load_dataset checked their layout alone
            check_token_values(self.path, group, split)
        self._group = group
        self.n_items = group[IMAGE_TOKENS].shape[0]
        self.ids = (group["ids"][()] if "ids" in group else np.arange(self.n_items)).astype(np.int64)
        self.attrs = read_attrs(self._file)
        _, first, self._image_of = np.unique(self.ids, return_index=True, return_inverse=True)
        self._first = first  # the row read for each distinct image
        self.n_image_tokens, self.d_img = group[IMAGE_TOKENS].shape[1:]
        self.d_txt = group["text_tokens"].shape[1]
        self.has_dense = "dense_text_tokens" in group
        self._offsets = {kind: group[offsets][()].astype(np.int64) for kind, (_, offsets) in TEXT_SETS.items()
                         if offsets in group}
        self._memory: Dict[str, np.ndarray] = {}
        size = len(first) * self.n_image_tokens * self.d_img * 2 + sum(
            group[tokens].shape[0] * group[tokens].shape[1] * 2 for tokens, _ in TEXT_SETS.values() if tokens in group)
        self.in_memory = size <= max_memory_bytes

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "Tokens":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows of a dataset, from memory or by one sorted read."""
        dset = self._group[name]
        where = f"/{self.split}/{name}"
        if self.in_memory:
            if name not in self._memory:
                if name == IMAGE_TOKENS:  # one row per distinct image
                    self._memory[name] = _read_rows(self.path, where, self._group, name, np.sort(self._first))[
                        np.argsort(np.argsort(self._first))]
                else:
                    self._memory[name] = _read(self.path, where, dset)
            return self._memory[name][rows]
        unique, inverse = np.unique(rows, return_inverse=True)
        return _read(self.path, where, dset, unique)[inverse]

    def text_lengths(self, dense: bool = False) -> np.ndarray:
        """Word tokens per item. Shape: [N] int64."""
        return np.diff(self._offsets["dense_text" if dense else "text"])

    def image_index(self, items: np.ndarray) -> np.ndarray:
        """The distinct image of each item (0..n_images-1)."""
        return self._image_of[np.asarray(items)]

    @property
    def n_images(self) -> int:
        return len(self._first)

    def images(self, items: np.ndarray) -> torch.Tensor:
        """Image tokens of ``items``. Shape: [n] -> [n, T, C_img] float32."""
        index = self.image_index(items)
        rows = index if self.in_memory else self._first[index]
        return torch.from_numpy(self._rows(IMAGE_TOKENS, rows).astype(np.float32))

    def texts(self, items: np.ndarray, dense: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """Word tokens of ``items``, padded. Shape: [n] -> [n, L_max, C_txt] float32, [n, L_max] bool."""
        kind = "dense_text" if dense else "text"
        if kind not in self._offsets:
            raise DataError(f"{self.path}: /{self.split}: no {TEXT_SETS[kind][0]}")
        offsets = self._offsets[kind]
        items = np.asarray(items)
        starts, ends = offsets[items], offsets[items + 1]
        lengths = ends - starts
        flat = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(items) else np.zeros(0, int)
        rows = self._rows(TEXT_SETS[kind][0], flat).astype(np.float32)
        width = max(1, int(lengths.max()) if len(items) else 1)
        out = np.zeros((len(items), width, rows.shape[1]), dtype=np.float32)
        mask = np.arange(width)[None, :] < lengths[:, None]
        out[mask] = rows
        return torch.from_numpy(out), torch.from_numpy(mask)
