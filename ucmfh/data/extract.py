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

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np
import torch
from tqdm.auto import tqdm

from ucmfh.data.convert import empty_label_rows, read_classes, root_attrs
from ucmfh.data.h5 import SPLITS, DataError, create_split_dataset, make_folder, open_writer
from ucmfh.data.inputs import npz_member, open_npz, read_lines, read_text
from ucmfh.data.splits import DEFAULT_SEED, SplitSizes, check_seed, sample_split
from ucmfh.files import PathLike, atomic_file, write_attrs, write_text_atomic
from ucmfh.utils import resolve_device

log = logging.getLogger(__name__)

DEFAULT_MODEL = "openai/clip-vit-base-patch32"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
BAD_IMAGES = ("fail", "skip")
# remedies of refused input (DataError.remedy): the setting that would accept it
_SKIP_BAD = ("bad_images", "skip", "to leave such images out")
_RESTART = ("restart", True, "to discard it and start over")

Shard = Tuple[int, int]  # (index, count): a process that computes the chunks c with c % count == index


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


# ---------------------------------------------------------------- inputs


def list_images(images: PathLike) -> Tuple[List[str], List[str]]:
    """Names and paths of the images: a folder (recursive, sorted) or a list file."""
    images = os.fspath(images)
    if os.path.isdir(images):
        names = []
        for root, _, files in os.walk(images):
            for f in files:
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    names.append(os.path.relpath(os.path.join(root, f), images).replace(os.sep, "/"))
        names.sort()
        if not names:
            raise DataError(f"{images}: no image files ({', '.join(IMAGE_EXTENSIONS)})")
        return names, [os.path.join(images, n) for n in names]
    if not os.path.exists(images):
        raise DataError(f"{images}: no such file or folder")
    base = os.path.dirname(os.path.abspath(images))
    names = read_lines(images)
    if not names:
        raise DataError(f"{images}: empty image list")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{images}: image {dup!r} listed twice")
    return names, [n if os.path.isabs(n) else os.path.join(base, n) for n in names]


def _read_name_map(path: str, what: str) -> List[Tuple[str, object, int]]:
    """(image name, value, line/record number) from a TSV or JSON file."""
    entries: List[Tuple[str, object, int]] = []
    text = read_text(path)
    if path.lower().endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: not valid JSON ({err})") from None
        if isinstance(data, dict):
            for n, (name, value) in enumerate(data.items(), 1):
                entries.append((name, value, n))
        elif isinstance(data, list):
            key = "caption" if what == "caption" else "labels"
            for n, record in enumerate(data, 1):
                if not isinstance(record, dict) or "image" not in record or key not in record:
                    raise DataError(f"{path}: record {n}: expected {{\"image\": ..., \"{key}\": ...}}")
                entries.append((str(record["image"]), record[key], n))
        else:
            raise DataError(f"{path}: expected a JSON object or list of records")
        return entries
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise DataError(f"{path}: line {n}: expected 'image_name<TAB>{what}'")
        name, value = line.split("\t", 1)
        entries.append((name.strip(), value, n))
    if not entries:
        raise DataError(f"{path}: no entries")
    return entries


def read_captions(path: PathLike, names: Sequence[str]) -> Tuple[List[str], np.ndarray]:
    """Captions and the index of each one's image, in image order then file order.

    Every image needs at least one caption and every caption a known image.
    """
    path = os.fspath(path)
    index = {name: i for i, name in enumerate(names)}
    per_image: List[List[str]] = [[] for _ in names]
    unknown = []
    for name, value, n in _read_name_map(path, "caption"):
        values = value if isinstance(value, list) else [value]
        for caption in values:
            if not isinstance(caption, str) or not caption.strip():
                raise DataError(f"{path}: line/record {n}: empty or non-text caption for {name!r}")
        if name not in index:
            unknown.append(name)
            continue
        per_image[index[name]].extend(c.strip() for c in values)
    if unknown:
        raise DataError(
            f"{path}: {len(unknown)} captions name images that are not in the image list "
            f"(first: {unknown[0]!r}); images and captions do not match"
        )
    missing = [names[i] for i, caps in enumerate(per_image) if not caps]
    if missing:
        raise DataError(
            f"{path}: {len(missing)} of {len(names)} images have no caption (first: {missing[0]!r}); "
            "images and captions do not match"
        )
    captions = [c for caps in per_image for c in caps]
    image_of = np.repeat(np.arange(len(names), dtype=np.int64), [len(c) for c in per_image])
    return captions, image_of


def read_labels(path: PathLike, names: Sequence[str], classes: Optional[Sequence[str]] = None
                ) -> Tuple[np.ndarray, List[str]]:
    """Multi-hot labels [n_images, C] of the named images, and the class names.

    Unknown label names (not in ``classes``) and images without a line fail.
    """
    path = os.fspath(path)
    entries = {}
    for name, value, n in _read_name_map(path, "labels"):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DataError(f"{path}: line/record {n}: labels of {name!r} must be names")
        if name in entries:
            raise DataError(f"{path}: line/record {n}: {name!r} appears twice")
        entries[name] = (value, n)
    if classes is None:
        classes = sorted({v for value, _ in entries.values() for v in value})
        if not classes:
            raise DataError(f"{path}: no label names at all")
    column = {c: j for j, c in enumerate(classes)}
    labels = np.zeros((len(names), len(classes)), dtype=np.uint8)
    missing = [name for name in names if name not in entries]
    if missing:
        raise DataError(f"{path}: {len(missing)} images have no labels line (first: {missing[0]!r})")
    for i, name in enumerate(names):
        value, n = entries[name]
        for v in value:
            if v not in column:
                raise DataError(f"{path}: line/record {n}: unknown label {v!r} for {name!r} "
                                f"(known: {', '.join(classes[:10])}{', ...' if len(classes) > 10 else ''})")
            labels[i, column[v]] = 1
    return labels, list(classes)


# ---------------------------------------------------------------- encoder


def _looks_like_path(model: str) -> bool:
    """A hub name is ``name`` or ``owner/name``; anything else can only be meant as a folder."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if model.startswith((".", "~", "/", os.sep)) or model.endswith(("/", os.sep)):
        return True
    try:
        validate_repo_id(model)
    except HFValidationError:
        return True
    return False


def find_model(model: str) -> str:
    """``model`` when it is on this machine: a local folder, or a hub name in the local Hugging Face cache.

    Nothing is ever downloaded; a model that is not here is a
    :class:`FileNotFoundError` naming it.
    """
    if os.path.exists(model):
        if not os.path.isdir(model):
            raise NotADirectoryError(f"{model}: not a model folder (it is a file)")
        return model
    if _looks_like_path(model):
        raise FileNotFoundError(f"{model}: no such local model folder")
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise FileNotFoundError(
            f"{model}: not found locally (no such folder, and not in the local Hugging Face cache); "
            "extraction does not download models: download it once on a machine with network access "
            f"(`hf download {model}`) or pass a folder written by save_pretrained"
        )
    return model


class ClipEncoder:
    """CLIP image and text embeddings (projected) from ``transformers``, offline.

    ``model`` is a local folder written by ``save_pretrained`` holding the
    model, tokenizer and image processor, or a Hugging Face model name (e.g.
    ``openai/clip-vit-base-patch32``) already in the local Hugging Face cache.
    Nothing is downloaded (:func:`find_model`).
    """

    def __init__(self, model: str = DEFAULT_MODEL, device: Optional[str] = None, normalize: bool = False):
        try:
            from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel
        except ImportError as err:
            raise ImportError(
                "feature extraction needs transformers: pip install 'ucmfh[extract]'"
            ) from err
        self.device = resolve_device(device or "auto")  # ValueError naming the device
        find_model(model)
        try:
            self.model = CLIPModel.from_pretrained(model, local_files_only=True).eval().to(self.device)
            self.tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
            self.processor = AutoImageProcessor.from_pretrained(model, local_files_only=True)
        except (OSError, ValueError, KeyError) as err:  # files missing or of another kind of model
            raise DataError(f"{model}: not a complete CLIP model (model, tokenizer and image processor): "
                            f"{type(err).__name__}: {err}") from None
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.normalize = normalize
        self.name = model

    def _finish(self, x: torch.Tensor) -> np.ndarray:
        if self.normalize:
            x = torch.nn.functional.normalize(x, dim=-1)
        return x.float().cpu().numpy()

    @torch.inference_mode()
    def encode_images(self, images: list) -> np.ndarray:
        """[B] PIL images → [B, d] float32."""
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return self._finish(self.model.visual_projection(pooled))

    @torch.inference_mode()
    def encode_texts(self, texts: List[str]) -> np.ndarray:
        """[B] strings → [B, d] float32 (truncated to the model's context length)."""
        tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(self.device)
        pooled = self.model.text_model(input_ids=tokens["input_ids"],
                                       attention_mask=tokens["attention_mask"]).pooler_output
        return self._finish(self.model.text_projection(pooled))

    @torch.inference_mode()
    def encode_images_tokens(self, images: list) -> Tuple[np.ndarray, np.ndarray]:
        """[B] PIL images → the pooled [B, d] float32 of :meth:`encode_images` and the tokens [B, T, C] float16.

        The tokens are the vision tower's last hidden state after its post-layernorm, not projected:
        token 0 is [CLS] (post-layernorm [CLS] is CLIP's pooled output), tokens 1.. the patches row by row.
        """
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
        vision = self.model.vision_model(pixel_values=pixels)
        tokens = self.model.vision_model.post_layernorm(vision.last_hidden_state)
        pooled = self._finish(self.model.visual_projection(vision.pooler_output))
        return pooled, tokens.to(torch.float16).cpu().numpy()

    @torch.inference_mode()
    def encode_texts_tokens(self, texts: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[str]]:
        """[B] strings → the pooled [B, d] float32 of :meth:`encode_texts`, the word tokens [ΣL, C] float16,
        their count per text [B] int64 and the token string of each row [ΣL].

        The rows are the text tower's last hidden state (after its final layernorm, not projected) at the
        real tokens only: no start/end token, no padding. CLIP's attention is causal, so padding a batch
        changes none of them.
        """
        tokens = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                return_special_tokens_mask=True, return_tensors="pt")
        text = self.model.text_model(input_ids=tokens["input_ids"].to(self.device),
                                     attention_mask=tokens["attention_mask"].to(self.device))
        real = tokens["attention_mask"].bool() & ~tokens["special_tokens_mask"].bool()  # [B, L_max]
        rows = text.last_hidden_state[real.to(self.device)]  # row-major: text by text, in order
        words = self.tokenizer.convert_ids_to_tokens(tokens["input_ids"][real].tolist())
        pooled = self._finish(self.model.text_projection(text.pooler_output))
        return pooled, rows.to(torch.float16).cpu().numpy(), real.sum(dim=1).numpy().astype(np.int64), words

    @staticmethod
    def describe_tokens(model: str, n_image_tokens: int, d_img: int, d_txt: int) -> Dict[str, str]:
        """What :meth:`encode_images_tokens` and :meth:`encode_texts_tokens` compute, for the root attributes."""
        grid = int(round((n_image_tokens - 1) ** 0.5))
        patches = f"the {grid}x{grid} patches row by row" if grid * grid == n_image_tokens - 1 else "the patches"
        return {
            "image_tokens": (
                f"image_tokens [N,{n_image_tokens},{d_img}] float16: CLIP {model} vision tower (transformers "
                f"CLIPModel.vision_model), last hidden state after post_layernorm, all {n_image_tokens} tokens: "
                f"token 0 = [CLS] (root attribute image_tokens_cls), tokens 1..{n_image_tokens - 1} = {patches}; "
                f"NOT projected (the tower's width {d_img}; visual_projection of token 0 is the pooled image "
                "feature before any normalisation), NOT normalised, cast to float16 from the model's float32"),
            "text_tokens": (
                f"text_tokens [sumL,{d_txt}] float16: CLIP {model} text tower (CLIPModel.text_model), last "
                "hidden state (after final_layer_norm) of each caption, batched with padding (causal attention: "
                "padding changes no real token), truncated to the model's context length; rows of the real "
                "tokens only (start token, end token and padding dropped), NOT projected, NOT normalised, cast "
                "to float16. CSR: item i owns rows text_offsets[i]:text_offsets[i+1] (text_offsets [N+1] "
                "int64). text_words [sumL] UTF-8: the tokenizer's token string of each row (CLIP BPE, '</w>' "
                "ends a word). text_raw [N] UTF-8: the caption encoded."),
        }


def load_image(path: str):
    """An RGB PIL image, decoded in full; raises OSError for unreadable or truncated files."""
    from PIL import Image, ImageFile

    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # someone allowed truncated images globally; a half-grey image must not become a feature
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set; unset it for extraction")
    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise OSError(f"{path}: unreadable image ({type(err).__name__}: {err})") from None


# ---------------------------------------------------------------- chunks


def parse_shard(text: str) -> Shard:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"shard {text!r}: needs 0 <= I < N")
    return index, count


def _fingerprint(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


class _Scratch:
    """Finished chunks as ``kind-NNNNNN.npz`` files, each written atomically."""

    def __init__(self, folder: str, fingerprint: str, out: str):
        self.folder = folder
        make_folder(folder, out)
        manifest = os.path.join(folder, "manifest.json")
        if not os.path.exists(manifest):
            # shards may start together, on several machines: the first complete manifest linked wins
            mine = f"{manifest}.{socket.gethostname()}.{os.getpid()}"
            write_text_atomic(mine, json.dumps({"fingerprint": fingerprint}))
            try:
                os.link(mine, manifest)
            except FileExistsError:
                pass
            finally:
                os.remove(mine)
        try:
            old = json.loads(read_text(manifest)).get("fingerprint")
        except (ValueError, AttributeError):  # not JSON, or not an object
            raise DataError(f"{manifest}: unreadable scratch manifest", remedy=_RESTART) from None
        if old != fingerprint:
            raise DataError(f"{folder}: scratch of a different extraction (other inputs, model or settings)",
                            remedy=_RESTART)

    def path(self, kind: str, chunk: int) -> str:
        return os.path.join(self.folder, f"{kind}-{chunk:06d}.npz")

    def done(self, kind: str, chunk: int) -> bool:
        return os.path.exists(self.path(kind, chunk))

    def save(self, kind: str, chunk: int, features: np.ndarray, ok: np.ndarray,
             tokens: Optional[Dict[str, np.ndarray]] = None) -> None:
        """One chunk: pooled ``features``, ``ok`` rows and, in a token run, its token arrays (one file)."""
        with atomic_file(self.path(kind, chunk)) as tmp, open(tmp, "wb") as f:
            # a file object: savez would add ".npz" to a name
            np.savez(f, features=features, ok=ok, **{f"tokens_{k}": v for k, v in (tokens or {}).items()})

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
            raise DataError(f"{err}; a damaged scratch chunk", remedy=_RESTART) from None

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
            raise DataError(f"{err}; a damaged scratch chunk", remedy=_RESTART) from None


def _chunks(n_items: int, cfg: ExtractConfig, shard: Optional[Shard] = None) -> List[Tuple[int, int, int]]:
    """``(chunk, start, stop)`` of every chunk, or of the chunks of ``shard``."""
    every = [(c, start, min(n_items, start + cfg.chunk_items))
             for c, start in enumerate(range(0, n_items, cfg.chunk_items))]
    return every if shard is None else [t for t in every if t[0] % shard[1] == shard[0]]


def _run_chunks(
    kind: str,
    n_items: int,
    scratch: _Scratch,
    cfg: ExtractConfig,
    compute: Callable[[int, int, tqdm], tuple],
    bar: tqdm,
    report: ExtractReport,
    shard: Optional[Shard] = None,
) -> None:
    """Compute every chunk (of ``shard``) that has no file yet; ``compute`` advances the bar per batch."""
    for chunk, start, stop in _chunks(n_items, cfg, shard):
        if scratch.done(kind, chunk):
            report.chunks_reused += 1
            bar.update(stop - start)
        else:
            scratch.save(kind, chunk, *compute(start, stop, bar))  # features, ok[, tokens]
            report.chunks_computed += 1


def _missing_chunks(counts: Dict[str, int], scratch: _Scratch, cfg: ExtractConfig) -> None:
    """Refuse a merge while any chunk has no file, naming the shards that owe one."""
    missing = {kind: [c for c, _, _ in _chunks(n, cfg) if not scratch.done(kind, c)] for kind, n in counts.items()}
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


def _wait_for_shards(scratch: _Scratch, count: int, poll_seconds: float) -> None:
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


def _gather(kind: str, n_items: int, scratch: _Scratch, cfg: ExtractConfig) -> Tuple[np.ndarray, np.ndarray]:
    parts = [scratch.load(kind, c) for c, _, _ in _chunks(n_items, cfg)]
    d = max(p[0].shape[1] for p in parts)
    # a chunk whose images were all unreadable has no columns: NaN rows, never used
    feats = [p[0] if p[0].shape[1] == d else np.full((len(p[1]), d), np.nan, np.float32) for p in parts]
    return np.concatenate(feats), np.concatenate([p[1] for p in parts])


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
                  captions: Sequence[str], scratch: _Scratch, cfg: ExtractConfig) -> Tuple[int, int, int]:
    """Write every split's token datasets from the scratch chunks, one chunk in memory at a time.

    ``rows[s]`` are the split's caption rows (sorted, as :func:`sample_split` gives them); a split's
    images are the images of its captions, in image order. Returns (T, C_img, C_txt).
    """
    strings = h5py.string_dtype()
    images = {s: np.unique(image_of[r]) for s, r in rows.items()}  # sorted
    stores: Dict[str, h5py.Dataset] = {}
    shape = None
    for chunk, start, stop in _chunks(len(names), cfg):
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
                            f"earlier chunks have {shape}; a damaged scratch chunk", remedy=_RESTART)
        for s, (lo, hi) in spans.items():
            if hi > lo:
                stores[s][lo:hi] = tokens[images[s][lo:hi] - start]
    for s in SPLITS:
        image_row = np.searchsorted(images[s], image_of[rows[s]]).astype(np.int64)
        f[s].create_dataset("image_row", data=image_row)
        f[s].create_dataset("image_files", data=np.array([names[i] for i in images[s]], dtype=object),
                            dtype=strings)
        _virtual_tokens(f[s], len(rows[s]), image_row, shape)

    text_chunks = _chunks(len(captions), cfg)
    lengths = np.concatenate([scratch.load_tokens("text", c, ["lengths"])["lengths"] for c, _, _ in text_chunks])
    if lengths.shape != (len(captions),) or (lengths < 0).any():
        raise DataError(f"{scratch.folder}: token counts of {lengths.shape} captions for {len(captions)}; "
                        "a damaged scratch folder", remedy=_RESTART)
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
                            remedy=_RESTART)
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
    for s, r in rows.items():
        f[s].create_dataset("text_offsets", data=offsets[s])
        f[s].create_dataset("text_raw", data=np.array([captions[i] for i in r], dtype=object), dtype=strings)
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
    names, paths = list_images(images)
    caption_list, image_of = read_captions(captions, names)
    label_matrix, class_names = read_labels(labels, names, read_classes(classes) if classes else None)
    keep_image = empty_label_rows(label_matrix, os.fspath(labels), empty_labels)

    computing = shard is not None or not merge
    if encoder is None and computing:
        encoder = ClipEncoder(cfg.model, cfg.device, cfg.normalize)
    model_name = getattr(encoder, "name", None) or cfg.model
    scratch_dir = out + ".parts"
    if restart and os.path.isdir(scratch_dir):
        shutil.rmtree(scratch_dir)
    if cfg.tokens and computing and not all(hasattr(encoder, m) for m in ("encode_images_tokens",
                                                                           "encode_texts_tokens")):
        raise TypeError(f"encoder {model_name!r} has no encode_images_tokens/encode_texts_tokens: it cannot "
                        "extract tokens")
    # a token run's chunks hold more than a pooled run's: their scratch folders never mix
    scratch = _Scratch(scratch_dir, _fingerprint(model_name, cfg.normalize, cfg.chunk_items, paths, caption_list,
                                                 *(["tokens"] if cfg.tokens else [])), out)
    report = ExtractReport(path=out, rows={}, n_images=len(names), n_captions=len(caption_list), shard=shard)
    counts = {"image": len(names), "text": len(caption_list)}

    def image_chunk(start: int, stop: int, bar: tqdm) -> tuple:
        feats, ok, tokens = [], np.ones(stop - start, dtype=bool), []
        with ThreadPoolExecutor(cfg.workers) as pool:
            for b in range(start, stop, cfg.batch_size):
                batch_paths = paths[b : min(stop, b + cfg.batch_size)]
                loaded = list(pool.map(_try_load, batch_paths))
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
        total = sum(stop - start for n in counts.values() for _, start, stop in _chunks(n, cfg, shard))
        desc = "extract" if shard is None else f"extract shard {shard[0]}/{shard[1]}"
        with tqdm(total=total, unit="item", desc=desc, disable=not progress) as bar:
            _run_chunks("image", len(names), scratch, cfg, image_chunk, bar, report, shard)
            _run_chunks("text", len(caption_list), scratch, cfg, text_chunk, bar, report, shard)
    if shard is not None:
        write_text_atomic(scratch.marker(shard), json.dumps(
            {"chunks_computed": report.chunks_computed, "chunks_reused": report.chunks_reused}))
        if not merge:
            report.path = None
            report.seconds = time.perf_counter() - t0
            return report
        _wait_for_shards(scratch, shard[1], poll_seconds)
    _missing_chunks(counts, scratch, cfg)
    img_feats, img_ok = _gather("image", len(names), scratch, cfg)
    txt_feats, _ = _gather("text", len(caption_list), scratch, cfg)
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
    try:
        index = sample_split(len(caption_list), sizes, seed, ids=image_of, keep=keep_rows)
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
    with open_writer(out, attrs, overwrite) as f:
        for s in SPLITS:
            r = rows[s]
            create_split_dataset(f, s, "image", (len(r), img_feats.shape[1]))[...] = img_feats[image_of[r]]
            create_split_dataset(f, s, "text", (len(r), txt_feats.shape[1]))[...] = txt_feats[r]
            create_split_dataset(f, s, "labels", (len(r), len(class_names)))[...] = label_matrix[image_of[r]]
            create_split_dataset(f, s, "ids", (len(r),))[...] = image_of[r]
            report.rows[s] = len(r)
        if cfg.tokens:
            shapes = _write_tokens(f, rows, image_of, names, caption_list, scratch, cfg)
            write_attrs(f, _token_attrs(getattr(encoder, "describe_tokens", ClipEncoder.describe_tokens),
                                        model_name, *shapes))
    if not cfg.keep_scratch:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    report.seconds = time.perf_counter() - t0
    return report


def _try_load(path: str):
    try:
        return load_image(path), None
    except OSError as err:
        return None, str(err)
