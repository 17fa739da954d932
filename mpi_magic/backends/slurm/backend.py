"""Ranks as one Slurm job of ``--instances`` nodes with ``--gpus`` tasks each: a cell's job is an
allocation (``salloc``) whose launcher runs on this machine, in it (``mpirun``, which reads the
allocation and starts its daemons on the nodes through srun, or ``srun --mpi=pmix``); a session's is a
batch job (``sbatch``), whose launcher runs on its first node. The launcher's output goes to files in
the job folder, on a filesystem the nodes share, which the notebook reads as they grow; one batched
``squeue`` says where the job is in the queue and how much of its time is left. A process beside the
notebook cancels the job if the kernel dies.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, BinaryIO, Iterable

from ...shared import envvars, jobdir, stacks, wire
from ...shared.events import Allocation, Event, LauncherExited, StreamDecoder
from ...shared.layout import RESULTS
from ...shared.unreachable import stopped_answering
from .. import launcher as launchers
from .. import follow
from ..follow import EventQueue, Tally
from . import cluster, commands
from .commands import SlurmSetupError
from .queue import REQUEUED_STATES, WATCHER, JobState, QueueWatcher, look
from .script import ERRORS, EXIT_FILE, OUTPUT, PID_FILE, SCRIPT_FILE, batch_script, salloc_argv, sbatch_argv, shape

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from ..base import BackendJob, SessionBackend
    from .session_ranks import SlurmSessionRanks

# seconds between looks at the launcher's files: while output flows (or is due: a session's cell was just
# sent), and at most while they are quiet, the wait doubling in between (each look reads two open files)
READ_AT_ONCE, READ_LATER = 0.002, 0.25
EXIT_WAIT = 5.0  # seconds the exit file gets to show after Slurm says the job ended (a shared filesystem's caches)
INTERRUPT_GRACE = 5.0  # seconds between SIGINT to every process of the job and cancelling it
READ_CHUNK = 1 << 16
# At most READ_MOST bytes of a file are read at a look, and at most QUEUE_SIZE looks' events wait to be
# polled: a rank flooding its output makes the file grow on the shared filesystem, not this process.
READ_MOST, QUEUE_SIZE = 64 * READ_CHUNK, 16
# Why Slurm ended a job, in the user's words: by its state in squeue, or by what slurmstepd wrote into the
# job's error file ("*** JOB 40 ON n1 CANCELLED AT 2026-12-05T18:35:45 DUE TO TIME LIMIT ***", "... DUE TO
# NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***"); a failed node is named where sinfo lists it down or failing.
ENDED_BY_SLURM = {
    "TIMEOUT": "the job reached its Slurm time limit (--time)",
    "CANCELLED": "the job was cancelled in Slurm (scancel) from outside this notebook",
    "NODE_FAIL": "a node of the job failed (NODE_FAIL)",
    "OUT_OF_MEMORY": "a node ran out of memory (OUT_OF_MEMORY); ask for more with --slurm-args --mem=...",
    "PREEMPTED": "Slurm preempted the job for another",
    "BOOT_FAIL": "a node failed to boot (BOOT_FAIL)",
    "DEADLINE": "the job passed its deadline",
    "REQUEUED": "Slurm put the job back in its queue to run it again later, and it was cancelled",
}
REQUEUED_NOT_CANCELLED = ("Slurm put the job back in its queue to run it again later, and cancelling it failed: "
                          "{why}; cancel it with scancel {job_id}")
_STEPD_SAYS = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))?(?:, [^*]*)? \*\*\*")
_DUE_TO = {"TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED"}
# ... and as salloc says it, holding a cell's allocation here: "salloc: error: Node failure on n2", "salloc: Job
# 40 has exceeded its time limit and its allocation has been revoked.", or for any other end Slurm made "salloc:
# Job allocation 40 has been revoked." (squeue may then say why: a cancel, a preemption). After salloc's own
# "Relinquishing job allocation 40", as the script ended, a "revoked" is about that giving back, and is dropped.
_SALLOC_SAYS = {"NODE_FAIL": re.compile(r"salloc: error: Node failure on "),
                "TIMEOUT": re.compile(r"salloc: Job \d+ has exceeded its time limit")}
_REVOKED = re.compile(r"\s*salloc: Job allocation \d+ has been revoked")
_RELINQUISHED = re.compile(r"\s*salloc: Relinquishing job allocation \d+")
# salloc's word on its allocation, on its errors: the job's id at once (pending or granted), then news
# the notebook shows otherwise (the queue, the end) or has no use for, which is not shown as the launcher's
_ALLOCATION = re.compile(rb"salloc: (?:Granted|Pending) job allocation (\d+)")
_SALLOC_NEWS = re.compile(r"\s*salloc: (?:(?:Granted|Pending) job allocation \d+|job \d+ (?:queued and "
                          r"waiting for resources|has been allocated resources)|Waiting for resource configuration|"
                          r"Nodes \S+ are ready for job)$")
SALLOC_LIMIT = 30.0  # seconds salloc may take to say the job's id (it says it as soon as slurmctld answers)


class SlurmBackend:
    """The payload stays in the user's private job folder (0700) on the shared filesystem, so ranks
    skip the digest check, as local ranks do."""

    name = "slurm"
    pins_digest = False
    stop_description = "scancel: SIGINT to every rank, then the job"

    def __init__(self, config: Config, options: LaunchOptions):
        self.sbatch, self.salloc = commands.client("sbatch"), commands.client("salloc")
        for name in ("squeue", "scancel", "sinfo"):
            commands.client(name)
        self.partition = cluster.chosen(options, cluster.partitions())
        # what sinfo cannot tell (an account, a QOS, a reservation, a feature): Slurm's own reason
        tested = commands.run("sbatch", "--test-only", *shape(options, self.partition.gpus_per_node), "--wrap=true")
        if tested.returncode != 0:
            raise SlurmSetupError(f"Slurm would refuse the job: {commands.said(tested)} (sbatch --test-only); "
                                  "nothing was submitted")
        self.expected_start = (tested.stderr or tested.stdout).strip().removeprefix("sbatch: ")
        self.srun = bool(options.settings.get("srun"))
        if self.srun:
            offered = commands.run("srun", "--mpi=list")
            if "pmix" not in offered.stdout + offered.stderr:
                raise SlurmSetupError("--srun starts the ranks through Slurm's PMIx plugin, which srun --mpi=list "
                                      "does not offer here; drop --srun to start them with mpirun")
            self.tag_style = "srun"
        else:
            self.launcher = launchers.find_launcher(config.get("mpirun"))
            self.tag_style = self.launcher.tag_style

    def check(self, options: LaunchOptions) -> list[str]:
        """A warning where the partition's nodes have GPUs, but fewer than the ranks per node."""
        gpus = self.partition.gpus_per_node
        if gpus and options.procs_per_instance > gpus:
            return [f"partition {self.partition.name} has {gpus} GPUs per node but --gpus asks for "
                    f"{options.procs_per_instance} processes per node; they will share"]
        return []

    def unpriced(self, options: LaunchOptions) -> str | None:
        return ("a Slurm cluster charges its accounts in units of its own, which the meter does not know "
                "(--time bounds a job, and the account's limits what it may spend)")

    def launch(self, command: list[str], options: LaunchOptions) -> list[str]:
        """The command the batch script runs: the launcher, then ``command`` (every rank's runtime)."""
        if self.srun:
            return [commands.client("srun"), "--mpi=pmix", "--label", "--kill-on-bad-exit=1", *command]
        # the allocation has a slot for each rank: never --oversubscribe; the daemons on the nodes pass
        # the stack requests' signals on to the ranks
        forwarding = (stacks.forwarding_args(self.launcher.version[0] if self.launcher.version else 5, options.mpirun_args)
                      if self.launcher.flavour == "openmpi" else [])
        return launchers.mpirun_argv(self.launcher, options.world_size, command, [*forwarding, *options.mpirun_args],
                                     options.world_size)

    def environment(self, job_name: str, token: str, options: LaunchOptions) -> dict[str, str]:
        return {
            **launchers.job_environment(job_name, token, options.instances, options.procs_per_instance),
            envvars.STACKS_EVENTS: "1",  # a rank asked for its stack sends it as an event: its pid is on another node
            **options.env,
        }

    def _write(self, job_dir: str, job_name: str, command: list[str], options: LaunchOptions,
               env: dict[str, str], batch: bool) -> list[str]:
        """The job's script, written into the job folder, and the launcher's output and errors made there
        empty, 0600: Slurm writes into them as they are, where it would make them by the job's umask;
        returns the line that runs it: ``sbatch`` for a ``batch`` job, else ``salloc``."""
        script = batch_script(job_name, job_dir, self.launch(command, options), env, here=not batch)
        with jobdir.open_private(os.path.join(job_dir, SCRIPT_FILE), "w") as f:
            f.write(script)
        for name in (OUTPUT, ERRORS):
            jobdir.open_private(os.path.join(job_dir, name), "w").close()
        line = sbatch_argv if batch else salloc_argv
        return line(self.sbatch if batch else self.salloc, job_dir, job_name, options, self.partition.gpus_per_node)

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints: the job's script, the salloc (or, with ``--batch``, sbatch) line, and what
        ``sbatch --test-only`` said."""
        batch = bool(options.settings.get("batch"))
        argv = self._write(job_dir, job_name, launchers.runtime_command(job_dir, digest), options,
                           self.environment(job_name, "<event token>", options), batch=batch)
        with open(os.path.join(job_dir, SCRIPT_FILE)) as f:
            script = f.read()
        runs = "run by sbatch on the allocation's first node" if batch else "run here by salloc in the allocation"
        return (f"script {os.path.join(job_dir, SCRIPT_FILE)}, {runs}:\n{script}\n{'sbatch' if batch else 'salloc'} "
                "line:\n" + " ".join(_quoted(argv)) + f"\nsbatch --test-only: {self.expected_start}")

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> SlurmJob:
        """``salloc``, which runs the job's script here once Slurm grants the allocation (with ``--batch``,
        a batch job's, on its first node)."""
        if options.settings.get("batch"):
            return self.submit_batch(job_dir, job_name, launchers.runtime_command(job_dir, digest), options, {})
        token = wire.new_token()
        argv = self._write(job_dir, job_name, launchers.runtime_command(job_dir, digest), options,
                           self.environment(job_name, token, options), batch=False)
        job_id, salloc = _allocate(argv, job_dir)
        try:
            return SlurmJob(job_id, job_name, job_dir, StreamDecoder(token, self.tag_style), salloc=salloc)
        except BaseException:  # (an interrupt too): nobody would follow the job
            _reap(salloc, stop=True)
            raise

    def start_session(self, name: str, options: LaunchOptions, config: Config) -> SlurmSessionRanks:
        """One allocation whose ranks wait for cells from this notebook's channel (``session_ranks.py``)."""
        from .session_ranks import start

        return start(self, name, options, config)

    def submit_batch(self, job_dir: str, job_name: str, command: list[str], options: LaunchOptions,
                     extra_env: dict[str, str]) -> SlurmJob:
        """``sbatch`` of ``command`` as the job's launched command: a batch job, which lives on by itself."""
        token = wire.new_token()
        env = {**self.environment(job_name, token, options), **extra_env}
        argv = self._write(job_dir, job_name, command, options, env, batch=True)
        submitted = commands.run("sbatch", *argv[1:])
        if submitted.returncode != 0:
            raise _refused(submitted)
        job_id = submitted.stdout.strip().split(";")[0]
        return SlurmJob(job_id, job_name, job_dir, StreamDecoder(token, self.tag_style))


REVOKED = "REVOKED"  # salloc said its allocation was revoked, and no more of why


def salloc_news(line: str, relinquished: bool) -> tuple[bool, bool]:
    """(whether a line of salloc's errors file is salloc's news, not the launcher's; whether salloc has
    given the allocation back by then, so that a "revoked" after it is news too)."""
    if _RELINQUISHED.match(line):
        return True, True
    return bool(_SALLOC_NEWS.match(line) or (relinquished and _REVOKED.match(line))), relinquished


def said_in(lines) -> str | None:
    """The state Slurm's own words in the launcher's lines end the job in (the last that says one):
    slurmstepd's or salloc's; ``REVOKED`` where salloc says only that the allocation ended."""
    revoked = False
    for line in reversed(lines):
        found = _STEPD_SAYS.search(line)
        if found:
            return _DUE_TO.get(found[1] or "", "CANCELLED")
        for state, says in _SALLOC_SAYS.items():
            if says.search(line):
                return state
        revoked = revoked or bool(_REVOKED.match(line))
    return REVOKED if revoked else None


def _refused(command: subprocess.CompletedProcess) -> SlurmSetupError:
    return SlurmSetupError(f"Slurm refused the job: {commands.said(command)}; nothing was submitted")


def _allocate(argv: list[str], job_dir: str) -> tuple[str, subprocess.Popen]:
    """Start ``salloc`` (in a session of its own: an interrupt is the notebook's to pass on), its output
    and errors into the job folder's files; the job's id, as salloc says it at once, pending or granted."""
    errors = os.path.join(job_dir, ERRORS)
    with open(os.path.join(job_dir, OUTPUT), "ab") as out, open(errors, "ab") as err:
        salloc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    deadline = time.monotonic() + SALLOC_LIMIT
    nap = 0.001
    try:
        while True:
            with open(errors, "rb") as f:
                said = f.read(1 << 16)
            found = _ALLOCATION.search(said)
            if found:
                return found[1].decode(), salloc
            if salloc.poll() is not None:
                raise _refused(subprocess.CompletedProcess(argv, salloc.returncode, "", said.decode(errors="replace")))
            if time.monotonic() > deadline:
                raise SlurmSetupError(f"salloc did not say the job's id within {SALLOC_LIMIT:g}s: is slurmctld "
                                      "up? (scontrol ping says); nothing was submitted")
            time.sleep(nap)
            nap = min(nap * 2, 0.05)
    except BaseException:  # (an interrupt too): salloc gives back what it asked for as it ends
        _reap(salloc, stop=True)
        raise


class SlurmJob:
    """A Slurm job, followed through its files in the job folder and ``squeue``; ``salloc``: the
    process that holds its allocation here (for a batch job, None)."""

    abort_grace = 3.0  # after a rank's failure the launcher ends the job; if it has not, it is cancelled
    linger = 10.0  # after every rank succeeded the job's script ends within this, else it is cancelled
    launcher = None  # (the job folder is kept while its record says the job runs)
    stacks_dir = None  # the ranks are asked through Slurm (``request_stacks``)

    def __init__(self, job_id: str, name: str, job_dir: str, decoder: StreamDecoder, watcher: QueueWatcher = WATCHER,
                 salloc: subprocess.Popen | None = None):
        self.job_id, self.name, self.job_dir = job_id, name, job_dir
        self._decoder, self._watcher, self._salloc = decoder, watcher, salloc
        self._relinquished = False  # salloc said it gives the allocation back (the script has ended)
        self._events = EventQueue(QUEUE_SIZE)
        self._tally = Tally()  # (its hosts: the nodes the ranks said they started on, by Slurm's names)
        self._allocation: Allocation | None = None  # squeue's news, not yet polled (never waits for room)
        self._allocation_lock = threading.Lock()  # set by the queue's thread, taken by poll
        self._finished = self._cancelled = False
        self._state: JobState | None = None  # squeue's latest
        self._ended: JobState | None = None  # Slurm says it ended (a state, "REQUEUED", or "gone from squeue")
        self._nodes = ""  # the job's nodes, once squeue said where it runs
        self._fallback_due: float | None = None  # when the ranks are asked for their stacks the second way
        self.over = threading.Event()  # set once the end is delivered (before ``poll`` hands it out)
        self._wake = threading.Event()  # set when output is due (a session's cell was sent)
        self._watchdog = follow.watchdog([commands.client("scancel"), job_id])  # (the kernel's death)
        threading.Thread(target=self._follow, name=f"mpi_magic {name} files", daemon=True).start()
        watcher.watch(job_id, self._on_state)

    # -- what Slurm says -------------------------------------------------------------------

    def _on_state(self, state: JobState | None) -> None:
        if state is None:  # no longer listed: ended long ago, or purged
            self._ended = self._ended or JobState("GONE")
            return
        had_run = bool(self._nodes or self._tally.pids)  # before this state
        self._nodes = state.nodes or self._nodes
        if state != self._state:
            self._state = state
            with self._allocation_lock:
                self._allocation = state.allocation()
        if state.ended:
            self._ended = state
        elif state.state in REQUEUED_STATES and had_run:  # requeued (a node failed): the run is over, the job cancelled
            self._ended = self._ended or JobState("REQUEUED", state.reason)

    # -- what the launcher says --------------------------------------------------------------

    def _follow(self) -> None:
        """Read the launcher's files as they grow until its exit status is written (or Slurm ended
        the job without it), then deliver the end."""
        tails = [_Tail(os.path.join(self.job_dir, OUTPUT), "stdout"), _Tail(os.path.join(self.job_dir, ERRORS), "stderr")]
        exit_path = os.path.join(self.job_dir, EXIT_FILE)
        nap, ended_at = READ_AT_ONCE, None
        while True:
            done = os.path.exists(exit_path)
            read = False
            for tail in tails:
                lines = tail.read()
                if lines:
                    self._deliver(lines, tail.stream)
                    read = True
            if self._ended is not None:  # (the exit status is waited for only where a launcher ran)
                ended_at = ended_at or time.monotonic()
                done = done or not self._tally.pids or time.monotonic() - ended_at > EXIT_WAIT
            if done:
                if self._salloc is not None:  # salloc says its last (the allocation given back, or revoked) first
                    self._salloc_ended()
                for tail in tails:  # the rest of each file, its last line too
                    while True:
                        self._deliver(tail.read(final=True), tail.stream)
                        if not tail.more:
                            break
                break
            self._ask_the_second_way_when_due()
            nap = READ_AT_ONCE if read else min(nap * 2, READ_LATER)
            if self._wake.wait(nap):
                self._wake.clear()
                nap = READ_AT_ONCE
        self._watcher.forget(self.job_id)
        end = self._end(exit_path)
        if self._requeued():
            end = self._cancel_requeued(end)
        follow.release(self._watchdog)
        self._events.put([*self._decoder.rejections(), end])
        self.over.set()

    def _salloc_ended(self) -> None:
        """salloc, once the job's script has ended (or Slurm ended the job): it gives the allocation back
        and exits. One that does not within EXIT_WAIT (a slurmctld too busy to answer) is killed, and the
        job cancelled, so that no allocation stays held and nothing it started runs on."""
        assert self._salloc is not None
        if not _reap(self._salloc):
            self._cancel_from_thread()
    def _deliver(self, lines: list[str], stream: str) -> None:
        if self._salloc is not None and stream == "stderr":
            lines = [line for line in lines if not self._salloc_news(line)]
        if not lines:
            return
        decoded = self._decoder.feed_lines(lines, stream)
        first = not self._tally.pids
        self._tally.take(decoded)
        if first and self._tally.pids and (self._state is None or self._state.state == "PENDING"):
            self._watcher.hurry()  # squeue's word is older than the ranks: what it says now is shown
        if decoded:
            self._events.put(decoded)

    def _salloc_news(self, line: str) -> bool:
        """Whether ``line`` is salloc's news, not shown as the launcher's (its giving the allocation back,
        and what it says of the allocation after that)."""
        news, self._relinquished = salloc_news(line, self._relinquished)
        return news

    def _end(self, exit_path: str) -> LauncherExited:
        try:
            with open(exit_path) as f:
                returncode: int | None = int(f.read().strip() or "0")
        except (OSError, ValueError):
            returncode = None
        if returncode and not self._tally.failed and not self._cancelled:
            self._ask_slurm()  # the launcher failed and no rank said why: Slurm may have ended the job (a node failed)
        said = self._slurm_said()
        if returncode is not None and said in (None, REVOKED):
            lost = {} if self._tally.failed else launchers.lost_hosts("\n".join(self._tally.log.lines))
            if lost:  # (Open MPI 5's mpirun then exits with status 0; Slurm may revoke the allocation after)
                return LauncherExited(returncode, reason=lost_nodes(lost))
            if said is None:
                return self._tally.ended(returncode)
        state = "CANCELLED" if said == REVOKED else said or (self._ended.state if self._ended else "GONE")
        if self._cancelled:
            return LauncherExited(returncode)
        if state == "NODE_FAIL":
            nodes = ",".join(filter(None, [self._nodes, *sorted(self._tally.hosts)]))  # (before squeue saw it run)
            reason = node_failure(cluster.down_nodes(nodes) if nodes else {})
        elif state in ENDED_BY_SLURM:
            reason = ENDED_BY_SLURM[state]
        elif not self._tally.pids:
            reason = (f"the job ended ({state}) before its launcher started: is the job folder {self.job_dir} on a "
                      "filesystem every node shares? (%mpirun_config cache_dir=...)")
        else:
            reason = f"the job ended ({state}) without its launcher's exit status"
        return LauncherExited(None, reason=reason)

    def _requeued(self) -> bool:
        """Whether Slurm put the job back in its queue: as squeue said, or, where slurmstepd's words
        ended it first for what Slurm requeues a job for (a failed node, a preemption), as squeue
        says now (a job still listed, not ended: back in the queue, or on its way there)."""
        if self._salloc is not None:
            return False  # (Slurm never requeues an allocation salloc holds)
        if self._ended is not None and self._ended.state == "REQUEUED":
            return True
        if self._cancelled or self._slurm_said() not in ("NODE_FAIL", "PREEMPTED"):
            return False
        states = look([self.job_id])
        state = None if states is None else states.get(self.job_id)
        return state is not None and not state.ended

    def _cancel_requeued(self, end: LauncherExited) -> LauncherExited:
        """The job Slurm requeued is cancelled: it would run again later by itself, with nobody watching.
        Where Slurm does not take the cancel, the end says so and how to cancel it."""
        why = self._cancel_from_thread()
        if why is None:
            return end
        said = REQUEUED_NOT_CANCELLED.format(why=why, job_id=self.job_id)
        if end.reason and end.reason != ENDED_BY_SLURM["REQUEUED"]:
            said = f"{end.reason}; {said}"
        return dataclasses.replace(end, reason=said)

    def _cancel_from_thread(self) -> str | None:
        """``scancel`` the job from a thread that must go on whatever Slurm says; None once Slurm
        took it, else why not (a busy slurmctld that did not answer within ``commands.CALL_LIMIT``)."""
        try:
            cancelled = commands.run("scancel", self.job_id)
        except SlurmSetupError as exc:
            return str(exc)
        return None if cancelled.returncode == 0 else commands.said(cancelled)

    def _ask_slurm(self) -> None:
        """Slurm's word on the job now, not at the queue's next poll."""
        states = look([self.job_id])
        if states is not None:
            self._on_state(states.get(self.job_id))

    def new_cell(self) -> None:
        """A session's next cell was sent: its ranks report anew, and its output is due, so the files
        are looked at at once."""
        self._tally.new_cell()
        self._wake.set()

    def _slurm_said(self) -> str | None:
        """The state Slurm ended the job in, as slurmstepd wrote it into the error file or salloc said it
        there (at once, where squeue may say it seconds later), else as squeue said it; ``REVOKED`` where
        salloc says only that Slurm took the allocation back; None where Slurm did not end it."""
        said = said_in(self._tally.log.lines)
        if said not in (None, REVOKED):
            return said
        told = self._ended is not None and self._ended.state in ENDED_BY_SLURM
        if said == REVOKED and not self._cancelled and not told:
            self._ask_slurm()  # salloc says only that the allocation ended: squeue may say why
        if self._ended is not None and self._ended.state in ENDED_BY_SLURM:
            return self._ended.state
        return said  # (REVOKED: Slurm ended it, saying no more; None: Slurm did not end it)

    # -- BackendJob ------------------------------------------------------------------------

    @property
    def state(self) -> JobState | None:
        """What squeue said last (None before it answered)."""
        return self._state

    @property
    def started(self) -> bool:
        """Whether a rank has started (the launcher runs)."""
        return bool(self._tally.pids)

    @property
    def finished(self) -> bool:
        return self._finished

    def poll(self, timeout: float) -> list[Event]:
        batch = self._events.take(timeout if self._allocation is None else 0.0)
        # (the end is the last event the reader puts: the last of the batch it comes in)
        self._finished = self._finished or bool(batch) and isinstance(batch[-1], LauncherExited)
        with self._allocation_lock:
            allocation, self._allocation = self._allocation, None
        if allocation is not None:
            batch.insert(0, allocation)
        return batch

    def cancel(self) -> None:
        """A pending job is cancelled at once; a running one gets SIGINT on every process (the
        ranks raise KeyboardInterrupt, the launcher ends them), then is cancelled after a grace."""
        if self._finished:
            return
        self._cancelled = True
        pending = not self._tally.pids and (self._state is None or self._state.state == "PENDING")
        if pending:
            commands.run("scancel", self.job_id)
        else:
            self._signal_launcher_here(signal.SIGINT)
            commands.run("scancel", "--full", "--signal=INT", self.job_id)
            self._cancel_after_grace()
        self._watcher.hurry()

    def _cancel_after_grace(self) -> None:
        """In INTERRUPT_GRACE seconds, the job is cancelled if it still runs; where Slurm does not take
        the cancel (a busy slurmctld), it is tried again after another grace, until the job ends."""
        timer = threading.Timer(INTERRUPT_GRACE, self._cancel_if_running)
        timer.daemon = True
        timer.start()

    def _cancel_if_running(self) -> None:
        if self._finished or self._ended is not None or self.over.is_set():
            return
        if self._cancel_from_thread() is not None:
            self._cancel_after_grace()
        self._watcher.hurry()

    def request_stacks(self) -> bool:
        """The stack request's signal to every process of the job (``scancel --signal``): each rank
        sends its stack as an event; the second way follows ``FALLBACK_AFTER`` seconds later (``_follow``)."""
        if self._finished or not self._tally.pids:
            return False
        self._tally.answered.clear()
        asked = self._signal_job(stacks.SIGNAL_NAME)
        if asked:
            self._fallback_due = time.monotonic() + stacks.FALLBACK_AFTER
        return asked

    def _signal_job(self, name: str) -> bool:
        signum = int(getattr(signal, name))  # (by number: scancel knows only some signals by name)
        self._signal_launcher_here(signum)
        return commands.run("scancel", "--full", f"--signal={signum}", self.job_id).returncode == 0

    def _signal_launcher_here(self, signum: int) -> None:
        """The signal to the launcher, where it runs here under salloc: scancel's reaches the job's steps
        on the nodes (mpirun's daemons), not mpirun, which passes it on to every rank (as a batch job's
        mpirun, in the batch step scancel signals, does)."""
        ended = os.path.exists(os.path.join(self.job_dir, EXIT_FILE))
        if self._salloc is None or self._salloc.poll() is not None or ended:
            return  # (a launcher that ended is not signalled: its number may be another process's by now)
        try:
            with open(os.path.join(self.job_dir, PID_FILE)) as f:
                os.kill(int(f.read().strip()), signum)
        except (OSError, ValueError):
            pass  # not started yet, or ended: Slurm's signal is the one that counts

    def _ask_the_second_way_when_due(self) -> None:
        due = self._fallback_due
        if due is not None and time.monotonic() >= due:
            self._fallback_due = None
            if not self._tally.started - self._tally.reported - self._tally.answered:
                return  # every running rank answered: none is asked again
            try:
                self._signal_job(stacks.FALLBACK_NAME)  # ranks that answered the first way drop it
            except SlurmSetupError:
                pass  # slurmctld did not answer: ranks that hold the GIL give no stack this time

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """The ranks wrote their results into the job folder, on the shared filesystem."""


class _Tail:
    """One of the launcher's files as it grows, cut into whole lines."""

    def __init__(self, path: str, stream: str):
        self.path, self.stream = path, stream
        self._file: BinaryIO | None = None
        self._rest = b""
        self.more = False  # the last read stopped at READ_MOST: the file has more already

    def read(self, final: bool = False) -> list[str]:
        """The lines written since the last read (up to READ_MOST bytes); ``final``: the file is
        complete, so once it is read to its end, its last line too, unterminated."""
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return []
        chunks = [self._rest]
        file = self._file
        self.more = True
        for _ in range(READ_MOST // READ_CHUNK):
            chunk = file.read(READ_CHUNK)
            if not chunk:
                self.more = False
                break
            chunks.append(chunk)
        data = b"".join(chunks)
        lines = data.split(b"\n")
        self._rest = lines.pop()
        if final and not self.more:
            if self._rest:
                lines.append(self._rest)
            self._rest = b""
            file.close()
            self._file = None
        return b"\n".join(lines).decode("utf-8", errors="replace").split("\n") if lines else []


def lost_nodes(lost: dict[str, str]) -> str:
    """Why mpirun ended the job, naming the nodes whose daemon it lost ({node: the node mpirun runs on}):
    "node n2 stopped answering mpirun on n1 (lost, or cut off)"."""
    return stopped_answering("node", list(lost), f"mpirun on {next(iter(lost.values()))}")


def node_failure(down: dict[str, str]) -> str:
    """Why a NODE_FAIL ended the job, naming the nodes Slurm holds down ({node: Slurm's reason}):
    "node n2 of the job failed (NODE_FAIL; Slurm's reason: Not responding)"."""
    if not down:
        return ENDED_BY_SLURM["NODE_FAIL"]
    reasons = set(down.values())
    if len(reasons) == 1:
        said = f"Slurm's reason: {reasons.pop()}"
    else:
        said = "Slurm's reasons: " + "; ".join(f"{node}: {reason}" for node, reason in down.items())
    return f"{'node' if len(down) == 1 else 'nodes'} {', '.join(down)} of the job failed (NODE_FAIL; {said})"


def _reap(salloc: subprocess.Popen, stop: bool = False) -> bool:
    """salloc waited for (told to ``stop`` first: SIGTERM, on which it gives back what it asked for) up to
    EXIT_WAIT, and killed if it has not exited by then; whether it exited by itself."""
    if stop and salloc.poll() is None:
        salloc.terminate()
    try:
        salloc.wait(EXIT_WAIT)
        return True
    except subprocess.TimeoutExpired:
        salloc.kill()
        salloc.wait()
        return False


def _quoted(argv: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(word) for word in argv]


if TYPE_CHECKING:  # read by the type checker only
    def _is_backend(backend: SlurmBackend) -> SessionBackend:
        return backend

    def _is_backend_job(job: SlurmJob) -> BackendJob:
        return job
