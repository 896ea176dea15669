"""Stopping a long loop at a safe point on SIGINT or SIGTERM (:func:`stop_on_signals`), and what a stopped
training run raises (:class:`TrainingInterrupted`), or other stopped work (:func:`stopped_by`); SIGTERM as Ctrl-C
(:func:`terminate_as_interrupt`), a process's end by either (:func:`exit_stopped`), either held while torch imports
(:func:`hold_signals_while_importing`), once a program's work is over (:func:`work_over`), and a program's end
without the interpreter's teardown (:func:`end_program`). Neither click nor torch is imported here: a command sets
these before it imports them."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, Callable, Collection, Dict, Iterator, NoReturn, Optional, Tuple


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by a signal (``signum``; None: one that reached another rank); ``state_path``
    holds its saved state (or None)."""

    def __init__(self, message: str, state_path: Optional[str], signum: Optional[int] = None) -> None:
        super().__init__(message)
        self.state_path = state_path
        self.signum = signum


def stopped_by(message: str, signum: Optional[int]) -> KeyboardInterrupt:
    """An interrupt saying ``message`` that remembers the signal that stopped the work (None: Ctrl-C's)."""
    err = KeyboardInterrupt(message)
    err.signum = signum  # type: ignore[attr-defined]
    return err


# how long an interrupt Python could not raise waits to be sent again: for the code that lost it to have returned
RESEND_AFTER_S = 0.02


def send_again(signum: int) -> None:
    """Send ``signum`` to this process again a moment later (:data:`RESEND_AFTER_S`), from a thread: it is raised
    where the process's own code runs then."""
    timer = threading.Timer(RESEND_AFTER_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def resend_lost_interrupts() -> None:
    """Install, once a process, a ``sys.unraisablehook`` under which a ``KeyboardInterrupt`` that Python could not
    raise where it came (a signal handler's, run inside a weakref callback, a ``__del__`` or importlib's module
    lock callback: 'Exception ignored in ...', a traceback on stderr, and the stop lost: a command went on to its
    end and exit 0 after SIGTERM) is said nowhere, and its signal is sent to this process again a moment later,
    from a thread, to be raised where the process's own code runs. Other exceptions go to the hook there was."""
    previous = sys.unraisablehook
    if getattr(previous, "resends_interrupts", False):
        return

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous(unraisable)
            return
        signum = getattr(unraisable.exc_value, "signum", None) or signal.SIGINT
        send_again(signum)

    hook.resends_interrupts = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


_LOCK = threading.Lock()
# the loops under way in threads other than the main one: their thread and flag, by the flag's id
_IN_THREADS: Dict[int, Tuple[int, Dict[str, Optional[int]]]] = {}


def stop_threads(signum: int, threads: Optional[Collection[int]] = None) -> None:
    """Every loop under way inside :func:`stop_on_signals` in a thread other than the main one (or in ``threads``
    alone, by :func:`threading.get_ident`) stops at its next safe point, as ``signum`` stops a loop of the main
    thread (runs side by side in threads: ``ucmfh grid --jobs N --workers threads``). A loop that starts later is
    not stopped: call it again."""
    with _LOCK:
        for thread, flag in _IN_THREADS.values():
            if threads is None or thread in threads:
                flag["signal"] = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Dict[str, Optional[int]]]:
    """While training (or another long loop that commits its work step by step, as an index build does),
    SIGINT and SIGTERM set ``flag["signal"]`` instead of killing the step in progress; the loop stops at its
    next safe point. (A KeyboardInterrupt could land anywhere, even in a callback that swallows it.) In a thread
    other than the main one, which hears no signal, the loop stops where :func:`stop_threads` says so."""
    flag: Dict[str, Optional[int]] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread alone
        with _LOCK:
            _IN_THREADS[id(flag)] = (threading.get_ident(), flag)
        try:
            yield flag
        finally:
            with _LOCK:
                del _IN_THREADS[id(flag)]
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """While inside, a SIGINT or SIGTERM whose handler is Python's is held; once the block ends, the signal is sent
    again (:func:`send_again`), to be raised where the process's own code runs (raised at the block's end, inside
    an import, it would undo the module imported: ``sys.modules`` drops a module whose code raised). In the main
    thread alone (elsewhere, nothing is held)."""
    heard: list = []
    previous: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            if callable(signal.getsignal(signum)):  # not SIG_DFL or SIG_IGN: those act as they would
                previous[signum] = signal.signal(signum, lambda heard_signum, frame: heard.append(heard_signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if heard:
            send_again(heard[0])


SAID_WHEN_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _exit_flushed(code: int) -> NoReturn:
    """End the process at once with ``code``, its standard output and error flushed first (what a stream closed,
    mid-write or read by a reader gone, ``| head``, held is lost, as it would be)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream closed, mid-write (a reentrant flush) or its reader gone
            pass
    os._exit(code)


@contextlib.contextmanager
def imports_of_a_program(program: Optional[bool] = None) -> Iterator[None]:
    """While a program imports what its command needs, before any work (nothing written, nothing to undo): a
    SIGINT or SIGTERM ends it at once, one line ('interrupted', 'terminated') and 130 or 143, where raised there,
    inside a class body, a C module's set-up or an ``exec`` of a string (a dataclass's methods are made so), an
    interrupt became another error (a traceback, exit 1) or left CPython's mark of a Ctrl-C unhandled, which
    killed the process by SIGINT at its exit (-2) whatever caught it. ``program``: whether this process is one
    (None: as :func:`run_as_program` marked it); one that is not (a command run in-process: a test, a notebook)
    is left as it is. A signal whose action is not Python's (ignored: a job started in the background) stays so;
    in the main thread alone."""
    if not (_PROGRAM["running"] if program is None else program) or \
            threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        print(SAID_WHEN_STOPPED[signum], file=sys.stderr)
        _exit_flushed(128 + signum)

    previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)
                if callable(signal.getsignal(signum))}
    try:
        yield
    finally:
        for signum, was in previous.items():
            signal.signal(signum, was)


class _HoldSignalsWhileImporting:
    """A ``sys.meta_path`` finder that runs the first import of ``name`` under :func:`signals_held`, then leaves."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)  # the finders' own
        exec_module = getattr(spec.loader, "exec_module", None) if spec is not None else None
        if exec_module is not None:
            def held(module: Any) -> None:
                with signals_held():
                    exec_module(module)

            spec.loader.exec_module = held  # this spec's loader alone
        return spec


def hold_signals_while_importing(name: str = "torch") -> None:
    """A program's first import of ``name`` (torch: a second or two) hears no SIGINT or SIGTERM until it is done;
    one that came is raised then. Torch's import calls Python from C++ (pybind11): a Ctrl-C raised there became a
    C++ exception that ended the process in 'terminate called after throwing an instance of
    pybind11::error_already_set' and SIGABRT (-6; 2 of 30 Ctrl-Cs half a second into 'ucmfh train-hash')."""
    if name not in sys.modules and not any(isinstance(f, _HoldSignalsWhileImporting) and f.name == name
                                           for f in sys.meta_path):
        sys.meta_path.insert(0, _HoldSignalsWhileImporting(name))


def terminate_as_interrupt() -> Callable[[], None]:
    """Until the returned function is called, SIGTERM ends the command as Ctrl-C does (a ``KeyboardInterrupt``
    that remembers the signal: a file half-written is removed, one line is said, exit 143), where it would
    have killed the process on the spot, leaving its temporary files. Only where SIGTERM has its default
    action, in the main thread (a parent that set it otherwise keeps its own). An interrupt raised where Python
    drops it (a weakref callback) is sent again (:func:`resend_lost_interrupts`). Needs neither click nor torch:
    the ``ucmfh`` command and demo.py set it before they import either."""
    resend_lost_interrupts()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return lambda: None

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        raise stopped_by("terminated", signum)

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is handler:  # not one set since (work_over's)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


def exit_stopped(err: KeyboardInterrupt, text: Optional[str] = None) -> NoReturn:
    """End the process as ``err`` stopped it: ``text`` (else its words, else 'interrupted') on stderr, nothing where
    ``text`` is '', and the shell's exit code of its signal (128 + its number: 130 for SIGINT, 143 for SIGTERM; an
    interrupt that names no signal, ``signum``, is Ctrl-C's). Needs neither click nor torch (a Ctrl-C while the
    ``ucmfh`` command imports them); the commands' own stops say more (``ucmfh.app.errors.interrupted``)."""
    text = (str(err) or "interrupted") if text is None else text
    if text:
        print(text, file=sys.stderr)
    signum: Optional[int] = getattr(err, "signum", None)
    sys.exit(128 + signum if signum else 128 + signal.SIGINT)


_PROGRAM = {"running": False}


def run_as_program() -> None:
    """Mark this process as a program, the ``ucmfh`` command or demo.py run as a script, whose end is its command's
    end (its entry point calls this; a command called in-process, as the tests and a notebook call them, is not)."""
    _PROGRAM["running"] = True


def work_over() -> None:
    """A program's command has done its work and said so: from here to the process's end (click's exit, then the
    interpreter's teardown with torch loaded, a second or more) Ctrl-C and SIGTERM end it at once, its output
    flushed, exit 130 or 143 and nothing more said, where a Ctrl-C made click say 'Aborted!' and exit 1, a SIGTERM
    killed it silently (-15), losing lines of output not yet flushed, and a Ctrl-C could be lost (exit 0). A signal
    a parent had ignored (a job started in the background) stays ignored. Nothing where the process is not a
    program (:func:`run_as_program`), or in a thread other than the main one."""
    if not _PROGRAM["running"] or threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        _exit_flushed(128 + signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: a handler not set from Python
            signal.signal(signum, handler)


def end_program(code: object) -> NoReturn:
    """End a program (:func:`run_as_program`) whose command has ended, with ``code`` as ``sys.exit`` takes it: the
    functions registered with ``atexit`` run and the output is flushed, then the process ends at once, not through
    the interpreter's teardown. There CPython puts SIGINT and SIGTERM back to their default action, and with
    torch loaded the teardown lasts a third of a second or more: a signal then killed the process (-2, -15), where
    :func:`work_over`'s handlers end it 130 or 143. Not a program (a command called in-process): ``sys.exit``."""
    if not _PROGRAM["running"] or threading.current_thread() is not threading.main_thread():
        sys.exit(code)
    import atexit

    status = 0 if code is None else code if isinstance(code, int) else 1
    if not isinstance(code, int) and code is not None:  # a message, as sys.exit prints it
        print(code, file=sys.stderr)
    atexit._run_exitfuncs()  # noqa: SLF001 - what the interpreter's exit runs, run here before leaving
    _exit_flushed(status)
