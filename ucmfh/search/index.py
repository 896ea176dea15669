"""A searchable index of binary codes: exact Hamming top-K over packed bits, in memory or in a folder.

An index holds, per modality (``img``, ``txt``), the items' codes as packed
uint64 words and their ids, and optionally what shows or re-ranks a result:
labels (multi-hot), float16 real-valued embeddings (the hash heads' pre-sign
outputs, for cosine re-ranking), strings (``text`` for captions, ``paths``
for image files) and ``origin``: where a built item was read (for re-ranking by
the collection's token features). Verbs as in FAISS: :meth:`Index.add`, :meth:`Index.search`,
:meth:`Index.save`, :meth:`Index.load`; :func:`ucmfh.search.build.build_index` encodes a
collection file with a checkpoint into an index folder.

On disk an index is a folder whose manifest alone says how many rows are committed
(:mod:`ucmfh.search.folder`, docs/search.md); loading maps its files, so an index larger
than RAM is searched from the page cache. The scan is :mod:`ucmfh.search.scan`.

Ranking: Hamming distance ascending, ties by position (the order items were
added) ascending, as everywhere in ucmfh (docs/reference.md §6).
"""
from __future__ import annotations

import contextlib
import glob
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ucmfh.bits import MAX_BITS, as_words, n_words, to_numpy
from ucmfh.config import backend_config
from ucmfh.data.format import DataError
from ucmfh.files import locked
from ucmfh.search.folder import EMBEDDING_DTYPE, MANIFEST, MODALITIES, STRINGS, Column, IndexFolder, modality_name
from ucmfh.search.kernels import search_device
from ucmfh.search.scan import check_k, hamming_search

ArrayLike = Any  # numpy arrays or torch tensors (torch is not imported to search on the CPU)
# fixed-width columns besides codes and ids: name -> dtype
_EXTRA = {"embed": EMBEDDING_DTYPE, "labels": np.uint8, "origin": np.int64}
STRINGS_SPAN = 1 << 28  # bytes of strings read at once for the items asked for, where they lie within them


class UnfinishedIndex(ValueError):
    """An index whose build stopped before every row of a collection was added (an interrupted or killed
    ``ucmfh index``): a search of it would miss those rows without a word. The same build continues it."""


def _check_rows(name: str, value: Any, n: int, width: Optional[int] = None) -> None:
    shape = getattr(value, "shape", (len(value),))
    if shape[0] != n or (width is not None and (len(shape) != 2 or shape[1] != width)):
        want = f"({n},)" if width is None else f"({n}, {width})"
        raise ValueError(f"{name}: expected shape {want}, got {tuple(shape)}")


class Index(IndexFolder):
    """Binary codes of items of two modalities, searched by exact Hamming top-K.

    Example:
        >>> index = Index(n_bits=64)
        >>> index.add("txt", txt_codes, ids=ids, text=captions)   # ±1 [N, 64], numpy or torch
        >>> distances, positions = index.search(img_codes, k=10, modality="txt")
        >>> index.ids("txt")[positions]                              # [Q, 10] int64
        >>> index.save("my.index"); index = Index.load("my.index")  # memory-mapped
    """

    def __init__(self, n_bits: int, meta: Optional[Mapping[str, Any]] = None) -> None:
        if isinstance(n_bits, bool) or not isinstance(n_bits, (int, np.integer)):  # "16" and 16.7 were taken
            raise TypeError(f"n_bits must be a whole number, got {type(n_bits).__name__} {n_bits!r}")
        if not 1 <= n_bits <= MAX_BITS:
            raise ValueError(f"n_bits must be in 1 .. {MAX_BITS}, got {n_bits}")
        self.n_bits = int(n_bits)
        self.words = n_words(self.n_bits)
        self.meta: Dict[str, Any] = dict(meta or {})
        self.sources: List[Dict[str, Any]] = []  # collection files built in (ucmfh.search.build)
        self.path: Optional[str] = None  # the folder, once saved or loaded
        self._count = {m: 0 for m in MODALITIES}
        self._columns: Dict[str, Dict[str, Column]] = {m: {} for m in MODALITIES}
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
        if col is None:  # a ValueError, one line (a KeyError's message is shown quoted)
            if not self._count[modality]:
                raise ValueError(f"the index holds no {modality} items (it holds {self._count['img']} img and "
                                 f"{self._count['txt']} txt items)")
            raise ValueError(f"the index keeps no {name!r} of its {modality} items")
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
        at = to_numpy(positions)
        if at.size and (at.min() < 0 or at.max() >= self.count(modality)):  # -1 was the last item, unsaid
            wrong = at.min() if at.min() < 0 else at.max()
            raise IndexError(f"position {wrong} is not one of the {self.count(modality)} {modality} items "
                             f"(0 to {self.count(modality) - 1})")
        if self._columns[modality].get(name) is not None and self._columns[modality][name].dtype is None:
            return self.strings(modality, name, at)
        return np.asarray(self._column(modality, name)[at])

    def has(self, modality: str, name: str, anywhere: bool = False) -> bool:
        """Whether the items of ``modality`` carry the column ``name`` (ids, names, paths, ...); ``anywhere`` is
        :meth:`Shards.has`'s (one index: the same)."""
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
        """``text`` or ``paths`` of the items at ``positions`` (any shape; flattened). Each item is decoded once
        however often it is asked for (the hits of many queries repeat), from one read of the bytes they
        span where that is at most ``STRINGS_SPAN`` bytes."""
        offsets, blob = self._column(modality_name(modality), name)
        unique, inverse = np.unique(to_numpy(positions).ravel(), return_inverse=True)
        if not len(unique):
            return []
        starts, ends = np.asarray(offsets[unique]).tolist(), np.asarray(offsets[unique + 1]).tolist()
        low, high = min(starts), max(ends)
        if high - low <= STRINGS_SPAN:
            span = bytes(blob[low:high])
            texts = [span[a - low : b - low].decode("utf-8") for a, b in zip(starts, ends)]
        else:
            texts = [bytes(blob[a:b]).decode("utf-8") for a, b in zip(starts, ends)]
        return [texts[i] for i in inverse.tolist()]

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
        if ids.size and int(ids.min()) < 0:  # as 'ucmfh index' refuses them (docs/search.md)
            raise ValueError(f"{where} ids: must be >= 0, got {int(ids.min())} (first at row "
                             f"{int(np.argmax(ids < 0))})")
        if ids.size and int(ids.max()) > np.iinfo(np.int64).max:  # uint64: stored as negative ids, unsaid
            raise ValueError(f"{where} ids: {int(ids.max())} does not fit int64, as ids are kept")
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
            if isinstance(value, (str, bytes)):  # 'dog' was kept as the captions 'd', 'o' and 'g'
                raise TypeError(f"{where} {name}: a list of strings, one an item, not one {type(value).__name__}")
            if value is not None:
                value = list(value)
                missing = next((i for i, s in enumerate(value) if s is None), None)
                if missing is not None:  # str(None) would show the text 'None'
                    raise ValueError(f"{where} {name}: None at position {missing}; give a string ('' for none)")
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
                    have[name] = Column(None, None)
                else:
                    have[name] = Column(value.dtype, value.shape[1] if value.ndim == 2 else None)
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
                                  f"row {source['done']} of {source['rows']} (interrupted, or under way in another "
                                  "process), so a search would miss the rest")

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
        ``self.ids(modality)[positions]`` gives the items' ids. ``backend`` (a name, ``"mih"``, or a
        :class:`ucmfh.config.BackendConfig`; None: ``exact``) ``mih``: the same result by multi-index hashing on
        the CPU (:mod:`ucmfh.search.mih`; ``served`` gets how many queries it and the scan served, and
        ``scanned``, which the scan did; ``small``, the queries scanned because the items are too few for
        probing to pay, :data:`ucmfh.search.mih.MIN_ITEMS`, and ``uncompiled``, because ucmfh's C kernels are not
        built here, where no tables are built);
        ``faiss-*``: FAISS's approximate search (:mod:`ucmfh.search.approx`; positions -1 where it
        found fewer than k). An index whose build was interrupted is refused (:class:`UnfinishedIndex`).
        Scores of these hits favour the items added first in ties (:func:`ucmfh.search.build_index`).
        """
        self.check_finished()  # its rows of the interrupted collection are a part of it: a search would miss the rest
        modality = modality_name(modality)
        k = check_k(k)
        backend = backend_config(backend)
        qw = as_words(queries, self.n_bits, "queries")
        codes = self.codes(modality)
        device = search_device(device)
        scanned_because = {}  # multi-index hashing asked where probing cannot pay (too few items, no compiled probe)
        if backend.backend == "mih" and str(device) == "cpu":
            from ucmfh.search import mih

            if codes.shape[0] >= mih.MIN_ITEMS and mih.compiled():
                tables, _ = mih.multi_index(self, modality, backend.substrings)
                return tables.search(qw, int(k), threads, scan=lambda q, k: hamming_search(q, codes, self.n_bits, k,
                                                                                             device, threads),
                                     stats=served)
            scanned_because = {"small" if codes.shape[0] < mih.MIN_ITEMS else "uncompiled": qw.shape[0]}
        if backend.backend not in ("exact", "mih"):
            from ucmfh.search import approx

            return approx.search(self, qw, int(k), modality, backend, threads)
        if served is not None:
            served.update(mih=0, scan=qw.shape[0], scanned=np.arange(qw.shape[0]), **scanned_because)
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
                    with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another search's build
                        os.remove(old)
        finally:
            lock.__exit__(None, None, None)
        return self._derived[key], "built"
