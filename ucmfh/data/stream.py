"""Feature rows read from an HDF5 split on demand: training on data larger than memory.

:func:`ucmfh.data.h5.load_dataset` keeps a split's features in memory below a size threshold
and gives them as :class:`Rows` above it. ``Rows`` look like the ``[N, d]`` tensors they replace
where the library reads features (``rows[a:b]``, ``rows[index]``, ``len``, ``shape``, ``to``),
and read through a cache of row blocks of bounded size, whatever N is.

A streamed split is trained on in the order of the same split in memory (a uniform permutation),
so that streaming changes no batch, no value and no weight. A training batch, drawn from the whole
split, would touch a different block for nearly every item: such scattered rows are read row by
row instead (nearby rows in one read), past the block cache, and a batch's rows are read ahead of
its step (:meth:`Rows.read_ahead`) and kept for it. Where the rows lie as they are in the file (float32,
uncompressed), scattered rows are read at their byte offsets by several threads at once (:class:`_Pread`),
past HDF5, which serialises its calls.
"""
from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Optional, Tuple, Union

import h5py
import numpy as np
import torch

from ucmfh.data.format import DataError
from ucmfh.utils import host_index, to_device


@dataclass(frozen=True)
class StreamSettings:
    """How a streamed split is read: ``block_rows`` rows per block; the cache holds ``2 · window`` blocks
    per feature dataset."""

    block_rows: int = 16384
    window: int = 8

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.window < 1:
            raise ValueError(f"block_rows and window must be positive, got {self.block_rows}, {self.window}")

    def within(self, cache_bytes: int, d: int, least: int = 256) -> "StreamSettings":
        """These settings with blocks small enough for the cache of one float32 dataset of ``d``
        columns to fit in ``cache_bytes`` (blocks of ``least`` rows at the smallest)."""
        fit = cache_bytes // (2 * self.window * 4 * d)
        return replace(self, block_rows=int(max(min(least, self.block_rows), min(self.block_rows, fit))))


def open_without_chunk_cache(path: str) -> h5py.File:
    """An HDF5 file opened read-only without HDF5's chunk cache: a row read through that cache reads its
    whole chunk (about 1 MiB, :mod:`ucmfh.data.writer`), 40 µs a row against 6 for the row alone, measured;
    blocks are cached here. HDF5 shares a file opened twice in a process, with the first opening's cache:
    :func:`ucmfh.data.h5.load_dataset` opens it so too."""
    return h5py.File(path, "r", rdcc_nbytes=0)


GAP = 32  # file rows read past rather than apart: a read of the rows between two wanted ones costs less than a call
AHEAD = 2  # the most batches read ahead and kept for their step, per dataset
READERS = 8  # threads reading scattered rows at once (:class:`_Pread`)
READ_BYTES = 1 << 20  # the most one read brings in at once
_POOL: Tuple[int, Optional[ThreadPoolExecutor]] = (0, None)  # the process that made it, the readers
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The process's reader threads (a forked child makes its own: it has none of its parent's threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL[0] != os.getpid() or _POOL[1] is None:
            _POOL = (os.getpid(), ThreadPoolExecutor(READERS, thread_name_prefix="ucmfh-rows"))
        return _POOL[1]


def _chunks(dataset: h5py.Dataset) -> list:
    """The dataset's chunks' storage infos (``chunk_offset``, ``byte_offset``, ...)."""
    found: list = []
    try:
        dataset.id.chunk_iter(found.append)  # one pass (HDF5 1.14)
    except (AttributeError, NotImplementedError):
        found = [dataset.id.get_chunk_info(i) for i in range(dataset.id.get_num_chunks())]
    return found


class _Pread:
    """A dataset's rows read at their byte offsets in the file with ``os.preadv``, straight into place, from
    several threads at once: for a float32 dataset, unfiltered, contiguous or chunked by whole rows, in a
    plain file. HDF5 serialises its calls, so a scattered batch read through h5py waits for one row after
    another; these reads take a fifth of the time from a disk and a third from the page cache
    (docs/distributed.md). :meth:`of` gives None for any other layout, or where the offsets do not read back
    the dataset's first and last rows."""

    def __init__(self, path: str, first_rows: np.ndarray, offsets: np.ndarray, chunk_rows: int, d: int) -> None:
        self.path, self.first_rows, self.offsets = path, first_rows, offsets
        self.chunk_rows, self.row_bytes = chunk_rows, 4 * d
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)

    @classmethod
    def of(cls, path: str, dataset: h5py.Dataset) -> Optional["_Pread"]:
        n, d = dataset.shape
        if (n == 0 or not hasattr(os, "preadv") or dataset.dtype != np.dtype("<f4") or dataset.file.driver != "sec2"
                or dataset.file.userblock_size != 0 or dataset.id.get_create_plist().get_nfilters() != 0):
            return None
        if dataset.chunks is None:
            offset = dataset.id.get_offset()
            if offset is None:
                return None
            first_rows, offsets, chunk_rows = np.zeros(1, dtype=np.int64), np.array([offset], dtype=np.int64), n
        else:
            if dataset.chunks[1] != d:
                return None
            chunks = {}
            for info in _chunks(dataset):
                chunks[info.chunk_offset[0]] = info.byte_offset
            chunk_rows = dataset.chunks[0]
            if len(chunks) != -(-n // chunk_rows):  # a chunk never written is not in the file
                return None
            first_rows = np.array(sorted(chunks), dtype=np.int64)
            offsets = np.array([chunks[r] for r in first_rows], dtype=np.int64)
        reader = cls(path, first_rows, offsets, chunk_rows, d)
        out = np.empty((2, d), dtype=np.float32)
        reader.read(np.array([0, n - 1]), out)
        return reader if np.array_equal(out, np.stack([dataset[0], dataset[n - 1]])) else None

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """``out[:] = the file rows rows`` (increasing, distinct; ``out`` C-contiguous float32): each run of
        consecutive rows within a chunk, at most ``READ_BYTES``, read straight into its place in ``out``."""
        most = max(1, READ_BYTES // self.row_bytes)
        chunk = rows // self.chunk_rows
        cuts = np.flatnonzero((np.diff(rows) != 1) | (np.diff(chunk) != 0) | (np.diff(rows // most) != 0)) + 1
        begins, ends = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(rows)]])
        at = self.offsets[chunk[begins]] + (rows[begins] - self.first_rows[chunk[begins]]) * self.row_bytes
        runs = list(zip(begins.tolist(), ends.tolist(), at.tolist()))

        def read_some(part: list) -> None:
            for begin, end, offset in part:
                size = (end - begin) * self.row_bytes
                if os.preadv(self.fd, [out[begin:end]], offset) != size:
                    raise OSError(f"{self.path}: a read of {size} bytes at {offset} came back short")

        step = -(-len(runs) // READERS)
        list(_pool().map(read_some, [runs[i:i + step] for i in range(0, len(runs), step)]))


def _stamp(fd: int) -> Tuple[int, int]:
    """An open file's size and modification time: another content written into it changes them."""
    stat = os.fstat(fd)
    return stat.st_size, stat.st_mtime_ns


class _Blocks:
    """One HDF5 dataset's blocks of rows, least recently used first out, and the batches read ahead of their
    step; shared by the views of it."""

    def __init__(self, path: str, name: str, settings: StreamSettings) -> None:
        self.path, self.name, self.settings = path, name, settings
        self.file = open_without_chunk_cache(path)
        self.dataset = self.file[name]
        self.cache: "OrderedDict[Tuple[int, int], np.ndarray]" = OrderedDict()
        self.ahead: "OrderedDict[Tuple[int, bytes], np.ndarray]" = OrderedDict()
        self.lock = threading.Lock()  # a step reads while the next step's rows are read ahead
        self.pread = _Pread.of(path, self.dataset)
        self.fd = os.open(path, os.O_RDONLY)  # the file opened, whatever is renamed into its path since
        weakref.finalize(self, os.close, self.fd)
        self.stamp = _stamp(self.fd)

    def block(self, rows: np.ndarray, key: Tuple[int, int]) -> np.ndarray:
        """The file rows ``rows`` (sorted) as float32, cached under ``key``."""
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
            self.cache[key] = data = self.read(rows)
            while len(self.cache) > 2 * self.settings.window:
                self.cache.popitem(last=False)
            return data

    def keep(self, key: Tuple[int, bytes], rows: np.ndarray) -> None:
        """Keep a batch's rows read ahead until its step takes them (:meth:`take`)."""
        with self.lock:
            self.ahead[key] = rows
            while len(self.ahead) > AHEAD:
                self.ahead.popitem(last=False)

    def take(self, key: Tuple[int, bytes]) -> Optional[np.ndarray]:
        with self.lock:
            return self.ahead.pop(key, None)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The file rows ``rows`` (sorted) as float32: one contiguous read when they are dense, else one
        per run of rows less than ``GAP`` apart within a span of ``block_rows`` file rows (a spread subset,
        e.g. a validation part; a training batch), so that memory stays bounded by a block whatever the
        rows' spread, and rows far apart are read alone; by :class:`_Pread` where it can, the rows alone."""
        if _stamp(self.fd) != self.stamp:  # rows of two contents in one run, or HDF5's 'addr overflow'
            raise DataError(f"{self.path}: changed since it was opened (written over in place while its rows were "
                            "read as training went); put it back, or run again on the new file")
        span = self.settings.block_rows
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        if hi - lo <= max(span, 2 * len(rows)):
            data = np.asarray(self.dataset[lo:hi], dtype=np.float32)
            return data if hi - lo == len(rows) else data[rows - lo]
        out = np.empty((len(rows), self.dataset.shape[1]), dtype=np.float32)
        if self.pread is not None:  # the rows alone, side by side
            self.pread.read(rows, out)
            return out
        cuts = np.flatnonzero((np.diff(rows // span) != 0) | (np.diff(rows) > GAP)) + 1
        for group in np.split(np.arange(len(rows)), cuts):
            a, b = int(rows[group[0]]), int(rows[group[-1]]) + 1
            out[group] = np.asarray(self.dataset[a:b], dtype=np.float32)[rows[group] - a]
        return out


_VIEWS = itertools.count()  # cache keys: views of one file (a split and its subsets) never share a key


class Rows:
    """The rows ``index`` (sorted file rows; all when None) of one feature dataset of a split,
    read on demand. Shape: ``[len(index), d]``; reads (``x[a:b]``, ``x[positions]``) give float32 tensors on
    ``device``; ``x.numpy()`` reads every row into memory. Not an array: ``np.asarray(x)`` and
    ``torch.as_tensor(x)`` do not read it whole unasked."""

    def __init__(self, path: str, name: str, settings: StreamSettings = StreamSettings(),
                 index: Optional[np.ndarray] = None, device: Union[str, torch.device] = "cpu",
                 _blocks: Optional[_Blocks] = None, _view: Optional[int] = None) -> None:
        self.blocks = _blocks or _Blocks(path, name, settings)
        self.settings = settings
        n_file = self.blocks.dataset.shape[0]
        self.index = np.arange(n_file) if index is None else np.asarray(index, dtype=np.int64)
        self.device = torch.device(device)
        self.view = next(_VIEWS) if _view is None else _view

    @property
    def shape(self) -> Tuple[int, int]:
        return len(self.index), int(self.blocks.dataset.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        """What its reads give, as a tensor's ``dtype`` says it (it was None: a notebook's check of it failed)."""
        return torch.float32

    def numpy(self) -> np.ndarray:
        """Every row, read whole into memory ([N, d] float32), as a tensor's ``numpy()`` gives them: the streamed
        split's features, where a notebook wants them (``x[:]`` is the same rows as a tensor)."""
        return self[:].cpu().numpy()

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return f"Rows({self.blocks.path}:{self.blocks.name}, shape={self.shape}, streamed)"

    def to(self, device: Union[str, torch.device]) -> "Rows":
        return Rows(self.blocks.path, self.blocks.name, self.settings, self.index, device, self.blocks, self.view)

    def subset(self, positions: Union[slice, torch.Tensor, np.ndarray]) -> "Rows":
        """The rows at ``positions`` (increasing), still streamed."""
        if isinstance(positions, slice):
            positions = np.arange(len(self))[positions]
        positions = np.asarray(positions.cpu() if isinstance(positions, torch.Tensor) else positions)
        if len(positions) > 1 and not (np.diff(positions) > 0).all():
            raise ValueError("a streamed subset takes increasing positions")
        return Rows(self.blocks.path, self.blocks.name, self.settings, self.index[positions], self.device,
                    self.blocks)

    def _positions(self, key: Union[slice, torch.Tensor, np.ndarray]) -> np.ndarray:
        if isinstance(key, slice):
            return np.arange(len(self))[key]
        return np.asarray(host_index(key) if isinstance(key, torch.Tensor) else key, dtype=np.int64)

    def _read(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions``: through the block cache, or row by row where the view has more blocks
        than the cache holds and the positions would use little of each block they touch (a training batch)."""
        size = self.settings.block_rows
        block_of = positions // size
        wanted = np.unique(block_of)
        scattered = -(-len(self) // size) > 2 * self.settings.window and len(wanted) * size > 4 * len(positions)
        if scattered:
            rows, inverse = np.unique(self.index[positions], return_inverse=True)
            return self.blocks.read(rows)[inverse.reshape(-1)]
        parts = [self.blocks.block(self.index[b * size:(b + 1) * size], (self.view, int(b))) for b in wanted]
        starts = np.zeros(len(wanted), dtype=np.int64)
        starts[1:] = np.cumsum([len(p) for p in parts])[:-1]
        return np.concatenate(parts)[starts[np.searchsorted(wanted, block_of)] + positions % size]

    def read_ahead(self, key: Union[slice, torch.Tensor, np.ndarray]) -> None:
        """Read the rows ``self[key]`` will give now (on a worker thread, ahead of the step that asks), and
        keep them for it."""
        positions = self._positions(key)
        self.blocks.keep((self.view, positions.tobytes()), self._read(positions))

    def __getitem__(self, key: Union[slice, torch.Tensor, np.ndarray]) -> torch.Tensor:
        positions = self._positions(key)
        rows = self.blocks.take((self.view, positions.tobytes()))
        return to_device(torch.from_numpy(self._read(positions) if rows is None else rows), self.device)

    def column_stats(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Mean and (population) standard deviation of every column, float64, in one pass by blocks."""
        total = torch.zeros(self.shape[1], dtype=torch.float64)
        squares = torch.zeros_like(total)
        for start in range(0, len(self), self.settings.block_rows):
            x = self[start:start + self.settings.block_rows].cpu().double()
            total += x.sum(0)
            squares += (x * x).sum(0)
        mean = total / len(self)
        return mean, (squares / len(self) - mean * mean).clamp_min(0).sqrt()


Features = Union[torch.Tensor, Rows]


def column_stats(x: Features) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean and population standard deviation of each column of ``[N, d]`` features, float64."""
    if isinstance(x, Rows):
        return x.column_stats()
    x = x.double()
    return x.mean(dim=0), x.std(dim=0, correction=0) if x.shape[0] > 1 else torch.ones_like(x[0])


def take(x: Features, index: torch.Tensor) -> Features:
    """The rows ``index`` of features: a tensor in memory, a streamed view of streamed rows."""
    return x.subset(index) if isinstance(x, Rows) else x[index]


def is_streamed(x: Features) -> bool:
    return isinstance(x, Rows)
