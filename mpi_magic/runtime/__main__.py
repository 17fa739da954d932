"""Entry point on each rank: ``python -m mpi_magic.runtime JOB_DIR [--digest SHA256]``."""

import sys

from .rank import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
