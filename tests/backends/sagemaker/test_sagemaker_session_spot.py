"""Sessions on SageMaker whose instances go: a spot interruption ends the session and says why,
and the job SageMaker starts again runs no cell sent before. Unchanged boto3 against a moto server
and mpi_magic's SageMaker emulator, one of each for the module (``local_aws_env``); each test keeps
to its own S3 prefix and its own jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers import LOG_GROUP, described, job_story, once, run, start_session, wait_until

import mpi_magic
from mpi_magic.shared import events, wire
from mpi_magic.shared import envvars


def test_a_spot_interruption_ends_the_session_and_says_why(cloud_sessions, aws, local_aws_env):
    from mpi_magic.testing.sagemaker_emulator import interrupt

    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 1 --spot")
    run(ip, "--quiet", "kept = 1")
    reclaim = lambda: interrupt(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], s.job_name)  # noqa: E731
    with once(lambda: s.status == "running", reclaim, pause=1), pytest.raises(mpi_magic.MpiMagicError) as raised:
        run(ip, "--quiet", "import time\ntime.sleep(60)")
    assert f"session {s.name} ended: spot interruption: the job's instances were replaced" in str(raised.value)
    assert s.status == "stopped" and described(aws, s.job_name)["TrainingJobStatus"] == "Stopped"


def test_a_session_job_started_again_runs_no_cell_sent_before(aws, cloud_settings, local_aws_env, tmp_path):
    from mpi_magic.testing.sagemaker_emulator import interrupt

    env = {**os.environ, **local_aws_env, **cloud_settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")}
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
        token = described(aws, job_name)["Environment"][envvars.EVENT_TOKEN]

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
