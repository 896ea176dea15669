"""SEPS (docs/seps.md): the matcher of image and caption tokens (:mod:`ucmfh.seps.model`), its
training (:mod:`ucmfh.seps.fit`) and its scoring of pairs and databases (:mod:`ucmfh.seps.scoring`).

The usual names load on first use from here (``from ucmfh.seps import SEPS, fit_seps``)."""
from importlib import import_module
from typing import Any

_HOMES = {
    "SEPS": "model", "State": "model",
    "fit_seps": "fit", "build_model": "fit",
    "databases": "scoring", "database_scores": "scoring", "recall_rows": "scoring", "score_candidates": "scoring",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(f"ucmfh.seps.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'ucmfh.seps' has no attribute {name!r}")
