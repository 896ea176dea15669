"""Train UCMFH (fusion, then hashing) with each registered loss and tabulate MAP@50.

For every dataset, loss and seed the fusion stage is trained once and reused
(a fresh copy each time) by the hashing stage at every bit length. Each cell
(dataset, loss, seed, n_bits) is cached as JSON under ``--out``, with the
settings it was trained with, so a re-run skips finished cells and redoes
cells whose settings changed. At the end the script writes ``results.md``
(one table per dataset and protocol: mean ± sample std over seeds) and
``results.csv`` (long format) under ``--out``.

Example (the command behind docs/losses.md):

    python scripts/compare_losses.py \\
        --dataset /work/shared/data/wiki.h5 --dataset /work/shared/data/mirflickr730.h5 --dataset synthetic \\
        --bits 16,32,64,128 --seeds 2023,2024,2025 --out runs/compare_losses
"""
from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ucmfh.config import PROTOCOLS, FusionConfig, HashConfig, to_dict
from ucmfh.data import Dataset, load_dataset
from ucmfh.files import write_text_atomic
from ucmfh.data.synthetic import SyntheticSpec, make_synthetic
from ucmfh.scoring import evaluate_hashing, random_codes_map
from ucmfh.losses import LOSSES
from ucmfh.train import fit_fusion, fit_hashing

DIRECTIONS = (("map_i2t", "I→T"), ("map_t2i", "T→I"))
RANDOM = "random-codes"  # the reference row of every table: untrained, uniformly random ±1 codes


def parse_list(text: str, kind: type = str) -> List[Any]:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse_params(items: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``NAME:key=value,key=value`` → {NAME: {key: value}}; values parsed as JSON where possible."""
    out: Dict[str, Dict[str, Any]] = {}
    for item in items:
        name, _, rest = item.partition(":")
        if name not in LOSSES:
            raise SystemExit(f"--loss-params: unknown loss {name!r}")
        params = out.setdefault(name, {})
        for pair in filter(None, rest.split(",")):
            key, _, value = pair.partition("=")
            try:
                params[key] = json.loads(value)
            except json.JSONDecodeError:
                params[key] = value
    return out


def parse_spec(text: str) -> SyntheticSpec:
    values: Dict[str, Any] = {}
    for pair in filter(None, text.split(",")):
        key, _, value = pair.partition("=")
        values[key] = json.loads(value)
    return SyntheticSpec(**values)


def write_json(path: str, value: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text_atomic(path, json.dumps(value, indent=1, ensure_ascii=False))


def read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def resolve_dataset(entry: str, out: str, spec: SyntheticSpec) -> Tuple[str, str]:
    """(name, path) of a ``--dataset`` entry; ``synthetic`` is generated under ``out`` once."""
    if entry == "synthetic":
        path = os.path.join(out, "data", "synthetic.h5")
        meta = os.path.join(out, "data", "synthetic.json")
        if read_json(meta) != dataclasses.asdict(spec) or not os.path.exists(path):
            make_synthetic(path, spec, overwrite=True)
            write_json(meta, dataclasses.asdict(spec))
        return "synthetic", path
    return os.path.splitext(os.path.basename(entry))[0], entry


class Grid:
    """The settings of one comparison and where its cells live."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.params = parse_params(args.loss_params)

    def fusion_cfg(self, loss: str, seed: int) -> FusionConfig:
        a = self.args
        return FusionConfig(
            d_model=a.d_model, d_ff=a.d_ff, loss=loss, loss_params=self.params.get(loss, {}),
            epochs=a.fusion_epochs, batch_size=a.batch_size, seed=seed, device=a.device,
        )

    def hash_cfg(self, loss: str, seed: int, n_bits: int) -> HashConfig:
        a = self.args
        return HashConfig(
            n_bits=n_bits, hidden=a.hidden, loss=loss, loss_params=self.params.get(loss, {}),
            epochs=a.hash_epochs, batch_size=a.batch_size, seed=seed, device=a.device,
        )

    def cell_path(self, dataset: str, loss: str, seed: int, n_bits: int) -> str:
        return os.path.join(self.args.out, "cells", dataset, loss, f"seed{seed}", f"bits{n_bits}.json")

    def settings(self, dataset_path: str, loss: str, seed: int, n_bits: int) -> Dict[str, Any]:
        return {
            "dataset": os.path.abspath(dataset_path),
            "fusion": to_dict(self.fusion_cfg(loss, seed)),
            "hashing": to_dict(self.hash_cfg(loss, seed, n_bits)),
        }


def run_group(grid: Grid, name: str, data: Dataset, path: str, loss: str, seed: int, bits: Sequence[int]) -> None:
    """Train fusion once for (dataset, loss, seed), then hashing at each missing bit length."""
    todo = [
        n for n in bits
        if (read_json(grid.cell_path(name, loss, seed, n)) or {}).get("settings") != grid.settings(path, loss, seed, n)
    ]
    if not todo:
        return
    fusion_cfg = grid.fusion_cfg(loss, seed)
    start = time.perf_counter()
    fusion, fusion_history = fit_fusion(data, fusion_cfg, progress=False)
    fusion_time = time.perf_counter() - start
    for n_bits in todo:
        hash_cfg = grid.hash_cfg(loss, seed, n_bits)
        start = time.perf_counter()
        # the hashing stage fine-tunes the encoder it is given: each bit length gets its own copy
        model, hash_history = fit_hashing(data, hash_cfg, copy.deepcopy(fusion), progress=False)
        hash_time = time.perf_counter() - start
        rows = evaluate_hashing(model, data, protocols=PROTOCOLS, k=50, device=grid.args.device)
        cell = {
            "dataset": name, "loss": loss, "seed": seed, "n_bits": n_bits,
            "map": {r["protocol"]: {"map_i2t": r["map_i2t"], "map_t2i": r["map_t2i"]} for r in rows},
            "fusion_time_s": fusion_time, "hash_time_s": hash_time,
            "fusion_loss_last": fusion_history[-1] if fusion_history else None,
            "hash_loss_last": hash_history[-1] if hash_history else None,
            "settings": grid.settings(path, loss, seed, n_bits),
        }
        write_json(grid.cell_path(name, loss, seed, n_bits), cell)
        maps = "  ".join(f"{p}: {cell['map'][p]['map_i2t']:.3f}/{cell['map'][p]['map_t2i']:.3f}" for p in PROTOCOLS)
        print(f"{name:>14} {loss:>9} seed {seed} {n_bits:>3} bits  {maps}  "
              f"(fusion {fusion_time:.0f}s, hashing {hash_time:.0f}s)", flush=True)


def run_random(grid: Grid, name: str, data: Dataset, seeds: Sequence[int], bits: Sequence[int]) -> None:
    """MAP@50 of uniformly random ±1 codes (the floor; the same under both protocols)."""
    for seed in seeds:
        for n_bits in bits:
            path = grid.cell_path(name, RANDOM, seed, n_bits)
            if read_json(path) is None:
                scores = random_codes_map(data, n_bits, k=50, seed=seed)
                both = {"map_i2t": scores["map_i2t"], "map_t2i": scores["map_t2i"]}
                write_json(path, {"dataset": name, "loss": RANDOM, "seed": seed, "n_bits": n_bits,
                                  "map": {p: both for p in PROTOCOLS}, "fusion_time_s": 0.0, "hash_time_s": 0.0})


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def summarise(grid: Grid, datasets: Sequence[str], losses: Sequence[str], bits: Sequence[int],
              seeds: Sequence[int]) -> Tuple[List[Dict[str, Any]], str]:
    """CSV rows and the Markdown tables of every finished cell of the grid."""
    rows: List[Dict[str, Any]] = []
    md: List[str] = []
    for name in datasets:
        table_losses = [*losses, RANDOM]
        cells = {
            (loss, seed, n): read_json(grid.cell_path(name, loss, seed, n))
            for loss in table_losses for seed in seeds for n in bits
        }
        for protocol in PROTOCOLS:
            md += [f"### {name}, protocol `{protocol}`: MAP@50 I→T / T→I (mean ± std over seeds)", ""]
            md.append("| loss | " + " | ".join(f"{n} bits" for n in bits) + " | mean | seeds | fusion s | hashing s per n_bits |")
            md.append("|---|" + "---|" * (len(bits) + 4))
            for loss in table_losses:
                line, all_maps, used_seeds = [f"`{loss}`" if loss != RANDOM else "random ±1 codes"], [], set()
                fusion_t, hash_t = [], []
                for n in bits:
                    done = [cells[(loss, s, n)] for s in seeds if cells[(loss, s, n)]]
                    if not done:
                        line.append("–")
                        continue
                    text = []
                    for key, arrow in DIRECTIONS:
                        values = [c["map"][protocol][key] for c in done]
                        m, sd = mean_std(values)
                        all_maps += values
                        text.append(f"{m:.3f} ± {sd:.3f}")
                        rows.append({
                            "dataset": name, "protocol": protocol, "loss": loss, "n_bits": n, "direction": arrow,
                            "map50_mean": round(m, 4), "map50_std": round(sd, 4), "n_seeds": len(values),
                            "seeds": " ".join(str(c["seed"]) for c in done),
                            "fusion_time_s": round(statistics.fmean(c["fusion_time_s"] for c in done), 1),
                            "hash_time_s": round(statistics.fmean(c["hash_time_s"] for c in done), 1),
                        })
                    used_seeds |= {c["seed"] for c in done}
                    fusion_t += [c["fusion_time_s"] for c in done]
                    hash_t += [c["hash_time_s"] for c in done]
                    line.append(" / ".join(text))
                if all_maps:
                    times = [f"{statistics.fmean(fusion_t):.1f}", f"{statistics.fmean(hash_t):.1f}"]
                    line += [f"{statistics.fmean(all_maps):.3f}", str(len(used_seeds)),
                             *(["–", "–"] if loss == RANDOM else times)]
                else:
                    line += ["–", "0", "–", "–"]
                md.append("| " + " | ".join(line) + " |")
            md.append("")
    return rows, "\n".join(md + summary(grid, datasets, losses, bits, seeds))


def summary(grid: Grid, datasets: Sequence[str], losses: Sequence[str], bits: Sequence[int],
            seeds: Sequence[int]) -> List[str]:
    """Each loss against the first one (``original``), paired by seed, n_bits and direction."""
    base = losses[0]
    md = [f"### Summary: mean MAP@50 over n_bits and both directions; Δ = loss − `{base}` "
          "paired by (seed, n_bits, direction), mean ± std over the pairs; wins = pairs where the loss is higher", "",
          "| dataset | protocol | loss | mean MAP@50 | Δ vs " + f"`{base}`" + " | wins |", "|---|---|---|---|---|---|"]
    for name in datasets:
        for protocol in PROTOCOLS:
            def value(loss: str, seed: int, n: int, key: str) -> Optional[float]:
                cell = read_json(grid.cell_path(name, loss, seed, n))
                return cell["map"][protocol][key] if cell else None

            for loss in losses:
                mine = [value(loss, s, n, k) for s in seeds for n in bits for k, _ in DIRECTIONS]
                ref = [value(base, s, n, k) for s in seeds for n in bits for k, _ in DIRECTIONS]
                done = [m for m in mine if m is not None]
                if not done:
                    continue
                pairs = [m - r for m, r in zip(mine, ref) if m is not None and r is not None]
                if loss == base or not pairs:
                    delta, wins = "–", "–"
                else:
                    d_mean, d_std = mean_std(pairs)
                    delta = f"{d_mean:+.3f} ± {d_std:.3f}"
                    wins = f"{sum(d > 0 for d in pairs)}/{len(pairs)}"
                md.append(f"| {name} | {protocol} | `{loss}` | {statistics.fmean(done):.3f} | {delta} | {wins} |")
    md.append("")
    return md


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", action="append", required=True,
                   help="an HDF5 file in the ucmfh format, or 'synthetic' (generated under --out); repeatable")
    p.add_argument("--losses", default=",".join(LOSSES), help="comma-separated registry names")
    p.add_argument("--loss-params", action="append", default=[], metavar="NAME:key=value,...",
                   help="hyper-parameters of one loss (default: the loss's own defaults); repeatable")
    p.add_argument("--bits", default="16,32,64,128")
    p.add_argument("--seeds", default="2023,2024,2025")
    p.add_argument("--fusion-epochs", type=int, default=10)
    p.add_argument("--hash-epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--d-model", type=int, default=FusionConfig.d_model)
    p.add_argument("--d-ff", type=int, default=FusionConfig.d_ff)
    p.add_argument("--hidden", type=int, default=HashConfig.hidden, help="hash head hidden width")
    p.add_argument("--synthetic", default="", metavar="key=value,...",
                   help="SyntheticSpec fields of the 'synthetic' dataset, e.g. n_query=200,n_retrieval=1200,n_train=600")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default="runs/compare_losses")
    p.add_argument("--report-only", action="store_true", help="only tabulate the cached cells")
    args = p.parse_args(argv)

    losses = parse_list(args.losses)
    unknown = [x for x in losses if x not in LOSSES]
    if unknown:
        raise SystemExit(f"unknown loss(es) {unknown}; choose from {sorted(LOSSES)}")
    bits, seeds = parse_list(args.bits, int), parse_list(args.seeds, int)
    if args.threads:
        torch.set_num_threads(args.threads)
    grid = Grid(args)
    spec = parse_spec(args.synthetic)
    names = []
    for entry in args.dataset:
        name, path = resolve_dataset(entry, args.out, spec)
        names.append(name)
        if args.report_only:
            continue
        data = load_dataset(path)
        run_random(grid, name, data, seeds, bits)
        for loss in losses:
            for seed in seeds:
                run_group(grid, name, data, path, loss, seed, bits)

    rows, md = summarise(grid, names, losses, bits, seeds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(md + "\n")
    with open(os.path.join(args.out, "results.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["dataset"])
        writer.writeheader()
        writer.writerows(rows)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
