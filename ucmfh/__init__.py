"""ucmfh: deep cross-modal hashing on precomputed image and text features."""
__version__ = "0.1.0"
