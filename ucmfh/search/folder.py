"""An index on disk (docs/search.md): a folder of raw column files and a manifest that alone says how many
rows are committed. :class:`IndexFolder` gives :class:`ucmfh.search.index.Index` its save, load and
append; the folder's format and columns are here.

    index.json              manifest: n_bits, counts, fields, meta (checkpoint, features), sources
    img.codes  txt.codes    uint64 [count, words], row-major, raw
    img.ids    txt.ids      int64 [count]
    *.embed  *.labels       float16 [count, d], uint8 [count, C] (when present)
    *.origin                int64 [count, 2]: (number in ``sources``, row of that collection) (built items)
    *.text.offsets/.bytes   strings as CSR: int64 [count + 1] offsets into UTF-8 bytes (likewise paths)

Every data file only grows: an append writes past the committed rows, then replaces the manifest
atomically, so a write killed midway leaves rows that no reader sees and the next append overwrites. A
new folder appears under its name only once complete. Loading maps the files (``mmap=True``).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ucmfh.data.format import DataError, MissingFile
from ucmfh.files import PathLike, atomic_path, locked, named_write_error, write_json_atomic

FORMAT = "ucmfh-index"
VERSION = 1
MANIFEST = "index.json"
MODALITIES = ("img", "txt")
NAMES = {"img": "image", "txt": "text"}  # a modality's name in words, and its features' dataset in a file
_SHORT = {full: short for short, full in NAMES.items()}
STRINGS = ("text", "paths")


class Column:
    """One column of one modality: a fixed-width array (in memory or a mapped file) or strings."""

    def __init__(self, dtype: Optional[np.dtype], width: Optional[int]) -> None:
        self.dtype, self.width = dtype, width  # dtype None: strings
        self.parts: List[Any] = []
        self.mapped: Any = None  # np.memmap / (offsets, bytes) of the committed rows of a folder

    def shape(self, n: int) -> Tuple[int, ...]:
        return (n,) if self.width is None else (n, self.width)


def modality_name(name: str) -> str:
    """A modality's short name ('img', 'txt') from either of its names ('image' is 'img')."""
    name = _SHORT.get(name, name)
    if name not in MODALITIES:
        raise ValueError(f"modality must be 'image' or 'text' ('img'/'txt'), got {name!r}")
    return name


EMBEDDING_DTYPE = np.float16  # the real-valued head outputs kept for re-ranking by cosine


def _check_layout(name: str, dtype: np.dtype, width: Any, words: int) -> None:
    """A fixed-width column's type and width as the manifest says them, checked against what ucmfh writes (a
    ValueError, said as a damaged manifest): ids of another type were read as 0, objects crashed the process."""
    layouts = {"codes": (np.dtype(np.uint64), words), "ids": (np.dtype(np.int64), None),
               "origin": (np.dtype(np.int64), 2), "labels": (np.dtype(np.uint8), "any"),
               "embed": (np.dtype(EMBEDDING_DTYPE), "any")}
    if name not in layouts:
        raise ValueError(f"a column {name!r}, which no index holds")
    wanted, span = layouts[name]
    if dtype != wanted or (span != "any" and width != span) or (span == "any" and not (
            isinstance(width, int) and width >= 1)):
        raise ValueError(f"its {name} column is {dtype.str}" + ("" if width is None else f" of width {width}")
                         + f", where an index's is {wanted.str}"
                         + ("" if span in ("any", None) else f" of width {span}"))


class IndexFolder:
    """Saving, loading and appending to an index folder (a base of :class:`ucmfh.search.index.Index`,
    whose columns and counts it writes and reads)."""

    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Write the index to a new folder, atomically (a temporary folder renamed when complete).
        ``overwrite`` replaces an index folder there, never another folder or a file (``FileExistsError``).

        The index is then bound to the folder: later :meth:`add` calls append to it.
        """
        path = os.path.abspath(os.fspath(path))
        if os.path.exists(path) and not overwrite:
            raise FileExistsError(f"{path}: exists; not replaced")
        if os.path.exists(path) and not _is_index_folder(path):  # a user's folder was deleted, a file renamed away
            raise FileExistsError(f"{path}: exists and is not an index folder; not replaced (overwrite replaces an "
                                  "index alone)")
        try:  # its manifest, written last, holds it: a NumPy number failed there, every column written
            json.dumps(self.meta)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: not saved: the index's meta holds what JSON cannot write ({err}; give plain "
                             "numbers: float(x), int(x))") from None
        tmp = atomic_path(path)
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        try:
            counts = {}
            for modality in MODALITIES:
                counts[modality] = self._count[modality]
                for name, col in self._columns[modality].items():
                    if col.dtype is None:
                        offsets, blob = self._strings(modality, name)
                        write_raw(os.path.join(tmp, f"{modality}.{name}.offsets"), offsets)
                        write_raw(os.path.join(tmp, f"{modality}.{name}.bytes"), blob)
                    else:
                        write_raw(os.path.join(tmp, f"{modality}.{name}"), self._column(modality, name))
            write_json_atomic(os.path.join(tmp, MANIFEST), self._manifest())
            if overwrite and os.path.exists(path):
                old = atomic_path(path + ".old")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old)
            else:
                try:  # refused where a folder was made there since the look above (another process's index)
                    os.rename(tmp, path)
                except OSError as err:
                    if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                        raise
                    raise FileExistsError(f"{path}: made by another process meanwhile; not replaced") from None
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
        loaded = type(self).load(path)
        self.__dict__.update(loaded.__dict__)
        return path

    def _manifest(self) -> Dict[str, Any]:
        modalities = {}
        for modality in MODALITIES:
            cols = self._columns[modality]
            modalities[modality] = {
                "count": self._count[modality],
                "columns": {name: (None if c.dtype is None else [np.dtype(c.dtype).str, c.width])
                            for name, c in cols.items()},
            }
            strings = {name: int(self._strings(modality, name)[0][-1]) for name, c in cols.items() if c.dtype is None}
            if strings:
                modalities[modality]["string_bytes"] = strings
        return {"format": FORMAT, "version": VERSION, "n_bits": self.n_bits, "words": self.words,
                "meta": self.meta, "sources": self.sources, "modalities": modalities}

    @classmethod
    def load(cls, path: PathLike, mmap: bool = True) -> "IndexFolder":
        """Open an index folder; with ``mmap`` its columns are memory-mapped (read on demand), else read in.

        Raises :class:`ucmfh.data.format.DataError` naming the folder, the file and the problem.
        """
        path = os.path.abspath(os.fspath(path))
        manifest = read_manifest(path)
        try:
            return cls._from_manifest(path, manifest, mmap)
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:  # a manifest edited or damaged
            what = f"no {err}" if isinstance(err, KeyError) else str(err)
            raise DataError(f"{os.path.join(path, MANIFEST)}: damaged ({what}); build the index again") from None

    @classmethod
    def _from_manifest(cls, path: str, manifest: Dict[str, Any], mmap: bool) -> "IndexFolder":
        index = cls(manifest["n_bits"], manifest.get("meta"))
        index.sources = list(manifest.get("sources") or [])
        index.path = path
        for modality in MODALITIES:
            entry = manifest["modalities"].get(modality) or {"count": 0, "columns": {}}
            n = int(entry["count"])
            if n < 0:
                raise DataError(f"{path}: {MANIFEST}: modalities.{modality}.count is {n}, not a count of items")
            index._count[modality] = n
            for name, spec in entry["columns"].items():
                if spec is None:
                    col = Column(None, None)
                    size = int(entry.get("string_bytes", {}).get(name, -1))
                    offsets = map_file(path, f"{modality}.{name}.offsets", np.int64, (n + 1,), mmap)
                    if offsets[0] != 0 or offsets[-1] != size:
                        raise DataError(f"{path}: {modality}.{name}.offsets: do not match the manifest "
                                        f"({offsets[-1]} bytes, manifest {size})")
                    col.mapped = (offsets, map_file(path, f"{modality}.{name}.bytes", np.uint8, (size,), mmap))
                else:
                    dtype, width = np.dtype(spec[0]), spec[1]
                    _check_layout(name, dtype, width, index.words)  # an edited one read ids of 0, or crashed
                    col = Column(dtype, width)
                    col.mapped = map_file(path, f"{modality}.{name}", dtype, col.shape(n), mmap)
                index._columns[modality][name] = col
            if n and set(index._columns[modality]) < {"codes", "ids"}:
                raise DataError(f"{path}: {MANIFEST}: modality {modality!r} has no codes or ids")
            if "codes" in index._columns[modality] and index._columns[modality]["codes"].width != index.words:
                raise DataError(f"{path}: {modality}.codes: {index._columns[modality]['codes'].width} words per "
                                f"code, expected {index.words} for {index.n_bits} bits")
        return index

    def _append_folder(self, rows: Dict[str, Dict[str, Any]], source: Optional[Dict[str, Any]]) -> None:
        """Write rows past the committed ones, then commit them with one atomic manifest replace."""
        with locked(os.path.join(self.path, MANIFEST)):
            self._refuse_changed()
            for modality, columns in rows.items():
                n = self._count[modality]
                for name, value in columns.items():
                    col = self._columns[modality][name]
                    if col.dtype is None:
                        offsets, _ = self._strings(modality, name)
                        start = int(offsets[-1])
                        encoded = [s.encode("utf-8") for s in value]
                        new = start + np.cumsum([len(b) for b in encoded], dtype=np.int64)
                        write_at(os.path.join(self.path, f"{modality}.{name}.offsets"), (n + 1) * 8, new)
                        write_at(os.path.join(self.path, f"{modality}.{name}.bytes"), start,
                                  np.frombuffer(b"".join(encoded), dtype=np.uint8))
                    else:
                        itemsize = np.dtype(col.dtype).itemsize * (col.width or 1)
                        write_at(os.path.join(self.path, f"{modality}.{name}"), n * itemsize,
                                  np.ascontiguousarray(value, dtype=col.dtype))
                self._count[modality] = n + len(columns["ids"])
            if source is not None:
                self._record_source(source)
            write_json_atomic(os.path.join(self.path, MANIFEST), self._manifest_from_disk())
        fresh = type(self).load(self.path, mmap=True)
        self.__dict__.update(fresh.__dict__)

    def roll_back(self, counts: Mapping[str, int], sources: List[Dict[str, Any]]) -> None:
        """Commit ``counts`` rows a modality and ``sources`` again, as they were before a build that was refused
        part-way (the rows written past them are left to be written over, as past any commit)."""
        manifest = os.path.join(self.path, MANIFEST)
        with locked(manifest):
            self._refuse_changed()
            self._count = {m: min(int(counts.get(m, 0)), self._count[m]) for m in MODALITIES}
            for modality in MODALITIES:
                if not self._count[modality]:  # no items: the columns are the next add's to fix
                    self._columns[modality] = {}
            self.sources = [dict(s) for s in sources]
            write_json_atomic(manifest, self._manifest_from_disk())
        fresh = type(self).load(self.path, mmap=True)
        self.__dict__.update(fresh.__dict__)

    def _refuse_changed(self) -> None:
        """Refuse (``DataError``) to write where the manifest on disk counts other rows than this index opened with:
        another writer committed since. Called under the manifest's lock."""
        on_disk = read_manifest(self.path)
        for modality in MODALITIES:
            if on_disk["modalities"].get(modality, {}).get("count", 0) != self._count[modality]:
                raise DataError(f"{self.path}: changed by another writer since it was opened (another build added "
                                "to it meanwhile); open it again, or run the same build again")

    def _manifest_from_disk(self) -> Dict[str, Any]:
        """The manifest of the rows now written: counts from ``_count``, string sizes from their offsets."""
        modalities = {}
        for modality in MODALITIES:
            n = self._count[modality]
            cols = self._columns[modality]
            entry: Dict[str, Any] = {"count": n, "columns": {
                name: (None if c.dtype is None else [np.dtype(c.dtype).str, c.width]) for name, c in cols.items()}}
            sizes = {}
            for name, c in cols.items():
                if c.dtype is None:
                    offsets = np.fromfile(os.path.join(self.path, f"{modality}.{name}.offsets"), dtype=np.int64,
                                          count=n + 1)
                    sizes[name] = int(offsets[-1])
            if sizes:
                entry["string_bytes"] = sizes
            modalities[modality] = entry
        return {"format": FORMAT, "version": VERSION, "n_bits": self.n_bits, "words": self.words,
                "meta": self.meta, "sources": self.sources, "modalities": modalities}


def write_raw(path: str, array: np.ndarray) -> None:
    write_at(path, 0, array)


def write_at(path: str, offset: int, array: np.ndarray) -> None:
    """Write ``array`` at byte ``offset``, dropping whatever lay beyond it (rows of a killed write). A full disk is
    an ``OSError`` naming ``path`` (numpy's ``tofile`` said '45856 requested and 4096 written')."""
    try:
        with open(path, "r+b" if os.path.exists(path) else "w+b") as f:
            f.truncate(offset)
            f.seek(offset)
            f.write(np.ascontiguousarray(array).data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        raise named_write_error(err, path) from None


def _is_index_folder(path: str) -> bool:
    """A folder whose manifest says it is an index, of any version (an index of an older ucmfh may be replaced)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    return os.path.isdir(path) and isinstance(manifest, dict) and manifest.get("format") == FORMAT


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of an index folder, checked."""
    file = os.path.join(path, MANIFEST)
    if os.path.isfile(path):  # a dataset or collection file given where its index belongs
        raise DataError(f"{path}: a file, not an index folder ('ucmfh index' makes one)")
    if not os.path.isdir(path):
        raise MissingFile(f"{path}: no such index folder")
    if not os.path.exists(file):
        raise DataError(f"{path}: not an index (no {MANIFEST})")
    try:
        with open(file, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise DataError(f"{file}: unreadable ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{file}: not a ucmfh index manifest")
    if manifest.get("version") != VERSION:
        raise DataError(f"{file}: index version {manifest.get('version')}, this ucmfh reads {VERSION}")
    return manifest


def map_file(folder: str, name: str, dtype: np.dtype, shape: Tuple[int, ...], mmap: bool) -> np.ndarray:
    path = os.path.join(folder, name)
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    size = os.path.getsize(path) if os.path.exists(path) else -1
    if size < need:
        raise DataError(f"{folder}: {name}: {'missing' if size < 0 else f'{size} bytes'}, "
                        f"the manifest's rows need {need}")
    if need == 0:
        return np.zeros(shape, dtype=dtype)
    if mmap:
        return np.memmap(path, dtype=dtype, mode="r", shape=shape)
    return np.fromfile(path, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
