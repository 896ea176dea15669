"""Datasets in the ucmfh HDF5 format.

The loaders (:mod:`ucmfh.data.h5`, which imports torch) and the writer (:mod:`ucmfh.data.writer`) load on first use, so that
``ucmfh.data.format`` serves a CPU search without them.
"""
from typing import Any

__all__ = ["DataError", "Dataset", "Split", "load_dataset", "validate_file", "write_dataset"]


def __getattr__(name: str) -> Any:
    if name == "write_dataset":
        from ucmfh.data import writer

        return writer.write_dataset
    if name in __all__:
        from ucmfh.data import h5

        return getattr(h5, name)
    raise AttributeError(f"module 'ucmfh.data' has no attribute {name!r}")
