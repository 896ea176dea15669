"""Codes of a trained model over a large synthetic collection, for scripts/bench_mih.py (docs/search.md).

    python scripts/trained_codes.py --out /tmp/trained --items 10000000 --bits 64 128
    python scripts/bench_mih.py --words /tmp/trained/txt64.npy --query-words /tmp/trained/img64.npy

Steps, each skipped when its output is there:

1. A small training file of the synthetic model of ``ucmfh make-synthetic`` (docs/data.md: labels from
   a skewed prior, a class + item latent, two different random non-linear maps, noise, L2 norm), narrow
   features (``--dim``, 64-d each: 10M × 512-d would not fit this machine), ``--train`` items.
2. ``ucmfh train-hash`` on it: the default method, each of ``--bits``.
3. ``--items`` more items of the *same* model (the same prototypes and maps, new labels, latents and
   noise), drawn and encoded by blocks, so memory stays near one block: the text codes of every item
   (what a search of captions holds) and the image codes of ``--queries`` items (what asks), as the
   kernels' uint64 words ``txtB.npy`` [N, B / 64] and ``imgB.npy`` [Q, B / 64].

The model is written out here rather than taken from :func:`ucmfh.data.synthetic.make_synthetic_arrays`,
which draws every item at once from one generator: its order of draws (and so every synthetic figure in
the docs) stays as it is.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

import numpy as np

from ucmfh.bits import as_words
from ucmfh.data.writer import write_dataset
from ucmfh.search.build import Encoder


class Model:
    """The synthetic model's fixed parts (class prior, prototypes, the two modality maps) from one seed."""

    def __init__(self, n_classes: int, dim: int, d_latent: int = 64, seed: int = 0, mean_extra: float = 1.5,
                 noise: float = 2.0) -> None:
        rng = np.random.default_rng(seed)
        prior = 1.0 / np.arange(1, n_classes + 1) ** 0.8
        self.prior = rng.permutation(prior / prior.sum())
        self.prototypes = rng.normal(size=(n_classes, d_latent))
        self.maps = {m: (rng.normal(size=(d_latent, 2 * d_latent)), rng.normal(size=(2 * d_latent, dim)))
                     for m in ("image", "text")}
        self.n_classes, self.d_latent, self.mean_extra, self.noise = n_classes, d_latent, mean_extra, noise

    def draw(self, n: int, rng: np.random.Generator) -> dict:
        counts = np.minimum(1 + rng.poisson(self.mean_extra, size=n), self.n_classes)
        keys = np.log(self.prior)[None, :] + rng.gumbel(size=(n, self.n_classes))  # Gumbel top-k, as make-synthetic
        labels = (np.argsort(np.argsort(-keys, axis=1), axis=1) < counts[:, None]).astype(np.uint8)
        latent = labels @ self.prototypes / np.sqrt(labels.sum(axis=1, keepdims=True))
        latent = latent + rng.normal(size=(n, self.d_latent))
        out = {"labels": labels}
        for m, (w1, w2) in self.maps.items():
            signal = np.tanh(latent @ w1 / np.sqrt(self.d_latent) * 2.0) @ w2 / np.sqrt(2 * self.d_latent)
            x = signal + self.noise * signal.std() * rng.normal(size=signal.shape)
            out[m] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the training file, the runs and the codes")
    parser.add_argument("--items", type=int, default=10_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--bits", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=24)
    parser.add_argument("--train", type=int, default=20_000)
    parser.add_argument("--block", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = Model(args.classes, args.dim, seed=args.seed)

    data = os.path.join(args.out, "narrow.h5")
    if not os.path.exists(data):
        rng = np.random.default_rng(args.seed + 1)
        n_query, n_retrieval = 2000, args.train
        items = model.draw(n_query + n_retrieval, rng)
        ids = np.arange(n_query + n_retrieval, dtype=np.int64)

        def take(rows: np.ndarray) -> dict:
            return {**{k: v[rows] for k, v in items.items()}, "ids": ids[rows]}

        retrieval = np.arange(n_query, n_query + n_retrieval)
        write_dataset(data, {"train": take(retrieval), "query": take(np.arange(n_query)), "retrieval": take(retrieval)},
                      attrs={"name": "narrow", "source": f"scripts/trained_codes.py {vars(args)}"})
    for bits in args.bits:
        results = os.path.join(args.out, "train.jsonl")
        found = glob.glob(os.path.join(args.out, "runs", "*", "*", f"hash{bits}.pt"))
        if not found:
            subprocess.run([sys.executable, "-m", "ucmfh", "train-hash", "-d", data, "-b", str(bits), "--out",
                            os.path.join(args.out, "runs"), "--results", results, "--quiet"], check=True)
            found = glob.glob(os.path.join(args.out, "runs", "*", "*", f"hash{bits}.pt"))
        encoder = Encoder(found[0])
        txt_path, img_path = (os.path.join(args.out, f"{m}{bits}.npy") for m in ("txt", "img"))
        if os.path.exists(txt_path) and os.path.exists(img_path):
            continue
        rng = np.random.default_rng(args.seed + 2)  # the same items for every length
        codes = np.lib.format.open_memmap(txt_path + ".part", mode="w+", dtype=np.uint64,
                                          shape=(args.items, -(-bits // 64)))
        start = time.perf_counter()
        for a in range(0, args.items, args.block):
            block = model.draw(min(args.block, args.items - a), rng)
            codes[a:a + len(block["text"])] = as_words(encoder.encode(block["text"], "txt"), bits)
            print(f"{bits} bits: {a + len(block['text']):,} of {args.items:,} items encoded "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        codes.flush()
        del codes
        os.replace(txt_path + ".part", txt_path)
        asked = model.draw(args.queries, rng)
        np.save(img_path, as_words(encoder.encode(asked["image"], "img"), bits))
        print(f"wrote {txt_path} and {img_path}", flush=True)


if __name__ == "__main__":
    main()
