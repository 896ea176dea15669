"""Write dataset files in the ucmfh HDF5 format (docs/reference.md §1, tokens §9): atomically, validated
before they appear under their name (:func:`write_dataset` from arrays, :func:`open_writer` piece by piece)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

import h5py
import numpy as np

from ucmfh.data.format import SPLITS, DataError, finite_float32, is_bag_of_words
from ucmfh.data.h5 import is_multi_hot, validate_file
from ucmfh.files import PathLike, atomic_file, check_space, checked_path, write_attrs


DTYPES = {"image": np.float32, "text": np.float32, "labels": np.uint8, "ids": np.int64, "text_bow": np.uint8,
          # token features (docs/reference.md §9)
          "image_tokens": np.float16, "text_tokens": np.float16, "text_offsets": np.int64,
          "dense_text_tokens": np.float16, "dense_text_offsets": np.int64}
# strings (UTF-8), one an item: the captions (docs/reference.md §9) and the image files, shown by search results;
# and one a text token row: its word (§9)
STRINGS = ("text_raw", "paths", "text_words")


def make_folder(folder: str, for_path: str) -> None:
    """Create ``folder`` (for writing ``for_path``); a failure is an OSError naming both."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        # not a FileExistsError: a file in the way of a folder is no output to overwrite
        raise OSError(f"{for_path}: cannot create the folder {folder} ({err.strerror or err})") from None


@contextmanager
def open_writer(
    path: PathLike,
    attrs: Optional[Dict[str, object]] = None,
    overwrite: bool = False,
    size: Optional[int] = None,
) -> Iterator[h5py.File]:
    """Stream a dataset file: yield an open temporary file, then validate and rename.

    The caller creates the groups and datasets (use :func:`create_split_dataset`
    for the right dtype and chunking) and fills them piece by piece, so a file
    larger than memory can be written. On normal exit the file is validated
    and only then appears under ``path``; on any error the temporary file is
    removed and ``path`` is left as it was. ``size``: the bytes the data will take, checked against the
    disk's free space before anything is written (:func:`check_space`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a folder, not a file name")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path}: exists; not replaced")
    make_folder(os.path.dirname(os.path.abspath(path)), path)
    if size is not None:
        check_space(path, size)
    with atomic_file(path, replace=overwrite) as tmp:
        try:
            f = h5py.File(tmp, "w")
        except OSError as err:
            reason = os.strerror(err.errno) if err.errno else str(err)
            raise OSError(f"{path}: cannot create a file in {os.path.dirname(tmp)} ({reason})") from None
        with f:
            write_attrs(f, attrs)
            yield f
        try:
            validate_file(tmp)
        except DataError as err:  # said of the file asked for, which is not written
            text = str(err).replace(tmp, path)
            if text.startswith(f"{path}: "):
                text = f"{path}: not written: {text[len(path) + 2:]}"
            raise DataError(text, err.remedy) from None


def create_split_dataset(f: h5py.File, split: str, name: str, shape: tuple) -> h5py.Dataset:
    """Create ``/split/name`` with the format's dtype for ``name``, chunked by rows."""
    if name not in DTYPES:
        raise DataError(f"{f.filename}: /{split}/{name}: unknown dataset name")
    group = f.require_group(split)
    chunks = None
    if len(shape) == 2 and shape[0] and shape[1]:
        # about 1 MiB per chunk, whole rows: row-block reads and writes touch few chunks
        rows = max(1, min(shape[0], (1 << 20) // (shape[1] * np.dtype(DTYPES[name]).itemsize)))
        chunks = (rows, shape[1])
    return group.create_dataset(name, shape=shape, dtype=DTYPES[name], chunks=chunks)


def write_dataset(
    path: PathLike,
    splits: Dict[str, Dict[str, np.ndarray]],
    attrs: Optional[Dict[str, object]] = None,
    overwrite: bool = False,
) -> str:
    """Write a dataset file atomically and validate it.

    ``splits`` maps each of train/query/retrieval to a dict with ``image``,
    ``text``, ``labels`` and optionally ``ids``, ``text_bow``, the token arrays of
    docs/reference.md §9 (``image_tokens``, ``text_tokens``, ``text_offsets``, ``dense_text_*``) and strings,
    one an item: ``text_raw`` (the captions) and ``paths`` (the image files), which search results show; or one a
    ``text_tokens`` row: ``text_words``, its word.
    The file appears under its final name only once complete and valid.
    """
    path = checked_path("write_dataset", path)
    if not isinstance(splits, dict) or not all(isinstance(split, dict) for split in splits.values()):
        raise TypeError(f"write_dataset: splits must be a dict of train/query/retrieval to dicts of arrays "
                        f"({{'image': ..., 'text': ..., 'labels': ...}}), got {type(splits).__name__}")
    size = sum(_items(array) * np.dtype(DTYPES[name]).itemsize for split in splits.values() if isinstance(split, dict)
               for name, array in split.items() if name in DTYPES and array is not None)
    with open_writer(path, attrs, overwrite, size) as f:
        for split in SPLITS:
            if split not in splits:
                raise DataError(f"{path}: /{split}: missing split in the arrays to write")
            f.create_group(split)
            for name, array in splits[split].items():
                if name not in DTYPES and name not in STRINGS:
                    known = ", ".join([*DTYPES, *STRINGS])
                    raise DataError(f"{path}: /{split}/{name}: unknown dataset name (the names: {known})")
                if array is None:
                    continue
                if name in STRINGS:
                    rows = splits[split].get("text_tokens" if name == "text_words" else "image")
                    f[split].create_dataset(name, data=_strings(path, f"/{split}/{name}", array, rows),
                                            dtype=h5py.string_dtype())
                    continue
                array = _as_format(path, f"/{split}/{name}", name, np.asarray(array))
                chunks = (1, *array.shape[1:]) if array.ndim == 3 else True if array.ndim == 2 else None
                f[split].create_dataset(name, data=array, chunks=chunks if array.size else None)
    return path


def _items(array: object) -> int:
    """The values an array holds, from its shape where it has one (an HDF5 dataset, a memmap: not read for it);
    0 for one numpy cannot make (refused when written, in the writer's words)."""
    if hasattr(array, "shape"):
        return int(np.prod(array.shape))
    try:
        return np.asarray(array).size
    except ValueError:  # ragged
        return 0


def _strings(path: str, where: str, values: object, rows: Optional[np.ndarray]) -> list:
    """Strings, as many as ``rows`` has rows (None refused: it would be the text 'None')."""
    if isinstance(values, (str, bytes)):
        raise DataError(f"{path}: {where}: expected one string an item, got a single {type(values).__name__}")
    values = list(values)
    for i, v in enumerate(values):
        if isinstance(v, bytes):
            try:
                values[i] = v.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: {where}: item {i} is bytes, not UTF-8 ({err.reason} at byte {err.start})") \
                    from None
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise DataError(f"{path}: {where}: item {bad} is {type(values[bad]).__name__}, not a string ('' for none)")
    for i, v in enumerate(values):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as err:  # a file name read by os.fsdecode of bytes not UTF-8: a lone surrogate
            raise DataError(f"{path}: {where}: item {i} is no UTF-8 text ({err.reason} at character {err.start}: "
                            "a name of bytes not UTF-8?)") from None
    nul = next((i for i, v in enumerate(values) if "\0" in v), None)
    if nul is not None:  # h5py's traceback: 'VLEN strings do not support embedded NULLs'
        raise DataError(f"{path}: {where}: item {nul} holds a NUL character (\\x00), which an HDF5 string cannot "
                        "hold")
    if rows is not None and len(values) != len(rows):
        raise DataError(f"{path}: {where}: {len(values)} strings, the split has {len(rows)} "
                        + ("text token rows" if where.endswith("text_words") else "rows"))
    return values


def _as_format(path: str, where: str, name: str, array: np.ndarray) -> np.ndarray:
    """``array`` in the format's dtype for ``name``, refusing a cast that would change a value."""
    if array.dtype.kind not in "biuf":
        raise DataError(f"{path}: {where}: expected numbers, got {array.dtype}")
    if name == "ids" and array.dtype.kind not in "iu":
        raise DataError(f"{path}: {where}: ids must be integers, got {array.dtype}")  # 2.7 would become 2
    if name == "labels" and array.ndim != 2:
        raise DataError(f"{path}: {where}: expected multi-hot labels [N, C], got shape {array.shape}"
                        + (" (one class an item? give it one-hot: numpy.eye(C)[classes])" if array.ndim == 1 else ""))
    if name == "labels" and not is_multi_hot(array):
        raise DataError(f"{path}: {where}: labels must be multi-hot 0/1 values")
    if name == "text_bow" and not is_bag_of_words(array):
        raise DataError(f"{path}: {where}: bag-of-words counts must be whole numbers from 0 to 255 (uint8)")
    if name in ("image", "text") and array.dtype.kind == "f":  # said as such, not as numpy's overflow warning
        return finite_float32(array, f"{path}: {where}")
    return array.astype(DTYPES[name], copy=False)
