#!/usr/bin/env python3
"""Time the converters on inputs the size of the real example files (not a test).

The whole set (query + retrieval) of each file in --data is written out as a
.npy / .mat v5 / .mat v7.3 / UCMFH-pkl release in a temporary folder and
converted back; --rows/--dim add a synthetic whole set of that size (e.g.
--rows 190000 --dim 1024 for NUS-WIDE), converted from .npy and .mat v7.3.

    python scripts/bench_convert.py
    python scripts/bench_convert.py --rows 190000 --dim 1024
"""
import argparse
import pickle
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import scipy.io

from ucmfh.data import load_dataset
from ucmfh.data.convert import convert_arrays, convert_pkl
from ucmfh.data.splits import SplitSizes

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def save_mat73(path, name, array, chunk_rows=8192):
    """MATLAB v7.3 layout ([N, d] stored as [d, N]), written in blocks."""
    with h5py.File(path, "w", userblock_size=512) as f:
        dset = f.create_dataset(name, shape=array.shape[::-1], dtype=array.dtype,
                                chunks=(array.shape[1], min(array.shape[0], 1024)))
        for start in range(0, array.shape[0], chunk_rows):
            dset[:, start:start + chunk_rows] = array[start:start + chunk_rows].T


def timed(label, fn):
    t0 = time.perf_counter()
    report = fn()
    print(f"  {label:<28s} {time.perf_counter() - t0:7.2f} s   {report.rows}")


def bench_file(path, tmp, sizes):
    ds = load_dataset(path)
    image = np.concatenate([ds.query.img.numpy(), ds.retrieval.img.numpy()])
    text = np.concatenate([ds.query.txt.numpy(), ds.retrieval.txt.numpy()])
    labels = np.concatenate([ds.query.labels.numpy(), ds.retrieval.labels.numpy()])
    print(f"{path.name}: {len(image)} items, image {image.shape[1]}-d, text {text.shape[1]}-d, {labels.shape[1]} classes")
    stem = tmp / path.stem
    np.save(f"{stem}-i.npy", image), np.save(f"{stem}-t.npy", text), np.save(f"{stem}-l.npy", labels)
    timed(".npy -> h5", lambda: convert_arrays(f"{stem}-i.npy", f"{stem}-t.npy", f"{stem}-l.npy",
                                               f"{stem}-npy.h5", sizes=sizes, progress=False))
    for key, array, part in (("IAll", image, "i"), ("YAll", text, "t"), ("LAll", labels, "l")):
        scipy.io.savemat(f"{stem}-{part}5.mat", {key: array.astype(np.float64)})
        save_mat73(f"{stem}-{part}73.mat", key, array.astype(np.float64))
    for fmt, label in (("5", ".mat v5 (float64) -> h5"), ("73", ".mat v7.3 (float64) -> h5")):
        timed(label,
              lambda: convert_arrays(f"{stem}-i{fmt}.mat", f"{stem}-t{fmt}.mat", f"{stem}-l{fmt}.mat",
                                     f"{stem}-mat{fmt}.h5", sizes=sizes, progress=False))
    pkl = tmp / f"{path.stem}-pkl"
    pkl.mkdir()
    for split, part in ds.splits():
        with open(pkl / f"{split}.pkl", "wb") as f:
            pickle.dump({"image": part.img.numpy(), "text": part.txt.numpy(), "label": part.labels.numpy()}, f)
    timed("UCMFH pkl -> h5", lambda: convert_pkl(pkl, f"{stem}-pkl.h5"))


def bench_synthetic(rows, dim, tmp):
    print(f"synthetic: {rows} items, image {dim}-d float32, text {dim}-d float32, 21 classes")
    rng = np.random.default_rng(0)
    labels = (rng.random((rows, 21)) < 0.1).astype(np.uint8)
    labels[np.arange(rows), rng.integers(0, 21, rows)] = 1
    np.save(tmp / "l.npy", labels)
    for part in ("i", "t"):
        arr = np.lib.format.open_memmap(tmp / f"{part}.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
        for start in range(0, rows, 16384):
            arr[start:start + 16384] = rng.standard_normal((min(16384, rows - start), dim), dtype=np.float32)
        arr.flush()
        save_mat73(tmp / f"{part}.mat", "X", arr)
        del arr
    sizes = SplitSizes(query=2100, train=10500)
    timed(".npy (memory-mapped) -> h5", lambda: convert_arrays(tmp / "i.npy", tmp / "t.npy", tmp / "l.npy",
                                                              tmp / "npy.h5", sizes=sizes))
    timed(".mat v7.3 -> h5", lambda: convert_arrays(tmp / "i.mat", tmp / "t.mat", tmp / "l.npy", tmp / "mat.h5",
                                                    sizes=sizes))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wiki.h5, mirflickr730.h5")
    parser.add_argument("--rows", type=int, default=0, help="also time a synthetic whole set of this many items")
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, sizes in (("wiki.h5", SplitSizes(query=693, train=2173)),
                            ("mirflickr730.h5", SplitSizes(query=100, train=630))):
            if (args.data / name).exists():
                bench_file(args.data / name, tmp, sizes)
            else:
                print(f"{args.data / name}: not found, skipped")
        if args.rows:
            (tmp / "syn").mkdir()
            bench_synthetic(args.rows, args.dim, tmp / "syn")


if __name__ == "__main__":
    main()
