"""Distinct codes: how many codes a model gives the items of each side it is scored on. A model whose codes
collapsed to a few (DGCPN on Wiki: one code for every item at 16 bits) scores the level of a random order,
which a MAP alone does not tell from a weak model; so does one whose query codes collapsed, which ranks the
database one way for every query."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # torch is imported where codes are counted: reading results' verdicts needs none
    import torch

Split = Tuple["torch.Tensor", "torch.Tensor", Optional["torch.Tensor"]]
COLLAPSED = 0.01  # codes of at most this share of a side's items: a model whose codes collapsed
# the sides distinct_codes counts, as a warning names them
SIDES = {"img": "retrieval images", "txt": "retrieval texts", "query_img": "query images", "query_txt": "query texts"}


def distinct_codes(img: torch.Tensor, txt: torch.Tensor, ids: Optional[torch.Tensor] = None, *,
                   query: Optional[Split] = None, n_bits: Optional[int] = None) -> Dict[str, Any]:
    """How many distinct codes the retrieval split's items get, per modality, and of how many items (images: one
    per id): ``{"img": [codes, items], "txt": [codes, items], "n_bits": n}``; with ``query``, the query split's
    ``(img, txt, ids)`` codes, ``query_img`` and ``query_txt`` too. Shape: codes [N, n_bits] ±1, or packed
    ([N, bytes] uint8, with ``n_bits``)."""
    import torch

    def count(img: torch.Tensor, txt: torch.Tensor, ids: Optional[torch.Tensor]) -> Tuple[list, list]:
        images = len(img) if ids is None else len(torch.unique(ids))
        return [len(torch.unique(img, dim=0)), images], [len(torch.unique(txt, dim=0)), len(txt)]

    out: Dict[str, Any] = dict(zip(("img", "txt"), count(img, txt, ids)))
    if query is not None:
        out.update(zip(("query_img", "query_txt"), count(*query)))
    out["n_bits"] = img.shape[1] if n_bits is None else int(n_bits)
    return out


def collapsed(distinct: Dict[str, Any]) -> List[str]:
    """The sides (:data:`SIDES`: each split's modalities; an older row's, the retrieval split's alone) whose
    distinct codes are at most :data:`COLLAPSED` of what they could be: their items, or the codes of their length
    where those are fewer (8 bits: 256)."""
    space = 2 ** min(int(distinct.get("n_bits", 64)), 62)
    return [m for m in SIDES if m in distinct and distinct[m][0] < distinct[m][1]
            and distinct[m][0] <= max(1, COLLAPSED * min(distinct[m][1], space))]


def collapse_warning(distinct: Dict[str, Any], protocol: str) -> Optional[str]:
    """The line that says a row's codes collapsed (:func:`collapsed`), or None."""
    few = collapsed(distinct)
    if not few:
        return None
    counts = ", ".join(f"{SIDES[m]} {distinct[m][0]} for {distinct[m][1]} items" for m in few)
    return (f"warning: collapsed codes ({protocol}): distinct codes of the {counts}; its scores are those of a "
            "near-random order, not of a weak ranking")
