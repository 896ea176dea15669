"""Users' input files, opened so that every failure is a :class:`DataError` naming the file and the problem.

Text is read as UTF-8 (a leading byte-order mark is dropped). An ``.npy``
array's header is read first and its size checked against the file, so a
truncated or padded file is named as such before it is memory-mapped. An
``.npz`` archive is checked when opened and each member when read.
"""
from __future__ import annotations

import os
import zipfile
import zlib
from typing import IO, List, Tuple

import numpy as np

from ucmfh.data.format import DataError, MissingFile
from ucmfh.files import PathLike, check_a_file

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
# what reading a damaged zip member can raise
_ZIP_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


def read_text(path: PathLike) -> str:
    """The whole text of a UTF-8 file, with ``\\r\\n`` and ``\\r`` line ends read as ``\\n``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); "
                        "save the file as UTF-8") from None
    if "\x00" in text:  # valid UTF-8, which no text of an HDF5 file holds: an extraction failed at its very end
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise DataError(f"{path}: line {line}: a NUL character, which no text of the features file can hold (UTF-16 "
                        "text? save the file as UTF-8)")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_lines(path: PathLike) -> List[str]:
    """The non-blank lines of a UTF-8 file, stripped."""
    return [line.strip() for line in read_text(path).split("\n") if line.strip()]


def _start(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(len(NPY_MAGIC))
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None


def _npy_header(fp: IO[bytes], where: str) -> Tuple[Tuple[int, ...], np.dtype]:
    """Shape and dtype from the header of an ``.npy`` stream, which is left at the data."""
    try:
        version = np.lib.format.read_magic(fp)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fp)
    except (ValueError, EOFError) as err:
        raise DataError(f"{where}: truncated or damaged .npy header ({err})") from None
    if dtype.hasobject:
        raise DataError(f"{where}: holds pickled Python objects, not a numeric array")
    return shape, dtype


def load_npy(path: PathLike) -> np.ndarray:
    """An ``.npy`` array, memory-mapped; the file's size must be exactly what its header describes."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    check_a_file(path, "an .npy array", DataError)  # a pipe was read as an empty file
    size = os.path.getsize(path)
    if size == 0:
        raise DataError(f"{path}: empty file (0 bytes)")
    start = _start(path)
    if start.startswith(ZIP_MAGIC):
        raise DataError(f"{path}: an .npz archive, not an .npy array")
    if not start.startswith(NPY_MAGIC):
        raise DataError(f"{path}: not an .npy array (no NumPy header)")
    with open(path, "rb") as f:
        shape, dtype = _npy_header(f, path)
        offset = f.tell()
    needed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    held = size - offset
    if held != needed:
        what = "truncated" if held < needed else "longer than its header says"
        raise DataError(f"{path}: {what}: the header describes shape {tuple(shape)} {dtype} "
                        f"({needed} bytes of data), the file holds {held}")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise DataError(f"{path}: not a readable .npy array ({err})") from None


def open_npz(path: PathLike) -> "np.lib.npyio.NpzFile":
    """An open ``.npz`` archive (close it, or use it in ``with``); members are read by :func:`npz_member`."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"{path}: no such file")
    check_a_file(path, "an .npz archive", DataError)
    if os.path.getsize(path) == 0:
        raise DataError(f"{path}: empty file (0 bytes)")
    start = _start(path)
    if start.startswith(NPY_MAGIC):
        raise DataError(f"{path}: an .npy array, not an .npz archive")
    if not start.startswith(b"PK"):  # numpy takes the rest for a pickle, and says how to load one unsafely
        raise DataError(f"{path}: not an .npz archive (a zip file of .npy arrays, as numpy.savez writes)")
    try:
        return np.load(path, allow_pickle=False)
    except _ZIP_ERRORS as err:
        # a cut zip file loses its directory at the end: "not a zip file"
        raise DataError(f"{path}: not a readable .npz archive, truncated or damaged ({err})") from None


def npz_member(npz: "np.lib.npyio.NpzFile", path: PathLike, name: str) -> np.ndarray:
    """The array ``name`` of an open ``.npz`` archive, read whole."""
    where = f"{os.fspath(path)}:{name}"
    member = name + ".npy" if name + ".npy" in npz.zip.namelist() else name
    try:
        with npz.zip.open(member) as fp:
            _npy_header(fp, where)
        return npz[name]
    except DataError:
        raise
    except _ZIP_ERRORS as err:
        raise DataError(f"{where}: unreadable archive member, truncated or damaged ({err})") from None
