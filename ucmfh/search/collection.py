"""Collection files and query files: features (and what shows a result) read in row ranges.

A collection is an HDF5 file with, at its root or in groups (a ucmfh dataset
file's splits, docs/reference.md §1):

    image [N, d_img] float, text [N, d_txt] float   at least one of the two
    ids [N] int (optional; equal id = the same image), labels [N, C] 0/1 (optional)
    paths [N] str (optional: the image files), text_raw [N] str (optional: the captions)

and the root attributes ``image_feature`` / ``text_feature`` naming the
extractors. Rows of several groups are read as one sequence, group by group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np

from ucmfh.data.format import (
    DataError, MissingFile, a_name_not_a_path, check_finite, finite_float32, first_of_each_id, not_hdf5, utf8_strings,
)
from ucmfh.data.input_files import load_npy
from ucmfh.files import check_a_file, read_attrs
from ucmfh.search.folder import NAMES

COLUMNS = ("image", "text", "ids", "labels", "paths", "text_raw")
WHICH_MODALITY = ("query_modality", "image|text", "to say which")  # the remedy where queries could be either
DEFAULT_SPLITS = ("query", "retrieval")  # a dataset file's collection (§7): train is drawn from retrieval
# a dataset file's groups whose items another group holds: its train split is drawn from its retrieval split
# (docs/reference.md §1, the field's standard; the same items in wiki, flickr8k1000 and mirflickr730)
PART_OF = {"/train": "/retrieval"}


@dataclass
class Collection:
    """A collection file opened for reading by row ranges (across its groups, in order)."""

    path: str
    groups: List[str]
    rows: List[int]
    columns: Dict[str, Optional[int]]  # present column -> width (None for 1-D)
    attrs: Dict[str, Any] = field(default_factory=dict)
    part_of: Dict[str, str] = field(default_factory=dict)  # group -> the group of the file that holds its items

    def holds(self, group: str, other: str) -> bool:
        """Whether ``group``'s items include every item of ``other`` (groups of this file): the same group, or
        a dataset file's retrieval split and its train split (:data:`PART_OF`)."""
        return group == other or self.part_of.get(other) == group

    def __len__(self) -> int:
        return sum(self.rows)

    def has(self, name: str) -> bool:
        """Whether the collection carries the column ``name``."""
        return name in self.columns

    def feature(self, modality: str) -> Optional[str]:
        """The extractor that made a modality's features (root attribute), when recorded."""
        value = self.attrs.get(f"{NAMES[modality]}_feature")
        return None if value is None else str(value)

    def where(self, name: str) -> str:
        return ", ".join(f"{g.rstrip('/')}/{name}" for g in self.groups)

    def read(self, name: str, start: int = 0, stop: Optional[int] = None) -> Any:
        """Rows [start, stop) of a column: an array, or a list of str for strings."""
        stop = len(self) if stop is None else stop
        parts: List[Any] = []
        with h5py.File(self.path, "r") as f:
            first = 0
            for group, n in zip(self.groups, self.rows):
                a, b = max(start - first, 0), min(stop - first, n)
                if a < b:
                    parts.append(_read(self.path, f[group][name], f"{group.rstrip('/')}/{name}", a, b))
                first += n
        if name in ("paths", "text_raw"):
            return [s for part in parts for s in part]
        if not parts:
            shape = (0,) if self.columns[name] is None else (0, self.columns[name])
            return np.zeros(shape, dtype=np.float32)
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if name in NAMES.values():
            check_finite(out, f"{self.path}: {self.where(name)}", start)
        if name == "labels":  # validate passed labels of 2, which index refused and a search's marks read as 1
            other = np.argwhere(~np.isin(out, (0, 1)))
            if other.size:
                row, column = other[0]
                raise DataError(f"{self.path}: {self.where('labels')}: labels must be multi-hot 0/1 values (row "
                                f"{start + int(row)} has {out[row, column]})")
        return out

    def ids(self) -> Optional[np.ndarray]:
        return self.read("ids").astype(np.int64) if self.has("ids") else None


def differing(a: str, b: str, context: int = 16, width: int = 60) -> Tuple[str, str]:
    """Where two extractor descriptions differ: each cut to the part that differs, with ``context`` characters
    around it and ``…`` where cut. Descriptions run long and often share a long beginning (the same
    extractor, another preprocessing), so cutting both to one prefix would print them the same."""
    same = len(os.path.commonprefix([a, b]))
    tail = len(os.path.commonprefix([a[same:][::-1], b[same:][::-1]]))
    start = max(same - context, 0)
    space = a.rfind(" ", max(start - context, 0), start)  # begin at a word where one is near
    start = space + 1 if start and space >= 0 else start

    def cut(text: str) -> str:
        stop = min(len(text) - tail + context, len(text))
        part = text[start:stop]
        if len(part) > width:
            part, stop = part[: width - 1], start + width - 1
        return ("…" if start else "") + part + ("…" if stop < len(text) else "")

    return cut(a), cut(b)


def _read(path: str, dset: h5py.Dataset, where: str, a: int, b: int) -> Any:
    try:
        values = dset[a:b]
    except (OSError, ValueError, TypeError) as err:
        raise DataError(f"{path}: {where}: unreadable data ({err})") from None
    return utf8_strings(values, f"{path}: {where}", a) if dset.dtype.kind in "OSU" else values


def open_collection(path: str, splits: Optional[Sequence[str]] = None) -> Collection:
    """Check a collection file's layout (not its values, but for negative ids) and open it.

    ``splits``: the groups to read; default the root when it holds ``image`` or
    ``text``, else the groups ``query`` and ``retrieval`` that exist.
    Raises :class:`DataError` naming the file, the dataset and the problem.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such collection file{a_name_not_a_path(path)}" if path else
                                "an empty path; give the collection file")
    check_a_file(path, "a collection file", DataError)  # a pipe: opening it waited for ever, past SIGTERM
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(not_hdf5(path, err)) from None
    with f:
        flat = "image" in f or "text" in f
        if splits:
            missing = [s for s in splits if s not in f or not isinstance(f[s], h5py.Group)]
            if missing:
                groups = sorted(k for k in f if isinstance(f[k], h5py.Group))
                raise DataError(f"{path}: /{missing[0]}: no such group (the file has: {groups or 'none'})")
            # 'query', '/query' and 'query/' are one group, and a group named twice is read once
            groups = list(dict.fromkeys(f"/{s.strip('/')}" for s in splits))
        elif flat:
            groups = ["/"]
        else:
            groups = [f"/{s}" for s in DEFAULT_SPLITS if s in f]
            if not groups:
                raise DataError(f"{path}: /: no image or text dataset, and no query or retrieval group "
                                f"(the file has: {sorted(f.keys())})")
        columns: Dict[str, Optional[int]] = {}
        rows = []
        for g in groups:
            group = _object(path, f, g)
            if not isinstance(group, h5py.Group):
                raise DataError(f"{path}: {g}: expected a group, found a dataset")
            present = [name for name in COLUMNS if name in group]
            if not {"image", "text"} & set(present):
                raise DataError(f"{path}: {g}: no image or text dataset (it has: {sorted(group.keys())})")
            earlier = set(columns)  # the columns of the groups before this one
            n = None
            for name in present:
                where = f"{g.rstrip('/')}/{name}"
                dset = _object(path, group, name, where)
                if not isinstance(dset, h5py.Dataset):
                    raise DataError(f"{path}: {where}: expected a dataset")
                two_d = name in ("image", "text", "labels")
                if dset.ndim != (2 if two_d else 1):
                    raise DataError(f"{path}: {where}: expected a {2 if two_d else 1}-D array, got shape {dset.shape}")
                if n is None:
                    n = dset.shape[0]
                elif dset.shape[0] != n:
                    raise DataError(f"{path}: {where}: {dset.shape[0]} rows, {g.rstrip('/')}/{present[0]} has {n}")
                if name in NAMES.values() and dset.dtype.kind != "f":
                    raise DataError(f"{path}: {where}: expected floating-point features, got {dset.dtype}")
                if name == "ids" and dset.dtype.kind not in "iu":
                    raise DataError(f"{path}: {where}: ids must be integers, got {dset.dtype}")
                if name == "ids" and dset.dtype.kind == "u" and dset.shape[0] and \
                        int(_read(path, dset, where, 0, dset.shape[0]).max()) > np.iinfo(np.int64).max:
                    raise DataError(f"{path}: {where}: ids beyond {np.iinfo(np.int64).max} do not fit int64 (an "
                                    "index keeps ids as int64)")
                if name == "ids" and dset.dtype.kind == "i":  # an id is an image: -1 for 'unknown' would be one image
                    negative = np.flatnonzero(_read(path, dset, where, 0, dset.shape[0]) < 0)
                    if len(negative):
                        raise DataError(f"{path}: {where}: {len(negative)} negative ids (first at row {negative[0]}); "
                                        "ids must be >= 0: rows sharing an id are one image, indexed once, so give "
                                        "each image of its own an id of its own")
                if name == "labels" and dset.dtype.kind not in "biuf":
                    raise DataError(f"{path}: {where}: labels must be multi-hot 0/1 numbers, got {dset.dtype}")
                if name in ("paths", "text_raw") and dset.dtype.kind not in "OSU":
                    raise DataError(f"{path}: {where}: expected strings, got {dset.dtype}")
                width = dset.shape[1] if two_d else None
                if name in columns and columns[name] != width:
                    raise DataError(f"{path}: {where}: {width} columns, an earlier group has {columns[name]}")
                columns.setdefault(name, width)
            if earlier and set(present) != earlier:
                raise DataError(f"{path}: {g}: has {sorted(present)}, an earlier group {sorted(earlier)}")
            if not n:  # an index built of it would be empty, and 'already indexed (0 rows)' said of it
                raise DataError(f"{path}: {g}: no rows")
            rows.append(int(n))
        try:
            attrs = read_attrs(f)
        except (OSError, TypeError, ValueError) as err:
            raise DataError(f"{path}: root attributes: unreadable ({err})") from None
        dataset = all(g.strip("/") in f and isinstance(f[g], h5py.Group) for pair in PART_OF.items() for g in pair)
    return Collection(path, groups, rows, columns, attrs, dict(PART_OF) if dataset else {})


def _object(path: str, parent: Any, name: str, where: Optional[str] = None) -> Any:
    """``parent[name]``, an object HDF5 cannot open (a link to nothing, a damaged header) said in one line."""
    try:
        return parent[name]
    except (KeyError, OSError, RuntimeError, ValueError) as err:
        raise DataError(f"{path}: {where or name}: unreadable ({str(err).splitlines()[0]})") from None


@dataclass
class Queries:
    """Query items of one modality: features and what describes them.

    Shape: features [Q, d] float32; ids [Q] int64 or None; labels [Q, C] or None.
    """

    modality: str
    features: np.ndarray
    source: str
    ids: Optional[np.ndarray] = None
    labels: Optional[np.ndarray] = None
    text: Optional[List[str]] = None
    paths: Optional[List[str]] = None
    # an image query without a path: the text of its own item (a caption of that image in a caption set, a pair's
    # text), which says what the image is where nothing else does
    paired_text: Optional[List[str]] = None
    feature: Optional[str] = None  # the extractor, when the file records it
    # where an HDF5 query file's items lie (their token features are read from there): file, group, rows
    path: Optional[str] = None
    group: Optional[str] = None
    rows: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self.features.shape[0]

    def describe(self, i: int) -> Optional[str]:
        """What query ``i`` is, in words: its text, its image's path, or its paired text (said so); None where the
        file keeps none of them."""
        if self.text is not None:
            return self.text[i]
        if self.paths is not None:
            return self.paths[i]
        return None if self.paired_text is None else f"its paired text: {self.paired_text[i]}"

    def part(self, start: int, stop: int) -> "Queries":
        """Queries ``start`` to ``stop`` (a block of them searched at a time), described alike."""
        def cut(values: Any) -> Any:
            return None if values is None else values[start:stop]

        return replace(self, features=self.features[start:stop], ids=cut(self.ids), labels=cut(self.labels),
                       text=cut(self.text), paths=cut(self.paths), paired_text=cut(self.paired_text),
                       rows=cut(self.rows))


def read_queries(
    path: str,
    modality: Optional[str],
    dims: Dict[str, int],
    split: Optional[str] = None,
    ids: Optional[Sequence[int]] = None,
) -> Queries:
    """Queries from features in an ``.npy`` file [Q, d] or an HDF5 collection (``split``: one group,
    default ``query`` in a dataset file), optionally only the items with the given ``ids``.

    ``modality`` ('img'/'txt') may be None when the file settles it (one feature
    dataset, or an ``.npy`` whose width fits one modality of ``dims``). Image
    queries are one per id (equal ids are the same image).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such query file{a_name_not_a_path(path)}")
    if path.endswith(".npy"):
        if ids is not None or split is not None:
            raise ValueError(f"{path}: an .npy file has no ids or splits; select rows from an HDF5 file")
        x = np.array(load_npy(path))  # a text named .npy: 'not an .npy array', not numpy's word on pickles
        if x.ndim == 1:
            x = x[None]
        if x.ndim != 2 or x.dtype.kind not in "fiu":
            raise DataError(f"{path}: expected numeric features [Q, d], got {x.dtype} {x.shape}")
        if not x.shape[0]:  # a search of nothing, said as done
            raise DataError(f"{path}: no queries (0 rows)")
        if modality is None:
            fits = [m for m, d in dims.items() if d == x.shape[1]]
            if len(fits) != 1:
                remedy = ("say which modality they are" if fits else
                          "features of the extractors the index was built from are needed")
                raise DataError(f"{path}: {x.shape[1]}-d features fit "
                                f"{'both modalities' if fits else 'neither modality'} of the checkpoint "
                                f"(image {dims['img']}-d, text {dims['txt']}-d); {remedy}",
                                remedy=WHICH_MODALITY if fits else None)
            modality = fits[0]
        return Queries(modality, finite_float32(x, path), path)
    if os.path.isfile(path) and not h5py.is_hdf5(path):  # a text, an .npz, an .npy under another name
        raise DataError(f"{path}: neither an .npy file nor an HDF5 file (query features are an .npy [Q, d], or an "
                        "HDF5 collection or dataset file)")
    coll = open_collection(path, [split] if split else None)
    if split is None and coll.groups != ["/"]:  # a dataset file: its query split
        coll = open_collection(path, ["query"])
    available = [m for m, name in NAMES.items() if coll.has(name)]
    if modality is None:
        if len(available) != 1:
            raise DataError(f"{path}: has image and text features; say which modality the queries are",
                            remedy=WHICH_MODALITY)
        modality = available[0]
    name = NAMES[modality]
    if not coll.has(name):
        raise DataError(f"{path}: {coll.where(name)}: missing dataset (the queries are {name} features)")
    all_ids = coll.ids()
    n = len(coll)
    if ids is not None:
        if all_ids is None:
            raise DataError(f"{path}: {coll.where('ids')}: missing dataset, so no query can be chosen by id")
        wanted = np.asarray(list(ids), dtype=np.int64)
        missing = wanted[~np.isin(wanted, all_ids)]
        if missing.size:
            low, high = (int(all_ids.min()), int(all_ids.max())) if len(all_ids) else (None, None)
            gaps = ", with gaps" if len(all_ids) and len(np.unique(all_ids)) < high - low + 1 else ""
            held = f" (its {len(all_ids)} ids run from {low} to {high}{gaps})" if len(all_ids) else " (it holds no item)"
            if split is None and coll.groups == ["/query"]:  # a dataset file's query split, read by default
                held += "; --split retrieval or --split train reads another split"
            raise DataError(f"{path}: {coll.where('ids')}: no item with id {', '.join(map(str, missing[:5]))}{held}")
        rows = []
        for i in wanted:
            match = np.flatnonzero(all_ids == i)
            rows.extend(match[:1] if modality == "img" else match)
        rows = np.asarray(rows, dtype=np.int64)
    else:
        rows = first_of_each_id(all_ids) if modality == "img" and all_ids is not None else np.arange(n)
    features = coll.read(name)
    if len(rows) != len(features) or np.any(rows != np.arange(len(rows))):  # a copy of every row: 600 MB at 300k
        features = features[rows]
    features = features.astype(np.float32, copy=False)
    text = paths = None
    if modality == "txt" and coll.has("text_raw"):
        raw = coll.read("text_raw")
        text = [raw[i] for i in rows]
    paired_text = None
    if modality == "img" and coll.has("paths"):
        raw = coll.read("paths")
        paths = [raw[i] for i in rows]
    elif modality == "img" and coll.has("text_raw"):  # an item is a pair: the query's row holds its text
        raw = coll.read("text_raw")
        paired_text = [raw[i] for i in rows]
    return Queries(
        modality, features, f"{path}:{coll.groups[0]}", ids=None if all_ids is None else all_ids[rows],
        labels=coll.read("labels")[rows] if coll.has("labels") else None, text=text, paths=paths,
        paired_text=paired_text,
        feature=coll.feature(modality), path=path, group=coll.groups[0], rows=rows,
    )
