"""Entry point on each rank: ``python -m mpi_magic.runtime JOB_DIR [--digest SHA256]`` for one
cell, or ``python -m mpi_magic.runtime --session SOCKET [--idle-timeout SECONDS]`` for a session."""

import gc
import sys

if __name__ == "__main__":
    gc.disable()  # the runtime's start-up makes no garbage worth collecting: rank.start_up turns it back on
    if "--session" in sys.argv[1:2]:
        from .cell_loop import main
    else:
        from .rank import main
    sys.exit(main(sys.argv[1:]))
