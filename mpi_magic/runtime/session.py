"""A session's rank: set up once, then run cell after cell in the same globals.

Rank 0 takes each message from the notebook's channel and broadcasts it over MPI; the other
ranks wait for it without spinning a core. A cell that raises is reported like a one-off
cell's, and the rank goes back to waiting instead of ending: the world stays whole as long
as every rank gets back. SIGINT interrupts the cell being run (``KeyboardInterrupt`` in the
cell's code) and is ignored between cells. Rank 0 ends the session when told to, when the
notebook is gone, or after ``--idle-timeout`` seconds without a cell.
"""

from __future__ import annotations

import os
import signal
import time

from .. import channel, payload, wire
from ..layout import result_path
from . import rank as one_off

WAIT_SLEEP_MAX = 0.002  # longest nap between checks for the next cell on ranks other than 0


def main(argv: list[str]) -> int:
    socket_path = argv[argv.index("--session") + 1]
    idle_option = one_off._option(argv, "--idle-timeout")
    idle_timeout = float(idle_option) if idle_option else None
    secret = os.environ.pop(channel.SECRET_VARIABLE, "")
    place, emitter, reporter = one_off.start_up()
    ready_writer = one_off.event_writer(os.dup(2), "stderr")
    from mpi4py import MPI  # a session's ranks talk to each other between cells

    comm = MPI.COMM_WORLD
    source = channel.RankEnd(socket_path, secret) if place.rank == 0 else None
    interrupts = CellInterrupts()
    namespace = one_off.new_namespace()
    emitter.emit_via(ready_writer, wire.READY, cell=0)
    while True:
        message = _next_message(comm, source, idle_timeout, emitter)
        if message["kind"] == "stop":
            break
        run_cell(message, place, emitter, reporter, namespace, interrupts)
        one_off.flush_streams()
        # on stderr, after the cell's own stderr: once it arrives, all the cell's output has
        emitter.emit_via(ready_writer, wire.READY, cell=message["cell"])
    if source is not None:
        source.close()
    return 0


def _next_message(comm, source: channel.RankEnd | None, idle_timeout: float | None,
                  emitter: wire.Emitter) -> dict:
    """Rank 0: the notebook's next message (a stop of its own making when the notebook is gone
    or the session has idled too long); every rank: that message, broadcast."""
    if source is not None:
        try:
            message = source.receive(idle_timeout)
        except (channel.ChannelError, OSError, ValueError):
            message = {"kind": "stop", "reason": "the notebook is gone"}
        if message is None:
            message = {"kind": "stop", "reason": f"idle for {idle_timeout:g}s (--idle-timeout)"}
        if message["kind"] == "stop":
            emitter.emit(wire.CLOSING, reason=str(message.get("reason", "stop")))
        comm.Ibarrier().Wait()
    else:
        _wait_without_spinning(comm.Ibarrier())
    return comm.bcast(message if source is not None else None, root=0)


def _wait_without_spinning(request) -> None:
    """A blocking MPI wait would keep a core busy for as long as the session idles."""
    nap = 0.00005
    while not request.Test():
        time.sleep(nap)
        nap = min(nap * 2, WAIT_SLEEP_MAX)


def run_cell(message: dict, place, emitter: wire.Emitter, reporter, namespace: dict,
             interrupts: CellInterrupts) -> None:
    """One cell in the session's globals: load what the notebook sent, run, report, write results."""
    one_off.announce(emitter, place)
    job_dir = message["dir"]
    try:
        bundle = payload.read(os.path.join(job_dir, payload.PAYLOAD_FILE), message.get("digest"))
        one_off.load_into(bundle, namespace)
        with interrupts:
            value = one_off.run_source(bundle.meta["source"], namespace, bundle.meta.get("value_at"))
    except BaseException as exc:  # noqa: BLE001 - reported; the rank goes back to waiting
        one_off.report_failure(emitter, reporter, exc)
        return
    reporter.flush()
    try:
        unreturned: dict[str, str] = {}
        results_digest = ""
        if place.rank == 0 or bundle.meta.get("gather"):
            unreturned, results_digest = one_off.write_results(job_dir, place.rank, bundle.meta, namespace, value)
    except BaseException as exc:  # noqa: BLE001 - a rank whose results are lost has failed
        _discard(result_path(job_dir, place.rank))
        one_off.report_failure(emitter, reporter, exc)
        return
    emitter.emit(wire.FINISHED, ok=True, unreturned=unreturned, results_digest=results_digest)


def _discard(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class CellInterrupts:
    """SIGINT raises ``KeyboardInterrupt`` only while a cell's code runs (``with interrupts:``)."""

    def __init__(self) -> None:
        self.armed = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.armed:
            raise KeyboardInterrupt

    def __enter__(self) -> CellInterrupts:
        self.armed = True
        return self

    def __exit__(self, *exc_info) -> None:
        self.armed = False
