"""Encode a collection with a hashing checkpoint into an index: chunked, resumable, appending.

Codes are computed under the ``unimodal`` protocol (docs/reference.md §3): an
image's code from the image alone, a caption's from the caption alone, so a
user with only one modality can compute the same code for a query. The index
records the checkpoint (SHA-256 of the file) and the feature extractors (the
collection's root attributes); queries encoded by another checkpoint, or
features of another extractor, are refused.

Each chunk of rows is appended and committed with the build's progress
(``Index.sources``, where a collection is recorded before its first chunk): a
killed build continues at its last committed chunk, an index with an unfinished
build is refused by search (:meth:`Index.check_finished`), and an index never holds
the same items twice: a group of a collection already indexed (the same file content
and group name; a dataset file's train split is its retrieval split's items) is not
added again, whatever groups a later build names (:func:`groups_to_add`). Another
collection built into an existing index is appended. Each item keeps its
origin (the source's number and its row in the collection), which re-ranking by
the collection's token features reads (:mod:`ucmfh.search.seps_rerank`).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ucmfh.checkpoint import load_model
from ucmfh.bits import as_words, to_numpy
from ucmfh.config import INDEX_CHUNK_SIZE
from ucmfh.data.format import DataError, first_of_each_id, row_fingerprints
from ucmfh.data.h5 import is_dataset_file, validate_file
from ucmfh.files import fingerprint, locked
from ucmfh.search.collection import Collection, differing, open_collection
from ucmfh.search.folder import NAMES, modality_name
from ucmfh.search.index import Index
from ucmfh.utils import check_argument, resolve_device

PROTOCOL = "unimodal"
Log = Callable[[str], None]


class Encoder:
    """A hashing checkpoint as an encoder of one modality at a time (``unimodal``).

    ``encode`` gives the heads' real-valued outputs; their signs are the codes
    (sign(0) = +1), the same codes as ``ucmfh encode --protocol unimodal``.
    """

    def __init__(self, checkpoint: str, device: str = "cpu", batch_size: int = 4096) -> None:
        check_argument("Encoder", "checkpoint", checkpoint, (str, os.PathLike), "a hashing checkpoint's path")
        checkpoint = os.fspath(checkpoint)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")  # 0: range()'s error later
        model, _, hash_cfg, _ = load_model(checkpoint, "hash")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.batch_size = batch_size
        dims = model.fusion if hasattr(model, "fusion") else model
        self.dims = {"img": int(dims.d_img), "txt": int(dims.d_txt)}
        self.n_bits = int(hash_cfg.n_bits)
        self.identity = {"path": os.path.abspath(checkpoint), "sha256": fingerprint(checkpoint),
                         "method": hash_cfg.method, "n_bits": self.n_bits,
                         "d_img": self.dims["img"], "d_txt": self.dims["txt"]}

    def __repr__(self) -> str:
        return (f"Encoder({self.identity['method']!r}, {self.n_bits} bits, image {self.dims['img']}-d, text "
                f"{self.dims['txt']}-d, on {self.device}; {self.identity['path']})")

    def check_dim(self, features: np.ndarray, modality: str, where: str) -> None:
        """Refuse features of ``modality`` that are not [N, d] of the width the checkpoint takes (``DataError``
        naming ``where``)."""
        if features.ndim != 2:
            raise DataError(f"{where}: expected {NAMES[modality]} features [N, {self.dims[modality]}] (one vector: "
                            f"[{self.dims[modality]}]), got shape {features.shape}")
        if features.shape[1] != self.dims[modality]:
            raise DataError(f"{where}: {features.shape[1]}-d {NAMES[modality]} features, the checkpoint "
                            f"{self.identity['path']} takes {self.dims[modality]}-d")

    @torch.no_grad()
    def encode(self, features: np.ndarray, modality: str) -> np.ndarray:
        """Head outputs of one modality ('image'/'img' or 'text'/'txt'), numpy or torch features of the width the
        checkpoint takes, finite. Shape: [N, d] -> [N, n_bits] float32; one vector [d] -> [1, n_bits]."""
        modality = modality_name(modality)
        features = to_numpy(features)
        if features.ndim == 1:  # one item, as the command line takes one query vector
            features = features[None, :]
        self.check_dim(features, modality, "features")
        if features.dtype.kind != "f" or not np.isfinite(features).all():
            raise DataError(f"features: {NAMES[modality]} features must be finite floating-point numbers, got "
                            f"{features.dtype}" + (" with NaN or inf" if features.dtype.kind == "f" else ""))
        out = []
        for start in range(0, features.shape[0], self.batch_size):
            x = torch.from_numpy(np.ascontiguousarray(features[start : start + self.batch_size], dtype=np.float32))
            out.append(self.model.modality_logits(x.to(self.device), modality).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.n_bits), dtype=np.float32)


def check_same_checkpoint(index: Index, encoder: Encoder) -> None:
    """Refuse an encoder other than the one that made the index."""
    made = (index.meta.get("checkpoint") or {})
    if made.get("sha256") == encoder.identity["sha256"]:
        if encoder.n_bits != index.n_bits:  # the model that made it, a manifest changed or damaged since
            raise DataError(f"{index.path or 'index'}: holds {index.n_bits}-bit codes, but the checkpoint that made "
                            f"it, {made.get('path')}, makes {encoder.n_bits}-bit codes: its manifest has been changed "
                            "or damaged; build the index again")
        return
    before, now = str(made.get("sha256"))[:12], encoder.identity["sha256"][:12]
    if made.get("path") == encoder.identity["path"]:
        raise DataError(f"{index.path or 'index'}: made by checkpoint {made.get('path')} (sha256 {before}), which "
                        f"has changed since (sha256 {now}: trained again or replaced); codes of another model are "
                        "not comparable: build a new index with it, or use the checkpoint the index was built with")
    raise DataError(f"{index.path or 'index'}: made by checkpoint {made.get('path')} (sha256 {before}), not "
                    f"{encoder.identity['path']} (sha256 {now}); codes of different models are not comparable")


def check_same_feature(index: Index, modality: str, feature: Optional[str], where: str) -> None:
    """Refuse features of another extractor than the index's, when both are recorded."""
    recorded = (index.meta.get("features") or {}).get(modality)
    if recorded and feature and recorded != feature:
        given, made = differing(feature, recorded)
        raise DataError(f"{where}: its {NAMES[modality]} features were made by '{given}', but the index's by "
                        f"'{made}'; codes of features of different extractors are not comparable")


def check_same_columns(index: Index, coll: Collection, embeddings: bool, origins: Dict[str, bool], out: str) -> None:
    """Refuse, before anything is added, a collection whose items would have other columns than the index's
    (every add to a modality gives the same columns): captions (``/text_raw``), image paths (``/paths``),
    labels, or embeddings (``--no-embeddings``) that one has and the other has not."""
    given = {"labels": "/labels (labels)", "text": "/text_raw (captions)", "paths": "/paths (image files)"}
    for modality in NAMES:
        if not index.count(modality) or not coll.has(NAMES[modality]):
            continue
        have = set(index.fields(modality))
        new = {"labels"} if coll.has("labels") else set()
        new |= {"text"} if modality == "txt" and coll.has("text_raw") else set()
        new |= {"paths"} if modality == "img" and coll.has("paths") else set()
        new |= ({"embed"} if embeddings else set()) | ({"origin"} if origins[modality] else set())
        for name in sorted(have ^ new):
            if name == "embed":
                why = ("kept their embeddings for re-ranking; build without --no-embeddings" if name in have else
                       "were built with --no-embeddings; add these with --no-embeddings too")
                raise DataError(f"{out}: its {NAMES[modality]} items {why}")
            if name in given:
                raise DataError(f"{coll.path}: {'has no' if name in have else 'has'} {given[name]}, which the "
                                f"{NAMES[modality]} items of {out} {'have' if name in have else 'have not'}: "
                                "every collection in an index gives the same columns; build a new index (another -o)")


def check_not_again(index: Index, coll: Collection, sha: str, key: str, out: str) -> None:
    """Refuse, at the start of a build (``key``: its source), a collection whose items' ids are in the index
    already: rows of one id are one item, so those items would be indexed twice (a search then lists each
    twice). A collection file built in before whose content has changed since (a file grown by new rows) is
    another collection to the index, and every item it held before would be doubled; a re-export or a
    renamed copy of one built in would double all of them. (A file holding new items only, a day's batch, is
    added, under the same name or another.) A collection without ids is judged so only against its own
    file's earlier builds: its items are numbered after the index's largest id (:func:`first_id`), which no
    item holds, but a grown file's first rows are the items its earlier build numbered."""
    if any(s["key"] == key for s in index.sources):  # a build going on: its own rows hold its ids
        return
    real = os.path.realpath(coll.path)
    earlier = [s for s in index.sources
               if os.path.realpath(s.get("path", "")) == real and s["key"].split(":", 1)[0] != sha]
    grown = bool(earlier)
    ids = coll.ids()
    if ids is None and not grown:
        return
    if ids is None:  # its rows, numbered as its earlier build numbered them
        ids = int(earlier[0].get("first_id", 0)) + np.arange(len(coll), dtype=np.int64)
    held = np.concatenate([index.ids(m) for m in NAMES if index.count(m)] or [np.zeros(0, np.int64)])
    again = np.flatnonzero(np.isin(ids, held))
    if not len(again):
        return
    first = f"{len(again)} of its {len(ids)} rows have ids {out} holds already (first: id {int(ids[again[0]])} at " \
            f"row {int(again[0])}); adding it would index those items twice"
    if grown:
        raise DataError(f"{coll.path}: built into {out} before, and changed since: {first}: put the new rows in a "
                        "file of their own, or build a new index (another -o)")
    raise DataError(f"{coll.path}: {first} (a copy or a re-export of a collection built in? rows of one id are one "
                    f"item): give new items ids of their own, after {out}'s largest, {int(held.max())} ('ucmfh "
                    f"extract --first-id {int(held.max()) + 1}'), or build a new index (another -o)")


@dataclass
class BuildReport:
    index: Index
    added: Dict[str, int]  # items added per modality by this call
    resumed_at: int  # the row the build started at (0: from the start)
    rows: int  # rows of the collection asked for, each item once (a group inside another one asked for is not counted)
    already: bool  # the collection was already complete in the index
    stopped: bool = False  # should_stop ended the build before its end (the same call continues it)
    skipped: Dict[str, str] = field(default_factory=dict)  # group asked for, not added -> the group holding its items


def first_id(index: Optional[Index], key: str) -> int:
    """The id of the first row of a build from a collection without ids (``key``: its source): each of its rows
    is an item of its own, numbered from here. After the largest id the index holds, so that two files without
    ids, or two builds of one file's groups, never give two items one id (a search would list both as one id,
    and judge them the same item); an index's first such build numbers its rows from 0, as the file does. A
    resumed build goes on with the number its start recorded."""
    if index is None:
        return 0
    started = next((s for s in index.sources if s["key"] == key), None)
    if started is not None:  # recorded at its start; 0 for builds recorded before the number was
        return int(started.get("first_id", 0))
    held = [int(index.ids(m).max()) for m in NAMES if index.count(m)]
    return max(held) + 1 if held else 0


def groups_to_add(coll: Collection, sources: Sequence[Dict[str, Any]], sha: str, out: str
                  ) -> Tuple[Collection, Dict[str, str]]:
    """The groups of ``coll`` whose items the index does not hold yet (``coll`` cut to them), and those it
    does: group -> the group holding its items, an indexed one or another asked for (a dataset file's
    train split is its retrieval split's items, :data:`ucmfh.search.collection.PART_OF`).

    A group is identified by the file's content (``sha``, its SHA-256: a copy of the file is the same
    collection) and its name, not by comparing rows, which would read every item: an index holds the
    same items of the same collection once. Refused (:class:`DataError`): a group holding items another
    group put in the index (a retrieval split after its train split: only some of its items are new),
    and anything new while another build is interrupted (that build's own command finishes it first).
    """
    ours = [s for s in sources if s["key"].split(":", 1)[0] == sha]
    for s in sources:  # a build interrupted, then its file changed: it can never be finished, nor searched
        if s not in ours and int(s.get("done", 0)) < int(s.get("rows", 0)) and \
                os.path.realpath(s.get("path", "")) == os.path.realpath(coll.path):
            raise DataError(f"{out}: its build from {coll.path} stopped at row {s['done']} of {s['rows']} "
                            "(interrupted), and the file has changed since: that build cannot be finished; build a "
                            "new index (another -o), or put the file back as it was and run the same command")
    indexed = [g for s in ours if int(s.get("done", 0)) >= int(s.get("rows", 0)) for g in s["groups"]]
    new: List[str] = []
    skipped: Dict[str, str] = {}
    for i, group in enumerate(coll.groups):
        holder = next((h for h in indexed + coll.groups[i + 1:] + new if coll.holds(h, group)), None)
        if holder is not None:
            skipped[group] = holder
            continue
        part = next((h for h in indexed if coll.holds(group, h)), None)
        if part is not None:
            raise DataError(f"{coll.path}: {group} holds the items of {part} (a dataset file's {part.strip('/')} "
                            f"split is drawn from its {group.strip('/')} split), which {out} holds already; "
                            "adding it would index them twice: index the other groups alone, or build a new index")
        new.append(group)
    key = f"{sha}:{','.join(new)}"
    for s in sources:  # rows added between an interrupted build's and the rest of it would split them: the
        # positions, and so every tie's order, would differ from the uninterrupted builds'
        if new and s["key"] != key and int(s.get("done", 0)) < int(s.get("rows", 0)):
            raise DataError(f"{out}: its build of {', '.join(s['groups'])} from {s.get('path')} is at row "
                            f"{s['done']} of {s['rows']} (interrupted, or under way in another process); let that "
                            "build finish first (the same build again continues an interrupted one), or build a new "
                            "index (another -o)")
    rows = [r for g, r in zip(coll.groups, coll.rows) if g in new]
    return dataclasses.replace(coll, groups=new, rows=rows), skipped


def build_index(
    collection: str,
    checkpoint: str,
    out: str,
    splits: Optional[Sequence[str]] = None,
    chunk_size: int = INDEX_CHUNK_SIZE,
    embeddings: bool = True,
    device: str = "cpu",
    progress: bool = False,
    stop_after: Optional[int] = None,
    should_stop: Optional[Callable[[], Any]] = None,
) -> BuildReport:
    """Encode every item of a collection file into the index folder ``out`` (created, resumed or appended to).

    Images are indexed once per id (the first row of each id in this collection);
    captions, every row. Groups whose items the index holds already are not added again (the report's
    ``skipped``; ``already`` when none is left). ``embeddings`` keeps the float16 head outputs for cosine
    re-ranking. ``stop_after`` stops after that many chunks (tests simulate a kill with it); ``should_stop``,
    when it returns something true after a committed chunk, stops there too (a signal: the report says
    ``stopped``, and the same call continues the build). One build writes to a folder at a time: another
    started meanwhile (in another process) is refused (``DataError``).

    Items are held in the order read: a dataset file's ``query`` group, then ``retrieval`` (``splits`` chooses).
    A search breaks ties by that position, so the query split's own items win ties against its queries: R@K or
    MAP of such hits is optimistic beside the field's figures (``collection`` database, id order; tie-aware
    ones), which :func:`ucmfh.evaluate_hashing` or :func:`ucmfh.evaluate_caption_set` gives (docs/search.md).
    """
    for name, value, what in (("collection", collection, "a collection or dataset file's path"),
                              ("checkpoint", checkpoint, "a hashing checkpoint's path"),
                              ("out", out, "the index folder's path")):
        check_argument("build_index", name, value, (str, os.PathLike), what)
    if isinstance(splits, str):  # one group: 'query' was read as the groups q, u, e, r and y
        splits = [splits]
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a whole number >= 1, got {chunk_size!r}")  # 2.5 left a folder behind
    # the inputs are read before the folder is made and locked: a missing or wrong one leaves nothing behind
    if is_dataset_file(collection):  # the checks every other command makes of it ('ucmfh validate'), before any work
        validate_file(collection, token_values=False)
    coll, encoder = open_collection(collection, splits), Encoder(checkpoint, device)
    for modality, name in NAMES.items():
        if coll.has(name) and coll.columns[name] != encoder.dims[modality]:
            raise DataError(f"{coll.path}: {coll.where(name)}: {coll.columns[name]}-d features, the checkpoint "
                            f"{encoder.identity['path']} takes {encoder.dims[modality]}-d")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with contextlib.ExitStack() as held:
        try:  # one build a folder at a time: two at once each refused the other's rows, and one deleted the folder
            held.enter_context(locked(out, hidden=True, wait=False))
        except BlockingIOError:
            raise DataError(f"{out}: another build is writing to it now (an 'ucmfh index' in another process); let "
                            "it finish, then run this one again") from None
        return _build(coll, encoder, out, chunk_size, embeddings, progress, stop_after, should_stop)


def _build(coll: Collection, encoder: Encoder, out: str, chunk_size: int, embeddings: bool, progress: bool,
           stop_after: Optional[int], should_stop: Optional[Callable[[], Any]]) -> BuildReport:
    """:func:`build_index`'s work, under the folder's lock."""
    features = {m: coll.feature(m) for m in NAMES if coll.has(NAMES[m])}
    sha = fingerprint(coll.path)
    index = None
    empty = os.path.isdir(out) and not os.listdir(out)  # an empty folder made for it: a new index there
    created = empty or not os.path.exists(out)  # a build refused part-way leaves the index as it found it
    if not created:
        index = Index.load(out)
        counts_before, sources_before = {m: index.count(m) for m in NAMES}, copy.deepcopy(index.sources)
        check_same_checkpoint(index, encoder)
        for modality, feature in features.items():
            check_same_feature(index, modality, feature, coll.path)
        if not index.meta.get("features"):
            index.meta["features"] = {}
        for m, f in features.items():
            index.meta["features"].setdefault(m, f)
    asked = coll
    coll, skipped = groups_to_add(coll, index.sources if index is not None else [], sha, out)
    if not coll.groups:  # every group asked for is indexed already (index exists: a new one holds nothing)
        # the rows asked for, each item once: a group held by another group asked for is counted there
        rows = sum(r for g, r in zip(asked.groups, asked.rows) if skipped[g] == g or skipped[g] not in asked.groups)
        return BuildReport(index, {"img": 0, "txt": 0}, rows, rows, True, skipped=skipped)
    key = f"{sha}:{','.join(coll.groups)}"
    if index is not None:
        check_not_again(index, coll, sha, key, out)
    n = len(coll)
    stat = os.stat(coll.path)
    ids = coll.ids()
    # size and mtime identify the file cheaply at search time (re-ranking reads its tokens by row)
    source = {"key": key, "path": os.path.abspath(coll.path), "groups": coll.groups, "rows": n,
              "group_rows": list(coll.rows), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
              "modalities": sorted(features)}  # whose items it holds: a search's relevance told before it runs
    if ids is None:
        source["first_id"] = first_id(index, key)
        if source["first_id"] + n - 1 > np.iinfo(np.int64).max:  # before any row is recorded: they would wrap round
            raise DataError(f"{coll.path}: its {n} rows have no ids, and numbered after {out}'s largest id "
                            f"({source['first_id'] - 1}) they would pass the largest an id may be (2**63 - 1); give "
                            "them ids of their own, or build a new index (another -o)")
    if index is None:  # the collection is recorded from the start, so an interrupted first build is seen as unfinished
        if empty:
            os.rmdir(out)  # saved in its place (a save makes a folder of its own, atomically)
        index = Index(encoder.n_bits, {"checkpoint": encoder.identity, "features": features, "protocol": PROTOCOL})
        index.sources = [{**source, "done": 0}]
        index.save(out)
    done = next((int(s["done"]) for s in index.sources if s["key"] == key), 0)
    if done >= n:
        return BuildReport(index, {"img": 0, "txt": 0}, done, n, True, skipped=skipped)
    # an index built before items kept their origin stays without it (its columns are fixed)
    origins = {m: index.count(m) == 0 or index.has(m, "origin") for m in NAMES}
    check_same_columns(index, coll, embeddings, origins, out)
    if all(s["key"] != key for s in index.sources):  # announced before its first chunk (Index.unfinished)
        index.add_many({}, {**source, "done": 0})
    keep_img = np.ones(n, dtype=bool)  # an image is indexed once per id (all rows of a set without ids)
    if ids is not None:
        keep_img[:] = False
        keep_img[first_of_each_id(ids)] = True
    before = {m: index.count(m) for m in NAMES}
    number = next((i for i, s in enumerate(index.sources) if s["key"] == key), len(index.sources))
    bar = tqdm(total=n, initial=done, desc=f"index {os.path.basename(coll.path)}", unit="item", disable=not progress)
    try:
        return _add_chunks(index, coll, encoder, source, number, keep_img, ids, origins, embeddings, done, chunk_size,
                           stop_after, should_stop, bar, before, skipped)
    except (DataError, ValueError) as err:  # a refusal of this build's rows (a NaN, ...): the index as it was
        if created:
            shutil.rmtree(out, ignore_errors=True)
            if empty:
                os.makedirs(out, exist_ok=True)
        else:
            index.roll_back(counts_before, sources_before)
        raise DataError(f"{err} ({out}: {'not created' if created else 'left as it was before this build'})") from None
    finally:
        bar.close()


class OneImageAnId:
    """Rows sharing an id are one image, indexed once (its first row): each later row's image features are checked
    to be its first row's, as a dataset file's are (``ucmfh validate``), so that an id of another meaning (an
    album's) is refused rather than its images but one dropped. Checked chunk by chunk, as the build reads them;
    a resumed build checks the rows whose first row it has read."""

    def __init__(self, ids: np.ndarray) -> None:
        _, self.first, self.which = np.unique(ids, return_index=True, return_inverse=True)
        self.which = self.which.ravel()
        self.prints = np.zeros(len(self.first), dtype=np.uint64)
        self.seen = np.zeros(len(self.first), dtype=bool)
        self.ids = ids

    def check(self, image: np.ndarray, start: int, coll: Collection) -> None:
        """``image``: rows ``start`` on of the collection's image features."""
        prints = row_fingerprints(image, np.arange(image.shape[1]))
        which = self.which[start:start + len(image)]
        first = self.first[which] == np.arange(start, start + len(image))
        self.prints[which[first]], self.seen[which[first]] = prints[first], True
        other = np.flatnonzero(~first & self.seen[which] & (prints != self.prints[which]))
        if other.size:
            row = start + int(other[0])
            raise DataError(f"{coll.path}: {coll.where('image')}: rows {int(self.first[self.which[row]])} and {row} "
                            f"share id {self.ids[row]} but hold different image features; rows sharing an id are one "
                            "image, indexed once: give each image an id of its own")


def _add_chunks(index: Index, coll: Collection, encoder: Encoder, source: Dict[str, Any], number: int,
                keep_img: np.ndarray, ids: Optional[np.ndarray], origins: Dict[str, bool], embeddings: bool, done: int,
                chunk_size: int, stop_after: Optional[int], should_stop: Optional[Callable[[], Any]], bar: Any,
                before: Dict[str, int], skipped: Dict[str, str]) -> BuildReport:
    """:func:`build_index`'s chunks from row ``done`` on, each encoded, appended and committed with the build's
    progress."""
    n = len(coll)
    chunks, stopped = 0, False
    one_image = OneImageAnId(ids) if ids is not None and coll.has("image") else None
    for start in range(done, n, chunk_size):
        stop = min(start + chunk_size, n)
        items = {}
        chunk_ids = ids[start:stop] if ids is not None else None
        for modality, name in NAMES.items():
            if not coll.has(name):
                continue
            rows = keep_img[start:stop] if modality == "img" else np.ones(stop - start, dtype=bool)
            x = coll.read(name, start, stop)
            if modality == "img" and one_image is not None:
                one_image.check(x, start, coll)
            logits = encoder.encode(x[rows], modality)
            item: Dict[str, Any] = {"codes": as_words(logits, encoder.n_bits)}
            if chunk_ids is not None:
                item["ids"] = chunk_ids[rows]
            else:  # no ids: an item's id is its row in the build, after the ids the index held (first_id)
                item["ids"] = source["first_id"] + np.arange(start, stop, dtype=np.int64)[rows]
            if embeddings:
                item["embeddings"] = logits.astype(np.float16)
            if origins[modality]:
                item["origin"] = np.stack([np.full(int(rows.sum()), number, dtype=np.int64),
                                           np.arange(start, stop, dtype=np.int64)[rows]], axis=1)
            if coll.has("labels"):
                item["labels"] = coll.read("labels", start, stop)[rows].astype(np.uint8)  # checked 0/1
            for column, kind in (("text_raw", "txt"), ("paths", "img")):
                if modality == kind and coll.has(column):
                    values = coll.read(column, start, stop)
                    item["text" if column == "text_raw" else "paths"] = [v for v, r in zip(values, rows) if r]
            items[modality] = item
        index.add_many(items, {**source, "done": stop})
        bar.update(stop - start)
        chunks += 1
        if stop_after is not None and chunks >= stop_after and stop < n:
            break
        if should_stop is not None and should_stop() and stop < n:
            stopped = True
            break
    added = {m: index.count(m) - before[m] for m in NAMES}
    return BuildReport(index, added, done, n, False, stopped, skipped)
