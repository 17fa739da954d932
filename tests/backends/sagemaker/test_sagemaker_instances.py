"""What the cloud settings and an instance type make of a SageMaker job: the request and dry
runs, settings refused before anything is uploaded, GPU and NeuronCore counts, EFA, the network
SageMaker names, prices and billing. Over real HTTP to the rehearsal cloud, as ``test_sagemaker``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import BUCKET, ROLE, run, training_jobs, uploaded

import mpi_magic
from mpi_magic.backends.sagemaker.aws import INSTALL_SAGEMAKER


def test_dry_run_prints_the_request_and_starts_nothing(ip, cloud, prefix, capsys):
    jobs_before = training_jobs(cloud)
    run(ip, "-i 4 -g 2 --dry-run --job-name dry-1 --tags team=ml", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    assert request["TrainingJobName"] == "dry-1" and request["ResourceConfig"]["InstanceCount"] == 4
    assert request["Environment"]["MPI_MAGIC_PROCS_PER_INSTANCE"] == "2"
    assert request["Tags"] == [{"Key": "team", "Value": "ml"}]
    assert f"s3://{BUCKET}/{prefix}/dry-1/payload/payload.bin" in out
    assert uploaded(cloud, prefix) == []
    assert training_jobs(cloud) == jobs_before


@pytest.mark.parametrize(("setting", "message"), [
    ("role=my-role", "'my-role' is not an IAM role ARN"),
    ("instance_type=ml.p4dd.24xlarge", "did you mean ml.p4d.24xlarge?"),
    ("s3_root=s3://no-such-bucket/x", "the bucket 'no-such-bucket' of --s3-root cannot be used"),
])
def test_bad_cloud_settings_are_one_sentence_before_anything_isuploaded(ip, cloud, prefix, setting, message):
    ip.run_line_magic("mpirun_config", setting)
    with pytest.raises(mpi_magic.MpiMagicError, match=message) as caught:
        run(ip, "", "x = 1\n")
    assert "\n" not in str(caught.value)
    assert uploaded(cloud, prefix) == []


@contextlib.contextmanager
def aws_out_of_reach(monkeypatch):
    """HTTPS from this process goes through a proxy that closes every connection at once, as on a
    machine that cannot reach AWS (the rehearsal cloud, plain HTTP on loopback, still answers);
    yields the list of connections tried, which grows."""
    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.settimeout(0.05)
    tried: list[tuple] = []
    done = threading.Event()

    def refuse():
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                connection, peer = proxy.accept()
                tried.append(peer)
                connection.close()

    thread = threading.Thread(target=refuse)
    thread.start()
    for name in ("https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
    try:
        yield tried
    finally:
        done.set()
        thread.join()
        proxy.close()


STUDIO = "/opt/ml/metadata/resource-metadata.json"


@pytest.mark.parametrize(("setting", "refusal"), [
    ("role=", "no execution role: the SageMaker SDK looks for SageMaker Studio's role in {studio} (not on this "
              "machine), then asks STS which role these credentials act as, and that failed ({failure}); pass "
              "--role arn:aws:iam::ACCOUNT:role/NAME (or set it once with %mpirun_config role=...)"),
    ("s3_root=", "no --s3-root: the SageMaker SDK makes its default bucket, sagemaker-us-east-1-ACCOUNT, with the "
                 "account's number from STS, and that failed ({failure}); pass --s3-root s3://your-bucket/prefix "
                 "(or set it once with %mpirun_config s3_root=...)"),
])
def test_with_the_sdk_a_default_it_cannot_find_is_refused_after_one_try_saying_where_it_looked(
        ip, cloud, prefix, monkeypatch, setting, refusal):
    """The SageMaker SDK is installed (the [sagemaker] extra brings it) and this is not SageMaker Studio:
    its defaults need STS, which is out of reach, so the cell is refused after one try, not botocore's
    five, in one sentence."""
    import sagemaker.core  # noqa: F401 - imported before the clock starts: the import takes seconds

    assert not os.path.exists(STUDIO)
    ip.run_line_magic("mpirun_config", setting)
    with aws_out_of_reach(monkeypatch) as tried:
        with pytest.raises(mpi_magic.MpiMagicError) as caught:
            run(ip, "", "x = 1\n")
    said, why = refusal.format(studio=STUDIO, failure="\0").split("\0")
    failure = re.fullmatch(re.escape(said) + "(.+)" + re.escape(why), str(caught.value))
    assert failure and "https://sts.us-east-1.amazonaws.com" in failure[1], str(caught.value)
    assert len(tried) == 1, f"{len(tried)} tries: each retry waits longer (botocore's backoff)"
    assert uploaded(cloud, prefix) == []


NO_SDK = """
import importlib.abc, sys

class NoSageMakerSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "sagemaker":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoSageMakerSdk())
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
ip.run_line_magic("load_ext", "mpi_magic")
ip.run_line_magic("mpirun_config", sys.argv[1])
try:
    ip.run_cell_magic("mpirun_remote", "--dry-run", "x = 1")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.parametrize(("setting", "refusal"), [
    (f"s3_root=s3://{BUCKET}/x role=", "no execution role: the default (SageMaker Studio's role) comes from the "
     "SageMaker SDK, which is not installed (" + INSTALL_SAGEMAKER + "); pass "
     "--role arn:aws:iam::ACCOUNT:role/NAME (or set it once with %mpirun_config role=...)"),
    (f"role={ROLE} s3_root=", "no --s3-root: the default (the bucket sagemaker-REGION-ACCOUNT) comes from the "
     "SageMaker SDK, which is not installed (" + INSTALL_SAGEMAKER + "); pass "
     "--s3-root s3://your-bucket/prefix (or set it once with %mpirun_config s3_root=...)"),
    (f"role={ROLE} s3_root=s3://{BUCKET}/x image_uri=", "no training image: the default (the newest PyTorch "
     "training image for this Python) comes from the SageMaker SDK, which is not installed "
     "(" + INSTALL_SAGEMAKER + "); pass --image-uri URI (or set it once with %mpirun_config image_uri=...)"),
])
def test_without_the_sdk_a_missing_default_says_to_pass_it(aws, setting, refusal):
    """The SDK is installed here: a Python whose imports of it are refused stands in for one without it,
    running the cell in a real InteractiveShell against the rehearsal cloud."""
    line = f"backend=sagemaker instance_type=ml.m5.xlarge image_uri=local/emulated {setting}"
    shown = subprocess.run([sys.executable, "-c", NO_SDK, line], capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip() == f"SageMakerSetupError: {refusal}", shown.stderr[-2000:]


def test_checkpoint_s3_maps_sagemakers_checkpoint_channel_and_a_bad_one_is_one_sentence(ip, cloud, prefix, capsys):
    run(ip, f"-i 2 -g 1 --spot --checkpoint-s3 s3://{BUCKET}/{prefix}/ck/ --dry-run", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    assert request["CheckpointConfig"] == {"S3Uri": f"s3://{BUCKET}/{prefix}/ck", "LocalPath": "/opt/ml/checkpoints"}
    assert request["Environment"]["MPI_MAGIC_CHECKPOINT_S3"] == f"s3://{BUCKET}/{prefix}/ck"
    for uri, message in (("ck/x", "--checkpoint-s3: 'ck/x' is not an s3:// address"),
                         ("s3://no-such-bucket/ck", "the bucket 'no-such-bucket' of --checkpoint-s3 cannot be used")):
        with pytest.raises(mpi_magic.MpiMagicError, match=message) as caught:
            run(ip, f"-i 2 -g 1 --checkpoint-s3 {uri}", "x = 1\n")
        assert "\n" not in str(caught.value)
    assert uploaded(cloud, prefix) == []


def test_the_default_image_is_the_sdks_pytorch_training_image_for_this_python(ip, cloud, capsys):
    import sys

    ip.run_line_magic("mpirun_config", "image_uri=")
    run(ip, "-i 2 -g 1 --dry-run", "x = 1\n")
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.index("\nS3 objects:")])
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert image.startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:")
    assert f"-py3{sys.version_info[1]}" in image


def test_missing_region_and_credentials_are_named(ip, cloud, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(mpi_magic.MpiMagicError, match="no AWS region: pass --region"):
        run(ip, "", "x = 1\n")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(mpi_magic.MpiMagicError, match="no AWS credentials found"):
        run(ip, "", "x = 1\n")


def test_each_cells_session_reads_credentials_afresh_and_botocores_models_from_one_loader(cloud, monkeypatch):
    from mpi_magic.backends.sagemaker.aws import aws_clients

    first = aws_clients("us-east-1")
    assert first.get_credentials().access_key == "testing"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "changed-since")
    second = aws_clients("eu-west-1")
    assert second.get_credentials().access_key == "changed-since"
    assert (first.region_name, second.region_name) == ("us-east-1", "eu-west-1")
    first_loader, second_loader = (s._session.get_component("data_loader") for s in (first, second))
    assert first_loader is second_loader, "the service models are read once"
    assert len(set(second_loader.search_paths)) == len(second_loader.search_paths), "no folder searched twice"


def test_an_instance_without_gpus_says_its_processes_run_on_its_cpus(ip, cloud, capsys):
    run(ip, "-g 1 --dry-run", "x = 1\n")
    assert "ml.m5.xlarge has no GPU: its 1 process per instance runs on its CPUs" in capsys.readouterr().err
    run(ip, "-g 2 --dry-run", "x = 1\n")
    assert "ml.m5.xlarge has no GPU: its 2 processes per instance run on its CPUs" in capsys.readouterr().err


def test_more_processes_than_gpus_is_a_warning(ip, cloud, capsys):
    ip.run_line_magic("mpirun_config", "instance_type=ml.g5.xlarge")
    run(ip, "-g 2 --dry-run", "x = 1\n")
    assert "ml.g5.xlarge has 1 GPU but --gpus asks for 2 processes per instance" in capsys.readouterr().err


def test_the_request_is_valid_for_botocores_service_model():
    from mpi_magic.backends.sagemaker.request import CloudSettings, training_job_request, validate

    settings = CloudSettings("us-west-2", ROLE, "img", "ml.p4d.24xlarge", "s3://b/p", spot=True, keep_alive=600,
                             subnets=("subnet-1",), security_groups=("sg-1",), kms_key="key", tags={"a": "b"})
    validate(training_job_request(settings, "job-1", 4, 8, "d" * 64, {"A": "1"}))


def test_an_image_for_another_python_is_refused_before_submitting(ip, cloud, prefix):
    import sys

    other = sys.version_info[1] - 1
    ip.run_line_magic("mpirun_config", "image_uri=763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                                       f"pytorch-training:2.1.0-gpu-py3{other}-cu121-ubuntu20.04-sagemaker")
    with pytest.raises(mpi_magic.MpiMagicError,
                       match=rf"runs Python 3\.{other} but this notebook runs Python 3\.{sys.version_info[1]}"):
        run(ip, "", "x = 1\n")
    assert uploaded(cloud, prefix) == []


def test_without_boto3_the_extra_to_install_is_named(ip, monkeypatch, cache_dir):
    import sys

    from IPython.core.error import UsageError

    monkeypatch.setitem(sys.modules, "boto3", None)  # what an install without the extra looks like
    with pytest.raises(UsageError, match=re.escape("needs boto3, which is not installed: " + INSTALL_SAGEMAKER) + "$"):
        run(ip, "--backend sagemaker", "x = 1\n")


GIVES_UP_ON_SILENCE = "-o ConnectTimeout=5 -o ServerAliveInterval=3 -o ServerAliveCountMax=2"


@pytest.mark.parametrize(("version_text", "launch", "signals"), [
    ("mpirun.real (OpenRTE) 4.1.7\n\nReport bugs to", ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_no_tree_spawn",
                                                      "1", "--allow-run-as-root", "--mca", "plm_rsh_args",
                                                      GIVES_UP_ON_SILENCE],
     ["--mca", "ess_base_forward_signals", "SIGURG,28"]),  # both stack requests: Open MPI 4 adds them to its own
    ("mpirun (Open MPI) 5.0.6\n", ["--prtemca", "plm_ssh_agent", "ssh", "--prtemca", "plm_ssh_no_tree_spawn", "1",
                                   "--prtemca", "plm_ssh_args", GIVES_UP_ON_SILENCE],
     ["--prtemca", "ess_base_forward_signals", "SIGTSTP,SIGUSR1,SIGUSR2,SIGABRT,SIGALRM,SIGCONT,SIGURG,28"]),  # 5 replaces
])
def test_bootstrap_speaks_open_mpi_4_behind_the_images_wrapper_and_5(tmp_path, monkeypatch, version_text, launch,
                                                                     signals):
    """Only `mpirun --version` is stood in for (a script printing what each version prints)."""
    from mpi_magic.backends.sagemaker import bootstrap
    from mpi_magic.shared import fabric

    monkeypatch.setattr(fabric, "DEVICE_CLASSES", (str(tmp_path / "infiniband"),))  # an instance without EFA
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
    assert rest[:11 + len(signals)] == ["--bind-to", "none", *signals, "--mca", "btl", "^ofi", "--mca", "mtl", "^ofi",
                                        "--mca", "btl_tcp_if_include", "eth0"]
    assert ["-x", "STAGE"] == rest[rest.index("STAGE") - 1:rest.index("STAGE") + 1]
    monkeypatch.setenv("OMPI_MCA_ess_base_forward_signals", "SIGUSR1")  # the user's choices stay theirs
    monkeypatch.setenv("OMPI_MCA_plm_rsh_args" if "4." in version_text else "PRTE_MCA_plm_ssh_args", "-q")
    theirs = bootstrap.mpirun_argv(str(fake), "ssh", "/hosts", 16)
    assert "ess_base_forward_signals" not in theirs and GIVES_UP_ON_SILENCE not in theirs


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
    run(ip, "-i 2 -g 1 --dry-run", "x = 1\n")
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
    run(ip, "-i 2 -g 2 --gather --out job", (
        "import os, psutil\n"
        "nic = (os.environ.get('NCCL_SOCKET_IFNAME'), sorted(psutil.net_if_addrs()))\n"  # (the interfaces where it runs)
        "transports = (os.environ.get('OMPI_MCA_btl'), os.environ.get('OMPI_MCA_mtl'))\n"
    ))
    interface = ip.user_ns["nic"][0][0]  # (eth0 on test hosts; this machine's first interface on the stand-in)
    assert interface != "lo" and all(name == interface and name in present for name, present in ip.user_ns["nic"])
    logs = cloud.client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    stream = logs.describe_log_streams(logGroupName=group, logStreamNamePrefix=ip.user_ns["job"].name + "/algo-1-")
    lines = [e["message"] for e in logs.get_log_events(logGroupName=group, startFromHead=True,
                                                        logStreamName=stream["logStreams"][0]["logStreamName"])["events"]]
    launch = next(line for line in lines if line.startswith("mpi_magic bootstrap: running mpirun"))
    assert f"--mca btl_tcp_if_include {interface} --prtemca prte_if_include {interface}" in launch
    # no fabric device on the emulated instances: Open MPI's libfabric transports are left out
    assert "--mca btl ^ofi --mca mtl ^ofi" in " ".join(shlex.split(launch))
    assert ip.user_ns["transports"] == [("^ofi", "^ofi")] * 4


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
    run(ip, "-i 2 -g 1 --gather --env NCCL_PROTO=LL", (
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


def test_a_type_without_a_known_gpu_count_needs_gpus_before_anything_isuploaded(ip, cloud, prefix, capsys):
    from mpi_magic.backends.sagemaker.settings import accelerators, training_instance_types

    uncounted = next(t for t in training_instance_types() if accelerators(t) is None)
    ip.run_line_magic("mpirun_config", f"instance_type={uncounted}")
    jobs_before = training_jobs(cloud)
    with pytest.raises(mpi_magic.MpiMagicError) as caught:
        run(ip, "-i 2", "x = 1\n")
    assert str(caught.value) == (f"mpi_magic does not know how many GPUs {uncounted} has: pass --gpus N (the "
                                 "processes to run on each instance), or choose a type it knows")
    assert uploaded(cloud, prefix) == [] and training_jobs(cloud) == jobs_before
    run(ip, "-i 2 -g 3 --dry-run", "x = 1\n")  # with --gpus it goes ahead, without a warning
    out, err = capsys.readouterr()
    assert '"MPI_MAGIC_PROCS_PER_INSTANCE": "3"' in out and not re.search(r"GPU|NeuronCore", err)


def test_trainium_counts_neuroncores(ip, cloud, capsys):
    from mpi_magic.backends.sagemaker.settings import NEURON

    cores = NEURON["ml.trn1.2xlarge"][1]
    ip.run_line_magic("mpirun_config", "instance_type=ml.trn1.2xlarge")
    run(ip, "-i 2 --dry-run", "x = 1\n")
    run(ip, f"-i 2 -g {cores + 1} --dry-run", "x = 1\n")
    out, err = capsys.readouterr()
    assert f'"MPI_MAGIC_PROCS_PER_INSTANCE": "{cores}"' in out
    assert f"ml.trn1.2xlarge has {cores} NeuronCores but --gpus asks for {cores + 1} processes per instance" in err


def test_each_rank_of_an_8_gpu_instance_knows_its_place_and_sees_every_gpu(ip, cloud):
    """The documented binding: every rank of an instance sees all its GPUs (CUDA_VISIBLE_DEVICES is
    left as the instance has it) and picks its own by LOCAL_RANK, as torch DDP expects."""
    import os

    ip.run_line_magic("mpirun_config", "instance_type=ml.p4d.24xlarge")
    run(ip, "-i 2 --gather --out job", (
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
    from mpi_magic.shared.cost import Cost
    from mpi_magic.view.summary import duration

    run(ip, "-i 2 -g 1 --out job", "import time\ntime.sleep(2)\n")
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

    from mpi_magic.backends.sagemaker.training_job import billing_of
    from mpi_magic.backends.sagemaker.pricing import PRICES, cost
    from mpi_magic.shared.events import Billing

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
    from mpi_magic.shared.cost import dollars

    region = cloud.session.Session().region_name
    run(ip, "-i 4 -g 1 --dry-run", "x = 1\n")  # the fixture's ml.m5.xlarge
    hourly = PRICES[region]["ml.m5.xlarge"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Price: ml.m5.xlarge in {region} lists at {dollars(hourly)} per instance-hour on demand (AWS price list "
        f"of {TABLE_DATE}); 4 instances: {cost('ml.m5.xlarge', region, 4 * 3600.0)} an hour")
    unpriced = next(t for t in ("ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g5.48xlarge") if t not in PRICES[region])
    ip.run_line_magic("mpirun_config", f"instance_type={unpriced}")
    run(ip, "-i 2 --spot --dry-run", "x = 1\n")
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"Price: mpi_magic's table has none for {unpriced} in {region}; see the SageMaker pricing page")


PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"


def test_a_training_plan_goes_into_the_request_and_its_capacity_is_billed_by_the_plan(ip, cloud, capsys):
    run(ip, f"-i 2 -g 1 --training-plan {PLAN} --dry-run", "x = 1\n")
    printed = capsys.readouterr().out
    assert f'"TrainingPlanArn": "{PLAN}"' in printed
    assert ("Price: the job runs on training plan p5-week's reserved capacity, paid for when the plan was bought: "
            "no charge by the hour for its instances") in printed
    run(ip, f"-i 2 -g 1 --training-plan {PLAN} --out job", "import time\ntime.sleep(1)\n")
    job = ip.user_ns["job"]
    described = cloud.client("sagemaker").describe_training_job(TrainingJobName=job.name)
    assert described["ResourceConfig"]["TrainingPlanArn"] == PLAN  # what SageMaker was asked for
    billed = described["BillableTimeInSeconds"] * 2
    assert job.model.billable_seconds() == billed and job.model.cost() is None
    from mpi_magic.view.summary import duration

    assert f"{duration(billed)} of instance time on training plan p5-week, paid for by the plan" in \
        capsys.readouterr().err


@pytest.mark.parametrize("line, message", [
    ("--training-plan p5-week", "--training-plan 'p5-week' is not a training plan's ARN, like "
                                "arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan"),
    (f"--training-plan {PLAN} --spot", "--spot does not apply to a training plan, whose capacity is reserved; "
                                       "drop one of them"),
])
def test_a_training_plan_that_cannot_be_is_one_sentence(ip, cloud, line, message):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as raised:
        run(ip, line, "x = 1\n")
    assert str(raised.value) == message


def test_watching_a_job_without_live_tail_makes_at_most_30_calls_a_minute_from_submitting_to_its_end(ip, cloud):
    """16 x 2 ranks reporting twice a second: CreateTrainingJob, DescribeTrainingJob and the log's
    reads together, counted until the job's end was known (its results are fetched after)."""
    from mpi_magic.backends.sagemaker.training_job import SageMakerJob

    watched = []
    init = SageMakerJob.__init__

    def remembered(self, *args, **kwargs):
        init(self, *args, **kwargs)
        watched.append(self)

    SageMakerJob.__init__ = remembered
    try:
        ip.run_line_magic("mpirun_config", "live_tail=no")
        run(ip, "-i 16 -g 2 --quiet", "import time, mpi_magic\nfor _ in mpi_magic.progress(range(30)):\n"
                                      "    time.sleep(0.5)\n")
    finally:
        SageMakerJob.__init__ = init
    job = watched[-1]
    minutes = (time.monotonic() - job.created_at) / 60  # (an upper bound of the time to its end)
    assert job.calls_at_end is not None and job.calls_at_end / minutes <= 30, (job.calls_at_end, minutes, job.calls)
    assert job.calls["GetLogEvents"] >= 5, "the log was read while the ranks reported"


def test_the_failure_reason_names_the_rank_that_failed_first_by_its_instances_corrected_clock(monkeypatch, capsys):
    """The leader relays every rank's events as mpirun passes them on; instance 1's clock runs 30 s
    ahead of the leader's. Rank 2 (instance 1) raised first, though its report came last (it was
    keeping its frames); rank 3 lost a peer, and its clock says it came before rank 2. (Rank 0 raised
    a second after rank 2: more than the relay's lag on a loaded machine makes of the clocks.)"""
    from mpi_magic.backends.sagemaker import bootstrap
    from mpi_magic.shared.events import RankFinished, RankStarted, encode

    token = "0123456789abcdef"
    monkeypatch.setenv("MPI_MAGIC_EVENT_TOKEN", token)
    raised = time.time() + 0.4  # when rank 2 raised, by instance 0's clock
    ahead = {0: 0.0, 1: 30.0}
    timeline = [(raised - 0.3, RankStarted(rank=r, instance=r // 2, local_rank=r % 2, world_size=4, host="h", pid=r,
                                          seq=0, time=raised - 0.32 + ahead[r // 2])) for r in range(4)]
    timeline += [  # (when it comes, the event)
        (raised + 0.05, RankFinished(rank=3, ok=False, error_type="RuntimeError", message="Connection closed by peer",
                                     seq=1, time=raised - 0.1 + 30.0)),
        (raised + 1.05, RankFinished(rank=0, ok=False, error_type="RuntimeError", message="collateral", seq=1,
                                     time=raised + 1.0)),
        (raised + 1.2, RankFinished(rank=2, ok=False, error_type="ValueError", message="root cause", seq=1,
                                    time=raised + 30.0))]

    class Mpirun:
        def readline(self):
            if not timeline:
                return b""
            comes, event = timeline.pop(0)
            time.sleep(max(0.0, comes - time.time()))
            return f"[1,{event.rank}]<stdout>: {encode(event, token)}\n".encode()

    failures: list = []
    bootstrap.relay_output(Mpirun(), failures, bootstrap.relay_state())
    capsys.readouterr()
    assert [f.rank for f in failures] == [3, 0, 2], "as they came"
    assert bootstrap.first_failure(failures) == "rank 2 raised ValueError: root cause"


def test_the_leader_names_the_workers_it_cannot_release_and_the_ranks_that_never_finished(tmp_path, monkeypatch,
                                                                                         capsys):
    """What the leader makes of a job's end beside mpirun's status (the jobs themselves on test hosts:
    test_sagemaker_host_faults.py)."""
    from mpi_magic.backends.sagemaker import bootstrap

    # an ssh for which algo-3 is gone and algo-4 refuses the first time, that notes each try and its options
    agent = tmp_path / "ssh"
    agent.write_text('#!/bin/sh\nhost=$7\necho "$1 $2 $3 $4 $5 $6" >> "$0.$host"\n'
                     'if [ "$host" = algo-3 ] || { [ "$host" = algo-4 ] && [ ! -e "$0.refused" ]; }; then\n'
                     '    [ "$host" = algo-3 ] || touch "$0.refused"\n'
                     '    echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255\nfi\n')
    agent.chmod(0o755)
    assert bootstrap.release(["algo-2", "algo-3", "algo-4"], str(agent)) == ["algo-3"]
    tries = {host: (tmp_path / f"ssh.{host}").read_text().splitlines() for host in ("algo-2", "algo-3", "algo-4")}
    assert tries == {"algo-2": [GIVES_UP_ON_SILENCE], "algo-3": [GIVES_UP_ON_SILENCE] * 3,
                     "algo-4": [GIVES_UP_ON_SILENCE] * 2}
    said = capsys.readouterr().out
    assert said.count("could not release") == 1
    assert ("could not release algo-3: " + str(agent) + " exited with status 255: ssh: connect to host algo-3 port 22: "
            "Connection refused") in said
    assert bootstrap.unreachable_sentence(["algo-3"], "algo-1") == ("instance algo-3 stopped answering algo-1 (lost, or "
                                                                     "cut off)")
    line = bootstrap.UNREACHABLE + bootstrap.unreachable_sentence(["algo-2", "algo-3"], "algo-1")
    assert bootstrap.unreachable_in(line) == "instances algo-2, algo-3 stopped answering algo-1 (lost, or cut off)"
    assert bootstrap.unreachable_in(bootstrap.ALL_RELAYED) is None

    relayed = bootstrap.relay_state()
    relayed["finished"].update({0, 1})  # (as relay_output notes them)
    hosts = ["algo-1", "algo-2"]
    assert bootstrap.unfinished_ranks(relayed, 4, 2, hosts) == "ranks 2, 3 on algo-2 never finished the cell"
    relayed["finished"].update({2, 3})
    assert bootstrap.unfinished_ranks(relayed, 4, 2, hosts) == ""
    monkeypatch.setenv("MPI_MAGIC_SESSION_URI", "s3://bucket/jobs/session-1/session")
    assert bootstrap.unfinished_ranks(relayed, 4, 2, hosts) == "the session's ranks ended without rank 0 closing the session"
    relayed["closed"] = True
    assert bootstrap.unfinished_ranks(relayed, 4, 2, hosts) == ""
