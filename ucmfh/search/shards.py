"""Several index files searched as one: the same results as one index of their items in order."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ucmfh.bits import as_words, to_numpy
from ucmfh.config import backend_config
from ucmfh.data.format import DataError
from ucmfh.files import PathLike
from ucmfh.search.collection import differing
from ucmfh.search.folder import NAMES, STRINGS, modality_name
from ucmfh.search.index import ArrayLike, Index
from ucmfh.search.scan import check_k, merge_top_k


class Shards:
    """Indexes made by one checkpoint, searched as the concatenation of their items (in the order given).

    A position is global: shard ``s``'s item ``j`` is at ``offset(s) + j``. Each
    shard's exact top-k is merged by (distance, position), so results equal
    those of one index holding every item in that order.
    """

    def __init__(self, shards: Sequence[Index]) -> None:
        if not shards:
            raise ValueError("no index given")
        seen: Dict[Any, Index] = {}
        for shard in shards:  # one index twice would return each of its hits twice
            key = os.path.realpath(shard.path) if shard.path else id(shard)
            if key in seen:
                raise ValueError(f"{shard.path or 'index'}: given twice; its items would be searched twice and "
                                 "every hit returned twice")
            seen[key] = shard
        first = shards[0]
        features: Dict[str, str] = {}  # modality -> the extractor, as the shards that record one record it
        described: Dict[str, Index] = {}
        for shard in shards:
            if shard.n_bits != first.n_bits:
                raise DataError(f"{shard.path}: holds {shard.n_bits}-bit codes, but {first.path} holds "
                                f"{first.n_bits}-bit ones; indexes searched as one must share their code length")
            a = (first.meta.get("checkpoint") or {}).get("sha256")
            b = (shard.meta.get("checkpoint") or {}).get("sha256")
            if a != b:
                raise DataError(f"{shard.path}: was made by another checkpoint than {first.path} "
                                f"(sha256 {str(b)[:12]} vs {str(a)[:12]}); indexes searched as one must share it")
            for modality, feature in (shard.meta.get("features") or {}).items():
                if not feature:
                    continue
                if modality in features and features[modality] != feature:
                    mine, theirs = differing(feature, features[modality])
                    raise DataError(f"{shard.path}: its {NAMES[modality]} features were made by '{mine}', but "
                                    f"those of {described[modality].path} by '{theirs}'; indexes searched as one "
                                    "must share their extractors")
                features.setdefault(modality, feature)
                described.setdefault(modality, shard)
        held: Dict[Tuple[str, str], Index] = {}  # (a collection's content, one of its groups) -> the shard holding it
        for shard in shards:  # two folders of one collection: the same items twice, every hit twice
            for source in getattr(shard, "sources", None) or ():
                content = str(source.get("key", "")).split(":")[0]
                for group in source.get("groups") or ():
                    other = held.setdefault((content, group), shard)
                    if other is not shard:
                        raise ValueError(f"{shard.path}: holds the items of {source.get('path')} {group}, as "
                                         f"{other.path} does; searched as one, every hit of them would be returned "
                                         "twice")
        self.shards = list(shards)
        # the features every shard that records them shares: queries of another extractor are refused for all
        self.n_bits, self.path = first.n_bits, first.path
        self.meta = {**first.meta, "features": features}

    def count(self, modality: str) -> int:
        return sum(s.count(modality) for s in self.shards)

    def has(self, modality: str, name: str, anywhere: bool = False) -> bool:
        """Whether every shard holding items of ``modality`` carries the column ``name`` (``anywhere``: one does;
        :meth:`take` of a string column gives None for the items of the others)."""
        holding = [s.has(modality, name) for s in self.shards if s.count(modality)]
        return any(holding) if anywhere else all(holding)

    def shard_of(self, modality: str, positions: ArrayLike) -> np.ndarray:
        """The shard (its number, in the order given) of each item at global ``positions``; the same shape."""
        return np.searchsorted(self._offsets(modality), to_numpy(positions), side="right") - 1

    def _offsets(self, modality: str) -> np.ndarray:
        return np.cumsum([0] + [s.count(modality) for s in self.shards])

    def search(self, queries: ArrayLike, k: int, modality: str = "txt", device: Any = "cpu",
               threads: Optional[int] = None, backend: Optional[Any] = None,
               served: Optional[Dict[str, int]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """As :meth:`Index.search`, over every shard's items; positions are global."""
        modality = modality_name(modality)
        k = check_k(k)
        backend = backend_config(backend)
        qw = as_words(queries, self.n_bits, "queries")
        dists, positions = [], []
        scanned: set = set()  # queries the scan served in some shard
        small = []  # for each shard searched: too small for probing (every query scanned there)
        uncompiled = 0  # queries scanned because the compiled probe is not built here (every shard's)
        for offset, shard in zip(self._offsets(modality), self.shards):
            if shard.count(modality):
                part: Dict[str, Any] = {}
                d, p = shard.search(qw, int(k), modality, device, threads, backend, part)
                scanned.update(part.get("scanned", []))
                small.append(bool(part.get("small")))
                uncompiled = max(uncompiled, int(part.get("uncompiled", 0)))
                dists.append(d)
                positions.append(np.where(p < 0, -1, p + offset))  # -1: not found (approximate backends)
        if served is not None:  # a query counts as multi-index hashing's where it served every shard
            served.update(mih=qw.shape[0] - len(scanned), scan=len(scanned),
                          scanned=np.array(sorted(scanned), dtype=np.int64),
                          small=qw.shape[0] if small and all(small) else 0,  # as one index too small
                          uncompiled=uncompiled,
                          small_shards=(sum(small), len(small)) if 0 < sum(small) < len(small) else None)
        if not dists:
            empty = np.zeros((qw.shape[0], 0), dtype=np.int64)
            return empty, empty.copy()
        return merge_top_k(dists, positions, int(k))

    def take(self, modality: str, name: str, positions: ArrayLike) -> Any:
        """As :meth:`Index.take`, by global position."""
        positions = to_numpy(positions)
        flat = positions.ravel()
        offsets = self._offsets(modality)
        shard_of = self.shard_of(modality, flat)
        parts: List[Any] = [None] * len(flat)
        out = None
        for s in np.unique(shard_of):
            where = np.flatnonzero(shard_of == s)
            if name in STRINGS and not self.shards[s].has(modality, name):  # a shard without captions: None
                continue
            values = self.shards[s].take(modality, name, flat[where] - offsets[s])
            if isinstance(values, list):
                for i, v in zip(where, values):
                    parts[i] = v
            else:
                if out is None:
                    out = np.zeros((len(flat),) + values.shape[1:], dtype=values.dtype)
                out[where] = values
        if name in STRINGS or (out is None and any(p is not None for p in parts)):
            return parts
        if out is None:
            return np.zeros(positions.shape, dtype=np.int64)
        return out.reshape(positions.shape + out.shape[1:])

    def origins(self, modality: str, positions: ArrayLike) -> Tuple[List[Dict[str, Any]], np.ndarray, np.ndarray]:
        """As :meth:`Index.origins`, by global position (places met in several shards listed once)."""
        flat = to_numpy(positions).ravel()
        offsets = self._offsets(modality)
        shard_of = self.shard_of(modality, flat)
        places: List[Dict[str, Any]] = []
        seen: Dict[Tuple[Any, ...], int] = {}
        place = np.empty(len(flat), dtype=np.int64)
        row = np.empty(len(flat), dtype=np.int64)
        for s in np.unique(shard_of):
            where = np.flatnonzero(shard_of == s)
            found, p, r = self.shards[s].origins(modality, flat[where] - offsets[s])
            local = np.array([seen.setdefault(_place_key(f), len(seen)) for f in found], dtype=np.int64)
            for f in found:
                if seen[_place_key(f)] == len(places):
                    places.append(f)
            place[where], row[where] = local[p], r
        return places, place, row


def _place_key(place: Dict[str, Any]) -> Tuple[Any, ...]:
    return place["path"], place["group"], place["size"], place["mtime_ns"]


def open_index(paths: Union[PathLike, Sequence[PathLike]], mmap: bool = True) -> Union[Index, Shards]:
    """One index folder, or several searched as one (:class:`Shards`); an index whose build was interrupted
    is refused (:class:`ucmfh.search.index.UnfinishedIndex`)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    indexes = [Index.load(p, mmap=mmap) for p in paths]
    named: Dict[Tuple[int, int], int] = {}
    for i, index in enumerate(indexes):  # IDX and IDX/, or a relative and an absolute path: one folder
        stat = os.stat(index.path)
        first = named.setdefault((stat.st_dev, stat.st_ino), i)
        if first != i:
            raise ValueError(f"{index.path}: index folder named twice (as '{os.fspath(paths[first])}' and "
                             f"'{os.fspath(paths[i])}'); its items would be searched twice and every hit "
                             "returned twice")
    for index in indexes:
        index.check_finished()
    return indexes[0] if len(indexes) == 1 else Shards(indexes)
