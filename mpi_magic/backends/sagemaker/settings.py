"""A SageMaker job's settings and the facts about instance types they are checked against.

Light to import: the default ``--gpus`` is read from the GPU table while a cell's line is parsed
(``backends.default_gpus``), before anyone knows a cloud job will run. boto3 and botocore are
imported only when settings are resolved.
"""

from __future__ import annotations

import difflib
import re
import sys

from ...errors import BackendSetupError
from . import sdk
from ...shared.layout import split_s3
from .aws import aws_clients, service_model
from .request import CloudSettings


class SageMakerSetupError(BackendSetupError):
    """Something the SageMaker backend needs is missing or wrong; nothing was uploaded or started."""


_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")

# NVIDIA GPUs per instance, the default processes per instance. The SageMaker SDK's
# own table (sagemaker/core/image_uri_config/instance_gpu_info.json) agrees where it has the type,
# which a test checks; the types it lacks (g6, g6e, p5e, p5en, p5.4xlarge, p6-b200) follow AWS's
# instance type pages. A valid type in neither table needs --gpus; other names are refused.
GPUS = {
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.p2.xlarge": 1, "ml.p2.8xlarge": 8, "ml.p2.16xlarge": 16,
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.4xlarge": 1, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8, "ml.p6-b200.48xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.8xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g4dn.16xlarge": 1,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.16xlarge": 1,
    "ml.g5.12xlarge": 4, "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8,
    "ml.g6.xlarge": 1, "ml.g6.2xlarge": 1, "ml.g6.4xlarge": 1, "ml.g6.8xlarge": 1, "ml.g6.16xlarge": 1,
    "ml.g6.12xlarge": 4, "ml.g6.24xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.g6e.xlarge": 1, "ml.g6e.2xlarge": 1, "ml.g6e.4xlarge": 1, "ml.g6e.8xlarge": 1, "ml.g6e.16xlarge": 1,
    "ml.g6e.12xlarge": 4, "ml.g6e.24xlarge": 4, "ml.g6e.48xlarge": 8,
}
# EC2's general purpose (m), compute optimized (c), memory optimized (r) and burstable (t) families
# carry no GPU: one process per instance unless --gpus says otherwise.
CPU_FAMILIES = ("m", "c", "r", "t")

# Trainium: (Neuron devices, NeuronCores) per instance. A process per NeuronCore is the default, as the
# SageMaker SDK's own training driver starts torchrun (sagemaker/core/modules/train/container_drivers:
# common/utils.py get_process_count, SM_NUM_GPUS or else SM_NUM_NEURONS, which scripts/environment.py
# num_neurons counts as the NeuronCores `neuron-ls` reports) and as AWS Neuron's examples run (32 on
# trn1.32xlarge). trn2 counts logical cores at Neuron's default of
# two physical cores each (LNC=2): 16 Trainium2 devices x 8 physical cores = 64 logical ones.
NEURON = {
    "ml.trn1.2xlarge": (1, 2), "ml.trn1.32xlarge": (16, 32), "ml.trn1n.32xlarge": (16, 32),
    "ml.trn2.48xlarge": (16, 64),
}


def accelerators(instance_type: str) -> tuple[int, str] | None:
    """(how many, "GPU" or "NeuronCore") of a type in the tables; (0, "GPU") for a CPU type; None if unknown."""
    if instance_type in NEURON:
        return NEURON[instance_type][1], "NeuronCore"
    if instance_type in GPUS:
        return GPUS[instance_type], "GPU"
    family = instance_type.split(".")[1] if instance_type.count(".") == 2 else ""
    if family[:1] in CPU_FAMILIES and family[1:2].isdigit():  # m5, c7i, r6g, t3: not trn1
        return 0, "GPU"
    return None


def default_processes(instance_type: str | None) -> int:
    """Processes per instance when --gpus is not given: one per GPU or NeuronCore, one on a CPU type.
    A valid type whose count mpi_magic does not know needs --gpus: a wrong guess would either leave
    accelerators idle or put several processes on one."""
    if not instance_type:
        return 1  # resolve() says that the instance type is missing
    known = accelerators(instance_type)
    if known is None:
        instance_gpus(instance_type)  # a name that is no training instance type gets its own sentence
        raise SageMakerSetupError(f"mpi_magic does not know how many GPUs {instance_type} has: pass --gpus N "
                                  "(the processes to run on each instance), or choose a type it knows")
    return max(1, known[0])


def training_instance_types() -> list[str]:
    """Every training instance type in botocore's SageMaker service model."""
    return list(service_model("sagemaker").shape_for("TrainingInstanceType").enum)


def instance_gpus(instance_type: str) -> int | None:
    """GPUs (or NeuronCores) of a known type; None for a valid type mpi_magic has no count for;
    an error for a name that is not a training instance type."""
    valid = training_instance_types()
    if instance_type not in valid:
        close = difflib.get_close_matches(instance_type, valid, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; for example --instance-type ml.g5.12xlarge"
        raise SageMakerSetupError(f"{instance_type!r} is not a SageMaker training instance type{hint}")
    counted = accelerators(instance_type)
    return None if counted is None else counted[0]


def _from_sdk(missing: str, option: str, setting: str, find, *arguments):
    """A default the SageMaker SDK finds; where it cannot, one sentence: what is missing, where the SDK
    looked (or that it is not installed), and the option that gives it."""
    fix = f"pass {option} (or set it once with %mpirun_config {setting}=...)"
    try:
        return find(*arguments)
    except (sdk.SdkMissing, LookupError) as exc:
        raise SageMakerSetupError(f"no {missing}: {exc}; {fix}") from None
    except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds; the user needs the option
        raise SageMakerSetupError(f"no {missing}: the SageMaker SDK could not find one ({type(exc).__name__}: "
                                  f"{exc}); {fix}") from None


def _check_bucket(s3, bucket: str, option: str) -> None:
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - botocore raises several kinds here
        raise SageMakerSetupError(f"the bucket {bucket!r} of {option} cannot be used ({exc}); "
                                  f"create it or pass another {option}") from None


def resolve(values: dict) -> tuple[CloudSettings, object]:
    """Settings from the cell's options and defaults, checked; (settings, boto3 handle)."""
    aws = aws_clients(values.get("region"))
    region = aws.region_name
    if not region:
        raise SageMakerSetupError("no AWS region: pass --region us-east-1 or set AWS_DEFAULT_REGION")
    if aws.get_credentials() is None:
        raise SageMakerSetupError("no AWS credentials found: run `aws configure`, set AWS_PROFILE, "
                                  "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    values = {**{k: v for k, v in sdk.config_defaults().items()}, **{k: v for k, v in values.items() if v}}
    instance_type = values.get("instance_type")
    if not instance_type:
        raise SageMakerSetupError("no instance type: pass --instance-type, for example ml.g5.12xlarge")
    instance_gpus(instance_type)
    role = values.get("role") or _from_sdk("execution role", "--role arn:aws:iam::ACCOUNT:role/NAME", "role",
                                           sdk.execution_role, aws)
    if not _ROLE_ARN.match(role):
        raise SageMakerSetupError(f"--role {role!r} is not an IAM role ARN like arn:aws:iam::123456789012:role/Name")
    image_uri = values.get("image_uri") or _from_sdk("training image", "--image-uri URI", "image_uri",
                                                     sdk.default_image, region, instance_type)
    tagged = re.search(r"-py3(\d+)-?", image_uri)
    if tagged and int(tagged.group(1)) != sys.version_info[1]:
        raise SageMakerSetupError(
            f"the image {image_uri} runs Python 3.{tagged.group(1)} but this notebook runs Python "
            f"3.{sys.version_info[1]}; pickled values only load under the same minor version: choose a py3"
            f"{sys.version_info[1]} image")
    s3_root = (values.get("s3_root") or "").rstrip("/")
    if not s3_root:
        bucket = _from_sdk("--s3-root", "--s3-root s3://your-bucket/prefix", "s3_root", sdk.default_bucket, aws)
        s3_root = f"s3://{bucket}/mpi-magic"
    try:
        bucket, _ = split_s3(s3_root)
    except ValueError as exc:
        raise SageMakerSetupError(f"--s3-root: {exc}") from None
    s3 = aws.client("s3")
    _check_bucket(s3, bucket, "--s3-root")
    checkpoint_s3 = (values.get("checkpoint_s3") or "").rstrip("/") or None
    if checkpoint_s3:
        try:
            checkpoint_bucket, _ = split_s3(checkpoint_s3)
        except ValueError as exc:
            raise SageMakerSetupError(f"--checkpoint-s3: {exc}") from None
        if checkpoint_bucket != bucket:
            _check_bucket(s3, checkpoint_bucket, "--checkpoint-s3")
    settings = CloudSettings(
        region=region, role=role, image_uri=image_uri, instance_type=instance_type, s3_root=s3_root,
        volume_size=int(values.get("volume_size") or 100), max_runtime=int(values.get("max_runtime") or 86400),
        spot=bool(values.get("spot")), max_wait=values.get("max_wait"), checkpoint_s3=checkpoint_s3,
        keep_alive=values.get("keep_alive"),
        subnets=tuple(values.get("subnets") or ()), security_groups=tuple(values.get("security_groups") or ()),
        kms_key=values.get("kms_key"), tags=dict(values.get("tags") or {}), training_plan=values.get("training_plan"),
    )
    return settings, aws
