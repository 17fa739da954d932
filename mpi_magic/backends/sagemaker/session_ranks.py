"""A session on SageMaker: one training job whose ranks wait for cells (``runtime/cell_loop.py``).

Cells, values and results go through S3 under the job's prefix (``s3channel``: signed by a key
only this notebook holds); the ranks' events and output come back through the leader's
CloudWatch stream, read by the one-off jobs' watch loop (``training_job.SageMakerJob``), paced here so
that an idle session costs at most 12 AWS calls a minute and a running cell at most 30. A cell's
end, its small results and the tail of its output come sooner, from the end record rank 0 writes
to S3 (``cell_end``), which the notebook looks for while the cell runs: every 50 ms for its first
3 s, then less and less often, every 2 s at most (S3 GETs, counted apart in ``end_looks``: about 30
a minute during a long cell, at $0.0004 per 1,000). An object there that is not rank 0's record is
refused and the looks go on: rank 0's record, written when the cell ends, takes its place.

The notebook refreshes a heartbeat object; the job ends by itself when it is older than the
heartbeat limit, after ``--max-idle`` without a cell, or at ``--max-runtime``. The key is
kept in this user's private cache folder so that ``%mpirun_session attach`` can take the
session over from a fresh kernel on this machine.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Iterable

from ...errors import ResultsLost
from ...shared import envvars, jobdir, s3channel, wire
from ...shared.cost import estimate
from ...shared.events import Event, Note, RankReady
from ...shared.layout import RESULTS, result_path, result_uri
from ...shared.payload import PAYLOAD_FILE
from ..follow import stop_then_wait
from .cell_end import CellEnds
from .history import record_job
from .settings import SageMakerSetupError
from .training_job import ClientError, SageMakerJob, billing_of, described_job, fetch_each

if TYPE_CHECKING:
    from ..base import SessionRanks

# AWS calls: idle, DescribeTrainingJob every 10 s, the log every 20 s and the heartbeat (once a minute
# by default) make 10 a minute; while a cell runs, the log is read soon after the cell is sent, then
# less and less often (every 4 s at most), with DescribeTrainingJob every 30 s: about 25 a minute.
STARTING_DESCRIBE, STARTING_LOGS = 5.0, 1.0  # until every rank is up: SageMaker's phases, then the ranks
IDLE_DESCRIBE, IDLE_LOGS = 10.0, 20.0
RUNNING_DESCRIBE, RUNNING_LOGS_MIN, RUNNING_LOGS_MAX = 30.0, 0.25, 4.0
STOPPING_DESCRIBE = 2.0
ASKED_LOGS, ASKED_FOR = 1.0, 20.0  # after the ranks were asked for their stacks, the log is read every second for 20 s
END_LOOK_FAST, END_LOOK_FAST_FOR, END_LOOK_SLOW = 0.05, 3.0, 2.0  # seconds between looks for a cell's end record
RECORD_WAIT = 20.0  # seconds the results wait for the end record that holds them, when the log told the end first
STOP_LIMIT = 600.0  # seconds to wait for Stopped
KEYS = "sessions"  # under the cache folder: one private key file per session started here


def key_path(cache_dir: str, job_name: str) -> str:
    return os.path.join(cache_dir, KEYS, f"{job_name}.key")


def save_key(cache_dir: str, job_name: str, signer: s3channel.Signer) -> None:
    """The session's private key, readable by this user only: what ``attach`` signs with."""
    path = key_path(cache_dir, job_name)
    jobdir.make_private_dirs(os.path.dirname(path))
    with jobdir.open_private(path, "wb") as f:
        f.write(signer.private_bytes)


def load_key(cache_dir: str, job_name: str) -> s3channel.Signer:
    try:
        with open(key_path(cache_dir, job_name), "rb") as f:
            return s3channel.Signer(f.read())
    except FileNotFoundError:
        raise SageMakerSetupError(
            f"session {job_name} was not started from this machine as this user (its key is not in "
            f"{os.path.dirname(key_path(cache_dir, job_name))}); only the notebook holding its key can run cells "
            "on it") from None


class SageMakerSessionRanks:
    """A session's training job: its events through the job's watch loop, cells through S3."""

    launcher = None  # on SageMaker's instances: no launcher process here
    stacks_dir = None  # no rank process here to signal
    stop_description = "an interrupt signed by this notebook, through S3"
    latency = 20.0  # seconds S3 polling and CloudWatch add before the notebook sees the ranks back
    start_limit = 3600.0  # provisioning instances can take many minutes
    end_records = True  # a cell's end from rank 0's record in S3 (settable: a benchmark compares with the log's)

    def __init__(self, job: SageMakerJob, channel: s3channel.NotebookEnd, world_size: int,
                 heartbeat_every: float, key_file: str, stacks_uri: str, clock=time.monotonic):
        self.job, self.channel, self.world_size = job, channel, world_size
        self.stacks_uri = stacks_uri  # the job's results prefix, under which its leader reads requests for stacks
        self.key_file = key_file  # removed once the job has ended: the key signs nothing after that
        self.name = self.job_name = job.name
        self.heartbeat_every = heartbeat_every
        self.clock = clock
        self._cell = 0  # the last cell sent
        self._sent_at: float | None = None  # while a cell runs: when it (or its interrupt) was sent
        self._back: set[int] = set()
        self._stop_beating = threading.Event()
        self._beater: threading.Thread | None = None
        self.released: str | None = None  # why this notebook no longer holds the session, which runs on
        self._sent_at = self.clock()  # starting counts as running: every rank reports ready to cell 0
        self.job.describe_every, self.job.logs_every = STARTING_DESCRIBE, STARTING_LOGS
        self._starting = True
        self._rank_key: str | None = None  # rank 0's public key, from its first ready event in the log
        self.ends = CellEnds()
        self._record_uri: str | None = None  # where the running cell's end record is looked for (None: not looked for)
        self._refused: str | None = None  # why the last object found there was not the cell's end record
        self._next_end_look = 0.0
        self._end_wait = END_LOOK_FAST
        self._stacks_asked_at: float | None = None  # when the ranks were last asked for their stacks
        self.end_looks = 0  # GETs of end records (S3, cheap and not throttled like SageMaker's and CloudWatch's calls)

    # -- pacing -------------------------------------------------------------------------------

    def _pace_idle(self) -> None:
        self._sent_at = None
        self.job.describe_every, self.job.logs_every = IDLE_DESCRIBE, IDLE_LOGS

    def _pace_running(self) -> None:
        self._sent_at = self.clock()
        self.job.describe_every, self.job.logs_every = RUNNING_DESCRIBE, RUNNING_LOGS_MIN
        self.job.look_soon(RUNNING_LOGS_MIN)

    def resume(self, cells: int) -> None:
        """Taking a session over: ``cells`` cells ran on it, and its ranks are waiting after the last."""
        self._cell = cells

    def start_heartbeat(self) -> None:
        """Refresh the heartbeat now, then every ``heartbeat_every`` seconds, from a thread."""
        self.channel.beat()
        self._beater = threading.Thread(target=self._beat, name=f"mpi_magic heartbeat {self.name}", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop_beating.wait(self.heartbeat_every):
            try:
                self.channel.beat()
            except s3channel.TakenOver as exc:
                self._release(str(exc))
            except Exception:  # noqa: BLE001 - missed once; the limit allows for several
                pass

    def _release(self, reason: str) -> None:
        """Hold the session no more, and leave its job running: no heartbeat, no cells, no stop."""
        self.released = self.released or reason
        self._stop_beating.set()

    def let_go(self, reason: str) -> None:
        """Stop watching and refreshing the session from this notebook; its job runs on until its
        heartbeat limit, or until a notebook takes it over (``%mpirun_session attach``)."""
        self._release(reason)
        if self._beater is not None and self._beater is not threading.current_thread():
            self._beater.join(timeout=10)

    # -- SessionRanks ---------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """The job has ended, or this notebook let go of it (so the watching ends too)."""
        return self.job.finished or self.released is not None

    @property
    def api_calls(self) -> int:
        """AWS calls made for this session so far (the watch loop's, the heartbeat's, the cells'), less
        the looks for end records (``end_looks``)."""
        return self.job.api_calls - self.end_looks

    def poll(self, timeout: float) -> list[Event]:
        if self._sent_at is not None and not self._starting:  # a cell runs: the log is read less often the longer it runs
            ran = self.clock() - self._sent_at
            self.job.logs_every = min(RUNNING_LOGS_MAX, max(RUNNING_LOGS_MIN, ran / 2))
        if self._stacks_asked_at is not None:  # the answers are due: read soon, in a cell or between cells
            if self.clock() - self._stacks_asked_at < ASKED_FOR:
                self.job.logs_every = min(self.job.logs_every or ASKED_LOGS, ASKED_LOGS)
            else:
                self._stacks_asked_at = None
                if self._sent_at is None:
                    self.job.logs_every = IDLE_LOGS
        said: list[Event] = []
        if self._record_uri is not None:
            if self.clock() >= self._next_end_look:
                said = self._look_for_end()
            timeout = min(timeout, max(0.0, self._next_end_look - self.clock()))
        found = said + self.ends.from_log(self.job.poll(timeout))
        from_record = self.ends.apply(self.job.decode_rank_lines)
        if from_record is not None:
            self._record_uri = None
            found += from_record
        for event in found:
            if isinstance(event, RankReady) and event.rank == 0 and event.cell == 0 and event.key:
                self._rank_key = self._rank_key or event.key  # (the first: rank 0 announces it once)
            if isinstance(event, RankReady) and event.cell == self._cell:
                self._back.add(event.rank)
        if self._sent_at is not None and len(self._back) >= self.world_size:
            self._starting = False
            self._pace_idle()
        return found

    def _look_for_end(self) -> list[Event]:
        """Read the running cell's end record if rank 0 has written it; look again later otherwise,
        also after refusing an object someone else put there (said once for each): rank 0's record,
        written when the cell ends, takes its place."""
        assert self._record_uri is not None and self._rank_key is not None
        self.end_looks += 1
        said: list[Event] = []
        try:
            self.ends.record = self.channel.end_record(self._record_uri, self._cell, self._rank_key)
        except s3channel.Refused as exc:
            self._refused = str(exc)
            said.append(Note(f"refused the object at cell {self._cell}'s end record in S3 ({exc}): it is not rank 0's "
                             "record, which is still looked for there"))
        except Exception:  # noqa: BLE001 - S3 unreachable for a moment: look again
            pass
        if self.ends.record is not None:
            self._record_uri = None
            return said
        since = self.clock() - (self._sent_at or self.clock())
        self._end_wait = END_LOOK_FAST if since < END_LOOK_FAST_FOR else min(END_LOOK_SLOW, self._end_wait * 1.5)
        self._next_end_look = self.clock() + self._end_wait
        return said

    def connect(self) -> bool:
        return True  # S3 needs no connection: rank 0 is there once it says it is ready

    def close(self, reason: str) -> None:
        """The job's end is SageMaker's to say (Stopped, not Completed): it is stopped."""
        if self.released is not None:
            return
        self.job.describe_every = STOPPING_DESCRIBE
        self.job.cancel()

    def send_cell(self, number: int, job_dir: str, digest: str | None) -> None:
        try:
            self.channel.check_held()
        except s3channel.TakenOver as exc:
            self._release(str(exc))
            raise
        self._cell, self._back = number, set()
        record = self.end_records and self._rank_key is not None
        self.ends.begin()
        self._record_uri = self.channel.send_cell(number, os.path.join(job_dir, PAYLOAD_FILE),
                                                  end_record=record)
        self._pace_running()
        self._refused = None
        self._end_wait, self._next_end_look = END_LOOK_FAST, self.clock() + END_LOOK_FAST

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """From the cell's end record where it holds them, else from their objects in S3. Where the log
        told the cell's end before the record was read, the record is waited for (often at first, then
        less often): the small results are only there. ``ResultsLost`` where results are still missing
        then."""
        deadline, wait = self.clock() + RECORD_WAIT, END_LOOK_FAST
        while self._record_uri is not None and self.clock() < deadline:
            self._look_for_end()
            time.sleep(wait)
            wait = min(END_LOOK_SLOW, wait * 1.5)
        missing = self.ends.fetch_results(job_dir, ranks, kind)
        results = s3channel.results_uri(self.channel.uri, self._cell)
        fetch_each(self.job.s3, ((result_uri(results, rank, kind), result_path(job_dir, rank, kind))
                                 for rank in missing))
        lost = [rank for rank in missing if not os.path.exists(result_path(job_dir, rank, kind))]
        if kind == RESULTS and lost and self._record_uri is not None:
            why = (f"the object where its end record goes is not rank 0's record ({self._refused}): someone else "
                   f"writes to {self.channel.uri}/ and replaced rank 0's record, or put theirs and rank 0's never came "
                   "(allow only this notebook and the job's role to write there)" if self._refused else
                   f"rank 0's end record, which holds them, did not come within {RECORD_WAIT:g}s")
            raise ResultsLost(f"the results of cell {self._cell} could not be read: {why}")

    def request_stacks(self) -> bool:
        """An object the session's leader watches, as a one-off job's does: it asks every rank through
        mpirun, in a cell or between cells."""
        if self.finished:
            return False
        asked = self.job.request_stacks(self.stacks_uri)
        self._stacks_asked_at = self.clock()
        self.job.look_soon(ASKED_LOGS)
        return asked

    def interrupt(self, pids: dict[int, int]) -> None:
        """One signed object: rank 0 sees it within a second and interrupts every rank."""
        if self._cell:
            self.channel.interrupt(self._cell)
            self._pace_running()

    def memory(self, pids: dict[int, int]) -> dict[int, int]:
        return {}

    def stop(self, wait: bool = True) -> None:
        """StopTrainingJob; with ``wait``, until SageMaker says it ended (the session's watcher reads that)."""
        self._stop_beating.set()
        if self._beater is not None and self._beater is not threading.current_thread():
            self._beater.join(timeout=10)
        if self.released is not None:
            return  # another notebook holds it, or may: its job is not this notebook's to stop

        def cancel() -> None:
            self.job.describe_every = STOPPING_DESCRIBE
            self.job.cancel()

        if stop_then_wait(cancel, lambda: self.job.finished, STOP_LIMIT if wait else 0, lambda: time.sleep(0.05)):
            try:
                os.remove(self.key_file)
            except OSError:
                pass

    def facts(self) -> list[str]:
        """What ``%mpirun_session`` adds for this backend: the job, its billable instance time so far
        and what that costs at the shipped list prices."""
        try:
            described = self.job.sagemaker.describe_training_job(TrainingJobName=self.name)
        except Exception as exc:  # noqa: BLE001 - shown instead
            return [f"training job: {self.name} (DescribeTrainingJob failed: {type(exc).__name__}: {exc})"]
        lines = [f"training job: {self.name}, {described['TrainingJobStatus']} ({described.get('SecondaryStatus', '')})"]
        billing = billing_of(described, self.job.region)
        if billing is not None:
            spent = ("paid for by the training plan" if billing.training_plan
                     else estimate(billing.hourly_price, billing.instance_seconds, billing.spot))
            config = described["ResourceConfig"]
            lines.append(f"billable instance time: {billing.instance_seconds:.0f}s ({config['InstanceCount']} x "
                         f"{config['InstanceType']}), {spent or 'cost unknown (no list price in the shipped table)'}")
        return lines


def start(backend, name: str, options, idle_timeout: float | None, heartbeat_every: float, heartbeat_limit: float,
          cache_dir: str) -> SageMakerSessionRanks:
    """Upload the code, create the job whose ranks wait for cells, and start the heartbeat."""
    from .request import job_prefix, results_uri, validate

    settings = backend.settings
    if heartbeat_limit <= heartbeat_every:
        raise SageMakerSetupError(f"heartbeat_limit ({heartbeat_limit:g}s) must be longer than heartbeat "
                                  f"({heartbeat_every:g}s), or the session would end between two heartbeats")
    _refuse_a_running_namesake(backend, name, cache_dir)
    signer = s3channel.Signer()
    uri = s3channel.session_uri(job_prefix(settings, name))
    token = wire.new_token()
    request = backend.request(name, "", options, token, session={
        envvars.SESSION_URI: uri, envvars.SESSION_KEY: signer.public_text,
        envvars.HEARTBEAT_LIMIT: repr(float(heartbeat_limit)),
        envvars.IDLE_TIMEOUT: repr(float(idle_timeout or 0)),  # (0: none)
    })
    validate(request)
    job = SageMakerJob(backend.aws, name, s3channel.results_uri(uri, 0), token, live_tail=False)  # paced here
    backend.upload(job.s3, name, None)
    ranks = SageMakerSessionRanks(job, s3channel.NotebookEnd(job.s3, uri, name, signer),
                                  options.world_size, heartbeat_every, key_path(cache_dir, name),
                                  results_uri(settings, name))
    save_key(cache_dir, name, signer)
    ranks.channel.beat()  # before the job exists: rank 0 finds it from its first look
    try:
        job.create(request)
    except ClientError as exc:
        os.remove(key_path(cache_dir, name))
        raise SageMakerSetupError(f"SageMaker did not create the session's training job {name}: {exc}") from None
    try:
        record_job(name, settings.region)
        ranks.start_heartbeat()
    except BaseException:  # an interrupt right after creating must not leave the job running
        ranks.stop(wait=False)
        raise
    return ranks


def _refuse_a_running_namesake(backend, name: str, cache_dir: str) -> None:
    """A session of this name started here whose job still runs keeps its key and its S3 objects."""
    if not os.path.exists(key_path(cache_dir, name)):
        return
    try:
        status = backend.aws.client("sagemaker").describe_training_job(TrainingJobName=name)["TrainingJobStatus"]
    except ClientError:
        status = "gone"
    if status in ("InProgress", "Stopping"):
        raise SageMakerSetupError(f"session {name} started from here still runs: %mpirun_session attach {name}, "
                                  "or choose another --job-name")
    os.remove(key_path(cache_dir, name))  # kept for a job that has ended


def attach(job_name: str, region: str | None, cache_dir: str, heartbeat_every: float) -> tuple[SageMakerSessionRanks, dict]:
    """A running session started from this machine, its cells counted from S3; (ranks, facts)."""
    aws, described = described_job(job_name, region)
    environment = described.get("Environment", {})
    uri = environment.get(envvars.SESSION_URI)
    if not uri:
        raise SageMakerSetupError(f"training job {job_name!r} is not an mpi_magic session; "
                                  f"%mpirun_attach {job_name} follows a one-off job")
    if described["TrainingJobStatus"] != "InProgress":
        raise SageMakerSetupError(f"session {job_name} has ended ({described['TrainingJobStatus']}"
                                  f"{': ' + described['FailureReason'] if described.get('FailureReason') else ''}); "
                                  "%mpirun_session start starts a new one")
    signer = load_key(cache_dir, job_name)
    if signer.public_text != environment.get(envvars.SESSION_KEY):
        raise SageMakerSetupError(f"the key kept here for {job_name} is not the one the session checks cells with")
    job = SageMakerJob(aws, job_name, s3channel.results_uri(uri, 0), environment.get(envvars.EVENT_TOKEN, ""),
                       live_tail=False)
    instances = int(environment[envvars.INSTANCES])
    per_instance = int(environment[envvars.PROCS_PER_INSTANCE])
    ranks = SageMakerSessionRanks(job, s3channel.NotebookEnd(job.s3, uri, job_name, signer),
                                  instances * per_instance, heartbeat_every, key_path(cache_dir, job_name),
                                  environment.get(envvars.RESULTS_URI, ""))
    ranks.channel.beat()  # first: the session may be close to its heartbeat limit
    cells = ranks.channel.last_cell()
    ranks.resume(cells)
    ranks.start_heartbeat()
    try:
        names = set(environment.get(envvars.ENV_NAMES, "").split())
        info = {"instances": instances, "procs_per_instance": per_instance, "cells": cells,
                "env": {k: v for k, v in environment.items() if k in names}}
    except BaseException:  # an interrupt right now: the session runs on, unwatched from here
        ranks.let_go("the attach was interrupted")
        raise
    return ranks, info


if TYPE_CHECKING:  # read by the type checker only
    def _is_session_ranks(ranks: SageMakerSessionRanks) -> SessionRanks:
        return ranks
