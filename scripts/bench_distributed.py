#!/usr/bin/env python3
"""Data-parallel and streamed training, measured (not a test); figures in docs/distributed.md.

``ranks``: ``ucmfh train-hash`` on one process (``--threads`` threads) and under
``torchrun --nproc-per-node N`` (threads / N each), same data, settings and seed: MAP (or R@K
and rSum on a caption set), training seconds and items per second.

``stream``: a synthetic collection of ``--items`` items written chunk by chunk (never whole in
memory; labelled like ``ucmfh make-synthetic``), then one training run on it with features
streamed beyond ``--max-memory``: wall time, items/s and the peak resident memory of the
training process against the file's size.

``reads``: the batch reads of a streamed training epoch alone, no training: the split's image and text rows
in batches of a uniform permutation, as training reads them (a batch scattered over more blocks than the
cache holds: row by row, at the rows' offsets by several threads where the file's layout allows), items read
per second over ``--batches`` batches, the page cache as found or emptied first (``--cold``): from the disk,
as from a file larger than memory.

    python scripts/bench_distributed.py ranks --data-dir ../shared/data -d mirflickr730 -d flickr8k1000
    python scripts/bench_distributed.py stream --items 5000000 --file /tmp/big.h5
    python scripts/bench_distributed.py reads --file /tmp/big.h5 --batches 200 [--max-memory 1GiB] [--cold]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from typing import List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(args: List[str], procs: int, threads: int) -> float:
    """Run ``ucmfh ARGS`` on ``procs`` processes; returns the wall seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "ucmfh", *args]
    if procs > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "ucmfh", *args]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def ranks(a: argparse.Namespace) -> None:
    import h5py

    print("| set | processes × threads | bits | database | I→T | T→I | rSum | best epoch / run | "
          "train s | items/s | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in a.dataset:
            with h5py.File(os.path.join(a.data_dir, dataset + ".h5"), "r") as f:
                n_train = f["train/image"].shape[0]
            for procs in (1, a.procs):
                threads = max(1, a.threads // procs)
                results = os.path.join(tmp, f"{dataset}-{procs}.jsonl")
                wall = run_cli(["train-hash", "-d", dataset, "--data-dir", a.data_dir, "-b", str(a.bits), "--quiet",
                                "--seed", str(a.seed), "--out", os.path.join(tmp, f"runs{procs}"),
                                "--results", results, *a.extra], procs, threads)
                for line in open(results):
                    r = json.loads(line)
                    fmt = (lambda d: "/".join(f"{d[k]:.1f}" for k in ("1", "5", "10")))
                    i2t, t2i = ((fmt(r["recall_i2t"]), fmt(r["recall_t2i"])) if "recall_i2t" in r
                                else (f"{r['map_i2t']:.3f}", f"{r['map_t2i']:.3f}"))
                    speed = r["epochs_run"] * n_train * (1 - (r["settings"]["hash"].get("val_fraction") or 0)) \
                        / r["train_time_s"]
                    rsum = f"{r['rsum']:.1f}" if "rsum" in r else "—"  # a caption set's alone
                    print(f"| {dataset} | {procs} × {threads} | {r['n_bits']} | {r.get('database', 'retrieval')} | "
                          f"{i2t} | {t2i} | {rsum} | {r['best_epoch']} / "
                          f"{r['epochs_run']} | {r['train_time_s']:.1f} | {speed:,.0f} | {wall:.1f} |", flush=True)


def write_collection(path: str, n_train: int, d: int, n_classes: int = 24, d_latent: int = 32,
                     n_query: int = 2000, n_retrieval: int = 20000, chunk: int = 100_000, seed: int = 0) -> None:
    """A labelled synthetic collection written chunk by chunk: MIRFlickr-like class structure."""
    from ucmfh.data.writer import create_split_dataset, open_writer

    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(n_classes, d_latent))
    maps = [rng.normal(size=(d_latent, d)) / np.sqrt(d_latent) for _ in range(2)]
    attrs = {"name": f"collection{n_train}", "classes": [f"class{c:02d}" for c in range(n_classes)],
             "image_feature": f"synthetic {d}-d", "text_feature": f"synthetic {d}-d",
             "source": "scripts/bench_distributed.py write_collection", "split": "chunks drawn independently"}
    with open_writer(path, attrs, overwrite=True) as f:
        first_id = 0
        for split, n in (("train", n_train), ("query", n_query), ("retrieval", n_retrieval)):
            out = {name: create_split_dataset(f, split, name, shape) for name, shape in
                   (("image", (n, d)), ("text", (n, d)), ("labels", (n, n_classes)), ("ids", (n,)))}
            for start in range(0, n, chunk):
                m = min(chunk, n - start)
                labels = (rng.random((m, n_classes)) < 0.08).astype(np.uint8)
                labels[np.arange(m), rng.integers(0, n_classes, m)] = 1
                latent = labels @ prototypes / np.sqrt(labels.sum(1, keepdims=True)) + 0.7 * rng.normal(size=(m, d_latent))
                for name, w in (("image", maps[0]), ("text", maps[1])):
                    x = np.tanh(latent @ w) + 0.5 * rng.normal(size=(m, d))
                    out[name][start:start + m] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
                out["labels"][start:start + m] = labels
                out["ids"][start:start + m] = first_id + np.arange(start, start + m)
                print(f"\r{split}: {start + m:,}/{n:,}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            first_id += n  # every item its own id, distinct across splits


def stream(a: argparse.Namespace) -> None:
    if not os.path.exists(a.file):
        start = time.perf_counter()
        write_collection(a.file, a.items, a.d)
        print(f"wrote {a.file} in {time.perf_counter() - start:.0f} s")
    size = os.path.getsize(a.file)
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        args = ["train-hash", "-d", a.file, "--method", "two-tower", "-b", "64", "--epochs", str(a.epochs),
                "--val-fraction", "0.01", "--max-memory", a.max_memory, "--out", os.path.join(tmp, "runs"),
                "--results", results, "--device", "cpu", "--quiet", "--batch-size", "1024", *a.extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        wall = run_cli(args, 1, a.threads)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        [r] = [json.loads(line) for line in open(results)]
    print("| items | file GB | --max-memory | epochs × candidates | train s | items/s | peak RSS GB | MAP@50 I→T / T→I "
          "| wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    candidates = max(1, len(r.get("choice_val_scores") or {}))  # two-tower trains each temperature it chooses from
    speed = candidates * r["epochs_run"] * a.items * 0.99 / r["train_time_s"]
    print(f"| {a.items:,} | {size / 1e9:.2f} | {a.max_memory} | {r['epochs_run']} × {candidates} | "
          f"{r['train_time_s']:.0f} | "
          f"{speed:,.0f} | {peak / 1e9:.2f}{' (earlier child)' if before * 1024 > peak else ''} | "
          f"{r['map_i2t']:.3f} / {r['map_t2i']:.3f} | {wall:.0f} |")


def reads(a: argparse.Namespace) -> None:
    import torch

    from ucmfh.app.options import ByteSize
    from ucmfh.data.h5 import load_dataset

    if not os.path.exists(a.file):
        fail(f"--file {a.file}: no such file (write one with 'stream')")
    if a.cold:
        drop_page_cache()
    train = load_dataset(a.file, validate=False, max_memory_bytes=ByteSize().convert(a.max_memory, None, None)).train
    if not train.streamed:
        fail(f"--max-memory {a.max_memory}: the training split fits, so it is not streamed")
    splits = [train.img, train.txt]  # the rows training reads, with the block caches training sizes
    order = torch.randperm(len(splits[0]), generator=torch.Generator().manual_seed(0))
    batches = order[:a.batches * a.batch_size].split(a.batch_size)
    start = time.perf_counter()
    for index in batches:
        for rows in splits:
            rows[index]
    seconds = time.perf_counter() - start
    items = sum(len(index) for index in batches)
    print("| file GB | rows | d | page cache | batch | batches | s | items/s | µs an item (image + text) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {os.path.getsize(a.file) / 1e9:.2f} | {len(splits[0]):,} | {splits[0].shape[1]} | "
          f"{'emptied' if a.cold else 'as found'} | {a.batch_size} | {len(batches)} | {seconds:.1f} | "
          f"{items / seconds:,.0f} | {1e6 * seconds / items:.0f} |")


def drop_page_cache() -> None:
    """Write the file system's dirty pages and empty the kernel's page cache (``/proc/sys/vm/drop_caches``)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError as e:
        fail(f"--cold empties the page cache, which needs root: {e}")


def fail(message: str) -> None:
    print(f"bench_distributed.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("ranks")
    r.add_argument("--data-dir", default="data")
    r.add_argument("-d", "--dataset", action="append", required=True)
    r.add_argument("--procs", type=int, default=2)
    r.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    r.add_argument("--bits", type=int, default=64)
    r.add_argument("--seed", type=int, default=2023)
    r.add_argument("extra", nargs="*", help="more train-hash options (after --)")
    s = sub.add_parser("stream")
    s.add_argument("--items", type=int, default=5_000_000)
    s.add_argument("--d", type=int, default=512)
    s.add_argument("--file", default=os.path.join(tempfile.gettempdir(), "ucmfh-collection.h5"))
    s.add_argument("--max-memory", default="1GiB")
    s.add_argument("--epochs", type=int, default=1)
    s.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    s.add_argument("extra", nargs="*", help="more train-hash options (after --)")
    r = sub.add_parser("reads")
    r.add_argument("--file", default=os.path.join(tempfile.gettempdir(), "ucmfh-collection.h5"))
    r.add_argument("--max-memory", default="1GiB", help="as train-hash's: the training split must be streamed")
    r.add_argument("--batches", type=int, default=200)
    r.add_argument("--batch-size", type=int, default=1024)
    r.add_argument("--cold", action="store_true", help="empty the page cache before the reads (root only)")
    a = p.parse_args()
    {"ranks": ranks, "stream": stream, "reads": reads}[a.what](a)


if __name__ == "__main__":
    main()
