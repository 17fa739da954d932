"""SageMaker jobs on test hosts (``mpi_magic.testing.hosts``) meeting the faults real clusters have:
an instance lost mid-cell, an instance cut off from the others, a session that loses an instance.
The emulator does each to one instance's host (``instance_fault``). Unchanged boto3 against a moto
server and mpi_magic's SageMaker emulator, one of each for the module (``local_aws_env``); each
test keeps to its own S3 prefix and its own jobs."""

from __future__ import annotations

import time

import psutil
import pytest
from helpers import BUSY_CELL, described, job_story, needs_hosts, once, once_running, run, start_session, wait_until

import mpi_magic
from mpi_magic.backends.sagemaker.bootstrap import ALL_RELAYED, UNREACHABLE
from mpi_magic.testing.sagemaker_emulator import LOG_GROUP, instance_fault

pytestmark = needs_hosts()



def _fault(local_aws_env, job_name: str, host: str, fault: str) -> float:
    """Do ``fault`` to ``host`` of the job now; when it was done (time.monotonic)."""
    instance_fault(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], job_name, host, fault)
    return time.monotonic()


def _leader_said(cloud, job_name: str) -> list[str]:
    """The bootstrap's own lines in the leader's (algo-1's) log."""
    logs = cloud.client("logs")
    stream = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/algo-1-")["logStreams"][0]
    events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream["logStreamName"], startFromHead=True)
    return [event["message"].rstrip() for event in events["events"] if event["message"].startswith(ALL_RELAYED[:20])]


def _left_running(pids) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(("fault", "within", "what"), [("kill", 10, "lost"), ("cut", 30, "cut off")])
def test_an_instance_lost_or_cut_off_mid_cell_ends_the_cell_naming_it_fails_the_job_and_leaves_nothing(
        ip, cloud, local_aws_env, fault, within, what):
    done = {}
    strike = lambda: done.update(at=_fault(local_aws_env, ip.user_ns["job"].name, "algo-2", fault))  # noqa: E731
    with once_running(ip, strike), pytest.raises(mpi_magic.MpiMagicError) as raised:
        run(ip, "-i 2 -g 2 --out job", BUSY_CELL)
    ended_after = time.monotonic() - done["at"]
    job = ip.user_ns["job"]
    assert ended_after < within, f"the cell ended {ended_after:.1f}s after algo-2 was {what}"
    assert "algo-2" in str(raised.value) and job.status != "completed"
    sagemaker = described(cloud, job.name)
    assert sagemaker["TrainingJobStatus"] == "Failed", job_story(cloud, job.name)
    assert "instance algo-2 stopped" in sagemaker["FailureReason"], job_story(cloud, job.name)
    if fault == "cut":  # (a lost one may fail the job as the leader's last try to release it ends)
        said = _leader_said(cloud, job.name)  # the instance first: a reader that stops at ALL_RELAYED has it
        lost = UNREACHABLE + "instance algo-2 stopped answering algo-1 (lost, or cut off)"
        assert lost in said and ALL_RELAYED in said and said.index(lost) < said.index(ALL_RELAYED), said
    # every rank ended with the job, those cut off with algo-2 too
    assert wait_until(lambda: _left_running(r.pid for r in job.ranks) == [], 10)


def test_a_lost_leader_fails_the_job_naming_it_and_its_workers_end_by_themselves(ip, cloud, local_aws_env):
    """algo-1 dies mid-cell: the emulator notices, as SageMaker notices a lost instance, and fails the job;
    algo-2, whose leader stopped answering, would end by itself after LEADER_SILENCE."""
    done = {}
    strike = lambda: done.update(at=_fault(local_aws_env, ip.user_ns["job"].name, "algo-1", "lose"))  # noqa: E731
    with once_running(ip, strike), pytest.raises(mpi_magic.MpiMagicError) as raised:
        run(ip, "-i 2 -g 2 --out job", BUSY_CELL)
    ended_after = time.monotonic() - done["at"]
    job = ip.user_ns["job"]
    # (about 35 s: the emulator gives the workers VANISHED_GRACE to say why first, then the notebook's
    # watch, which reads the job's state less often while its log is quiet, takes up to 18 s to see it)
    assert ended_after < 45, f"the cell ended {ended_after:.1f}s after algo-1 was lost"
    assert "algo-1" in str(raised.value) and job.status != "completed"
    sagemaker = described(cloud, job.name)
    assert sagemaker["TrainingJobStatus"] == "Failed", job_story(cloud, job.name)
    # the service's reason, or algo-2's, had it given up on its leader first (it ends by itself then)
    assert "instance algo-1 stopped" in sagemaker["FailureReason"], job_story(cloud, job.name)
    assert wait_until(lambda: _left_running(r.pid for r in job.ranks) == [], 10)


def test_a_session_that_loses_an_instance_under_a_cell_ends_with_a_sentence_naming_it(cloud_sessions, aws,
                                                                                      local_aws_env):
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 2")
    pids = [rank.pid for rank in s.ranks]
    lose = lambda: _fault(local_aws_env, s.job_name, "algo-2", "kill")  # noqa: E731
    with once(lambda: s.status == "running", lose, pause=1), pytest.raises(mpi_magic.MpiMagicError) as raised:
        run(ip, "--quiet", BUSY_CELL)
    assert (f"session {s.name} ended: instance algo-2 stopped answering algo-1 (lost, or cut off); every rank "
            "was stopped") in str(raised.value)
    sagemaker = described(aws, s.job_name)
    assert sagemaker["TrainingJobStatus"] == "Failed" and "algo-2" in sagemaker["FailureReason"]
    assert wait_until(lambda: _left_running(pids) == [], 10)


def test_a_session_that_loses_an_instance_between_cells_says_so_at_the_next_cell(cloud_sessions, aws, local_aws_env,
                                                                                 capsys):
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 2")
    run(ip, "--quiet", "kept = 1")
    pids = [rank.pid for rank in s.ranks]
    _fault(local_aws_env, s.job_name, "algo-2", "kill")
    assert wait_until(lambda: s.status == "stopped", 20), job_story(aws, s.job_name)
    capsys.readouterr()
    run(ip, "-i 1 -g 2 --quiet", "kept = 2")  # (as a one-off job)
    said = capsys.readouterr()
    assert (f"session {s.name} ended (instance algo-2 stopped answering algo-1 (lost, or cut off)); this cell "
            "runs as a one-off job") in said.out + said.err
    assert ip.user_ns["kept"] == 2
    assert described(aws, s.job_name)["TrainingJobStatus"] == "Failed"
    assert wait_until(lambda: _left_running(pids) == [], 10)
