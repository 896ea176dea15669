"""Exact search: ucmfh's Index against faiss.IndexBinaryFlat (same codes, queries, threads), and
faiss.IndexBinaryIVF's recall@k against the exact result.

    python scripts/bench_search.py --sizes 1000000 10000000 --bits 64 128 --out /tmp/bench_search

Codes are uniform random bits (the worst case for pruning: no clusters). Per size, code length and
thread count: build time (ucmfh: add + save to a folder; FAISS: add), index bytes per item, queries
per second for a batch of queries, p50/p99 latency of single-query calls, at k = 10 and 100; ids are
checked identical to IndexBinaryFlat's. Peak memory: a fresh process that maps a saved index and
searches it (``--memory FOLDER``), its maximum resident set size.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np



def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def latencies(fn, queries: np.ndarray, repeat: int) -> tuple:
    times = []
    for i in range(repeat):
        q = queries[i % len(queries) : i % len(queries) + 1]
        start = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - start)
    times = np.array(times) * 1000
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM; unlike ru_maxrss it is not inherited from the
    forking parent across exec)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def memory_probe(folder: str, n_queries: int, k: int) -> None:
    """Map a saved index, search it, print the peak RSS (MiB) as JSON (run in a fresh process)."""
    from ucmfh.search import Index

    index = Index.load(folder)
    rng = np.random.default_rng(1)
    q = rng.integers(0, 2**63, size=(n_queries, index.words), dtype=np.uint64, endpoint=True)
    d, p = index.search(q, k, "txt")
    ids = index.ids("txt")[p]
    print(json.dumps({"peak_rss_mib": peak_rss_mib(),
                      "torch_imported": "torch" in sys.modules, "n": index.count("txt"), "checksum": int(ids.sum())}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--bits", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="[default: 1 and all]")
    ap.add_argument("--ks", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--queries", type=int, default=200, help="queries of the batch (QPS)")
    ap.add_argument("--latency-queries", type=int, default=30, help="single-query calls timed (p50/p99)")
    ap.add_argument("--ivf-nprobe", type=int, nargs="*", default=[1, 4, 16, 64])
    ap.add_argument("--ivf-max-size", type=int, default=1_000_000, help="IVF only up to this size (its training is slow)")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "bench_search"),
                    help="scratch folder for the saved indexes [default: TMPDIR/bench_search]")
    ap.add_argument("--memory", metavar="FOLDER", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory:
        memory_probe(args.memory, args.queries, max(args.ks))
        return

    from ucmfh.search.approx import import_faiss
    try:
        faiss = import_faiss()
    except ImportError as err:  # the comparison is the script's point: one line, not a traceback
        ap.error(str(err))

    from ucmfh.search import Index
    from ucmfh.bits import packed_bytes
    from ucmfh.parallel import default_threads
    from ucmfh.search.kernels import kernels_module

    all_threads = default_threads()
    thread_counts = args.threads or sorted({1, all_threads})
    os.makedirs(args.out, exist_ok=True)
    print(f"# {os.uname().nodename}: {all_threads} CPUs; faiss {faiss.__version__}; kernels: "
          f"{kernels_module().kernel_name()}")
    rows = []
    for bits in args.bits:
        for n in args.sizes:
            rng = np.random.default_rng(n + bits)
            words = rng.integers(0, 2**64 - 1, size=(n, bits // 64), dtype=np.uint64, endpoint=True)
            queries = rng.integers(0, 2**64 - 1, size=(args.queries, bits // 64), dtype=np.uint64, endpoint=True)
            packed, qpacked = np.ascontiguousarray(packed_bytes(words, bits)), np.ascontiguousarray(packed_bytes(queries, bits))
            folder = os.path.join(args.out, f"n{n}_b{bits}")
            shutil.rmtree(folder, ignore_errors=True)

            def build():
                index = Index(bits)
                index.add("txt", words)
                index.save(folder)
                return index

            index, build_s = timed(build)
            index = Index.load(folder)  # searched memory-mapped
            disk = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
            flat, faiss_build_s = timed(lambda: _flat(faiss, bits, packed))
            base = {"n": n, "bits": bits, "build_s": round(build_s, 3), "faiss_build_s": round(faiss_build_s, 3),
                    "bytes_per_item": round(disk / n, 2), "faiss_bytes_per_item": bits / 8}
            for threads in thread_counts:
                faiss.omp_set_num_threads(threads)
                for k in args.ks:
                    index.search(queries[:4], k, "txt", threads=threads)  # page the mapped codes in
                    (d, p), ours_s = timed(lambda: index.search(queries, k, "txt", threads=threads))
                    (fd, fi), faiss_s = timed(lambda: flat.search(qpacked, k))
                    same = bool(np.array_equal(p, fi) and np.array_equal(d, fd))
                    lat = latencies(lambda q: index.search(q, k, "txt", threads=threads), queries, args.latency_queries)
                    flat_lat = latencies(lambda q: flat.search(np.ascontiguousarray(packed_bytes(q, bits)), k),
                                         queries, args.latency_queries)
                    row = {**base, "threads": threads, "k": k,
                           "qps": round(len(queries) / ours_s, 1), "faiss_qps": round(len(queries) / faiss_s, 1),
                           "p50_ms": round(lat[0], 2), "p99_ms": round(lat[1], 2),
                           "faiss_p50_ms": round(flat_lat[0], 2), "faiss_p99_ms": round(flat_lat[1], 2),
                           "identical_ids": same}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            probe = subprocess.run([sys.executable, __file__, "--memory", folder, "--queries", str(args.queries),
                                    "--ks", str(max(args.ks))], capture_output=True, text=True, check=True)
            mem = json.loads(probe.stdout.strip().splitlines()[-1])
            print(json.dumps({"n": n, "bits": bits, "memory": mem}), flush=True)
            if n <= args.ivf_max_size and args.ivf_nprobe:
                faiss.omp_set_num_threads(all_threads)
                nlist = int(4 * np.sqrt(n))
                quantizer = faiss.IndexBinaryFlat(bits)
                ivf = faiss.IndexBinaryIVF(quantizer, bits, nlist)
                sample = packed[rng.choice(n, size=min(n, 40 * nlist), replace=False)]
                _, train_s = timed(lambda: ivf.train(sample))
                _, add_s = timed(lambda: ivf.add(packed))
                k = 10
                _, exact = index.search(queries, k, "txt", threads=all_threads)
                for nprobe in args.ivf_nprobe:
                    ivf.nprobe = nprobe
                    (_, ai), s = timed(lambda: ivf.search(qpacked, k))
                    recall = np.mean([len(set(a) & set(e)) / k for a, e in zip(ai, exact)])
                    row = {"n": n, "bits": bits, "ivf_nlist": nlist, "nprobe": nprobe, "k": k,
                           "threads": all_threads, "recall_at_k": round(float(recall), 4),
                           "qps": round(len(queries) / s, 1), "train_s": round(train_s, 2), "add_s": round(add_s, 2)}
                    print(json.dumps(row), flush=True)
            shutil.rmtree(folder, ignore_errors=True)
            del words, packed, flat


def _flat(faiss, bits: int, packed: np.ndarray):
    flat = faiss.IndexBinaryFlat(bits)
    flat.add(packed)
    return flat


if __name__ == "__main__":
    main()
