#!/usr/bin/env python3
"""Convert released feature files to the ucmfh HDF5 format (same as `ucmfh convert`).

    python scripts/convert.py pkl FOLDER OUT.h5
    python scripts/convert.py mat mirflickr25k-iall.mat mirflickr25k-yall.mat mirflickr25k-lall.mat OUT.h5 --standard-split mirflickr
    python scripts/convert.py npz image.npy text.npy labels.npy OUT.h5 --query 100 --train 500
"""
from ucmfh.data.cli import convert

if __name__ == "__main__":
    convert()
