"""Defaults only the SageMaker SDK knows: the training image for this Python and region, the
execution role (in SageMaker Studio), the session's default bucket, and the SDK's defaults
configuration file. Imported only when one of them is needed: importing the SDK takes seconds.
"""

from __future__ import annotations

import sys

from ...errors import INSTALL_SAGEMAKER


class SdkMissing(ImportError):
    pass


def _need_sdk(what: str):
    try:
        import sagemaker.core  # noqa: F401
    except ImportError:
        raise SdkMissing(
            f"{what} comes from the SageMaker SDK, which is not installed: {INSTALL_SAGEMAKER}"
        ) from None


def default_image(region: str, instance_type: str, minor: int = sys.version_info[1]) -> str:
    """The newest SageMaker PyTorch training image for Python 3.<minor> in ``region``."""
    _need_sdk("the default --image-uri")
    from sagemaker.core import image_uris

    versions = image_uris.config_for_framework("pytorch")["training"]["versions"]
    python = f"py3{minor}"
    candidates = [v for v, spec in versions.items() if python in spec.get("py_versions", [])]
    if not candidates:
        raise LookupError(f"the SageMaker SDK knows no PyTorch training image for Python 3.{minor}")
    newest = max(candidates, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
    return image_uris.retrieve("pytorch", region=region, version=newest, py_version=python,
                               instance_type=instance_type, image_scope="training")


def _session(boto_session):
    from sagemaker.core.helper.session_helper import Session

    return Session(boto_session=boto_session)


def execution_role(boto_session) -> str | None:
    """The role these credentials act as, if they are a role (as in SageMaker Studio)."""
    _need_sdk("the default --role")
    from sagemaker.core.helper.session_helper import get_execution_role

    try:
        return get_execution_role(_session(boto_session))
    except ValueError:
        return None


def default_bucket(boto_session) -> str:
    """The session's default bucket (sagemaker-<region>-<account>), made if missing."""
    _need_sdk("the default --s3-root")
    return _session(boto_session).default_bucket()


def _config_files() -> list[str]:
    """Where the SDK looks for its configuration (its own defaults and override variables)."""
    import os

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
