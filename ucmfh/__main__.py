"""``python -m ucmfh`` and the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import signal
import sys


def _terminated(signum, frame):  # noqa: ARG001 - signal handler signature
    sys.stderr.write("terminated\n")
    sys.exit(128 + signum)


def run() -> int:
    """The ``ucmfh`` command: importing torch takes seconds, and a Ctrl-C or SIGTERM meanwhile is one line too, not
    an import traceback or a silent death (the console script calls this, so its imports come after the guard);
    then the command's own handling takes over (:func:`ucmfh.app.errors.terminate_as_interrupt`)."""
    default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if default:
        signal.signal(signal.SIGTERM, _terminated)
    try:
        from ucmfh.app.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    finally:
        if default:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    sys.exit(run())
