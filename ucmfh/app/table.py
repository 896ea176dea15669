"""Result rows as people read them (a small plain-text table, what each protocol and database means) and
as machines keep them (appended to a JSON-lines results file)."""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

from ucmfh.files import PathLike, append_jsonl, read_jsonl
from ucmfh.config import EXPECTED
from ucmfh.printable import pad, shown_width

PROTOCOL_NOTES = {
    "unimodal": "cross-modal: image codes from images alone, text codes from texts alone",
    "fused": "UCMFH's protocol: every code also sees its item's paired modality (not cross-modal retrieval)",
}
Log = Callable[[str], None]


def append_results(path: PathLike, rows: List[Dict[str, Any]]) -> None:
    """Append result rows to a JSON-lines file (locked, one write per row: concurrent runs keep every row)."""
    append_jsonl(path, rows)


def append_cell_rows(path: PathLike, rows: List[Dict[str, Any]], log: Log, name: Optional[str] = None) -> None:
    """Append a grid cell's rows (``name``: the cell, in the line said instead), unless every one is in the results
    file already, by run, protocol, database and k: a grid started beside this one on the same file trained the
    cell, this one scored its checkpoint as reused, and appended the same rows a second time (a grid skips the
    cells finished when it starts)."""
    def measured(row: Dict[str, Any]) -> tuple:
        return row.get("run"), row.get("protocol"), row.get("database"), row.get("k")

    keys = {row.get("run") for row in rows}
    # the lines that name the cell's runs alone are read: a lab's file of 100,000 rows is not parsed a cell
    mine = [json.dumps(key) for key in keys] if all(isinstance(key, str) for key in keys) else None
    there = {measured(row) for row in read_jsonl(path, on_skip=lambda line: None, containing=mine)} if rows else set()
    if rows and all(measured(row) in there for row in rows):
        log(f"      {name + ': ' if name else ''}its rows are in {path} already (appended meanwhile by a grid beside "
            "this one)")
    else:
        append_results(path, rows)


class _Head:
    """The first columns of every line of format_table; the dataset's and the method's as wide as the
    longest of ``rows`` needs (a method of another package may have a long name)."""

    def __init__(self, rows: List[Dict[str, Any]]) -> None:
        self.dataset = max([14] + [shown_width(str(r["dataset"])) + 1 for r in rows])
        self.method = max([11] + [shown_width(str(r.get("method") or "ucmfh")) + 1 for r in rows])
        self.title = self(dict(dataset="dataset", task="task", method="method", loss="loss", n_bits="bits",
                               protocol="protocol"))

    def __call__(self, r: Dict[str, Any]) -> str:
        method = str(r.get("method") or "ucmfh")
        return (f"{pad(str(r['dataset']), self.dataset)}{r['task']:<9}{pad(method, self.method)}"
                f"{r['loss'] or '-':<10}{r['n_bits'] or '-':>5}  {r['protocol']:<9}")


def _lead(r: Dict[str, Any], key: str) -> Any:
    """A row's score as tables lead with it: the tie-aware twin where the row has one."""
    return r.get(key + EXPECTED, r[key])


def _caption_scores(r: Dict[str, Any], pick=_lead) -> str:
    recall = ["/".join(f"{pick(r, key)[rank]:.1f}" for rank in ("1", "5", "10")) for key in ("recall_i2t", "recall_t2i")]
    return f"{recall[0]:>18}{recall[1]:>18}{pick(r, 'rsum'):>7.1f}{pick(r, 'map_i2t'):>11.4f}{pick(r, 'map_t2i'):>7.4f}"


def _index_order(r: Dict[str, Any], key: str) -> Any:
    return r[key]


def format_table(rows: List[Dict[str, Any]]) -> str:
    """A small plain-text table of result rows, with what each protocol (and database) means."""
    captions = [r for r in rows if "database" in r]
    labelled = [r for r in rows if "database" not in r]
    lines = []
    head = _Head(rows)
    if labelled:
        real = any("real_valued" in r for r in labelled)
        tie_aware = any("map_i2t" + EXPECTED in r for r in labelled)
        lines.append(f"{head.title}{'MAP@k':>6}{'I->T':>8}{'T->I':>8}" + (f"{'index I->T':>12}{'T->I':>8}" if tie_aware else "")
                     + (f"{'cosine I->T':>13}{'T->I':>8}" if real else ""))
        for r in labelled:
            index = f"{r['map_i2t']:>12.4f}{r['map_t2i']:>8.4f}" if "map_i2t" + EXPECTED in r else " " * 20 * tie_aware
            cosine = (f"{_lead(r['real_valued'], 'map_i2t'):>13.4f}{_lead(r['real_valued'], 'map_t2i'):>8.4f}"
                      if "real_valued" in r else "")
            lines.append(f"{head(r)}{r['k']:>6}{_lead(r, 'map_i2t'):>8.4f}{_lead(r, 'map_t2i'):>8.4f}{index}{cosine}")
        floors = {(r["dataset"], r["n_bits"]): r for r in labelled if "random_map_i2t" in r}
        for (name, bits), r in floors.items():
            floor = {"dataset": name, "task": "random", "method": "-", "loss": None, "n_bits": bits, "protocol": "-"}
            lines.append(f"{head(floor)}{r['k']:>6}{r['random_map_i2t']:>8.4f}{r['random_map_t2i']:>8.4f}")
    if captions:
        lines.append(f"{head.title}{'database':<11}"
                     f"{'I->T R@1/5/10':>18}{'T->I R@1/5/10':>18}{'rSum':>7}{'MAP@k I->T':>11}{'T->I':>7}")
        for r in captions:
            floor = f" (random codes: rSum {r['random_rsum']:.1f})" if "random_rsum" in r else ""
            lines.append(f"{head(r)}{r['database']:<11}{_caption_scores(r)}{floor}")
            if "rsum" + EXPECTED in r:
                lines.append(f"{'  (ties by database index)':<{len(head.title)}}{r['database']:<11}"
                             f"{_caption_scores(r, _index_order)}")
            if "real_valued" in r:
                lines.append(f"{'  (cosine of the real-valued head outputs)':<{len(head.title)}}{r['database']:<11}"
                             f"{_caption_scores(r['real_valued'])}")
        lines.append("  caption set (relevance = same id): image->text queries are the unique query images, "
                     "text->image queries every query caption; R@K in %")
        lines.append("  test: the query split as database; collection: query and retrieval together")
    if any("map_i2t" + EXPECTED in r for r in rows):
        lines.append("  scores: the mean over every order of tied items (tie-aware, docs/evaluation.md); index: "
                     "ties broken by database index, as the field's code does")
    if any("real_valued" in r for r in rows):
        lines.append("  cosine: the hash heads' real-valued outputs before the sign, ranked by cosine (what the "
                     "codes lose to their sign)")
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        lines.append(f"  {protocol}: {PROTOCOL_NOTES[protocol]}")
    return "\n".join(lines)


def report(rows: List[Dict[str, Any]], results: Optional[str], echo: Log = print) -> None:
    """Append rows to the results file (when one is given) and print them as a table; nothing without rows
    (a rank other than 0 of a distributed run). Appended first: a reader that closes the output early (``| head``,
    ``| grep -m1``) ends the command as the table is printed, and took the rows with it."""
    if not rows:
        return
    try:
        if results:
            append_results(results, rows)
    except OSError as err:  # checked before the run (ucmfh.app.outputs); the disk may still fill up
        raise OSError(f"--results {results}: the rows above were not appended ({err.strerror or err}); the "
                      "checkpoints are saved, so the same command scores them again without training") from None
    finally:  # the scores, shown whatever refused them (a file that became another program's while the run went)
        echo(format_table(rows))
    if results:
        echo(f"results appended to {results}")
