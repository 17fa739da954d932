"""Sessions on SageMaker over real HTTP: unchanged boto3 against a moto server (S3, CloudWatch
Logs) and mpi_magic's SageMaker emulator, which runs the session's training job until it is
stopped or ends itself. One server of each for the module (``local_aws_env``); each test keeps
to its own S3 prefix and its own jobs."""

from __future__ import annotations

import _thread
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import BUCKET, ROLE, once, run
from IPython.core.error import UsageError

import mpi_magic
from mpi_magic import events, payload, s3channel, wire
from mpi_magic.backends.sagemaker.pricing import PRICES
from mpi_magic.cost import dollars
from mpi_magic.errors import RemoteRankError

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


@pytest.fixture
def settings(tmp_path) -> dict[str, str]:
    """The MPI_MAGIC_* settings of this test's sessions (its own S3 prefix), small safeguard limits."""
    return {"MPI_MAGIC_BACKEND": "sagemaker", "MPI_MAGIC_INSTANCE_TYPE": "ml.m5.xlarge",
            "MPI_MAGIC_IMAGE_URI": "local/emulated", "MPI_MAGIC_ROLE": ROLE,
            "MPI_MAGIC_S3_ROOT": f"s3://{BUCKET}/jobs/{tmp_path.name}", "MPI_MAGIC_HEARTBEAT": "1",
            "MPI_MAGIC_HEARTBEAT_LIMIT": "60"}


@pytest.fixture
def sessions(sessions, aws, settings, monkeypatch):
    """The shell on the rehearsal cloud, with whatever session a test starts stopped at its end."""
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return sessions


def start(ip, line: str):
    ip.run_line_magic("mpirun_session", f"start {line} --out s --quiet")
    return ip.user_ns["s"]


def described(aws, job_name: str) -> dict:
    return aws.client("sagemaker").describe_training_job(TrainingJobName=job_name)


def leader_log(aws, job_name: str) -> list[str]:
    logs = aws.client("logs")
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/algo-1-")
    name = streams["logStreams"][0]["logStreamName"]
    lines, token = [], None
    while True:
        reply = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=name,
                                    **({"nextToken": token} if token else {"startFromHead": True}))
        lines += [e["message"] for e in reply["events"]]
        if not reply["events"] or reply["nextForwardToken"] == token:
            return lines
        token = reply["nextForwardToken"]


def job_story(aws, job_name: str) -> str:
    """What a job went through, for a failing assertion: its status, transitions and each stream's last lines."""
    job = described(aws, job_name)
    lines = [f"{job['TrainingJobStatus']} {job.get('FailureReason', '')}"]
    lines += [f"  {t['Status']}: {t.get('StatusMessage', '')}" for t in job["SecondaryStatusTransitions"]]
    logs = aws.client("logs")
    for stream in logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=job_name)["logStreams"]:
        reply = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream["logStreamName"], startFromHead=False)
        lines += [f"{stream['logStreamName']}:"] + [f"  {e['message'].rstrip()}" for e in reply["events"][-30:]]
    return "\n".join(lines)


def wait_until(check, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_4x2_session_keeps_state_sends_a_value_once_and_stop_ends_in_stopped(sessions, aws, capsys):
    ip = sessions
    s = start(ip, "-i 4 -g 2")
    assert (s.status, s.world_size, s.backend, s.job_name) == ("idle", 8, "sagemaker", s.name)
    assert described(aws, s.job_name)["TrainingJobStatus"] == "InProgress"
    pids = {r.pid for r in s.ranks}
    run(ip, "--quiet", "import mpi_magic, os\ncounter = 10 * mpi_magic.rank()")
    ip.user_ns["weights"] = np.arange(200_000, dtype=np.float64)  # 1.6 MB
    run(ip, "--quiet", "counter += 1\nfirst = float(weights.sum())")
    sent = s.bytes_sent
    run(ip, "--quiet --gather", "seen = (counter, float(weights[-1]), os.getpid(), os.environ['SAGEMAKER_BASE_DIR'][-6:])")
    assert ip.user_ns["seen"] == [(10 * r + 1, 199_999.0, ip.user_ns["seen"][r][2], f"algo-{r // 2 + 1}")
                                  for r in range(8)]
    assert {seen[2] for seen in ip.user_ns["seen"]} == pids, "the same processes ran every cell"
    assert ip.user_ns["first"] == float(ip.user_ns["weights"].sum())
    assert s.bytes_sent == sent and s.cells == 3
    s3 = aws.client("s3")
    prefix = s3channel.session_uri(f"jobs/{s.job_name}")  # under this test's s3_root
    sizes = {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in
             s3.list_objects_v2(Bucket=BUCKET, Prefix=os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1])["Contents"]
             if "/payloads/" in o["Key"]}
    assert sizes["00000002.bin"] > 1_600_000 > sizes["00000003.bin"], "the weights crossed S3 once"
    assert prefix  # the layout's owner names it

    with pytest.raises(UsageError, match=f"this cell asks for --instance-type ml.g5.xlarge, but session {s.name} runs"):
        run(ip, "--instance-type ml.g5.xlarge", "x = 1")  # its job has its instances already
    run(ip, "--quiet --instance-type ml.m5.xlarge", "same_type = 1")  # the session's own: fine

    capsys.readouterr()
    ip.run_line_magic("mpirun_session", "")
    shown = capsys.readouterr().out
    assert f"session {s.name}: sagemaker, 4 x 2 = 8 ranks, idle" in shown
    assert f"training job: {s.job_name}, InProgress (Training)" in shown
    assert "ranks alive: 8/8, cells run: 4, idle for:" in shown
    # the instance time billed so far, at the shipped table's price (rounded to the second shown)
    billed = re.search(r"billable instance time: (\d+)s \(4 x ml.m5.xlarge\), about (\S+)", shown)
    hourly = PRICES[aws.session.Session().region_name]["ml.m5.xlarge"]
    assert billed and billed[2] in {dollars(hourly * (int(billed[1]) + d) / 3600) for d in (-1, 0, 1)}
    run(ip, "--quiet --out job", "y = 1")  # a short cell's view starts from what has been billed so far
    assert ip.user_ns["job"].model.billable_seconds() >= int(billed[1])
    ip.run_line_magic("mpirun_session", "stop")
    shown = capsys.readouterr().out
    assert "stopped: 5 cells run" in shown and f"training job: {s.job_name}, Stopped" in shown
    assert s.status == "stopped" and described(aws, s.job_name)["TrainingJobStatus"] == "Stopped"


def test_failures_interrupts_and_a_cell_not_signed_by_the_notebook(sessions, aws, tmp_path, capsys):
    ip = sessions
    s = start(ip, "-i 2 -g 1")
    run(ip, "--quiet", "import mpi_magic\nkept = 'state'")
    with pytest.raises(RemoteRankError) as raised:
        run(ip, "--quiet", "if mpi_magic.rank() == 1:\n    raise ValueError('bad input on 1')\nother = 1")
    assert raised.value.failures[0].rank == 1 and "bad input on 1" in str(raised.value)
    assert s.status == "idle", "a failure every rank got back from keeps the session"

    # Someone who may write to the bucket puts the next cell there, signed by a key of their own.
    marker = tmp_path / "forged-cell-ran"
    forged = tmp_path / "forged"
    forged.mkdir()
    digest = payload.write(str(forged / payload.PAYLOAD_FILE), [],
                           {"source": f"open({str(marker)!r}, 'w').write('ran')\n", "returns": [], "gather": False,
                            "display": False})
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    uri = s3channel.session_uri(f"s3://{BUCKET}/{root}/{s.job_name}")
    intruder = s3channel.NotebookEnd(aws.client("s3"), uri, s.job_name, s3channel.Signer())
    assert digest
    intruder.send_cell(3, str(forged / payload.PAYLOAD_FILE))
    assert wait_until(lambda: any("refused" in line for line in leader_log(aws, s.job_name)), 20)
    refusal = [line for line in leader_log(aws, s.job_name) if "refused" in line]
    assert f"refused {s3channel.message_uri(uri, 3)}: not signed by the notebook's key; it was not run" in refusal[0]
    run(ip, "--quiet --out job", "third = kept")  # the notebook's own cell 3 takes the place of the forged one
    assert ip.user_ns["third"] == "state" and not marker.exists()
    shown = s.said_between_cells() + ip.user_ns["job"].logs(0).splitlines()  # read before the cell, or with it
    assert any("not signed by the notebook's key; it was not run" in line for line in shown)

    with once(lambda: s.status == "running", _thread.interrupt_main, pause=2), pytest.raises(KeyboardInterrupt):
        run(ip, "--quiet", "import time\ncaught = True\nif mpi_magic.rank() == 1:  # rank 0 is back at once\n"
                           "    caught = False\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n"
                           "        caught = True\n        raise")
    assert s.status == "idle" and described(aws, s.job_name)["TrainingJobStatus"] == "InProgress"
    assert "interrupted on every rank; session" in capsys.readouterr().err
    run(ip, "--quiet --gather", "back = (kept, caught)")
    assert ip.user_ns["back"] == [("state", True)] * 2

    with pytest.raises(mpi_magic.MpiMagicError):
        run(ip, "--quiet", "import os\nif mpi_magic.rank() == 1:\n    os._exit(3)\nimport time\ntime.sleep(30)")
    assert s.status == "stopped" and s.ended_reason
    assert described(aws, s.job_name)["TrainingJobStatus"] == "Failed"


def test_an_idle_session_ends_itself(sessions, aws):
    ip = sessions
    s = start(ip, "-i 1 -g 2 --idle-timeout 2")
    assert wait_until(lambda: s.status == "stopped", 40)
    assert "idle for 2s (--idle-timeout)" in s.ended_reason
    assert described(aws, s.job_name)["TrainingJobStatus"] == "Completed"


def test_attach_from_a_fresh_process_then_heartbeat_loss_ends_the_job(aws, settings, local_aws_env, tmp_path):
    env = {**os.environ, **local_aws_env, **settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache"),
           "MPI_MAGIC_HEARTBEAT_LIMIT": "8"}
    shell = ("from IPython.core.interactiveshell import InteractiveShell\n"
             "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n")
    first = shell + (
        "ip.run_line_magic('mpirun_session', 'start -i 2 -g 1 --detach --out s --quiet')\n"
        "ip.run_cell_magic('mpirun_remote', '--quiet', 'import mpi_magic\\nx = 40 + mpi_magic.rank()')\n"
        "print('JOB', ip.user_ns['s'].job_name, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    job_name = out.stdout.split("JOB ")[1].split()[0]
    assert described(aws, job_name)["TrainingJobStatus"] == "InProgress", "--detach: the job outlived its kernel"
    second = shell + (
        "import os, signal\n"
        f"ip.run_line_magic('mpirun_session', 'attach {job_name} --out s --quiet')\n"
        "ip.run_cell_magic('mpirun_remote', '--quiet --gather', 'y = x + 1')\n"
        "print('RESULT', ip.user_ns['y'], ip.user_ns['s'].cells, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"  # the kernel dies: no atexit, no more heartbeats
    )
    out = subprocess.run([sys.executable, "-c", second], capture_output=True, text=True, env=env, timeout=120)
    assert "RESULT [41, 42] 2" in out.stdout, out.stdout + out.stderr
    assert out.returncode == -signal.SIGKILL
    assert wait_until(lambda: described(aws, job_name)["TrainingJobStatus"] != "InProgress", 40)
    assert described(aws, job_name)["TrainingJobStatus"] == "Completed"
    decoder = events.StreamDecoder(described(aws, job_name)["Environment"][wire.TOKEN_VARIABLE])
    closing = [e for line in leader_log(aws, job_name) for e in decoder.feed(line)
               if isinstance(e, events.SessionClosing)]
    assert "the notebook's heartbeat stopped: not refreshed for 8s" in closing[0].reason


def test_a_kernel_that_exits_cleanly_stops_its_session_at_once(aws, settings, local_aws_env, tmp_path):
    env = {**os.environ, **local_aws_env, **settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")}
    script = ("from IPython.core.interactiveshell import InteractiveShell\n"
              "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
              "ip.run_line_magic('mpirun_session', 'start -i 1 -g 1 --out s --quiet')\n"
              "print('JOB', ip.user_ns['s'].job_name, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    job_name = out.stdout.split("JOB ")[1].split()[0]
    assert described(aws, job_name)["TrainingJobStatus"] in ("Stopping", "Stopped"), "StopTrainingJob at exit"
    assert wait_until(lambda: described(aws, job_name)["TrainingJobStatus"] == "Stopped", 30)


def test_what_cannot_start_or_be_taken_over_is_one_sentence(sessions, aws, monkeypatch):
    ip = sessions
    monkeypatch.setenv("MPI_MAGIC_HEARTBEAT_LIMIT", "1")
    with pytest.raises(mpi_magic.MpiMagicError, match=r"heartbeat_limit \(1s\) must be longer than heartbeat \(1s\)"):
        ip.run_line_magic("mpirun_session", "start -i 1 -g 1")
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=root), "nothing uploaded"
    with pytest.raises(mpi_magic.MpiMagicError, match="no training job 'no-such-session'") as refused:
        ip.run_line_magic("mpirun_session", "attach no-such-session")
    assert "\n" not in str(refused.value)


def test_a_spot_interruption_ends_the_session_and_says_why(sessions, aws, local_aws_env):
    from mpi_magic.testing.sagemaker_emulator import interrupt

    ip = sessions
    s = start(ip, "-i 2 -g 1 --spot")
    run(ip, "--quiet", "kept = 1")
    reclaim = lambda: interrupt(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], s.job_name)  # noqa: E731
    with once(lambda: s.status == "running", reclaim, pause=1), pytest.raises(mpi_magic.MpiMagicError) as raised:
        run(ip, "--quiet", "import time\ntime.sleep(60)")
    assert f"session {s.name} ended: spot interruption: SageMaker replaced its instances" in str(raised.value)
    assert s.status == "stopped" and described(aws, s.job_name)["TrainingJobStatus"] == "Stopped"


def test_two_notebooks_never_both_hold_a_session_the_later_claim_wins(aws, tmp_path):
    uri, job = f"s3://{BUCKET}/jobs/{tmp_path.name}/session", "held-job"
    signer = s3channel.Signer()
    first = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)
    first.beat()
    time.sleep(0.01)
    later = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)  # %mpirun_session attach
    first.beat()  # the first one may beat once more before the later one's first beat
    later.beat()
    with pytest.raises(s3channel.TakenOver, match=f"another notebook took session {job} over"):
        first.beat()
    with pytest.raises(s3channel.TakenOver):
        first.check_held()  # as before sending a cell
    later.beat()
    later.check_held()


def test_ranks_started_again_never_run_a_cell_sent_before(aws, tmp_path):
    """After a restart, rank 0 waits for the cell after the last one the notebook sent."""
    uri, job = f"s3://{BUCKET}/jobs/{tmp_path.name}/session", "spot-job"
    (tmp_path / payload.PAYLOAD_FILE).write_bytes(b"payload")
    signer = s3channel.Signer()
    notebook = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)
    for cell in (1, 2):
        notebook.send_cell(cell, str(tmp_path / payload.PAYLOAD_FILE))
    rank0 = s3channel.RankEnd(uri, signer.public_text, None, job)
    rank0.skip_cells_sent()
    assert rank0.receive(timeout=0.5) is None
    notebook.send_cell(3, str(tmp_path / payload.PAYLOAD_FILE))
    assert rank0.receive(timeout=5)["cell"] == 3


def test_a_notebook_another_took_the_session_from_lets_go_and_an_interrupted_attach_stops_nothing(
        sessions, aws, settings, local_aws_env, cache_dir, monkeypatch):
    from mpi_magic.backends.sagemaker.session import SageMakerSessionRanks

    ip = sessions
    s = start(ip, "-i 1 -g 2")
    run(ip, "--quiet", "kept = 1")
    other = ("from IPython.core.interactiveshell import InteractiveShell\n"
             "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
             f"ip.run_line_magic('mpirun_session', 'attach {s.job_name} --detach --quiet')\n"
             "ip.run_cell_magic('mpirun_remote', '--quiet --gather', 'seen = kept + 1')\n"
             "print('RESULT', ip.user_ns['seen'], flush=True)\n")
    env = {**os.environ, **local_aws_env, **settings, "MPI_MAGIC_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, env=env, timeout=120)
    assert "RESULT [2, 2]" in out.stdout, out.stdout + out.stderr
    assert wait_until(lambda: s.status == "stopped", 10), "the next heartbeat finds the later claim"
    assert s.ended_sentence().startswith(f"session {s.name} is not this notebook's any more: another notebook took "
                                         f"session {s.job_name} over")
    assert described(aws, s.job_name)["TrainingJobStatus"] == "InProgress"

    with monkeypatch.context() as holding, once(lambda: True, _thread.interrupt_main, pause=1), \
            pytest.raises(KeyboardInterrupt):
        holding.setattr(SageMakerSessionRanks, "connect", lambda self: False)  # the attach waits for rank 0
        ip.run_line_magic("mpirun_session", f"attach {s.job_name} --quiet")
    assert described(aws, s.job_name)["TrainingJobStatus"] == "InProgress", "giving up an attach stops nothing"
    ip.run_line_magic("mpirun_session", f"attach {s.job_name} --out s --quiet")
    run(ip, "--quiet --gather", "again = kept")
    assert ip.user_ns["again"] == [1, 1]


def test_a_session_job_started_again_runs_no_cell_sent_before(aws, settings, local_aws_env, tmp_path):
    from mpi_magic.testing.sagemaker_emulator import interrupt

    env = {**os.environ, **local_aws_env, **settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")}
    notebook = ("from IPython.core.interactiveshell import InteractiveShell\n"
                "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
                "ip.run_line_magic('mpirun_session', 'start -i 1 -g 2 --spot --detach --out s --quiet')\n"
                "ip.run_cell_magic('mpirun_remote', '--quiet', 'print(\"the first cell ran\", flush=True)')\n"
                "print('JOB', ip.user_ns['s'].job_name, flush=True)\n")  # then it exits, and its job runs on
    out = subprocess.run([sys.executable, "-c", notebook], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    job_name = out.stdout.split("JOB ")[1].split()[0]
    try:
        interrupt(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], job_name)
        logs = aws.client("logs")
        token = described(aws, job_name)["Environment"][wire.TOKEN_VARIABLE]

        def second_attempt() -> list[events.Event]:
            streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/algo-1-")
            if len(streams["logStreams"]) < 2:
                return []
            decoder = events.StreamDecoder(token)
            reply = logs.get_log_events(logGroupName=LOG_GROUP, startFromHead=True,
                                        logStreamName=streams["logStreams"][-1]["logStreamName"])
            return [e for item in reply["events"] for e in decoder.feed(item["message"])]

        assert wait_until(lambda: len([e for e in second_attempt() if isinstance(e, events.RankReady)]) == 2, 60), \
            job_story(aws, job_name)
        time.sleep(2)  # rank 0 looks for the next cell ten times a second: cell 1 would have run by now
        seen = second_attempt()
        assert sorted((e.rank, e.cell) for e in seen if isinstance(e, events.RankReady)) == [(0, 0), (1, 0)]
        assert not [e for e in seen if isinstance(e, (events.RankFinished, events.Output))], "no cell ran again"
    finally:
        aws.client("sagemaker").stop_training_job(TrainingJobName=job_name)
        assert wait_until(lambda: described(aws, job_name)["TrainingJobStatus"] == "Stopped", 30), \
            job_story(aws, job_name)
