"""A running SageMaker training job, watched through DescribeTrainingJob and the leader's
CloudWatch log stream; and finding one again (``%mpirun_attach``) by its name."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ...errors import JobError
from ...shared import cell, jobdir
from ...shared.events import STARTING_PHASES, Billing, Event, LauncherOutput, Note, Phase, Restarted, StreamDecoder
from ..follow import Tally
from ...shared.layout import RESULTS, result_path, result_uri, split_s3, stacks_request_uri
from ...shared.payload import PAYLOAD_FILE, read_header
from .bootstrap import ALL_RELAYED, PAYLOAD_CHANNEL, TOLD_TO_STOP, announced_tag_style, unreachable_in
from .livetail import Ledger, LiveTail, live_tail_client
from .pricing import hourly_price
from .aws import aws_clients
from .settings import SageMakerSetupError
from ...shared import envvars

if TYPE_CHECKING:
    from ..base import BackendJob

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
FULL_PAGE = 10000  # GetLogEvents' largest page: a reply this long may have more behind it
LOG_LAG = 15.0  # seconds to keep reading an ended job's log for lines still arriving
ENDING_DESCRIBE = 1.0  # seconds to the first DescribeTrainingJob once the leader said mpirun is gone, then
# half as long again after each, up to the quiet pace: a job ends soon after, but its stop may take minutes
FETCHES = 16  # results downloaded at a time
RETRY_FIRST, RETRY_MOST = 2.0, 30.0  # seconds before reading again after a failed read, doubling up to the most
LIVE_READS = 15.0  # seconds between GetLogEvents calls while Live Tail brings the lines: for what it missed
LIVE_AGAIN_AFTER = 60.0  # a Live Tail session that ran this long and ended (3 hours, a dropped connection) starts again


@dataclass(frozen=True)
class Pace:
    """How often the watch loop reads the leader's log and describes the job, in seconds.

    The log is read every ``logs_fast`` seconds while lines arrive and half as often again after
    each read that finds none, up to ``logs_slow``; DescribeTrainingJob is called every
    ``describe_training`` seconds while the job trains and its log flows: then the leader's log
    says what happens (its ranks' lines, that the leader was told to stop, that mpirun is gone).
    Otherwise (starting, a quiet log: the instances may have been reclaimed) it is called every
    ``describe`` seconds. One read of the log is one call whatever the number of ranks, up to 10,000 lines a read.

    While a Live Tail session brings the lines (``livetail``), the log is read every ``LIVE_READS``
    seconds only, for what the session missed.

    ``calls_per_minute`` caps the calls over the whole job, from submitting it: a read falls due
    only while it leaves the calls within ``BUDGET_START`` plus that many a minute since the job was
    created. So a job of ``BUDGET_START / (30 - rate) * 60`` seconds or more (20 s at 24 a minute)
    makes at most 30 a minute; no SageMaker job is shorter: its instances take minutes to start.
    Once a Live Tail session began, the one read of what was written before it is made at once,
    whatever the budget: the session's lines wait for it, to be shown after the lines before them.
    """

    logs_fast: float
    logs_slow: float
    describe: float
    describe_training: float
    calls_per_minute: float | None = None


# Without Live Tail: at most 60/2.2 = 27 log reads and 2 DescribeTrainingJob calls a minute while a job
# trains (29 <= 30), whatever its size; a line waits 1.1 s for a read on average (plus CloudWatch's own
# delay). With Live Tail: 4 log reads and 2 DescribeTrainingJob calls a minute, and a line waits half
# a second on average for the session's next update.
# While nothing arrives (instances starting, a quiet cell) the log is read every 5 s and the job
# described every 5 s: 24 a minute, and no line waits more than 5 s for a read. Between the two,
# the log is read every 3.3 s and 4.95 s (18 and 12 a minute) beside a describe every 30 s.
# The cap keeps a short job's start-up and ending reads (several, soon after one another) within 30 a
# minute over the whole job: CreateTrainingJob and the first DescribeTrainingJob, then 24 a minute.
ADAPTIVE = Pace(logs_fast=2.2, logs_slow=5.0, describe=5.0, describe_training=30.0, calls_per_minute=24.0)
BUDGET_START = 2  # calls a job may make at once: CreateTrainingJob, and the first DescribeTrainingJob
READ_CALLS = 2  # the most one read makes (DescribeLogStreams, then GetLogEvents): a read waits for room for both
FIXED = Pace(logs_fast=1.0, logs_slow=1.0, describe=3.0, describe_training=3.0)  # ~80-95 calls a minute

try:
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:  # without boto3, import_boto3() says what to install
    BotoCoreError = ClientError = OSError


class SageMakerJob:
    """A submitted training job, seen through DescribeTrainingJob and the leader's log stream.

    The bootstrap stops every rank when one fails and the job ends by itself (uploading can
    take a while), so nothing here stops a job early: only an interrupt or cancel() does.
    """

    launcher = None  # on SageMaker's instances: no launcher process here
    stacks_dir = None  # no rank process here to signal
    abort_grace = None
    linger = None
    pace: Pace = ADAPTIVE  # settable, for a benchmark to compare paces
    attempts = 10  # of each call: botocore retries throttling and 5xx errors with backoff

    def __init__(self, aws, name: str, results_uri: str, token: str, live_tail: bool = True):
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": self.attempts})
        self.name, self.results_uri, self.host = name, results_uri, "algo-1"
        self.sagemaker = aws.client("sagemaker", config=config)
        self.region: str = self.sagemaker.meta.region_name
        self.logs = aws.client("logs", config=config)
        self.s3 = aws.client("s3", config=config)
        self.calls: Counter[str] = Counter()  # AWS calls made so far, by operation
        self.created_at: float | None = None  # when this kernel created the job: its call budget starts then
        self.calls_at_end: int | None = None  # AWS calls made when the job's end was known (results not fetched yet)
        for client in (self.sagemaker, self.logs, self.s3):
            client.meta.events.register("before-call", self._count)
        # Live Tail (``livetail``): not for a session, which sets its own pace
        self.live_tail = live_tail
        self._live_client: Any = None
        self._live_config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5)
        self._aws = aws
        self._log_group_arn: str | None = None  # from the job's ARN: Live Tail names log groups by ARN
        self.lines_from: Counter[str] = Counter()  # log lines passed on, by the reader that brought them first
        self.live_endings: list[str] = []  # why each Live Tail session ended
        self._event_token = token
        self._restart_to = 1  # the attempt DescribeTrainingJob says is under way
        self._attempt_since = 0.0  # when the attempt under way began (epoch): its streams are newer
        self._status = "InProgress"
        self._secondary = ""
        # None: paced by ``pace``; a session sets them as it goes
        self.describe_every: float | None = None
        self.logs_every: float | None = None
        self._failures = 0  # reads that failed in a row
        self._lines = 0  # log lines read so far
        self._live: LiveTail | None = None
        self._next_describe = 0.0
        self._described_at = 0.0
        self._next_logs = 0.0
        self._finished = False
        self._ended_status: str | None = None
        self._follow_attempt(1, "openmpi5")

    def _follow_attempt(self, attempt: int, tag_style: str) -> None:
        """Read attempt ``attempt``'s leader stream from its start (SageMaker starts a managed spot
        job again after each interruption, with new streams whose events count from the start)."""
        self._attempt = attempt
        self._stream: str | None = None
        self._token: str | None = None  # the stream's read position
        self._decoder = StreamDecoder(self._event_token, tag_style)
        self._tally = Tally()
        self._logs_wait = self.pace.logs_fast
        self._quiet_since: float | None = None
        self._all_relayed = False  # the leader said every line of mpirun's output is in its log
        self._told_to_stop = False  # the leader said it was told to stop (a stop, or capacity reclaimed)
        self._unreachable = ""  # the leader's sentence naming the instances that stopped answering
        self._ending_wait = ENDING_DESCRIBE  # between DescribeTrainingJob calls once mpirun is gone
        self._line_at = time.monotonic()  # when the last line came
        self._close_live()
        self._live_off = False  # Live Tail ended early in this attempt (refused, sampled): the log is read instead
        self._live_read = False  # the log was read since the stream started: its lines may be passed on
        self._ledger = Ledger()
        self._lines_at_read = self._lines

    def _count(self, model, **_) -> None:
        self.calls[model.name] += 1

    @property
    def api_calls(self) -> int:
        """AWS calls made so far (Live Tail's one a session included)."""
        return sum(self.calls.values())

    def create(self, request: dict) -> None:
        self.created_at = time.monotonic()
        self.sagemaker.create_training_job(**request)

    def _within_budget(self, now: float) -> bool:
        """Whether a read may be made now without the job's calls exceeding the pace's cap."""
        rate = self.pace.calls_per_minute
        if rate is None or self.created_at is None or self.describe_every is not None or self.logs_every is not None:
            return True  # (a job attached to reads its history at once; a session paces itself)
        if self._ended_status or self._restart_to > self._attempt:
            return True  # the end, or an attempt that began: its last lines are read at once, whatever the budget
        return self.api_calls + READ_CALLS <= BUDGET_START + rate / 60.0 * (now - self.created_at)

    @property
    def finished(self) -> bool:
        return self._finished

    def poll(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        events: list[Event] = []
        while not events and not self._finished:
            now, read = time.monotonic(), False
            if self._live is not None:
                events += self._take_live(now)
            try:
                if now >= self._next_describe and self._within_budget(now):  # (else it waits for the budget)
                    events += self._describe()
                    self._described_at = now
                    self._next_describe = now + self._describe_wait()
                    read = True
                # (the one read of what came before Live Tail's stream began is made at once: its lines wait for it)
                catching_up = self._live is not None and self._live.started and not self._live_read
                if now >= self._next_logs and (catching_up or self._within_budget(now)):
                    events += self._read_logs()
                    self._live_read = self._live_read or catching_up
                    self._next_logs = now + self._logs_wait_after(self._lines > self._lines_at_read)
                    self._lines_at_read = self._lines
                    read = True
                    self._start_live()
                    # the log went quiet, or says mpirun is gone: describe sooner
                    self._next_describe = min(self._next_describe, self._described_at + self._describe_wait())
                if read:  # every read tried this time succeeded: an outage, if any, is over
                    self._failures = 0
            except (BotoCoreError, ClientError) as exc:
                # watching failed beyond botocore's own retries (throttling, permissions, network, expired
                # credentials): say so once, keep the job, and read again later and later until it answers
                self._failures += 1
                if self._failures == 1:
                    events.append(Note(f"could not read the job's status or logs ({type(exc).__name__}: {exc}); "
                                       f"the job goes on: reading again every {RETRY_MOST:g}s at most until AWS answers"))
                wait = min(RETRY_MOST, RETRY_FIRST * 2 ** (self._failures - 1))
                self._next_describe = self._next_logs = now + wait
            if self._ended_status and not events and self._drained(now):
                events += self._end(self._ended_status)
            if events or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return events

    def _describe_wait(self) -> float:
        """Seconds to the next DescribeTrainingJob: rarer once the leader's log tells how the job goes."""
        if self.describe_every is not None:
            return self.describe_every
        if self._all_relayed:  # mpirun is gone: the job ends now
            return self._ending_wait
        training = self._secondary == "Training" or self._stream is not None
        return self.pace.describe_training if training and self._flowing() and not self._told_to_stop else self.pace.describe

    def _flowing(self) -> bool:
        """Lines arrive (as they come while Live Tail runs, else as the reads find them): the
        leader's log says how the job goes."""
        if self._live is not None:
            return time.monotonic() - self._line_at < self.pace.logs_slow
        return self._logs_wait < self.pace.logs_slow

    def _logs_wait_after(self, lines_arrived: bool) -> float:
        """Seconds to the next read of the log: soon while lines arrive, later and later while none do;
        rarely while Live Tail brings them."""
        if self._ended_status:  # the last lines are on their way
            return min(ENDING_DESCRIBE, self.logs_every or self.pace.logs_fast)
        if self.logs_every is not None:
            return self.logs_every
        if lines_arrived:
            self._logs_wait = self.pace.logs_fast
        else:
            self._logs_wait = min(self.pace.logs_slow, self._logs_wait * 1.5)
        return LIVE_READS if self._live is not None and self._live.started else self._logs_wait

    # -- Live Tail --------------------------------------------------------------------------------

    def _start_live(self) -> None:
        """Open a Live Tail session on the leader's stream, once it is known."""
        if (not self.live_tail or self._live is not None or self._live_off or self._stream is None
                or self._ended_status or self._log_group_arn is None):
            return
        if self._live_client is None:
            self._live_client = live_tail_client(self._aws, self.logs, self._live_config)
            self._live_client.meta.events.register("before-call", self._count)
        self._live, self._live_read = LiveTail(self._live_client, self._log_group_arn, self._stream), False

    def _take_live(self, now: float) -> list[Event]:
        """The lines Live Tail brought that no read did; once it ended, the log is read instead.
        Every line it brings comes after those read before: a line shows once, and in order."""
        live = self._live
        assert live is not None
        ended = live.ended  # read before taking: the thread adds its last lines before it says it ended
        events: list[Event] = []
        if not self._live_read and ended is None:  # the lines written between the last read and the stream's
            if live.started:  # start come first: its lines wait for that read, made at once
                self._next_logs = min(self._next_logs, now)
            return events
        lines = live.take()
        for timestamp, message in lines if self._live_read else ():  # (ended before that read: reads bring all)
            if self._ledger.first_live((timestamp, message)):
                self.lines_from["Live Tail"] += 1
                events += self._take_line(message)
        if ended is not None:
            self.live_endings.append(ended)
            self._live = None
            self._live_off = now - live.opened < LIVE_AGAIN_AFTER  # a long session that ended starts again
            self._next_logs = min(self._next_logs, now)  # for what it may have missed
        return events

    def _close_live(self) -> None:
        if self._live is not None:
            self._live.close()
            self.live_endings.append("closed")
            self._live = None

    def _drained(self, now: float) -> bool:
        """After the job ended, its last log lines may still be on their way to CloudWatch."""
        if self._quiet_since is None:
            self._quiet_since = now
        return self._tally.all_reported or self._all_relayed or now - self._quiet_since > LOG_LAG

    def look_soon(self, logs: float) -> None:
        """Read the log within ``logs`` seconds, whatever the pace."""
        self._next_logs = min(self._next_logs, time.monotonic() + logs)

    def _describe(self) -> list[Event]:
        described = self.sagemaker.describe_training_job(TrainingJobName=self.name)
        self._status = described["TrainingJobStatus"]
        if self._all_relayed:
            self._ending_wait = min(self.pace.describe, self._ending_wait * 1.5)
        if self._log_group_arn is None and described.get("TrainingJobArn"):
            _, partition, _, region, account = described["TrainingJobArn"].split(":")[:5]  # the job's log group's
            self._log_group_arn = f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}"
        events: list[Event] = []
        if described.get("SecondaryStatus") != self._secondary:
            self._secondary = described["SecondaryStatus"]
            # SageMaker's own words ("Training", "Completed"): the job's outcome is settled from the ranks
            events.append(Phase(self._secondary, f"SageMaker: {self._secondary}"))
        attempt = attempts(described.get("SecondaryStatusTransitions", ()))
        if attempt.number > self._restart_to:  # (also when the job then ended waiting for capacity: MaxWaitTimeExceeded)
            self._restart_to, self._attempt_since = attempt.number, attempt.since  # read this attempt's last lines,
            self._next_logs = 0.0  # then follow the next one's
        if self._status in ("Completed", "Failed", "Stopped") and not self._ended_status:
            self._ended_status = self._status
            self._described = described
            self._next_logs = 0.0  # the log, read to its end, is the last word
            self._close_live()
        billing = billing_of(described, self.region)
        if billing is not None:
            events.append(billing)
        return events

    def _end(self, status: str) -> list[Event]:
        described = self._described
        events: list[Event] = []
        if described.get("FailureReason"):
            events.append(LauncherOutput(f"SageMaker FailureReason: {described['FailureReason']}"))
            events.append(Note(f"SageMaker FailureReason: {described['FailureReason']}"))
        code = {"Completed": 0, "Failed": 1, "Stopped": -15}[status]
        self.calls_at_end = self.api_calls
        events += self._decoder.rejections()
        ended = self._tally.log.ended(code, self._tally.world_size is not None)  # (no rank is taken for gone: the
        # leader's end says which did not finish)
        # an instance that stopped answering ended the job, whatever its launcher said
        events.append(replace(ended, reason=self._unreachable) if self._unreachable else ended)
        self._finished = True
        return events

    def _read_logs(self) -> list[Event]:
        if self._restart_to > self._attempt:
            events = self._read_stream() if self._stream is not None else []
            return events + [self._begin_attempt(self._restart_to)]
        if self._stream is None:
            paginator = self.logs.get_paginator("describe_log_streams")
            try:  # in name order, and a stream's name ends in the second its instance started: the newest last
                for page in paginator.paginate(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.name}/algo-1-"):
                    for stream in page.get("logStreams", []):
                        if stream.get("creationTime", 0) / 1000 >= self._attempt_since:  # not an earlier attempt's
                            self._stream = stream["logStreamName"]
            except self.logs.exceptions.ResourceNotFoundException:
                return []
            if self._stream is None:
                return []
        return self._read_stream()

    def _begin_attempt(self, attempt: int) -> Restarted:
        """SageMaker started the job again (a spot interruption): the ranks' state so far is void."""
        self._follow_attempt(attempt, self._decoder.style)
        return Restarted(attempt, "spot interruption", f"spot interruption: restarting, attempt {attempt}")

    def _read_stream(self) -> list[Event]:
        events: list[Event] = []
        while True:
            kwargs = {"nextToken": self._token} if self._token else {"startFromHead": True}
            reply = self.logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=self._stream, limit=FULL_PAGE,
                                             **kwargs)
            live = self._live is not None
            for item in reply.get("events", []):
                if self._ledger.first_read((item["timestamp"], item["message"]), live):
                    self.lines_from["GetLogEvents"] += 1
                    events += self._take_line(item["message"])
            if reply.get("nextForwardToken") in (None, self._token):
                return events
            self._token = reply["nextForwardToken"]
            if len(reply.get("events", [])) < FULL_PAGE:  # caught up: ask again at the next read
                return events

    def decode_rank_lines(self, rank: int, lines: list[str]) -> list[Event]:
        """The events in a rank's own event lines (a session cell's end record), decoded as the log's
        are: an event the log brings again later is passed on once."""
        events = self._decoder.feed_rank(rank, lines)
        self._tally.take(events)
        return events

    def _take_line(self, line: str) -> list[Event]:
        """The events in one line of the leader's log, whichever reader brought it."""
        self._lines += 1
        self._quiet_since, self._line_at = None, time.monotonic()
        self._decoder.style = announced_tag_style(line) or self._decoder.style
        self._unreachable = unreachable_in(line) or self._unreachable
        if line in (ALL_RELAYED, TOLD_TO_STOP):  # mpirun is gone, or a stop or capacity reclaimed: the status says
            self._all_relayed = self._all_relayed or line == ALL_RELAYED
            self._told_to_stop = self._told_to_stop or line == TOLD_TO_STOP
            self._next_describe = min(self._next_describe, time.monotonic() + ENDING_DESCRIBE)
        decoded = self._decoder.feed(line)
        self._tally.take(decoded)
        return decoded

    def cancel(self) -> None:
        """StopTrainingJob; polling then sees Stopping and Stopped."""
        if self._ended_status:
            return
        try:
            self.sagemaker.stop_training_job(TrainingJobName=self.name)
        except ClientError:
            pass  # it ended meanwhile
        self._next_describe = 0.0

    def request_stacks(self, results_uri: str | None = None) -> bool:
        """An object the leader watches while mpirun runs, under the job's results (``results_uri``: a
        session's, which its cells' results are not under); it asks every rank through mpirun."""
        if self._ended_status:
            return True  # nothing to ask: every rank's answer is how it ended
        uri = stacks_request_uri(results_uri or self.results_uri)
        bucket, key = split_s3(uri)
        try:
            self.s3.put_object(Bucket=bucket, Key=key, Body=repr(time.time()).encode())
        except ClientError as exc:
            raise JobError(f"the ranks of job {self.name} could not be asked for their stacks: writing {uri} failed "
                           f"({exc})") from None
        return True

    def fetch_results(self, job_dir: str, ranks, kind: str = RESULTS) -> None:
        """Copy each rank's results from its own S3 key into the job folder."""
        fetch_each(self.s3, ((result_uri(self.results_uri, rank, kind), result_path(job_dir, rank, kind))
                             for rank in ranks))


def fetch_each(s3, copies: Iterable[tuple[str, str]]) -> None:
    """Copy each ``(s3 uri, path)``, ``FETCHES`` at a time, one GetObject each (``download_file``
    would add a HeadObject per rank); a missing object leaves no file, reported when it is read."""

    def fetch(copy: tuple[str, str]) -> None:
        uri, path = copy
        bucket, key = split_s3(uri)
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        except ClientError:
            return
        jobdir.make_private_dirs(os.path.dirname(path))
        partial = f"{path}.{os.getpid()}-{threading.get_ident()}.part"  # its own: two watchers of a job may fetch at once
        with jobdir.open_private(partial, "wb") as f:
            for chunk in body.iter_chunks(1 << 20):
                f.write(chunk)
        os.replace(partial, path)  # a result file is whole or absent

    with ThreadPoolExecutor(FETCHES, thread_name_prefix="mpi_magic results") as pool:
        list(pool.map(fetch, copies))


# Statuses a job passes through on its way back from Training to another attempt
RESTARTING = STARTING_PHASES | {"Interrupted", "Restarting"}
# Those between a spot interruption and its next attempt's instances: none is billed
BETWEEN_ATTEMPTS = RESTARTING - {"Downloading", "DownloadingTrainingImage"}


@dataclass(frozen=True)
class Attempts:
    """How many times SageMaker started a job (``number``: 2 after one spot interruption), since
    when the last attempt runs (``since``, epoch; 0 for the first), and the seconds spent between
    attempts (``between``), reclaimed and waiting for capacity, which are not billed."""

    number: int
    since: float
    between: float
    waiting: bool  # between attempts now


def attempts(transitions: Iterable[dict], now: float | None = None) -> Attempts:
    """The attempts in a job's SecondaryStatusTransitions: a managed spot job goes from Training
    back to starting statuses (Interrupted, Starting, ...) when SageMaker starts it again."""
    number, since, between, trained, left_at = 1, 0.0, 0.0, False, None
    for transition in transitions:
        status, at = transition.get("Status"), _epoch(transition["StartTime"])
        if left_at is not None and status not in BETWEEN_ATTEMPTS:
            between, left_at = between + at - left_at, None
        if status == "Training":
            trained = True
        elif trained and status in RESTARTING:
            number, since, trained = number + 1, at, False
            left_at = at if status in BETWEEN_ATTEMPTS else None
    if left_at is not None:
        between += (time.time() if now is None else now) - left_at
    return Attempts(number, since, between, left_at is not None)


def billing_of(described: dict, region: str, now: float | None = None) -> Billing | None:
    """What a DescribeTrainingJob reply says the job has been billed for; None before training.

    SageMaker bills each instance from TrainingStartTime to TrainingEndTime, less the time a spot
    job spent between attempts; at the end, BillableTimeInSeconds is that time per instance,
    which "multiplied by InstanceCount" is the instance time billed (the API reference's words).
    """
    started = described.get("TrainingStartTime")
    if started is None:
        return None
    config = described["ResourceConfig"]
    instances = int(config["InstanceCount"])
    plan = config.get("TrainingPlanArn") or ""
    price = None if plan else hourly_price(config["InstanceType"], region)  # a plan's capacity is paid for by the plan
    spot = bool(described.get("EnableManagedSpotTraining"))
    if "BillableTimeInSeconds" in described and described.get("TrainingEndTime") is not None:
        return Billing(instances, float(described["BillableTimeInSeconds"]) * instances, False, price, spot, plan)
    ended = described.get("TrainingEndTime")
    now = time.time() if now is None else now
    until = _epoch(ended) if ended is not None else now
    attempt = attempts(described.get("SecondaryStatusTransitions", ()), until)
    seconds = max(0.0, until - _epoch(started) - attempt.between)
    return Billing(instances, seconds * instances, ended is None and not attempt.waiting, price, spot, plan)


def _epoch(value) -> float:
    """Seconds since the epoch of a time boto3 parsed (a datetime) or left as a number."""
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def described_job(name: str, region: str | None) -> tuple[Any, dict]:
    """(boto3 handle, DescribeTrainingJob reply) of an existing job; one sentence when there is none."""
    aws = aws_clients(region)
    if not aws.region_name:
        raise SageMakerSetupError("no AWS region: pass --region us-east-1 or set AWS_DEFAULT_REGION")
    sagemaker = aws.client("sagemaker")
    try:
        return aws, sagemaker.describe_training_job(TrainingJobName=name)
    except sagemaker.exceptions.ClientError as exc:
        raise SageMakerSetupError(f"no training job {name!r} in {aws.region_name} ({exc})") from None


def attach(name: str, region: str | None, live_tail: bool = True) -> tuple[SageMakerJob, dict]:
    """An existing job (started by any notebook), with what is needed to follow it to its end."""
    aws, described = described_job(name, region)
    environment = described.get("Environment", {})
    if envvars.RESULTS_URI not in environment:
        raise SageMakerSetupError(f"training job {name!r} was not started by mpi_magic")
    channel = next(c for c in described["InputDataConfig"] if c["ChannelName"] == PAYLOAD_CHANNEL)
    bucket, key = split_s3(f"{channel['DataSource']['S3DataSource']['S3Uri'].rstrip('/')}/{PAYLOAD_FILE}")
    header, _ = read_header(_ranged_reads(aws.client("s3"), bucket, key), f"s3://{bucket}/{key}")
    info = {"instances": int(environment[envvars.INSTANCES]),
            "procs_per_instance": int(environment[envvars.PROCS_PER_INSTANCE]),
            "returns": header["meta"]["returns"], "gather": header["meta"].get("gather", False),
            "cell_file": header["meta"].get("cell_file", cell.FILENAME)}  # (a job started before cells had their own)
    job = SageMakerJob(aws, name, environment[envvars.RESULTS_URI], environment.get(envvars.EVENT_TOKEN, ""),
                       live_tail)
    return job, info  # reads the log from its start


def _ranged_reads(s3, bucket: str, key: str) -> Callable[[int], bytes]:
    """``read(size)`` over an S3 object, each a ranged GET: the header without the payload."""
    position = 0

    def read(size: int) -> bytes:
        nonlocal position
        if size <= 0:
            return b""
        body = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={position}-{position + size - 1}")["Body"].read()
        position += len(body)
        return body

    return read


if TYPE_CHECKING:  # read by the type checker only
    def _is_backend_job(job: SageMakerJob) -> BackendJob:
        return job
