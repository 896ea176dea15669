"""One matrix of a released feature file — MATLAB ``.mat`` (v5 or v7.3), ``.npy`` or ``.npz`` — found by
its variable name (or the usual names of its role) and read in blocks of rows: a v7.3 file lazily, a
``.npy`` memory-mapped."""
from __future__ import annotations

import os
import re
import struct
import zlib
from contextlib import ExitStack
from typing import Optional, Sequence, Tuple

import h5py
import numpy as np

from ucmfh.data.format import DataError, MissingFile
from ucmfh.data.input_files import load_npy, npz_member, open_npz
from ucmfh.files import PathLike

# variable names tried, in order, when a file holds several arrays and no key is given
ROLE_KEYS = {
    "image": ("image", "img", "IAll", "I", "X"),
    "text": ("text", "txt", "YAll", "T", "Y"),
    "labels": ("labels", "label", "LAll", "L"),
    "ids": ("ids", "id", "image_ids"),
}
_MAT_META = ("#refs#", "#subsystem#")


class ArraySource:
    """A 2-D matrix in some file, read in blocks of rows.

    ``read(start, stop)`` returns rows ``start:stop`` as a dense numpy array.
    """

    def __init__(self, name: str, shape: Tuple[int, ...], dtype: np.dtype, reader):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._reader = reader

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, start: int, stop: int) -> np.ndarray:
        try:
            return np.asarray(self._reader(start, stop))
        except (OSError, ValueError, EOFError, zlib.error) as err:  # a damaged block of a lazily read file
            raise DataError(f"{self.name}: rows {start}..{stop - 1}: unreadable ({err})") from None

    def read_all(self) -> np.ndarray:
        return self.read(0, self.shape[0])


def _in_memory(name: str, array) -> ArraySource:
    if hasattr(array, "tocsr"):  # scipy sparse (tag bag-of-words is often sparse)
        array = array.tocsr()
        return ArraySource(name, array.shape, array.dtype, lambda a, b: array[a:b].toarray())
    return ArraySource(name, array.shape, array.dtype, lambda a, b: array[a:b])


def _pick_key(path: str, names: Sequence[str], key: Optional[str], role: str) -> str:
    if key is not None:
        if key not in names:
            raise DataError(f"{path}: no variable {key!r} (the file has: {sorted(names)})")
        return key
    for candidate in ROLE_KEYS.get(role, ()):
        if candidate in names:
            return candidate
    if len(names) == 1:
        return names[0]
    # one split's rows a matrix (I_tr, I_te, I_db): a key picks one split, and a new split would be drawn from it
    parts: dict = {}
    for n in names:
        found = re.fullmatch(r"(.+)_(tr|te|db|train|test|query|retrieval|database)", n, re.IGNORECASE)
        if found:
            parts.setdefault(found.group(1), []).append(n)
    split = [n for stem in parts.values() if len(stem) > 1 for n in stem]  # a stem in two splits at least
    if split:
        raise DataError(f"{path}: {len(names)} variables {sorted(names)}: a split's rows in each ({', '.join(split)})"
                        "; whole-set matrices are read: stack each modality's splits into one (docs/data.md)",
                        remedy=("split_index", "SPLIT.npz", "to keep the released split"))
    raise DataError(f"{path}: {len(names)} variables {sorted(names)}, none with a usual {role or 'matrix'} name",
                    remedy=(f"{role}_key", "NAME", "to choose one") if role else None)


def open_array(path: PathLike, key: Optional[str] = None, role: str = "", stack: Optional[ExitStack] = None) -> ArraySource:
    """Open one matrix of a ``.mat`` (v5 or v7.3), ``.npy`` or ``.npz`` file.

    ``key`` names the variable; without it the role's usual names
    (:data:`ROLE_KEYS`) are tried, then a file's only variable. A v7.3 file
    stays open (registered on ``stack``) and is read lazily; ``.npy`` is
    memory-mapped.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        if key is not None:  # a key of nothing: a user who meant another file, or an .npz
            raise DataError(f"{path}: an .npy file holds one array, not variables: the key {key!r} names nothing "
                            "here (keys name the variables of .npz and .mat files)")
        return _in_memory(path, load_npy(path))
    if ext == ".npz":
        with open_npz(path) as npz:
            name = _pick_key(path, list(npz.files), key, role)
            return _in_memory(f"{path}:{name}", npz_member(npz, path, name))
    if ext == ".mat":
        if h5py.is_hdf5(path):
            return _open_mat73(path, key, role, stack)
        return _open_mat5(path, key, role)
    raise DataError(f"{path}: unknown array file type {ext!r} (expected .mat, .npy or .npz)")


def _open_mat5(path: str, key: Optional[str], role: str) -> ArraySource:
    import scipy.io
    from scipy.io.matlab import MatReadError

    # what scipy's reader raises on a cut or damaged file, depending on where the damage is
    errors = (MatReadError, ValueError, OSError, TypeError, IndexError, KeyError, EOFError, struct.error, zlib.error)
    try:
        names = [n for n, _, _ in scipy.io.whosmat(path)]
    except NotImplementedError:  # a v7.3 header, but h5py found no readable HDF5 file behind it
        raise DataError(f"{path}: a MATLAB v7.3 file that is not readable as HDF5 (truncated or damaged)") from None
    except errors as err:
        raise DataError(f"{path}: not a readable .mat file, truncated or damaged ({err})") from None
    name = _pick_key(path, names, key, role)
    try:
        array = scipy.io.loadmat(path, variable_names=[name])[name]
    except errors as err:
        raise DataError(f"{path}:{name}: not readable, truncated or damaged ({err})") from None
    return _in_memory(f"{path}:{name}", array)


def _open_mat73(path: str, key: Optional[str], role: str, stack: Optional[ExitStack]) -> ArraySource:
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path}: a MATLAB v7.3 (HDF5) file that cannot be read, truncated or damaged ({err})") from None
    if stack is not None:
        stack.callback(f.close)
    names = [n for n in f.keys() if n not in _MAT_META]
    name = _pick_key(path, names, key, role)
    dset = f[name]
    where = f"{path}:{name}"
    if not isinstance(dset, h5py.Dataset):
        raise DataError(f"{where}: a MATLAB struct, cell or sparse matrix; store it as a full numeric matrix")
    if dset.attrs.get("MATLAB_class") in (b"char", "char"):  # stored as uint16 codes: numbers, but text
        raise DataError(f"{where}: a MATLAB char array (text), not a numeric matrix")
    if dset.ndim != 2:
        # MATLAB [N, d] is stored as [d, N]; more axes mean raw pixels, not features
        raise DataError(
            f"{where}: expected a 2-D feature matrix, got MATLAB shape {dset.shape[::-1]}; "
            "raw images must go through `ucmfh extract` first"
        )
    return ArraySource(where, dset.shape[::-1], dset.dtype, lambda a, b: dset[:, a:b].T)
