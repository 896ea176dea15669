"""Benchmark MAP@K at NUS-WIDE scale: ucmfh.metrics vs a per-query full sort vs faiss.

Methods, each timed in its own subprocess so that its peak memory can be read:

* ``ucmfh``: :func:`ucmfh.metrics.average_precision_at_k` (exact); on the CPU the
  compiled popcount kernels (``--backend``), on a GPU the chunked matmul + top-K.
* ``ucmfh_torch``: the same call under ``ucmfh.metrics.set_backend("torch")``, i.e.
  the torch (GPU) path run on the CPU; only with ``--device cpu``.
* ``ucmfh_expected``: the same call with ``ties="expected"`` (the mean over every order of tied
  items, :mod:`ucmfh.metrics.ties`): histograms by distance instead of a top-K, same backend.
* ``reference``: a per-query loop that computes all N distances and sorts the
  whole retrieval set, as UCMFH's ``calculate_top_map`` (DJSRH's) does, in numpy with a stable
  sort (so its MAP is the docs/reference.md §6 value); timed on ``--ref-queries``
  queries and extrapolated to all of them.
* ``faiss``: ``faiss.IndexBinaryFlat`` top-K search, then the same AP step;
  skipped when faiss is not importable. Its tie order is its own, so its MAP
  may differ slightly from the exact value.

Data are synthetic but structured: labels with skewed class frequencies, codes
the sign of the sum of per-class random prototypes plus noise (so there are
clusters and many equal distances). Example::

    python scripts/bench_eval.py --bits 16 64 128 --json bench_eval.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from ucmfh.files import write_json_atomic
from ucmfh.metrics.arguments import DEFAULT_K

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_data(n_query: int, n_retrieval: int, n_bits: int, n_classes: int, seed: int = 0):
    """Structured synthetic codes (±1 int8) and multi-hot labels (uint8)."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n_classes + 1) ** 0.8
    popularity /= popularity.sum()
    prototypes = rng.choice([-1.0, 1.0], size=(n_classes, n_bits)).astype(np.float32)

    def draw(n):
        # independent classes with skewed frequencies, ~1.7 labels per item, none empty
        labels = (rng.random((n, n_classes)) < np.minimum(1.0, 1.7 * popularity)).astype(np.uint8)
        empty = np.flatnonzero(labels.sum(axis=1) == 0)
        labels[empty, rng.choice(n_classes, size=empty.size, p=popularity)] = 1
        signal = labels.astype(np.float32) @ prototypes
        codes = np.where(signal + rng.normal(0.0, 1.5, size=signal.shape) >= 0, 1, -1).astype(np.int8)
        return codes, labels

    query_codes, query_labels = draw(n_query)
    retrieval_codes, retrieval_labels = draw(n_retrieval)
    return query_codes, retrieval_codes, query_labels, retrieval_labels


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _ap_from_ranked_relevance(rel: np.ndarray) -> np.ndarray:
    """docs/reference.md §6 AP of each row of ranked relevance [Q, K]."""
    hits = np.cumsum(rel, axis=1)
    pos = np.arange(1, rel.shape[1] + 1)
    found = rel.sum(axis=1)
    return np.where(found > 0, (hits / pos * rel).sum(axis=1) / np.maximum(found, 1), 0.0)


def reference_ap(qB, rB, qL, rL, k: int, queries) -> np.ndarray:
    """Per-query loop over the whole retrieval set with a stable full sort (the slow reference)."""
    n_bits = qB.shape[1]
    rB = rB.astype(np.float32)
    rL = rL.astype(np.float32)
    out = []
    for i in queries:
        hamm = 0.5 * (n_bits - rB @ qB[i].astype(np.float32))
        gnd = (rL @ qL[i].astype(np.float32)) > 0
        ind = np.argsort(hamm, kind="stable")[:k]
        out.append(_ap_from_ranked_relevance(gnd[ind][None, :].astype(np.float64))[0])
    return np.array(out)


def worker(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    qB, rB, qL, rL = make_data(args.n_query, args.n_retrieval, args.n_bits, args.n_classes, args.seed)
    result = {"method": args.worker, "n_bits": args.n_bits}
    if args.worker == "ucmfh":
        from ucmfh.metrics import average_precision_at_k, native_kernels, set_backend
        from ucmfh.metrics.native import use_native

        set_backend(args.backend)
        device = torch.device(args.device)
        q = torch.from_numpy(qB).float().to(device)
        r = torch.from_numpy(rB).float().to(device)
        ql = torch.from_numpy(qL).to(device)
        rl = torch.from_numpy(rL).to(device)
        kw = dict(k=args.k, chunk_size=args.chunk_size, retrieval_chunk_size=args.retrieval_chunk_size,
                  ties=args.ties)
        times = []
        base = _rss_mb()
        _reset_peak()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.repeat):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            ap = average_precision_at_k(q, r, ql, rl, **kw)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result.update(
            seconds=min(times), seconds_all=times, map=float(ap.mean().item()),
            peak_extra_mb=_peak_rss_mb() - base,
            path=f"native ({native_kernels()})" if use_native(device) else "torch",
        )
        if device.type == "cuda":
            result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        ref_queries = np.linspace(0, args.n_query - 1, min(args.ref_queries, args.n_query)).astype(int)
        result["ap_on_reference_queries"] = ap.cpu().numpy()[ref_queries].tolist()
    elif args.worker == "reference":
        queries = np.linspace(0, args.n_query - 1, min(args.ref_queries, args.n_query)).astype(int)
        base = _rss_mb()
        _reset_peak()
        start = time.perf_counter()
        ap = reference_ap(qB, rB, qL, rL, args.k, queries)
        seconds = time.perf_counter() - start
        result.update(
            seconds_measured=seconds, queries_measured=len(queries),
            seconds=seconds * args.n_query / len(queries), extrapolated=len(queries) < args.n_query,
            map_on_reference_queries=float(ap.mean()), ap_on_reference_queries=ap.tolist(),
            peak_extra_mb=_peak_rss_mb() - base,
        )
    elif args.worker == "faiss":
        import faiss

        if args.threads:
            faiss.omp_set_num_threads(args.threads)
        pq = np.packbits(qB > 0, axis=1)
        pr = np.packbits(rB > 0, axis=1)
        base = _rss_mb()
        _reset_peak()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            index = faiss.IndexBinaryFlat(8 * pq.shape[1])
            index.add(pr)
            _, idx = index.search(pq, args.k)
            rel = np.einsum("qc,qkc->qk", qL.astype(np.float32), rL[idx].astype(np.float32)) > 0
            ap = _ap_from_ranked_relevance(rel.astype(np.float64))
            times.append(time.perf_counter() - start)
        result.update(
            seconds=min(times), seconds_all=times, map=float(ap.mean()),
            peak_extra_mb=_peak_rss_mb() - base, faiss_version=faiss.__version__,
            faiss_threads=faiss.omp_get_max_threads(),
        )
    return result


def machine_info() -> dict:
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
        "load_average": os.getloadavg(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-query", type=int, default=2100)
    p.add_argument("--n-retrieval", type=int, default=190_000)
    p.add_argument("--n-classes", type=int, default=21)
    p.add_argument("--bits", type=int, nargs="+", default=[16, 64, 128])
    p.add_argument("--k", type=int, default=DEFAULT_K)
    p.add_argument("--ref-queries", type=int, default=200, help="queries the slow reference is timed on")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of the fast methods (the best is reported)")
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--retrieval-chunk-size", type=int, default=65536)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for every method (0: library default)")
    p.add_argument("--backend", choices=("auto", "native", "torch"), default="auto",
                   help="what computes method ucmfh on the CPU (ucmfh.metrics.set_backend); "
                        "method ucmfh_torch always uses torch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write all results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--n-bits", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ties", default="index", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return

    try:
        import faiss  # noqa: F401

        methods = ["ucmfh", "ucmfh_expected", "ucmfh_torch", "reference", "faiss"]
    except ImportError:
        methods = ["ucmfh", "ucmfh_expected", "ucmfh_torch", "reference"]
        print("faiss not importable: skipping (b); pip install faiss-cpu to include it")
    if args.device != "cpu":
        methods.remove("ucmfh_torch")
    info = machine_info()
    print(f"machine: {info}")
    print(f"command: python {' '.join([os.path.relpath(__file__, ROOT)] + (argv or sys.argv[1:]))}")
    rows = []
    for n_bits in args.bits:
        res = {}
        for method in methods:
            role, backend, ties = {"ucmfh_torch": ("ucmfh", "torch", "index"),
                                   "ucmfh_expected": ("ucmfh", args.backend, "expected")}.get(
                method, (method, args.backend, "index"))
            cmd = [sys.executable, __file__, "--worker", role, "--backend", backend, "--n-bits", str(n_bits),
                   "--ties", ties]
            for name in ("n_query", "n_retrieval", "n_classes", "k", "ref_queries", "repeat",
                         "chunk_size", "retrieval_chunk_size", "device", "seed", "threads"):
                cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
            env = dict(os.environ)
            if args.threads:
                for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                    env[var] = str(args.threads)
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            res[method] = json.loads(out.strip().splitlines()[-1])
        ours, ref = res["ucmfh"], res["reference"]
        row = {
            "n_bits": n_bits,
            "ucmfh_s": ours["seconds"], "ucmfh_map": ours["map"], "ucmfh_peak_mb": ours["peak_extra_mb"],
            "ucmfh_path": ours["path"],
            "reference_s": ref["seconds"], "reference_queries_timed": ref["queries_measured"],
            "reference_peak_mb": ref["peak_extra_mb"],
            "speedup_vs_reference": ref["seconds"] / ours["seconds"],
            "max_abs_ap_diff_vs_reference": float(np.max(np.abs(
                np.array(ours["ap_on_reference_queries"]) - np.array(ref["ap_on_reference_queries"])))),
        }
        if "peak_gpu_mb" in ours:
            row["ucmfh_peak_gpu_mb"] = ours["peak_gpu_mb"]
        ex = res["ucmfh_expected"]
        row.update(expected_s=ex["seconds"], expected_map=ex["map"], expected_over_index=ex["seconds"] / ours["seconds"])
        if "ucmfh_torch" in res:
            tp = res["ucmfh_torch"]
            assert tp["path"] == "torch", tp["path"]
            row.update(torch_path_s=tp["seconds"], torch_path_map=tp["map"],
                       torch_path_peak_mb=tp["peak_extra_mb"])
        if "faiss" in res:
            fa = res["faiss"]
            row.update(faiss_s=fa["seconds"], faiss_map=fa["map"], faiss_peak_mb=fa["peak_extra_mb"],
                       speedup_vs_faiss=fa["seconds"] / ours["seconds"])
        rows.append(row)
        print(json.dumps(row), flush=True)

    print()
    print(f"ucmfh path: {rows[0]['ucmfh_path']}" if rows else "")
    header = f"{'bits':>4} {'ucmfh s':>8} {'expect s':>8} {'torch s':>8} {'ref s':>8} {'x ref':>7} {'faiss s':>8} {'x faiss':>7} " \
             f"{'MAP@' + str(args.k):>8} {'expected':>8} {'|dAP| ref':>9} {'peak MB':>8}"
    print(header)
    for row in rows:
        print(f"{row['n_bits']:>4} {row['ucmfh_s']:>8.3f} {row['expected_s']:>8.3f} {row.get('torch_path_s', float('nan')):>8.3f} "
              f"{row['reference_s']:>8.1f} "
              f"{row['speedup_vs_reference']:>7.1f} {row.get('faiss_s', float('nan')):>8.3f} "
              f"{row.get('speedup_vs_faiss', float('nan')):>7.2f} {row['ucmfh_map']:>8.4f} {row['expected_map']:>8.4f} "
              f"{row['max_abs_ap_diff_vs_reference']:>9.1e} {row['ucmfh_peak_mb']:>8.0f}")
    if args.json:
        write_json_atomic(args.json, {"machine": info, "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
