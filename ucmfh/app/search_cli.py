"""``ucmfh index`` and ``ucmfh search``: thin click wrappers over :mod:`ucmfh.search`."""
from __future__ import annotations

import json
import os
import sys
from typing import Optional, Tuple

import click

from ucmfh.app.errors import UserError, describe, user_errors
from ucmfh.app.options import Count, InputPath, device_option, given_twice
from ucmfh.app.outputs import check_outputs
from ucmfh.config import INDEX_CHUNK_SIZE, SEARCH_BACKENDS, BackendConfig, SettingError, backend_config

MODALITY = click.Choice(["image", "text"])
_BACKEND = BackendConfig()
MAX_HITS = 10_000_000  # hits one search holds at the most: of one query, or of all with --html (one page of them)


# index and search: the popcount kernels' CPU by default
SEARCH_DEVICE = device_option("cpu", "cpu (the compiled popcount kernels), cuda, cuda:1, auto (CUDA when present)")


@click.command("index")
@click.argument("collection", type=click.Path(dir_okay=False))
@click.option("--checkpoint", "-c", required=True, type=InputPath(dir_okay=False), help="A hashN.pt checkpoint.")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False),
              help="The index folder: created, or resumed / appended to when it exists.")
@click.option("--split", "splits", multiple=True,
              help="Groups of COLLECTION to index (repeatable) [default: the root's items, or query and retrieval "
                   "of a dataset file]; groups already in OUT are not added again.")
@click.option("--chunk-size", default=INDEX_CHUNK_SIZE, show_default=True, type=Count(min=1),
              help="Items encoded and committed at a time (a killed build resumes at the last chunk).")
@click.option("--embeddings/--no-embeddings", default=True, show_default=True,
              help="Keep the float16 real-valued embeddings (for 'ucmfh search --rerank cosine').")
@SEARCH_DEVICE
@click.option("--quiet", is_flag=True, help="No progress bar.")
@user_errors
def index_cmd(collection, checkpoint, out, splits, chunk_size, embeddings, device, quiet) -> None:
    """Encode every item of COLLECTION (unimodal protocol) into the index folder OUT."""
    from ucmfh.search.build import build_index
    from ucmfh.signals import stop_on_signals, stopped_by

    check_outputs(folders={"--out": out})
    signalled = {"signal": None}
    try:  # SIGINT and SIGTERM end the build once the chunk in progress is committed
        with stop_on_signals() as signalled:
            report = build_index(collection, checkpoint, out, splits=splits or None, chunk_size=chunk_size,
                                 embeddings=embeddings, device=device, progress=not quiet,
                                 should_stop=lambda: signalled["signal"])
    except KeyboardInterrupt:
        report = None
    if report is None or report.stopped:
        raise stopped_by(_interrupted_build(out, collection), signalled["signal"])
    index = report.index
    for group, holder in report.skipped.items():
        click.echo(f"{out}: {group} of {collection} is not added again: " +
                   ("it is indexed already" if group == holder else f"its items are those of {holder}"))
    if report.already:
        click.echo(f"{out}: {collection} is already indexed ({report.rows} rows); nothing added")
    else:
        if report.resumed_at:
            click.echo(f"resumed at row {report.resumed_at} of {report.rows}")
        click.echo(f"{out}: added {report.added['img']} images and {report.added['txt']} texts from {collection}")
    click.echo(f"{out}: {index.count('img')} images, {index.count('txt')} texts, {index.n_bits} bits")


@click.command("search")
@click.argument("index", nargs=-1, required=True, type=InputPath(file_okay=False))
@click.option("--queries", "-q", type=InputPath(dir_okay=False),
              help="Query features: an .npy [Q, d], or an HDF5 collection / dataset file (its query split).")
@click.option("--split", help="With an HDF5 --queries: the group holding the queries.")
@click.option("--ids", help="With an HDF5 --queries: only the items with these ids (comma-separated).")
@click.option("--query-modality", type=MODALITY,
              help="What the query features are [default: the file's only modality, else the one not searched].")
@click.option("--text", "text", multiple=True, help="A caption as a query (repeatable; needs the index's CLIP model).")
@click.option("--image", "image", multiple=True, type=InputPath(dir_okay=False),
              help="An image file as a query (repeatable; needs the index's CLIP model).")
@click.option("--k", "-k", default=10, show_default=True, type=Count(min=1), help="Results per query.")
@click.option("--modality", "-m", type=MODALITY, default="text", show_default=True, help="What is searched.")
@click.option("--rerank", type=click.Choice(["cosine", "seps"]),
              help="Re-rank the Hamming candidates: cosine of the real-valued embeddings kept in the index, or "
                   "SEPS on the token features of the queries' file and of the indexed collection (needs --seps).")
@click.option("--seps", "seps_checkpoint", type=InputPath(dir_okay=False),
              help="With --rerank seps: the SEPS checkpoint ('ucmfh train-seps').")
@click.option("--candidates", type=Count(min=1), help="Candidates re-ranked [default: 10 × -k].")
@click.option("--backend", type=click.Choice(SEARCH_BACKENDS), default=_BACKEND.backend, show_default=True,
              help="exact: every code compared; mih: the same results by multi-index hashing, its tables built on "
                   "first use and cached in the index folder (the scan where probing would cost more); "
                   "faiss-ivf / faiss-hnsw: FAISS's approximate search (needs the extra "
                   "'faiss'), its index built on first use and cached in the index folder.")
@click.option("--substrings", type=Count(min=1),
              help="mih: substrings per code [default: about bits / log2(items)].")
@click.option("--nlist", type=Count(min=1),
              help="faiss-ivf: lists the codes are clustered into [default: sqrt(items)].")
@click.option("--nprobe", type=Count(min=1),
              help=f"faiss-ivf: lists scanned per query [default: {_BACKEND.nprobe}].")
@click.option("--ef-search", type=Count(min=1),
              help=f"faiss-hnsw: the candidate list of the graph walk (at least k) [default: {_BACKEND.ef_search}].")
@click.option("--recall", "check_recall", is_flag=True,
              help="With a FAISS backend: also search exactly and print the approximate candidates' recall.")
@click.option("--checkpoint", "-c", type=InputPath(dir_okay=False),
              help="The index's checkpoint, where it has moved from the path recorded in the index.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines (one per hit) instead of a table.")
@click.option("--metrics", "with_metrics", is_flag=True,
              help="Also print R@1/5/10 (in %) and MAP@k of the queries, judged by shared labels or the same id "
                   "(on stderr with --json); of the hits as ranked, items at one distance by their position in the "
                   "index ('ucmfh evaluate': tie-aware figures).")
@click.option("--html", type=click.Path(dir_okay=False),
              help="Also write a static results page here (a file other than a page ucmfh wrote: with --overwrite).")
@click.option("--overwrite", is_flag=True, help="Replace an --html file that is not a page ucmfh wrote.")
@click.option("--threads", type=Count(min=1), help="CPU threads over queries [default: torch's].")
@SEARCH_DEVICE
@click.option("--quiet", is_flag=True, help="No progress bar (shown on a terminal, where the hits go elsewhere).")
@user_errors
def search_cmd(index, queries, split, ids, query_modality, text, image, k, modality, rerank, seps_checkpoint,
               candidates, backend, substrings, nlist, nprobe, ef_search, check_recall, checkpoint, as_json,
               with_metrics, html, overwrite, threads, device, quiet) -> None:
    """Search INDEX (several folders: searched as one) with queries; print the top-k items of each."""
    from ucmfh.search.build import Encoder
    from ucmfh.search.collection import read_queries
    from ucmfh.search.folder import modality_name
    from ucmfh.search.results import Totals, format_scores, legend, merged, result_lines, result_rows, search_blocks
    from ucmfh.search.index import UnfinishedIndex
    from ucmfh.search.shards import open_index

    given = [name for name, v in (("--queries", queries), ("--text", text), ("--image", image)) if v]
    if len(given) != 1:
        raise click.UsageError("give queries by exactly one of --queries, --text and --image")
    if any(not caption.strip() for caption in text):
        raise click.BadParameter("an empty caption; give the words to search for", param_hint="--text")
    if (split or ids) and not queries:
        raise click.UsageError("--split and --ids select rows of an HDF5 --queries file")
    try:  # a setting the backend has no use for is refused by the library; here it is named as its flag
        config = backend_config(backend, nlist=nlist, nprobe=nprobe, ef_search=ef_search, substrings=substrings,
                                check_recall=check_recall)
    except SettingError as err:
        flag = {"check_recall": "--recall"}.get(err.setting, "--" + err.setting.replace("_", "-"))
        raise click.UsageError(f"{flag} does not apply to --backend {backend}") from None
    if (rerank == "seps") != bool(seps_checkpoint):
        raise click.UsageError("--rerank seps and --seps SEPS.pt go together")
    if candidates is not None and rerank is None:
        raise click.UsageError("--candidates goes with --rerank (the Hamming candidates it re-ranks)")
    if candidates is not None and candidates < k:
        raise click.BadParameter(f"{candidates} candidates re-ranked for the top {k}: at least -k",
                                 param_hint="--candidates")
    if rerank == "seps" and not queries:
        raise UserError("--rerank seps needs the queries' token features, and --text and --image queries have "
                        "none: give an HDF5 --queries file with token datasets")
    check_outputs({"--html": html}, overwrite=overwrite,
                  inputs={"INDEX": index, "--queries": queries, "--image": image, "--seps": seps_checkpoint,
                          "--checkpoint": checkpoint})
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        opened = open_index(index)
    except UnfinishedIndex as err:
        raise UserError(f"{describe(err)}; let a build under way finish, or run the same 'ucmfh index' command again "
                        "to finish an interrupted one") from None
    built = getattr(opened, "shards", [opened])  # the files an index records are its inputs too
    check_outputs({"--html": html}, overwrite=overwrite,
                  inputs={"INDEX's checkpoint": [p for p in ((b.meta.get("checkpoint") or {}).get("path")
                                                             for b in built) if p],
                          "INDEX's collections": [s["path"] for b in built for s in b.sources if s.get("path")]})
    if substrings is not None:  # before any table is built (a build for a count it cannot cut was cached first)
        from ucmfh.search.mih import check_substrings

        try:
            check_substrings(opened.n_bits, substrings)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--substrings") from None
    encoder = Encoder(checkpoint or _recorded_checkpoint(opened, index[0]), device)
    searched = modality_name(modality)
    if k > opened.count(searched) > 0:  # every item listed: said, where a shorter list than asked came unexplained
        click.echo(f"note: -k {k} is more than the {opened.count(searched)} {modality} items of the index; each "
                   "query lists them all", err=True)
    if queries:
        wanted = _parse_ids(ids)
        asked = modality_name(query_modality) if query_modality else None
        if asked is None and not queries.endswith(".npy"):
            asked = _default_query_modality(queries, split, searched)
        q = read_queries(queries, asked, encoder.dims, split=split, ids=wanted)
        _check_rows(len(q), min(k, opened.count(searched)), html)
    else:
        from ucmfh.search.clip import clip_queries

        _check_rows(len(text) + len(image), min(k, opened.count(searched)), html)  # before CLIP encodes them
        q = clip_queries(opened, text=list(text), images=list(image), device=device)
    if with_metrics:  # before the search, which a growing index's many files made fail after it
        from ucmfh.search.results import relevance_problem

        problem = relevance_problem(opened, searched, q)
        if problem:
            raise UserError(f"--metrics: {problem}")
    matcher = None
    if seps_checkpoint:
        from ucmfh.search.seps_rerank import load_matcher

        matcher = load_matcher(seps_checkpoint, device)
    from tqdm.auto import tqdm

    # a block of queries at a time, printed as found: 300,000 queries held 1.5 GB, and printed nothing for a minute
    blocks = search_blocks(opened, encoder, q, k, searched, rerank=rerank, candidates=candidates, device=device,
                           matcher=matcher, backend=config, threads=threads, check_recall=check_recall)
    totals, page = Totals(), []
    # on a terminal (stderr) where the hits go to a file or a pipe; from a second on
    shown = not quiet and not sys.stdout.isatty()
    with tqdm(total=len(q), desc="search", unit="query", delay=1, leave=False, disable=None if shown else True) as bar:
        for results in blocks:
            totals.add(results)
            if html:
                page.append(results)
            if as_json:  # a query's rows at a time
                for rows in filter(None, result_rows(results)):
                    click.echo("\n".join(json.dumps(row, ensure_ascii=False) for row in rows))
            else:
                for lines in result_lines(results):
                    click.echo(lines)
            bar.update(len(results.positions))
    if not as_json and legend(totals.relevance):
        click.echo(legend(totals.relevance))
    found = totals.scores() if with_metrics else None  # judged: relevance_problem said so before the search
    if found is not None:
        click.echo(format_scores(found), err=as_json)
        click.echo("  of the hits as ranked: items at one distance by their position in the index, the order it was "
                   "built in (a file indexed whole: its /query split first, which favours them); 'ucmfh evaluate' "
                   "gives tie-aware figures", err=as_json)
        if found.get("own_found"):
            click.echo(f"  {found['own_found']} of the {found['queries']} queries find their own item (its pair in "
                       f"{q.group}) among the hits, relevant by its labels: the field's figures search "
                       "the retrieval split alone (index it with --split retrieval, or 'ucmfh evaluate')",
                       err=as_json)
    if html:
        from ucmfh.search.html import missing_images, write_html

        results = merged(q, page)
        write_html(html, results, title=f"ucmfh search: {', '.join(index)}")
        size = os.path.getsize(html)  # one page of every query's hits: -k 200 of 4,500 queries was 168 MB, unsaid
        click.echo(f"wrote {html} ({size / 1e6:.1f} MB)" if size >= 1e6 else f"wrote {html}", err=as_json)
        missing = missing_images(results)
        if missing:
            click.echo(f"  {len(missing)} of its image files not found from here (first: {missing[0]}); the page says "
                       "so in their place", err=as_json)
    n = max(1, len(q))
    click.echo(f"{len(q)} quer{'y' if len(q) == 1 else 'ies'}, ms per query: " + ", ".join(
        f"{stage} {1000 * s / n:.3f}" for stage, s in totals.seconds.items()), err=True)
    if totals.served is not None:
        from ucmfh.search.mih import MIN_ITEMS

        why = (f"under {MIN_ITEMS:,} items the scan is faster than probing" if totals.served.get("small") else
               "where probing would read more")
        if totals.served.get("uncompiled"):
            why = ("ucmfh's C kernels are not built here (ucmfh.native_kernels() is None: pip install with a C "
                   "compiler builds them), and without them the scan is faster than probing")
        if totals.served.get("small_shards"):  # a query is multi-index hashing's where it served every shard
            few, shards = totals.served["small_shards"]
            why += (f"; {few} of the {shards} shards hold under {MIN_ITEMS:,} items and scan every query, so none "
                    "counts as multi-index hashing's")
        click.echo(f"mih: {totals.served.get('mih', 0)} queries by multi-index hashing, "
                   f"{totals.served.get('scan', 0)} by the scan ({why})", err=True)
    if nlist is not None and nlist > opened.count(searched):  # n_lists cuts it to the items: said, not silently
        click.echo(f"faiss-ivf: --nlist {nlist} is more lists than the {opened.count(searched)} items searched; "
                   f"{opened.count(searched)} lists", err=True)
    if totals.recall is not None:
        click.echo(f"{backend} recall@{totals.recall['depth']} against exact search: {totals.recall['ids']:.4f} of the "
                   f"items, {totals.recall['distances']:.4f} of the distances", err=True)


def _interrupted_build(out: str, collection: str) -> str:
    """What an interrupted ``index`` left, and how to go on."""
    from ucmfh.search import Index

    try:
        sources = Index.load(out).sources
    except (OSError, ValueError):  # stopped before the folder was made
        return f"interrupted before {out} was created; nothing was written"
    mine = [s for s in sources if s.get("path") == os.path.abspath(collection)]
    if not mine:
        return f"interrupted before any row of {collection} was added to {out}"
    if all(s["done"] >= s["rows"] for s in mine):
        return f"interrupted after {collection} was indexed: {out} is complete"
    done = ", ".join(f"{s['done']} of {s['rows']} rows" for s in mine if s["done"] < s["rows"])
    return (f"interrupted: {out} holds {done} of {collection}, and 'ucmfh search' refuses it until the same "
            "command has continued the build to the end")


def _recorded_checkpoint(index, path: str) -> str:
    recorded = (index.meta.get("checkpoint") or {}).get("path")
    if not recorded:
        raise ValueError(f"{path}: records no checkpoint; give it with --checkpoint")
    if not os.path.exists(recorded):
        raise FileNotFoundError(f"{path}: its checkpoint {recorded} is gone; give it with --checkpoint")
    return recorded


def _check_rows(queries: int, each: int, html: Optional[str]) -> None:
    """Refuse, before the search, more hits than one holds (:data:`MAX_HITS`): a query's (its block's are
    held until printed), or with ``--html`` all of them (the page's); 76M held ran a 23-GB machine out of
    memory."""
    if each > MAX_HITS:
        raise click.BadParameter(f"{each:,} hits of a query, more than {MAX_HITS:,} (held until printed): ask for "
                                 "fewer", param_hint="-k")
    if html and queries * each > MAX_HITS:
        raise click.BadParameter(f"{queries:,} quer{'y' if queries == 1 else 'ies'} × {each:,} hits = "
                                 f"{queries * each:,} hits on one --html page, more than {MAX_HITS:,} (each held "
                                 "until it is written): ask for fewer hits, or fewer queries (--ids)", param_hint="-k")


def _parse_ids(ids: Optional[str]) -> Optional[Tuple[int, ...]]:
    if ids is None:
        return None
    try:  # int() takes the spaces around a number, not within it ("1 6" is not 16)
        parsed = tuple(int(v) for v in ids.split(",") if v.strip())
    except ValueError:
        parsed = ()
    if not parsed:
        raise click.BadParameter(f"expected comma-separated integers, got {ids!r}", param_hint="--ids")
    again = given_twice(parsed)
    if again is not None:  # its queries would be asked twice, their hits listed twice
        raise click.BadParameter(f"id {again} is given twice", param_hint="--ids")
    return parsed


def _default_query_modality(path: str, split: Optional[str], searched: str) -> Optional[str]:
    """The file's only modality; with both, the one not searched (a cross-modal query)."""
    from ucmfh.data.format import DataError
    from ucmfh.search.collection import open_collection

    try:
        coll = open_collection(path, [split] if split else None)
    except (OSError, DataError):
        return None  # read_queries, reading the file next, names what is wrong with it
    both = coll.has("image") and coll.has("text")
    if not both:
        return None
    return "img" if searched == "txt" else "txt"
