"""The resumable work of an extraction: finished chunks kept as small ``.npz`` files in a scratch folder
beside the output, each written atomically, and the shards that compute them (clip-retrieval's
independent partitions: shard ``i`` of ``n`` computes the chunks ``c`` with ``c % n == i``)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from tqdm.auto import tqdm

from ucmfh.data.format import DataError
from ucmfh.data.writer import make_folder
from ucmfh.data.input_files import npz_member, open_npz, read_text
from ucmfh.files import atomic_file, write_text_atomic

log = logging.getLogger(__name__)
RESTART = ("restart", True, "to discard it and start over")  # the remedy of a damaged scratch (DataError.remedy)
Shard = Tuple[int, int]  # (index, count): a process that computes the chunks c with c % count == index


def parse_shard(text: str) -> Shard:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"shard {text!r}: needs 0 <= I < N")
    return index, count


def fingerprint(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


class Scratch:
    """Finished chunks as ``kind-NNNNNN.npz`` files, each written atomically."""

    def __init__(self, folder: str, key: str, out: str, model: Optional[str] = None,
                 parts: Optional[Dict[str, str]] = None):
        """``key``: the fingerprint of what the chunks are of; ``parts``, where given, its parts by name (each a
        fingerprint): a scratch of another key is refused naming the parts that differ. ``model``: the digest
        of the model's files (:func:`ucmfh.data.clip_encoder.model_digest`) where the chunks are computed; a
        merge, which loads no model, gives none."""
        self.folder = folder
        make_folder(folder, out)
        manifest = os.path.join(folder, "manifest.json")
        if not os.path.exists(manifest) and any(name.endswith(".npz") for name in os.listdir(folder)):
            raise DataError(f"{folder}: chunks without a manifest (an extraction's, whose folder was removed under "
                            "it): of what, nothing says", remedy=RESTART)
        if not os.path.exists(manifest):
            # shards may start together, on several machines: the first complete manifest linked wins
            mine = f"{manifest}.{socket.gethostname()}.{os.getpid()}"
            write_text_atomic(mine, json.dumps({"fingerprint": key, "parts": parts, "model": model}))
            try:
                os.link(mine, manifest)
            except FileExistsError:
                pass
            finally:
                os.remove(mine)
        try:
            saved = json.loads(read_text(manifest))
            old, weights, old_parts = saved.get("fingerprint"), saved.get("model"), saved.get("parts")
        except (ValueError, AttributeError):  # not JSON, or not an object
            raise DataError(f"{manifest}: unreadable scratch manifest", remedy=RESTART) from None
        if old != key:  # which part differs: the inputs given in another spelling, a flag, the files themselves
            differ = [name for name in parts or ()
                      if isinstance(old_parts, dict) and old_parts.get(name) != parts[name]]
            empty = not any(name.endswith(".npz") for name in os.listdir(folder))
            raise DataError(f"{folder}: scratch of a different extraction ("
                            + (f"it differs from this one in its {', '.join(differ)}" if differ
                               else "other inputs, model or settings")
                            + ("; it holds no finished chunk" if empty else "") + ")", remedy=RESTART)
        if None not in (model, weights) and weights != model:  # trained on into its folder: chunks of two models
            raise DataError(f"{folder}: scratch of other files of the same model (its weights, tokenizer or image "
                            "processor have changed since its chunks were computed)", remedy=RESTART)

    def path(self, kind: str, chunk: int) -> str:
        return os.path.join(self.folder, f"{kind}-{chunk:06d}.npz")

    def done(self, kind: str, chunk: int) -> bool:
        return os.path.exists(self.path(kind, chunk))

    def save(self, kind: str, chunk: int, features: np.ndarray, ok: np.ndarray,
             tokens: Optional[Dict[str, np.ndarray]] = None, files: Optional[np.ndarray] = None) -> None:
        """One chunk: pooled ``features``, ``ok`` rows, in a token run its token arrays, and where given the state
        of the files its rows were computed from (``files``, [n, 2]: size and modification time; one file)."""
        if not os.path.exists(os.path.join(self.folder, "manifest.json")):  # its chunk would start a folder anew
            raise DataError(f"{self.folder}: removed while this extraction wrote into it (by another extraction of "
                            "the same OUT, one that restarted or finished); run it again")
        members = {f"tokens_{k}": v for k, v in (tokens or {}).items()}
        if files is not None:
            members["files"] = files
        with atomic_file(self.path(kind, chunk)) as tmp, open(tmp, "wb") as f:
            # a file object: savez would add ".npz" to a name
            np.savez(f, features=features, ok=ok, **members)

    def files(self, kind: str, chunk: int) -> Optional[np.ndarray]:
        """The state of the files a chunk was computed from, as :meth:`save` kept it (None: it kept none)."""
        path = self.path(kind, chunk)
        try:
            with open_npz(path) as f:
                return npz_member(f, path, "files") if "files" in f.files else None
        except DataError as err:
            raise DataError(f"{err}; a damaged scratch chunk", remedy=RESTART) from None

    def marker(self, shard: Shard) -> str:
        return os.path.join(self.folder, f"shard-{shard[0]}-of-{shard[1]}.done")

    def finished_shards(self) -> List[Shard]:
        found = (re.fullmatch(r"shard-(\d+)-of-(\d+)\.done", name) for name in os.listdir(self.folder))
        return sorted((int(m.group(1)), int(m.group(2))) for m in found if m)

    def load(self, kind: str, chunk: int) -> Tuple[np.ndarray, np.ndarray]:
        path = self.path(kind, chunk)
        try:
            with open_npz(path) as f:
                return npz_member(f, path, "features"), npz_member(f, path, "ok")
        except DataError as err:
            raise DataError(f"{err}; a damaged scratch chunk", remedy=RESTART) from None

    def load_tokens(self, kind: str, chunk: int, names: Sequence[str]) -> Dict[str, np.ndarray]:
        """The token arrays ``names`` of a chunk saved by a token run (only those are read)."""
        path = self.path(kind, chunk)
        try:
            with open_npz(path) as f:
                missing = [n for n in names if f"tokens_{n}" not in f.files]
                if missing:
                    raise DataError(f"{path}: no tokens_{missing[0]} member (a chunk without tokens)")
                return {n: npz_member(f, path, f"tokens_{n}") for n in names}
        except DataError as err:
            raise DataError(f"{err}; a damaged scratch chunk", remedy=RESTART) from None


def chunks(n_items: int, chunk_items: int, shard: Optional[Shard] = None) -> List[Tuple[int, int, int]]:
    """``(chunk, start, stop)`` of every chunk, or of the chunks of ``shard``."""
    every = [(c, start, min(n_items, start + chunk_items))
             for c, start in enumerate(range(0, n_items, chunk_items))]
    return every if shard is None else [t for t in every if t[0] % shard[1] == shard[0]]


def run_chunks(
    kind: str,
    n_items: int,
    scratch: Scratch,
    chunk_items: int,
    compute: Callable[[int, int, tqdm], tuple],
    bar: tqdm,
    report: Any,
    shard: Optional[Shard] = None,
    files: Optional[Callable[[int, int], np.ndarray]] = None,
    names: Optional[Sequence[str]] = None,
) -> None:
    """Compute every chunk (of ``shard``) that has no file yet; ``compute`` advances the bar per batch. With
    ``files`` (the state of the files of items ``start:stop``, as :meth:`Scratch.save` keeps it), a finished chunk
    whose files have changed since (an image replaced or edited) is computed again, the first changed one (of
    ``names``) said: its rows were the old files' features."""
    for chunk, start, stop in chunks(n_items, chunk_items, shard):
        now = files(start, stop) if files is not None else None
        if scratch.done(kind, chunk):
            kept = scratch.files(kind, chunk) if now is not None else None
            changed = [] if kept is None or kept.shape != now.shape else np.flatnonzero((kept != now).any(axis=1))
            if not len(changed):
                report.chunks_reused += 1
                bar.update(stop - start)
                continue
            first = names[start + changed[0]] if names is not None else f"item {start + changed[0]}"
            log.warning("%s chunk %d: %d of its files changed since it was computed (first: %s); computed again",
                        kind, chunk, len(changed), first)
        scratch.save(kind, chunk, *compute(start, stop, bar), files=now)  # features, ok[, tokens]
        report.chunks_computed += 1


def missing_chunks(counts: Dict[str, int], scratch: Scratch, chunk_items: int) -> None:
    """Refuse a merge while any chunk has no file, naming the shards that owe one."""
    missing = {kind: [c for c, _, _ in chunks(n, chunk_items) if not scratch.done(kind, c)] for kind, n in counts.items()}
    if not any(missing.values()):
        return
    where = "; ".join(f"{kind} chunks {_some(chunks)}" for kind, chunks in missing.items() if chunks)
    finished = scratch.finished_shards()
    counts_seen = sorted({n for _, n in finished})
    if len(counts_seen) == 1:
        n = counts_seen[0]
        owing = sorted({c % n for chunks in missing.values() for c in chunks})
        hint = f"shard{'s' if len(owing) > 1 else ''} {', '.join(f'{i}/{n}' for i in owing)} not done"
    else:
        hint = "no shard has finished" if not finished else "shards of different counts finished"
    raise DataError(f"{scratch.folder}: cannot merge, {hint} ({where} missing); run the missing shards first")


def _some(items: List[int], most: int = 5) -> str:
    text = ", ".join(map(str, items[:most]))
    return text + (f" and {len(items) - most} more" if len(items) > most else "")


def wait_for_shards(scratch: Scratch, count: int, poll_seconds: float) -> None:
    """Block until every shard of ``count`` has marked itself done (``torchrun`` ranks as shards: a
    failed rank ends the whole job, so no timeout is needed here)."""
    told = False
    while True:
        done = {i for i, n in scratch.finished_shards() if n == count}
        if len(done) == count:
            return
        if not told:
            log.info("waiting for shards %s of %d to finish", ", ".join(str(i) for i in range(count) if i not in done),
                     count)
            told = True
        time.sleep(poll_seconds)


def gather_chunks(kind: str, n_items: int, scratch: Scratch, chunk_items: int) -> Tuple[np.ndarray, np.ndarray]:
    parts = [scratch.load(kind, c) for c, _, _ in chunks(n_items, chunk_items)]
    d = max(p[0].shape[1] for p in parts)
    # a chunk whose images were all unreadable has no columns: NaN rows, never used
    feats = [p[0] if p[0].shape[1] == d else np.full((len(p[1]), d), np.nan, np.float32) for p in parts]
    return np.concatenate(feats), np.concatenate([p[1] for p in parts])


