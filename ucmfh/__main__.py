"""``python -m ucmfh`` and the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys


def run() -> int:
    """The ``ucmfh`` command: importing torch takes seconds, and a Ctrl-C or SIGTERM meanwhile ends it as one at
    any later moment does (one line, 130 or 143; :mod:`ucmfh.app.errors`, which needs click alone, not torch).
    The console script calls this, so its imports come after the guard."""
    from ucmfh.app.errors import interrupted, terminate_as_interrupt

    restore = terminate_as_interrupt()
    try:
        from ucmfh.app.cli import main
    except KeyboardInterrupt as err:  # Ctrl-C's, or SIGTERM's (which remembers its signal)
        interrupted(err)
    finally:
        restore()  # the command sets its own (ucmfh.app.cli.main)
    return main()


if __name__ == "__main__":
    sys.exit(run())
