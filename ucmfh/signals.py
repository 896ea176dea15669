"""Stopping a long loop at a safe point on SIGINT or SIGTERM (:func:`stop_on_signals`), and what a stopped
training run raises (:class:`TrainingInterrupted`)."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Dict, Iterator, Optional


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal (``signum``; None: one that reached another rank); ``state_path``
    holds its saved state (or None)."""

    def __init__(self, message: str, state_path: Optional[str], signum: Optional[int] = None) -> None:
        super().__init__(message)
        self.state_path = state_path
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Dict[str, Optional[int]]]:
    """While training (or another long loop that commits its work step by step, as an index build does),
    SIGINT and SIGTERM set ``flag["signal"]`` instead of killing the step in progress; the loop stops at its
    next safe point. (A KeyboardInterrupt could land anywhere, even in a callback that swallows it.)"""
    flag: Dict[str, Optional[int]] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
