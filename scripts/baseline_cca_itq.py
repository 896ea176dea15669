"""MAP@50 of the CCA-ITQ baseline on a dataset, both directions, per code length.

    python scripts/baseline_cca_itq.py ../shared/data/wiki.h5 -b 16 32 64 128
"""
from __future__ import annotations

import argparse

from ucmfh.baselines import fit_cca_itq
from ucmfh.data.h5 import load_dataset
from ucmfh.files import write_json_atomic
from ucmfh.scoring import random_codes_map, score_both_directions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--n-bits", "-b", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args()
    data = load_dataset(args.dataset)
    rows = []
    print(f"{'dataset':<14}{'bits asked':>11}{'bits':>6}{'I->T':>8}{'T->I':>8}{'rand I->T':>11}{'rand T->I':>11}")
    for bits in args.n_bits:
        model = fit_cca_itq(data, bits)
        scores = score_both_directions(model.codes(data.query), model.codes(data.retrieval),
                                       data.query.labels, data.retrieval.labels, args.k)
        floor = random_codes_map(data, model.n_bits, args.k)
        rows.append({"dataset": data.name, "method": "cca-itq", "protocol": "unimodal", "n_bits_asked": bits,
                     "n_bits": model.n_bits, "k": args.k, **scores,
                     "random_map_i2t": floor["map_i2t"], "random_map_t2i": floor["map_t2i"]})
        print(f"{data.name:<14}{bits:>11}{model.n_bits:>6}{scores['map_i2t']:>8.4f}{scores['map_t2i']:>8.4f}"
              f"{floor['map_i2t']:>11.4f}{floor['map_t2i']:>11.4f}")
    if args.json:
        write_json_atomic(args.json, rows)


if __name__ == "__main__":
    main()
