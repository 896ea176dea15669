"""A searchable index of binary codes: exact Hamming top-K over packed bits, in memory or in a folder.

An index holds, per modality (``img``, ``txt``), the items' codes as packed
uint64 words and their ids, and optionally what shows or re-ranks a result:
labels (multi-hot), float16 real-valued embeddings (the hash heads' pre-sign
outputs, for cosine re-ranking), strings (``text`` for captions, ``paths``
for image files) and ``origin``: where a built item was read (for re-ranking by
the collection's token features). Verbs as in FAISS: :meth:`Index.add`, :meth:`Index.search`,
:meth:`Index.save`, :meth:`Index.load`; :func:`ucmfh.search.build.build_index` encodes a
collection file with a checkpoint into an index folder.

On disk an index is a folder (docs/search.md)::

    index.json              manifest: n_bits, counts, fields, meta (checkpoint, features), sources
    img.codes  txt.codes    uint64 [count, words], row-major, raw
    img.ids    txt.ids      int64 [count]
    *.embed  *.labels       float16 [count, d], uint8 [count, C] (when present)
    *.origin                int64 [count, 2]: (number in ``sources``, row of that collection) (built items)
    *.text.offsets/.bytes   strings as CSR: int64 [count + 1] offsets into UTF-8 bytes (likewise paths)

Every data file only grows, and only the manifest says how many rows are
committed: an append writes past the committed rows, then replaces the
manifest atomically. A write killed midway leaves rows that no reader sees
and the next append overwrites. A new folder appears under its name only once
complete. Loading maps the files (``mmap=True``): an index larger than RAM is
searched from the page cache.

Ranking: Hamming distance ascending, ties by position (the order items were
added) ascending, as everywhere in ucmfh (docs/reference.md §6).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ucmfh.bits import as_words, n_words, packed_bytes, to_numpy
from ucmfh.data.format import DataError
from ucmfh.files import PathLike, atomic_path, locked, write_json_atomic
from ucmfh.search.kernels import cpu_kernels, over_query_ranges

FORMAT = "ucmfh-index"
VERSION = 1
MANIFEST = "index.json"
MODALITIES = ("img", "txt")
STRINGS = ("text", "paths")
ArrayLike = Any  # numpy arrays or torch tensors (torch is not imported to search on the CPU)
EMBEDDING_DTYPE = np.float16  # the real-valued head outputs kept for re-ranking by cosine
# fixed-width columns besides codes and ids: name -> dtype
_EXTRA = {"embed": EMBEDDING_DTYPE, "labels": np.uint8, "origin": np.int64}


class UnfinishedIndex(ValueError):
    """An index whose build stopped before every row of a collection was added (an interrupted or killed
    ``ucmfh index``): a search of it would miss those rows without a word. The same build continues it."""


class _Column:
    """One column of one modality: a fixed-width array (in memory or a mapped file) or strings."""

    def __init__(self, dtype: Optional[np.dtype], width: Optional[int]) -> None:
        self.dtype, self.width = dtype, width  # dtype None: strings
        self.parts: List[Any] = []
        self.mapped: Any = None  # np.memmap / (offsets, bytes) of the committed rows of a folder

    def shape(self, n: int) -> Tuple[int, ...]:
        return (n,) if self.width is None else (n, self.width)


def _check_rows(name: str, value: Any, n: int, width: Optional[int] = None) -> None:
    shape = getattr(value, "shape", (len(value),))
    if shape[0] != n or (width is not None and (len(shape) != 2 or shape[1] != width)):
        want = f"({n},)" if width is None else f"({n}, {width})"
        raise ValueError(f"{name}: expected shape {want}, got {tuple(shape)}")


class Index:
    """Binary codes of items of two modalities, searched by exact Hamming top-K.

    Example:
        >>> index = Index(n_bits=64)
        >>> index.add("txt", txt_codes, ids=ids, text=captions)   # ±1 [N, 64], numpy or torch
        >>> distances, positions = index.search(img_codes, k=10, modality="txt")
        >>> index.ids("txt")[positions]                              # [Q, 10] int64
        >>> index.save("my.index"); index = Index.load("my.index")  # memory-mapped
    """

    def __init__(self, n_bits: int, meta: Optional[Mapping[str, Any]] = None) -> None:
        if not 1 <= int(n_bits) <= 65535:
            raise ValueError(f"n_bits must be in 1 .. 65535, got {n_bits}")
        self.n_bits = int(n_bits)
        self.words = n_words(self.n_bits)
        self.meta: Dict[str, Any] = dict(meta or {})
        self.sources: List[Dict[str, Any]] = []  # collection files built in (ucmfh.search.build)
        self.path: Optional[str] = None  # the folder, once saved or loaded
        self._count = {m: 0 for m in MODALITIES}
        self._columns: Dict[str, Dict[str, _Column]] = {m: {} for m in MODALITIES}
        self._derived: Dict[Tuple[str, str, int], Any] = {}  # structures built from the codes (:meth:`derived`)

    # ------------------------------------------------------------------ facts

    def count(self, modality: str) -> int:
        """Items of a modality."""
        return self._count[modality_name(modality)]

    @property
    def ntotal(self) -> int:
        """Items of both modalities (FAISS's name)."""
        return sum(self._count.values())

    def fields(self, modality: str) -> Dict[str, Optional[int]]:
        """Columns beyond codes and ids: name -> width (None for strings)."""
        cols = self._columns[modality_name(modality)]
        return {name: col.width for name, col in cols.items() if name not in ("codes", "ids")}

    def __repr__(self) -> str:
        where = f", path={self.path!r}" if self.path else ""
        return f"Index(n_bits={self.n_bits}, img={self._count['img']}, txt={self._count['txt']}{where})"

    # -------------------------------------------------------------- columns

    def _column(self, modality: str, name: str) -> Any:
        """All committed rows of a column: an array (maybe a memmap), or (offsets, bytes) for strings."""
        col = self._columns[modality].get(name)
        if col is None:
            raise KeyError(f"the index has no {name!r} for modality {modality!r}")
        if col.dtype is None:
            return self._strings(modality, name)
        if col.mapped is not None and not col.parts:
            return col.mapped
        pieces = ([] if col.mapped is None else [np.asarray(col.mapped)]) + col.parts
        if not pieces:
            return np.zeros(col.shape(0), dtype=col.dtype)
        whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        col.mapped, col.parts = whole, []
        return whole

    def _strings(self, modality: str, name: str) -> Tuple[np.ndarray, Any]:
        col = self._columns[modality][name]
        if col.parts:
            encoded = [s.encode("utf-8") for s in col.parts]
            offsets = np.cumsum([0] + [len(b) for b in encoded], dtype=np.int64)
            blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
            if col.mapped is not None:
                old_offsets, old_blob = col.mapped
                offsets = np.concatenate([old_offsets[:-1], offsets + old_offsets[-1]])
                blob = np.concatenate([np.asarray(old_blob), blob])
            col.mapped, col.parts = (offsets, blob), []
        if col.mapped is None:
            col.mapped = (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))
        return col.mapped

    def codes(self, modality: str) -> np.ndarray:
        """Packed words of every item. Shape: [count, words] uint64."""
        return self._column(modality_name(modality), "codes")

    def ids(self, modality: str) -> np.ndarray:
        """Ids of every item. Shape: [count] int64."""
        return self._column(modality_name(modality), "ids")

    def embeddings(self, modality: str) -> np.ndarray:
        """Real-valued embeddings of every item. Shape: [count, d] float16."""
        return self._column(modality_name(modality), "embed")

    def labels(self, modality: str) -> np.ndarray:
        """Multi-hot labels of every item. Shape: [count, C] uint8."""
        return self._column(modality_name(modality), "labels")

    def take(self, modality: str, name: str, positions: ArrayLike) -> Any:
        """Column ``name`` (ids, embed, labels, text, paths) of the items at ``positions``:
        an array of shape positions.shape (+ width), or a flat list of str."""
        modality = modality_name(modality)
        if self._columns[modality].get(name) is not None and self._columns[modality][name].dtype is None:
            return self.strings(modality, name, positions)
        return np.asarray(self._column(modality, name)[to_numpy(positions)])

    def has(self, modality: str, name: str) -> bool:
        return name in self._columns[modality_name(modality)]

    def origins(self, modality: str, positions: ArrayLike) -> Tuple[List[Dict[str, Any]], np.ndarray, np.ndarray]:
        """Where the built items at ``positions`` were read: ``(places, place, row)``.

        ``places``: one dict per (collection file, group) met, with the source's ``path``,
        ``group``, ``size`` and ``mtime_ns`` as recorded at build; ``place`` [P] int64: each
        item's entry in ``places``; ``row`` [P] int64: its row in that group. Shape: positions
        of any shape, flattened to P. Raises ValueError for an index that keeps no origins.
        """
        modality = modality_name(modality)
        if not self.has(modality, "origin"):
            raise ValueError(f"{self.path or 'index'}: records no collection row of its {modality} items "
                             "(built before ucmfh kept them); build the index again to re-rank by tokens")
        origin = self.take(modality, "origin", to_numpy(positions).ravel()).reshape(-1, 2)
        keys = np.unique(origin[:, 0])
        places: List[Dict[str, Any]] = []
        place = np.empty(len(origin), dtype=np.int64)
        row = np.empty(len(origin), dtype=np.int64)
        for number in keys:
            source = self.sources[int(number)] if int(number) < len(self.sources) else None
            if source is None or "group_rows" not in source:
                raise DataError(f"{self.path}: {MANIFEST}: no source {int(number)} with its group rows, "
                                f"but {modality}.origin refers to it")
            which = np.flatnonzero(origin[:, 0] == number)
            starts = np.cumsum([0] + list(source["group_rows"]))
            group = np.searchsorted(starts, origin[which, 1], side="right") - 1
            for g in np.unique(group):
                at = which[group == g]
                place[at] = len(places)
                row[at] = origin[at, 1] - starts[g]
                places.append({"path": source["path"], "group": source["groups"][int(g)],
                               "size": source.get("size"), "mtime_ns": source.get("mtime_ns")})
        return places, place, row

    def strings(self, modality: str, name: str, positions: ArrayLike) -> List[str]:
        """``text`` or ``paths`` of the items at ``positions`` (any shape; flattened)."""
        offsets, blob = self._column(modality_name(modality), name)
        return [bytes(blob[offsets[p] : offsets[p + 1]]).decode("utf-8") for p in to_numpy(positions).ravel()]

    # ----------------------------------------------------------------- add

    def add(
        self,
        modality: str,
        codes: ArrayLike,
        ids: Optional[ArrayLike] = None,
        *,
        embeddings: Optional[ArrayLike] = None,
        labels: Optional[ArrayLike] = None,
        text: Optional[Sequence[str]] = None,
        paths: Optional[Sequence[str]] = None,
        origin: Optional[ArrayLike] = None,
    ) -> None:
        """Append items to one modality (appended to the folder at once when the index has one).

        Shape: codes [N, n_bits] ±1 (or packed, see :func:`as_words`); ids [N] int
        (default: the positions the items take); embeddings [N, d]; labels [N, C];
        origin [N, 2] int (number in :attr:`sources`, row of that collection).
        The first items added to a modality fix which of the optional columns it has.
        """
        self.add_many({modality: dict(codes=codes, ids=ids, embeddings=embeddings, labels=labels,
                                      text=text, paths=paths, origin=origin)})

    def add_many(self, items: Mapping[str, Mapping[str, Any]], source: Optional[Dict[str, Any]] = None) -> None:
        """Append items to several modalities in one commit (``add``'s keywords per modality);
        ``source`` (a built collection's progress, :mod:`ucmfh.search.build`) is recorded with them."""
        rows = {modality_name(m): self._prepare(modality_name(m), dict(v)) for m, v in items.items()}
        if self.path is None:
            for modality, columns in rows.items():
                self._append_memory(modality, columns)
        else:
            self._append_folder(rows, source)
        if source is not None and self.path is None:
            self._record_source(source)

    def _prepare(self, modality: str, given: Dict[str, Any]) -> Dict[str, Any]:
        where = f"{modality}"
        words = as_words(given["codes"], self.n_bits, f"{where} codes")
        n = words.shape[0]
        ids = given.get("ids")
        if ids is None:
            ids = np.arange(self._count[modality], self._count[modality] + n, dtype=np.int64)
        ids = to_numpy(ids)
        if ids.dtype.kind not in "iu":
            raise ValueError(f"{where} ids: must be integers, got {ids.dtype}")
        _check_rows(f"{where} ids", ids, n)
        columns: Dict[str, Any] = {"codes": words, "ids": ids.astype(np.int64)}
        for name, key in (("embed", "embeddings"), ("labels", "labels"), ("origin", "origin")):
            value = given.get(key)
            if value is not None:
                value = to_numpy(value)
                if value.ndim != 2:
                    raise ValueError(f"{where} {key}: expected a 2-D array, got shape {value.shape}")
                _check_rows(f"{where} {key}", value, n, 2 if name == "origin" else value.shape[1])
                if name == "labels" and value.size and not np.isin(value, (0, 1)).all():
                    raise ValueError(f"{where} labels: values other than 0 and 1")
                if name == "origin" and (value.dtype.kind not in "iu" or (value < 0).any()):
                    raise ValueError(f"{where} origin: expected non-negative integers")
                columns[name] = np.ascontiguousarray(value.astype(_EXTRA[name]))
        for name in STRINGS:
            value = given.get(name)
            if value is not None:
                value = [str(s) for s in value]
                _check_rows(f"{where} {name}", value, n)
                columns[name] = value
        have = self._columns[modality]
        signature = {name: ("strings" if isinstance(v, list) else (v.shape[1] if v.ndim == 2 else 1))
                     for name, v in columns.items()}
        if have:
            expected = {name: ("strings" if c.dtype is None else (c.width or 1)) for name, c in have.items()}
            if signature != expected:
                raise ValueError(f"{where}: the index's items have columns {expected}, these have {signature} "
                                 "(every add to a modality gives the same columns)")
        else:
            for name, value in columns.items():
                if isinstance(value, list):
                    have[name] = _Column(None, None)
                else:
                    have[name] = _Column(value.dtype, value.shape[1] if value.ndim == 2 else None)
        return columns

    def _append_memory(self, modality: str, columns: Dict[str, Any]) -> None:
        for name, value in columns.items():
            col = self._columns[modality][name]
            if col.dtype is None:
                col.parts.extend(value)
            else:
                col.parts.append(np.array(value, copy=True))
        self._count[modality] += len(columns["ids"])

    def unfinished(self) -> List[Dict[str, Any]]:
        """The collections built in only partly (their build was interrupted): ``sources`` entries
        whose ``done`` rows are fewer than their ``rows``."""
        return [s for s in self.sources if "rows" in s and int(s.get("done", 0)) < int(s["rows"])]

    def check_finished(self) -> None:
        """Refuse an index whose build was interrupted (:class:`UnfinishedIndex` naming the folder, the
        collection and how far its build went)."""
        for source in self.unfinished():
            raise UnfinishedIndex(f"{self.path or 'index'}: unfinished: its build from {source['path']} stopped at "
                                  f"row {source['done']} of {source['rows']} (interrupted), so a search would miss "
                                  "the rest")

    def _record_source(self, source: Dict[str, Any]) -> None:
        for i, s in enumerate(self.sources):
            if s["key"] == source["key"]:
                self.sources[i] = dict(source)
                return
        self.sources.append(dict(source))

    # ------------------------------------------------------------- search

    def search(
        self, queries: ArrayLike, k: int, modality: str = "txt", device: Any = "cpu", threads: Optional[int] = None,
        backend: Optional[Any] = None, served: Optional[Dict[str, int]] = None,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Exact top-k items of ``modality`` for each query, by (Hamming distance, position).

        Shape: queries [Q, n_bits] ±1 or real (sign), or packed (:func:`as_words`) ->
        (distances, positions) [Q, min(k, count)] int64 numpy. On the CPU the
        compiled popcount kernels run (without importing torch), on ``threads`` threads over
        queries (default: the CPUs this process may use); on a GPU the torch path.
        ``self.ids(modality)[positions]`` gives the items' ids. ``backend``
        (:class:`ucmfh.config.BackendConfig`) ``mih``: the same result by multi-index hashing on
        the CPU (:mod:`ucmfh.search.mih`; ``served`` gets how many queries it and the scan served, and
        ``scanned``, which the scan did);
        ``faiss-*``: FAISS's approximate search (:mod:`ucmfh.search.approx`; positions -1 where it
        found fewer than k).
        """
        modality = modality_name(modality)
        if int(k) < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        qw = as_words(queries, self.n_bits, "queries")
        codes = self.codes(modality)
        if backend is not None and backend.backend == "mih" and str(device) == "cpu":
            from ucmfh.search import mih

            tables, _ = mih.multi_index(self, modality, backend.substrings)
            return tables.search(qw, int(k), threads, scan=lambda q, k: hamming_search(q, codes, self.n_bits, k,
                                                                                         device, threads),
                                 stats=served)
        if backend is not None and backend.backend not in ("exact", "mih"):
            from ucmfh.search import approx

            return approx.search(self, qw, int(k), modality, backend, threads)
        if served is not None:
            served.update(mih=0, scan=qw.shape[0], scanned=np.arange(qw.shape[0]))
        return hamming_search(qw, codes, self.n_bits, int(k), device, threads)

    def derived(self, cache: str, name: str, build: Callable[[], Any], read: Callable[[str], Optional[Any]],
                write: Callable[[Any, str], None], stale: str) -> Tuple[Any, str]:
        """A structure built from the codes (a FAISS index, multi-index tables), kept for this opening of
        the index and cached inside its folder, in ``INDEX/cache/``: ``read(path)`` (None when absent or
        out of date), else ``build()`` and ``write(it, path)`` (under a lock on ``path``: two searches never
        build it twice; write to temporary names and rename). ``name`` holds every setting built in and
        the item count; other files matching ``stale`` (a glob in the cache folder) are then removed. A
        folder that cannot be written gets it built in memory. Returns it and how it was got: ``in
        memory``, ``cached`` or ``built``."""
        key = (cache, name, self.ntotal)
        if key in self._derived:
            return self._derived[key], "in memory"
        if self.path is None:
            self._derived[key] = build()
            return self._derived[key], "in memory"
        folder = os.path.join(self.path, cache)
        path = os.path.join(folder, name)
        try:
            os.makedirs(folder, exist_ok=True)
            lock = locked(path)
            lock.__enter__()
        except PermissionError:  # a read-only folder: built in memory, once per opening of the index
            self._derived[key] = build()
            return self._derived[key], "in memory"
        try:
            found = read(path)
            if found is not None:
                self._derived[key] = found
                return found, "cached"
            self._derived[key] = build()
            write(self._derived[key], path)
            for old in glob.glob(os.path.join(folder, stale)):
                base = os.path.basename(old)
                if base != name and not base.startswith(name + "."):  # name, name.lock, name.PART.npy stay
                    os.remove(old)
        finally:
            lock.__exit__(None, None, None)
        return self._derived[key], "built"

    # --------------------------------------------------------------- files

    def save(self, path: PathLike, overwrite: bool = False) -> str:
        """Write the index to a new folder, atomically (a temporary folder renamed when complete).

        The index is then bound to the folder: later :meth:`add` calls append to it.
        """
        path = os.path.abspath(os.fspath(path))
        if os.path.exists(path) and not overwrite:
            raise FileExistsError(f"{path}: exists; not replaced")
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
                        _write_raw(os.path.join(tmp, f"{modality}.{name}.offsets"), offsets)
                        _write_raw(os.path.join(tmp, f"{modality}.{name}.bytes"), blob)
                    else:
                        _write_raw(os.path.join(tmp, f"{modality}.{name}"), self._column(modality, name))
            write_json_atomic(os.path.join(tmp, MANIFEST), self._manifest())
            if os.path.exists(path):
                old = atomic_path(path + ".old")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old)
            else:
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                shutil.rmtree(tmp)
        loaded = Index.load(path)
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
    def load(cls, path: PathLike, mmap: bool = True) -> "Index":
        """Open an index folder; with ``mmap`` its columns are memory-mapped (read on demand), else read in.

        Raises :class:`ucmfh.data.format.DataError` naming the folder, the file and the problem.
        """
        path = os.path.abspath(os.fspath(path))
        manifest = read_manifest(path)
        index = cls(manifest["n_bits"], manifest.get("meta"))
        index.sources = list(manifest.get("sources") or [])
        index.path = path
        for modality in MODALITIES:
            entry = manifest["modalities"].get(modality) or {"count": 0, "columns": {}}
            n = int(entry["count"])
            index._count[modality] = n
            for name, spec in entry["columns"].items():
                if spec is None:
                    col = _Column(None, None)
                    size = int(entry.get("string_bytes", {}).get(name, -1))
                    offsets = _map(path, f"{modality}.{name}.offsets", np.int64, (n + 1,), mmap)
                    if offsets[0] != 0 or offsets[-1] != size:
                        raise DataError(f"{path}: {modality}.{name}.offsets: do not match the manifest "
                                        f"({offsets[-1]} bytes, manifest {size})")
                    col.mapped = (offsets, _map(path, f"{modality}.{name}.bytes", np.uint8, (size,), mmap))
                else:
                    dtype, width = np.dtype(spec[0]), spec[1]
                    col = _Column(dtype, width)
                    col.mapped = _map(path, f"{modality}.{name}", dtype, col.shape(n), mmap)
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
            on_disk = read_manifest(self.path)
            for modality in MODALITIES:
                if on_disk["modalities"].get(modality, {}).get("count", 0) != self._count[modality]:
                    raise DataError(f"{self.path}: changed by another writer since it was opened; open it again")
            for modality, columns in rows.items():
                n = self._count[modality]
                for name, value in columns.items():
                    col = self._columns[modality][name]
                    if col.dtype is None:
                        offsets, _ = self._strings(modality, name)
                        start = int(offsets[-1])
                        encoded = [s.encode("utf-8") for s in value]
                        new = start + np.cumsum([len(b) for b in encoded], dtype=np.int64)
                        _write_at(os.path.join(self.path, f"{modality}.{name}.offsets"), (n + 1) * 8, new)
                        _write_at(os.path.join(self.path, f"{modality}.{name}.bytes"), start,
                                  np.frombuffer(b"".join(encoded), dtype=np.uint8))
                    else:
                        itemsize = np.dtype(col.dtype).itemsize * (col.width or 1)
                        _write_at(os.path.join(self.path, f"{modality}.{name}"), n * itemsize,
                                  np.ascontiguousarray(value, dtype=col.dtype))
                self._count[modality] = n + len(columns["ids"])
            if source is not None:
                self._record_source(source)
            write_json_atomic(os.path.join(self.path, MANIFEST), self._manifest_from_disk())
        fresh = Index.load(self.path, mmap=True)
        self.__dict__.update(fresh.__dict__)

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

    @classmethod
    def create(cls, path: PathLike, n_bits: int, meta: Optional[Mapping[str, Any]] = None) -> "Index":
        """A new, empty index folder (atomically created), bound for appends."""
        index = cls(n_bits, meta)
        index.save(path)
        return index


def modality_name(name: str) -> str:
    aliases = {"image": "img", "text": "txt"}
    name = aliases.get(name, name)
    if name not in MODALITIES:
        raise ValueError(f"modality must be 'image' or 'text' ('img'/'txt'), got {name!r}")
    return name


def _write_raw(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.ascontiguousarray(array).tofile(f)
        f.flush()
        os.fsync(f.fileno())


def _write_at(path: str, offset: int, array: np.ndarray) -> None:
    """Write ``array`` at byte ``offset``, dropping whatever lay beyond it (rows of a killed write)."""
    mode = "r+b" if os.path.exists(path) else "w+b"
    with open(path, mode) as f:
        f.truncate(offset)
        f.seek(offset)
        np.ascontiguousarray(array).tofile(f)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of an index folder, checked."""
    file = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such index folder")
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


def _map(folder: str, name: str, dtype: np.dtype, shape: Tuple[int, ...], mmap: bool) -> np.ndarray:
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


# ----------------------------------------------------------------- the search


# The torch path's memory: its top-k holds about 8 candidates of 32 bytes per query and result
# (depth 10,000 × 2,100 queries at once would reach ~43 GB); queries are searched in
# chunks of at most QUERY_CHUNK_BYTES of such candidates.
CANDIDATE_BYTES = 8 * 32
QUERY_CHUNK_BYTES = 1 << 30


def hamming_search(
    qw: np.ndarray, rw: np.ndarray, n_bits: int, k: int, device: Any = "cpu", threads: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact top-k of query words [Q, W] among item words [N, W] by (distance, position).

    Shape: -> (distances, positions) [Q, min(k, N)] int64. CPU: the compiled kernels
    (those of :func:`ucmfh.metrics.native.native_top_k`) on ``threads`` threads over
    queries, else the torch path; a GPU device: the torch path, reading the items in blocks.
    """
    n = rw.shape[0]
    k = min(k, n)
    nq = qw.shape[0]
    if k == 0 or nq == 0:
        return np.zeros((nq, k), dtype=np.int64), np.zeros((nq, k), dtype=np.int64)
    kernels = cpu_kernels(device)
    if kernels is not None:
        qw = np.ascontiguousarray(qw)
        dist = np.empty((nq, k), dtype=np.int64)
        pos = np.empty((nq, k), dtype=np.int64)

        def work(a: int, b: int) -> None:
            kernels.top_k(qw[a:b], rw, b - a, n, qw.shape[1], n_bits, k, pos[a:b], dist[a:b])

        over_query_ranges(nq, threads, work)
        return dist, pos
    import torch

    from ucmfh.codes import unpack_codes
    from ucmfh.metrics.topk import hamming_top_k_torch
    from ucmfh.utils import resolve_device

    device = resolve_device(device) if isinstance(device, str) else device
    # packed items count their padding bits, which are clear in both sets and add no distance
    n_bytes = -(-n_bits // 8)
    block = 1 << 22
    # the top-k's candidate keys take about CANDIDATE_BYTES per query and k: queries go in chunks
    chunk = max(1, QUERY_CHUNK_BYTES // (CANDIDATE_BYTES * k))
    out_d, out_p = np.empty((nq, k), dtype=np.int64), np.empty((nq, k), dtype=np.int64)
    for a in range(0, nq, chunk):
        q = unpack_codes(torch.from_numpy(packed_bytes(qw[a : a + chunk], n_bits).copy()), 8 * n_bytes).to(device)
        dists, positions = [], []
        for start in range(0, n, block):
            # packed bytes of one block of items (a copy: a mapped file is read-only); unpacked on the device
            r = torch.from_numpy(np.array(packed_bytes(rw[start : start + block], n_bits)))
            d, p = hamming_top_k_torch(q, r, min(k, r.shape[0]), 65536)
            dists.append(d.cpu())
            positions.append(p.cpu() + start)
        out_d[a : a + chunk], out_p[a : a + chunk] = merge_top_k([x.numpy() for x in dists],
                                                                 [x.numpy() for x in positions], k)
    return out_d, out_p


def merge_top_k(dists: List[np.ndarray], positions: List[np.ndarray], k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Merge per-part top-k lists (global positions) into one, by (distance, position).

    Shape: lists of [Q, k_i] -> [Q, min(k, sum k_i)] int64.
    """
    if len(dists) == 1:
        return dists[0][:, :k], positions[0][:, :k]
    d = np.concatenate(dists, axis=1)
    p = np.concatenate(positions, axis=1)
    span = int(p.max()) + 1 if p.size else 1
    key = d * span + p  # unique: distances <= 65535, positions < 2**40
    order = np.argsort(key, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), np.take_along_axis(p, order, axis=1)
