"""The IPython magics: glue only (parse the line, run the cell, write the namespace)."""

from __future__ import annotations

import os
import shlex
import time
from collections import deque
from typing import TYPE_CHECKING

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from .notebook import debugger, export, pipeline
from .errors import BackendNotAvailable, JobError, LauncherNotFound, counted, ranks_phrase
from .backends import registry
from .backends.registry import launch_arguments, session_start_arguments
from .options import Config
from .shared import cell, jobdir
from .notebook.job import Job
from .notebook.session import Session
from .notebook.session import describe as describe_session
from .view.console import ConsoleEcho
from .view.summary import headline, roll_call_phrase

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


RECENT_JOBS = 16  # jobs of this notebook %mpirun_debug can go back to


@magics_class
class MpiMagics(Magics):
    shell: InteractiveShell  # registered with one, always
    def __init__(self, shell, config: Config | None = None):
        super().__init__(shell)
        self.defaults = config or registry.config()
        self.session: Session | None = None  # the session cells run on, while one is up
        self.recent_jobs: deque[Job] = deque(maxlen=RECENT_JOBS)  # newest last: %mpirun_debug looks for a failed one
        shell.events.register("pre_run_cell", self._notebook_cell)

    @property
    def latest_job(self) -> Job | None:
        """The newest cell's job, which %mpirun_stacks asks by default."""
        return self.recent_jobs[-1] if self.recent_jobs else None

    def _notebook_cell(self, info) -> None:
        """Code other than a session cell may change the values a session's ranks were sent."""
        if self.session is not None and not (info.raw_cell or "").lstrip().startswith("%%mpirun_remote"):
            self.session.holdings.notebook_ran()

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
        live = self.session if self.session is not None and self.session.status != "stopped" else None
        options = registry.parse_line(self.mpirun_remote, line, self.defaults, live.options if live else None)
        source = self.shell.transform_cell(cell)
        user_ns = self.shell.user_ns

        def keep_handle(job):
            self.recent_jobs.append(job)
            if options.out:
                user_ns[options.out] = job

        session = self._session_for(options)
        cell_file = self._cell_file(source)
        try:
            if session is not None:
                run = pipeline.run_in_session(session, source, user_ns, options, self.defaults, on_job=keep_handle,
                                              cell_names=self._cell_name, cell_file=cell_file)
            else:
                run = pipeline.run_cell(source, user_ns, options, self.defaults, on_job=keep_handle,
                                       deliver=user_ns.update, cell_names=self._cell_name, cell_file=cell_file)
        except (BackendNotAvailable, LauncherNotFound) as exc:
            raise UsageError(str(exc)) from None
        user_ns.update(run.values)
        return run.output if run.has_output else None

    def _cell_name(self, filename: str) -> str | None:
        """The name IPython's tracebacks give the cell compiled as ``filename`` ("Cell In[3]"); None for other code."""
        named = self.shell.compile.format_code_name(filename)
        return " ".join(named) if named else None

    def _cell_file(self, source: str) -> str:
        """The file name this cell's code is compiled under, here and on the ranks: IPython caches the code
        as one of its cells' (numbered as the cell shows it), so each cell has a file name of its own and the
        notebook names it as its own cells ("Cell In[5]", ``cell.name_cell``)."""
        running = self.shell.displayhook.exec_result  # the notebook cell being run, if any
        number = self.shell.execution_count if running is None else running.execution_count
        filename = self.shell.compile.cache(cell.numbered(source), number)
        name = self._cell_name(filename)
        if name is not None:
            cell.name_cell(filename, name)
        return filename

    def _session_for(self, options) -> Session | None:
        """The session this cell runs on: None for a one-off job (no session, --no-session, or
        one that has ended, which is said once); a cell that does not fit the session is refused."""
        session = self.session
        if session is None or options.no_session:
            return None
        if session.status == "stopped":
            if session.tell_ended():
                ended = (session.ended_sentence() if session.released
                         else f"session {session.name} ended ({session.ended_reason})")
                ConsoleEcho().say(f"{ended}; this cell runs as a one-off job (%mpirun_session start starts a "
                                  "new session)")
            return None
        if session.status != "idle":
            raise UsageError(f"session {session.name} is {session.status} (a cell still runs on it): wait for it, "
                             "or run this cell as a one-off job with --no-session")
        problem = session.mismatch(options)
        if problem:
            raise UsageError(problem)
        return session

    @line_magic
    @magic_arguments()
    @session_start_arguments
    def mpirun_session(self, line: str):
        """Keep ranks up between cells: their globals stay, values cross once, a cell runs in milliseconds.

        %mpirun_session start -i 2 -g 4 [--out NAME] [--max-idle SECONDS] [launch options]
        %mpirun_session            show the session: shape, state, ranks alive, cells run, memory
        %mpirun_session stop       end it (its ranks and their state)
        %mpirun_session restart    stop it and start one of the same shape
        %mpirun_session attach JOB_NAME [--out NAME] [--detach]
                                   take over a SageMaker session started from this machine

        While a session is up, every %%mpirun_remote cell runs on it (--no-session runs one as a
        one-off job). A session ends with the kernel, after --max-idle without a cell, and once its
        cost reaches --max-cost. On
        SageMaker (--backend sagemaker) it is one training job; it also ends when the notebook's
        heartbeat stops (heartbeat_limit in %mpirun_config) and at --max-runtime.
        """
        action, _, rest = line.strip().partition(" ")
        if action.startswith("-"):
            action, rest = "start", line
        action = action or "status"
        if action not in ("start", "stop", "restart", "status", "attach"):
            raise UsageError(f"%mpirun_session {action}: the actions are start, stop, restart, attach, or none to "
                             "show the session; for example %mpirun_session start -i 1 -g 4")
        if action not in ("start", "attach") and rest.strip():
            raise UsageError(f"%mpirun_session {action} takes no options (give them to %mpirun_session start)")
        session = self.session
        if action == "attach":
            return self._attach_session(rest)
        if action == "status":
            print(describe_session(session) if session is not None else
                  "no session: %mpirun_session start -i 1 -g 4 starts one")
            return None
        if action == "stop":
            if session is None or session.status == "stopped":
                print("no session is running")
                return None
            session.stop()
            print("\n".join([f"session {session.name} stopped: {counted(session.cells, 'cell')} run, nothing of it "
                             "is left running", *session.facts()]))
            return None
        if action == "restart":
            if session is None:
                raise UsageError("no session to restart: %mpirun_session start -i 1 -g 4 starts one")
            options = session.options
            session.stop("restarted")
        else:
            if session is not None and session.status != "stopped":
                raise UsageError(f"session {session.name} is up already ({session.world_size} ranks): "
                                 "%mpirun_session stop first, or %mpirun_session restart")
            options = registry.parse_line(self.mpirun_session, rest, self.defaults)
            cell_only = sorted(registry.cell_only() & options.given)
            if cell_only:
                raise UsageError(f"{registry.flag_of(cell_only[0])} applies to cells, not to %mpirun_session start; give it on a "
                                 "%%mpirun_remote cell's line")
            outliving = registry.attachable_names()
            if options.detach and options.backend not in outliving:
                raise UsageError(f"--detach applies to --backend {' or '.join(outliving)} sessions; a "
                                 f"{options.backend} session's ranks end with the kernel")
        try:
            self.session = pipeline.start_session(options, self.defaults)
        except (BackendNotAvailable, LauncherNotFound) as exc:
            raise UsageError(str(exc)) from None
        if options.out:
            self.shell.user_ns[options.out] = self.session
        return None

    def _attach_session(self, rest: str) -> None:
        """``%mpirun_session attach JOB_NAME [--out NAME] [--detach] [--quiet]``."""
        usage = "usage: %mpirun_session attach JOB_NAME [--out NAME] [--detach]; %mpirun_jobs lists your recent jobs"
        try:
            words = shlex.split(rest)
        except ValueError:
            raise UsageError(usage) from None
        flags = {w for w in words if w in ("--detach", "--quiet")}
        out = None
        if "--out" in words:
            at = words.index("--out")
            out = words[at + 1] if at + 1 < len(words) else ""
            words[at:at + 2] = []
            if not out.isidentifier():
                raise UsageError(f"--out {out!r} is not a valid variable name; for example --out session")
        names = [w for w in words if w not in flags]
        if len(names) != 1 or names[0].startswith("-"):
            raise UsageError(usage)
        current = self.session
        if current is not None and current.status != "stopped":
            raise UsageError(f"session {current.name} is up already: %mpirun_session stop it first")
        try:
            self.session = pipeline.attach_session(names[0], self.defaults, "--detach" in flags, "--quiet" in flags)
        except BackendNotAvailable as exc:
            raise UsageError(str(exc)) from None
        if out:
            self.shell.user_ns[out] = self.session
        return None

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
            run = pipeline.attach(args.job_name, self.shell.user_ns, self.defaults)
        except BackendNotAvailable as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns.update(run.values)
        if args.out:
            self.shell.user_ns[args.out] = run.job
        return run.output if run.has_output else None

    @line_magic
    @magic_arguments()
    @argument("handle", nargs="?", default=None, metavar="NAME",
              help="A job or session handle stored with --out (default: this notebook's newest job while it "
                   "runs, else the session).")
    @argument("--frames", action="store_true", help="Also list each group's frames, outermost first.")
    def mpirun_stacks(self, line: str):
        """Show where every rank is now, grouped: "ranks 0, 1 at cell line 7 in allreduce".

        For a job running in the background (--async) or a session's ranks. A cell that waits
        takes this roll-call by itself when its ranks go quiet (%mpirun_config stall_after) and
        when it is interrupted. Cell lines are numbered as the cell shows them, the magic line
        being line 1; job.stacks() gives every rank's frames.
        """
        try:
            args = _parse(self.mpirun_stacks, line)
        except (UsageError, ValueError):
            raise UsageError("usage: %mpirun_stacks [NAME] [--frames]") from None
        target = self._stacks_target(args.handle)
        try:
            snapshot = target.roll_call()
        except JobError as exc:
            raise UsageError(str(exc)) from None
        if isinstance(target, Session):
            print(f"session {target.name} ({target.backend}, {target.world_size} ranks) {target.status}")
        else:
            print(headline(target.model))
        for text in snapshot.lines(frames=args.frames):
            print(f"  {text}")

    def _stacks_target(self, handle: str | None) -> Job | Session:
        if handle is not None:
            target = self.shell.user_ns.get(handle)
            if not isinstance(target, (Job, Session)):
                raise UsageError(f"{handle} is not a job or session handle; store one with --out {handle}")
        elif self.latest_job is not None and self.latest_job.status == "running":
            target = self.latest_job
        elif self.session is not None and self.session.status != "stopped":
            target = self.session
        else:
            raise UsageError("no job of this notebook is running and no session is up: %mpirun_stacks shows where "
                             "the ranks of a job started with --async, or of a session, are")
        if isinstance(target, Job) and target.status != "running":
            raise UsageError(f"job {target.name} has {target.status}: its ranks have ended"
                             + (f" ({roll_call_phrase(target.model)})" if target.model.roll_call else ""))
        if isinstance(target, Session) and target.status == "stopped":
            raise UsageError(f"session {target.name} has ended: its ranks are gone")
        return target

    @line_magic
    @magic_arguments()
    @argument("rank", nargs="?", type=int, default=None,
              help="The failed rank to inspect (default: the first that raised).")
    @argument("-c", "--command", action="append", default=[], metavar="COMMAND",
              help="Run this debugger command, then leave (repeatable), as in a notebook run headless.")
    def mpirun_debug(self, line: str):
        """Open IPython's debugger on a failed rank's traceback, after the cell raised RemoteRankError.

        The rank's frames come back with their locals (values that pickle, up to 1 MiB each; others
        as their repr), so up, down, ll and p name work as in %debug; the cell's lines are numbered
        as the cell shows them, the magic line being line 1. Only the ranks that raised keep them.
        """
        try:
            args = _parse(self.mpirun_debug, line)
        except (UsageError, ValueError):
            raise UsageError("usage: %mpirun_debug [RANK] [-c COMMAND ...]") from None
        job = next((job for job in reversed(self.recent_jobs) if debugger.failed_ranks(job)), None)
        if job is None:
            raise UsageError("no job of this notebook has a rank that raised: %mpirun_debug opens the debugger on "
                             "one after a cell raised RemoteRankError")
        try:
            rank, record = debugger.load(job, args.rank)
        except JobError as exc:
            raise UsageError(str(exc)) from None
        failed = debugger.failed_ranks(job)
        others = [r for r in failed if r != rank]
        print(f"job {job.name}: rank {rank} raised {record['error_type']}: {record['message']}"
              + (f" (also raised: {ranks_phrase(others)}; %mpirun_debug N opens rank N)" if others else ""))
        debugger.interact(debugger.traceback_of(record), self.shell.debugger_cls, args.command)

    @line_magic
    @magic_arguments()
    @argument("job_name", nargs="?", default=None, metavar="JOB_NAME",
              help="A job kept here to reopen: its summary is shown as the cell showed it.")
    @argument("--out", default=None, metavar="NAME", help="Store the reopened job's handle in the notebook under NAME.")
    def mpirun_jobs(self, line: str):
        """List the jobs kept here and the SageMaker jobs started from this machine, or reopen one.

        %mpirun_jobs                       the SageMaker jobs started from here (newest first, with their
                                           status), then the jobs whose folders are kept (keep_jobs)
        %mpirun_jobs JOB_NAME [--out NAME] a kept job that ended, reopened (as mpi_magic.Job.load does):
                                           its summary, and with --out its handle (status, logs, metrics)
        """
        try:
            args = _parse(self.mpirun_jobs, line)
        except (UsageError, ValueError):
            raise UsageError("usage: %mpirun_jobs [JOB_NAME] [--out NAME]") from None
        cache_dir = self.defaults.get("cache_dir")
        if args.job_name is not None:
            try:
                job = Job.load(args.job_name, cache_dir)
            except JobError as exc:
                raise UsageError(str(exc)) from None
            display(job.summary)
            if args.out:
                self.shell.user_ns[args.out] = job
            return None
        for record in registry.attachable(self.defaults).recent_jobs():
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["created"]))
            print(f"{record['name']:<40} {started}  {record['status']:<11} {record['secondary']}")
            if "warning" in record:  # it still runs, and is billed
                print(f"warning: {record['warning']}")
        kept = jobdir.kept_jobs(cache_dir)
        if not kept:
            print(f"no job is kept in {os.path.join(cache_dir, 'jobs')} yet")
            return None
        print("jobs kept here (%mpirun_jobs JOB_NAME reopens one):")
        for info in kept:
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(info["started"])) if "started" in info else "?"
            shape = (f"{info['instances']} x {info['procs_per_instance']}" if "instances" in info
                     else f"{info.get('world_size', '?')} ranks")
            status = _kept_status(info, cache_dir)
            print(f"{info['name']:<40} {started}  {status:<11} {info.get('backend', '?')}, {shape}")
        return None

    @line_magic
    @magic_arguments()
    @argument("job", nargs="?", default=None, metavar="JOB",
              help="A job handle stored with --out, or a job's name (default: this notebook's newest job).")
    @argument("--to", default=None, metavar="DIR", help="The folder to write (default: the job's name, here).")
    def mpirun_export(self, line: str):
        """Write a folder that runs a job's cell again without a notebook: `bash DIR/run.sh`.

        The folder holds the cell (cell.py), the values it reads (payload.bin), the launch for its
        backend and shape (launch.txt: the mpirun line, the Slurm job's script, the SageMaker
        request), run.sh and a README.md of what it needs. run.sh prints every rank's output, exits
        with status 1 when a rank fails, and writes what the cell assigns to DIR/results.pickle.
        """
        try:
            args = _parse(self.mpirun_export, line)
        except (UsageError, ValueError):
            raise UsageError("usage: %mpirun_export [JOB] [--to DIR]") from None
        job = self._export_target(args.job)
        folder = os.path.abspath(args.to or job.name)
        try:
            notes = export.export(job, self.shell.user_ns, folder, self.defaults, self._cell_name)
        except (BackendNotAvailable, LauncherNotFound) as exc:
            raise UsageError(str(exc)) from None
        for note in notes:
            ConsoleEcho().say(note)
        print(f"job {job.name} exported to {folder}: bash {os.path.join(folder, 'run.sh')} runs it "
              f"({os.path.join(folder, 'README.md')} says what it needs)")

    def _export_target(self, handle: str | None) -> Job:
        if handle is None:
            if self.latest_job is None:
                raise UsageError("no job of this notebook to export yet: run a %%mpirun_remote cell first")
            return self.latest_job
        target = self.shell.user_ns.get(handle) if handle.isidentifier() else None
        if isinstance(target, Job):
            return target
        named = [job for job in self.recent_jobs if job.name == handle]
        if not named:
            raise UsageError(f"{handle} is neither a job handle nor one of this notebook's recent jobs "
                             f"({', '.join(job.name for job in self.recent_jobs) or 'none yet'})")
        return named[-1]

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


def _kept_status(info: dict, cache_dir: str) -> str:
    """A kept job's status as ``Job.load`` gives it: job.json's, unless that says running though the
    kernel that followed the job has gone."""
    status = info.get("status", "?")
    if status != "running" or jobdir.is_running(info):
        return status
    try:
        return Job.load(info["name"], cache_dir).status
    except JobError:
        return "?"


def _parse(magic_func, line: str):
    """A line magic's arguments, quoted as in a shell, no abbreviated options (``UsageError``)."""
    parser = magic_func.parser
    parser.allow_abbrev = False
    return parser.parse_args(shlex.split(line))
