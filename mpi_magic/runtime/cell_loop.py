"""A session's rank: set up once, then run cell after cell in the same globals.

Rank 0 takes each message from the notebook's channel and broadcasts it over MPI; the other
ranks wait for it without spinning a core. A cell that raises is reported like a one-off
cell's, and the rank goes back to waiting instead of ending: the world stays whole as long
as every rank gets back. SIGINT interrupts the cell being run (``KeyboardInterrupt`` in the
cell's code) and is ignored between cells. Rank 0 ends the session when told to, when the
notebook is gone, or after ``--idle-timeout`` seconds without a cell.

Where cells come from is one swappable piece (``LocalCells``: a Unix socket and the notebook's
job folders; ``ClusterCells``: a TCP channel and the job folders on the cluster's shared
filesystem, for a Slurm session; ``S3Cells``: signed messages and payloads in S3, for a SageMaker
session). Where the notebook cannot signal the ranks (Slurm, SageMaker), an interrupt comes to
rank 0 on the channel and goes on to the others over MPI (``RelayedInterrupts``).
"""

from __future__ import annotations

import base64
import os
import signal
import threading
import time

from ..shared import channel, payload, s3channel, wire
from ..shared.layout import POST_MORTEM, RESULTS, result_path, result_uri, split_s3
from . import rank as one_off
from .transcript import Transcript
from ..shared import envvars

WAIT_SLEEP_MAX = 0.002  # longest nap between checks for the next cell on ranks other than 0
CONTROL_TAG = 7  # an interrupt rank 0 passes on to the others (Slurm and SageMaker sessions)
CONTROL_NAP = 0.05  # seconds between the other ranks' looks for such an interrupt
BACK_CHECK = 0.25  # seconds between rank 0's checks that every rank is back from the cell
INLINE_RESULT = 64 * 1024  # bytes of a rank's results an end record holds (larger ones are objects of their own)
RECORD_RESULTS = 4 * 1024 * 1024  # bytes of results an end record holds in all


def main(argv: list[str]) -> int:
    """``--session ADDRESS`` (a Unix socket locally, ``tcp:HOST:PORT`` on a cluster) or ``--s3`` (a SageMaker
    session: the rest is in the environment)."""
    idle_option = one_off._option(argv, "--idle-timeout")
    idle_timeout = float(idle_option) if idle_option else None
    secret = os.environ.pop(envvars.SESSION_SECRET, "")
    place, emitter, reporter = one_off.start_up()
    ready_writer = one_off.event_writer(os.dup(2), "stderr")
    from mpi4py import MPI  # a session's ranks talk to each other between cells

    comm = MPI.COMM_WORLD
    cells: LocalCells | ClusterCells | S3Cells
    if "--s3" in argv:
        try:
            cells = S3Cells(place, comm, emitter)
        except BaseException as exc:  # noqa: BLE001 - reported; without MPI's finalize the launcher stops the rest
            one_off._fail(emitter, reporter, exc)
        idle_timeout = cells.idle_timeout
    else:
        address = argv[argv.index("--session") + 1]
        if address.startswith(channel.TCP):
            cells = ClusterCells(address, secret, place, comm)
        else:
            cells = LocalCells(address, secret, place)
    interrupts = CellInterrupts()
    namespace = one_off.new_namespace()
    emitter.emit_via(ready_writer, wire.READY, cell=0, **cells.ready_fields())
    while True:
        message = _next_message(comm, cells.source, idle_timeout, emitter, cells)
        if message["kind"] == "stop":
            break
        with cells.running(message):
            run_cell(message, place, emitter, reporter, namespace, interrupts, cells)
        one_off.flush_streams()
        # on stderr, after the cell's own stderr: once it arrives, all the cell's output has
        emitter.emit_via(ready_writer, wire.READY, cell=message["cell"])
    cells.close()
    return 0


class LocalCells:
    """Cells from the notebook's Unix socket; payloads and results in the notebook's job folders."""

    ends_with_record = False  # rank 0 writes no end record: the notebook hears the cell's end from the ranks

    def __init__(self, socket_path: str, secret: str, place: one_off.Placement):
        self.source = channel.SocketRankEnd(socket_path, secret) if place.rank == 0 else None

    def ready_fields(self) -> dict:
        """What the ranks' first ready event adds."""
        return {}

    def running(self, message: dict):
        return _Nothing()

    def cell_back(self) -> None:
        """Every rank is back from the cell (each rank calls this): what the channel does then."""

    def all_back(self) -> None:
        """Every rank is back from the cell (the notebook interrupts local ranks by itself)."""

    def payload(self, message: dict) -> tuple[str, str | None]:
        """(the payload's path, the digest to check it against)."""
        return os.path.join(message["dir"], payload.PAYLOAD_FILE), message.get("digest")

    def results_dir(self, message: dict) -> str:
        return message["dir"]

    def publish(self, message: dict, rank: int, path: str, kind: str = RESULTS) -> None:
        """The results are where the notebook reads them already."""

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


class RelayedInterrupts:
    """Where the notebook cannot signal every rank: while a cell runs, rank 0 looks for an
    interrupt of it on its channel (``self.end.interrupted``) from a thread, and passes it on over
    MPI to the other ranks, each of which listens on a thread of its own."""

    end: s3channel.S3RankEnd | channel.SocketRankEnd
    poll_every = s3channel.INTERRUPT_POLL  # seconds between rank 0's looks for an interrupt

    def __init__(self, place: one_off.Placement, comm):
        self.place, self.comm = place, comm
        self.control = comm.Dup()
        self._cell = 0  # the cell running on this rank (0: none)
        self._watch: tuple[threading.Event, threading.Thread] | None = None  # rank 0: interrupts of the last cell
        self._listener: threading.Thread | None = None
        if place.rank != 0:
            self._listener = threading.Thread(target=self._listen, name="mpi_magic interrupts", daemon=True)
            self._listener.start()

    def running(self, message: dict):
        return _Running(self, message["cell"])

    def cell_ended(self) -> None:
        """Rank 0 left the cell (what the channel needs to know of it)."""

    def watch(self, cell: int) -> None:
        """Rank 0: look for an interrupt of ``cell`` from now until every rank is back from it."""
        self.all_back()
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch_for, args=(cell, stop), name="mpi_magic interrupt watch",
                                   daemon=True)
        watcher.start()
        self._watch = (stop, watcher)

    def all_back(self) -> None:
        if self._watch is not None:
            stop, watcher = self._watch
            stop.set()
            watcher.join()
            self._watch = None

    def _listen(self) -> None:
        """Ranks other than 0: an interrupt from rank 0 for the cell this rank runs raises in it."""
        while True:
            request = self.control.irecv(source=0, tag=CONTROL_TAG)
            while True:
                done, cell = request.test()
                if done:
                    break
                time.sleep(CONTROL_NAP)
            if cell < 0:
                return
            if cell == self._cell:
                os.kill(os.getpid(), signal.SIGINT)

    def _watch_for(self, cell: int, stop: threading.Event) -> None:
        """Rank 0, while ``cell`` runs: an interrupt from the notebook goes to every rank."""
        while not stop.wait(self.poll_every):
            try:
                asked = self.end.interrupted(cell)
            except channel.ChannelError:  # the notebook is gone: nobody will interrupt (rank 0 ends the session)
                return
            except Exception as exc:  # noqa: BLE001 - the channel unreachable for a moment: look again
                _say(f"mpi_magic session: could not look for an interrupt ({type(exc).__name__}: {exc})")
                continue
            if asked:
                for other in range(1, self.comm.Get_size()):
                    self.control.send(cell, dest=other, tag=CONTROL_TAG)
                os.kill(os.getpid(), signal.SIGINT)
                return

    def close(self) -> None:
        self.all_back()
        if self.place.rank == 0:
            for other in range(1, self.comm.Get_size()):
                self.control.send(-1, dest=other, tag=CONTROL_TAG)
        elif self._listener is not None:
            self._listener.join()


class ClusterCells(RelayedInterrupts, LocalCells):
    """A Slurm session's cells: rank 0 reads them from the notebook's TCP channel; payloads and
    results are in the notebook's job folders, on the filesystem the cluster's nodes share."""

    poll_every = 0.1  # a look is a read of a socket rank 0 holds: cheap

    def __init__(self, address: str, secret: str, place: one_off.Placement, comm):
        LocalCells.__init__(self, address, secret, place)
        RelayedInterrupts.__init__(self, place, comm)
        if self.source is not None:
            self.end = self.source

    def close(self) -> None:
        RelayedInterrupts.close(self)
        LocalCells.close(self)


class S3Cells(RelayedInterrupts):
    """A SageMaker session's cells: rank 0 reads signed messages from S3 (``s3channel``); the
    first rank of each instance downloads the payload and checks it against the signed digest
    before any rank of the instance reads it; each rank uploads its own results. An interrupt
    reaches rank 0 through S3 and the other ranks from rank 0 over MPI (a thread on each).

    Where the notebook asks for it, every rank keeps a transcript of the cell and, once all are
    back, rank 0 gathers them into the cell's end record, signed with a key of its own (announced
    in its first ready event, through the job's log) and put in S3; small payloads come in the
    message and small results go in the record instead of objects of their own."""

    end: s3channel.S3RankEnd

    def __init__(self, place: one_off.Placement, comm, emitter: wire.Emitter):
        env = os.environ
        self.idle_timeout = float(env.get(envvars.IDLE_TIMEOUT) or 0) or None
        limit = float(env.get(envvars.HEARTBEAT_LIMIT) or 0) or None
        self.base = os.path.join(env.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "mpi_magic_session")
        if place.rank == 0:
            s3channel.ensure_verifier()  # before any message is read: nothing runs unchecked
        # every rank may upload results (with --gather), so every rank has an S3 end; only rank 0 receives
        self.end = s3channel.S3RankEnd(env[envvars.SESSION_URI], env.get(envvars.SESSION_KEY, ""), limit,
                                     env.get(envvars.JOB, ""), say=_say)
        self.source = self.end if place.rank == 0 else None
        if self.source is not None:
            self.source.skip_cells_sent()
        self.instance = comm.Split(place.instance, place.local_rank)
        super().__init__(place, comm)
        self.key = s3channel.Signer() if place.rank == 0 else None  # what rank 0 signs end records with
        self.transcript = Transcript()
        self.transcript.install(emitter)
        self._ending: dict | None = None  # the message of the cell whose end record is owed
        self._results: dict[str, str] = {}  # this rank's small results of the cell, for the record
        self._inline_limit = min(INLINE_RESULT, RECORD_RESULTS // max(1, comm.Get_size()))

    def ready_fields(self) -> dict:
        return {"key": self.key.public_text} if self.key is not None else {}

    @property
    def ends_with_record(self) -> bool:
        return self._ending is not None

    def running(self, message: dict):
        self.transcript.begin()
        self._results = {}
        self._ending = message if message.get("end_record") else None
        return super().running(message)

    def cell_back(self) -> None:
        message, self._ending = self._ending, None
        if message is None:
            return
        part = {"rank": self.place.rank, **self.transcript.record(), "results": self._results}
        parts = self.comm.gather(part, root=0)
        if self.key is None:
            return
        body = {"cell": message["cell"], "job": self.end.job_name, "ranks": parts}
        signed = self.key.sign(body)
        if len(signed) > s3channel.MAX_END_RECORD:  # more than the notebook reads: it ends the cell from the log
            self._publish_held(message["cell"], parts)
            body["ranks"] = [{"rank": part["rank"], "events": [], "output": {}, "dropped": {}, "whole": False,
                              "results": {}} for part in parts]
            signed = self.key.sign(body)
        try:
            self.end.put_end(message, signed)
        except Exception as exc:  # noqa: BLE001 - the notebook hears the end from the log instead
            _say(f"mpi_magic session: could not write the end record of cell {message['cell']} "
                 f"({type(exc).__name__}: {exc}); the notebook reads the log instead")
            self._publish_held(message["cell"], parts)

    def _publish_held(self, cell: int, parts: list[dict]) -> None:
        """Rank 0, where the end record could not be written: the small results it held go to S3 as
        objects of their own, where the notebook looks for them without a record."""
        for part in parts:
            for kind, data in part["results"].items():
                bucket, key = split_s3(result_uri(s3channel.results_uri(self.end.uri, cell), part["rank"], kind))
                try:
                    self.end.s3.put_object(Bucket=bucket, Key=key, Body=base64.b64decode(data))
                except Exception as exc:  # noqa: BLE001 - said; that rank's results are lost
                    _say(f"mpi_magic session: rank {part['rank']}'s results of cell {cell} could not be put in S3 "
                         f"({type(exc).__name__}: {exc})")

    def cell_ended(self) -> None:
        self.end.cell_ended()

    def payload(self, message: dict) -> tuple[str, str | None]:
        folder = os.path.join(self.base, f"cell-{message['cell']}")
        error = None
        if self.place.local_rank == 0:
            import shutil

            # every rank is past the cells before (the notebook sends a cell once all are back): their
            # payloads go, or a long session would fill the volume; values mapped from them stay readable
            for earlier in os.listdir(self.base) if os.path.isdir(self.base) else []:
                shutil.rmtree(os.path.join(self.base, earlier), ignore_errors=True)
            try:
                if "payload" in message:  # small: in the signed message itself
                    _write_payload(base64.b64decode(message["payload"]), message["sha256"], folder)
                else:
                    self.end.fetch_payload(message["cell"], message["sha256"], folder)
            except Exception as exc:  # noqa: BLE001 - every rank of the instance reports it
                error = f"{type(exc).__name__}: {exc}"
        error = self.instance.bcast(error, root=0)
        # every rank fails the cell if any instance could not fetch it: ranks that ran it alone would
        # wait in its collectives for ranks that went back to waiting
        if self.comm.allreduce(error is not None):
            error = error or "another instance could not fetch it"
        if error is not None:
            from ..errors import PayloadError  # only when it is raised: see payload._refused

            raise PayloadError(f"the cell's payload could not be fetched: {error}")
        return os.path.join(folder, payload.PAYLOAD_FILE), None  # checked against the signed digest already

    def results_dir(self, message: dict) -> str:
        return one_off._scratch_dir()

    def publish(self, message: dict, rank: int, path: str, kind: str = RESULTS) -> None:
        try:
            if kind == RESULTS and self._ending is not None and os.path.getsize(path) <= self._inline_limit:
                with open(path, "rb") as f:  # in the end record
                    self._results[kind] = base64.b64encode(f.read()).decode()
                return
            self.end.upload_result(path, message["cell"], rank, kind)
        finally:
            import shutil

            shutil.rmtree(os.path.dirname(os.path.dirname(path)), ignore_errors=True)  # the scratch folder


def _write_payload(data: bytes, sha256: str, folder: str) -> None:
    """A payload that came in the message, written where the instance's ranks read it, and checked
    against the signed digest before anyone reads it."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, payload.PAYLOAD_FILE)
    with open(path, "wb") as f:
        f.write(data)
    if payload.file_digest(path) != sha256:
        from ..errors import PayloadError  # only when it is raised: see payload._refused

        os.remove(path)
        raise PayloadError("the payload in the message is not the one its signed digest names")


class _Running:
    """While a cell runs, the rank knows which one (for interrupts); rank 0 starts watching for them."""

    def __init__(self, cells: RelayedInterrupts, cell: int):
        self.cells, self.cell = cells, cell

    def __enter__(self) -> None:
        self.cells._cell = self.cell
        if self.cells.place.rank == 0:
            self.cells.watch(self.cell)

    def __exit__(self, *exc_info) -> None:
        self.cells._cell = 0
        if self.cells.place.rank == 0:
            self.cells.cell_ended()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info) -> None:
        return None


def _say(text: str) -> None:
    """A line for the job's log (rank 0's stderr reaches the notebook as that rank's output)."""
    import sys

    print(text, file=sys.stderr, flush=True)


def _next_message(comm, source: channel.SocketRankEnd | s3channel.S3RankEnd | None, idle_timeout: float | None,
                  emitter: wire.Emitter, cells: LocalCells | ClusterCells | S3Cells) -> dict:
    """Rank 0: the notebook's next message (a stop of its own making when the notebook is gone
    or the session has idled too long); every rank: that message, broadcast.

    Rank 0 waits for it while the other ranks may still be in the cell (it finished its part
    first): until they are all back, an interrupt must still reach them (``cells.all_back``)."""
    if source is None:
        _wait_without_spinning(comm.Ibarrier())  # every rank back from the cell
        cells.cell_back()
        _wait_without_spinning(comm.Ibarrier())  # rank 0 has the message: a blocking bcast would spin until then
        return comm.bcast(None, root=0)
    barrier = comm.Ibarrier()
    back = False
    if cells.ends_with_record:  # the notebook sends nothing before the cell's end record: wait for every rank
        _wait_without_spinning(barrier)
        back = True
        cells.all_back()
        cells.cell_back()
    deadline = None if idle_timeout is None else time.monotonic() + idle_timeout
    message = None
    try:
        while message is None:
            if not back and barrier.Test():
                back = True
                cells.all_back()
            now = time.monotonic()
            if deadline is not None and idle_timeout is not None and now >= deadline:
                message = channel.stop_message(idle_reason(idle_timeout))
                break
            wait = None if deadline is None else deadline - now
            if not back:
                wait = BACK_CHECK if wait is None else min(wait, BACK_CHECK)
            message = source.receive(wait)
    except channel.ChannelError as exc:
        message = channel.stop_message(f"the notebook is gone ({exc})")
    except (OSError, ValueError):
        message = channel.stop_message("the notebook is gone")
    if message["kind"] == "stop":
        emitter.emit(wire.CLOSING, reason=str(message.get("reason", "stop")))
    if not back:
        barrier.Wait()
        cells.all_back()
    comm.Ibarrier().Wait()
    return comm.bcast(message, root=0)


def idle_reason(idle_timeout: float) -> str:
    """Why rank 0 ends a session that waited ``idle_timeout`` seconds for a cell."""
    return f"idle for {idle_timeout:g}s (--max-idle)"


def _wait_without_spinning(request) -> None:
    """A blocking MPI wait would keep a core busy for as long as the session idles."""
    nap = 0.00005
    while not request.Test():
        time.sleep(nap)
        nap = min(nap * 2, WAIT_SLEEP_MAX)


def run_cell(message: dict, place, emitter: wire.Emitter, reporter, namespace: dict,
             interrupts: CellInterrupts, cells: LocalCells | ClusterCells | S3Cells) -> None:
    """One cell in the session's globals: load what the notebook sent, run, report, write results."""
    one_off.announce(emitter, place)
    try:
        path, digest = cells.payload(message)
        bundle = payload.read(path, digest)
        one_off.load_into(bundle, namespace)
    except BaseException as exc:  # noqa: BLE001 - reported; the rank goes back to waiting
        one_off.report_failure(emitter, reporter, exc)
        return
    cell_file = bundle.meta["cell_file"]
    try:
        with interrupts:
            value = one_off.run_source(bundle.meta["source"], bundle.meta["code"], namespace, cell_file,
                                       bundle.meta["cell_name"])
    except BaseException as exc:  # noqa: BLE001 - reported; the rank goes back to waiting
        failed_at = time.time()  # keeping the frames may take seconds: the failure is when it was raised
        kept = one_off.keep_post_mortem(exc, cell_file, cells.results_dir(message), place.rank,
                                        lambda path: cells.publish(message, place.rank, path, POST_MORTEM))
        one_off.report_failure(emitter, reporter, exc, kept, failed_at, cell_file)
        return
    reporter.flush()
    results_dir = ""
    try:
        unreturned: dict[str, str] = {}
        results_digest = ""
        if place.rank == 0 or bundle.meta.get("gather"):
            results_dir = cells.results_dir(message)
            unreturned, results_digest = one_off.write_results(results_dir, place.rank, bundle.meta, namespace, value)
            cells.publish(message, place.rank, result_path(results_dir, place.rank))
    except BaseException as exc:  # noqa: BLE001 - a rank whose results are lost has failed
        if results_dir:
            _discard(result_path(results_dir, place.rank))
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
