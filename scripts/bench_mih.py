"""Multi-index hashing (``--backend mih``) against the linear scan (``exact``) and faiss.IndexBinaryFlat.

    python scripts/bench_mih.py --sizes 1000000 10000000 --bits 64 --kinds clustered random
    python scripts/bench_mih.py --words codes.npy        # codes of your own (uint64 words [N, W], e.g. an index's)
    python scripts/bench_mih.py --words texts.npy --query-words images.npy   # and queries of your own

Codes: ``clustered`` are what learned codes look like — 10,000 random centres, every bit of an item
flipped with probability 1/16 — and ``random`` uniform bits, the worst case, where the planner should
keep the scan. Queries are drawn the same way (with ``--words``: ``--query-words``, else taken from the codes). Per size,
length, kind and k: queries per second of each method on one thread and on all, the share of queries
multi-index hashing served (the planner scans the rest), the tables' build time and bytes per item,
the process's peak resident memory so far, and whether every id and distance equals the scan's.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench_search import peak_rss_mib  # scripts/: the directory of this script
from ucmfh.search.scan import hamming_search
from ucmfh.parallel import default_threads
from ucmfh.search.mih import MultiIndex


def draw(kind: str, n: int, words: int, centres: np.ndarray, rng) -> np.ndarray:
    def bits(shape):
        return rng.integers(0, 2**64, size=shape, dtype=np.uint64, endpoint=False)

    if kind == "random":
        return bits((n, words))
    flips = bits((n, words)) & bits((n, words)) & bits((n, words)) & bits((n, words))  # each bit with p = 1/16
    return centres[rng.integers(0, len(centres), n)] ^ flips


def per_second(fn, n_queries: int, repeat: int = 3) -> tuple:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return n_queries / best, out


def bench(items: np.ndarray, queries: np.ndarray, n_bits: int, ks, label: dict) -> list:
    rows = []
    start = time.perf_counter()
    tables = MultiIndex(items, n_bits)
    build_s = time.perf_counter() - start
    try:
        import faiss

        flat = faiss.IndexBinaryFlat(n_bits)
        flat.add(np.ascontiguousarray(items.view(np.uint8)[:, : n_bits // 8]))
    except ImportError:
        flat = None
    for threads in sorted({1, default_threads()}):
        for k in ks:
            scan = lambda q, kk: hamming_search(q, items, n_bits, kk, threads=threads)  # noqa: E731
            qps_scan, want = per_second(lambda: scan(queries, k), len(queries))
            served: dict = {}
            qps_mih, got = per_second(lambda: tables.search(queries, k, threads, scan=scan, stats=served),
                                      len(queries))
            row = {**label, "n": len(items), "bits": n_bits, "k": k, "threads": threads, "m": tables.m,
                   "build_s": round(build_s, 2), "table_bytes_per_item": round(tables.nbytes / len(items), 1),
                   "scan_qps": round(qps_scan), "mih_qps": round(qps_mih), "speedup": round(qps_mih / qps_scan, 2),
                   "mih_served": served.get("mih", 0) / len(queries),
                   "identical": bool(np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]))}
            if flat is not None:
                faiss.omp_set_num_threads(threads)
                qps_flat, _ = per_second(lambda: flat.search(np.ascontiguousarray(
                    queries.view(np.uint8)[:, : n_bits // 8]), k), len(queries))
                row["faiss_flat_qps"] = round(qps_flat)
            row["peak_rss_mib"] = round(peak_rss_mib(), 1)  # so far: the codes, tables, faiss's copy, the drawing
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--bits", type=int, nargs="+", default=[64])
    parser.add_argument("--kinds", nargs="+", default=["clustered", "random"], choices=["clustered", "random"])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--words", help="a .npy of uint64 words [N, W] to search instead of drawn codes")
    parser.add_argument("--query-words", help="with --words: a .npy of query words [Q, W] [default: drawn from --words]")
    parser.add_argument("--n-bits", type=int, help="with --words: the code length [default: 64 W]")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    if args.words:
        items = np.ascontiguousarray(np.load(args.words), dtype=np.uint64)
        n_bits = args.n_bits or 64 * items.shape[1]
        if args.query_words:
            queries = np.ascontiguousarray(np.load(args.query_words), dtype=np.uint64)[: args.queries]
        else:
            queries = items[rng.choice(len(items), size=min(args.queries, len(items)), replace=False)]
        rows += bench(items, queries, n_bits, args.ks, {"codes": args.words})
    for n_bits in ([] if args.words else args.bits):
        if n_bits % 64:
            parser.error("--bits: whole 64-bit words only")
        words = n_bits // 64
        centres = draw("random", 10_000, words, None, rng)
        for kind in args.kinds:
            for n in args.sizes:
                items = draw(kind, n, words, centres, rng)
                queries = draw(kind, args.queries, words, centres, rng)
                rows += bench(items, queries, n_bits, args.ks, {"codes": kind})
    print()
    print(f"{'codes':>10} {'items':>10} {'bits':>4} {'k':>4} {'thr':>3} {'scan q/s':>9} {'mih q/s':>9} {'x':>6} "
          f"{'mih served':>10} {'faiss flat q/s':>14} {'B/item':>6} {'same':>5}")
    for r in rows:
        print(f"{str(r['codes'])[-10:]:>10} {r['n']:>10} {r['bits']:>4} {r['k']:>4} {r['threads']:>3} "
              f"{r['scan_qps']:>9} {r['mih_qps']:>9} {r['speedup']:>6} {r['mih_served']:>10.0%} "
              f"{r.get('faiss_flat_qps', '-'):>14} {r['table_bytes_per_item']:>6} {str(r['identical']):>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
