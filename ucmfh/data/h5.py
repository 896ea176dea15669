"""Read and validate datasets in the ucmfh HDF5 format (docs/reference.md §1); :mod:`ucmfh.data.writer`
writes them.

One file per dataset, groups ``train``, ``query``, ``retrieval``, each holding
``image`` [N, d_img] float32, ``text`` [N, d_txt] float32, ``labels`` [N, C]
uint8 (multi-hot) and optionally ``ids`` [N] int64 and ``text_bow`` [N, V].
A caption set (docs/reference.md §7) has no ``labels`` in any split and
``ids`` in every split: relevance is then "same id".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

import h5py
import numpy as np
import torch

from ucmfh.data.format import (
    CODES_FORMAT, REQUIRED, SPLITS, DataError, MissingFile, a_name_not_a_path, check_utf8_column, finite_float32,
    id_problem, is_bag_of_words, not_hdf5, row_fingerprints, shared_ids, unlabelled_rows,
)
from ucmfh.data.stream import Features, Rows, StreamSettings, is_streamed, open_without_chunk_cache, take
from ucmfh.data.tokens import check_dense_source, check_token_splits, check_tokens, check_virtual_sources
from ucmfh.files import PathLike, checked_path, read_attrs
from ucmfh.utils import check_argument

# rows checked for NaN/inf at a time: bounded memory on NUS-WIDE-sized files
_CHECK_ROWS = 65536
# a feature dataset's rows read at a time: as many as this many bytes of float64 hold (at most _CHECK_ROWS); 65,536
# rows of Flickr8k's 1,280-d images at once, copied as they were checked, took 'ucmfh validate' to 1.5 GB
_CHECK_BYTES = 32 << 20
_PRINT_COLUMNS = 32  # the image columns compared between rows sharing an id

@dataclass
class Split:
    """One split: its features in memory, or streamed from the file (:class:`ucmfh.data.stream.Rows`).

    Shape:
        img: [N, d_img] float32; txt: [N, d_txt] float32 (tensors, or Rows read as such);
        labels: [N, C] uint8 multi-hot, or None in a caption set; ids: [N] int64 or None.
    """

    img: Features
    txt: Features
    labels: Optional[torch.Tensor]
    ids: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.img.shape[0]

    def __repr__(self) -> str:  # the sizes, not every feature (a dataclass's repr prints the tensors)
        labels = "no labels (a caption set)" if self.labels is None else f"{self.labels.shape[1]} classes"
        return (f"Split({len(self)} items, image {self.img.shape[1]}-d, text {self.txt.shape[1]}-d, {labels}"
                f"{', ids' if self.ids is not None else ''}{', streamed from the file' if self.streamed else ''})")

    @property
    def streamed(self) -> bool:
        """Whether the features are read from the file on demand (:mod:`ucmfh.data.stream`)."""
        return is_streamed(self.img)

    def checked(self, where: str, name: str = "split") -> "Split":
        """This split as the models take it, where a caller made it (``where``: the entry point, ``name``: what
        the caller calls it): numpy features as tensors, float64 or float16 as float32; items and finite features
        in memory checked (``ValueError``; ``DataError`` for NaN or infinity, which made codes of -1 where scored
        and a model of NaN where trained). A streamed split's rows were checked where its file was loaded."""
        if self.streamed:
            return self
        features = {}
        for modality, x in (("img", self.img), ("txt", self.txt)):
            x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
            if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point():
                shape = f" of shape {tuple(x.shape)} and type {x.dtype}" if hasattr(x, "shape") else ""
                raise ValueError(f"{where}: {name}.{modality} must be 2-D floating-point features [N, d], got "
                                 f"{type(x).__name__}{shape}")
            if x.dtype != torch.float32:  # float64, float16: the models' type
                x = x.float()
            if not bool(torch.isfinite(x).all()):
                raise DataError(f"{where}: {name}.{modality} holds NaN or infinity (features must be finite)")
            features[modality] = x
        if len(features["img"]) != len(features["txt"]):
            raise ValueError(f"{where}: {name}.img has {len(features['img'])} rows, {name}.txt "
                             f"{len(features['txt'])}")
        if len(features["img"]) == 0:
            raise ValueError(f"{where}: the {name} has no items")
        for field_name in ("labels", "ids"):  # numpy's, as tensors (the features' rule), a row an item
            value = getattr(self, field_name)
            if isinstance(value, (list, tuple)):  # a row for each item, said to be none ('got list'; an audit's)
                value = np.asarray(value, dtype=np.uint8 if field_name == "labels" else np.int64)
            if isinstance(value, np.ndarray):
                value = features[field_name] = torch.from_numpy(value)
            rows = len(value) if getattr(value, "ndim", 0) else None  # None: not an array of rows
            if value is not None and rows != len(features["img"]):
                rows = f"{rows} rows" if rows is not None else type(value).__name__
                raise ValueError(f"{where}: {name}.{field_name} must have a row for each of its {len(features['img'])} "
                                 f"items, got {rows}")
        return replace(self, **features)

    def shuffle(self, generator: torch.Generator) -> torch.Tensor:
        """A training epoch's order of the items: a uniform permutation, the same whether the features are
        in memory or streamed (streaming changes no batch, hence no result; a run's identity leaves it out)."""
        return torch.randperm(len(self), generator=generator)

    def read_ahead(self, index: torch.Tensor) -> None:
        """Read the streamed rows ``index`` and keep them for the step that asks for them (on a worker
        thread, ahead of that step); nothing for a split in memory."""
        if self.streamed:
            self.img.read_ahead(index)
            self.txt.read_ahead(index)

    def to(self, device: Union[str, torch.device]) -> "Split":
        """The split with its tensors on ``device``."""
        return Split(
            self.img.to(device),
            self.txt.to(device),
            None if self.labels is None else self.labels.to(device),
            None if self.ids is None else self.ids.to(device),
        )

    def subset(self, index: Union[slice, torch.Tensor]) -> "Split":
        """The items ``index`` (a slice or an index tensor) of the split."""
        return Split(
            take(self.img, index),
            take(self.txt, index),
            None if self.labels is None else self.labels[index],
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
        """The file's ``name`` attribute, else its file name without the extension."""
        return str(self.attrs.get("name") or (Path(self.path).stem if self.path else "dataset"))

    def __repr__(self) -> str:  # the sizes, not every feature (a dataclass's repr prints the tensors)
        sizes = ", ".join(f"{name} {'withheld' if isinstance(split, Withheld) else len(split)}"
                          for name, split in self.splits())
        labels = "a caption set" if self.caption_set else f"{self.n_classes} classes"
        return (f"Dataset({self.name!r}: {sizes}; image {self.d_img}-d, text {self.d_txt}-d, {labels}"
                f"{'; ' + self.path if self.path else ''})")

    @property
    def d_img(self) -> int:
        """The width of the image features."""
        return self.train.img.shape[1]

    @property
    def d_txt(self) -> int:
        """The width of the text features."""
        return self.train.txt.shape[1]

    @property
    def n_classes(self) -> int:
        """The number of label classes; 0 for a caption set."""
        return 0 if self.caption_set else self.train.labels.shape[1]

    @property
    def caption_set(self) -> bool:
        """No labels: relevance is "same id" (several captions of one image share an id)."""
        return self.train.labels is None

    def splits(self) -> Iterator[tuple]:
        """``(name, split)`` of train, query and retrieval, in that order."""
        for name in SPLITS:
            yield name, getattr(self, name)

    def train_only(self) -> "Dataset":
        """This dataset with its query and retrieval splits withheld (:class:`Withheld`): what a method is given
        to train on, so that no method, ours or another package's, reads them from what it is given. Its file's
        path is withheld too, its file name kept as its name, for messages (the name attribute many files share:
        a subset of Wikipedia's is 'wiki' too): a method that opened the file would find them there. A guard
        against a slip, not a sandbox: a streamed training split reads its rows from the file, whose handle its
        :class:`~ucmfh.data.stream.Rows` hold, as any code in the process could open it."""
        return replace(self, query=Withheld("query"), retrieval=Withheld("retrieval"), path=None,
                       attrs={**self.attrs, "name": os.path.basename(self.path) if self.path else self.name})


class Withheld:
    """In place of a split that training must not see (:meth:`Dataset.train_only`): any use of it is a
    ``ValueError`` saying so (an empty split would have given NaN statistics without a word)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):  # Python's protocols (copy, pickle) ask for these: they are not a split's
            raise AttributeError(attribute)
        raise self._refused(attribute)

    def __len__(self) -> int:
        raise self._refused("__len__")

    def _refused(self, attribute: str) -> ValueError:
        return ValueError(f"the {self.name} split is withheld from training (its .{attribute} was read): a method "
                          "trains on the training split alone (docs/methods.md)")

    def __repr__(self) -> str:
        return f"Withheld({self.name!r})"


def _fail(path: PathLike, where: str, problem: str, remedy: Optional[Tuple[str, object, str]] = None) -> DataError:
    return DataError(f"{path}: {where}: {problem}", remedy)


def is_multi_hot(values: np.ndarray) -> bool:
    """Whether every value is exactly 0 or 1 (any numeric dtype)."""
    return values.dtype.kind in "biuf" and bool(np.isin(values, (0, 1)).all())


def _kind(obj: object) -> str:
    if isinstance(obj, h5py.Group):
        return "a group"
    if isinstance(obj, h5py.Dataset):
        return "a dataset"
    return f"an HDF5 {type(obj).__name__}"


def _member(path: str, parent: h5py.Group, name: str, where: str, want: type,
            required: bool = True) -> Optional[Union[h5py.Group, h5py.Dataset]]:
    """``parent[name]`` when it is a ``want`` (group or dataset); None when absent and not required."""
    noun = "group" if want is h5py.Group else "dataset"
    try:
        obj = parent.get(name)
    except (KeyError, OSError) as err:  # a link to a file or object that is gone
        raise _fail(path, where, f"unreadable {noun} ({err})") from None
    if obj is None and name in parent:  # a soft or external link whose target is gone
        link = parent.get(name, getlink=True)
        target = getattr(link, "path", "?") + (f" in {link.filename}" if isinstance(link, h5py.ExternalLink) else "")
        raise _fail(path, where, f"a link to {target}, which is not there")
    if obj is None:
        if not required:
            return None
        holder = "file" if parent.name == "/" else "group"
        raise _fail(path, where, f"missing {noun} (the {holder} has: {sorted(parent.keys())})")
    if not isinstance(obj, want):
        raise _fail(path, where, f"expected a {noun}, found {_kind(obj)}")
    if isinstance(obj, h5py.Dataset):
        check_virtual_sources(path, where, obj)
    return obj


def _read(path: str, where: str, dset: h5py.Dataset, rows: slice = slice(None)) -> np.ndarray:
    try:
        return dset[rows]
    except (OSError, ValueError, TypeError) as err:  # a damaged chunk, an unreadable type
        raise _fail(path, where, f"unreadable data ({err})") from None


def _block_rows(dset: h5py.Dataset) -> int:
    """How many rows of a feature dataset ``dset`` ([N, d]) a check reads at a time (:data:`_CHECK_BYTES`)."""
    return max(1, min(_CHECK_ROWS, _CHECK_BYTES // (8 * max(1, dset.shape[1] if dset.ndim > 1 else 1))))


def _check_finite(path: str, where: str, dset: h5py.Dataset, keep: Optional[Dict[str, Any]] = None) -> np.ndarray:
    """No NaN or inf, as stored nor as read (float32: a float64 value beyond its range is read as inf); each
    row's fingerprint as read (:func:`row_fingerprints`), from the same reads. Where ``keep`` names ``where``,
    the values read, as float32, are kept there (a load reads the file once)."""
    picked = np.unique(np.linspace(0, dset.shape[1] - 1, min(dset.shape[1], _PRINT_COLUMNS)).astype(np.int64))
    kept = np.empty(dset.shape, dtype=np.float32) if keep is not None and where in keep else None
    prints = []
    rows = _block_rows(dset)
    for start in range(0, dset.shape[0], rows):
        block = _read(path, where, dset, slice(start, start + rows))
        block = finite_float32(block, f"{path}: {where}", start)
        prints.append(row_fingerprints(block, picked))
        if kept is not None:
            kept[start : start + len(block)] = block
    if kept is not None:
        keep[where] = kept
    return np.concatenate(prints)


def _equal_items(path: str, f: h5py.File, rows: np.ndarray, other: str, pairs: Dict[str, np.ndarray]) -> np.ndarray:
    """Of the query ``rows`` whose fingerprints (``pairs``) some item of split ``other`` shares, those whose whole
    image and text rows equal such an item's. Prints of a few columns collide where those columns are equal
    across items (sparse features: bags of words, their sampled columns all zero), so a leak is decided on the
    whole rows, read again for the rows whose prints collide alone."""
    candidates = np.flatnonzero(np.isin(pairs[other], pairs["query"][rows]))
    mine, theirs = (_whole_prints(path, f, split, index) for split, index in (("query", rows), (other, candidates)))
    return rows[np.isin(mine, theirs)]


def _column_prints(path: str, f: h5py.File, split: str, name: str, index: np.ndarray) -> np.ndarray:
    """The fingerprints of the rows ``index`` (ascending) of ``split``'s ``name`` features from every column,
    read by blocks of rows. Shape: [n] uint64."""
    dset, prints = f[split][name], []
    every = np.arange(dset.shape[1])
    rows = _block_rows(dset)
    for start in range(0, dset.shape[0], rows):
        inside = index[(index >= start) & (index < start + rows)]
        if len(inside):
            block = _read(path, f"/{split}/{name}", dset, slice(start, start + rows))
            prints.append(row_fingerprints(block[inside - start].astype(np.float32), every))
    return np.concatenate(prints) if prints else np.zeros(0, dtype=np.uint64)


def _whole_prints(path: str, f: h5py.File, split: str, index: np.ndarray) -> np.ndarray:
    """The fingerprints of the items (image and text rows) ``index`` (ascending) of ``split``. Shape: [n] uint64."""
    return _item_prints(*(_column_prints(path, f, split, name, index) for name in ("image", "text")))


def images_trained_on(path: str) -> Tuple[int, int]:
    """How many query rows of a (valid) dataset file have the image features of a training row, and of how many:
    the same picture under another id and another text (Wikipedia's query rows 66, 380 and 542, each an image of
    two articles), which validation lets be (the field's splits hold it): an image→text query of it ranks by an
    image trained on."""
    with open_without_chunk_cache(path) as f:
        query, train = (_column_prints(path, f, split, "image", np.arange(f[split]["image"].shape[0]))
                        for split in ("query", "train"))
    return int(np.isin(query, train).sum()), len(query)


def rows_found_in(path: str, split: str, other_path: str, other_split: str) -> Tuple[int, int]:
    """How many rows of ``split`` of ``path`` have the image and text features (every column, by value) of a row
    of ``other_split`` of ``other_path``, and of how many: a model scored on another file's query items it was
    trained on (another export of the same items). Both files are read by blocks of rows."""
    with open_without_chunk_cache(path) as f, open_without_chunk_cache(other_path) as g:
        mine = _whole_prints(path, f, split, np.arange(f[split]["image"].shape[0]))
        theirs = _whole_prints(other_path, g, other_split, np.arange(g[other_split]["image"].shape[0]))
    return int(np.isin(mine, theirs).sum()), len(mine)


def queries_trained_on(scored: str, trained: Optional[str]) -> Optional[Tuple[int, int]]:
    """How many of ``scored``'s query items are items of ``trained``'s training split, by their captions
    (``text_raw``), and of how many: a model scored on items it was trained on (another export of the same
    photos, e.g. a Flickr8k subset against full Flickr8k) scores far above its honest figure. An item (the
    rows of one id) counts when more than half its captions are training captions (one generic caption, "A dog
    runs through the grass", is in both splits of one file). None where the scored file is not a caption set
    (a labelled set's texts are tags, which repeat across images: 10 of mirflickr730's 100 query items against
    its own training split), either file holds no captions, or ``trained`` is not there."""
    if not trained or not os.path.isfile(trained):
        return None
    try:
        with h5py.File(scored, "r") as a, h5py.File(trained, "r") as b:
            if "text_raw" not in a["query"] or "train" not in b or "text_raw" not in b["train"] or \
                    "labels" in a["query"] or "ids" not in a["query"]:  # captions of a caption set: tags repeat
                return None
            captions = a["query/text_raw"][()]
            ids = a["query/ids"][()]
            training = set(b["train/text_raw"][()])
    except (OSError, KeyError):
        return None
    found = np.array([caption in training for caption in captions])
    items, item = np.unique(ids, return_inverse=True)
    share = np.bincount(item, weights=found, minlength=len(items)) / np.bincount(item, minlength=len(items))
    return int((share > 0.5).sum()), len(items)


def _item_prints(image: np.ndarray, text: np.ndarray) -> np.ndarray:
    """An item's fingerprint from its image's and its text's. Shape: [N], [N] -> [N] uint64."""
    return image ^ (text * np.uint64(0x9E3779B97F4A7C15))


def relevance_warnings(query_labels: Any, retrieval_labels: Any) -> List[str]:
    """What to say of labels under which some query items' scores say nothing of the codes: those that share a
    label with no retrieval item (each scores 0 in every MAP) and those that share one with every retrieval item
    (each scores 1: one class for all scores every ranking, and random codes, 1). Valid labels (a file may hold
    them; a small collection of a few overlapping classes does), said where they are scored. Read by blocks of
    query rows against the retrieval split's distinct label rows. Shape: [Q, C], [N, C] (arrays, h5py datasets)."""
    retrieval = np.unique(np.asarray(retrieval_labels[()]) != 0, axis=0).astype(np.float32)  # [U, C]
    none = every = 0
    n = query_labels.shape[0]
    for start in range(0, n, _CHECK_ROWS):
        shared = (np.asarray(query_labels[start:start + _CHECK_ROWS]) != 0).astype(np.float32) @ retrieval.T > 0
        none += int((~shared.any(axis=1)).sum())
        every += int(shared.all(axis=1).sum())
    said = []
    for count, whom, score in ((none, "no retrieval item", 0), (every, "every retrieval item", 1)):
        if count == n:
            said.append(f"every query item shares a label with {whom}: every MAP is {score}, whatever the codes"
                        + (" (one class for all?)" if score else ""))
        elif count:
            said.append(f"{count} of the {n} query items share a label with {whom}: each scores {score} in every "
                        "MAP, whatever the codes")
    return said


# where ids are given by a flag (convert's --ids), the remedy of copies under several ids
COPIES_ONE_ID = ("ids", "IDS", "giving copies of one item one id, so that they fall in one split")


def _check_one_image_an_id(path: str, where: str, ids: np.ndarray, prints: np.ndarray) -> None:
    """Rows sharing an id are one image (docs/reference.md §1: a caption set's captions of one image): their
    image features must be equal. Ids given by row (5 captions an image, numbered as if 4) would make strangers
    positives and one image of several, without a word."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    other = np.flatnonzero(prints != prints[first[inverse.ravel()]])
    if other.size:
        row = int(other[0])
        raise _fail(path, where, f"rows {int(first[inverse.ravel()[row]])} and {row} share id {ids[row]} but hold "
                                 f"different image features ({other.size} such rows); rows sharing an id are one "
                                 "image: give each image an id of its own")


def _check_an_id_one_image_in_both(path: str, ids: Dict[str, np.ndarray], images: Dict[str, np.ndarray]) -> None:
    """An id names one image in train and retrieval alike (docs/reference.md §1; train drawn from retrieval keeps
    its ids): a train split whose ids were given anew, another image under a retrieval item's id, was valid, and
    its rows made strangers positives wherever the two splits meet (an encoder trained on both)."""
    common, in_train, in_retrieval = np.intersect1d(ids["train"], ids["retrieval"], return_indices=True)
    other = np.flatnonzero(images["train"][in_train] != images["retrieval"][in_retrieval])
    if other.size:  # unequal fingerprints: unequal features (equal ones may still differ: not refused)
        row = int(other[0])
        raise _fail(path, "/train/ids", f"id {common[row]} is another image than /retrieval's (train row "
                                        f"{in_train[row]}, retrieval row {in_retrieval[row]}; {other.size} such ids); "
                                        "an id names one image in every split")


def _check_an_id_an_image(path: str, where: str, ids: np.ndarray, prints: np.ndarray) -> None:
    """The converse of :func:`_check_one_image_an_id`: most rows' images are not also under other ids. Ids given
    by row (a caption its own id) make each caption its own image, and a caption set's I→T finds one text where
    there are five: its figures another protocol's, without a word. A few images twice under two ids are real
    (Wikipedia's 14 rows, Flickr8k's 10 of 35,455): more than half the rows is refused."""
    pairs = np.unique(np.stack([prints, ids.astype(np.uint64)], axis=1), axis=0)  # each (image, id) once
    images, count = np.unique(pairs[:, 0], return_counts=True)
    several = np.isin(prints, images[count > 1])
    if 2 * int(several.sum()) > len(ids):
        row = int(np.argmax(several))
        other = int(np.flatnonzero((prints == prints[row]) & (ids != ids[row]))[0])
        raise _fail(path, where, f"{int(several.sum())} of {len(ids)} rows hold an image that other rows hold "
                                 f"under other ids (first: rows {row} and {other}, ids {ids[row]} and {ids[other]}); "
                                 "the rows of one image share its id (a caption set: its captions)", COPIES_ONE_ID)


def _check_ids(path: str, where: str, dset: h5py.Dataset, n_rows: int) -> np.ndarray:
    """The ids: integers (a float id would be truncated on loading), >= 0, fitting int64."""
    if dset.dtype.kind not in "iu":
        raise _fail(path, where, f"ids must be integers, got {dset.dtype}")
    if dset.shape != (n_rows,):
        raise _fail(path, where, f"expected shape ({n_rows},), got {dset.shape}")
    ids = _read(path, where, dset)
    problem = id_problem(ids)
    if problem:
        raise _fail(path, where, problem)
    return ids


def _check_split(path: str, group: h5py.Group, split: str, dims: Dict[str, tuple],
                 tokens: Dict[str, list], token_values: bool, pairs: Dict[str, np.ndarray],
                 images: Dict[str, np.ndarray], keep: Optional[Dict[str, Any]] = None) -> Optional[np.ndarray]:
    """Check one split's datasets (its token datasets' values with ``token_values``); ``dims`` collects each
    dataset's column count across splits, ``tokens`` the token datasets (§9) each split has, ``pairs`` each
    item's fingerprint of its image and text features together, ``images`` of its image features, and ``keep``
    the features read of the datasets it names (:func:`validate_file`). Returns its ids."""
    n_rows = None
    prints: Dict[str, np.ndarray] = {}
    for name in REQUIRED:
        where = f"/{split}/{name}"
        if name == "labels" and name not in group:  # a caption set: relevance is "same id" (checked below)
            continue
        dset = _member(path, group, name, where, h5py.Dataset)
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
            raise _fail(path, where, f"{dset.shape[1]} columns, but /{previous[0]}/{name} has {previous[1]}")
        if name == "labels":
            labels = _read(path, where, dset)
            if not is_multi_hot(labels):
                raise _fail(path, where, "labels must be multi-hot 0/1 values")
            problem = unlabelled_rows(labels)
            if problem:
                raise _fail(path, where, problem)
        else:
            if dset.dtype.kind != "f":
                raise _fail(path, where, f"expected floating-point features, got {dset.dtype}")
            prints[name] = _check_finite(path, where, dset, keep)
    bow = _member(path, group, "text_bow", f"/{split}/text_bow", h5py.Dataset, required=False)
    if bow is not None:
        where = f"/{split}/text_bow"
        if bow.ndim != 2 or bow.shape[0] != n_rows:
            raise _fail(path, where, f"expected shape ({n_rows}, V), got {bow.shape}")
        if bow.dtype.kind not in "biuf":
            raise _fail(path, where, f"expected word counts, got {bow.dtype}")
        previous = dims.setdefault("text_bow", (split, bow.shape[1]))  # one vocabulary
        if previous[1] != bow.shape[1]:
            raise _fail(path, where, f"{bow.shape[1]} words, but /{previous[0]}/text_bow has {previous[1]}")
        step = _block_rows(bow)
        for start in range(0, n_rows if token_values else 0, step):  # validate passed counts of 0.5
            if not is_bag_of_words(_read(path, where, bow, slice(start, start + step))):
                raise _fail(path, where, "bag-of-words counts must be whole numbers from 0 to 255 (uint8)")
    for name in ("paths", "text_raw"):  # what search results show of an item: one string each
        strings = _member(path, group, name, f"/{split}/{name}", h5py.Dataset, required=False)
        if strings is not None and (strings.shape != (n_rows,) or strings.dtype.kind not in "OSU"):
            raise _fail(path, f"/{split}/{name}", f"expected {n_rows} strings, one an item, got {strings.dtype} "
                                                  f"{strings.shape}")
        if strings is not None and token_values:  # validate passed bytes that 'ucmfh index' then refused
            check_utf8_column(strings, f"{path}: /{split}/{name}")
    ids = _member(path, group, "ids", f"/{split}/ids", h5py.Dataset, required=False)
    if "labels" not in group and ids is None:
        raise _fail(path, f"/{split}/labels", "missing dataset, and no /ids either: a file without labels "
                                               "(a caption set) needs ids, whose equality is then relevance")
    tokens[split] = check_tokens(path, group, split, n_rows, dims, token_values)
    pairs[split] = _item_prints(prints["image"], prints["text"])  # an item: both its features
    images[split] = prints["image"]
    if ids is None:
        return None
    split_ids = _check_ids(path, f"/{split}/ids", ids, n_rows)
    _check_one_image_an_id(path, f"/{split}/image", split_ids, prints["image"])
    _check_an_id_an_image(path, f"/{split}/ids", split_ids, prints["image"])
    return split_ids


def is_dataset_file(path: str) -> bool:
    """Whether ``path`` is a dataset file (its three splits, docs/data.md) rather than a collection file, whose
    groups may have any names (a group named train among them): it has train, query and retrieval. False for what
    is not an HDF5 file (open_collection says what it is), or not a regular file (a pipe: opening it waited)."""
    if not os.path.isfile(path):
        return False
    try:
        with h5py.File(path, "r") as f:
            return all(f.get(split, getlink=True) is not None for split in ("train", "query", "retrieval"))
    except OSError:
        return False


def validate_file(path: PathLike, token_values: bool = True,
                  keep: Optional[Dict[str, Any]] = None) -> Dict[str, object]:
    """Check a dataset file against the format without loading it whole; ``token_values=False`` leaves out
    the scan of its token datasets' values (their layout is checked; :class:`ucmfh.data.tokens.Tokens`
    scans a split's values where it reads them). ``keep``: the feature datasets whose values to keep, by path
    (``"/train/image"``); each is set to its float32 array as read for the check.

    Returns the root attributes. Raises :class:`DataError` naming the file,
    the HDF5 object and the problem.
    """
    path = checked_path("validate_file", path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file{a_name_not_a_path(path)}" if path else
                          "an empty path; give the dataset file")
    if os.path.isdir(path):  # HDF5's own word on it ran to several lines
        raise DataError(f"{path}: is a folder, not a dataset file")
    if not os.path.isfile(path):  # a pipe or a device: opening it waited for ever
        raise DataError(f"{path}: not a regular file (a pipe or a device); give the dataset file")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(not_hdf5(path, err)) from None
    with f:
        if f.attrs.get("format") == CODES_FORMAT:  # not '/train: missing group'
            raise DataError(f"{path}: a codes file of 'ucmfh encode', not a dataset; 'ucmfh evaluate --codes {path}' "
                            "scores it")
        dims: Dict[str, tuple] = {}
        ids: Dict[str, np.ndarray] = {}
        tokens: Dict[str, list] = {}
        pairs: Dict[str, np.ndarray] = {}
        images: Dict[str, np.ndarray] = {}
        for split in SPLITS:
            split_ids = _check_split(path, _member(path, f, split, f"/{split}", h5py.Group), split, dims, tokens,
                                     token_values, pairs, images, keep)
            if split_ids is not None:
                ids[split] = split_ids
        check_token_splits(path, tokens)
        try:
            attrs = read_attrs(f)
        except (OSError, TypeError, ValueError) as err:
            raise _fail(path, "root attributes", f"unreadable ({err})") from None
        if "dense_text_tokens" in tokens["train"]:
            check_dense_source(path, attrs)
        labelled = [split for split in SPLITS if "labels" in f[split]]
        if labelled and len(labelled) < len(SPLITS):
            missing = next(split for split in SPLITS if split not in labelled)
            raise _fail(path, f"/{missing}/labels", f"missing dataset, but /{labelled[0]}/labels exists: "
                                                    "either every split has labels or none (a caption set)")
        classes = attrs.get("classes")
        n_classes = dims["labels"][1] if labelled else 0
        if classes is not None and (not isinstance(classes, list) or len(classes) != n_classes):
            got = f"{len(classes)} names" if isinstance(classes, list) else f"a single {type(classes).__name__}"
            raise _fail(path, "attribute 'classes'", f"{got} for {n_classes} label columns")
        if ids and len(ids) < len(SPLITS):  # read by one split and not the next: said where it is missing
            missing = next(split for split in SPLITS if split not in ids)
            raise _fail(path, f"/{missing}/ids", f"missing dataset, but /{next(iter(ids))}/ids exists: either every "
                                                 "split has ids or none")
        if ids:
            _check_an_id_one_image_in_both(path, ids, images)
        for other in ("retrieval", "train"):  # a query item trained on, or found as itself, inflates every score
            problem = shared_ids(ids["query"], ids[other], other) if ids else None
            if problem:
                raise _fail(path, "/query/ids", problem)
        for other in ("retrieval", "train"):  # the same items under other ids (a query split copied from another)
            again = np.flatnonzero(np.isin(pairs["query"], pairs[other]))
            if len(again):  # the prints of sampled columns agree: the whole rows, read again, decide
                again = _equal_items(path, f, again, other, pairs)
            if len(again):
                named = f", id {ids['query'][again[0]]}" if ids else ""
                raise _fail(path, "/query", f"{len(again)} items have the image and text features of /{other} "
                                            f"items (first: query row {again[0]}{named}); query and {other} must be "
                                            "disjoint: a query item trained on, or found as itself, inflates every "
                                            "score", COPIES_ONE_ID)
        return attrs


DEFAULT_MAX_MEMORY = 8 * 2**30  # bytes of features held in memory; the largest splits beyond it are streamed


def _feature_bytes(f: h5py.File) -> Dict[str, int]:
    """Each split's bytes of features as float32, from the shapes alone."""
    return {s: 4 * f[s]["image"].shape[0] * (f[s]["image"].shape[1] + f[s]["text"].shape[1]) for s in SPLITS}


def _streamed(size: Optional[Dict[str, int]], max_memory_bytes: Optional[int]) -> Set[str]:
    """The splits whose features are read from the file as training goes: the largest, until those held fit."""
    streamed: Set[str] = set()
    if size is None or max_memory_bytes is None:
        return streamed
    held = sum(size.values())
    for split in sorted(SPLITS, key=size.get, reverse=True):
        if held > max_memory_bytes:
            streamed.add(split)
            held -= size[split]
    return streamed


def load_dataset(path: PathLike, validate: bool = True, max_memory_bytes: Optional[int] = DEFAULT_MAX_MEMORY,
                 stream: StreamSettings = StreamSettings()) -> Dataset:
    """Load a dataset file (validated first, but for its token datasets' values: read by
    :class:`ucmfh.data.tokens.Tokens`, which checks them): ids and labels into memory as CPU tensors, and the features
    too while all splits' features fit in ``max_memory_bytes`` (None: always); beyond that the largest
    splits' features are :class:`Rows` read from the file on demand, as ``stream`` says, their block
    caches within what the splits held in memory leave of ``max_memory_bytes``. ``validate=False`` reads a file
    known to be valid without checking its values (seconds on a large file); one not of the format's shape is
    still refused in validation's words.
    """
    path = checked_path("load_dataset", path)
    check_argument("load_dataset", "max_memory_bytes", max_memory_bytes, int, "bytes, e.g. 8 * 2**30", optional=True)
    if max_memory_bytes is not None and (isinstance(max_memory_bytes, bool) or max_memory_bytes <= 0):
        raise ValueError(f"load_dataset: max_memory_bytes must be a positive number of bytes (None: every split in "
                         f"memory), got {max_memory_bytes!r}")
    if not os.path.isfile(path):  # absent, a folder, a pipe (whose opening waited for ever): said as validation says
        validate_file(path)
    try:
        with h5py.File(path, "r") as f:
            sizes: Optional[Dict[str, int]] = _feature_bytes(f)
    except (OSError, KeyError, TypeError, ValueError, IndexError, AttributeError):
        sizes = None  # not a file of the format's shape: validation says what is wrong
    # the features held in memory are those validation reads: kept from its reads, not read again
    keep = {f"/{split}/{name}": None for split in SPLITS if split not in _streamed(sizes, max_memory_bytes)
            for name in ("image", "text")} if validate and sizes is not None else None
    # a file not of the format's shape: validation says what is wrong (h5py's KeyError or OSError did, unchecked)
    attrs = validate_file(path, token_values=False, keep=keep) if validate or sizes is None else None
    with open_without_chunk_cache(path) as f:  # the streamed splits' files share its cache
        if attrs is None:
            attrs = read_attrs(f)
        size = sizes if sizes is not None else _feature_bytes(f)
        streamed = _streamed(size, max_memory_bytes)
        held = sum(size[split] for split in SPLITS if split not in streamed)

        # the block caches of the streamed features share what the splits held in memory leave
        per_dataset = (max_memory_bytes or 0) - held if streamed else 0
        per_dataset //= max(1, 2 * len(streamed))

        def features(split: str, name: str) -> Features:
            if split in streamed:
                return Rows(path, f"{split}/{name}", stream.within(per_dataset, f[split][name].shape[1]))
            if keep is not None:
                return torch.from_numpy(keep[f"/{split}/{name}"])
            return torch.from_numpy(np.asarray(f[split][name][()], dtype=np.float32))

        splits = {}
        for split in SPLITS:
            group = f[split]
            splits[split] = Split(
                img=features(split, "image"),
                txt=features(split, "text"),
                labels=(torch.from_numpy(np.asarray(group["labels"][()], dtype=np.uint8))
                        if "labels" in group else None),
                ids=torch.from_numpy(np.asarray(group["ids"][()], dtype=np.int64)) if "ids" in group else None,
            )
    return Dataset(attrs=attrs, path=path, **splits)
