"""boto3 and botocore as the SageMaker backend uses them: imported only when a cell goes to SageMaker,
and their service models read once per kernel."""

from __future__ import annotations

from typing import Any

from ...errors import BackendNotAvailable


def import_boto3() -> Any:
    """boto3, or the one sentence that says which extra installs it."""
    try:
        import boto3
    except ImportError:
        raise BackendNotAvailable(
            "the sagemaker backend needs boto3, which is not installed: pip install 'mpi-magic[sagemaker]'"
        ) from None
    return boto3


# botocore's loader of service models, shared by the sessions below once the first made it
_loader: Any = None


def _botocore_session() -> Any:
    global _loader
    import botocore.session

    session = botocore.session.get_session()
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


def aws_session(region: str | None = None) -> Any:
    """A boto3 session for one cell. Credentials, region and endpoints are read afresh, as they may
    have changed since the last cell; botocore's service models, megabytes of JSON that take a
    third of a second to parse, are read once, by the loader every such session shares."""
    boto3 = import_boto3()
    session = boto3.session.Session(botocore_session=_botocore_session(), region_name=region)
    _loader.search_paths[:] = list(dict.fromkeys(_loader.search_paths))  # boto3 adds its folder again each time
    return session


def service_model(name: str) -> Any:
    """botocore's model of one AWS service, from the shared loader."""
    import_boto3()
    return _botocore_session().get_service_model(name)
