"""Convert released feature files into the ucmfh HDF5 format (docs/reference.md §1).

Three inputs, one output format:

* :func:`convert_pkl` — UCMFH's ``train.pkl`` / ``query.pkl`` / ``retrieval.pkl``
  (each a dict with ``image`` [N, 512], ``text`` [N, 512], ``label`` [N, C]),
  split as released; read by :func:`ucmfh.data.safe_pickle.load_pickle`, which runs none of a file's code.
* :func:`convert_arrays` — whole-set matrices (image, text, labels) from
  DJSRH/UCCH-style ``.mat`` files (v5 via :mod:`scipy.io`, v7.3 via h5py,
  which stores MATLAB's [N, d] as [d, N]) or from ``.npy`` / ``.npz`` files,
  with a seeded split (:mod:`ucmfh.data.splits`) or a given one.

Large inputs are streamed: the source is read in blocks of rows, each block is
cast to float32 and scattered into the output splits, so at most one copy of a
matrix (none for ``.npy`` and v7.3 ``.mat``) is in memory.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import h5py
import numpy as np
from tqdm.auto import tqdm

from ucmfh.config import SettingError
from ucmfh.data.format import MissingFile, finite_float32
from ucmfh.data.h5 import SPLITS, DataError, PathLike, is_multi_hot
from ucmfh.data.writer import create_split_dataset, open_writer
from ucmfh.data.arrays import ArraySource, open_array
from ucmfh.data.input_files import read_lines
from ucmfh.data.safe_pickle import load_pickle
from ucmfh.data.splits import DEFAULT_SEED, SplitIndex, SplitSizes, check_seed, load_split_index, sample_split
from ucmfh.signals import stop_on_signals, stopped_by

log = logging.getLogger(__name__)

EMPTY_LABELS = ("drop", "fail")
CHUNK_ROWS = 4096  # rows read and written per block by a conversion


@dataclass
class ConvertReport:
    """What a conversion wrote: rows per split and rows dropped for having no label."""

    path: str
    rows: Dict[str, int]
    dropped: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _read_ids(src: Any, n: int) -> np.ndarray:
    """Item ids, one a row: whole numbers >= 0 (rows of one id are one image)."""
    values = src.read_all()
    if values.ndim == 2 and 1 in values.shape:  # a .mat column or row vector
        values = values.reshape(-1)
    if values.ndim != 1 or len(values) != n:
        raise DataError(f"{src.name}: expected {n} ids, one a row of the features, got shape {values.shape}")
    if values.dtype.kind not in "iu":
        if values.dtype.kind != "f" or not np.array_equal(values, np.round(values)):
            raise DataError(f"{src.name}: ids must be whole numbers, got {values.dtype}")
    if values.size and values.min() < 0:
        raise DataError(f"{src.name}: ids must be >= 0 (rows sharing an id are one image), got {values.min():g}")
    if values.size and values.max() >= 2**63:  # wrapped to negative ids, said of the output file
        row = int(np.argmax(values >= 2**63))
        raise DataError(f"{src.name}: id {values[row]} at row {row} does not fit int64")
    return values.astype(np.int64)


ONE_HOT = "give it one-hot: numpy.eye(C)[classes]"


def _check_labels(labels: np.ndarray, where: str) -> np.ndarray:
    """[N, C] 0/1 labels as uint8; refused, naming the first wrong value: any other shape or value, and one
    column (one class shared by every labelled row makes every MAP 1; a column of class indices is not 0/1)."""
    if labels.ndim != 2 or labels.shape[1] == 0:
        raise DataError(f"{where}: labels must be a 2-D [N, C] multi-hot matrix, got shape {labels.shape}")
    if not is_multi_hot(labels):
        row, column = (int(i[0]) for i in np.nonzero(~np.isin(labels, (0, 1))))
        whole = labels.dtype.kind in "biu" or bool(np.all(np.round(labels) == labels))
        hint = (f" (a column of class indices? {ONE_HOT})" if labels.shape[1] == 1 and whole
                else " (counts? labels > 0 are the 0/1 labels)" if whole and labels.min() >= 0 else "")
        raise DataError(f"{where}: labels must be multi-hot 0/1 values, got {labels[row, column]:g} at row {row}, "
                        f"column {column}{hint}")
    if labels.shape[1] == 1:
        raise DataError(f"{where}: one label column: one class for every labelled row would make every MAP 1 "
                        f"(class indices? {ONE_HOT})")
    return labels.astype(np.uint8)


def empty_label_rows(labels: np.ndarray, where: str, empty_labels: str,
                     names: Optional[Sequence[str]] = None) -> np.ndarray:
    """Bool mask of rows to keep; rows with no label are dropped (logged) or fail. ``names``: what each row is
    (an image's file name), said instead of its row number."""
    if empty_labels not in EMPTY_LABELS:
        raise ValueError(f"empty_labels must be one of {EMPTY_LABELS}, got {empty_labels!r}")
    empty = labels.sum(axis=1) == 0
    n_empty = int(empty.sum())
    if n_empty:
        index = int(np.flatnonzero(empty)[0])
        first = f"row {index}" if names is None else f"image {names[index]}"
        kind = "rows" if names is None else "images"
        if empty_labels == "fail":
            raise DataError(f"{where}: {n_empty} {kind} have no label (first: {first})",
                            remedy=("empty_labels", "drop", "to leave them out"))
        log.warning("%s: dropped %d of %d %s that have no label (first: %s)", where, n_empty, len(labels), kind, first)
    return ~empty


def root_attrs(
    out: str,
    name: Optional[str],
    classes: Optional[Sequence[str]],
    n_classes: int,
    image_feature: Optional[str],
    text_feature: Optional[str],
    source: str,
    split_rule: str,
) -> Dict[str, object]:
    if classes is not None and len(classes) != n_classes:
        raise SettingError("classes", f"classes: {len(classes)} class names given for the {n_classes} label columns "
                                      f"of the input (writing {out})")
    return {
        "name": name or os.path.splitext(os.path.basename(out))[0],
        # a caption set has no classes: no attribute (an empty list was written as an empty float64 array)
        **({"classes": list(classes) if classes is not None else [f"class_{i}" for i in range(n_classes)]}
           if n_classes else {}),
        "image_feature": image_feature or "unknown",
        "text_feature": text_feature or "unknown",
        "source": source,
        "split": split_rule,
    }


def read_classes(path: PathLike) -> List[str]:
    """Class names, one per line (blank lines ignored)."""
    names = read_lines(path)
    if not names:
        raise DataError(f"{path}: no class names")
    if len(set(names)) != len(names):
        again = next(name for i, name in enumerate(names) if name in names[:i])
        raise DataError(f"{path}: repeated class names (first: {again!r})")
    return names


def _as_numpy(value, where: str) -> np.ndarray:
    try:
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        array = np.asarray(value)
    except (ValueError, TypeError) as err:  # ragged lists, a dtype numpy lacks
        raise DataError(f"{where}: not a numeric array ({err})") from None
    if array.dtype.kind not in "biuf":
        raise DataError(f"{where}: not a numeric array (dtype {array.dtype})")
    return array


def _load_pkl(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """A split's arrays, keyed image, text and labels, and what the file names each: a message names the file's
    key (its labels 'label', UCMFH's, or 'labels'), where a file of 'label' was said to hold 'labels'."""
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    data = load_pickle(path)  # runs none of the file's code: a released file may come from anyone
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a dict with 'image', 'text', 'label', got {type(data).__name__}")
    label_key = "labels" if "labels" in data and "label" not in data else "label"
    missing = [k for k in ("image", "text", label_key) if k not in data]
    if missing:
        raise DataError(f"{path}: missing keys {missing} (has {sorted(map(str, data))})")
    names = {"image": "image", "text": "text", "labels": label_key}
    arrays = {
        "image": _as_numpy(data["image"], f"{path}: 'image'"),
        "text": _as_numpy(data["text"], f"{path}: 'text'"),
        "labels": _as_numpy(data[label_key], f"{path}: '{label_key}'"),
    }
    for k, v in arrays.items():
        key = names[k]
        if v.ndim != 2:
            raise DataError(f"{path}: '{key}': expected a 2-D array, got shape {v.shape}")
        if len(v) != len(arrays["image"]):
            raise DataError(f"{path}: '{key}' has {len(v)} rows, 'image' has {len(arrays['image'])}")
        if k != "labels":
            finite_float32(v, f"{path}: '{k}'")
    if len(arrays["image"]) == 0:
        raise DataError(f"{path}: empty split (0 rows)")
    return arrays, names


def convert_pkl(
    inputs: Union[PathLike, Dict[str, PathLike]],
    out: PathLike,
    *,
    name: Optional[str] = None,
    classes: Optional[Sequence[str]] = None,
    image_feature: str = "CLIP ViT-B/32 image embedding (UCMFH release)",
    text_feature: str = "CLIP ViT-B/32 text embedding (UCMFH release)",
    empty_labels: str = "drop",
    overwrite: bool = False,
) -> ConvertReport:
    """UCMFH's ``train.pkl`` / ``query.pkl`` / ``retrieval.pkl`` → one HDF5 file, split as released.

    ``inputs`` is the folder holding the three files or a dict split → path.
    One split is held in memory at a time (a pickle cannot be streamed).
    """
    t0 = time.perf_counter()
    out = os.fspath(out)
    if isinstance(inputs, dict):
        paths = {s: os.fspath(inputs[s]) for s in SPLITS}
    else:
        paths = {s: os.path.join(os.fspath(inputs), f"{s}.pkl") for s in SPLITS}
    for path in paths.values():
        if not os.path.exists(path):
            raise MissingFile(f"{path}: no such file")
    report = ConvertReport(path=out, rows={})
    # the first split fixes the class count for the root attributes
    first, names = _load_pkl(paths["train"])
    n_classes = first["labels"].shape[1]
    attrs = root_attrs(
        out, name, classes, n_classes, image_feature, text_feature,
        source="UCMFH pkl release: " + ", ".join(f"{s}={paths[s]}" for s in SPLITS),
        split_rule="as released: train.pkl, query.pkl, retrieval.pkl",
    )
    columns = {key: (paths["train"], array.shape[1]) for key, array in first.items()}
    size = sum(os.path.getsize(path) for path in paths.values())  # pickled arrays: about the file's size
    with open_writer(out, attrs, overwrite, size) as f:
        for split in SPLITS:
            arrays, names = (first, names) if split == "train" else _load_pkl(paths[split])
            first = None
            for key, array in arrays.items():
                if array.shape[1] != columns[key][1]:
                    raise DataError(f"{paths[split]}: '{names[key]}' has {array.shape[1]} columns, "
                                    f"but {columns[key][0]} has {columns[key][1]}")
            labels = _check_labels(arrays["labels"], f"{paths[split]}: '{names['labels']}'")
            keep = empty_label_rows(labels, paths[split], empty_labels)
            report.dropped[split] = int((~keep).sum())
            if not keep.any():
                raise DataError(f"{paths[split]}: empty split (no row has a label)")
            for key, array in (("image", arrays["image"]), ("text", arrays["text"]), ("labels", labels)):
                create_split_dataset(f, split, key, (int(keep.sum()), array.shape[1]))[...] = array[keep]
            report.rows[split] = int(keep.sum())
            del arrays
    report.seconds = time.perf_counter() - t0
    return report


def _scatter(
    f: h5py.File,
    key: str,
    src: ArraySource,
    index: Dict[str, np.ndarray],
    chunk_rows: int,
    bar: tqdm,
    heard: Dict[str, Optional[int]],
) -> None:
    """Copy the rows of ``src`` named by ``index`` into ``/split/key``, one source block at a time; a signal
    ``heard`` (:func:`ucmfh.signals.stop_on_signals`) ends it between two blocks (a KeyboardInterrupt).

    Each split's source rows are sorted, so the rows of one block land in a
    contiguous range of each output dataset.
    """
    dsets = {s: create_split_dataset(f, s, key, (len(rows), src.shape[1])) for s, rows in index.items()}
    n = len(src)
    for start in range(0, n, chunk_rows):
        if heard["signal"] is not None:
            raise stopped_by("interrupted; nothing written", heard["signal"])
        stop = min(n, start + chunk_rows)
        spans = {s: np.searchsorted(rows, (start, stop)) for s, rows in index.items()}
        if any(hi > lo for lo, hi in spans.values()):
            block = finite_float32(src.read(start, stop), src.name, start)
            for s, (lo, hi) in spans.items():
                if hi > lo:
                    dsets[s][lo:hi] = block[index[s][lo:hi] - start]
        bar.update(stop - start)


def convert_arrays(
    image: PathLike,
    text: PathLike,
    labels: Optional[PathLike],
    out: PathLike,
    *,
    ids: Optional[PathLike] = None,
    image_key: Optional[str] = None,
    text_key: Optional[str] = None,
    labels_key: Optional[str] = None,
    ids_key: Optional[str] = None,
    sizes: Optional[SplitSizes] = None,
    split_index: Optional[Union[SplitIndex, PathLike]] = None,
    seed: int = DEFAULT_SEED,
    name: Optional[str] = None,
    classes: Optional[Sequence[str]] = None,
    image_feature: Optional[str] = None,
    text_feature: Optional[str] = None,
    empty_labels: str = "drop",
    chunk_rows: int = CHUNK_ROWS,
    overwrite: bool = False,
    progress: bool = True,
) -> ConvertReport:
    """Whole-set image / text / label matrices (``.mat`` v5 or v7.3, ``.npy``, ``.npz``) → HDF5.

    The split is drawn by :func:`ucmfh.data.splits.sample_split` with
    ``sizes`` and ``seed`` (rule and seed go into the ``split`` attribute), or
    given as ``split_index`` (a :class:`SplitIndex` or an ``.npz`` of source
    rows). ``ids`` in the output are the source row numbers, or the ``ids`` given: rows of one id are one
    image (its captions), kept in one split, the split's sizes counted in ids. Without ``labels`` the
    output is a caption set (relevance: same id), which needs ``ids``. Rows without a label are dropped
    before drawing (``empty_labels='drop'``, logged) or fail.

    Shape: image [N, d_img], text [N, d_txt], labels [N, C] 0/1, any numeric dtype; ids [N] integers >= 0.

    Raises ``DataError`` for the inputs, ``SettingError`` (a ValueError, its ``settings`` the sizes at fault) for
    split sizes more than the rows give.
    """
    t0 = time.perf_counter()
    out = os.fspath(out)
    if (sizes is None) == (split_index is None):
        raise ValueError("give exactly one of sizes (a drawn split) or split_index (a given split)")
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    check_seed(seed)
    with ExitStack() as stack:
        if labels is None and ids is None:
            raise ValueError("a caption set (no labels) needs ids: rows of one id are one image, relevant to each "
                             "other")
        img_src = open_array(image, image_key, "image", stack)
        txt_src = open_array(text, text_key, "text", stack)
        lab_src = None if labels is None else open_array(labels, labels_key, "labels", stack)
        item_ids = None if ids is None else _read_ids(open_array(ids, ids_key, "ids", stack), len(img_src))
        for src, role in ((img_src, "image"), (txt_src, "text"), (lab_src, "labels")):
            if src is None:
                continue
            if len(src.shape) != 2 or src.shape[1] == 0:
                hint = (f" (one class an item? {ONE_HOT})"
                        if role == "labels" and len(src.shape) == 1 else "")
                raise DataError(f"{src.name}: expected a 2-D [N, d] {role} matrix, got shape {src.shape}{hint}")
            if src.dtype.kind not in "biuf":
                raise DataError(f"{src.name}: expected numeric {role} values, got {src.dtype}")
        n = len(img_src)
        for src in (txt_src, lab_src):
            if src is not None and len(src) != n:
                turned = (src if src.shape[1] == n else img_src if img_src.shape[1] == len(src) else None)
                hint = f" ({turned.name} stored transposed, [d, N]? save it as [N, d])" if turned is not None else ""
                raise DataError(f"{src.name}: {len(src)} rows, but {img_src.name} has {n}{hint}")
        head = min(n, 256)
        first = img_src.read(0, head) if img_src.shape == txt_src.shape else None
        # the same rows, unless every value is one (rows of zeros: features missing in both, which the rows hold)
        if first is not None and np.ptp(first) > 0 and np.array_equal(first, txt_src.read(0, head)):
            raise DataError(f"{txt_src.name}: its first {head} rows are those of {img_src.name}: the image matrix "
                            "given as the text matrix too?")
        label_matrix = None if lab_src is None else _check_labels(lab_src.read_all(), lab_src.name)
        keep = np.ones(n, dtype=bool) if lab_src is None else empty_label_rows(label_matrix, lab_src.name, empty_labels)
        if not keep.any():
            raise DataError(f"{lab_src.name}: no row has a label (every row is 0)")
        if split_index is None:
            try:
                index = sample_split(n, sizes, seed, ids=item_ids, keep=keep)
            except SettingError as err:  # said as the sizes at fault: --query, --train, --retrieval
                raise SettingError(err.settings, f"{img_src.name}: {err}") from None
        else:
            index = split_index if isinstance(split_index, SplitIndex) else load_split_index(os.fspath(split_index))
            given = os.fspath(split_index) if not isinstance(split_index, SplitIndex) else "the split index"
            # MATLAB's row numbers start at 1: given as they are, every row is the next one
            parts = index.as_dict()
            lowest = min((int(rows.min()) for rows in parts.values() if rows.size), default=0)
            one_based = " (numbered from 1, as MATLAB does? row numbers start at 0: subtract 1)" if lowest >= 1 else ""
            for s, rows in parts.items():
                outside = rows[(rows < 0) | (rows >= n)]
                if outside.size:
                    raise DataError(f"{given}: {s}: {outside.size} rows out of range for {n} source rows "
                                    f"(first: {outside[0]}){one_based}")
            held = np.zeros(n, dtype=bool)
            for rows in parts.values():
                held[rows] = True
            if one_based and keep[0] and held[1:][keep[1:]].all():  # every labelled row but row 0: shifted by one?
                log.warning("%s: no split holds source row 0, the one labelled row left out%s", given, one_based)
            # rows without a label were dropped (--empty-labels drop, logged): from the splits given too, where
            # they were refused, the message's remedy being the drop that had been made
            left = {s: int((~keep[rows]).sum()) for s, rows in index.as_dict().items()}
            if any(left.values()):
                said = ", ".join(f"{s} {n}" for s, n in left.items() if n)
                log.warning("%s: left out of the splits it gives, rows without a label: %s", given, said)
                index = dataclasses.replace(index, rule=f"{index.rule}; rows without a label left out: {said}",
                                            **{s: rows[keep[rows]] for s, rows in index.as_dict().items()})
            for s, rows in index.as_dict().items():
                if not rows.size:
                    raise DataError(f"{given}: {s}: empty split (no row of it has a label)")
        rows = index.as_dict()
        attrs = root_attrs(
            out, name, classes, 0 if label_matrix is None else label_matrix.shape[1],
            image_feature or f"from {img_src.name} ({img_src.shape[1]}-d)",
            text_feature or f"from {txt_src.name} ({txt_src.shape[1]}-d)",
            source=f"image={img_src.name}; text={txt_src.name}; "
                   + (f"labels={lab_src.name}" if lab_src is not None else "no labels (a caption set)")
                   + (f"; ids={ids}" if ids is not None else ""),
            split_rule=index.rule,
        )
        n_written = sum(len(r) for r in rows.values())
        size = n_written * (4 * (img_src.shape[1] + txt_src.shape[1]) + 8 +
                            (0 if label_matrix is None else label_matrix.shape[1]))
        with open_writer(out, attrs, overwrite, size) as f:
            for s in SPLITS:
                if label_matrix is not None:
                    create_split_dataset(f, s, "labels", (len(rows[s]), label_matrix.shape[1]))[...] = \
                        label_matrix[rows[s]]
                create_split_dataset(f, s, "ids", (len(rows[s]),))[...] = \
                    rows[s] if item_ids is None else item_ids[rows[s]]
            # Ctrl-C (or SIGTERM) stops the copy between two blocks: raised inside h5py, it could land in a weakref
            # callback, where Python prints it and goes on, and the file was written all the same
            with tqdm(total=2 * n, unit="row", desc=f"convert {os.path.basename(out)}", disable=not progress) as bar, \
                    stop_on_signals() as heard:
                _scatter(f, "image", img_src, rows, chunk_rows, bar, heard)
                _scatter(f, "text", txt_src, rows, chunk_rows, bar, heard)
    return ConvertReport(
        path=out,
        rows={s: len(rows[s]) for s in SPLITS},
        dropped={"all": int((~keep).sum())},
        seconds=time.perf_counter() - t0,
    )

