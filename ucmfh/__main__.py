"""``python -m ucmfh`` and the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys
from typing import NoReturn


def run() -> NoReturn:
    """The ``ucmfh`` command: importing click and torch takes seconds, and a Ctrl-C or SIGTERM meanwhile ends it as
    one at any later moment does (one line, 130 or 143; :mod:`ucmfh.signals`, which needs neither). The console
    script calls this, so its imports come after the guard."""
    from ucmfh.signals import end_program, exit_stopped, hold_signals_while_importing, run_as_program, \
        imports_of_a_program, terminate_as_interrupt

    restore = terminate_as_interrupt()
    hold_signals_while_importing("torch")  # a command imports it as it runs
    try:
        with imports_of_a_program(True):  # a signal ends it at once (inside a class body: a traceback, or -2)
            from ucmfh.app.cli import main
    except KeyboardInterrupt as err:  # Ctrl-C's, or SIGTERM's (which remembers its signal)
        exit_stopped(err)
    finally:
        restore()  # the command sets its own (ucmfh.app.cli.main)
    run_as_program()
    from ucmfh.app.errors import escape_what_output_cannot_encode, lose_what_errors_cannot_write

    lose_what_errors_cannot_write()  # 2>/dev/full, 2>&-
    escape_what_output_cannot_encode()  # > out.txt on Windows: cp1252
    try:
        code = main()  # click's: it ends in SystemExit
    except SystemExit as ended:
        code = ended.code
    end_program(code)


if __name__ == "__main__":
    sys.exit(run())
