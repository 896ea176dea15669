"""Binary codes as torch tensors of packed bits, and the HDF5 file that holds a model's codes for evaluation.

The bit convention is :mod:`ucmfh.bits`'s (``numpy.packbits`` order, sign >= 0 a set bit).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Union

import numpy as np
import torch

from ucmfh import bits
from ucmfh.config import PROTOCOLS
from ucmfh.data.format import CODES_FORMAT, DataError, MissingFile, id_problem, not_hdf5, shared_ids, unlabelled_rows
from ucmfh.files import atomic_file, check_a_file, check_space, read_attrs, write_attrs

ArrayLike = Union[np.ndarray, torch.Tensor]

def pack_codes(codes: ArrayLike) -> np.ndarray:
    """Pack ±1 codes into bits. Shape: [N, n_bits] -> [N, ceil(n_bits / 8)] uint8.

    Values >= 0 become set bits, so real-valued head outputs pack as their sign (:func:`ucmfh.bits.pack`).
    """
    return bits.pack(codes)


def unpack_codes(packed: ArrayLike, n_bits: int) -> torch.Tensor:
    """Unpack bits into ±1 float32 codes, on the device of ``packed`` when it is a tensor.

    Shape: [N, ceil(n_bits / 8)] uint8 -> [N, n_bits] float32.
    """
    if not isinstance(packed, torch.Tensor):
        packed = torch.from_numpy(np.ascontiguousarray(packed))
    if packed.dtype != torch.uint8 or packed.ndim != 2:
        raise ValueError(f"packed codes must be 2-D uint8, got {packed.dtype} {tuple(packed.shape)}")
    if not 0 < n_bits <= 8 * packed.shape[1]:
        raise ValueError(f"n_bits={n_bits} does not fit {packed.shape[1]} bytes per code")
    weights = torch.from_numpy(bits.BIT_WEIGHTS).to(packed.device)
    is_set = (packed[:, :, None] & weights) != 0  # [N, bytes, 8]
    is_set = is_set.reshape(packed.shape[0], 8 * packed.shape[1])[:, :n_bits]  # -1 cannot be solved for 0 rows
    return torch.where(is_set, 1.0, -1.0)


# ------------------------------------------------------------------ codes file

VERSION = 1
GROUPS = ("query", "retrieval")
MODALITIES = ("img", "txt")


@dataclass
class Codes:
    """A codes file in memory.

    Shape:
        packed[(group, modality)]: [N_group, ceil(n_bits / 8)] uint8 for group in
        query/retrieval and modality in img/txt; labels[group]: [N_group, C] uint8, or None in a caption
        set (relevance by id, docs/reference.md §7); ids[group]: [N_group] int64, or None.
    """

    n_bits: int
    packed: Dict[tuple, torch.Tensor]
    labels: Dict[str, Optional[torch.Tensor]]
    ids: Dict[str, Optional[torch.Tensor]]
    attrs: Dict[str, object] = field(default_factory=dict)
    path: Optional[str] = None

    @property
    def caption_set(self) -> bool:
        """No labels: relevance is "same id" (the codes of a caption set)."""
        return self.labels["query"] is None

    def codes(self, group: str, modality: str) -> torch.Tensor:
        """±1 float32 codes of one group and modality. Shape: [N_group, n_bits]."""
        return unpack_codes(self.packed[(group, modality)], self.n_bits)


def save_codes(
    path: Union[str, "os.PathLike[str]"],
    *,
    query_img: ArrayLike,
    query_txt: ArrayLike,
    retrieval_img: ArrayLike,
    retrieval_txt: ArrayLike,
    query_labels: Optional[ArrayLike],
    retrieval_labels: Optional[ArrayLike],
    query_ids: Optional[ArrayLike] = None,
    retrieval_ids: Optional[ArrayLike] = None,
    attrs: Optional[Dict[str, object]] = None,
    overwrite: bool = True,
) -> str:
    """Write codes as packed bits to HDF5, atomically (temporary file, then ``os.replace``; without
    ``overwrite``, only where no file is there by then: ``FileExistsError``).

    Codes are ±1 (or real-valued: their sign is stored, sign(0) = +1), shape
    [N, n_bits]; labels multi-hot [N, C], or None for a caption set, whose ids are then required;
    ids int64 [N]. ``attrs`` (protocol, dataset, model, …) go to the root attributes beside ``n_bits``.
    Layout: ``/{query,retrieval}/{img,txt[,labels][,ids]}``. Returns the path.
    """
    path = os.fspath(path)
    if not overwrite and os.path.exists(path):  # said after the work as 'written by another process meanwhile'
        raise FileExistsError(f"{path}: exists; not replaced")
    given = {
        ("query", "img"): query_img, ("query", "txt"): query_txt,
        ("retrieval", "img"): retrieval_img, ("retrieval", "txt"): retrieval_txt,
    }
    arrays = {key: bits.to_numpy(value) for key, value in given.items()}
    n_bits = arrays[("query", "img")].shape[1] if arrays[("query", "img")].ndim == 2 else -1
    for (group, modality), codes in arrays.items():
        if codes.ndim != 2 or codes.shape[1] != n_bits:
            raise ValueError(f"{path}: {group}_{modality}: codes must be [N, {n_bits}], got shape {codes.shape}")
        if codes.dtype == np.uint8:
            raise ValueError(f"{path}: {group}_{modality}: pass ±1 codes, not uint8 (packed bits are ambiguous)")
        # 0/1 codes were stored as all ones, a file that load_codes refuses was written (0 bits)
        bits.check_signed(codes, f"{path}: {group}_{modality}", packed=False)
        if codes.dtype.kind == "f" and not np.isfinite(codes).all():  # NaN was stored as a -1 bit, scored
            row = int(np.argmax(~np.isfinite(codes).all(axis=1)))
            raise ValueError(f"{path}: {group}_{modality}: non-finite values (first: row {row}), which have no sign")
        bits.check_n_bits(n_bits, f"{path}: {group}_{modality}")
    if (query_labels is None) != (retrieval_labels is None):
        raise ValueError(f"{path}: labels: give both query_labels and retrieval_labels, or neither (a caption set)")
    if query_labels is None and (query_ids is None or retrieval_ids is None):
        raise ValueError(f"{path}: a caption set (no labels) needs query_ids and retrieval_ids: relevance is by id")
    labels = {"query": query_labels, "retrieval": retrieval_labels}
    labels = {g: None if value is None else bits.to_numpy(value) for g, value in labels.items()}  # None: a caption set
    ids = {"query": query_ids, "retrieval": retrieval_ids}
    for group in GROUPS:
        n = arrays[(group, "img")].shape[0]
        lab = labels[group]
        if arrays[(group, "txt")].shape[0] != n or lab is not None and (lab.ndim != 2 or lab.shape[0] != n):
            raise ValueError(
                f"{path}: {group}: img, txt and labels must have the same rows, got "
                f"{arrays[(group, 'img')].shape[0]}, {arrays[(group, 'txt')].shape[0]}, "
                f"{'none' if lab is None else lab.shape}"
            )
        if lab is not None:  # what load_codes refuses, refused before it is written
            problem = "values other than 0 and 1" if lab.size and not np.isin(lab, (0, 1)).all() else \
                unlabelled_rows(lab)
            if problem:
                raise ValueError(f"{path}: {group}_labels: {problem}")
        if n == 0:  # as load_codes refuses it: a database of none, every figure empty
            raise ValueError(f"{path}: {group}: no rows")
        if ids[group] is not None:
            given = bits.to_numpy(ids[group])  # its own values: a uint64 id beyond int64 is said, not wrapped
            if given.dtype.kind not in "iu":  # 0.5 was written as 0, merging items, as load_codes refuses it
                raise ValueError(f"{path}: {group}_ids: ids must be integers, got {given.dtype}")
            ids[group] = given.astype(np.int64)
            if ids[group].shape != (n,):
                raise ValueError(f"{path}: {group}_ids: must have shape ({n},), got {ids[group].shape}")
            problem = id_problem(given)
            if problem:
                raise ValueError(f"{path}: {group}_ids: {problem}")
    if labels["query"] is not None and labels["query"].shape[1] != labels["retrieval"].shape[1]:
        raise ValueError(f"{path}: labels: query and retrieval differ in classes")
    if (ids["query"] is None) != (ids["retrieval"] is None):
        raise ValueError(f"{path}: ids: give both query_ids and retrieval_ids, or neither")
    problem = shared_ids(ids["query"], ids["retrieval"], "retrieval") if labels["query"] is None else None
    if problem:  # as load_codes refuses it
        raise ValueError(f"{path}: query_ids: {problem}")

    protocol = (attrs or {}).get("protocol")
    if protocol is not None and protocol not in PROTOCOLS:  # written into every row scored of it; load_codes refuses
        raise ValueError(f"{path}: attrs: 'protocol' is {protocol!r}, expected one of {', '.join(PROTOCOLS)}")

    import h5py

    # HDF5 finds a full disk as it closes the file, and then crashed the process (a segmentation fault)
    size = sum(len(codes) * bits.n_bytes(n_bits) for codes in arrays.values())
    size += sum(value.size for value in labels.values() if value is not None)  # uint8
    size += sum(value.size * 8 for value in ids.values() if value is not None)  # int64
    check_space(path, size)
    with atomic_file(path, replace=overwrite) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["format"] = CODES_FORMAT
        f.attrs["version"] = VERSION
        f.attrs["n_bits"] = n_bits
        try:
            write_attrs(f, attrs, reserved=("format", "version", "n_bits"))
        except ValueError as err:
            raise ValueError(f"{path}: attrs: {err}") from None
        for group in GROUPS:
            g = f.create_group(group)
            for modality in MODALITIES:
                g.create_dataset(modality, data=pack_codes(arrays[(group, modality)]))
            if labels[group] is not None:
                g.create_dataset("labels", data=(labels[group] != 0).astype(np.uint8))
            if ids[group] is not None:
                g.create_dataset("ids", data=ids[group])
    return path


def load_codes(path: Union[str, "os.PathLike[str]"]) -> Codes:
    """Read and validate a codes file written by :func:`save_codes`.

    Raises :class:`ucmfh.data.format.DataError` (a ValueError) naming the file, the
    dataset and the problem.
    """
    import h5py

    path = os.fspath(path)

    def fail(where: str, problem: str) -> DataError:
        return DataError(f"{path}: {where}: {problem}")

    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such codes file")
    check_a_file(path, "a codes file", DataError)
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(not_hdf5(path, err, "codes file: not HDF5")) from None
    with f:
        if f.attrs.get("format") != CODES_FORMAT:
            if all(split in f for split in ("train", "query", "retrieval")):  # its features: -d takes it
                raise DataError(f"{path}: a dataset file, not a codes file ('ucmfh encode' writes those); score a "
                                "checkpoint on it with 'ucmfh evaluate -c CHECKPOINT -d FILE'")
            raise fail("/", f"attribute 'format' is {f.attrs.get('format')!r}, expected {CODES_FORMAT!r}")
        version = f.attrs.get("version", VERSION)
        if not isinstance(version, (int, np.integer)) or not 1 <= version <= VERSION:
            shown = version.item() if isinstance(version, np.generic) else version  # '1' shown as 1 was no cause
            raise fail("/", f"attribute 'version' is {shown!r}: this ucmfh reads codes files of version 1 to "
                            f"{VERSION} (one of a later ucmfh: upgrade it)")
        if "n_bits" not in f.attrs:
            raise fail("/", "missing attribute 'n_bits'")
        n_bits = f.attrs["n_bits"]
        if isinstance(n_bits, bool) or not isinstance(n_bits, (int, np.integer)):  # 9.5 was read as 9
            shown = n_bits.item() if isinstance(n_bits, np.generic) else n_bits  # 9.5, not np.float64(9.5)
            raise fail("/", f"attribute 'n_bits' is {shown!r}, not a whole number")
        n_bits = int(n_bits)
        if not 1 <= n_bits <= bits.MAX_BITS:
            raise fail("/", f"n_bits must be in 1 .. {bits.MAX_BITS}, got {n_bits}")
        n_bytes = (n_bits + 7) // 8
        packed, labels, ids = {}, {}, {}
        for group in GROUPS:
            if group not in f:
                raise fail(f"/{group}", "missing group")
            if not isinstance(f[group], h5py.Group):
                raise fail(f"/{group}", "expected a group, found a dataset")
            for name in MODALITIES:
                if name not in f[group]:
                    raise fail(f"/{group}/{name}", "missing dataset")
            for name in (*MODALITIES, "labels", "ids"):  # a group in its place ended in an AttributeError
                if name in f[group] and not isinstance(f[group][name], h5py.Dataset):
                    raise fail(f"/{group}/{name}", "expected a dataset, found a group")
            if "labels" not in f[group] and "ids" not in f[group]:
                raise fail(f"/{group}/labels", "missing dataset (and no ids: a caption set's relevance)")
            # the group's items: as many as its ids or labels have rows (whichever codes differ are to blame)
            counted = next((name for name in ("ids", "labels") if name in f[group]), "img")
            if counted != "img" and not f[group][counted].ndim:  # said as the img's rows against -1
                raise fail(f"/{group}/{counted}", "expected one row an item, got a scalar")
            rows = f[group][counted].shape[0] if f[group][counted].ndim else -1
            if rows == 0:  # nothing to score (a database of none: every figure would be empty)
                raise fail(f"/{group}", "no rows")
            for modality in MODALITIES:
                d = f[group][modality]
                where = f"/{group}/{modality}"
                if d.dtype != np.uint8 or d.ndim != 2:
                    raise fail(where, f"expected 2-D uint8 packed codes, got {d.dtype} {d.shape}")
                if d.shape[0] != rows:  # the codes of one item each
                    raise fail(where, f"{d.shape[0]} rows, /{group}/{counted} has {rows}")
                if d.shape != (rows, n_bytes):
                    raise fail(where, f"shape {d.shape}, expected ({rows}, {n_bytes}) for {n_bits} bits")
                data = d[()]
                if n_bits % 8 and (data[:, -1] & ((1 << (8 - n_bits % 8)) - 1)).any():
                    raise fail(where, f"padding bits beyond bit {n_bits} are set")
                packed[(group, modality)] = torch.from_numpy(data)
            labels[group] = _labels(f[group], rows, fail) if "labels" in f[group] else None
            if "ids" in f[group]:
                d = f[group]["ids"]
                if d.shape != (rows,) or not np.issubdtype(d.dtype, np.integer):
                    raise fail(f"/{group}/ids", f"expected ({rows},) integers, got {d.dtype} {d.shape}")
                problem = id_problem(d[()])
                if problem:
                    raise fail(f"/{group}/ids", problem)
                ids[group] = torch.from_numpy(d[()].astype(np.int64))
            else:
                ids[group] = None
        if (labels["query"] is None) != (labels["retrieval"] is None):
            raise fail("/query/labels" if labels["query"] is None else "/retrieval/labels",
                       "labels present in only one group")
        if labels["query"] is not None and labels["query"].shape[1] != labels["retrieval"].shape[1]:
            raise fail("/retrieval/labels", f"{labels['retrieval'].shape[1]} classes, query has {labels['query'].shape[1]}")
        if (ids["query"] is None) != (ids["retrieval"] is None):
            raise fail("/query/ids" if ids["query"] is None else "/retrieval/ids", "ids present in only one group")
        if labels["query"] is None:  # a caption set's relevance is the id: a query item found as a database one
            problem = shared_ids(ids["query"].numpy(), ids["retrieval"].numpy(), "retrieval")
            if problem:
                raise fail("/query/ids", problem)
        attrs = read_attrs(f, skip=("format", "version", "n_bits"))
        if "protocol" in attrs and attrs["protocol"] not in PROTOCOLS:  # written into every row scored of it
            raise fail("/", f"attribute 'protocol' is {attrs['protocol']!r}, expected one of {', '.join(PROTOCOLS)}")
    return Codes(n_bits=n_bits, packed=packed, labels=labels, ids=ids, attrs=attrs, path=path)


def _labels(group, rows: int, fail) -> torch.Tensor:
    """A group's multi-hot labels, checked. Shape: -> [rows, C] uint8."""
    d = group["labels"]
    if d.ndim != 2 or d.shape[0] != rows:
        raise fail(f"{group.name}/labels", f"shape {d.shape}, expected ({rows}, C)")
    lab = d[()]
    if lab.size and not np.isin(lab, (0, 1)).all():
        raise fail(f"{group.name}/labels", "values other than 0 and 1")
    problem = unlabelled_rows(lab)
    if problem:  # as a dataset file's (ucmfh.data.h5): its MAP would be 0 for them, said of the method
        raise fail(f"{group.name}/labels", problem)
    return torch.from_numpy(lab.astype(np.uint8))
