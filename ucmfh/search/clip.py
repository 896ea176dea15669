"""Raw captions and image files as queries, through the CLIP model an index's features came from.

Only an index whose features were made by ``ucmfh extract`` (root attribute
``CLIP <model> <modality> embedding (<d>-d[, L2-normalised])``) can encode raw
queries, and only with that model on this machine: nothing is downloaded.
"""
from __future__ import annotations

import re
from typing import List, Optional, Tuple

import numpy as np

from ucmfh.data.h5 import DataError
from ucmfh.search.collection import Queries
from ucmfh.search.folder import NAMES

_CLIP = re.compile(r"^CLIP (?P<model>.+) (?P<modality>image|text) embedding \((?P<dim>\d+)-d(?P<norm>, L2-normalised)?\)$")


def clip_model_of(feature: Optional[str]) -> Optional[Tuple[str, bool]]:
    """(model, normalised) of a feature description written by ``ucmfh extract``; None for any other."""
    match = _CLIP.match(feature or "")
    return None if match is None else (match.group("model"), match.group("norm") is not None)


def clip_queries(index, text: List[str], images: List[str], device: str = "cpu") -> Queries:
    """Queries of one kind (captions or image files) encoded by the index's CLIP model."""
    from ucmfh.data.clip_encoder import ClipEncoder, load_image

    modality = "txt" if text else "img"
    feature = (index.meta.get("features") or {}).get(modality)
    found = clip_model_of(feature)
    if found is None:
        raise DataError(f"{index.path}: its {NAMES[modality]} features were made by "
                        f"'{feature or 'an unrecorded extractor'}', not a CLIP model of 'ucmfh extract': "
                        f"raw {NAMES[modality]} queries cannot be encoded here; extract their features with "
                        f"that extractor and pass them with --queries")
    model, normalize = found
    encoder = ClipEncoder(model, device=device, normalize=normalize)
    if text:
        features = encoder.encode_texts(list(text))
        return Queries("txt", features.astype(np.float32), "--text", text=list(text), feature=feature)
    features = encoder.encode_images([load_image(p) for p in images])
    return Queries("img", features.astype(np.float32), "--image", paths=list(images), feature=feature)
