#!/usr/bin/env python3
"""A smaller copy of a dataset file for the GPU machine, whose working tree travels in 64 MiB (not a test).

Every float32 array (the features) is rounded to float16 and stored as float32 again, gzip level 9 behind
the shuffle filter, which the zeroed low mantissa bytes let compress about twice as well; every other
array, group and attribute is copied as it is, and an array under two names (a train split that is the
retrieval split) stays one array under both. The copy is a valid dataset file of its own content, so its
runs have their own identity: figures from it are those of float16-rounded features (say so beside them).
``flickr8k.h5`` (88.5 MB) becomes 48.5 MiB.

    python scripts/compact_data.py ../shared/data/flickr8k.h5 gpu-data/flickr8k.h5
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict

import h5py
import numpy as np

ROWS_PER_CHUNK = 1024
NOTE = "features rounded to float16 (stored float32) by scripts/compact_data.py"


def compact(src: str, dst: str) -> None:
    """Write the compact copy of ``src`` to ``dst`` (under a temporary name, renamed when complete)."""
    tmp = dst + ".part"
    with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        g.attrs.update(dict(f.attrs))
        g.attrs["compacted"] = NOTE

        copied: Dict[object, str] = {}  # an object reached before -> its path in the copy

        def copy(group: h5py.Group) -> None:
            for key, obj in group.items():
                name = obj.name
                if obj.id in copied:  # an object under two names (a file's train split that is its retrieval
                    g[name] = g[copied[obj.id]]  # split): one object in the copy too, under both
                    continue
                copied[obj.id] = name
                if isinstance(obj, h5py.Group):
                    g.require_group(name).attrs.update(dict(obj.attrs))
                    copy(obj)
                elif obj.dtype == np.float32 and obj.ndim >= 1 and len(obj):
                    data = obj[()].astype(np.float16).astype(np.float32)
                    chunks = (min(len(data), ROWS_PER_CHUNK), *data.shape[1:])
                    g.create_dataset(name, data=data, chunks=chunks, compression="gzip", compression_opts=9,
                                     shuffle=True).attrs.update(dict(obj.attrs))
                else:
                    f.copy(obj, g, name)

        copy(f)
    os.replace(tmp, dst)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="A dataset file (.h5).")
    p.add_argument("dst", help="The copy to write (its folder is created; an existing file is refused).")
    args = p.parse_args(argv)
    if not os.path.isfile(args.src):
        p.error(f"{args.src}: no such file")
    if os.path.exists(args.dst):
        p.error(f"{args.dst}: exists; remove it first")
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    try:
        compact(args.src, args.dst)
    except OSError as e:
        print(f"compact_data.py: error: {args.src}: {e}", file=sys.stderr)
        return 2
    print(f"{args.dst}: {os.path.getsize(args.dst) / 2**20:.1f} MiB ({os.path.getsize(args.src) / 2**20:.1f} MiB before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
