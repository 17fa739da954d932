"""Defaults only the SageMaker SDK knows: the training image for this Python and region, the
execution role (in SageMaker Studio), the session's default bucket, and the SDK's defaults
configuration file. Imported only when one of them is needed: importing the SDK takes seconds.
"""

from __future__ import annotations

import os
import re
import sys

from .aws import INSTALL_SAGEMAKER


STUDIO_METADATA = "/opt/ml/metadata/resource-metadata.json"  # where the SDK reads SageMaker Studio's role
# A default the SDK cannot find at once is not worth waiting for: its AWS calls are tried once and give
# up within seconds, where botocore would retry with backoff (6 s before saying STS cannot be reached).
QUICK_CALLS = {"connect_timeout": 3, "read_timeout": 10, "retries": {"total_max_attempts": 1}}
_NOT_INSTALLED = f"comes from the SageMaker SDK, which is not installed ({INSTALL_SAGEMAKER})"


class SdkMissing(ImportError):
    pass


class NoDefault(LookupError):
    """The SDK looked for a default and found none; the message says where it looked."""


def _need_sdk(default: str):
    try:
        import sagemaker.core  # noqa: F401
    except ImportError:
        raise SdkMissing(f"the default ({default}) {_NOT_INSTALLED}") from None


def default_image(region: str, instance_type: str, minor: int = sys.version_info[1]) -> str:
    """The newest SageMaker PyTorch training image for Python 3.<minor> in ``region``."""
    _need_sdk("the newest PyTorch training image for this Python")
    from sagemaker.core import image_uris

    versions = image_uris.config_for_framework("pytorch")["training"]["versions"]
    python = f"py3{minor}"
    candidates = [v for v, spec in versions.items() if python in spec.get("py_versions", [])]
    if not candidates:
        raise NoDefault(f"the SageMaker SDK knows no PyTorch training image for Python 3.{minor}")
    newest = max(candidates, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    return image_uris.retrieve("pytorch", region=region, version=newest, py_version=python,
                               instance_type=instance_type, image_scope="training")


def _session(boto_session):
    """The SDK's session, on a boto3 session of its own whose calls are ``QUICK_CALLS``."""
    from botocore.config import Config
    from sagemaker.core.helper.session_helper import Session

    from .aws import aws_clients

    return Session(boto_session=aws_clients(boto_session.region_name, Config(**QUICK_CALLS)))


def execution_role(boto_session) -> str:
    """SageMaker Studio's role (or a notebook instance's), else the role these credentials act as."""
    _need_sdk("SageMaker Studio's role")
    from botocore.exceptions import BotoCoreError, ClientError
    from sagemaker.core.helper.session_helper import get_execution_role

    looked = (f"the SageMaker SDK looks for SageMaker Studio's role in {STUDIO_METADATA}"
              f"{'' if os.path.exists(STUDIO_METADATA) else ' (not on this machine)'}, then asks STS which role "
              "these credentials act as")
    try:
        return get_execution_role(_session(boto_session))
    except ValueError as exc:  # the SDK's "The current AWS identity is not a role: ARN, therefore ..."
        identity = re.search(r"arn:[^\s,]+", str(exc))
        raise NoDefault(f"{looked}: they are not a role's ({identity[0] if identity else exc})") from None
    except (BotoCoreError, ClientError) as exc:
        raise NoDefault(f"{looked}, and that failed ({exc})") from None


def default_bucket(boto_session) -> str:
    """The session's default bucket (sagemaker-<region>-<account>), made if missing."""
    _need_sdk("the bucket sagemaker-REGION-ACCOUNT")
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _session(boto_session).default_bucket()
    except (BotoCoreError, ClientError) as exc:
        raise NoDefault(f"the SageMaker SDK makes its default bucket, sagemaker-{boto_session.region_name}-ACCOUNT, "
                        f"with the account's number from STS, and that failed ({exc})") from None


def _config_files() -> list[str]:
    """Where the SDK looks for its configuration (its own defaults and override variables)."""
    return [path for path in (
        os.environ.get("SAGEMAKER_ADMIN_CONFIG_OVERRIDE", "/etc/xdg/sagemaker/config.yaml"),
        os.environ.get("SAGEMAKER_USER_CONFIG_OVERRIDE",
                       os.path.join(os.path.expanduser("~"), ".config", "sagemaker", "config.yaml")),
    ) if os.path.exists(path)]


def config_defaults() -> dict:
    """Training-job defaults from the SDK's configuration file, where the user keeps one."""
    if not _config_files():
        return {}  # no file: do not pay for importing the SDK
    try:
        from sagemaker.core.config.config import load_sagemaker_config
    except ImportError:
        return {}
    config = load_sagemaker_config() or {}
    sagemaker = config.get("SageMaker", {})
    training = sagemaker.get("TrainingJob", {})
    bucket = sagemaker.get("PythonSDK", {}).get("Modules", {}).get("Session", {}).get("DefaultS3Bucket")
    defaults = {
        "role": training.get("RoleArn"),
        "subnets": tuple(training.get("VpcConfig", {}).get("Subnets", ())),
        "security_groups": tuple(training.get("VpcConfig", {}).get("SecurityGroupIds", ())),
        "kms_key": training.get("OutputDataConfig", {}).get("KmsKeyId"),
        "s3_root": f"s3://{bucket}/mpi-magic" if bucket else None,
        "tags": {t["Key"]: t["Value"] for t in training.get("Tags", [])},
    }
    return {k: v for k, v in defaults.items() if v}
