"""Datasets in the ucmfh HDF5 format."""
from ucmfh.data.h5 import DataError, Dataset, Split, load_dataset, validate_file, write_dataset

__all__ = ["DataError", "Dataset", "Split", "load_dataset", "validate_file", "write_dataset"]
