"""``python -m ucmfh`` and the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys


def run() -> int:
    """The ``ucmfh`` command: importing click and torch takes seconds, and a Ctrl-C or SIGTERM meanwhile ends it as
    one at any later moment does (one line, 130 or 143; :mod:`ucmfh.signals`, which needs neither). The console
    script calls this, so its imports come after the guard."""
    from ucmfh.signals import exit_stopped, run_as_program, terminate_as_interrupt

    restore = terminate_as_interrupt()
    try:
        from ucmfh.app.cli import main
    except KeyboardInterrupt as err:  # Ctrl-C's, or SIGTERM's (which remembers its signal)
        exit_stopped(err)
    finally:
        restore()  # the command sets its own (ucmfh.app.cli.main)
    run_as_program()
    return main()


if __name__ == "__main__":
    sys.exit(run())
