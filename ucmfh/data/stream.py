"""Feature rows read from an HDF5 split on demand: training on data larger than memory.

:func:`ucmfh.data.h5.load_dataset` keeps a split's features in memory below a size threshold
and gives them as :class:`Rows` above it. ``Rows`` look like the ``[N, d]`` tensors they replace
where the library reads features (``rows[a:b]``, ``rows[index]``, ``len``, ``shape``, ``to``),
and read through a cache of row blocks of bounded size, whatever N is.

Random batches over the whole split would touch a different block for nearly every item. A
streamed split is therefore shuffled by blocks (:meth:`Rows.shuffle`): the blocks are permuted,
taken ``window`` at a time, and the items of each window permuted among themselves, as a
shuffle buffer does. Every item is still used once per epoch, and a batch reads blocks of at
most two windows, all of which the cache holds.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Optional, Tuple, Union

import h5py
import numpy as np
import torch

from ucmfh.utils import host_index, to_device


@dataclass(frozen=True)
class StreamSettings:
    """How a streamed split is read: ``block_rows`` rows per block, ``window`` blocks shuffled
    together; the cache holds ``2 · window`` blocks per feature dataset (a batch may span two windows)."""

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


class _Blocks:
    """One HDF5 dataset's blocks of rows, least recently used first out; shared by the views of it."""

    def __init__(self, path: str, name: str, settings: StreamSettings) -> None:
        self.path, self.name, self.settings = path, name, settings
        self.file = h5py.File(path, "r")
        self.dataset = self.file[name]
        self.cache: "OrderedDict[Tuple[int, int], np.ndarray]" = OrderedDict()
        self.lock = threading.Lock()  # a step reads while the next step's rows are read ahead

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

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The file rows ``rows`` (sorted) as float32: one contiguous read when they are dense, else one
        per span of ``block_rows`` file rows that holds any (a spread subset, e.g. a validation part),
        so that memory stays bounded by a block whatever the rows' spread."""
        span = self.settings.block_rows
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        if hi - lo <= max(span, 2 * len(rows)):
            data = np.asarray(self.dataset[lo:hi], dtype=np.float32)
            return data if hi - lo == len(rows) else data[rows - lo]
        out = np.empty((len(rows), self.dataset.shape[1]), dtype=np.float32)
        cuts = np.flatnonzero(np.diff(rows // span)) + 1
        for group in np.split(np.arange(len(rows)), cuts):
            a, b = int(rows[group[0]]), int(rows[group[-1]]) + 1
            out[group] = np.asarray(self.dataset[a:b], dtype=np.float32)[rows[group] - a]
        return out


_VIEWS = itertools.count()  # cache keys: views of one file (a split and its subsets) never share a key


class Rows:
    """The rows ``index`` (sorted file rows; all when None) of one feature dataset of a split,
    read on demand. Shape: ``[len(index), d]``; reads give float32 tensors on ``device``."""

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

    def _blocks_of(self, positions: np.ndarray) -> Tuple[np.ndarray, np.ndarray, list]:
        """The block of each position, the blocks that hold them, and their rows (read, or found in the cache)."""
        size = self.settings.block_rows
        block_of = positions // size
        wanted = np.unique(block_of)
        parts = [self.blocks.block(self.index[b * size:(b + 1) * size], (self.view, int(b))) for b in wanted]
        return block_of, wanted, parts

    def read_ahead(self, key: Union[slice, torch.Tensor, np.ndarray]) -> None:
        """Read the blocks that ``self[key]`` will need into the cache."""
        self._blocks_of(self._positions(key))

    def __getitem__(self, key: Union[slice, torch.Tensor, np.ndarray]) -> torch.Tensor:
        positions = self._positions(key)
        block_of, wanted, parts = self._blocks_of(positions)
        starts = np.zeros(len(wanted), dtype=np.int64)
        starts[1:] = np.cumsum([len(p) for p in parts])[:-1]
        rows = np.concatenate(parts)[starts[np.searchsorted(wanted, block_of)] + positions % self.settings.block_rows]
        return to_device(torch.from_numpy(rows), self.device)

    def shuffle(self, generator: torch.Generator) -> torch.Tensor:
        """A permutation of the positions in which each window of items comes from ``window`` blocks."""
        size, n = self.settings.block_rows, len(self)
        n_blocks = -(-n // size)
        if n_blocks == 1:  # the order of an in-memory split
            return torch.randperm(n, generator=generator)
        order = torch.randperm(n_blocks, generator=generator)
        out = []
        for start in range(0, n_blocks, self.settings.window):
            blocks = order[start:start + self.settings.window].tolist()
            items = torch.cat([torch.arange(b * size, min(n, (b + 1) * size)) for b in blocks])
            out.append(items[torch.randperm(len(items), generator=generator)])
        return torch.cat(out)

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
