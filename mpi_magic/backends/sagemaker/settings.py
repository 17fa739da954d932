"""A SageMaker job's settings and the facts about instance types they are checked against.

Light to import: ``options`` reads the GPU table while parsing a cell's line, before anyone
knows a cloud job will run. boto3 and botocore are imported only when settings are resolved.
"""

from __future__ import annotations

import difflib
import re
import sys
from typing import Any, Callable

from ...errors import BackendNotAvailable, SageMakerSetupError
from . import sdk
from ...layout import split_s3
from .request import CloudSettings

_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")

# GPUs per instance of the types people train on: the default processes per instance. Other valid
# types run too (with --gpus); names that are not training instance types are refused.
GPUS = {
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8, "ml.g6.xlarge": 1, "ml.g6.12xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.trn1.32xlarge": 0, "ml.m5.large": 0, "ml.m5.xlarge": 0, "ml.m5.2xlarge": 0, "ml.m5.4xlarge": 0,
    "ml.m5.12xlarge": 0, "ml.m5.24xlarge": 0, "ml.c5.xlarge": 0, "ml.c5.4xlarge": 0, "ml.c5.18xlarge": 0,
}


def import_boto3() -> Any:
    """boto3, or the one sentence that says which extra installs it."""
    try:
        import boto3
    except ImportError:
        raise BackendNotAvailable(
            "the sagemaker backend needs boto3, which is not installed: pip install 'mpi-magic[sagemaker]'"
        ) from None
    return boto3


def training_instance_types() -> list[str]:
    """Every training instance type in botocore's SageMaker service model."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return list(model.shape_for("TrainingInstanceType").enum)


def instance_gpus(instance_type: str) -> int | None:
    """GPUs of a known type; None for a valid type mpi_magic has no count for; an error otherwise."""
    known = training_instance_types()
    if instance_type not in known:
        close = difflib.get_close_matches(instance_type, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; for example --instance-type ml.g5.12xlarge"
        raise SageMakerSetupError(f"{instance_type!r} is not a SageMaker training instance type{hint}")
    return GPUS.get(instance_type)


def _from_sdk(find, *args):
    """A default the SageMaker SDK finds; a clear sentence when it cannot."""
    *arguments, option = args
    try:
        return find(*arguments)
    except (sdk.SdkMissing, LookupError) as exc:
        raise SageMakerSetupError(f"{exc}; or pass {option}") from None
    except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds; the user needs the option
        raise SageMakerSetupError(f"the SageMaker SDK could not find a default ({type(exc).__name__}: {exc}); "
                                  f"pass {option}") from None


def resolve(values: dict) -> tuple[CloudSettings, object]:
    """Settings from the cell's options and defaults, checked; (settings, boto3 session)."""
    boto3 = import_boto3()
    session = boto3.session.Session(region_name=values.get("region"))
    region = session.region_name
    if not region:
        raise SageMakerSetupError("no AWS region: pass --region us-east-1 or set AWS_DEFAULT_REGION")
    if session.get_credentials() is None:
        raise SageMakerSetupError("no AWS credentials found: run `aws configure`, set AWS_PROFILE, "
                                  "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    values = {**{k: v for k, v in sdk.config_defaults().items()}, **{k: v for k, v in values.items() if v}}
    instance_type = values.get("instance_type")
    if not instance_type:
        raise SageMakerSetupError("no instance type: pass --instance-type, for example ml.g5.12xlarge")
    instance_gpus(instance_type)
    role = values.get("role") or _from_sdk(sdk.execution_role, session, "--role arn:aws:iam::ACCOUNT:role/NAME")
    if not role:
        raise SageMakerSetupError("no execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME "
                                  "(or set it once with %mpirun_config role=...)")
    if not _ROLE_ARN.match(role):
        raise SageMakerSetupError(f"--role {role!r} is not an IAM role ARN like arn:aws:iam::123456789012:role/Name")
    image_uri = values.get("image_uri") or _from_sdk(sdk.default_image, region, instance_type, "--image-uri")
    tagged = re.search(r"-py3(\d+)-?", image_uri)
    if tagged and int(tagged.group(1)) != sys.version_info[1]:
        raise SageMakerSetupError(
            f"the image {image_uri} runs Python 3.{tagged.group(1)} but this notebook runs Python "
            f"3.{sys.version_info[1]}; pickled values only load under the same minor version: choose a py3"
            f"{sys.version_info[1]} image")
    s3_root = (values.get("s3_root") or "").rstrip("/")
    if not s3_root:
        s3_root = f"s3://{_from_sdk(sdk.default_bucket, session, '--s3-root s3://your-bucket/prefix')}/mpi-magic"
    try:
        bucket, _ = split_s3(s3_root)
    except ValueError as exc:
        raise SageMakerSetupError(f"--s3-root: {exc}") from None
    s3 = session.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - botocore raises several kinds here
        raise SageMakerSetupError(f"the bucket {bucket!r} of --s3-root cannot be used ({exc}); "
                                  "create it or pass another --s3-root") from None
    settings = CloudSettings(
        region=region, role=role, image_uri=image_uri, instance_type=instance_type, s3_root=s3_root,
        volume_size=int(values.get("volume_size") or 100), max_runtime=int(values.get("max_runtime") or 86400),
        spot=bool(values.get("spot")), max_wait=values.get("max_wait"), keep_alive=values.get("keep_alive"),
        subnets=tuple(values.get("subnets") or ()), security_groups=tuple(values.get("security_groups") or ()),
        kms_key=values.get("kms_key"), tags=dict(values.get("tags") or {}),
    )
    return settings, session
