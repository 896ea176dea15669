"""Distinct codes: how many codes a model gives the items of each side it is scored on. A model whose codes
collapsed to a few (DGCPN on Wiki: one code for every item at 16 bits) scores the level of a random order,
which a MAP alone does not tell from a weak model; so does one whose query codes collapsed, which ranks the
database one way for every query."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

Split = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


def distinct_codes(img: torch.Tensor, txt: torch.Tensor, ids: Optional[torch.Tensor] = None, *,
                   query: Optional[Split] = None, n_bits: Optional[int] = None) -> Dict[str, Any]:
    """How many distinct codes the retrieval split's items get, per modality, and of how many items (images: one
    per id): ``{"img": [codes, items], "txt": [codes, items], "n_bits": n}``; with ``query``, the query split's
    ``(img, txt, ids)`` codes, ``query_img`` and ``query_txt`` too. Shape: codes [N, n_bits] ±1, or packed
    ([N, bytes] uint8, with ``n_bits``)."""
    def count(img: torch.Tensor, txt: torch.Tensor, ids: Optional[torch.Tensor]) -> Tuple[list, list]:
        images = len(img) if ids is None else len(torch.unique(ids))
        return [len(torch.unique(img, dim=0)), images], [len(torch.unique(txt, dim=0)), len(txt)]

    out: Dict[str, Any] = dict(zip(("img", "txt"), count(img, txt, ids)))
    if query is not None:
        out.update(zip(("query_img", "query_txt"), count(*query)))
    out["n_bits"] = img.shape[1] if n_bits is None else int(n_bits)
    return out
