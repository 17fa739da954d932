"""The SageMaker backend over real HTTP: unchanged boto3 against a moto server (S3, CloudWatch
Logs) and mpi_magic's SageMaker emulator, which really runs every simulated instance.

The tests share one server of each (``local_aws_env``); each keeps to its own S3 prefix and
its own job names, so none sees another's files or jobs. How a job is watched (faults, the
log's pace, Live Tail, a spot restart) is in ``test_sagemaker_watch``; what the settings and an
instance type make of a job in ``test_sagemaker_instances``."""

from __future__ import annotations

import io
import re
import sys

import pytest
from helpers import BUCKET, ROLE, once, run, uploaded, wait_until

import mpi_magic


def test_ranks_spread_over_every_instance_with_their_own_results(ip, cloud, prefix):
    run(ip, "-i 4 -g 2 --gather --out job", (
        "import os, mpi_magic\n"
        "where = (mpi_magic.rank(), mpi_magic.instance(), int(os.environ['OMPI_COMM_WORLD_LOCAL_RANK']),\n"
        "         os.path.basename(os.environ['SAGEMAKER_BASE_DIR']))\n"
        "for step in mpi_magic.progress(range(5)):\n"
        "    pass\n"
    ))
    where = ip.user_ns["where"]
    assert where == [(r, r // 2, r % 2, f"algo-{r // 2 + 1}") for r in range(8)]
    job = ip.user_ns["job"]
    assert job.status == "completed" and job.backend == "sagemaker"
    assert [(s.n, s.total) for s in job.ranks] == [(5, 5)] * 8, "every rank's progress, read from CloudWatch"
    keys = [key for key in uploaded(cloud, prefix) if key.startswith(f"{prefix}/{job.name}/results/")]
    assert sorted(keys) == sorted(f"{prefix}/{job.name}/results/rank-{r}.bin" for r in range(8))
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    assert described["TrainingJobStatus"] == "Completed" and described["ResourceConfig"]["InstanceCount"] == 4


def test_a_failing_rank_fails_the_job_with_its_traceback_and_releases_every_instance(ip, cloud, capsys,
                                                                                     monkeypatch):
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-i 2 -g 2 --out job", (
            "import mpi_magic, time\n"
            "from mpi4py import MPI\n"
            "shard = [mpi_magic.rank()] * 3\n"
            "if mpi_magic.rank() == 3:\n"
            "    raise ValueError('bad shard')\n"
            "MPI.COMM_WORLD.barrier()\n"
        ))
    assert (caught.value.rank, caught.value.instance, caught.value.error_type) == (3, 1, "ValueError")
    assert "raise ValueError('bad shard')" in "\n".join(caught.value._render_traceback_())
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=ip.user_ns["job"].name)
    assert described["TrainingJobStatus"] == "Failed"
    assert "rank 3 raised ValueError: bad shard" in described["FailureReason"]
    # its frames came back through S3, for the debugger in the notebook
    monkeypatch.setattr(sys, "stdin", io.StringIO("p shard\nq\n"))
    capsys.readouterr()
    ip.run_line_magic("mpirun_debug", "")
    assert "[3, 3, 3]" in capsys.readouterr().out


def test_a_function_from_an_earlier_cell_shows_that_cell_and_its_lines_from_an_instance(ip, cloud, capsys):
    assert ip.run_cell("import warnings\ndef shard_of(rank):\n    warnings.warn(f'rank {rank} reads slowly')\n"
                       "    return [1, 2, 3][rank]\n", store_history=True).success
    cell_name = f"Cell In[{ip.execution_count - 1}]"
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-i 2 -g 2", "import mpi_magic\nshard = shard_of(mpi_magic.rank())\n")
    assert f"  Cell In[{ip.execution_count}], line 3, in <module>\n    shard = shard_of(mpi_magic.rank())\n" \
           in caught.value.remote_traceback, "the running cell's frame too"
    assert f"  {cell_name}, line 4, in shard_of\n    return [1, 2, 3][rank]\n" in caught.value.remote_traceback
    said = capsys.readouterr().err  # (rank 3, the one that fails, warned before it raised)
    assert f"[rank 3] {cell_name}:3: UserWarning: rank 3 reads slowly\n" \
           "[rank 3]   warnings.warn(f'rank {rank} reads slowly')\n" in said, said


def test_quiet_ranks_on_every_instance_send_their_stacks_through_the_log_as_the_roll_call(ip, cloud, capsys):
    import _thread

    ip.run_line_magic("mpirun_config", "stall_after=2 view=text")
    def answered() -> bool:  # the ranks' answers come one by one, as the log brings them
        job = ip.user_ns.get("job")
        return bool(job and job.model.roll_call and "no answer" not in job.model.roll_call)

    with once(answered, _thread.interrupt_main, limit=90), pytest.raises(KeyboardInterrupt):
        run(ip, "-i 2 -g 2 --out job", (
            "from mpi4py import MPI\n"       # 2
            "import time\n"                  # 3
            "comm = MPI.COMM_WORLD\n"        # 4
            "if comm.rank == 2:\n"           # 5
            "    time.sleep(120)\n"          # 6
            "else:\n"                        # 7
            "    comm.allreduce(1)\n"        # 8
        ))
    job = ip.user_ns["job"]
    where = "ranks 0, 1, 3 at cell line 8 in allreduce; rank 2 at cell line 6 in sleep"
    assert job.model.roll_call == where, "every rank, instance 1's through mpirun, answered with its frames"
    assert f"where the ranks were: {where}" in capsys.readouterr().err, "the summary keeps it"
    assert job.status == "stopped"


def test_mpirun_stacks_asks_a_background_jobs_ranks_through_s3_and_they_answer_through_the_log(ip, cloud, capsys):
    ip.run_line_magic("mpirun_config", "stall_after=600")  # only when asked
    run(ip, "-i 2 -g 1 --async --quiet --out job", (
        "import mpi_magic, time\n"            # 2
        "if mpi_magic.rank() == 1:\n"         # 3
        "    time.sleep(120)\n"               # 4
        "else:\n"                             # 5
        "    while True:\n"                   # 6
        "        time.sleep(0.05)\n"          # 7
    ))
    job = ip.user_ns["job"]
    try:
        assert wait_until(lambda: all(r.status == "running" for r in job.ranks), 60)
        capsys.readouterr()
        ip.run_line_magic("mpirun_stacks", "")
        shown = capsys.readouterr().out
    finally:
        job.cancel()
        with pytest.raises(Exception, match="cancelled"):
            job.wait()
    assert "  rank 0 at cell line 7 in sleep\n  rank 1 at cell line 4 in sleep\n" in shown


def test_instances_refuse_a_payload_changed_after_submission(ip, cloud, monkeypatch):
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob

    create = SageMakerJob.create

    def tamper_then_create(self, request):
        s3 = cloud.client("s3")
        key = request["InputDataConfig"][1]["DataSource"]["S3DataSource"]["S3Uri"].split(BUCKET + "/")[1] + "payload.bin"
        body = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        body[-1] ^= 0xFF
        s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
        create(self, request)

    monkeypatch.setattr(SageMakerJob, "create", tamper_then_create)
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        run(ip, "-i 2 -g 1", "x = 1\n")
    assert caught.value.error_type == "PayloadError"
    assert "does not match the digest it was submitted with" in caught.value.message


def test_every_rank_on_every_instance_gets_the_jobs_environment(ip, cloud):
    run(ip, "-i 3 -g 1 --gather --env STAGE=eval --env SEED=7", "import os\nseen = (os.environ['STAGE'], os.environ['SEED'])\n")
    assert ip.user_ns["seen"] == [("eval", "7")] * 3


def test_requirements_are_installed_on_every_instance_first(ip, cloud, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install; pip still runs it on every instance\n")
    run(ip, f"-i 2 -g 1 --out job --requirements {requirements}", "x = 1\n")
    logs = cloud.client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    streams = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix=ip.user_ns["job"].name)["logStreams"]
    assert len(streams) == 2
    for stream in streams:
        lines = [e["message"] for e in logs.get_log_events(logGroupName=group, logStreamName=stream["logStreamName"],
                                                            startFromHead=True)["events"]]
        assert "mpi_magic bootstrap: installing requirements.txt" in lines, stream["logStreamName"]


def test_async_returns_at_once_and_the_results_arrive_when_the_job_ends(ip, cloud):
    run(ip, "-i 2 -g 1 --async --out job", "import time\ntime.sleep(3)\nvalue = 42\n")
    job = ip.user_ns["job"]
    assert "value" not in ip.user_ns and not job.done, "the cell returned before the job ended"
    job.wait(timeout=120)
    assert job.status == "completed" and ip.user_ns["value"] == 42


def test_attach_from_a_fresh_shell_rebuilds_the_dashboard_and_brings_the_results(ip, cloud, tmp_path):
    import subprocess
    import sys

    run(ip, "-i 2 -g 1 --gather --async --out job", (
        "import time, mpi_magic\n"
        "for i in mpi_magic.progress(range(4)):\n"
        "    time.sleep(0.5)\n"
        "where = mpi_magic.instance()\n"
    ))
    name = ip.user_ns["job"].name
    script = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'mpi_magic')\n"
        "ip.run_line_magic('mpirun_jobs', '')\n"
        f"ip.run_line_magic('mpirun_attach', '{name} --out attached')\n"
        "job = ip.user_ns['attached']\n"
        "print('RESULT', ip.user_ns['where'], job.status, [(r.n, r.total) for r in job.ranks])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert f"{name}" in out.stdout.splitlines()[0], out.stdout + out.stderr  # %mpirun_jobs lists it
    assert "RESULT [0, 1] completed [(4, 4), (4, 4)]" in out.stdout, out.stdout + out.stderr
    ip.user_ns["job"].wait(timeout=120)


def test_the_summary_shows_sagemakers_failure_reason_and_billable_time(ip, cloud, capsys):
    with pytest.raises(mpi_magic.RemoteRankError):
        run(ip, "-i 2 -g 1", "raise RuntimeError('boom')\n")
    summary = capsys.readouterr().err
    assert "SageMaker FailureReason: AlgorithmError: rank " in summary and "raised RuntimeError: boom" in summary
    assert re.search(r"failed [^\n]*, billable [^\n]* of instance time, (about \$|cost unknown)", summary)


def test_instances_refuse_code_changed_after_submission(ip, cloud, monkeypatch):
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob

    create = SageMakerJob.create

    def tamper_then_create(self, request):
        s3 = cloud.client("s3")
        code = request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"].split(BUCKET + "/")[1]
        s3.put_object(Bucket=BUCKET, Key=code + "bootstrap.py", Body=b"print('not what was submitted')\n")
        create(self, request)

    monkeypatch.setattr(SageMakerJob, "create", tamper_then_create)
    with pytest.raises(mpi_magic.RankExitError):
        run(ip, "-i 2 -g 1 --out job", "x = 1\n")
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=ip.user_ns["job"].name)
    assert described["TrainingJobStatus"] == "Failed"
    assert "bootstrap.py does not match the digest pinned when the job was submitted" in described["FailureReason"]


def test_a_sagemaker_job_reopens_in_a_new_python_from_the_folder_its_kernel_kept(ip, cloud, cache_dir):
    from helpers import job_facts, reopened_facts

    run(ip, "-i 2 -g 1 --out job", (
        "import mpi_magic\n"
        "for step in mpi_magic.progress(range(3)):\n"
        "    mpi_magic.log(loss=1.0 / (step + 1))\n"
        "print('on', mpi_magic.instance())\n"
    ))
    job = ip.user_ns["job"]
    seen = job_facts(job)
    assert seen["status"] == "completed" and "billable" in seen["summary"]
    assert seen["metrics"]["1"]["loss"][-1] == [2, 1 / 3] and seen["logs"]["1"] == "on 1\n"
    assert reopened_facts(cache_dir, job.name) == seen


def test_an_exported_sagemaker_job_is_created_followed_and_collected_from_bash(ip, cloud, cache_dir, tmp_path,
                                                                             monkeypatch):
    import json
    import os
    import pickle
    import subprocess

    (tmp_path / "notebook").mkdir()
    (tmp_path / "notebook" / "requirements.txt").write_text("# nothing to install; pip still runs it\n")
    monkeypatch.chdir(tmp_path / "notebook")  # the notebook's folder, which --requirements is relative to
    ip.user_ns["base"] = 10
    run(ip, "-i 2 -g 1 --gather --out job --requirements requirements.txt", (
        "import mpi_magic\n"
        "where = (mpi_magic.rank(), mpi_magic.instance(), base)\n"
        "print('rank', mpi_magic.rank())\n"
    ))
    folder = tmp_path / "exported"
    ip.run_line_magic("mpirun_export", f"--to {folder}")
    launch = (folder / "launch.txt").read_text()
    request = json.loads(launch[launch.index("{"):launch.index("\nS3 objects:")])
    assert request["ResourceConfig"]["InstanceCount"] == 2 and request["RoleArn"] == ROLE
    assert (folder / "requirements.txt").read_text() == "# nothing to install; pip still runs it\n"
    assert json.loads((folder / "export.json").read_text())["options"]["settings"]["requirements"] == "requirements.txt"
    (tmp_path / "elsewhere").mkdir()
    done = subprocess.run(["bash", str(folder / "run.sh")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path / "elsewhere",
                          env={**os.environ, "PYTHON": sys.executable, "MPI_MAGIC_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] rank 0", "[rank 1] rank 1"]
    with open(folder / "results.pickle", "rb") as f:
        assert pickle.load(f) == {"where": ip.user_ns["where"]}
    name = re.search(r"job (export-\S+) \(sagemaker, 2 x 1\) completed", done.stderr)
    assert name, done.stderr
    assert cloud.client("sagemaker").describe_training_job(TrainingJobName=name[1])["TrainingJobStatus"] == "Completed"
