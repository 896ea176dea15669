"""The FAISS backends of ``ucmfh search`` against its exact search: recall@k and queries per second.

    python scripts/bench_approx.py --n 1000000 --bits 64 --nprobe 1 4 16 64 --ef-search 16 64 256
    python scripts/bench_approx.py --index flickr.index --modality txt --queries-from img   # a real model's codes

Runs the library path of ``ucmfh search --backend`` (``Index.search(..., backend=BackendConfig(...))``):
the FAISS index is built from the index folder's codes on first use and cached in it (build seconds:
that first use; the second opening reads the cache, load seconds). Recall@k against the exact top-k:
``ids`` (the exact list's items found) and ``distances`` (ranks whose distance equals the exact one; ties
at the k-th distance do not count against it). QPS: one batch of queries, ``--threads`` threads.
Random codes: uniform bits for the items and the queries (no clusters: the worst case for IVF).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


from ucmfh.config import BackendConfig
from ucmfh.search import Index
from ucmfh.search.approx import faiss_index, import_faiss, recall


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def random_index(folder: str, n: int, bits: int, seed: int) -> Index:
    if os.path.exists(os.path.join(folder, "index.json")):
        index = Index.load(folder)
        if index.count("txt") == n and index.n_bits == bits:
            return index
        raise SystemExit(f"{folder}: holds another index; remove it or use another --out")
    rng = np.random.default_rng(seed)
    index = Index(bits)
    index.add("txt", rng.integers(0, 256, size=(n, bits // 8), dtype=np.uint8))  # packed bytes, uniform bits
    index.save(folder)
    return Index.load(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="random codes indexed (without --index)")
    ap.add_argument("--bits", type=int, default=64, help="a multiple of 8 (FAISS's binary indexes take bytes)")
    ap.add_argument("--index", help="an index folder (a real model's codes) instead of random codes")
    ap.add_argument("--modality", default="txt", help="with --index: the items searched")
    ap.add_argument("--queries-from", help="with --index: query with the codes of this modality of the index "
                                           "(e.g. img); default random codes")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nlist", type=int, default=None, help="IVF lists [default: sqrt(items)]")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[1, 4, 16, 64])
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--ef-search", type=int, nargs="*", default=[16, 64, 256])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "bench_approx"),
                    help="scratch folder for the random index [default: TMPDIR/bench_approx]")
    args = ap.parse_args()
    try:
        faiss = import_faiss()
    except ImportError as err:  # the point of the script: one line, not a traceback
        ap.error(str(err))
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed + 1)
    if args.index:
        folder, modality = args.index, args.modality
        index = Index.load(folder)
    else:
        folder, modality = os.path.join(args.out, f"random-{args.n}x{args.bits}"), "txt"
        index = random_index(folder, args.n, args.bits, args.seed)
    if args.queries_from:
        pool = index.codes(args.queries_from)
        queries = np.ascontiguousarray(pool[rng.choice(len(pool), size=min(args.queries, len(pool)), replace=False)])
    else:
        queries = rng.integers(0, 256, size=(args.queries, index.n_bits // 8), dtype=np.uint8)
    base = {"items": index.count(modality), "bits": index.n_bits, "queries": len(queries), "k": args.k,
            "threads": args.threads, "source": args.index or "random"}
    exact, s = timed(lambda: index.search(queries, args.k, modality, threads=args.threads))
    print(json.dumps({**base, "backend": "exact", "qps": round(len(queries) / s, 1), "recall_ids": 1.0,
                      "recall_distances": 1.0}), flush=True)
    settings = [BackendConfig(backend="faiss-ivf", nlist=args.nlist, nprobe=p) for p in args.nprobe]
    settings += [BackendConfig(backend="faiss-hnsw", hnsw_m=args.hnsw_m, ef_search=e) for e in args.ef_search]
    for cfg in settings:
        fresh = Index.load(folder)
        (_, how), build_s = timed(lambda: faiss_index(fresh, modality, cfg, args.threads))
        again = Index.load(folder)
        (found, how_again), load_s = timed(lambda: faiss_index(again, modality, cfg, args.threads))
        approx, s = timed(lambda: again.search(queries, args.k, modality, threads=args.threads, backend=cfg))
        r = recall(approx, exact)
        row = {**base, "backend": cfg.backend, "first_use": how, "first_use_s": round(build_s, 2),
               "second_use": how_again, "load_s": round(load_s, 3), "qps": round(len(queries) / s, 1),
               "recall_ids": round(r["ids"], 4), "recall_distances": round(r["distances"], 4),
               "not_found": int((approx[1] < 0).sum())}
        if cfg.backend == "faiss-ivf":
            row.update(nlist=int(found.nlist), nprobe=cfg.nprobe)
        else:
            row.update(hnsw_m=cfg.hnsw_m, ef_search=cfg.ef_search)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
