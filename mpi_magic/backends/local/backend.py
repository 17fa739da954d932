"""Ranks as processes of one ``mpirun`` on this machine, grouped into simulated instances."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

import psutil

from .. import launcher as launchers
from ...shared import envvars, jobdir, procs, wire
from ...shared.layout import RESULTS
from ...shared.events import Event, LauncherExited, RankGone, StreamDecoder
from ...options import Config, LaunchOptions
from ..follow import EventQueue, Tally
from ..scratch import ScratchFolder

if TYPE_CHECKING:
    from ..base import BackendJob, SessionBackend
    from .session_ranks import LocalSessionRanks

# Seconds each signal gets to work before the next, harder one is sent (SIGINT, SIGTERM, SIGKILL).
STOP_WAITS = (2.0, 2.0, 2.0)
# The readers hand over the events of one read (up to READ_CHUNK bytes of lines) at a time: a
# queue operation per event cost more than decoding it. At most QUEUE_SIZE reads wait (a flood of
# short lines then holds about as much memory as 10,000 single events did).
QUEUE_SIZE = 4
STUCK_CHECK = 1.0  # seconds between looks at whether the launcher is stuck
STUCK_REASON = "the launcher hung after its ranks ended, and was stopped"
READ_CHUNK = 1 << 16


class LocalBackend:
    """The payload stays in the user's private job folder (0700), so ranks skip the digest
    check: hashing a large payload once per rank would cost more than loading it."""

    name = "local"
    pins_digest = False
    stop_description = "SIGINT, then SIGTERM, then SIGKILL"

    def __init__(self, config: Config):
        self.launcher = launchers.find_launcher(config.get("mpirun"))
        self.tag_style = self.launcher.tag_style

    def check(self, options: LaunchOptions) -> list[str]:
        return []

    def unpriced(self, options: LaunchOptions) -> str | None:
        return "the local backend's ranks run on this machine, which the meter puts no price on"

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints: the launcher command line."""
        argv = launchers.mpirun_argv(self.launcher, options.world_size, self.command(job_dir, digest),
                                     options.mpirun_args, os.cpu_count() or 1)
        return "would run: " + " ".join(shlex.quote(a) for a in argv)

    def command(self, job_dir: str, digest: str | None) -> list[str]:
        return launchers.runtime_command(job_dir, digest)

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> "LocalJob":
        return self._launch(job_name, self.command(job_dir, digest), options, {}, _stacks_folder(job_dir))

    def start_session(self, name: str, options: LaunchOptions, config: Config | None = None) -> LocalSessionRanks:
        """Start ranks that wait for cells; the channel to rank 0 is a Unix socket only this user reaches."""
        import secrets

        from ...shared.channel import SocketChannel
        from .session_ranks import LocalSessionRanks

        secret = secrets.token_hex(16)
        folder = ScratchFolder("session")
        cells = SocketChannel(folder.path, secret)
        command = launchers.session_command(cells.address, options.max_idle)
        try:
            job = self._launch(name, command, options, {envvars.SESSION_SECRET: secret}, _stacks_folder(folder.path))
        except BaseException:
            cells.close()
            folder.remove()
            raise
        return LocalSessionRanks(job, cells, folder)

    def _launch(self, job_name: str, command: list[str], options: LaunchOptions, extra_env: dict[str, str],
                stacks_dir: str) -> "LocalJob":
        token = wire.new_token()
        cores = os.cpu_count() or 1
        argv = launchers.mpirun_argv(self.launcher, options.world_size, command, options.mpirun_args, cores)
        env = launchers.launcher_environ(self.launcher, dict(os.environ), os.geteuid() == 0,
                                         launchers.oversubscribed(options.world_size, cores))
        env.update(launchers.job_environment(job_name, token, options.instances, options.procs_per_instance))
        env.update({
            envvars.MASTER_ADDR: "127.0.0.1",
            envvars.MASTER_PORT: str(procs.free_port()),
            envvars.STACKS_DIR: stacks_dir,
        })
        env.update(options.env)
        env.update(extra_env)
        job = LocalJob(job_name, argv, env, os.getcwd(), StreamDecoder(token, self.tag_style),
                       launchers.tmpdir_variable(self.launcher))
        job.stacks_dir = stacks_dir
        return job


def _stacks_folder(parent: str) -> str:
    """Where the ranks dump their stacks when asked: inside the job's own private folder."""
    folder = os.path.join(parent, jobdir.STACKS_FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


class LocalJob:
    """A running mpirun: two pipe readers decode lines, tallied and queued (``follow``).

    Every process of the job is found by its process tree, its process group (mpirun leads one of
    its own, by setsid) and the ``MPI_MAGIC_JOB`` variable every process of it inherits, so what a
    rank started is stopped with it, even in a process group of its own. mpirun dies with the notebook
    process, and each rank with mpirun.
    """

    # After a rank reports an exception, mpirun normally stops the others at once; if it has
    # not within this many seconds (a rank ignoring signals), the job is stopped from here.
    abort_grace = 3.0
    # Once every rank has reported success, mpirun gets this long to exit by itself.
    linger = 3.0
    # Open MPI 5's launcher can deadlock in its own finalize when a rank dies while another is in
    # MPI's start-up: every process it started has ended (one unreaped) and it uses no CPU, yet it never
    # exits (nor passes on what the ranks said last). A launcher in that state this long is stopped.
    stuck_after = 3.0

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: str, decoder: StreamDecoder,
                 folder_variable: str | None = None):
        self.name = name
        self.host = socket.gethostname()
        self.argv = argv
        self.stacks_dir: str | None = None  # where its ranks dump their stacks when asked
        self._decoder = decoder
        self._decode_lock = threading.Lock()  # (two readers: one tally)
        self._events = EventQueue(QUEUE_SIZE)
        self._tally = Tally()
        self._finished = False
        self._gone: set[int] = set()  # ranks whose process is gone without having reported
        self._checked_at = 0.0
        self._quiet_since: float | None = None  # since when the launcher has looked stuck
        self._cpu_seen = 0.0  # the launcher's CPU seconds at the last look
        self._chunks_read = self._chunks_seen = 0  # of the launcher's output: so far, and at the last look
        self._stuck_checked_at = time.monotonic()  # the first look a STUCK_CHECK after the start: it lists processes
        self._stuck = self._cancelled = False
        # The launcher's temporary folder, new for this launch and removed after it (unless the user chose one)
        self._folder = None
        if folder_variable and folder_variable not in env:
            self._folder = ScratchFolder("mpirun")
            env = {**env, folder_variable: self._folder.path}
        # A process group of its own (setsid): a terminal's Ctrl-C reaches the job only through cancel().
        command, preexec = _dying_with_notebook(argv)
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec,
            )
        except BaseException:
            self._remove_folder()
            raise
        self.pid = self.process.pid
        self.started = psutil.Process(self.pid).create_time()
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, "stderr"), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _read(self, pipe, stream: str) -> None:
        """Read in chunks and cut lines here: every line goes on whole, however long."""
        pieces: list[bytes] = []  # the line read so far
        with pipe:
            for chunk in iter(lambda: pipe.read1(READ_CHUNK), b""):
                self._chunks_read += 1
                if b"\n" not in chunk:
                    pieces.append(chunk)
                    continue
                lines = chunk.split(b"\n")
                pieces.append(lines[0])
                lines[0] = b"".join(pieces)
                rest = lines.pop()
                pieces = [rest] if rest else []
                self._deliver(lines, stream)
            if pieces:
                self._deliver([b"".join(pieces)], stream)

    def _deliver(self, lines: list[bytes], stream: str) -> None:
        texts = b"\n".join(lines).decode("utf-8", errors="replace").split("\n")  # one decode for the read
        with self._decode_lock:
            decoded = self._decoder.feed_lines(texts, stream)
            self._tally.take(decoded)
        if decoded:
            self._events.put(decoded)

    def _wait(self) -> None:
        for reader in self._readers:
            reader.join()
        returncode = self.process.wait()
        self._stop()  # what a rank started and left behind
        self._remove_folder()
        with self._decode_lock:  # the launcher is gone: a rank that did not report never will
            exited = self._tally.ended(returncode, launcher_hung=self._stuck)
        if self._stuck:
            exited.reason = STUCK_REASON
        self._events.put([*self._decoder.rejections(), exited])

    def _remove_folder(self) -> None:
        if self._folder is not None:
            self._folder.remove()

    @property
    def launcher(self) -> tuple[int, float]:
        return self.pid, self.started

    @property
    def finished(self) -> bool:
        return self._finished

    def new_round(self) -> None:
        """A session's next cell starts: which ranks reported is counted anew."""
        with self._decode_lock:
            self._tally.new_cell()
            self._gone.clear()

    def request_stacks(self) -> bool:
        return False  # the notebook signals the ranks itself (stacks_dir)

    def fetch_results(self, job_dir: str, ranks, kind: str = RESULTS) -> None:
        """The ranks wrote their results into the job folder already."""

    def poll(self, timeout: float) -> list[Event]:
        batch = self._events.take(timeout)
        # (the end is the last event the readers put: the last of the batch it comes in)
        self._finished = self._finished or bool(batch) and isinstance(batch[-1], LauncherExited)
        batch.extend(self._check_ranks_and_launcher())
        return batch

    def _check_ranks_and_launcher(self) -> list[Event]:
        """Ranks whose process is gone without having reported (killed, or exited early). They
        are not failed yet: their last output may still be inside the launcher (Open MPI takes
        over a minute to pass on one 20 MB line), so how they ended is settled when it exits.
        A launcher stuck after its ranks ended is stopped, so that it does exit."""
        now = time.monotonic()
        if now - self._checked_at < 0.5:
            return []
        self._checked_at = now
        with self._decode_lock:
            tally = self._tally
            gone = [r for r, pid in tally.pids.items()
                    if r not in tally.reported and r not in self._gone and not _pid_alive(pid)]
            self._gone.update(gone)
        stuck = self._launcher_stuck(now)
        if stuck == "hung":
            self._stuck = True
            self._stop((signal.SIGKILL,))  # it is deadlocked: no signal it would handle reaches it
        elif stuck == "exited":  # what a rank left behind holds its output open: stopped, as the end stops it
            self._stop()
        return [RankGone(rank) for rank in gone]

    def _launcher_stuck(self, now: float) -> str | None:
        """"hung" once the launcher has left a rank it started unreaped, had no live process under
        it, used no CPU and said nothing for ``stuck_after`` seconds (looked at every
        ``STUCK_CHECK`` s: listing processes costs milliseconds). So one that has not forked yet,
        or is still passing on output, however slowly, is never taken for hung. Its ranks' last
        lines may be stuck inside it: their reports come from what it said before. "exited" once
        it has ended that long while something it started still holds its output open."""
        if self.process.returncode is not None or self._cancelled or now - self._stuck_checked_at < STUCK_CHECK:
            return None
        self._stuck_checked_at = now
        try:
            launcher = psutil.Process(self.pid)
            exited = launcher.status() == psutil.STATUS_ZOMBIE
            busy = 0.0 if exited else sum(launcher.cpu_times()[:2])
            idle = exited
            if not exited and busy <= self._cpu_seen + 0.05:
                children = launcher.children(recursive=True)
                idle = bool(children) and not any(_alive(p) for p in children)
        except psutil.Error:
            return None
        self._cpu_seen = busy
        said, self._chunks_seen = self._chunks_read != self._chunks_seen, self._chunks_read
        if not idle or (said and not exited):  # (once it exited, what is said comes from what it left)
            self._quiet_since = None
            return None
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since < self.stuck_after:
            return None
        return "exited" if exited else "hung"

    def cancel(self) -> None:
        """SIGINT, then SIGTERM, then SIGKILL to mpirun, every rank and what they started."""
        self._cancelled = True  # what the launcher does from now on is no hang
        self._stop((signal.SIGINT, signal.SIGTERM, signal.SIGKILL))
        self.process.wait()

    def _stop(self, signals=(signal.SIGTERM, signal.SIGKILL)) -> None:
        known: dict[int, psutil.Process] = {}
        for signum, wait in zip(signals, STOP_WAITS):
            known.update((p.pid, p) for p in self._processes())  # ranks whose mpirun died are still known
            alive = [p for p in known.values() if _alive(p)]
            if not alive:
                return
            for proc in alive:
                try:
                    proc.send_signal(signum)
                except psutil.Error:
                    pass
            deadline = time.monotonic() + wait
            # psutil would reap the launcher, and Popen then read its exit status as 0
            psutil.wait_procs([p for p in alive if p.pid != self.pid], timeout=wait)
            if any(p.pid == self.pid for p in alive):
                try:
                    self.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass

    def _processes(self) -> list[psutil.Process]:
        """mpirun's process tree, everything else in its process group (setsid), and every process that
        carries this job's ``MPI_MAGIC_JOB`` (a rank's child in a process group of its own)."""
        return procs.job_processes(self.pid, self.name, self.started)


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _dying_with_notebook(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The command and preexec function that start ``argv`` so that it gets SIGTERM when the
    notebook process dies. util-linux's setpriv sets that signal and execs the command, so Python
    need not fork the notebook's whole memory for a preexec function (about 6 ms per launch)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv:
        return [setpriv, "--pdeathsig", "TERM", *argv], None
    return argv, _die_with_parent


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the notebook process dies."""
    procs.die_with_parent(signal.SIGTERM)


if TYPE_CHECKING:  # read by the type checker only: these are a SessionBackend and its BackendJob
    def _is_backend(backend: LocalBackend) -> SessionBackend:
        return backend

    def _is_backend_job(job: LocalJob) -> BackendJob:
        return job

