"""``python -m ucmfh``: the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys

try:  # importing torch takes seconds: a Ctrl-C meanwhile is one line too, not an import traceback
    from ucmfh.app.cli import main
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
