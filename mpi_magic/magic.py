"""The IPython magics: glue only (parse the line, run the cell, write the namespace)."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from . import execute
from .errors import BackendNotAvailable, LauncherNotFound
from .options import Config, launch_arguments, parse_line

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class MpiMagics(Magics):
    shell: InteractiveShell  # registered with one, always
    def __init__(self, shell, config: Config | None = None):
        super().__init__(shell)
        self.defaults = config or Config()

    @cell_magic
    @magic_arguments()
    @launch_arguments
    def mpirun_remote(self, line: str, cell: str):
        """Run this cell as MPI ranks (instances x gpus), bring what it assigns back.

        Names the cell reads travel to every rank; after a successful run, the names it
        assigns come back from rank 0 (with --gather, as lists by rank). Inside the cell,
        mpi_magic.rank(), world_size(), local_rank(), instance() and num_instances() say
        where a rank runs; mpi4py works as usual. Defaults: %mpirun_config.
        """
        options = parse_line(self.mpirun_remote, line, self.defaults)
        source = self.shell.transform_cell(cell)
        user_ns = self.shell.user_ns

        def keep_handle(job):
            if options.out:
                user_ns[options.out] = job

        try:
            run = execute.run_cell(source, user_ns, options, self.defaults, on_job=keep_handle,
                                   deliver=user_ns.update)
        except (BackendNotAvailable, LauncherNotFound) as exc:
            raise UsageError(str(exc)) from None
        user_ns.update(run.values)
        return run.output if run.has_output else None

    @line_magic
    @magic_arguments()
    @argument("job_name", metavar="JOB_NAME",
              help="The training job to follow (see %%mpirun_jobs).")
    @argument("--out", default=None, metavar="NAME", help="Store the job handle in the notebook under NAME.")
    def mpirun_attach(self, line: str):
        """Follow a SageMaker job started earlier, e.g. after a kernel restart.

        Rebuilds the dashboard from the job's status and logs, and brings its results back
        into the notebook when it ends. Interrupting stops the job, as for a running cell.
        """
        try:
            args = _parse(self.mpirun_attach, line)
        except (UsageError, ValueError):  # argparse's complaint, or quotes that do not close
            raise UsageError("usage: %mpirun_attach JOB_NAME [--out NAME]; "
                             "%mpirun_jobs lists your recent jobs") from None
        try:
            run = execute.attach(args.job_name, self.shell.user_ns, self.defaults)
        except BackendNotAvailable as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns.update(run.values)
        if args.out:
            self.shell.user_ns[args.out] = run.job
        return run.output if run.has_output else None

    @line_magic
    def mpirun_jobs(self, line: str):
        """List the SageMaker jobs started from this machine (newest first), with their status."""
        from .backends.sagemaker.history import recent_jobs

        jobs = recent_jobs()
        if not jobs:
            print("no SageMaker jobs started from here yet")
        for record in jobs:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["created"]))
            print(f"{record['name']:<40} {started}  {record['status']:<11} {record['secondary']}")

    @line_magic
    def mpirun_config(self, line: str):
        """Show or set defaults for later %%mpirun_remote cells.

        %mpirun_config                      show every setting and where its value comes from
        %mpirun_config instances=2 gpus=4   set defaults (key= with no value unsets one)
        %mpirun_config --reset              forget everything set here

        Each setting can also come from an MPI_MAGIC_<NAME> environment variable; a cell's
        own options win over both.
        """
        line = line.strip()
        if line == "--reset":
            self.defaults.reset()
        elif line:
            self.defaults.update(line)
            return None
        print(self.defaults.describe())
        return None


def _parse(magic_func, line: str):
    """A line magic's arguments, quoted as in a shell, no abbreviated options (``UsageError``)."""
    parser = magic_func.parser
    parser.allow_abbrev = False
    return parser.parse_args(shlex.split(line))
