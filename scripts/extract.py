#!/usr/bin/env python3
"""CLIP features of images + captions -> ucmfh HDF5 (same as `ucmfh extract`).

    python scripts/extract.py IMAGES/ captions.tsv labels.tsv OUT.h5 --standard-split coco
"""
from ucmfh.data.cli import extract

if __name__ == "__main__":
    extract()
