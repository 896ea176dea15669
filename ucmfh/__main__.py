"""``python -m ucmfh``: the ``ucmfh`` command (also under ``torchrun -m ucmfh``)."""
import sys

from ucmfh.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
