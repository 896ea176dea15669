"""A deterministic synthetic dataset in the ucmfh format, shaped like MIRFlickr-25K by default.

Each item has multi-hot labels drawn from a skewed class prior and a latent
vector: the mean of its classes' prototypes plus an item-specific part. The
image feature and the text feature are two *different* random non-linear
maps of that latent, each with its own noise, then L2-normalised as CLIP
features are. So image and text live in unrelated coordinate systems: an
untrained model's image codes say nothing about text codes (MAP near the
random-code MAP), and a trained one must learn the cross-modal alignment.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Dict

import numpy as np

from ucmfh.config import SettingError
from ucmfh.data.h5 import PathLike
from ucmfh.data.writer import write_dataset
from ucmfh.files import ATTR_STRINGS_MAX


@dataclass
class SyntheticSpec:
    """Sizes and difficulty of a synthetic dataset (MIRFlickr-shaped defaults, docs/reference.md §1).

    Checked on construction: a :class:`ValueError` names the field.
    """

    n_query: int = 2000
    n_retrieval: int = 18015
    n_train: int = 5000  # drawn from retrieval, as the field does
    n_classes: int = 24
    d_img: int = 512
    d_txt: int = 512
    d_latent: int = 64
    mean_extra_labels: float = 1.5  # labels per item = 1 + Poisson(this), capped
    item_scale: float = 1.0  # item-specific part of the latent, relative to the class part
    noise: float = 2.0  # modality-specific noise, relative to the signal
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "SyntheticSpec":
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise SettingError(f.name, f"{f.name} must be an integer, got {value!r}")
                if f.name != "seed" and value < 1:
                    raise SettingError(f.name, f"{f.name} must be at least 1, got {value}")
            elif isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value):
                raise SettingError(f.name, f"{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise SettingError(f.name, f"{f.name} must be >= 0, got {value}")
        if self.n_classes > ATTR_STRINGS_MAX:  # the file names every class in one attribute
            raise SettingError("n_classes", f"n_classes must be at most {ATTR_STRINGS_MAX} (the classes' names are "
                                            f"one HDF5 attribute), got {self.n_classes}")
        if self.n_train > self.n_retrieval:
            raise SettingError(("n_train", "n_retrieval"), f"n_train ({self.n_train}) must be at most n_retrieval "
                               f"({self.n_retrieval}): train is drawn from retrieval")
        return self


def _labels(rng: np.random.Generator, n: int, spec: SyntheticSpec) -> np.ndarray:
    prior = 1.0 / np.arange(1, spec.n_classes + 1) ** 0.8
    prior = rng.permutation(prior / prior.sum())
    counts = np.minimum(1 + rng.poisson(spec.mean_extra_labels, size=n), spec.n_classes)
    # Gumbel top-k: each row takes its `count` classes without replacement, by the prior
    keys = np.log(prior)[None, :] + rng.gumbel(size=(n, spec.n_classes))
    rank = np.argsort(np.argsort(-keys, axis=1), axis=1)
    return (rank < counts[:, None]).astype(np.uint8)


def _modality(rng: np.random.Generator, latent: np.ndarray, d_out: int, noise: float) -> np.ndarray:
    d_latent = latent.shape[1]
    hidden = np.tanh(latent @ rng.normal(size=(d_latent, 2 * d_latent)) / np.sqrt(d_latent) * 2.0)
    signal = hidden @ rng.normal(size=(2 * d_latent, d_out)) / np.sqrt(2 * d_latent)
    x = signal + noise * signal.std() * rng.normal(size=signal.shape)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_synthetic_arrays(spec: SyntheticSpec) -> Dict[str, Dict[str, np.ndarray]]:
    """The three splits as arrays; the same spec gives the same arrays on every machine."""
    spec.validate()  # again: a spec's fields may have been changed since it was made
    rng = np.random.default_rng(spec.seed)
    n = spec.n_query + spec.n_retrieval
    labels = _labels(rng, n, spec)
    prototypes = rng.normal(size=(spec.n_classes, spec.d_latent))
    class_part = labels @ prototypes / np.sqrt(labels.sum(axis=1, keepdims=True))
    latent = class_part + spec.item_scale * rng.normal(size=(n, spec.d_latent))
    image = _modality(rng, latent, spec.d_img, spec.noise)
    text = _modality(rng, latent, spec.d_txt, spec.noise)
    ids = np.arange(n, dtype=np.int64)
    order = rng.permutation(n)
    query, retrieval = order[: spec.n_query], np.sort(order[spec.n_query :])
    train = np.sort(rng.choice(retrieval, size=spec.n_train, replace=False))

    def take(index: np.ndarray) -> Dict[str, np.ndarray]:
        return {"image": image[index], "text": text[index], "labels": labels[index], "ids": ids[index]}

    return {"train": take(train), "query": take(np.sort(query)), "retrieval": take(retrieval)}


def make_synthetic(path: PathLike, spec: SyntheticSpec = SyntheticSpec(), overwrite: bool = False) -> str:
    """Write a synthetic dataset file (atomic) and return its path; an existing file is refused before the data
    are made (``FileExistsError``; ``overwrite`` replaces it)."""
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{os.fspath(path)}: exists; not replaced")
    attrs = {
        "name": "synthetic",
        "classes": [f"class{c:02d}" for c in range(spec.n_classes)],
        "image_feature": f"synthetic {spec.d_img}-d, random non-linear map of a class+item latent, L2-normalised",
        "text_feature": f"synthetic {spec.d_txt}-d, a different random non-linear map of the same latent, L2-normalised",
        "source": "ucmfh.data.synthetic " + repr(asdict(spec)),
        "split": f"seed {spec.seed}: query {spec.n_query} drawn at random, retrieval the rest, "
                 f"train {spec.n_train} drawn from retrieval",
    }
    return write_dataset(path, make_synthetic_arrays(spec), attrs, overwrite=overwrite)
