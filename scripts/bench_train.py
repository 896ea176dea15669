#!/usr/bin/env python3
"""Training and encoding speed of ucmfh against a faithful re-implementation of UCMFH's code (not a test).

(a) ``ref``: UCMFH's training step as its code does it, from ``scripts/ucmfh_reference.py``
(its defects included): a per-item Dataset of CPU tensors behind a DataLoader
(batch 128, shuffle, drop_last=True), one ``concat(img, txt)`` 1024-d token
through ``nn.TransformerEncoder`` (4 heads, 2 layers, dim_feedforward 2048,
batch_first=False) on ``(1, B, 1024)``, NT-Xent through the broadcast
``F.cosine_similarity`` over (2B, 2B, d), one hash MLP per modality, one Adam +
per-batch MultiStepLR (gamma 1.2) per module, ``loss.item()`` every batch;
hashing loss = loss(fused) + 0.5 * loss(heads).
(b) ``ours``: ``ucmfh.fusion_stage.fit_fusion`` / ``ucmfh.methods.fit_hashing`` with default
settings (and each ``--amp`` mode asked for).

Measurements, alternating (a)/(b) in one process, ``--repeats`` times, medians:
items/s of the fusion and hashing stages, encoding items/s of a NUS-WIDE-shaped
retrieval set, the extrapolated wall time of a full MIRFlickr-shaped run,
peak memory (one subprocess per variant: ru_maxrss on CPU,
max_memory_allocated on CUDA), and MAP@50 after equal epochs on a smaller set.

    python scripts/bench_train.py                      # everything, CPU
    python scripts/bench_train.py --device cuda        # the same on a GPU
    python scripts/bench_train.py --only throughput --repeats 3
    python scripts/bench_train.py --device cuda --only throughput --cuda-graph   # + ours-none-graph: captured steps

Throughput is the items of a whole fit over its wall seconds (its set-up, a capture and its first epoch's
warm-up included) and, with ``--epochs`` 2 or more, the items of the epochs after the first over their seconds
(``*_steady``: the trainer's record of each epoch for ucmfh, the loop's own clock for the reference, each epoch's
work done on the device): what a long run trains at.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from ucmfh.config import FusionConfig, HashConfig
from ucmfh.data.h5 import Dataset, Split
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic_arrays
from ucmfh.evaluation import encode_split, evaluate_hashing
from ucmfh.metrics import map_at_k
from ucmfh.models.fusion import FusionEncoder
from ucmfh.models.hashing import CrossModalHasher
from ucmfh.methods import fit_hashing
from ucmfh.fusion_stage import fit_fusion
from ucmfh.captured_step import capture_steps
from ucmfh.training_log import EpochRecord, logging_to

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ucmfh_reference, beside this script
from ucmfh_reference import RefFuseTransEncoder, RefHashMlp, ref_encode, ref_fit_fusion, ref_fit_hashing  # noqa: E402

# ---------------------------------------------------------------- helpers


def make_data(spec: SyntheticSpec) -> Dataset:
    arrays = make_synthetic_arrays(spec)

    def split(part: Dict) -> Split:
        return Split(torch.from_numpy(part["image"]), torch.from_numpy(part["text"]),
                     torch.from_numpy(part["labels"]), torch.from_numpy(part["ids"]))

    return Dataset(split(arrays["train"]), split(arrays["query"]), split(arrays["retrieval"]), {"name": "synthetic"})


def timed(fn: Callable, device: torch.device) -> Tuple[float, float, object]:
    """Wall seconds, CPU seconds of this process, and ``fn()``.

    On a CPU shared with other busy processes, CPU seconds are the steadier
    measure of work done; wall seconds are what a user waits.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, time.process_time() - start_cpu, out


def fusion_cfg(args, amp: str, epochs: int) -> FusionConfig:
    kw = dict(epochs=epochs, batch_size=args.batch_size, device=str(args.device),
              modality_dropout=args.modality_dropout)
    if amp != "none":
        kw["amp"] = amp
    return FusionConfig(**kw)


def hash_cfg(args, amp: str, epochs: int) -> HashConfig:
    kw = dict(n_bits=args.n_bits, epochs=epochs, batch_size=args.batch_size, device=str(args.device),
              modality_dropout=args.modality_dropout)
    if amp != "none":
        kw["amp"] = amp
    return HashConfig(**kw)


def variants(args) -> List[str]:
    graphs = ["ours-none-graph"] if args.cuda_graph else []  # a captured step is full precision only
    return ["ref"] + [f"ours-{amp}" for amp in args.amp] + graphs


def said_eager(why: str) -> None:
    """A '-graph' variant whose stage ran eagerly (a capture refused, ...): said as the training commands say it,
    where scripts/speed_report.py reads it, so its figure is not taken for a captured one."""
    print(f"note: CUDA graphs asked for, but {why}", file=sys.stderr, flush=True)


class EpochSeconds:
    """A training log (:mod:`ucmfh.training_log`) that keeps the seconds of the epochs it is told of, as the
    trainer records them (to the read of the epoch's loss, which waits for the device's work)."""

    def __init__(self) -> None:
        self.seconds: List[float] = []

    def record(self, record: EpochRecord) -> None:
        self.seconds.append(record.seconds)

    def close(self) -> None:
        pass


class StageRun(NamedTuple):
    """One stage of one variant trained: items processed (all epochs), the model, each epoch's seconds."""

    n_items: int
    model: object
    seconds: List[float]


def run_stage(variant: str, stage: str, data: Dataset, args, epochs: int) -> StageRun:
    """Train one stage of one variant."""
    device = args.device
    if variant == "ref":
        if stage == "fusion":
            fit = ref_fit_fusion(data.train, epochs, device, args.batch_size)
        else:
            fusion = RefFuseTransEncoder(hidden_size=data.d_img + data.d_txt)
            fit = ref_fit_hashing(data.train, fusion, args.n_bits, epochs, device, args.batch_size)
        return StageRun(fit.n_items, fit.model, fit.seconds)
    amp = variant.split("-")[1]
    log = EpochSeconds()
    with capture_steps(variant.endswith("-graph"), on_eager=said_eager), logging_to(log):
        if stage == "fusion":
            model, _ = fit_fusion(data, fusion_cfg(args, amp, epochs), progress=False)
        else:
            fusion = FusionEncoder(data.d_img, data.d_txt)
            model, _ = fit_hashing(data, hash_cfg(args, amp, epochs), fusion, progress=False)
    return StageRun(len(data.train) * epochs, model, log.seconds)


def steady_rate(run: StageRun) -> Optional[float]:
    """Items a second once training runs: the epochs after the first (its warm-up, a capture) over their
    seconds; None for a run of one epoch."""
    if len(run.seconds) < 2:
        return None
    per_epoch = run.n_items / len(run.seconds)
    return per_epoch * (len(run.seconds) - 1) / sum(run.seconds[1:])


# ---------------------------------------------------------------- measurements


def bench_throughput(args) -> Dict[str, Dict[str, float]]:
    spec = SyntheticSpec(n_query=10, n_retrieval=args.n_train, n_train=args.n_train)
    data = make_data(spec)
    keys = ("fusion", "hashing", "fusion_cpu", "hashing_cpu") + ("fusion_steady", "hashing_steady") * (args.epochs > 1)
    rates: Dict[str, Dict[str, List[float]]] = {v: {k: [] for k in keys} for v in variants(args)}
    warm = Dataset(data.train.subset(slice(0, 2 * args.batch_size)), data.query, data.retrieval, data.attrs)
    for stage in ("fusion", "hashing"):
        for v in variants(args):  # warm-up, untimed
            run_stage(v, stage, warm, args, 1)
        for r in range(args.repeats):
            for v in variants(args):
                seconds, cpu, run = timed(lambda: run_stage(v, stage, data, args, args.epochs), args.device)
                rates[v][stage].append(run.n_items / seconds)
                rates[v][f"{stage}_cpu"].append(run.n_items / cpu)
                steady = steady_rate(run)
                if steady is not None:
                    rates[v][f"{stage}_steady"].append(steady)
                print(f"  {stage:<8} repeat {r}  {v:<16} {run.n_items / seconds:9.1f} items/s wall  "
                      f"{run.n_items / cpu:9.1f} items/CPU-s" + (f"  {steady:9.1f} items/s after its first epoch"
                                                                  if steady is not None else ""), flush=True)
    return {v: {s: statistics.median(x) for s, x in st.items()} for v, st in rates.items()}


def bench_encode(args) -> Dict[str, float]:
    spec = SyntheticSpec(n_query=10, n_retrieval=args.encode_n, n_train=10, n_classes=21)
    data = make_data(spec)
    device = args.device
    torch.manual_seed(0)
    fusion = RefFuseTransEncoder(hidden_size=data.d_img + data.d_txt).to(device)
    ref_models = (fusion, RefHashMlp(fusion.sigal_d, args.n_bits).to(device),
                  RefHashMlp(fusion.sigal_d, args.n_bits).to(device))
    ours = CrossModalHasher(FusionEncoder(data.d_img, data.d_txt), args.n_bits)
    jobs = {
        "ref": lambda: len(ref_encode(ref_models, data.retrieval, device)[0]),
        "ours-fused": lambda: len(encode_split(ours, data.retrieval, "fused", str(device))[0]),
        "ours-unimodal": lambda: len(encode_split(ours, data.retrieval, "unimodal", str(device))[0]),
    }
    rates: Dict[str, List[float]] = {k: [] for k in jobs}
    rates_cpu: Dict[str, List[float]] = {k: [] for k in jobs}
    for r in range(args.encode_repeats):
        for name, job in jobs.items():
            seconds, cpu, n = timed(job, device)
            rates[name].append(len(data.retrieval) / seconds)
            rates_cpu[name].append(len(data.retrieval) / cpu)
            print(f"  encode   repeat {r}  {name:<14} {len(data.retrieval) / seconds:9.1f} items/s wall  "
                  f"{len(data.retrieval) / cpu:9.1f} items/CPU-s ({n} coded)", flush=True)
    return {k: {"wall": statistics.median(rates[k]), "cpu": statistics.median(rates_cpu[k])} for k in jobs}


def _peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child
    started by a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_probe(args) -> None:
    """Child process: one epoch of one stage of one variant; print peak memory in MiB as JSON."""
    data = make_data(SyntheticSpec(n_query=10, n_retrieval=args.n_train, n_train=args.n_train))
    variant, stage = args.probe.split(":")
    if args.device.type == "cuda":
        run_stage(variant, stage, data, args, 1)
        torch.cuda.reset_peak_memory_stats(args.device)
        run_stage(variant, stage, data, args, 1)
        peak = torch.cuda.max_memory_allocated(args.device) / 2**20
        base = 0.0
    else:
        base = _peak_rss_mib()
        run_stage(variant, stage, data, args, 1)
        peak = _peak_rss_mib()
    print(json.dumps({"peak_mib": round(peak, 1), "training_mib": round(peak - base, 1)}))


def bench_memory(args) -> Dict[str, Dict[str, Dict[str, float]]]:
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for v in variants(args):
        out[v] = {}
        for stage in ("fusion", "hashing"):
            cmd = [sys.executable, __file__, "--probe", f"{v}:{stage}", "--device", str(args.device),
                   "--n-train", str(args.n_train), "--batch-size", str(args.batch_size), "--n-bits", str(args.n_bits),
                   "--threads", str(torch.get_num_threads())]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[v][stage] = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"  memory   {stage:<8} {v:<16} {out[v][stage]}", flush=True)
    return out


def bench_map(args) -> Dict[str, Dict[str, float]]:
    spec = SyntheticSpec(n_query=args.map_query, n_retrieval=args.map_retrieval, n_train=args.map_train)
    data = make_data(spec)
    out: Dict[str, Dict[str, float]] = {}
    for v in variants(args) if args.map_ref else variants(args)[1:]:
        if v == "ref":
            fusion = ref_fit_fusion(data.train, args.map_epochs, args.device, args.batch_size).model
            models = ref_fit_hashing(data.train, fusion, args.n_bits, args.map_epochs, args.device,
                                     args.batch_size).model
            q = ref_encode(models, data.query, args.device, itemwise=True)
            r = ref_encode(models, data.retrieval, args.device, itemwise=True)
            ql, rl = data.query.labels.to(args.device), data.retrieval.labels.to(args.device)
            out[v] = {"fused_i2t": map_at_k(q[0], r[1], ql, rl, 50), "fused_t2i": map_at_k(q[1], r[0], ql, rl, 50)}
        else:
            amp = v.split("-")[1]
            epochs = args.ours_map_epochs or args.map_epochs
            with capture_steps(v.endswith("-graph"), on_eager=said_eager):
                fusion, _ = fit_fusion(data, fusion_cfg(args, amp, epochs), progress=False)
                model, _ = fit_hashing(data, hash_cfg(args, amp, epochs), fusion, progress=False)
            out[v] = {}
            for row in evaluate_hashing(model, data, ("fused", "unimodal"), 50, str(args.device)):
                out[v][f"{row['protocol']}_i2t"] = row["map_i2t"]
                out[v][f"{row['protocol']}_t2i"] = row["map_t2i"]
        print(f"  MAP@50   {v:<16} " + "  ".join(f"{k} {x:.4f}" for k, x in out[v].items()), flush=True)
    return out


def machine() -> str:
    model = platform.processor() or "?"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    import os

    return f"{model}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--only", choices=["throughput", "encode", "memory", "map"], action="append",
                   help="Run only these parts (repeatable); default all.")
    p.add_argument("--amp", action="append", choices=["none", "bf16"],
                   help="ucmfh variants to time (repeatable); default none and bf16.")
    p.add_argument("--n-train", type=int, default=1280,
                   help="Training items per timed epoch (rates are per item; the full run is extrapolated to 5000).")
    p.add_argument("--cuda-graph", action="store_true",
                   help="Also time ucmfh in full precision with each full batch's step replayed from a CUDA graph "
                        "(on a GPU; elsewhere the same as ours-none).")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n-bits", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1, help="Epochs per timed measurement; with 2 or more, each "
                   "fit's items/s after its first epoch (its warm-up, a capture) too.")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--full-epochs", type=int, default=100, help="Epochs of each stage in the extrapolated full run.")
    p.add_argument("--encode-n", type=int, default=190000, help="Retrieval items encoded (NUS-WIDE: ~190k).")
    p.add_argument("--encode-repeats", type=int, default=1)
    p.add_argument("--map-train", type=int, default=2000)
    p.add_argument("--map-query", type=int, default=500)
    p.add_argument("--map-retrieval", type=int, default=5000)
    p.add_argument("--map-epochs", type=int, default=10)
    p.add_argument("--ours-map-epochs", type=int, default=0, help="Epochs of ucmfh's MAP runs (0: --map-epochs).")
    p.add_argument("--no-map-ref", dest="map_ref", action="store_false", help="MAP of ucmfh's variants only.")
    p.add_argument("--modality-dropout", type=float, default=FusionConfig.modality_dropout,
                   help="ucmfh's modality dropout (0 trains only the fused view, as UCMFH).")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default).")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.device = torch.device(args.device)
    args.amp = args.amp or ["none", "bf16"]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.probe:
        memory_probe(args)
        return
    parts = args.only or ["throughput", "encode", "memory", "map"]
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {machine()}; device {args.device}"
          + (f" ({torch.cuda.get_device_name(args.device)})" if args.device.type == "cuda" else ""))
    results: Dict[str, object] = {}
    if "throughput" in parts:
        print("throughput (items/s, median of repeats):")
        rates = results["throughput"] = bench_throughput(args)
        ref = rates["ref"]
        clocks = [("wall time", ""), ("CPU time", "_cpu")] + [("wall time after each fit's first epoch", "_steady")] * (
            args.epochs > 1)
        for clock, suffix in clocks:
            print(f" by {clock}:")
            for v, r in rates.items():
                f, h = r["fusion" + suffix], r["hashing" + suffix]
                full = args.full_epochs * 5000 * (1 / f + 1 / h)
                print(f"  {v:<16} fusion {f:8.1f} ({f / ref['fusion' + suffix]:.2f}x)  "
                      f"hashing {h:8.1f} ({h / ref['hashing' + suffix]:.2f}x)  "
                      f"full {args.full_epochs}+{args.full_epochs}-epoch 5000-item run {full / 3600:6.2f} h "
                      f"({full / (args.full_epochs * 5000 * (1 / ref['fusion' + suffix] + 1 / ref['hashing' + suffix])):.2f} of ref)")
    if "encode" in parts:
        print(f"encoding {args.encode_n} retrieval items:")
        enc = results["encode"] = bench_encode(args)
        for k, x in enc.items():
            print(f"  {k:<14} {x['wall']:9.1f} items/s wall ({x['wall'] / enc['ref']['wall']:.2f}x)  "
                  f"{x['cpu']:9.1f} items/CPU-s ({x['cpu'] / enc['ref']['cpu']:.2f}x)")
    if "memory" in parts:
        print("peak memory (MiB, one subprocess each):")
        results["memory"] = bench_memory(args)
    if "map" in parts:
        print(f"MAP@50 after {args.map_epochs}+{args.map_epochs} epochs, {args.map_train} train items:")
        results["map"] = bench_map(args)
    print("json: " + json.dumps(results))


if __name__ == "__main__":
    main()
