"""``python -m mpi_magic.submit FOLDER``: run a cell that ``%mpirun_export`` wrote to FOLDER, as its
notebook ran it (same backend, shape and options), from a terminal or CI: every rank's output is
printed, the exit status is 1 when the job fails (2 when it cannot run), and what the cell assigned goes to
``FOLDER/results.pickle``. SIGTERM stops the job as Ctrl-C does (status 143; 130 for Ctrl-C), so a
cancelled CI run leaves no job running."""

from __future__ import annotations

import os
import re
import signal
import sys
import types

USAGE = "usage: python -m mpi_magic.submit FOLDER (a folder %mpirun_export wrote)"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    from IPython.core.error import UsageError

    from .errors import JobError, MpiMagicError
    from .notebook import export, pipeline
    from .backends import registry
    from .shared import jobdir
    from .view.console import ConsoleEcho

    folder = os.path.abspath(argv[0])
    try:
        exported = export.read(folder)
    except (OSError, ValueError) as exc:
        print(f"mpi_magic: {folder} holds no export that can be read ({exc}); %mpirun_export writes one", file=sys.stderr)
        return 2
    export.forget_results(folder)
    signal.signal(signal.SIGTERM, _terminate)
    config = registry.config()
    config.update("view=text")
    echo = ConsoleEcho(every_rank=True)
    try:
        run = pipeline.run_exported(folder, exported, export.launch_options(exported, folder), config, echo)
    except JobError as exc:  # as the notebook shows it (a rank's own traceback), less what only a notebook can do
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in exc._render_traceback_()]
        print("\n".join(line for line in lines if not line.startswith("%mpirun_debug")), file=sys.stderr)
        return 1
    except (UsageError, MpiMagicError) as exc:
        print(f"mpi_magic: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # the job was stopped on the way out (the pipeline said so)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    except Exception as exc:  # a file gone, AWS refusing: not the cell's failure, so not status 1
        print(f"mpi_magic: the job could not run: {exc} ({type(exc).__name__})", file=sys.stderr)
        return 2
    import cloudpickle

    values = {name: value for name, value in run.values.items() if not isinstance(value, types.ModuleType)}
    path = os.path.join(folder, export.RESULTS_FILE)
    with jobdir.open_private(path, "wb") as f:
        cloudpickle.dump(values, f)
    echo.say(f"results written to {path}: {', '.join(values) or 'nothing'}")
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM (how CI cancels a run), raised where Ctrl-C would be, so the job is stopped the same way."""


def _terminate(signum, frame) -> None:
    raise Terminated()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
