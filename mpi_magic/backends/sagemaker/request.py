"""The CreateTrainingJob request and the S3 layout of a job, built by pure functions."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...shared.rankinfo import CHECKPOINTS, NO_CHECKPOINTS
from .bootstrap import ALL_RELAYED, CODE_ARCHIVE, CODE_CHANNEL, PAYLOAD_CHANNEL
from .aws import service_model
from ...shared import envvars

BOOTSTRAP = "bootstrap.py"
CHECKPOINT_PATH = f"/opt/ml/{CHECKPOINTS}"  # SageMaker's default LocalPath, where rankinfo.checkpoint_dir() points
# The entrypoint checks the code it is about to run against digests pinned in the job definition:
# whoever can write to the job's S3 prefix cannot change what the instances run.
PINNED_START = (
    "import hashlib, os, sys\n"
    "base = os.environ.get('SAGEMAKER_BASE_DIR', '/opt/ml')\n"
    f"code = os.path.join(base, 'input', 'data', '{CODE_CHANNEL}')\n"
    f"pinned = (('{BOOTSTRAP}', '{envvars.BOOTSTRAP_SHA256}'), ('{CODE_ARCHIVE}', '{envvars.CODE_SHA256}'))\n"
    "for name, variable in pinned:\n"
    "    with open(os.path.join(code, name), 'rb') as f:\n"
    "        found = hashlib.sha256(f.read()).hexdigest()\n"
    "    if found != os.environ[variable]:\n"
    "        reason = name + ' does not match the digest pinned when the job was submitted; not running it'\n"
    "        open(os.path.join(base, 'output', 'failure'), 'w').write(reason)\n"
    f"        print({ALL_RELAYED!r}, flush=True)\n"  # no rank ran, so the log is complete
    "        sys.exit(reason)\n"
    f"sys.argv = [os.path.join(code, '{BOOTSTRAP}')]\n"
    "exec(compile(open(sys.argv[0]).read(), sys.argv[0], 'exec'), {'__name__': '__main__'})\n"
)
ENTRYPOINT = ["python3", "-c", PINNED_START]

# Instance types with Elastic Fabric Adapter, and what NCCL and libfabric need there, as the SageMaker
# SDK sets them for its mpirun and torchrun drivers (sagemaker/core/modules/train/container_drivers/
# common/utils.py: SM_EFA_NCCL_INSTANCES, SM_EFA_RDMA_INSTANCES; distributed_drivers/mpi_utils.py,
# get_mpirun_command). NCCL_PROTO=simple copes with EFA delivering data out of order. The SDK's lists
# predate p5en and trn1n, which have EFA with RDMA too (AWS's "Supported instance types" for EFA).
_NEWER_EFA_RDMA = {"ml.p5en.48xlarge", "ml.trn1n.32xlarge"}
EFA_NCCL_INSTANCES = frozenset({
    "ml.g4dn.8xlarge", "ml.g4dn.12xlarge", "ml.g5.48xlarge", "ml.p3dn.24xlarge", "ml.p4d.24xlarge",
    "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.trn1.32xlarge", *_NEWER_EFA_RDMA,
})
EFA_RDMA_INSTANCES = frozenset({"ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge",
                                "ml.trn1.32xlarge", *_NEWER_EFA_RDMA})


def fabric_environment(instance_type: str) -> dict[str, str]:
    """The EFA variables every rank gets on ``instance_type`` (none on a type without EFA)."""
    environment: dict[str, str] = {}
    if instance_type in EFA_NCCL_INSTANCES:
        environment.update(FI_PROVIDER="efa", NCCL_PROTO="simple")
    if instance_type in EFA_RDMA_INSTANCES:  # EFA's RDMA for one-sided and two-sided transfers
        environment["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return environment


@dataclass(frozen=True)
class CloudSettings:
    """What a SageMaker job needs beyond the launch options; all resolved before submitting."""

    region: str
    role: str
    image_uri: str
    instance_type: str
    s3_root: str  # s3://bucket/prefix, without a trailing slash
    volume_size: int = 100
    max_runtime: int = 86400
    spot: bool = False
    max_wait: int | None = None
    checkpoint_s3: str | None = None  # s3://bucket/prefix of SageMaker's checkpoint channel
    keep_alive: int | None = None
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()
    kms_key: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    training_plan: str | None = None  # the ARN of the training plan whose reserved capacity the job runs on


def job_prefix(settings: CloudSettings, job_name: str) -> str:
    return f"{settings.s3_root}/{job_name}"


def input_uri(settings: CloudSettings, job_name: str, channel: str, name: str) -> str:
    """Where a file goes that every instance finds as ``input/data/<channel>/<name>``."""
    return f"{job_prefix(settings, job_name)}/{channel}/{name}"


def results_uri(settings: CloudSettings, job_name: str) -> str:
    return f"{job_prefix(settings, job_name)}/results"


def _channel(name: str, uri: str) -> dict:
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                        "S3DataDistributionType": "FullyReplicated"}},
        "InputMode": "File",
    }


def training_job_request(settings: CloudSettings, job_name: str, instances: int, procs_per_instance: int,
                         digest: str, env: dict[str, str], mpirun_args: Sequence[str] = (),
                         code_digests: tuple[str, str] = ("", ""), session: dict[str, str] | None = None) -> dict:
    """The CreateTrainingJob request: our bootstrap as entrypoint, code and payload as channels.

    A session's job (``session``: its ``s3channel`` variables) has no payload channel: its
    cells arrive later, through S3.
    """
    prefix = job_prefix(settings, job_name)
    environment = {
        **fabric_environment(settings.instance_type),  # the bootstrap forwards FI_* and NCCL_* to every rank
        **env,  # the cell's --env wins
        envvars.ENV_NAMES: " ".join(sorted(env)),  # forwarded by mpirun to every rank
        envvars.MPIRUN_ARGS: shlex.join(mpirun_args),
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        envvars.INSTANCES: str(instances),
        envvars.PROCS_PER_INSTANCE: str(procs_per_instance),
        envvars.PAYLOAD_DIGEST: digest,
        envvars.BOOTSTRAP_SHA256: code_digests[0],
        envvars.CODE_SHA256: code_digests[1],
        envvars.RESULTS_URI: results_uri(settings, job_name),
        envvars.JOB: job_name,
        envvars.MASTER_ADDR: "algo-1",
        envvars.MASTER_PORT: "29500",
        envvars.MAX_WAIT: str(settings.max_runtime),
        envvars.CHECKPOINT_S3: settings.checkpoint_s3 or NO_CHECKPOINTS,  # where rankinfo.checkpoint_dir() points
        **(session or {}),
    }
    request: dict[str, Any] = {
        "TrainingJobName": job_name,
        "RoleArn": settings.role,
        "AlgorithmSpecification": {
            "TrainingImage": settings.image_uri,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ENTRYPOINT,
        },
        "InputDataConfig": [_channel(CODE_CHANNEL, input_uri(settings, job_name, CODE_CHANNEL, ""))] + (
            [] if session else [_channel(PAYLOAD_CHANNEL, input_uri(settings, job_name, PAYLOAD_CHANNEL, ""))]),
        "OutputDataConfig": {"S3OutputPath": f"{prefix}/output/"},
        "ResourceConfig": {"InstanceType": settings.instance_type, "InstanceCount": instances,
                           "VolumeSizeInGB": settings.volume_size},
        "StoppingCondition": {"MaxRuntimeInSeconds": settings.max_runtime},
        "Environment": environment,
        "EnableManagedSpotTraining": settings.spot,
    }
    if settings.spot:
        request["StoppingCondition"]["MaxWaitTimeInSeconds"] = settings.max_wait or settings.max_runtime
    if settings.checkpoint_s3:  # SageMaker keeps /opt/ml/checkpoints and this prefix in step
        request["CheckpointConfig"] = {"S3Uri": settings.checkpoint_s3, "LocalPath": CHECKPOINT_PATH}
    if settings.keep_alive:
        request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = settings.keep_alive
    if settings.training_plan:
        request["ResourceConfig"]["TrainingPlanArn"] = settings.training_plan
    if settings.kms_key:
        request["OutputDataConfig"]["KmsKeyId"] = settings.kms_key
        request["ResourceConfig"]["VolumeKmsKeyId"] = settings.kms_key
    if settings.subnets or settings.security_groups:
        request["VpcConfig"] = {"Subnets": list(settings.subnets), "SecurityGroupIds": list(settings.security_groups)}
    if settings.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in settings.tags.items()]
    return request


def validate(request: dict) -> None:
    """Raise botocore's ParamValidationError where the request breaks SageMaker's service model."""
    from botocore.validate import ParamValidator
    from botocore.exceptions import ParamValidationError

    model = service_model("sagemaker")
    report = ParamValidator().validate(request, model.operation_model("CreateTrainingJob").input_shape)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())
