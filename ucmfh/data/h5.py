"""Read, validate and write datasets in the ucmfh HDF5 format (REFERENCE §1).

One file per dataset, groups ``train``, ``query``, ``retrieval``, each holding
``image`` [N, d_img] float32, ``text`` [N, d_txt] float32, ``labels`` [N, C]
uint8 (multi-hot) and optionally ``ids`` [N] int64 and ``text_bow`` [N, V].
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

import h5py
import numpy as np
import torch

from ucmfh.files import PathLike, atomic_file, read_attrs, write_attrs

SPLITS = ("train", "query", "retrieval")
REQUIRED = ("image", "text", "labels")
ROOT_ATTRS = ("name", "classes", "image_feature", "text_feature", "source", "split")
# rows checked for NaN/inf at a time: bounded memory on NUS-WIDE-sized files
_CHECK_ROWS = 65536

class DataError(ValueError):
    """A dataset file breaks the format; the message names file, dataset and problem."""


@dataclass
class Split:
    """One split held in memory.

    Shape:
        img: [N, d_img] float32; txt: [N, d_txt] float32;
        labels: [N, C] uint8 multi-hot; ids: [N] int64 or None.
    """

    img: torch.Tensor
    txt: torch.Tensor
    labels: torch.Tensor
    ids: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.img.shape[0]

    def to(self, device: Union[str, torch.device]) -> "Split":
        return Split(
            self.img.to(device),
            self.txt.to(device),
            self.labels.to(device),
            None if self.ids is None else self.ids.to(device),
        )

    def subset(self, index: Union[slice, torch.Tensor]) -> "Split":
        return Split(
            self.img[index],
            self.txt[index],
            self.labels[index],
            None if self.ids is None else self.ids[index],
        )


@dataclass
class Dataset:
    """A whole dataset: three splits plus the root attributes."""

    train: Split
    query: Split
    retrieval: Split
    attrs: Dict[str, object] = field(default_factory=dict)
    path: Optional[str] = None

    @property
    def name(self) -> str:
        return str(self.attrs.get("name") or (Path(self.path).stem if self.path else "dataset"))

    @property
    def d_img(self) -> int:
        return self.train.img.shape[1]

    @property
    def d_txt(self) -> int:
        return self.train.txt.shape[1]

    @property
    def n_classes(self) -> int:
        return self.train.labels.shape[1]

    def splits(self) -> Iterator[tuple]:
        for name in SPLITS:
            yield name, getattr(self, name)


def _fail(path: PathLike, where: str, problem: str) -> DataError:
    return DataError(f"{path}: {where}: {problem}")


def _check_finite(path: PathLike, where: str, dset: h5py.Dataset) -> None:
    for start in range(0, dset.shape[0], _CHECK_ROWS):
        block = dset[start : start + _CHECK_ROWS]
        bad = ~np.isfinite(block)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            kind = "NaN" if np.isnan(block[row, col]) else "inf"
            raise _fail(
                path, where,
                f"{int(bad.sum())} non-finite values in rows {start}..{start + len(block) - 1} "
                f"(first: {kind} at row {start + row}, column {col})",
            )


def validate_file(path: PathLike) -> Dict[str, object]:
    """Check a dataset file against the format without loading it whole.

    Returns the root attributes. Raises :class:`DataError` naming the file,
    the HDF5 dataset and the problem.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path}: not a readable HDF5 file ({err})") from None
    with f:
        dims: Dict[str, tuple] = {}
        ids: Dict[str, np.ndarray] = {}
        for split in SPLITS:
            if split not in f:
                raise _fail(path, f"/{split}", f"missing group (the file has: {sorted(f.keys())})")
            group = f[split]
            n_rows = None
            for name in REQUIRED:
                where = f"/{split}/{name}"
                if name not in group:
                    raise _fail(path, where, f"missing dataset (the group has: {sorted(group.keys())})")
                dset = group[name]
                if dset.ndim != 2:
                    raise _fail(path, where, f"expected a 2-D array, got shape {dset.shape}")
                if n_rows is None:
                    n_rows = dset.shape[0]
                elif dset.shape[0] != n_rows:
                    raise _fail(path, where, f"{dset.shape[0]} rows, but /{split}/image has {n_rows}")
                if dset.shape[0] == 0:
                    raise _fail(path, where, "empty split (0 rows)")
                if dset.shape[1] == 0:
                    raise _fail(path, where, "0 columns")
                previous = dims.setdefault(name, (split, dset.shape[1]))
                if previous[1] != dset.shape[1]:
                    raise _fail(
                        path, where,
                        f"{dset.shape[1]} columns, but /{previous[0]}/{name} has {previous[1]}",
                    )
                if name == "labels":
                    labels = dset[()]
                    if labels.dtype.kind not in "biuf" or not np.isin(labels, (0, 1)).all():
                        raise _fail(path, where, "labels must be multi-hot 0/1 values")
                    empty = np.flatnonzero(labels.sum(axis=1) == 0)
                    if empty.size:
                        raise _fail(
                            path, where,
                            f"{empty.size} rows have no label (first: row {empty[0]}); "
                            "relevance is 'shares a label', so such an item can never be relevant",
                        )
                else:
                    if dset.dtype.kind != "f":
                        raise _fail(path, where, f"expected floating-point features, got {dset.dtype}")
                    _check_finite(path, where, dset)
            if "ids" in group:
                dset = group["ids"]
                if dset.shape != (n_rows,):
                    raise _fail(path, f"/{split}/ids", f"expected shape ({n_rows},), got {dset.shape}")
                ids[split] = dset[()]
        classes = f.attrs.get("classes")
        if classes is not None and len(classes) != dims["labels"][1]:
            raise _fail(path, "attribute 'classes'", f"{len(classes)} names for {dims['labels'][1]} label columns")
        if "query" in ids and "retrieval" in ids:
            shared = np.intersect1d(ids["query"], ids["retrieval"])
            if shared.size:
                raise _fail(
                    path, "/query/ids",
                    f"{shared.size} ids also appear in /retrieval/ids (first: {shared[0]}); "
                    "query and retrieval must be disjoint",
                )
        return read_attrs(f)


def load_dataset(path: PathLike, validate: bool = True) -> Dataset:
    """Load a dataset file into memory as CPU tensors (validated first)."""
    path = os.fspath(path)
    attrs = validate_file(path) if validate else None
    with h5py.File(path, "r") as f:
        if attrs is None:
            attrs = read_attrs(f)
        splits = {}
        for split in SPLITS:
            group = f[split]
            splits[split] = Split(
                img=torch.from_numpy(np.asarray(group["image"][()], dtype=np.float32)),
                txt=torch.from_numpy(np.asarray(group["text"][()], dtype=np.float32)),
                labels=torch.from_numpy(np.asarray(group["labels"][()], dtype=np.uint8)),
                ids=torch.from_numpy(np.asarray(group["ids"][()], dtype=np.int64)) if "ids" in group else None,
            )
    return Dataset(attrs=attrs, path=path, **splits)


DTYPES = {"image": np.float32, "text": np.float32, "labels": np.uint8, "ids": np.int64, "text_bow": np.uint8}


@contextmanager
def open_writer(
    path: PathLike,
    attrs: Optional[Dict[str, object]] = None,
    overwrite: bool = False,
) -> Iterator[h5py.File]:
    """Stream a dataset file: yield an open temporary file, then validate and rename.

    The caller creates the groups and datasets (use :func:`create_split_dataset`
    for the right dtype and chunking) and fills them piece by piece, so a file
    larger than memory can be written. On normal exit the file is validated
    and only then appears under ``path``; on any error the temporary file is
    removed and ``path`` is left as it was.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path}: exists; not replaced")
    with atomic_file(path) as tmp:
        with h5py.File(tmp, "w") as f:
            write_attrs(f, attrs)
            yield f
        try:
            validate_file(tmp)
        except DataError as err:
            raise DataError(str(err).replace(tmp, path)) from None


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
    ``text``, ``labels`` and optionally ``ids`` and ``text_bow`` arrays.
    The file appears under its final name only once complete and valid.
    """
    path = os.fspath(path)
    with open_writer(path, attrs, overwrite) as f:
        for split in SPLITS:
            if split not in splits:
                raise DataError(f"{path}: /{split}: missing split in the arrays to write")
            f.create_group(split)
            for name, array in splits[split].items():
                if name not in DTYPES:
                    raise DataError(f"{path}: /{split}/{name}: unknown dataset name")
                if array is None:
                    continue
                array = np.asarray(array, dtype=DTYPES[name])
                f[split].create_dataset(name, data=array, chunks=True if array.ndim == 2 and array.size else None)
    return path
