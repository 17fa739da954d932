"""Sessions on SageMaker that lose or regain their notebook: a fresh process attaches and the
kernel dies, another notebook takes the session over (the instances' faults are in
``test_sagemaker_session_spot``).
Unchanged boto3 against a moto server and mpi_magic's SageMaker emulator, one of each for the
module (``local_aws_env``); each test keeps to its own S3 prefix and its own jobs."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys

import pytest
from helpers import described, leader_log, once, run, start_session, wait_until

from mpi_magic.shared import events, wire
from mpi_magic.shared import envvars


def test_attach_from_a_fresh_process_then_heartbeat_loss_ends_the_job(aws, cloud_settings, local_aws_env, tmp_path):
    env = {**os.environ, **local_aws_env, **cloud_settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache"),
           "MPI_MAGIC_HEARTBEAT_LIMIT": "30"}  # above what the second process takes to attach, loaded
    shell = ("from IPython.core.interactiveshell import InteractiveShell\n"
             "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n")
    # the second process starts now and waits for the job's name: it attaches as soon as the first has exited
    second = subprocess.Popen([sys.executable, "-c", shell + (
        "import os, signal, boto3\n"
        "job_name = input()\n"
        "ip.run_line_magic('mpirun_session', f'attach {job_name} --out s --quiet')\n"
        "ip.run_cell_magic('mpirun_remote', '--quiet --gather', 'y = x + 1')\n"
        "print('RESULT', ip.user_ns['y'], ip.user_ns['s'].cells, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"  # the kernel dies: no atexit, no more heartbeats
    )], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = shell + (
            "ip.run_line_magic('mpirun_session', 'start -i 2 -g 1 --detach --out s --quiet')\n"
            "ip.run_cell_magic('mpirun_remote', '--quiet', 'import mpi_magic\\nx = 40 + mpi_magic.rank()')\n"
            "print('JOB', ip.user_ns['s'].job_name, flush=True)\n"
        )
        out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        job_name = out.stdout.split("JOB ")[1].split()[0]
        assert described(aws, job_name)["TrainingJobStatus"] == "InProgress", "--detach: the job outlived its kernel"
        stdout, stderr = second.communicate(job_name + "\n", timeout=120)
    finally:
        second.kill()
        second.wait()
    assert "RESULT [41, 42] 2" in stdout, stdout + stderr
    assert second.returncode == -signal.SIGKILL
    assert wait_until(lambda: described(aws, job_name)["TrainingJobStatus"] != "InProgress", 60)
    assert described(aws, job_name)["TrainingJobStatus"] == "Completed"
    decoder = events.StreamDecoder(described(aws, job_name)["Environment"][envvars.EVENT_TOKEN])
    closing = [e for line in leader_log(aws, job_name) for e in decoder.feed(line)
               if isinstance(e, events.SessionClosing)]
    assert "the notebook's heartbeat stopped: not refreshed for 30s" in closing[0].reason


def test_a_notebook_another_took_the_session_from_lets_go_and_an_interrupted_attach_stops_nothing(
        cloud_sessions, aws, cloud_settings, local_aws_env, cache_dir, monkeypatch):
    from mpi_magic.backends.sagemaker.session_ranks import SageMakerSessionRanks

    ip = cloud_sessions
    s = start_session(ip, "-i 1 -g 2")
    run(ip, "--quiet", "kept = 1")
    other = ("from IPython.core.interactiveshell import InteractiveShell\n"
             "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
             f"ip.run_line_magic('mpirun_session', 'attach {s.job_name} --detach --quiet')\n"
             "ip.run_cell_magic('mpirun_remote', '--quiet --gather', 'seen = kept + 1')\n"
             "print('RESULT', ip.user_ns['seen'], flush=True)\n")
    env = {**os.environ, **local_aws_env, **cloud_settings, "MPI_MAGIC_CACHE_DIR": cache_dir}
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
