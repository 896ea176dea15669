#!/usr/bin/env python3
"""A smaller copy of a dataset file for the GPU machine, whose working tree travels in 64 MiB (not a test).

Every float32 array (the features) is rounded to float16 and stored as float32 again, gzip level 9 behind
the shuffle filter, which the zeroed low mantissa bytes let compress about twice as well; every other
array, group and attribute is copied as it is, and an array under two names (a train split that is the
retrieval split) stays one array under both. The copy is a valid dataset file of its own content, so its
runs have their own identity: figures from it are those of float16-rounded features (say so beside them).
An array with a value beyond float16's range (65504) is copied unrounded, and said. The copy is written under
a temporary name, validated, then renamed: a failure or Ctrl-C leaves no file. ``flickr8k.h5`` (88.5 MB)
becomes 48.5 MiB.

    python scripts/compact_data.py ../shared/data/flickr8k.h5 gpu-data/flickr8k.h5
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import h5py
import numpy as np

from ucmfh.data.h5 import DataError, validate_file
from ucmfh.files import atomic_file
from ucmfh.signals import stop_on_signals

ROWS_PER_CHUNK = 1024
NOTE = "features rounded to float16 (stored float32) by scripts/compact_data.py"
FLOAT16_MAX = float(np.finfo(np.float16).max)


def compact(src: str, dst: str) -> List[str]:
    """Write the compact copy of ``src`` to ``dst`` (under a temporary name, validated, renamed when complete);
    returns the arrays copied unrounded (a value beyond float16's range: rounded, it would be inf)."""
    with atomic_file(dst) as tmp:
        unrounded = _copy(src, tmp)
        try:
            validate_file(tmp)
        except DataError as err:
            raise DataError(str(err).replace(tmp, dst)) from None
    return unrounded


def _copy(src: str, tmp: str) -> List[str]:
    unrounded: List[str] = []
    # Ctrl-C (or SIGTERM) stops the copy between two arrays: raised inside h5py, it landed in a weakref callback,
    # where Python prints it and goes on, and the copy ran to its end
    with stop_on_signals() as stop, h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        g.attrs.update(dict(f.attrs))
        g.attrs["compacted"] = NOTE

        copied: Dict[object, str] = {}  # an object reached before -> its path in the copy

        def copy(group: h5py.Group) -> None:
            for key, obj in group.items():
                if stop["signal"] is not None:
                    raise KeyboardInterrupt
                name = obj.name
                if obj.id in copied:  # an object under two names (a file's train split that is its retrieval
                    g[name] = g[copied[obj.id]]  # split): one object in the copy too, under both
                    continue
                copied[obj.id] = name
                if isinstance(obj, h5py.Group):
                    g.require_group(name).attrs.update(dict(obj.attrs))
                    copy(obj)
                elif obj.dtype == np.float32 and obj.ndim >= 1 and len(obj):
                    data = obj[()]
                    if np.abs(data).max() <= FLOAT16_MAX:
                        data = data.astype(np.float16).astype(np.float32)
                    else:
                        unrounded.append(name)
                    chunks = (min(len(data), ROWS_PER_CHUNK), *data.shape[1:])
                    g.create_dataset(name, data=data, chunks=chunks, compression="gzip", compression_opts=9,
                                     shuffle=True).attrs.update(dict(obj.attrs))
                else:
                    f.copy(obj, g, name)

        copy(f)
    return unrounded


def _error(message: str) -> int:
    print(f"compact_data.py: error: {' '.join(message.split())}", file=sys.stderr)  # one line (HDF5's span two)
    return 2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="A dataset file (.h5).")
    p.add_argument("dst", help="The copy to write (its folder is created; an existing file is refused).")
    args = p.parse_args(argv)
    if not args.dst:
        return _error("dst: an empty path; name the copy to write")
    if not os.path.isfile(args.src):
        return _error(f"{args.src}: no such file" + (" (a folder)" if os.path.isdir(args.src) else ""))
    if os.path.exists(args.dst):
        return _error(f"{args.dst}: exists; remove it first")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
        unrounded = compact(args.src, args.dst)
    except KeyboardInterrupt:
        _error(f"{args.dst}: interrupted; nothing written")
        return 130
    except (OSError, DataError) as e:  # reading src, writing dst (a message of h5py's names the file)
        return _error(f"{args.src} -> {args.dst}: {e}")
    for name in unrounded:
        print(f"{args.dst}: {name}: copied unrounded (a value beyond float16's range, {FLOAT16_MAX:g})")
    print(f"{args.dst}: {os.path.getsize(args.dst) / 2**20:.1f} MiB ({os.path.getsize(args.src) / 2**20:.1f} MiB before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
