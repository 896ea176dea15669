"""A finished run's epoch history, read from its checkpoint (``ucmfh runs --history RUN``): each epoch's
loss and validation score, the epoch validation kept, the candidate it chose and the refit."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Tuple

from ucmfh.app.runs import the_checkpoint
from ucmfh.checkpoint import read_checkpoint


def history_of(run: str, rows: Iterable[Dict[str, Any]], where: str) -> Tuple[str, Dict[str, Any]]:
    """The checkpoint of ``run`` — a checkpoint's path, or a run key as ``ucmfh runs --json`` and the results
    rows give it (a unique prefix will do) — and the history it holds; ``ValueError`` naming what is wrong."""
    if os.path.isfile(run):
        path = run
    else:
        matching = [r for r in rows if str(r.get("run", "")).startswith(run)]
        if not matching:
            raise ValueError(f"{run}: neither a checkpoint file nor a run of {where}")
        keys = sorted({r["run"] for r in matching})
        if len(keys) > 1:
            raise ValueError(f"{run}: {len(keys)} runs of {where} start so ({', '.join(keys[:3])}"
                             f"{', ...' if len(keys) > 3 else ''}); give more of the key")
        path = the_checkpoint(matching, where)
    meta = read_checkpoint(path).get("meta", {})
    if "history" not in meta:
        raise ValueError(f"{path}: holds no training history (a checkpoint written by hand, or fitted in closed "
                         "form with no epochs)")
    return path, meta["history"]


def history_rows(history: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per epoch trained: ``part`` ('' for the run, 'refit' for the refit), ``epoch`` (from 1),
    ``loss``, ``validation`` (None where not validated) and ``kept`` (the epoch validation kept)."""
    scores = {int(epoch): score for epoch, score in history.get("validation") or []}
    best = history.get("best_epoch")
    rows = [{"part": "", "epoch": i, "loss": loss, "validation": scores.get(i), "kept": i == best}
            for i, loss in enumerate(history.get("loss") or [], 1)]
    rows += [{"part": "refit", "epoch": i, "loss": loss, "validation": None, "kept": False}
             for i, loss in enumerate(history.get("refit_loss") or [], 1)]
    return rows


def format_history(path: str, history: Dict[str, Any]) -> str:
    """The history as a table, after a line saying what validation chose."""
    rows = history_rows(history)
    trained = sum(1 for r in rows if not r["part"])
    head = [f"{path}: {trained} epochs"]
    if history.get("best_epoch") is not None:
        head.append(f"validation kept epoch {history['best_epoch']}")
    if history.get("chosen"):
        scores = ", ".join(f"{name} {score:.4f}" for name, score in (history.get("choice_scores") or {}).items())
        head.append(f"chose {history['chosen']}" + (f" ({scores})" if scores else ""))
    if history.get("refit_epochs") is not None:
        head.append(f"then refit for {history['refit_epochs']} epochs on the whole training split")
    lines = ["; ".join(head), f"{'part':<6} {'epoch':>5} {'loss':>10} {'validation':>10}"]
    for r in rows:
        val = "-" if r["validation"] is None else f"{r['validation']:.4f}"
        lines.append(f"{r['part'] or 'run':<6} {r['epoch']:>5} {r['loss']:>10.4f} {val:>10}"
                     + ("  kept" if r["kept"] else ""))
    return "\n".join(lines)
