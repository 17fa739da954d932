"""Ranks as processes of one ``mpirun`` on this machine, grouped into simulated instances."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading

import psutil

from .. import launcher as launchers
from ..events import Event, LauncherExited, StreamDecoder
from ..options import Config, LaunchOptions

# Seconds each signal gets to work before the next, harder one is sent (SIGINT, SIGTERM, SIGKILL).
STOP_WAITS = (2.0, 2.0, 2.0)


class LocalBackend:
    """The payload stays in the user's private job folder (0700), so ranks skip the digest
    check: hashing a large payload once per rank would cost more than loading it."""

    name = "local"
    pins_digest = False

    def __init__(self, config: Config):
        self.launcher = launchers.find_launcher(config.get("mpirun"))
        self.tag_style = self.launcher.tag_style

    def command(self, job_dir: str, digest: str | None) -> list[str]:
        return [sys.executable, "-m", "mpi_magic.runtime", job_dir, *(["--digest", digest] if digest else [])]

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> "LocalJob":
        argv = launchers.mpirun_argv(
            self.launcher, options.world_size, self.command(job_dir, digest), options.mpirun_args, os.cpu_count() or 1
        )
        env = launchers.launcher_environ(self.launcher, dict(os.environ), os.geteuid() == 0)
        env.update({
            "MPI_MAGIC_INSTANCES": str(options.instances),
            "MPI_MAGIC_PROCS_PER_INSTANCE": str(options.gpus),
            "MPI_MAGIC_MASTER_ADDR": "127.0.0.1",
            "MPI_MAGIC_MASTER_PORT": str(_free_port()),
            "MPI_MAGIC_JOB": job_name,
        })
        env.update(options.env)
        return LocalJob(job_name, argv, env, os.getcwd(), self.tag_style)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalJob:
    """A running mpirun: two pipe readers decode lines into one queue of events."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: str, tag_style: str):
        self.name = name
        self.host = socket.gethostname()
        self.argv = argv
        self._decoder = StreamDecoder(tag_style)
        self._decode_lock = threading.Lock()
        self._queue: queue.Queue[Event] = queue.Queue()
        self._finished = False
        # A session of its own: a terminal's Ctrl-C reaches the job only through cancel().
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True,
        )
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
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                with self._decode_lock:
                    for event in self._decoder.feed(line, stream):
                        self._queue.put(event)

    def _wait(self) -> None:
        for reader in self._readers:
            reader.join()
        self._queue.put(LauncherExited(self.process.wait()))

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def gaps(self) -> dict[int, int]:
        return self._decoder.gaps

    def poll(self, timeout: float) -> list[Event]:
        batch: list[Event] = []
        try:
            batch.append(self._queue.get(timeout=timeout))
            while True:
                batch.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        self._finished = self._finished or any(isinstance(e, LauncherExited) for e in batch)
        return batch

    def cancel(self) -> None:
        """SIGINT, then SIGTERM, then SIGKILL to mpirun and every rank, with short waits."""
        known: dict[int, psutil.Process] = {}
        for signum, wait in zip((signal.SIGINT, signal.SIGTERM, signal.SIGKILL), STOP_WAITS):
            known.update((p.pid, p) for p in self._tree())  # ranks whose mpirun died are still known
            alive = [p for p in known.values() if _alive(p)]
            if not alive:
                break
            for proc in alive:
                try:
                    proc.send_signal(signum)
                except psutil.Error:
                    pass
            psutil.wait_procs(alive, timeout=wait)
        self.process.wait()

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
