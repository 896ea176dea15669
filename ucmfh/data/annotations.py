"""What ``ucmfh extract`` is given besides the model (formats in docs/data.md): the images (a folder, or a
list file), the captions (TSV or JSON, several per image allowed) and the labels (TSV or JSON, with an
optional classes file that fixes the column order)."""
from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ucmfh.data.format import DataError, MissingFile
from ucmfh.data.input_files import read_lines, read_text
from ucmfh.files import PathLike

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def list_images(images: PathLike) -> Tuple[List[str], List[str]]:
    """Names and paths of the images: a folder (recursive, sorted) or a list file."""
    images = os.fspath(images)
    if os.path.isdir(images):
        def unreadable(err: OSError) -> None:  # a folder below it left out without a word, its images with it
            raise DataError(f"{err.filename}: cannot read this folder of IMAGES ({err.strerror or err})")

        names = []
        seen = set()
        # a linked folder is followed (its images were left out without a word), each real folder once (a link to a
        # folder above it would go round without end)
        for root, folders, files in os.walk(images, onerror=unreadable, followlinks=True):
            seen.add(os.path.realpath(root))
            folders[:] = [f for f in folders if os.path.realpath(os.path.join(root, f)) not in seen]
            for f in files:
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    names.append(os.path.relpath(os.path.join(root, f), images).replace(os.sep, "/"))
        names.sort()
        if not names:
            raise DataError(f"{images}: no image files ({', '.join(IMAGE_EXTENSIONS)})")
        return names, [os.path.join(images, n) for n in names]
    if not os.path.exists(images):
        raise MissingFile(f"{images}: no such file or folder")
    if images.lower().endswith(IMAGE_EXTENSIONS):  # read as a list of paths: 'line 1: not UTF-8 text'
        raise DataError(f"{images}: an image file; IMAGES is a folder of images or a text file listing their paths")
    base = os.path.dirname(os.path.abspath(images))
    names = read_lines(images)
    if not names:
        raise DataError(f"{images}: empty image list")
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise DataError(f"{images}: image {dup!r} listed twice")
    return names, [n if os.path.isabs(n) else os.path.join(base, n) for n in names]


def check_images_there(images: PathLike, names: Sequence[str], paths: Sequence[str]) -> None:
    """Every image a list file names is there (:class:`MissingFile` otherwise): such images were found once the
    model had loaded, as unreadable ones, and '--bad-images skip' left them out. (A merge reads none.)"""
    gone = [i for i, path in enumerate(paths) if not os.path.exists(path)]
    if gone:
        raise MissingFile(f"{os.fspath(images)}: {len(gone)} of its {len(names)} images are not there (first: "
                          f"{names[gone[0]]!r}); a relative path is read from the list's folder, "
                          f"{os.path.dirname(os.path.abspath(os.fspath(images)))}")


def _read_name_map(path: str, what: str) -> List[Tuple[str, object, int]]:
    """(image name, value, line/record number) from a TSV or JSON file."""
    entries: List[Tuple[str, object, int]] = []
    text = read_text(path)
    if path.lower().endswith(".json"):
        def once_each(pairs: List[Tuple[str, object]]) -> Dict[str, object]:
            # a key twice: JSON keeps its last value, and an image's first captions (or labels) were lost unsaid
            seen: Dict[str, object] = {}
            for key, value in pairs:
                if key in seen:
                    several = ", its captions as a list" if what == "caption" else ""
                    raise DataError(f"{path}: {key!r} is a key twice in one JSON object, which keeps only its last "
                                    f"value; give each image once{several}")
                seen[key] = value
            return seen

        try:
            data = json.loads(text, object_pairs_hook=once_each)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: not valid JSON ({err})") from None
        if what == "caption" and isinstance(data, dict) and isinstance(data.get("annotations"), list) \
                and isinstance(data.get("images"), list):  # COCO's captions_*.json: its records by image id
            files = {image.get("id"): image.get("file_name") for image in data["images"] if isinstance(image, dict)}
            for n, record in enumerate(data["annotations"], 1):
                if not isinstance(record, dict) or files.get(record.get("image_id")) is None:
                    raise DataError(f"{path}: annotations record {n}: expected an image_id of its images and a "
                                    "caption (COCO's captions layout)")
                entries.append((str(files[record["image_id"]]), record.get("caption"), n))
        elif isinstance(data, dict):
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
        for name, value, n in entries:  # \u0000: the file's text has none, its strings one
            if any("\x00" in text for text in (name, *(value if isinstance(value, list) else [value]))
                   if isinstance(text, str)):
                raise DataError(f"{path}: record {n}: a NUL character (\\u0000) in the {what} of {name!r}, which no "
                                "text of the features file can hold")
        return entries
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise DataError(f"{path}: line {n}: expected 'image_name<TAB>{what}'")
        fields = [field for field in line.split("\t") if field.strip()]  # tabs that align columns: no field
        if len(fields) > 2:  # another column's value became part of the caption (or a label), unsaid
            raise DataError(f"{path}: line {n}: {len(fields)} tab-separated fields; expected "
                            f"'image_name<TAB>{what}', the {what} without a tab")
        name, value = line.split("\t", 1)
        entries.append((name.strip(), value.strip("\t") if len(fields) == 2 else value, n))
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
        numbered = re.fullmatch(r"(.+)#\d+", name)  # Flickr8k's and Flickr30k's token files: 'image.jpg#2'
        if name not in index and numbered and numbered.group(1) in index:
            name = numbered.group(1)
        if name not in index:
            unknown.append(name)
            continue
        per_image[index[name]].extend(c.strip() for c in values)
    if unknown:
        other = next((name for name in unknown  # of another kind by its extension; a name without one is no hint
                      if os.path.splitext(name)[1] and not name.lower().endswith(IMAGE_EXTENSIONS)), None)
        kinds = "" if other is None else (f"; {other!r} is not listed as an image by its extension (images are "
                                          f"{', '.join(IMAGE_EXTENSIONS)}: convert it to one)")
        raise DataError(
            f"{path}: {len(unknown)} "
            + ("caption names an image that is" if len(unknown) == 1 else "captions name images that are")
            + " not in the image list "
            f"(first: {unknown[0]!r}); images and captions do not match{kinds}"
        )
    missing = [names[i] for i, caps in enumerate(per_image) if not caps]
    if missing:
        raise DataError(
            f"{path}: {len(missing)} of {len(names)} images {'has' if len(missing) == 1 else 'have'} no caption "
            f"(first: {missing[0]!r}); "
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
    listed = set(names)
    unknown = [name for name in entries if name not in listed]
    if unknown:  # its names became classes of no image (a header line's 'labels' too), as captions are refused
        raise DataError(f"{path}: {len(unknown)} of its lines "
                        + ("names an image that is" if len(unknown) == 1 else "name images that are")
                        + " not in the image list (first: "
                        f"{unknown[0]!r}, line/record {entries[unknown[0]][1]}); images and labels do not match")
    if classes is None:
        classes = sorted({v for value, _ in entries.values() for v in value})
        if not classes:
            raise DataError(f"{path}: no label names at all")
    column = {c: j for j, c in enumerate(classes)}
    labels = np.zeros((len(names), len(classes)), dtype=np.uint8)
    missing = [name for name in names if name not in entries]
    if missing:
        raise DataError(f"{path}: {len(missing)} {'image has' if len(missing) == 1 else 'images have'} no labels line "
                        f"(first: {missing[0]!r})")
    for i, name in enumerate(names):
        value, n = entries[name]
        for v in value:
            if v not in column:
                raise DataError(f"{path}: line/record {n}: unknown label {v!r} for {name!r} "
                                f"(known: {', '.join(classes[:10])}{', ...' if len(classes) > 10 else ''})")
            labels[i, column[v]] = 1
    return labels, list(classes)


