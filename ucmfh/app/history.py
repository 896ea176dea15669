"""A finished run's epoch history, read from its checkpoint (``ucmfh runs --history RUN``): each epoch's
loss and validation score, the epoch validation kept, the candidate it chose and the refit; printed, or
drawn (``--plot PREFIX``: the loss and the validation score by epoch, from :func:`history_figure`'s plain
data)."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ucmfh.app.runs import the_checkpoint
from ucmfh.checkpoint import read_checkpoint
from ucmfh.metrics.plots import SUFFIXES, figure_start
from ucmfh.selection import VALIDATION_K


# what every validation scores (ucmfh.selection.validator)
VALIDATION_LABEL = f"validation MAP@{VALIDATION_K}\n(unimodal, mean of I→T and T→I)"


def history_of(run: str, rows: Iterable[Dict[str, Any]], where: str
               ) -> Tuple[str, Dict[str, Any], Optional[str], Optional[str]]:
    """The checkpoint of ``run`` — a checkpoint's path, or a run key as ``ucmfh runs --json`` and the results
    rows give it (a unique prefix will do) —, the history it holds, the label of the dataset it was trained on
    and what it is ('two-tower 16 bits', 'fusion stage'; each None where it does not say); ``ValueError`` naming
    what is wrong."""
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
    history = meta.get("history")
    if history is None and meta.get("loss_history") is not None:  # an older ucmfh's (2026-11-23): its losses alone
        history = {"loss": list(meta["loss_history"])}
    if history is None:
        raise ValueError(f"{path}: holds no training history (a checkpoint written by hand, or fitted in closed "
                         "form with no epochs)")
    if "chosen" not in history and isinstance(history.get("candidates"), dict):  # an older ucmfh's choice
        history = {**history, "chosen": history.get("relaxation"), "choice_scores": history["candidates"]}
    identity = meta.get("identity") if isinstance(meta.get("identity"), dict) else {}
    stage = identity.get("hash") if isinstance(identity.get("hash"), dict) else None
    what = (f"{stage.get('method', 'ucmfh')} {stage['n_bits']} bits" if stage and "n_bits" in stage else
            "fusion stage" if isinstance(identity.get("fusion"), dict) else None)
    return path, history, (meta.get("dataset") or {}).get("label"), what


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
    head = [f"{path}: {trained} epoch{'s' if trained != 1 else ''}"]
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


def history_figure(path: str, history: Dict[str, Any], dataset: Optional[str] = None,
                   what: Optional[str] = None) -> Dict[str, Any]:
    """What ``--history --plot`` draws, as plain data from :func:`history_rows`: ``title`` (the checkpoint, what it
    is and the dataset trained on where given); ``loss``, each part's (``training``, or the candidate validation
    chose, and ``refit``) epochs and losses; ``validation``, the validated epochs and their scores; ``kept``, the
    epoch validation kept and its score (None without one)."""
    rows = history_rows(history)
    chosen = f"candidate {history['chosen']}" if history.get("chosen") else ""
    loss = {}
    for part in ("", "refit"):
        mine = [r for r in rows if r["part"] == part]
        if mine:  # a chosen candidate's own epochs: the others' are not kept
            loss[part or chosen or "training"] = ([r["epoch"] for r in mine], [r["loss"] for r in mine])
    validated = [r for r in rows if r["validation"] is not None]
    kept = next(((r["epoch"], r["validation"]) for r in rows if r["kept"] and r["validation"] is not None), None)
    trained_on = f"{dataset}: " if dataset else ""
    title = (f"{trained_on}{what + ', ' if what else ''}{os.path.basename(os.path.dirname(path))}/"
             f"{os.path.basename(path)}{', chose ' + history['chosen'] if chosen else ''}")
    return {"title": title, "loss": loss,
            "validation": ([r["epoch"] for r in validated], [r["validation"] for r in validated]), "kept": kept}


def history_paths(prefix: str) -> List[str]:
    """The files of ``--history --plot PREFIX``: ``PREFIX_history.png`` and ``.svg`` (``FOLDER/history.*``)."""
    return [f"{figure_start(prefix)}history{suffix}" for suffix in SUFFIXES]


def draw_history(figure: Dict[str, Any], prefix: str) -> List[str]:
    """Draw :func:`history_figure` data: the loss by epoch (a line per part) and, where the run was validated,
    the validation score by epoch with the epoch kept marked; written atomically with ucmfh's mark."""
    from ucmfh.metrics.plots import drawing, save_figure, subplots

    epochs, scores = figure["validation"]
    with drawing():
        from matplotlib.ticker import MaxNLocator

        fig, axes = subplots(1, 2 if epochs else 1, figsize=(10 if epochs else 5.5, 4), squeeze=False)
        ax = axes[0][0]
        for part, (x, y) in figure["loss"].items():
            ax.plot(x, y, marker=".", label=part)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        if epochs:
            ax = axes[0][1]
            ax.plot(epochs, scores, marker=".", color="C2", label="validation")
            if figure["kept"]:
                ax.plot(*figure["kept"], marker="*", markersize=14, color="C3", linestyle="none", label="epoch kept",
                        clip_on=False)  # whole where it is the highest score, on the frame
                ax.margins(y=0.1)
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(VALIDATION_LABEL)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(figure["title"], fontsize=10)
        fig.tight_layout()
        paths = [save_figure(fig, path) for path in history_paths(prefix)]
    return paths
