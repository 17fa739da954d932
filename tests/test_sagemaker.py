"""The SageMaker backend over real HTTP: unchanged boto3 against a moto server (S3, CloudWatch
Logs) and mpi_magic's SageMaker emulator, which really runs every simulated instance.

The tests share one server of each (``local_aws_env``); each keeps to its own S3 prefix and
its own job names, so none sees another's files or jobs."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from helpers import BUCKET, ROLE, once_running

import mpi_magic


@pytest.fixture
def prefix(tmp_path) -> str:
    """This test's own folder in the shared bucket."""
    return f"jobs/{tmp_path.name}"


@pytest.fixture
def cloud(ip, aws, prefix):
    ip.run_line_magic("mpirun_config", f"backend=sagemaker instance_type=ml.m5.xlarge image_uri=local/emulated "
                                       f"role={ROLE} s3_root=s3://{BUCKET}/{prefix}")
    return aws


def _uploaded(aws, prefix: str) -> list[str]:
    return [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])]


def _training_jobs(aws) -> list[str]:
    pages = aws.client("sagemaker").get_paginator("list_training_jobs").paginate()
    return [job["TrainingJobName"] for page in pages for job in page["TrainingJobSummaries"]]


def _run(ip, line: str, cell: str):
    return ip.run_cell_magic("mpirun_remote", line, cell)


def test_ranks_spread_over_every_instance_with_their_own_results(ip, cloud, prefix):
    _run(ip, "-i 4 -g 2 --gather --out job", (
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
    keys = [key for key in _uploaded(cloud, prefix) if key.startswith(f"{prefix}/{job.name}/results/")]
    assert sorted(keys) == sorted(f"{prefix}/{job.name}/results/rank-{r}.bin" for r in range(8))
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    assert described["TrainingJobStatus"] == "Completed" and described["ResourceConfig"]["InstanceCount"] == 4


def test_a_failing_rank_fails_the_job_with_its_traceback_and_releases_every_instance(ip, cloud):
    with pytest.raises(mpi_magic.RemoteRankError) as caught:
        _run(ip, "-i 2 -g 2 --out job", (
            "import mpi_magic, time\n"
            "from mpi4py import MPI\n"
            "if mpi_magic.rank() == 3:\n"
            "    raise ValueError('bad shard')\n"
            "MPI.COMM_WORLD.barrier()\n"
        ))
    assert (caught.value.rank, caught.value.instance, caught.value.error_type) == (3, 1, "ValueError")
    assert "raise ValueError('bad shard')" in "\n".join(caught.value._render_traceback_())
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=ip.user_ns["job"].name)
    assert described["TrainingJobStatus"] == "Failed"
    assert "rank 3 raised ValueError: bad shard" in described["FailureReason"]


def test_interrupt_stops_the_training_job(ip, cloud, capsys):
    import _thread

    with once_running(ip, _thread.interrupt_main, pause=0.1), pytest.raises(KeyboardInterrupt):
        _run(ip, "-i 2 -g 1 --out job", "import time\ntime.sleep(120)\n")
    job = ip.user_ns["job"]
    assert job.status == "stopped"
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    assert described["TrainingJobStatus"] == "Stopped"
    assert "StopTrainingJob" in capsys.readouterr().err


def test_instances_refuse_a_payload_changed_after_submission(ip, cloud, monkeypatch):
    from mpi_magic.backends.sagemaker.job import SageMakerJob

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
        _run(ip, "-i 2 -g 1", "x = 1\n")
    assert caught.value.error_type == "PayloadError"
    assert "does not match the digest it was submitted with" in caught.value.message


def test_dry_run_prints_the_request_and_starts_nothing(ip, cloud, prefix, capsys):
    jobs_before = _training_jobs(cloud)
    _run(ip, "-i 4 -g 2 --dry-run --job-name dry-1 --tags team=ml", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    assert request["TrainingJobName"] == "dry-1" and request["ResourceConfig"]["InstanceCount"] == 4
    assert request["Environment"]["MPI_MAGIC_PROCS_PER_INSTANCE"] == "2"
    assert request["Tags"] == [{"Key": "team", "Value": "ml"}]
    assert f"s3://{BUCKET}/{prefix}/dry-1/payload/payload.bin" in out
    assert _uploaded(cloud, prefix) == []
    assert _training_jobs(cloud) == jobs_before


@pytest.mark.parametrize(("setting", "message"), [
    ("role=", "pass --role arn:aws:iam::ACCOUNT:role/NAME"),
    ("role=my-role", "'my-role' is not an IAM role ARN"),
    ("instance_type=ml.p4dd.24xlarge", "did you mean ml.p4d.24xlarge?"),
    ("s3_root=s3://no-such-bucket/x", "the bucket 'no-such-bucket' of --s3-root cannot be used"),
])
def test_bad_cloud_settings_are_one_sentence_before_anything_is_uploaded(ip, cloud, prefix, setting, message):
    ip.run_line_magic("mpirun_config", setting)
    with pytest.raises(mpi_magic.MpiMagicError, match=message) as caught:
        _run(ip, "", "x = 1\n")
    assert "\n" not in str(caught.value)
    assert _uploaded(cloud, prefix) == []


def test_checkpoint_s3_maps_sagemakers_checkpoint_channel_and_a_bad_one_is_one_sentence(ip, cloud, prefix, capsys):
    _run(ip, f"-i 2 -g 1 --spot --checkpoint-s3 s3://{BUCKET}/{prefix}/ck/ --dry-run", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    assert request["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/{prefix}/ck", "LocalPath": "/opt/ml/checkpoints"}
    assert request["Environment"]["MPI_MAGIC_CHECKPOINT_S3"] == f"s3://{BUCKET}/{prefix}/ck"
    for uri, message in (("ck/x", "--checkpoint-s3: 'ck/x' is not an s3:// address"),
                         ("s3://no-such-bucket/ck", "the bucket 'no-such-bucket' of --checkpoint-s3 cannot be used")):
        with pytest.raises(mpi_magic.MpiMagicError, match=message) as caught:
            _run(ip, f"-i 2 -g 1 --checkpoint-s3 {uri}", "x = 1\n")
        assert "\n" not in str(caught.value)
    assert _uploaded(cloud, prefix) == []


def test_the_default_image_is_the_sdks_pytorch_training_image_for_this_python(ip, cloud, capsys):
    import sys

    ip.run_line_magic("mpirun_config", "image_uri=")
    _run(ip, "-i 2 -g 1 --dry-run", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert image.startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:")
    assert f"-py3{sys.version_info[1]}" in image


def test_missing_region_and_credentials_are_named(ip, cloud, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(mpi_magic.MpiMagicError, match="no AWS region: pass --region"):
        _run(ip, "", "x = 1\n")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(mpi_magic.MpiMagicError, match="no AWS credentials found"):
        _run(ip, "", "x = 1\n")


def test_more_processes_than_gpus_is_a_warning(ip, cloud, capsys):
    ip.run_line_magic("mpirun_config", "instance_type=ml.g5.xlarge")
    _run(ip, "-g 2 --dry-run", "x = 1\n")
    assert "ml.g5.xlarge has 1 GPU but --gpus asks for 2 processes per instance" in capsys.readouterr().err


def test_every_rank_on_every_instance_gets_the_jobs_environment(ip, cloud):
    _run(ip, "-i 3 -g 1 --gather --env STAGE=eval --env SEED=7", "import os\nseen = (os.environ['STAGE'], os.environ['SEED'])\n")
    assert ip.user_ns["seen"] == [("eval", "7")] * 3


def test_requirements_are_installed_on_every_instance_first(ip, cloud, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install; pip still runs it on every instance\n")
    _run(ip, f"-i 2 -g 1 --out job --requirements {requirements}", "x = 1\n")
    logs = cloud.client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    streams = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix=ip.user_ns["job"].name)["logStreams"]
    assert len(streams) == 2
    for stream in streams:
        lines = [e["message"] for e in logs.get_log_events(logGroupName=group, logStreamName=stream["logStreamName"],
                                                            startFromHead=True)["events"]]
        assert "mpi_magic bootstrap: installing requirements.txt" in lines, stream["logStreamName"]


def test_the_request_is_valid_for_botocores_service_model():
    from mpi_magic.backends.sagemaker.request import CloudSettings, training_job_request, validate

    settings = CloudSettings("us-west-2", ROLE, "img", "ml.p4d.24xlarge", "s3://b/p", spot=True, keep_alive=600,
                             subnets=("subnet-1",), security_groups=("sg-1",), kms_key="key", tags={"a": "b"})
    validate(training_job_request(settings, "job-1", 4, 8, "d" * 64, {"A": "1"}))


def test_async_returns_at_once_and_the_results_arrive_when_the_job_ends(ip, cloud):
    started = time.monotonic()
    _run(ip, "-i 2 -g 1 --async --out job", "import time\ntime.sleep(3)\nvalue = 42\n")
    assert time.monotonic() - started < 3, "the cell returned before the job ended"
    job = ip.user_ns["job"]
    assert "value" not in ip.user_ns and not job.done
    job.wait(timeout=120)
    assert job.status == "completed" and ip.user_ns["value"] == 42


def test_attach_from_a_fresh_shell_rebuilds_the_dashboard_and_brings_the_results(ip, cloud, tmp_path):
    import subprocess
    import sys

    _run(ip, "-i 2 -g 1 --gather --async --out job", (
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


def test_an_image_for_another_python_is_refused_before_submitting(ip, cloud, prefix):
    import sys

    other = sys.version_info[1] - 1
    ip.run_line_magic("mpirun_config", "image_uri=763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                                       f"pytorch-training:2.1.0-gpu-py3{other}-cu121-ubuntu20.04-sagemaker")
    with pytest.raises(mpi_magic.MpiMagicError,
                       match=rf"runs Python 3\.{other} but this notebook runs Python 3\.{sys.version_info[1]}"):
        _run(ip, "", "x = 1\n")
    assert _uploaded(cloud, prefix) == []


def test_without_boto3_the_extra_to_install_is_named(ip, monkeypatch, cache_dir):
    import sys

    from IPython.core.error import UsageError

    monkeypatch.setitem(sys.modules, "boto3", None)  # what an install without the extra looks like
    with pytest.raises(UsageError, match=r"pip install 'mpi-magic\[sagemaker\]'"):
        _run(ip, "--backend sagemaker", "x = 1\n")


def test_the_summary_shows_sagemakers_failure_reason_and_billable_time(ip, cloud, capsys):
    with pytest.raises(mpi_magic.RemoteRankError):
        _run(ip, "-i 2 -g 1", "raise RuntimeError('boom')\n")
    summary = capsys.readouterr().err
    assert "SageMaker FailureReason: AlgorithmError: rank " in summary and "raised RuntimeError: boom" in summary
    assert re.search(r"failed [^\n]*, billable [^\n]* of instance time, (about \$|cost unknown)", summary)


def test_instances_refuse_code_changed_after_submission(ip, cloud, monkeypatch):
    from mpi_magic.backends.sagemaker.job import SageMakerJob

    create = SageMakerJob.create

    def tamper_then_create(self, request):
        s3 = cloud.client("s3")
        code = request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"].split(BUCKET + "/")[1]
        s3.put_object(Bucket=BUCKET, Key=code + "bootstrap.py", Body=b"print('not what was submitted')\n")
        create(self, request)

    monkeypatch.setattr(SageMakerJob, "create", tamper_then_create)
    with pytest.raises(mpi_magic.RankExitError):
        _run(ip, "-i 2 -g 1 --out job", "x = 1\n")
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=ip.user_ns["job"].name)
    assert described["TrainingJobStatus"] == "Failed"
    assert "bootstrap.py does not match the digest pinned when the job was submitted" in described["FailureReason"]


@pytest.mark.parametrize(("version_text", "launch"), [
    ("mpirun.real (OpenRTE) 4.1.7\n\nReport bugs to", ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_no_tree_spawn",
                                                      "1", "--allow-run-as-root"]),
    ("mpirun (Open MPI) 5.0.6\n", ["--prtemca", "plm_ssh_agent", "ssh", "--prtemca", "plm_ssh_no_tree_spawn", "1"]),
])
def test_bootstrap_speaks_open_mpi_4_behind_the_images_wrapper_and_5(tmp_path, monkeypatch, version_text, launch):
    """Only `mpirun --version` is stood in for (a script printing what each version prints)."""
    from mpi_magic.backends.sagemaker import bootstrap

    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\nprintf '{version_text}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MPI_MAGIC_ENV_NAMES", "STAGE")
    monkeypatch.setenv("STAGE", "eval")
    monkeypatch.setenv("MPI_MAGIC_MPIRUN_ARGS", "--mca btl_tcp_if_include eth0")
    argv = bootstrap.mpirun_argv(str(fake), "ssh", "/hosts", 16)
    assert argv[:6] == [str(fake), "--hostfile", "/hosts", "-np", "16", "--tag-output"]
    assert argv[6:6 + len(launch)] == launch
    rest = argv[6 + len(launch):]
    assert rest[:5] == ["--bind-to", "none", "--mca", "btl_tcp_if_include", "eth0"]
    assert ["-x", "STAGE"] == rest[rest.index("STAGE") - 1:rest.index("STAGE") + 1]


def test_defaults_come_from_the_sagemaker_sdks_config_file(ip, cloud, tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\n"
        "SageMaker:\n"
        "  TrainingJob:\n"
        "    RoleArn: arn:aws:iam::123456789012:role/from-sdk-config\n"
        "    Tags:\n"
        "      - Key: team\n"
        "        Value: research\n"
    )
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    ip.run_line_magic("mpirun_config", "role=")
    _run(ip, "-i 2 -g 1 --dry-run", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    assert request["RoleArn"] == "arn:aws:iam::123456789012:role/from-sdk-config"
    assert request["Tags"] == [{"Key": "team", "Value": "research"}]


def _version_stand_in(tmp_path, version_text: str) -> str:
    """An `mpirun` that only prints a version: all `mpirun_argv` asks of it."""
    stand_in = tmp_path / "mpirun"
    stand_in.write_text(f"#!/bin/sh\nprintf '{version_text}'\n")
    stand_in.chmod(0o755)
    return str(stand_in)


@pytest.mark.parametrize(("version_text", "daemons"), [
    ("mpirun.real (OpenRTE) 4.1.7\n", ["--mca", "oob_tcp_if_include", "eth0"]),
    ("mpirun (Open MPI) 5.0.6\n", ["--prtemca", "prte_if_include", "eth0"]),
])
def test_mpirun_keeps_to_the_network_sagemaker_names(tmp_path, monkeypatch, version_text, daemons):
    """As the SageMaker SDK's mpirun: MPI traffic, the daemons' channel and NCCL on network_interface_name."""
    from mpi_magic.backends.sagemaker import bootstrap

    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("MPI_MAGIC_MPIRUN_ARGS", raising=False)
    argv = bootstrap.mpirun_argv(_version_stand_in(tmp_path, version_text), "ssh", "/hosts", 16, "eth0")
    joined = " ".join(argv)
    assert "--mca btl_tcp_if_include eth0 " + " ".join(daemons) in joined
    assert argv[argv.index("NCCL_SOCKET_IFNAME=eth0") - 1] == "-x"

    # the job's own choices win: --env NCCL_SOCKET_IFNAME, and an interface set in --mpirun-args
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ens5")
    monkeypatch.setenv("MPI_MAGIC_MPIRUN_ARGS", f"{daemons[0]} {daemons[1]} ens5 --mca btl_tcp_if_include ens5")
    argv = bootstrap.mpirun_argv(_version_stand_in(tmp_path, version_text), "ssh", "/hosts", 16, "eth0")
    assert "eth0" not in argv and "NCCL_SOCKET_IFNAME=eth0" not in argv
    assert argv.count("btl_tcp_if_include") == 1 and argv.count(daemons[1]) == 1
    assert argv[argv.index("NCCL_SOCKET_IFNAME") - 1] == "-x"  # forwarded as the job set it

    # an exclude is the job's choice too (Open MPI refuses an include beside it), in --mpirun-args or the environment
    monkeypatch.setenv("MPI_MAGIC_MPIRUN_ARGS", "--mca btl_tcp_if_exclude docker0")
    monkeypatch.setenv("OMPI_MCA_oob_tcp_if_exclude" if daemons[1].startswith("oob") else "PRTE_MCA_prte_if_exclude",
                       "docker0")
    argv = bootstrap.mpirun_argv(_version_stand_in(tmp_path, version_text), "ssh", "/hosts", 16, "eth0")
    assert "btl_tcp_if_include" not in argv and daemons[1] not in argv


def test_ranks_on_every_instance_use_the_network_sagemaker_names(ip, cloud):
    from mpi_magic.testing.sagemaker_emulator import network_interface

    _run(ip, "-i 2 -g 2 --gather --out job", "import os\nnic = os.environ.get('NCCL_SOCKET_IFNAME')\n")
    interface = network_interface()
    assert ip.user_ns["nic"] == [interface] * 4
    logs = cloud.client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    stream = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix=ip.user_ns["job"].name + "/algo-1-")
    lines = [e["message"] for e in logs.get_log_events(logGroupName=group, startFromHead=True,
                                                        logStreamName=stream["logStreams"][0]["logStreamName"])["events"]]
    launch = next(line for line in lines if line.startswith("mpi_magic bootstrap: running mpirun"))
    assert f"--mca btl_tcp_if_include {interface} --prtemca prte_if_include {interface}" in launch


@pytest.mark.parametrize(("instance_type", "env", "expected"), [
    ("ml.p4d.24xlarge", {}, {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple", "FI_EFA_USE_DEVICE_RDMA": "1"}),
    ("ml.g5.48xlarge", {}, {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}),  # EFA without RDMA, as the SDK has it
    ("ml.g5.12xlarge", {}, {}),
    ("ml.m5.xlarge", {}, {}),
    ("ml.p5.48xlarge", {"NCCL_PROTO": "LL128", "FI_PROVIDER": "tcp"},
     {"FI_PROVIDER": "tcp", "NCCL_PROTO": "LL128", "FI_EFA_USE_DEVICE_RDMA": "1"}),
])
def test_efa_instance_types_get_what_nccl_and_libfabric_need_and_the_cells_env_wins(instance_type, env, expected):
    from mpi_magic.backends.sagemaker.request import CloudSettings, training_job_request

    settings = CloudSettings("us-east-1", ROLE, "img", instance_type, "s3://b/p")
    environment = training_job_request(settings, "job-1", 2, 8, "d" * 64, env)["Environment"]
    fabric = {k: v for k, v in environment.items() if k.startswith(("FI_", "NCCL_"))}
    assert fabric == expected


def test_efa_variables_reach_every_rank_and_the_cells_env_wins_there_too(ip, cloud):
    ip.run_line_magic("mpirun_config", "instance_type=ml.p4d.24xlarge")
    _run(ip, "-i 2 -g 1 --gather --env NCCL_PROTO=LL", (
        "import os\n"
        "fabric = {k: v for k, v in os.environ.items() if k.startswith(('FI_', 'NCCL_PROTO'))}\n"
    ))
    assert ip.user_ns["fabric"] == [{"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_PROTO": "LL"}] * 2


def test_the_gpu_table_agrees_with_the_sagemaker_sdks_and_counts_the_current_training_types():
    """The SDK's instance_gpu_info (per region) wherever it has a training type; the types it
    lacks (g6e, p5en, trn2, ...) must still be counted where botocore lists them."""
    import os

    from sagemaker.core import instance_types_gpu_info

    from mpi_magic.backends.sagemaker.settings import GPUS, accelerators, training_instance_types

    with open(os.path.join(os.path.dirname(instance_types_gpu_info.__file__), "image_uri_config",
                           "instance_gpu_info.json")) as f:
        regions = list(json.load(f))
    training = set(training_instance_types())
    sdk: dict[str, set[int]] = {}
    for region in regions:
        for instance_type, info in instance_types_gpu_info.retrieve(region).items():
            sdk.setdefault(instance_type, set()).add(info["Count"])
    compared = {t: counts for t, counts in sdk.items() if t in training}
    assert len(compared) > 20, "the SDK's table was not found"
    assert {t: (GPUS.get(t), counts) for t, counts in compared.items() if {GPUS.get(t)} != counts} == {}
    families = ("g6", "g6e", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2")
    current = [t for t in training if t.split(".")[1] in families]
    assert {"ml.g6e.48xlarge", "ml.p5en.48xlarge", "ml.trn2.48xlarge"} <= set(current)
    assert [t for t in current if not accelerators(t) or not accelerators(t)[0]] == []


def test_a_type_without_a_known_gpu_count_needs_gpus_before_anything_is_uploaded(ip, cloud, prefix, capsys):
    import re

    from mpi_magic.backends.sagemaker.settings import accelerators, training_instance_types

    uncounted = next(t for t in training_instance_types() if accelerators(t) is None)
    ip.run_line_magic("mpirun_config", f"instance_type={uncounted}")
    jobs_before = _training_jobs(cloud)
    with pytest.raises(mpi_magic.MpiMagicError) as caught:
        _run(ip, "-i 2", "x = 1\n")
    assert str(caught.value) == (f"mpi_magic does not know how many GPUs {uncounted} has: pass --gpus N (the "
                                 "processes to run on each instance), or choose a type it knows")
    assert _uploaded(cloud, prefix) == [] and _training_jobs(cloud) == jobs_before
    _run(ip, "-i 2 -g 3 --dry-run", "x = 1\n")  # with --gpus it goes ahead, without a warning
    out, err = capsys.readouterr()
    assert '"MPI_MAGIC_PROCS_PER_INSTANCE": "3"' in out and not re.search(r"GPU|NeuronCore", err)


def test_trainium_counts_neuroncores(ip, cloud, capsys):
    from mpi_magic.backends.sagemaker.settings import NEURON

    cores = NEURON["ml.trn1.2xlarge"][1]
    ip.run_line_magic("mpirun_config", "instance_type=ml.trn1.2xlarge")
    _run(ip, "-i 2 --dry-run", "x = 1\n")
    _run(ip, f"-i 2 -g {cores + 1} --dry-run", "x = 1\n")
    out, err = capsys.readouterr()
    assert f'"MPI_MAGIC_PROCS_PER_INSTANCE": "{cores}"' in out
    assert f"ml.trn1.2xlarge has {cores} NeuronCores but --gpus asks for {cores + 1} processes per instance" in err


def test_each_rank_of_an_8_gpu_instance_knows_its_place_and_sees_every_gpu(ip, cloud):
    """The documented binding: every rank of an instance sees all its GPUs (CUDA_VISIBLE_DEVICES is
    left as the instance has it) and picks its own by LOCAL_RANK, as torch DDP expects."""
    import os

    ip.run_line_magic("mpirun_config", "instance_type=ml.p4d.24xlarge")
    _run(ip, "-i 2 --gather --out job", (
        "import os\n"
        "names = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'GROUP_RANK',\n"
        "         'CUDA_VISIBLE_DEVICES')\n"
        "seen = {name: os.environ.get(name) for name in names}\n"
    ))
    assert ip.user_ns["job"].world_size == 16, "eight processes on each ml.p4d.24xlarge by default"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # what the emulated instances inherited from here
    assert ip.user_ns["seen"] == [
        {"RANK": str(rank), "WORLD_SIZE": "16", "LOCAL_RANK": str(rank % 8), "LOCAL_WORLD_SIZE": "8",
         "NODE_RANK": str(rank // 8), "GROUP_RANK": str(rank // 8), "CUDA_VISIBLE_DEVICES": visible}
        for rank in range(16)
    ]


def test_the_billable_time_and_cost_are_the_tables_price_times_what_sagemaker_bills(ip, cloud, capsys):
    """Checked against DescribeTrainingJob: BillableTimeInSeconds per instance, times InstanceCount."""
    from mpi_magic.backends.sagemaker.pricing import PRICES
    from mpi_magic.cost import Cost
    from mpi_magic.view.summary import duration

    _run(ip, "-i 2 -g 1 --out job", "import time\ntime.sleep(2)\n")
    job = ip.user_ns["job"]
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    config = described["ResourceConfig"]
    billed = described["BillableTimeInSeconds"] * config["InstanceCount"]
    assert billed >= 2 * 2, "two instances for at least the cell's two seconds"
    expected = Cost(PRICES[cloud.session.Session().region_name][config["InstanceType"]] * billed / 3600)
    assert job.model.billable_seconds() == billed and job.model.cost() == expected
    assert f"billable {duration(billed)} of instance time, {expected}" in capsys.readouterr().err


def test_billing_is_live_from_the_training_start_and_spot_is_an_upper_bound():
    from datetime import datetime, timezone

    from mpi_magic.backends.sagemaker.job import billing_of
    from mpi_magic.backends.sagemaker.pricing import PRICES, cost
    from mpi_magic.events import Billing

    hourly = PRICES["us-east-1"]["ml.g5.xlarge"]
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    described = {"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 3},
                 "SecondaryStatus": "Downloading"}
    assert billing_of(described, "us-east-1", now=start.timestamp() + 60) is None, "not billed before training"
    described["TrainingStartTime"] = start
    assert billing_of(described, "us-east-1", now=start.timestamp() + 60) == Billing(3, 180.0, True, hourly)
    described.update(TrainingEndTime=datetime(2026, 1, 1, 0, 2, tzinfo=timezone.utc), BillableTimeInSeconds=100,
                     EnableManagedSpotTraining=True)
    assert billing_of(described, "us-east-1") == Billing(3, 300.0, False, hourly, spot=True)
    assert str(cost("ml.g5.xlarge", "us-east-1", 300.0, spot=True)).startswith("at most $")
    assert billing_of(described, "xx-nowhere-1").hourly_price is None  # shown as "cost unknown"


def test_dry_run_names_the_list_price_or_that_the_table_has_none(ip, cloud, capsys):
    from mpi_magic.backends.sagemaker.pricing import PRICES, TABLE_DATE, cost
    from mpi_magic.cost import dollars

    region = cloud.session.Session().region_name
    _run(ip, "-i 4 -g 1 --dry-run", "x = 1\n")  # the fixture's ml.m5.xlarge
    hourly = PRICES[region]["ml.m5.xlarge"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Price: ml.m5.xlarge in {region} lists at {dollars(hourly)} per instance-hour on demand (AWS price list "
        f"of {TABLE_DATE}); 4 instances: {cost('ml.m5.xlarge', region, 4 * 3600.0)} an hour")
    unpriced = next(t for t in ("ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.48xlarge") if t not in PRICES[region])
    ip.run_line_magic("mpirun_config", f"instance_type={unpriced}")
    _run(ip, "-i 2 --spot --dry-run", "x = 1\n")
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Price: mpi_magic's table has none for {unpriced} in {region}; see the SageMaker pricing page")


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
    from mpi_magic.backends.sagemaker.job import SageMakerJob
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
        _run(ip, "-i 2 -g 2 --gather", "import mpi_magic\nme = mpi_magic.rank()\n")
    finally:
        after = set_faults(endpoint, "DescribeTrainingJob")
    assert ip.user_ns["me"] == [0, 1, 2, 3]
    assert after.get("DescribeTrainingJob", 0) > before.get("DescribeTrainingJob", 0)
    assert faults.injected["GetLogEvents"] and faults.injected["DescribeLogStreams"] and faults.injected["GetObject"] >= 2


def test_status_unread_beyond_botocores_retries_is_one_note_and_the_job_still_ends_with_its_results(
        ip, cloud, monkeypatch, local_aws_env):
    from mpi_magic.backends.sagemaker import job as sagemaker_job
    from mpi_magic.backends.sagemaker.job import SageMakerJob
    from mpi_magic.events import Note
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
        _run(ip, "-i 2 -g 1 --gather", "import mpi_magic\nme = mpi_magic.rank()\n")
    finally:
        injected = set_faults(endpoint, "DescribeTrainingJob")
    notes = [e.text for e in seen if isinstance(e, Note) and "could not read" in e.text]
    assert len(notes) == 1 and "ThrottlingException" in notes[0]
    assert injected["DescribeTrainingJob"] >= 2  # the loop tried again while it was throttled, and said nothing more
    assert ip.user_ns["me"] == [0, 1]


def test_the_log_is_read_less_often_while_quiet_up_to_a_bound_and_soon_again_once_lines_arrive(aws):
    from mpi_magic.backends.sagemaker.job import ADAPTIVE, SageMakerJob

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
        return [int(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()) for o in listed]

    def interrupted() -> None:
        interrupt(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], ip.user_ns["job"].name)

    # every rank saves its step; once each has saved three of twelve in S3, spot capacity is reclaimed
    with once(lambda: len(steps := saved_steps()) == 4 and min(steps) >= 3, interrupted, pause=0, limit=90):
        _run(ip, f"-i 2 -g 2 --spot --checkpoint-s3 s3://{BUCKET}/{checkpoints} --gather --out job", (
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
    from mpi_magic.backends.sagemaker.job import Attempts, attempts, billing_of

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

def test_the_rehearsal_clouds_live_tail_streams_only_new_lines_and_samples_a_flood_as_aws_does(aws, tmp_path):
    from botocore.config import Config

    from mpi_magic.backends.sagemaker.livetail import live_tail_client

    logs, group, stream = aws.client("logs"), f"/mpi-magic-tests/{tmp_path.name}", "leader"
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)

    def put(messages):
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=group, logStreamName=stream,
                            logEvents=[{"timestamp": now, "message": m} for m in messages])

    put(["stored before the session"])
    arn = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"][0]["logGroupArn"]
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


def _watched_jobs(monkeypatch) -> list:
    """Every SageMakerJob made from now on in this test."""
    from mpi_magic.backends.sagemaker.job import SageMakerJob

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
    _run(ip, "-i 2 -g 2 --gather --out job --quiet", _numbered_lines(60, 0) + "for i in range(30):\n"
         "    print(i)\n    time.sleep(0.1)\n")
    job, [sagemaker_job] = ip.user_ns["job"], watched
    assert job.status == "completed" and ip.user_ns["me"] == [0, 1, 2, 3]
    for rank in range(4):
        assert job.logs(rank).split() == [str(i) for i in range(30)]
    assert [(s.n, s.total) for s in job.ranks] == [(60, 60)] * 4
    assert sagemaker_job.calls["StartLiveTail"] == 1 and sagemaker_job.live_endings == ["closed"]
    assert sagemaker_job.lines_from["Live Tail"] > 0, "lines came through the session"


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
        _run(ip, "-i 2 -g 2 --gather --out job --quiet", _numbered_lines(60, lines))
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
    from mpi_magic.backends.sagemaker.job import fetch_each

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
