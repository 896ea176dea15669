"""CLIP features from images and captions into the ucmfh HDF5 format.

Inputs (formats in ``docs/data.md``):

* images: a folder (every image file below it, named by its path relative to
  the folder) or a list file (one path per line, relative to the list's folder);
* captions: TSV ``image_name<TAB>caption`` (one line per caption, several per
  image allowed) or JSON (``{"image_name": "caption" | ["caption", ...]}`` or
  ``[{"image": name, "caption": text}, ...]``);
* labels: TSV ``image_name<TAB>label,label,...`` or JSON
  ``{"image_name": ["label", ...]}``; class names from a classes file (one per
  line, which fixes the column order) or, without it, the sorted set of names.

Each caption is one output row; its ``ids`` entry is its image's index, so the
captions of one image share an id (positives of each other) and a split.

Work is done in chunks of items; each finished chunk is saved as a small
``.npz`` in a scratch folder beside the output (``OUT.parts/``), so an
interrupted run resumes without recomputing finished chunks. The scratch is
removed once the output file is written and validated.

Sharded extraction (clip-retrieval's independent partitions): shard ``i`` of
``n`` computes the chunks ``c`` with ``c % n == i`` into the same scratch folder
(a shared filesystem when the shards run on several machines), resumes its own
chunks, and marks itself done (``shard-I-of-N.done``); a merge writes the one
output file from the finished chunks and refuses, naming the shards, when any
chunk is missing. The merged file is the file an unsharded run writes.

With ``ExtractConfig.tokens`` (``ucmfh extract --tokens``) each split also gets the
token features of docs/reference.md §9: CLIP's image tokens ([CLS] and patches) stored once
per image with a virtual ``image_tokens`` over them, and the word tokens of each caption
in CSR form. They travel in the same chunk files and are written split by split from
them, one chunk in memory at a time.

The CLIP implementation is ``transformers`` (the ``extract`` extra).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import h5py
import numpy as np
from tqdm.auto import tqdm

from ucmfh.config import SettingError
from ucmfh.data.annotations import check_images_there, list_images, read_captions, read_labels
from ucmfh.data.clip_encoder import DEFAULT_MODEL, IMAGE_LOADING, ClipEncoder, load_image
from ucmfh.data.convert import empty_label_rows, read_classes, root_attrs
from ucmfh.data.h5 import SPLITS, DataError
from ucmfh.data.writer import create_split_dataset, make_folder, open_writer
from ucmfh.data.scratch import (
    RESTART, Scratch, Shard, chunks, fingerprint, gather_chunks, missing_chunks, run_chunks, wait_for_shards,
)
from ucmfh.data.splits import DEFAULT_SEED, SplitSizes, check_seed, sample_split
from ucmfh.files import PathLike, locked, write_attrs, write_text_atomic

log = logging.getLogger(__name__)

BAD_IMAGES = ("fail", "skip")
# remedies of refused input (DataError.remedy): the setting that would accept it
_SKIP_BAD = ("bad_images", "skip", "to leave such images out")


@dataclass
class ExtractConfig:
    """Settings of a feature extraction; the one home of their defaults."""

    model: str = DEFAULT_MODEL
    batch_size: int = 64
    chunk_items: int = 2048  # items per resumable chunk file
    device: Optional[str] = None  # None: cuda when available, else cpu
    normalize: bool = False  # L2-normalise features (UCMFH's release keeps them raw)
    bad_images: str = "fail"  # unreadable image: fail, or skip its captions
    workers: int = 4  # image-decoding threads
    keep_scratch: bool = False
    tokens: bool = False  # also store image and word tokens (docs/reference.md §9)

    def __post_init__(self) -> None:
        for name in ("batch_size", "chunk_items", "workers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.bad_images not in BAD_IMAGES:
            raise ValueError(f"bad_images must be one of {BAD_IMAGES}, got {self.bad_images!r}")


@dataclass
class ExtractReport:
    path: Optional[str]
    rows: Dict[str, int]
    n_images: int
    n_captions: int
    skipped_images: List[str] = field(default_factory=list)
    chunks_computed: int = 0
    chunks_reused: int = 0
    seconds: float = 0.0
    shard: Optional[Shard] = None  # set by a shard's run, whose path is None unless it merged
    duplicate_images: List[Tuple[str, str]] = field(default_factory=list)  # (image, the earlier image it copies)


# ---------------------------------------------------------------- tokens (docs/reference.md §9)

TEXT_CHUNK_ROWS = 1024  # text_tokens rows per HDF5 chunk, as the shared token files
WORDS_CHUNK_ROWS = 4096


def _spans(sorted_values: np.ndarray, start: int, stop: int) -> Tuple[int, int]:
    """The positions ``lo:hi`` of the values in ``[start, stop)`` of a sorted array."""
    lo, hi = np.searchsorted(sorted_values, [start, stop])
    return int(lo), int(hi)


def _gather_rows(offsets: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The CSR rows of ``items``, concatenated. Shape: offsets [n+1], items [k] -> [Σ lengths of items]."""
    starts, lengths = offsets[items], offsets[items + 1] - offsets[items]
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + shift


def _virtual_tokens(group: h5py.Group, n_items: int, image_row: np.ndarray, shape: Tuple[int, int]) -> None:
    """``image_tokens`` [N, T, C]: item i reads ``image_tokens_per_image[image_row[i]]`` (same file)."""
    store = group["image_tokens_per_image"]
    layout = h5py.VirtualLayout(shape=(n_items, *shape), dtype=np.float16)
    source = h5py.VirtualSource(".", store.name, shape=store.shape, dtype=np.float16)
    # one mapping per run of items on consecutive images; the captions of one image map one by one
    cuts = np.flatnonzero(np.diff(image_row) != 1) + 1
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, n_items]):
        layout[a:b] = source[int(image_row[a]) : int(image_row[a]) + (b - a)]
    group.create_virtual_dataset("image_tokens", layout, fillvalue=np.nan)


def _write_tokens(f: h5py.File, rows: Dict[str, np.ndarray], image_of: np.ndarray, names: Sequence[str],
                  captions: Sequence[str], scratch: Scratch, cfg: ExtractConfig) -> Tuple[int, int, int]:
    """Write every split's token datasets from the scratch chunks, one chunk in memory at a time.

    ``rows[s]`` are the split's caption rows (sorted, as :func:`sample_split` gives them); a split's
    images are the images of its captions, in image order. Returns (T, C_img, C_txt).
    """
    strings = h5py.string_dtype()
    images = {s: np.unique(image_of[r]) for s, r in rows.items()}  # sorted
    stores: Dict[str, h5py.Dataset] = {}
    shape = None
    for chunk, start, stop in chunks(len(names), cfg.chunk_items):
        spans = {s: _spans(images[s], start, stop) for s in SPLITS}
        if all(lo == hi for lo, hi in spans.values()):
            continue  # no image of any split (e.g. all unreadable)
        tokens = scratch.load_tokens("image", chunk, ["image"])["image"]  # [n, T, C]
        if shape is None:
            shape = tokens.shape[1:]
            for s in SPLITS:
                stores[s] = f[s].create_dataset("image_tokens_per_image", shape=(len(images[s]), *shape),
                                                dtype=np.float16, chunks=(1, *shape), compression="gzip",
                                                compression_opts=4)
        elif tokens.shape[1:] != shape:
            raise DataError(f"{scratch.path('image', chunk)}: image tokens of shape {tokens.shape[1:]}, but "
                            f"earlier chunks have {shape}; a damaged scratch chunk", remedy=RESTART)
        for s, (lo, hi) in spans.items():
            if hi > lo:
                stores[s][lo:hi] = tokens[images[s][lo:hi] - start]
    for s in SPLITS:
        image_row = np.searchsorted(images[s], image_of[rows[s]]).astype(np.int64)
        f[s].create_dataset("image_row", data=image_row)
        f[s].create_dataset("image_files", data=np.array([names[i] for i in images[s]], dtype=object),
                            dtype=strings)
        _virtual_tokens(f[s], len(rows[s]), image_row, shape)

    text_chunks = chunks(len(captions), cfg.chunk_items)
    lengths = np.concatenate([scratch.load_tokens("text", c, ["lengths"])["lengths"] for c, _, _ in text_chunks])
    if lengths.shape != (len(captions),) or (lengths < 0).any():
        raise DataError(f"{scratch.folder}: token counts of {lengths.shape} captions for {len(captions)}; "
                        "a damaged scratch folder", remedy=RESTART)
    offsets = {s: np.r_[0, np.cumsum(lengths[r])].astype(np.int64) for s, r in rows.items()}
    text_sets: Dict[str, Tuple[h5py.Dataset, h5py.Dataset]] = {}
    d_txt = None
    for chunk, start, stop in text_chunks:
        spans = {s: _spans(r, start, stop) for s, r in rows.items()}
        if d_txt is not None and all(lo == hi for lo, hi in spans.values()):
            continue  # captions of skipped images only
        part = scratch.load_tokens("text", chunk, ["text", "lengths", "words"])
        local = np.r_[0, np.cumsum(part["lengths"])]
        if local[-1] != len(part["text"]) or len(part["words"]) != len(part["text"]):
            raise DataError(f"{scratch.path('text', chunk)}: {len(part['text'])} token rows and "
                            f"{len(part['words'])} words for {local[-1]} counted; a damaged scratch chunk",
                            remedy=RESTART)
        if d_txt is None:
            d_txt = part["text"].shape[1]
            for s in SPLITS:
                n_rows = int(offsets[s][-1])
                gzip = dict(compression="gzip", compression_opts=4) if n_rows else {}
                text_sets[s] = (
                    f[s].create_dataset("text_tokens", shape=(n_rows, d_txt), dtype=np.float16,
                                        chunks=(min(TEXT_CHUNK_ROWS, n_rows), d_txt) if n_rows else None, **gzip),
                    f[s].create_dataset("text_words", shape=(n_rows,), dtype=strings,
                                        chunks=(min(WORDS_CHUNK_ROWS, n_rows),) if n_rows else None, **gzip))
        for s, (lo, hi) in spans.items():
            if hi > lo:
                take_rows = _gather_rows(local, rows[s][lo:hi] - start)
                a, b = offsets[s][lo], offsets[s][hi]
                if b == a:
                    continue  # captions without a real token
                text_sets[s][0][a:b] = part["text"][take_rows]
                text_sets[s][1][a:b] = part["words"][take_rows].astype(object)
    for s in rows:
        f[s].create_dataset("text_offsets", data=offsets[s])
    return shape[0], shape[1], d_txt


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"


def _token_attrs(describe: Callable[..., Dict[str, str]], model: str, n_image_tokens: int, d_img: int,
                 d_txt: int) -> Dict[str, object]:
    """The root attributes of a token run: what was stored, and how (as the shared token files say)."""
    described = describe(model, n_image_tokens, d_img, d_txt)
    return {
        "image_tokens": described["image_tokens"] + (
            ". Stored once per image: image_tokens_per_image [M,T,C] float16 (one image per chunk, gzip 4) "
            "with image_row [N] int64 (item i -> row image_row[i]) and image_files [M] (the image names); "
            "image_tokens [N,T,C] is an HDF5 virtual dataset (source '.', this file) over that store."),
        "text_tokens": described["text_tokens"] + " gzip 4, 1024-row chunks.",
        "image_tokens_cls": True,
        "tokens_build": "ucmfh extract --tokens (" + ", ".join(
            f"{package} {_version(package)}" for package in ("ucmfh", "transformers", "torch", "h5py")) + ")",
    }


# ---------------------------------------------------------------- main entry


@contextlib.contextmanager
def scratch_held(folder: str, shard: Optional[Shard]) -> Iterator[None]:
    """An extraction's hold on its scratch folder: alone (a run of every chunk, a merge), or beside the other
    shards (a shard's run). Another extraction of the same OUT started meanwhile is refused (:class:`DataError`):
    two wrote chunks into one folder, one's restart or end removed it under the other, and a file was written
    whose captions had another caption's features. (The lock is this machine's: shards of other machines share
    the folder unseen, as they are meant to.)"""
    out = folder[:-len(".parts")]
    make_folder(os.path.dirname(os.path.abspath(folder)), out)  # OUT's folder, where the lock is
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locked(folder, hidden=True, wait=False, shared=shard is not None))
        except BlockingIOError:
            raise DataError(f"{folder}: another extraction of {out} is under way now (in another process); let it "
                            "finish, or extract into another OUT") from None
        yield


def extract_features(
    images: PathLike,
    captions: PathLike,
    labels: PathLike,
    out: PathLike,
    *,
    sizes: SplitSizes,
    seed: int = DEFAULT_SEED,
    classes: Optional[PathLike] = None,
    config: Optional[ExtractConfig] = None,
    encoder=None,
    name: Optional[str] = None,
    empty_labels: str = "drop",
    restart: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    shard: Optional[Shard] = None,
    merge: bool = False,
    poll_seconds: float = 5.0,
    first_id: int = 0,
) -> ExtractReport:
    """Compute CLIP features of images and captions and write a dataset file.

    Sizes count images (all captions of an image go to the same split).
    ``encoder`` (anything with ``encode_images``/``encode_texts`` and ``name``)
    replaces the CLIP model built from ``config.model``. Resumes from the
    scratch folder ``OUT.parts`` unless ``restart``.

    ``shard=(i, n)``: compute only the chunks of shard ``i`` of ``n``, mark it done and
    write nothing (``report.path`` is None), unless ``merge``: then wait for the
    other shards and write the file. ``merge`` without ``shard``: write the file
    from the finished chunks, computing none.

    An item's id is its image's index among the images (a folder's sorted by name, a list file's in its order),
    plus ``first_id`` (a later batch of one
    collection, given ids of its own, is added to the same index). Images of equal features (the same
    picture under two names) are drawn together, into one split, and count once in the sizes: a copy in
    the query split of a training image would be a leak, which ``validate`` refuses. Each split keeps
    its captions (``text_raw``) and its images' files (``paths``, relative to the output's folder), which
    search results show.

    Raises ``DataError`` for the inputs, ``SettingError`` (a ValueError, its ``settings`` the sizes at fault) for
    split sizes more than the images give.
    """
    t0 = time.perf_counter()
    cfg = config or ExtractConfig()
    out = os.fspath(out)
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out}: exists; not replaced")
    if restart and (shard is not None or merge):
        raise ValueError(f"{out}.parts: restarting would discard the chunks of every shard; delete that folder "
                         "to start the shards over")
    check_seed(seed)
    if first_id < 0:
        raise ValueError(f"the first id must be >= 0, got {first_id}")
    names, paths = list_images(images)
    computing = shard is not None or not merge
    if computing:
        check_images_there(images, names, paths)
    if first_id + len(names) - 1 > np.iinfo(np.int64).max:  # ids are int64
        raise ValueError(f"the first id, {first_id}: the ids of {len(names)} images from it would not fit int64")
    caption_list, image_of = read_captions(captions, names)
    label_matrix, class_names = read_labels(labels, names, read_classes(classes) if classes else None)
    keep_image = empty_label_rows(label_matrix, os.fspath(labels), empty_labels, names)
    try:  # the split the sizes ask for, drawn now as if every image were readable: refused before any feature
        sample_split(len(caption_list), sizes, seed, ids=image_of, keep=keep_image[image_of])
    except SettingError as err:  # said as the sizes at fault: --query, --train, --retrieval
        raise SettingError(err.settings, f"{captions}: {err}") from None
    except ValueError as err:  # no image left to split
        raise DataError(f"{captions}: {err}") from None

    scratch_dir = out + ".parts"
    with scratch_held(scratch_dir, shard):  # another extraction of OUT meanwhile: refused (before the model loads)
        if encoder is None and computing:
            encoder = ClipEncoder(cfg.model, cfg.device, cfg.normalize)
        model_name = getattr(encoder, "name", None) or cfg.model
        if restart and os.path.islink(scratch_dir):  # rmtree's own words named neither the folder nor the flag
            raise DataError(f"{scratch_dir}: a link to a folder of chunks; a restart removes the chunks of a "
                            "folder, not a link's: delete them yourself to start over")
        if restart and os.path.isdir(scratch_dir):
            shutil.rmtree(scratch_dir)
        if cfg.tokens and computing and not all(hasattr(encoder, m) for m in ("encode_images_tokens",
                                                                               "encode_texts_tokens")):
            raise TypeError(f"encoder {model_name!r} has no encode_images_tokens/encode_texts_tokens: it cannot "
                            "extract tokens")
        # a token run's chunks hold more than a pooled run's: their scratch folders never mix; nor do chunks of an
        # earlier way of reading images. An image changed since its chunk was computed makes that chunk be computed
        # again (run_chunks' files): a merge, which reads no image, takes the shards' chunks as they are
        # paths as written ('./imgs/a.jpg' and 'imgs/a.jpg' are one), not resolved: shards of several machines
        # share them
        model_key, path_keys = os.path.normpath(model_name) if os.path.isdir(model_name) else model_name, \
            [os.path.normpath(path) for path in paths]
        tokens = ["tokens"] if cfg.tokens else []
        parts = {"model": fingerprint(model_key), "normalization": fingerprint(cfg.normalize),
                 "chunk size": fingerprint(cfg.chunk_items), "images": fingerprint(path_keys),
                 "captions": fingerprint(caption_list), "way of reading images": fingerprint(IMAGE_LOADING),
                 "tokens": fingerprint(tokens)}
        scratch = Scratch(scratch_dir, fingerprint(model_key, cfg.normalize, cfg.chunk_items, path_keys, caption_list,
                                                   IMAGE_LOADING, *tokens), out,
                          model=getattr(encoder, "digest", None) if computing else None, parts=parts)
        report = ExtractReport(path=out, rows={}, n_images=len(names), n_captions=len(caption_list), shard=shard)
        cut = encoder.cut_texts(caption_list) if computing and hasattr(encoder, "cut_texts") else []
        if cut:  # their features are of their first words alone, as CLIP's own are
            log.warning("%d of the %d captions are longer than the model's context of %d tokens, and are cut to it "
                        "(first: %r)", len(cut), len(caption_list), encoder.max_length, caption_list[cut[0]][:80])
        counts = {"image": len(names), "text": len(caption_list)}

        # each image made the model's input as it is read, where the encoder can (ClipEncoder.prepare_image)
        prepare = getattr(encoder, "prepare_image", None)

        def image_chunk(start: int, stop: int, bar: tqdm) -> tuple:
            feats, ok, tokens = [], np.ones(stop - start, dtype=bool), []
            with ThreadPoolExecutor(cfg.workers) as pool:
                for b in range(start, stop, cfg.batch_size):
                    batch_paths = paths[b : min(stop, b + cfg.batch_size)]
                    loaded = list(pool.map(lambda path: _try_load(path, prepare), batch_paths))
                    good = []
                    for i, (img, err) in enumerate(loaded):
                        if err is None:
                            good.append(img)
                            continue
                        if cfg.bad_images == "fail":
                            raise DataError(err, remedy=_SKIP_BAD)
                        log.warning("%s; skipped", err)
                        ok[b - start + i] = False
                    if good and cfg.tokens:
                        pooled, batch_tokens = encoder.encode_images_tokens(good)
                        feats.append(np.asarray(pooled, dtype=np.float32))
                        tokens.append(np.asarray(batch_tokens, dtype=np.float16))
                    elif good:
                        feats.append(np.asarray(encoder.encode_images(good), dtype=np.float32))
                    bar.update(len(batch_paths))
            d = feats[0].shape[1] if feats else 0
            full = np.full((stop - start, d), np.nan, dtype=np.float32)  # skipped rows never reach the output
            if feats:
                full[ok] = np.concatenate(feats)
            if not cfg.tokens:
                return full, ok
            # [n, T, C]; NaN rows for skipped images, (n, 0, 0) when none was readable
            shape = tokens[0].shape[1:] if tokens else (0, 0)
            full_tokens = np.full((stop - start, *shape), np.nan, dtype=np.float16)
            if tokens:
                full_tokens[ok] = np.concatenate(tokens)
            return full, ok, {"image": full_tokens}

        def text_chunk(start: int, stop: int, bar: tqdm) -> tuple:
            feats, rows, lengths, words = [], [], [], []
            for b in range(start, stop, cfg.batch_size):
                batch = caption_list[b : min(stop, b + cfg.batch_size)]
                if cfg.tokens:
                    pooled, batch_rows, batch_lengths, batch_words = encoder.encode_texts_tokens(batch)
                    rows.append(np.asarray(batch_rows, dtype=np.float16))
                    lengths.append(np.asarray(batch_lengths, dtype=np.int64))
                    words += batch_words
                else:
                    pooled = encoder.encode_texts(batch)
                feats.append(np.asarray(pooled, dtype=np.float32))
                bar.update(len(batch))
            if not cfg.tokens:
                return np.concatenate(feats), np.ones(stop - start, dtype=bool)
            return np.concatenate(feats), np.ones(stop - start, dtype=bool), {
                "text": np.concatenate(rows), "lengths": np.concatenate(lengths), "words": np.array(words, dtype=str)}

        if computing:
            total = sum(stop - start for n in counts.values() for _, start, stop in chunks(n, cfg.chunk_items, shard))
            desc = "extract" if shard is None else f"extract shard {shard[0]}/{shard[1]}"
            with tqdm(total=total, unit="item", desc=desc, disable=not progress) as bar:
                run_chunks("image", len(names), scratch, cfg.chunk_items, image_chunk, bar, report, shard,
                           files=lambda start, stop: file_states(paths[start:stop]), names=names)
                run_chunks("text", len(caption_list), scratch, cfg.chunk_items, text_chunk, bar, report, shard)
        if shard is not None:
            write_text_atomic(scratch.marker(shard), json.dumps(
                {"chunks_computed": report.chunks_computed, "chunks_reused": report.chunks_reused}))
            if not merge:
                report.path = None
                report.seconds = time.perf_counter() - t0
                return report
            wait_for_shards(scratch, shard[1], poll_seconds)
        missing_chunks(counts, scratch, cfg.chunk_items)
        # every chunk not computed by this process was reused: a merge's are the shards' (it computes none)
        report.chunks_reused = sum(len(chunks(n, cfg.chunk_items)) for n in counts.values()) - report.chunks_computed
        img_feats, img_ok = gather_chunks("image", len(names), scratch, cfg.chunk_items)
        txt_feats, _ = gather_chunks("text", len(caption_list), scratch, cfg.chunk_items)
        if img_feats.shape[1] == 0 or not img_ok.any():
            raise DataError(f"{images}: no readable image")
        report.skipped_images = [names[i] for i in np.flatnonzero(~img_ok)]
        if report.skipped_images and cfg.bad_images == "fail":  # chunks from an earlier run with skip
            raise DataError(f"{paths[np.flatnonzero(~img_ok)[0]]}: unreadable image (found by an earlier run)",
                            remedy=_SKIP_BAD)
        if report.skipped_images:
            log.warning("skipped %d unreadable images (first: %s)", len(report.skipped_images),
                        ", ".join(report.skipped_images[:10]))

        keep_rows = (keep_image & img_ok)[image_of]
        copy_of = first_copies(img_feats, img_ok)
        report.duplicate_images = [(names[i], names[j]) for i, j in enumerate(copy_of) if i != j]
        if report.duplicate_images:
            log.warning("%d images have the features of an earlier image (the same picture; first: %s), each drawn "
                        "into the split of the image it copies", len(report.duplicate_images),
                        " = ".join(report.duplicate_images[0]))
        try:
            index = sample_split(len(caption_list), sizes, seed, ids=copy_of[image_of], keep=keep_rows)
        except SettingError as err:
            copies = f" (the {len(report.duplicate_images)} copies of other images count once)" \
                if report.duplicate_images else ""
            raise SettingError(err.settings, f"{captions}: {err}{copies}") from None
        except ValueError as err:
            raise DataError(f"{captions}: {err}") from None
        rows = index.as_dict()
        attrs = root_attrs(
            out, name, class_names, len(class_names),
            f"CLIP {model_name} image embedding ({img_feats.shape[1]}-d{', L2-normalised' if cfg.normalize else ''})",
            f"CLIP {model_name} text embedding ({txt_feats.shape[1]}-d{', L2-normalised' if cfg.normalize else ''})",
            source=f"images={os.fspath(images)}; captions={os.fspath(captions)}; labels={os.fspath(labels)}",
            split_rule=index.rule,
        )
        here = os.path.dirname(os.path.abspath(out))  # a path relative to the file's folder: they move together
        relative = [os.path.relpath(os.path.abspath(path), here).replace(os.sep, "/") for path in paths]
        strings = h5py.string_dtype()
        size = sum(len(r) for r in rows.values()) * (4 * (img_feats.shape[1] + txt_feats.shape[1]) + 8
                                                     + len(class_names))
        # the pooled features' (tokens' checked as they are written)
        with open_writer(out, attrs, overwrite, size) as f:
            for s in SPLITS:
                r = rows[s]
                create_split_dataset(f, s, "image", (len(r), img_feats.shape[1]))[...] = img_feats[image_of[r]]
                create_split_dataset(f, s, "text", (len(r), txt_feats.shape[1]))[...] = txt_feats[r]
                create_split_dataset(f, s, "labels", (len(r), len(class_names)))[...] = label_matrix[image_of[r]]
                create_split_dataset(f, s, "ids", (len(r),))[...] = image_of[r] + first_id
                f[s].create_dataset("text_raw", data=np.array([caption_list[i] for i in r], dtype=object),
                                    dtype=strings)
                f[s].create_dataset("paths", data=np.array([relative[i] for i in image_of[r]], dtype=object),
                                    dtype=strings)
                report.rows[s] = len(r)
            if cfg.tokens:
                shapes = _write_tokens(f, rows, image_of, names, caption_list, scratch, cfg)
                write_attrs(f, _token_attrs(getattr(encoder, "describe_tokens", ClipEncoder.describe_tokens),
                                            model_name, *shapes))
        if not cfg.keep_scratch:
            shutil.rmtree(scratch_dir, ignore_errors=True)
        report.seconds = time.perf_counter() - t0
        return report


def first_copies(features: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Each image's first image of equal features (its own index where none comes before it; an unreadable
    image, ``ok`` False, its own). Shape: features [M, d], ok [M] -> [M] int64."""
    out = np.arange(len(features), dtype=np.int64)
    readable = np.flatnonzero(ok)
    if readable.size < 2:
        return out
    rows = np.ascontiguousarray(features[readable])
    _, first, inverse = np.unique(rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(),
                                  return_index=True, return_inverse=True)
    out[readable] = readable[first[inverse.ravel()]]
    return out


def file_states(paths: Sequence[str]) -> np.ndarray:
    """Each file's size and modification time (ns), [n, 2] int64, which change when it is replaced or edited;
    -1 where it cannot be read (said when it is loaded)."""
    out = np.full((len(paths), 2), -1, dtype=np.int64)
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out[i] = st.st_size, st.st_mtime_ns
    return out


def _try_load(path: str, prepare: Optional[Callable[[Any], Any]] = None):
    """An image read (and made the model's input by ``prepare``), or the error that names it."""
    try:
        image = load_image(path)
    except OSError as err:
        return None, str(err)
    return (image if prepare is None else prepare(image)), None
