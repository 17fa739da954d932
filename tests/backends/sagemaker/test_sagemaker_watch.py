"""Watching a SageMaker job over real HTTP (unchanged boto3 against a moto server and mpi_magic's
SageMaker emulator): throttled and failing calls, the pace of the log's reads, a job started
again after a spot interruption, and the log followed through CloudWatch Live Tail.

The tests share one server of each (``local_aws_env``); each keeps to its own S3 prefix and
its own job names."""

from __future__ import annotations

import os
import time

import pytest
from helpers import BUCKET, run, wait_until


class ClientFaults:
    """A fault injector for CloudWatch Logs and S3, standing for what cannot run here: moto cannot be
    made to throttle. The first attempt of every ``every``-th call of each operation named is answered,
    before it is sent, with the error a busy service sends (ThrottlingException, HTTP 400, from
    CloudWatch Logs; SlowDown, HTTP 503, from S3), so that botocore handles it as it would the real one."""

    ERRORS = {
        "cloudwatch-logs": (400, b'{"__type": "ThrottlingException", "message": "Rate exceeded (injected)"}'),
        "s3": (503, b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate (injected)</Message></Error>"),
    }

    def __init__(self, every: int):
        from collections import Counter

        self.every = every
        self.sent: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()

    def attach(self, client, operations: list[str]) -> None:
        service = client.meta.service_model.service_id.hyphenize()
        for operation in operations:
            client.meta.events.register(f"before-send.{service}.{operation}", self._answer)

    def _answer(self, request, event_name: str, **_):
        from botocore.awsrequest import AWSResponse

        _, service, operation = event_name.split(".")
        self.sent[operation] += 1
        if (self.sent[operation] - 1) % self.every:
            return None  # sent as it is
        self.injected[operation] += 1
        status, body = self.ERRORS[service]
        return AWSResponse(request.url, status, {}, _Body(body))


class _Body:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, **_):
        yield self.data


def test_throttling_and_server_errors_neither_stop_a_job_nor_lose_a_result(ip, cloud, monkeypatch, local_aws_env):
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob
    from mpi_magic.testing.sagemaker_emulator import set_faults

    faults, init = ClientFaults(every=2), SageMakerJob.__init__

    def faulty(self, *args, **kwargs):
        init(self, *args, **kwargs)
        faults.attach(self.logs, ["GetLogEvents", "DescribeLogStreams"])
        faults.attach(self.s3, ["GetObject"])

    monkeypatch.setattr(SageMakerJob, "__init__", faulty)
    endpoint = local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"]
    before = set_faults(endpoint, "DescribeTrainingJob", throttle=0.3, server_error=0.2, seed=11)
    try:
        run(ip, "-i 2 -g 2 --gather", "import mpi_magic\nme = mpi_magic.rank()\n")
    finally:
        after = set_faults(endpoint, "DescribeTrainingJob")
    assert ip.user_ns["me"] == [0, 1, 2, 3]
    assert after.get("DescribeTrainingJob", 0) > before.get("DescribeTrainingJob", 0)
    assert faults.injected["GetLogEvents"] and faults.injected["DescribeLogStreams"] and faults.injected["GetObject"] >= 2


def test_status_unread_beyond_botocores_retries_is_one_note_and_the_job_still_ends_with_its_results(
        ip, cloud, monkeypatch, local_aws_env):
    from mpi_magic.backends.sagemaker import training_job as sagemaker_job
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob
    from mpi_magic.shared.events import Note
    from mpi_magic.testing.sagemaker_emulator import set_faults

    endpoint = local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"]
    seen, poll, noted_at = [], SageMakerJob.poll, []

    def watched(self, timeout):
        found = poll(self, timeout)
        seen.extend(found)
        if not noted_at and any(isinstance(e, Note) for e in found):
            noted_at.append(time.monotonic())
        if len(noted_at) == 1 and time.monotonic() - noted_at[0] > 1.5 * sagemaker_job.RETRY_FIRST:
            set_faults(endpoint, "DescribeTrainingJob")  # the outage ends after the loop's second try
            noted_at.append(time.monotonic())
        return found

    monkeypatch.setattr(SageMakerJob, "poll", watched)
    monkeypatch.setattr(SageMakerJob, "attempts", 1)  # each failed call reaches the watch loop
    set_faults(endpoint, "DescribeTrainingJob", throttle=1.0)
    try:
        run(ip, "-i 2 -g 1 --gather", "import mpi_magic\nme = mpi_magic.rank()\n")
    finally:
        injected = set_faults(endpoint, "DescribeTrainingJob")
    notes = [e.text for e in seen if isinstance(e, Note) and "could not read" in e.text]
    assert len(notes) == 1 and "ThrottlingException" in notes[0]
    assert injected["DescribeTrainingJob"] >= 2  # the loop tried again while it was throttled, and said nothing more
    assert ip.user_ns["me"] == [0, 1]


def test_the_log_is_read_less_often_while_quiet_up_to_a_bound_and_soon_again_once_lines_arrive(aws):
    from mpi_magic.backends.sagemaker.training_job import ADAPTIVE, SageMakerJob

    job = SageMakerJob(aws.session.Session(), "quiet-job", "s3://bucket/results", "token")
    quiet = [job._logs_wait_after(False) for _ in range(8)]
    assert quiet == sorted(quiet) and quiet[0] > ADAPTIVE.logs_fast and quiet[-1] == ADAPTIVE.logs_slow
    assert job._logs_wait_after(True) == ADAPTIVE.logs_fast
    assert job._describe_wait() == ADAPTIVE.describe
    job._secondary = "Training"  # from then on the leader's log tells how the job goes
    assert job._describe_wait() == ADAPTIVE.describe_training > ADAPTIVE.describe
    job.describe_every, job.logs_every = 2.0, 0.5  # a session's own pace wins
    assert (job._describe_wait(), job._logs_wait_after(False)) == (2.0, 0.5)


def test_a_spot_interruption_restarts_the_job_and_the_cell_resumes_from_its_checkpoint(
        ip, cloud, prefix, local_aws_env, capsys):
    from helpers import once
    from mpi_magic.testing.sagemaker_emulator import interrupt

    checkpoints = f"{prefix}/checkpoints"
    s3 = cloud.client("s3")

    def saved_steps() -> list[int]:
        time.sleep(0.2)  # asked again and again while the cell runs: not a flood of requests
        listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=checkpoints + "/").get("Contents", [])
        # (SageMaker copies whatever is in the folder: a rank's ``.part`` file too, if caught before its rename)
        return [int(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()) for o in listed
                if not o["Key"].endswith(".part")]

    def interrupted() -> None:
        interrupt(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], ip.user_ns["job"].name)

    # every rank saves its step; once each has saved three of twelve in S3, spot capacity is reclaimed
    with once(lambda: len(steps := saved_steps()) == 4 and min(steps) >= 3, interrupted, pause=0, limit=90):
        run(ip, f"-i 2 -g 2 --spot --checkpoint-s3 s3://{BUCKET}/{checkpoints} --gather --out job", (
            "import os, time, mpi_magic\n"
            "path = os.path.join(mpi_magic.checkpoint_dir(), f'rank-{mpi_magic.rank()}')\n"
            "resumed_from = int(open(path).read()) if os.path.exists(path) else 0\n"
            "for step in mpi_magic.progress(range(resumed_from, 12)):\n"
            "    time.sleep(0.4)\n"
            "    with open(path + '.part', 'w') as f:\n"
            "        f.write(str(step + 1))\n"
            "    os.replace(path + '.part', path)\n"
        ))
    job = ip.user_ns["job"]
    resumed_from = ip.user_ns["resumed_from"]
    assert all(3 <= start < 12 for start in resumed_from), f"every rank resumed from its checkpoint: {resumed_from}"
    assert saved_steps() == [12] * 4
    assert job.status == "completed" and job.model.attempt == 2
    assert [(s.status, s.n, s.total) for s in job.ranks] == [("completed", 12 - r, 12 - r) for r in resumed_from]
    assert "spot interruption: restarting, attempt 2" in capsys.readouterr().err
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    assert [t["Status"] for t in described["SecondaryStatusTransitions"]].count("Interrupted") == 1
    streams = cloud.client("logs").describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs",
                                                       logStreamNamePrefix=f"{job.name}/algo-1-")["logStreams"]
    assert len(streams) == 2, "the leader's log of each attempt"
    del ip.user_ns["resumed_from"]
    ip.run_line_magic("mpirun_attach", f"{job.name} --out attached")  # a new handle, from SageMaker and S3 alone
    attached = ip.user_ns["attached"]
    assert attached.model.attempt == 2 and [s.status for s in attached.ranks] == ["completed"] * 4
    assert ip.user_ns["resumed_from"] == resumed_from


def test_attempts_and_billable_time_of_a_job_started_again_after_a_spot_interruption():
    from mpi_magic.backends.sagemaker.training_job import Attempts, attempts, billing_of

    transitions = [{"Status": "Starting", "StartTime": 1000.0}, {"Status": "Downloading", "StartTime": 1010.0},
                   {"Status": "Training", "StartTime": 1020.0}, {"Status": "Interrupted", "StartTime": 1100.0},
                   {"Status": "Starting", "StartTime": 1101.0}, {"Status": "Downloading", "StartTime": 1400.0}]
    assert attempts(transitions[:3], now=1050.0) == Attempts(1, 0.0, 0.0, False)
    assert attempts(transitions[:5], now=1200.0) == Attempts(2, 1100.0, 100.0, True), "reclaimed: waiting for capacity"
    assert attempts(transitions, now=1500.0) == Attempts(2, 1100.0, 300.0, False)
    described = {"TrainingStartTime": 1010.0, "ResourceConfig": {"InstanceCount": 2, "InstanceType": "ml.m5.xlarge"},
                 "EnableManagedSpotTraining": True, "SecondaryStatusTransitions": transitions[:5]}
    waiting = billing_of(described, "us-east-1", now=1200.0)
    assert (waiting.instance_seconds, waiting.running) == (2 * (1200 - 1010 - 100), False)
    again = billing_of({**described, "SecondaryStatusTransitions": transitions}, "us-east-1", now=1500.0)
    assert (again.instance_seconds, again.running) == (2 * (1500 - 1010 - 300), True)


# -- Live Tail: the log pushed each second instead of read each time ----------------------------

def _log_stream(aws, tmp_path):
    """A new CloudWatch log stream of this test's own: (logs client, its group's ARN, the stream's
    name, ``put(messages)`` that writes lines to it now)."""
    logs, group, stream = aws.client("logs"), f"/mpi-magic-tests/{tmp_path.name}", "leader"
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)

    def put(messages: list[str]) -> None:
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=group, logStreamName=stream,
                            logEvents=[{"timestamp": now, "message": m} for m in messages])

    arn = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"][0]["logGroupArn"]
    return logs, arn, stream, put


def test_the_rehearsal_clouds_live_tail_streams_only_new_lines_and_samples_a_flood_as_aws_does(aws, tmp_path):
    from botocore.config import Config

    from mpi_magic.backends.sagemaker.livetail import live_tail_client

    logs, arn, stream, put = _log_stream(aws, tmp_path)
    put(["stored before the session"])
    client = live_tail_client(aws.session.Session(), logs, Config())
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.start_live_tail(logGroupIdentifiers=[arn + "-none"])
    reply = client.start_live_tail(logGroupIdentifiers=[arn], logStreamNames=[stream])["responseStream"]
    items = iter(reply)
    assert "sessionStart" in next(items)
    put(["one", "two"])
    updates, flooded = [], False
    for item in items:
        updates.append(item["sessionUpdate"])
        if not flooded and [r["message"] for u in updates for r in u["sessionResults"]] == ["one", "two"]:
            put([f"flood {i}" for i in range(1200)])
            flooded = True
        if updates[-1]["sessionMetadata"]["sampled"] or len(updates) > 15:
            break
    reply.close()
    sampled = updates[-1]
    assert sampled["sessionMetadata"]["sampled"], "more than 500 lines in a second are sampled"
    sample = [int(r["message"].split()[1]) for r in sampled["sessionResults"]]
    assert len(sample) == 500 and sample == sorted(set(sample)), "500 of them, in order"
    earlier = [r["message"] for u in updates[:-1] for r in u["sessionResults"]]
    assert earlier == ["one", "two"], "each new line once, none stored before the session began"


def test_closing_a_live_tail_session_ends_it_without_waiting_for_the_next_update(aws, tmp_path):
    """The watch loop closes its session when the job ends: the read in progress, which holds the
    connection until the next update (a second on), must not hold the loop or the session as long."""
    from botocore.config import Config

    from mpi_magic.backends.sagemaker.livetail import LiveTail, live_tail_client
    from mpi_magic.testing.moto_live_tail import UPDATE_EVERY

    logs, arn, stream, put = _log_stream(aws, tmp_path)
    live = LiveTail(live_tail_client(aws.session.Session(), logs, Config()), arn, stream)
    try:
        assert wait_until(lambda: live.started, 10), "the session started"
        put(["a line"])
        deadline = time.monotonic() + 10
        while not live.take() and time.monotonic() < deadline:  # watched closely: an update came just now
            time.sleep(0.01)
        updated = time.monotonic()
    finally:
        live.close()
    closed = time.monotonic()
    live._thread.join(10)
    assert not live._thread.is_alive() and live.ended == "closed"
    assert closed - updated < UPDATE_EVERY / 2, f"close() took {closed - updated:.2f}s"
    assert time.monotonic() - updated < UPDATE_EVERY, "the session ended before its next update"


def _watched_jobs(monkeypatch) -> list:
    """Every SageMakerJob made from now on in this test."""
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob

    made, init = [], SageMakerJob.__init__

    def remembered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(SageMakerJob, "__init__", remembered)
    return made


def _numbered_lines(lead_in: int, lines: int) -> str:
    """A cell that reports progress for ``lead_in`` tenths of a second, then prints 0 .. lines-1."""
    return ("import time, mpi_magic\n"
            f"for step in mpi_magic.progress(range({lead_in})):\n"
            "    time.sleep(0.1)\n"
            f"for i in range({lines}):\n"
            "    print(i)\n"
            "me = mpi_magic.rank()\n")


def test_a_job_follows_its_log_through_live_tail_every_line_once_and_in_order(ip, cloud, monkeypatch):
    watched = _watched_jobs(monkeypatch)
    run(ip, "-i 2 -g 2 --gather --out job --quiet", _numbered_lines(60, 0) + "for i in range(30):\n"
         "    print(i)\n    time.sleep(0.1)\n")
    job, [sagemaker_job] = ip.user_ns["job"], watched
    assert job.status == "completed" and ip.user_ns["me"] == [0, 1, 2, 3]
    for rank in range(4):
        assert job.logs(rank).split() == [str(i) for i in range(30)]
    assert [(s.n, s.total) for s in job.ranks] == [(60, 60)] * 4
    assert sagemaker_job.calls["StartLiveTail"] == 1 and sagemaker_job.live_endings == ["closed"]
    assert sagemaker_job.lines_from["Live Tail"] > 0, "lines came through the session"


def test_lines_written_while_live_tail_starts_slowly_come_first_and_once(ip, cloud, monkeypatch):
    """StartLiveTail answers 3 s late (a slow connection, injected on the client): the lines written
    meanwhile come only from a read, which may wait for the job's call budget; the stream's lines wait
    for that read, so every line still shows once and in order."""
    from mpi_magic.backends.sagemaker import training_job

    def slow_live_tail_client(*args):
        client = live_tail_client(*args)
        client.meta.events.register("before-send.cloudwatch-logs.StartLiveTail", lambda **_: time.sleep(3.0))
        return client

    live_tail_client = training_job.live_tail_client
    monkeypatch.setattr(training_job, "live_tail_client", slow_live_tail_client)
    watched = _watched_jobs(monkeypatch)
    run(ip, "-i 2 -g 2 --out job --quiet", "import time\nfor i in range(80):\n    print(i)\n    time.sleep(0.1)\n")
    job, [sagemaker_job] = ip.user_ns["job"], watched
    assert job.status == "completed"
    for rank in range(4):
        assert job.logs(rank).split() == [str(i) for i in range(80)]
    assert sagemaker_job.live_endings == ["closed"] and sagemaker_job.lines_from["Live Tail"] > 0


@pytest.mark.parametrize("case", ["refused", "sampled"])
def test_a_refused_or_sampled_live_tail_leaves_the_log_to_reads_with_every_line_once_and_in_order(
        ip, cloud, monkeypatch, local_aws_env, case):
    from mpi_magic.testing.moto_live_tail import refuse_live_tail

    watched = _watched_jobs(monkeypatch)
    endpoint = local_aws_env["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"]
    lines = 30 if case == "refused" else 2000  # 8,000 lines in about a second: more than Live Tail's 500
    if case == "refused":
        refuse_live_tail(endpoint, "AccessDeniedException")  # a role without logs:StartLiveTail
    try:
        run(ip, "-i 2 -g 2 --gather --out job --quiet", _numbered_lines(60, lines))
    finally:
        refused = refuse_live_tail(endpoint, None)
    job, [sagemaker_job] = ip.user_ns["job"], watched
    assert job.status == "completed" and ip.user_ns["me"] == [0, 1, 2, 3]
    for rank in range(4):
        assert job.logs(rank).split() == [str(i) for i in range(lines)]
    if case == "refused":
        assert refused >= 1 and sagemaker_job.calls["StartLiveTail"] == 1, "refused once, not asked again"
        assert "AccessDenied" in sagemaker_job.live_endings[0] and not sagemaker_job.lines_from["Live Tail"]
    else:
        assert "sampled" in sagemaker_job.live_endings[0] and sagemaker_job.lines_from["Live Tail"] > 0


def test_results_fetched_twice_at_once_into_one_folder_arrive_whole(aws, prefix, tmp_path):
    """Two watchers of one job (its own --async follower and %mpirun_attach) may fetch its results together."""
    from mpi_magic.backends.sagemaker.training_job import fetch_each

    s3, body = aws.client("s3"), bytes(range(256)) * 16384  # 4 MiB
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/rank-0.bin", Body=body)
    path = str(tmp_path / "results" / "rank-0.bin")
    fetch_each(s3, [(f"s3://{BUCKET}/{prefix}/rank-0.bin", path)] * 8)
    with open(path, "rb") as f:
        assert f.read() == body
    assert os.listdir(tmp_path / "results") == ["rank-0.bin"]


def test_the_ledger_passes_each_line_on_once_whichever_reader_brings_it_first():
    from mpi_magic.backends.sagemaker.livetail import READ_AHEAD_KEPT, Ledger

    now = [0.0]
    ledger = Ledger(clock=lambda: now[0])
    a, b, c, d = (1, "a"), (2, "b"), (3, "c"), (4, "d")
    assert ledger.first_live(a) and not ledger.first_read(a, live=True), "Live Tail first, the read's copy dropped"
    assert ledger.first_read(b, live=True) and not ledger.first_live(b), "the read first, Live Tail's copy dropped"
    assert ledger.first_live(a) and ledger.first_live(a), "one line written twice in one millisecond shows twice"
    assert not ledger.first_read(a, live=True) and not ledger.first_read(a, live=True)
    assert ledger.first_read(a, live=True), "and a third copy is new"
    assert ledger.first_read(c, live=False) and ledger.first_live(c), "read before any session: none brings it again, so it is not kept"
    assert ledger.first_read(d, live=True)
    now[0] = READ_AHEAD_KEPT + 1  # Live Tail never brought it (sampled away, or before the session began)
    assert ledger.first_live(d), "a read line is waited for only so long"
