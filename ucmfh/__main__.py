"""``python -m ucmfh`` and the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys


def run() -> int:
    """The ``ucmfh`` command: importing torch takes seconds, and a Ctrl-C meanwhile is one line too, not an
    import traceback (the console script calls this, so its imports come after the guard)."""
    try:
        from ucmfh.app.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
