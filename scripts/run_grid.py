#!/usr/bin/env python3
"""Train and score a grid of datasets x losses x bit lengths x seeds; one results table.

Each cell is one hashing run (``ucmfh.app.experiment.train_hash_stage``); the
fusion stage is trained once per (dataset, loss, seed) and reused from
``OUT/DATASET/LOSS-seedSEED/fusion.pt`` by the cells that share it. Result
rows are appended to a JSON-lines file; a cell whose rows are already there
with the same settings is skipped, so an interrupted grid resumes where it
stopped. The table (mean ± sample std over seeds) is written as Markdown and CSV.

    python scripts/run_grid.py -d mirflickr -d nuswide -b 16 -b 32 -b 64 -b 128 --seeds 2023,2024,2025
    python scripts/run_grid.py -d synthetic --epochs 5 --table runs/grid   # quick look
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
from itertools import product
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ucmfh.config import AMP_MODES, PROTOCOLS, REFERENCE_EPOCHS, FusionConfig, HashConfig, to_dict
from ucmfh.data.h5 import load_dataset
from ucmfh.files import write_text_atomic
from ucmfh.app.experiment import append_results, fusion_path, resolve_dataset, run_dir, train_hash_stage

Cell = Tuple[str, str, int, int]  # dataset, loss, n_bits, seed
TABLE_KEYS = ("dataset", "loss", "n_bits", "protocol")


def settings_of(fusion_cfg: FusionConfig, hash_cfg: HashConfig) -> Dict[str, Any]:
    """What makes two runs of a cell the same run: every setting but the device."""
    fusion = {k: v for k, v in to_dict(fusion_cfg).items() if k != "device"}
    hashing = {k: v for k, v in to_dict(hash_cfg).items() if k != "device"}
    return {"fusion": fusion, "hash": hashing}


def read_rows(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def finished(rows: List[Dict[str, Any]], cell: Cell, settings: Dict[str, Any], protocols: Sequence[str],
             k: int) -> List[Dict[str, Any]]:
    """The cell's rows with these settings, one per protocol, or [] when any protocol is missing."""
    mine = {r["protocol"]: r for r in rows
            if tuple(r.get(key) for key in ("grid_dataset", "loss", "n_bits", "seed", "k")) == (*cell, k)
            and r.get("settings") == settings}
    return [mine[p] for p in protocols] if all(p in mine for p in protocols) else []


def check_fusion_checkpoint(directory: str, fusion_cfg: FusionConfig) -> None:
    """Refuse to reuse a fusion encoder trained with other settings (it would silently mix runs)."""
    settings = os.path.splitext(fusion_path(directory))[0] + ".json"
    if not os.path.exists(settings):
        return
    with open(settings, encoding="utf-8") as f:
        saved = {k: v for k, v in json.load(f)["fusion_config"].items() if k != "device"}
    wanted = settings_of(fusion_cfg, HashConfig())["fusion"]
    if saved != wanted:
        diff = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        raise ValueError(f"{directory}: its fusion encoder was trained with other settings ({diff}); "
                         "use another --out or remove it")


def summarize(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Mean and sample std over seeds of MAP in both directions, one row per (dataset, loss, n_bits, protocol)."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[key] for key in TABLE_KEYS), []).append(r)
    table = []
    for key, group in groups.items():
        out = dict(zip(TABLE_KEYS, key), k=group[0]["k"], n_seeds=len(group))
        for direction in ("map_i2t", "map_t2i"):
            values = [r[direction] for r in group]
            out[f"{direction}_mean"] = statistics.fmean(values)
            out[f"{direction}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        table.append(out)
    return table


def write_table(table: List[Dict[str, Any]], prefix: str) -> Tuple[str, str]:
    """``PREFIX.csv`` and ``PREFIX.md``, each written atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    columns = [*TABLE_KEYS, "k", "n_seeds", "map_i2t_mean", "map_i2t_std", "map_t2i_mean", "map_t2i_std"]
    paths = (prefix + ".csv", prefix + ".md")
    csv_text = io.StringIO()
    writer = csv.DictWriter(csv_text, columns)
    writer.writeheader()
    writer.writerows(table)
    write_text_atomic(paths[0], csv_text.getvalue())
    lines = ["| dataset | loss | bits | protocol | seeds | MAP@k I→T | MAP@k T→I |", "|---|---|---:|---|---:|---|---|"]
    for r in table:
        lines.append(f"| {r['dataset']} | {r['loss']} | {r['n_bits']} | {r['protocol']} | {r['n_seeds']} "
                     f"| {r['map_i2t_mean']:.4f} ± {r['map_i2t_std']:.4f} | {r['map_t2i_mean']:.4f} ± {r['map_t2i_std']:.4f} |")
    ks = sorted({r["k"] for r in table})
    lines += ["", f"k = {', '.join(map(str, ks))}; mean ± sample standard deviation over seeds."]
    write_text_atomic(paths[1], "\n".join(lines) + "\n")
    return paths


def run_grid(
    datasets: Sequence[str], losses: Sequence[str], bits: Sequence[int], seeds: Sequence[int],
    fusion_base: Dict[str, Any], hash_base: Dict[str, Any], data_dir: str, out: str, results: str,
    table: str, protocols: Sequence[str] = PROTOCOLS, k: int = 50, epochs: Optional[int] = None,
    fusion_epochs: Optional[int] = None, progress: bool = False, log=print,
) -> List[Dict[str, Any]]:
    """Run every unfinished cell, then write the table of the whole grid; returns the table rows."""
    grid_rows: List[Dict[str, Any]] = []
    for dataset in datasets:
        data = load_dataset(resolve_dataset(dataset, data_dir))
        name = os.path.splitext(os.path.basename(dataset))[0]
        n_epochs = epochs if epochs is not None else REFERENCE_EPOCHS.get(name, 100)
        for loss, n_bits, seed in product(losses, bits, seeds):
            fusion_cfg = FusionConfig(**{**fusion_base, "loss": loss, "seed": seed,
                                         "epochs": fusion_epochs if fusion_epochs is not None else n_epochs}).validate()
            hash_cfg = HashConfig(**{**hash_base, "loss": loss, "seed": seed, "n_bits": n_bits,
                                     "epochs": n_epochs}).validate()
            settings = settings_of(fusion_cfg, hash_cfg)
            cell = (name, loss, n_bits, seed)
            done = finished(read_rows(results), cell, settings, protocols, k)
            if done:
                log(f"skip {cell}: finished")
                grid_rows += done
                continue
            log(f"run  {cell}")
            directory = run_dir(out, name, loss, seed)
            check_fusion_checkpoint(directory, fusion_cfg)
            rows = train_hash_stage(data, fusion_cfg, hash_cfg, directory, protocols, k, progress, log)
            rows = [{**r, "grid_dataset": name, "settings": settings} for r in rows]
            append_results(results, rows)
            grid_rows += rows
    for r in grid_rows:
        r["dataset"] = r["grid_dataset"]
    summary = summarize(grid_rows)
    for path in write_table(summary, table):
        log(f"wrote {path}")
    return summary


def _list(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", "-d", action="append", required=True, help="Dataset name or .h5 path (repeatable).")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--losses", type=_list(str), default=["original"], help="Comma-separated loss names.")
    p.add_argument("--n-bits", "-b", action="append", type=int, help="Code length (repeatable); default 16,32,64,128.")
    p.add_argument("--seeds", type=_list(int), default=[2023], help="Comma-separated seeds.")
    p.add_argument("--epochs", type=int, default=None, help="Hashing epochs [default: the reference's per dataset, else 100].")
    p.add_argument("--fusion-epochs", type=int, default=None, help="Fusion epochs [default: as --epochs].")
    p.add_argument("--protocol", choices=["both", *PROTOCOLS], default="both")
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--out", default="runs", help="Root folder of checkpoints.")
    p.add_argument("--results", default="runs/grid.jsonl", help="JSON-lines file of result rows (read to skip cells).")
    p.add_argument("--table", default="runs/grid", help="Table path without extension: writes .md and .csv.")
    p.add_argument("--device", default="auto")
    p.add_argument("--amp", choices=AMP_MODES, default="none")
    p.add_argument("--batch-size", type=int, default=FusionConfig.batch_size)
    # model-size overrides, e.g. for a tiny smoke grid
    p.add_argument("--d-model", type=int, default=FusionConfig.d_model)
    p.add_argument("--d-ff", type=int, default=FusionConfig.d_ff)
    p.add_argument("--n-heads", type=int, default=FusionConfig.n_heads)
    p.add_argument("--hidden", type=int, default=HashConfig.hidden)
    p.add_argument("--lr-fusion", type=float, default=FusionConfig.lr, help="Fusion lr in both stages.")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    common = dict(batch_size=args.batch_size, device=args.device, amp=args.amp)
    fusion_base = dict(common, d_model=args.d_model, d_ff=args.d_ff, n_heads=args.n_heads, lr=args.lr_fusion)
    hash_base = dict(common, hidden=args.hidden, lr_fusion=args.lr_fusion)
    protocols = PROTOCOLS if args.protocol == "both" else (args.protocol,)
    run_grid(args.dataset, args.losses, args.n_bits or [16, 32, 64, 128], args.seeds, fusion_base, hash_base,
             args.data_dir, args.out, args.results, args.table, protocols, args.k, args.epochs, args.fusion_epochs,
             progress=not args.quiet, log=print)


if __name__ == "__main__":
    main(sys.argv[1:])
