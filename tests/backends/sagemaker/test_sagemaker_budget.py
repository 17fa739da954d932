"""Budgets on the rehearsal cloud (moto and the SageMaker emulator, over real HTTP): a job or a
session whose cost at list price reaches --max-cost stops with a sentence and leaves its training
job Stopped; %mpirun_jobs warns of what still runs and
what it has cost. One server of each for the module; each test keeps to its own S3 prefix and jobs.

ml.m5.xlarge lists at $0.23 an instance-hour in us-east-1, so two instances spend $0.0005 in
about four seconds of training, and $0.004 in about 31 (a session's start, slower on a loaded
machine, included)."""

from __future__ import annotations

import re

import pytest
from helpers import BUCKET, ROLE, described, run, start_session, training_jobs, wait_until
from IPython.core.error import UsageError

import mpi_magic


def test_a_job_that_reaches_its_budget_is_stopped_with_a_sentence(ip, cloud):
    with pytest.raises(mpi_magic.JobError) as caught:
        run(ip, "-i 2 -g 1 --max-cost 0.0005 --out job", "import time\ntime.sleep(120)\n")
    job = ip.user_ns["job"]
    said = str(caught.value)
    assert re.fullmatch(rf"job {job.name}: its cost reached --max-cost \$0\.0005 \(about \$0\.000\d+ at list price\); "
                        r"all 2 ranks were stopped \(raise --max-cost to let it run longer\)", said), said
    assert job.status == "stopped" and job.model.stop_reason == "budget"
    assert described(cloud, job.name)["TrainingJobStatus"] == "Stopped"


def test_a_session_that_reaches_its_budget_ends_itself(cloud_sessions, aws, capsys):
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 1 --max-cost 0.004")  # about 31 s of training, the start included
    run(ip, "--quiet", "x = 1\n")  # a cell runs within it
    assert wait_until(lambda: s.model.cost() is not None, 20), "the meter's first figure (DescribeTrainingJob)"
    capsys.readouterr()
    ip.run_line_magic("mpirun_session", "")
    assert re.search(r", spent: about \$0\.00\d+ of --max-cost \$0\.004", capsys.readouterr().out)
    assert wait_until(lambda: s.status == "stopped", 120), "idle, it still costs: the budget ends it"
    assert re.fullmatch(r"its cost reached --max-cost \$0\.004 \(about \$0\.004\d* at list price\)",
                        s.ended_reason), s.ended_reason
    assert wait_until(lambda: described(aws, s.job_name)["TrainingJobStatus"] == "Stopped", 30)


def test_mpirun_jobs_warns_of_a_job_still_running_and_what_it_has_cost(ip, cloud, capsys):
    run(ip, "-i 2 -g 1 --async --quiet --out job", "import time\ntime.sleep(120)\n")
    job = ip.user_ns["job"]
    try:
        assert wait_until(lambda: job.model.billing is not None, 60), "training began"
        capsys.readouterr()
        ip.run_line_magic("mpirun_jobs", "")
        listed = capsys.readouterr().out
    finally:
        job.cancel()
        with pytest.raises(mpi_magic.JobError, match="cancelled"):
            job.wait()
    assert re.search(rf"^warning: job {job.name} still runs, about \$0\.0\d+ so far at list price "
                     rf"\(2 x ml\.m5\.xlarge\); %mpirun_attach {job.name} follows it \(an interrupt there stops it\)$",
                     listed, re.MULTILINE), listed
    capsys.readouterr()
    ip.run_line_magic("mpirun_jobs", "")
    assert "warning" not in capsys.readouterr().out, "a stopped job is not warned of"


def test_a_budget_where_the_meter_knows_no_price_is_refused_before_anything_starts(ip, cloud, cache_dir):
    jobs = set(training_jobs(cloud))
    with pytest.raises(UsageError) as caught:
        run(ip, "-g 1 --max-cost 5 --instance-type ml.c5.xlarge", "x = 1\n")
    assert str(caught.value) == ("--max-cost $5.00 cannot be kept: mpi_magic's price table has no list price for "
                                 "ml.c5.xlarge in us-east-1; drop it")
    ip.run_line_magic("mpirun_config", "max_cost=5 instance_type=ml.c5.xlarge")
    with pytest.raises(UsageError) as caught:
        run(ip, "-g 1", "x = 1\n")
    assert str(caught.value) == ("the max_cost setting ($5.00) cannot be kept: mpi_magic's price table has no list "
                                 "price for ml.c5.xlarge in us-east-1; unset it with %mpirun_config max_cost=")
    assert set(training_jobs(cloud)) == jobs, "nothing was created"


def test_the_budget_caps_the_jobs_runtime_so_sagemaker_stops_it_when_the_notebook_is_gone(ip, cloud, local_aws_env,
                                                                                          tmp_path, capsys):
    import json
    import os
    import subprocess
    import sys

    # two ml.m5.xlarge at $0.23 an instance-hour spend $0.0002 in 1.6 s: the job may train 2 s, and 30 s more
    ip.run_cell_magic("mpirun_remote", "-i 2 -g 1 --max-cost 0.0002 --dry-run", "x = 1\n")
    printed = capsys.readouterr().out
    request = json.loads(printed[printed.index("{"):printed.index("\nS3 objects:")])
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 2 + 30}
    # a kernel killed while its job runs: SageMaker itself stops the job at that runtime
    script = ("import os\nfrom IPython.core.interactiveshell import InteractiveShell\n"
              "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
              "ip.run_cell_magic('mpirun_remote', '-i 2 -g 1 --max-cost 0.0002 --async --quiet --out job',\n"
              "                  'import time\\ntime.sleep(300)\\n')\n"
              "print(ip.user_ns['job'].name, flush=True)\nos._exit(9)\n")
    settings = {"MPI_MAGIC_BACKEND": "sagemaker", "MPI_MAGIC_INSTANCE_TYPE": "ml.m5.xlarge",
                "MPI_MAGIC_IMAGE_URI": "local/emulated", "MPI_MAGIC_ROLE": ROLE,
                "MPI_MAGIC_S3_ROOT": f"s3://{BUCKET}/jobs/{tmp_path.name}", "MPI_MAGIC_CACHE_DIR": str(tmp_path / "k")}
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **local_aws_env, **settings})
    name = killed.stdout.strip()
    assert killed.returncode == 9 and name, killed.stdout + killed.stderr
    assert wait_until(lambda: described(cloud, name)["TrainingJobStatus"] == "Stopped", 90), described(cloud, name)
    assert described(cloud, name)["BillableTimeInSeconds"] <= 2 + 30 + 5
