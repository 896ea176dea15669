"""Seeds and devices: the one place each is decided."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator for the run's own draws.

    Shuffles and masks are drawn from the returned CPU generator, so a seed
    gives the same batches on every device.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return torch.Generator().manual_seed(seed)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else the CPU.

    An unknown device name, or CUDA on a machine where torch sees none, is a
    ``ValueError`` that says so (never a silent fall-back to the CPU).
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r}: unknown; use auto, cpu, cuda or cuda:N") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ValueError(f"device {device!r}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
                             f"{build}); choose cpu or auto")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif resolved.type != "cpu":
        raise ValueError(f"device {device!r}: ucmfh runs on cpu or cuda")
    return resolved
