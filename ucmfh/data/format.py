"""The vocabulary of the ucmfh HDF5 format (docs/reference.md §1): its splits, its required datasets,
the error a file that breaks it raises, and the check every feature block passes. numpy only, so
that the token files (:mod:`ucmfh.data.tokens`) and a CPU search use it without the loaders."""
from __future__ import annotations

import os
import zipfile
from typing import List, Optional, Tuple

import numpy as np

SPLITS = ("train", "query", "retrieval")
REQUIRED = ("image", "text", "labels")
CODES_FORMAT = "ucmfh-codes"  # the root attribute 'format' of a codes file (ucmfh.codes), which is not a dataset


class DataError(ValueError):
    """A dataset or input file breaks the format; the message names file, dataset and problem.

    ``remedy``, when given, is ``(setting, value, effect)``: the setting under
    which the input would be accepted, e.g. ``("bad_images", "skip", "to leave
    such images out")``. The message itself names no setting; each front door
    words the remedy as its own option.
    """

    def __init__(self, message: str, remedy: Optional[Tuple[str, object, str]] = None):
        super().__init__(message)
        self.remedy = remedy


class MissingFile(DataError, FileNotFoundError):
    """An input file or folder is not there: a :class:`DataError`, as every other refusal of an input, and a
    ``FileNotFoundError``, as Python's own ``open`` says it (a loader's missing file was one or the other)."""


def first_of_each_id(ids: np.ndarray) -> np.ndarray:
    """Rows holding the first occurrence of each id, ascending: equal ids are the same image
    (docs/reference.md §7), which a caption set indexes, or asks, once. Shape: [N] -> [M] int64."""
    return np.sort(np.unique(np.asarray(ids), return_index=True)[1]).astype(np.int64)


def id_problem(ids: np.ndarray) -> Optional[str]:
    """What is wrong with integer ``ids`` [N], or None: a negative id (equal ids mean the same item: a -1
    'unknown' marker would make strangers positives) or one beyond int64 (a dataset file's and a codes file's)."""
    if ids.size and ids.min() < 0:
        row = int(np.argmax(ids < 0))
        return f"{int((ids < 0).sum())} negative ids (first: {ids[row]} at row {row}); ids must be >= 0"
    if ids.size and ids.dtype == np.uint64 and ids.max() > np.uint64(np.iinfo(np.int64).max):  # numpy < 1.25: via float
        return f"id {ids.max()} does not fit int64"
    return None


def shared_ids(query: np.ndarray, other: np.ndarray, name: str) -> Optional[str]:
    """What is wrong where query ids also appear in the split or group ``name`` of ids ``other``, or None: a query
    item trained on, or found as itself, inflates every score."""
    shared = np.intersect1d(query, other)
    if not len(shared):
        return None
    return f"{len(shared)} ids also appear in /{name}/ids (first: {shared[0]}); query and {name} must be disjoint"


def row_fingerprints(rows: np.ndarray, picked: np.ndarray) -> np.ndarray:
    """One number a row from its values at the ``picked`` columns, as float32 read them: the bits of each value
    times a fixed odd weight, summed modulo 2^64. Equal rows give equal prints; rows differing in a picked
    column (two images' features differ in nearly every column) differ but by a chance of about 2^-64 (-0.0 is
    read as 0.0: the rows are compared by value). Cheap beside a whole comparison, as every load checks: 8 bytes
    a row. Shape: [N, d] -> [N] uint64."""
    values = np.ascontiguousarray(rows[:, picked], dtype=np.float32) + np.float32(0)  # -0.0 as 0.0: equal values
    bits = values.view(np.uint32).astype(np.uint64)
    weights = np.random.default_rng(0).integers(1, 2 ** 63, size=len(picked), dtype=np.uint64) | np.uint64(1)
    return (bits * weights).sum(axis=1, dtype=np.uint64)


MAX_ROW_NORM = 1e18  # a feature row's L2 norm beyond which its square (3.4e38 at most in float32) overflows


def finite_float32(block: np.ndarray, where: str, first_row: int = 0) -> np.ndarray:
    """``block`` [rows, d] as float32, refusing NaN and inf as given (:func:`check_finite`), then a value of a wider
    type beyond float32's range, said as such: it is read as an inf the user never had; then a row of L2 norm
    beyond :data:`MAX_ROW_NORM`, whose normalisation in float32 overflows: every method read such rows as zeros
    (features of magnitude 1e20 gave every item one code)."""
    check_finite(block, where, first_row)
    if block.dtype == np.float32:
        cast = block
    else:
        with np.errstate(over="ignore"):
            cast = block.astype(np.float32)
        check_finite(cast, f"{where} (read as float32: {block.dtype} values beyond its range become inf)", first_row)
    if cast.ndim == 2 and len(cast) and float(np.abs(cast).max()) * np.sqrt(cast.shape[1]) > MAX_ROW_NORM:
        norms = np.sqrt(np.square(cast, dtype=np.float64).sum(axis=1))  # the bound above, then the rows' norms
        big = np.flatnonzero(norms > MAX_ROW_NORM)
        if big.size:
            raise DataError(f"{where}: {big.size} rows of L2 norm beyond {MAX_ROW_NORM:.0e} (first: row "
                            f"{first_row + big[0]}, norm {norms[big[0]]:.3g}), whose normalisation in float32 "
                            "overflows (each read as zeros); scale the features, e.g. L2-normalise each row")
    return cast


def unlabelled_rows(labels: np.ndarray) -> Optional[str]:
    """What is wrong with multi-hot ``labels`` [N, C] that have rows of no label, or None: relevance is 'shares a
    label', so such an item can never be relevant (a dataset file's and a codes file's labels alike)."""
    empty = np.flatnonzero(labels.sum(axis=1) == 0)
    if not empty.size:
        return None
    return (f"{empty.size} rows have no label (first: row {empty[0]}); relevance is 'shares a label', so such an "
            "item can never be relevant")


def check_finite(block: np.ndarray, where: str, first_row: int = 0) -> None:
    """Fail on NaN or inf in a [rows, d] ``block`` whose rows are numbered from ``first_row``."""
    bad = ~np.isfinite(block)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        kind = "NaN" if np.isnan(block[row, col]) else "inf" if block[row, col] > 0 else "-inf"
        raise DataError(
            f"{where}: {int(bad.sum())} non-finite values in rows {first_row}..{first_row + len(block) - 1} "
            f"(first: {kind} at row {first_row + row}, column {col})"
        )


STRING_ROWS = 1 << 16  # strings decoded at a time where a whole column is checked


def utf8_strings(values: np.ndarray, where: str, first_row: int = 0) -> List[str]:
    """Rows of an HDF5 string column (bytes or str) as str; ``DataError`` naming ``where`` and the row of the first
    that is not UTF-8 ('utf-8 codec can't decode byte 0xed' named none)."""
    strings = values.tolist()
    for row, s in enumerate(strings):
        if not isinstance(s, str):
            try:
                strings[row] = s.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: row {first_row + row}: not UTF-8 text ({err.reason}, byte "
                                f"{err.start})") from None
    return strings


def check_utf8_column(column, where: str) -> None:
    """Every row of a 1-D string column (an HDF5 dataset, read a block at a time) UTF-8 (:func:`utf8_strings`)."""
    for start in range(0, column.shape[0], STRING_ROWS):
        utf8_strings(column[start:start + STRING_ROWS], where, start)


def is_bag_of_words(counts: np.ndarray) -> bool:
    """Whether ``counts`` are whole numbers from 0 to 255, as ``text_bow`` holds them (uint8)."""
    return not counts.size or bool(np.array_equal(counts, np.round(counts)) and 0 <= counts.min()
                                   and counts.max() <= 255)


def a_name_not_a_path(path: str) -> str:
    """What a missing ``path`` that reads as a dataset's name (``wiki``: no folder, no extension, as the commands'
    ``-d`` takes it) is, for a message that says it is not there: '' for another path."""
    if not path or os.sep in path or "/" in path or os.path.splitext(path)[1]:
        return ""
    return f" (a file's path is asked for here: the commands find -d {path} in --data-dir as {path}.h5)"


def not_hdf5(path: str, err: BaseException, what: str = "HDF5 file") -> str:
    """Why h5py could not open ``path`` (``err``; ``what``: the file asked for), in a message naming it: a
    checkpoint given for a dataset is said to be one, where HDF5's 'file signature not found' left the user to
    guess."""
    if zipfile.is_zipfile(path):  # what torch.save writes
        return f"{path}: a file torch saved (a checkpoint?), not an HDF5 file"
    return f"{path}: not a readable {what} ({err})"
