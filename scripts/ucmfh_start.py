"""Where UCMFH's task 1 starts: ucmfh's default (the heads on the trained fusion stage, task 0's encoder) against
UCMFH's release (a fusion encoder of random weights trained with the heads, ``fusion_start='random'``), the same
settings otherwise: MAP@50 of both protocols (a caption set's: of both databases, with their rSum), and each
way's training seconds (docs/reference.md §2, "Departures").

    OMP_NUM_THREADS=1 python scripts/ucmfh_start.py ../shared/data/mirflickr730.h5 --bits 16 --bits 64 \\
        --seed 2023 --seed 1 --seed 2

Prints one line per run and a table of means; ``--json`` writes every row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from ucmfh import evaluate_hashing, fit_fusion, fit_hashing, load_dataset, stage_configs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", help="an .h5 dataset file")
    p.add_argument("--bits", type=int, action="append", help="code lengths (repeatable; default 16 and 64)")
    p.add_argument("--seed", type=int, action="append", help="seeds (repeatable; default 2023)")
    p.add_argument("--reference", default="mirflickr",
                   help="the dataset whose reference epochs both stages train (default: mirflickr)")
    p.add_argument("--epochs", type=int, default=None, help="epochs of each stage (default: the reference's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args()
    data = load_dataset(args.dataset)
    rows = []
    for seed in args.seed or [2023]:
        settings = dict(dataset=args.reference, n_bits=args.bits or [16, 64], seed=seed, device=args.device)
        if args.epochs:
            settings["epochs"] = args.epochs
        fusion_cfg, trained_cfgs = stage_configs("ucmfh", **settings)
        _, random_cfgs = stage_configs("ucmfh", method_params={"fusion_start": "random"}, **settings)
        start = time.perf_counter()
        fusion, _ = fit_fusion(data, fusion_cfg, progress=False)
        fusion_seconds = time.perf_counter() - start
        for trained_cfg, random_cfg in zip(trained_cfgs, random_cfgs):
            for start_from, cfg, given, before in (("trained", trained_cfg, fusion, fusion_seconds),
                                                   ("random", random_cfg, fusion_cfg, 0.0)):
                start = time.perf_counter()
                model, _ = fit_hashing(data, cfg, given, progress=False)
                seconds = before + time.perf_counter() - start
                row = {"seed": seed, "n_bits": cfg.n_bits, "fusion_start": start_from, "epochs": cfg.epochs,
                       "seconds": round(seconds, 1)}
                for r in evaluate_hashing(model, data, ("unimodal", "fused"), 50, args.device, progress=False):
                    where = r["protocol"] + (f" {r['database']}" if "database" in r else "")  # a caption set's two
                    row[where] = [round(r["map_i2t_expected"], 4), round(r["map_t2i_expected"], 4)]
                    if "rsum_expected" in r:  # a caption set: the field's figure too
                        row[f"{where} rsum"] = round(r["rsum_expected"], 2)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\nmean over seeds, tie-aware MAP@50 I->T / T->I")
    for n_bits in sorted({r["n_bits"] for r in rows}):
        for start_from in ("trained", "random"):
            mine = [r for r in rows if r["n_bits"] == n_bits and r["fusion_start"] == start_from]
            cells = [f"{where} " + (f"{statistics.mean(r[where] for r in mine):.2f}" if where.endswith("rsum") else
                                    " / ".join(f"{statistics.mean(r[where][i] for r in mine):.4f}" for i in (0, 1)))
                     for where in mine[0] if where.startswith(("unimodal", "fused"))]
            print(f"{n_bits:>4} bits  {start_from:<8} {'  '.join(cells)}  "
                  f"seconds {statistics.mean(r['seconds'] for r in mine):.0f}  ({len(mine)} seeds)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
