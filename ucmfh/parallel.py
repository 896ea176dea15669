"""Work over contiguous ranges of rows, one range per thread: the compiled kernels release the GIL, so
the ranges run in parallel, each writing its own rows of the output."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def default_threads() -> int:
    """The CPUs this process may use (its affinity where the system says it, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def over_ranges(n: int, parts: int, work: Callable[[int, int], None]) -> None:
    """Call ``work(a, b)`` on ``parts`` (at least 1) contiguous ranges covering ``range(n)``, on as many
    threads; one part runs in the calling thread."""
    parts = max(1, parts)
    if parts == 1:
        work(0, n)
        return
    bounds = [n * i // parts for i in range(parts + 1)]
    with ThreadPoolExecutor(parts) as pool:
        for f in [pool.submit(work, a, b) for a, b in zip(bounds[:-1], bounds[1:])]:
            f.result()
