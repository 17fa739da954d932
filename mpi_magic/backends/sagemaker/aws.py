"""boto3 and botocore as the SageMaker backend uses them: imported only when a cell goes to SageMaker,
and their service models read once per kernel."""

from __future__ import annotations

from typing import Any

from ...errors import BackendNotAvailable

# What a sentence about a missing package of this backend says to run: the packages of the
# ``sagemaker`` extra (pyproject.toml), by their names on the package index, where mpi_magic is not.
INSTALL_SAGEMAKER = "pip install 'boto3>=1.34' 'sagemaker>=3' 'cryptography>=42'"


def import_boto3() -> Any:
    """boto3, or the one sentence that says which extra installs it."""
    try:
        import boto3
    except ImportError:
        raise BackendNotAvailable(
            f"the sagemaker backend needs boto3, which is not installed: {INSTALL_SAGEMAKER}"
        ) from None
    return boto3


# botocore's handle kept for its loader of service models, which every handle below shares
_models: Any = None


def _models_session() -> Any:
    global _models
    if _models is None:
        import botocore.session

        _models = botocore.session.get_session()
    return _models


def aws_clients(region: str | None = None, client_config: Any = None) -> Any:
    """boto3's handle (a ``boto3.Session``) for one cell. Credentials, region and endpoints are read afresh, as they may
    have changed since the last cell; botocore's service models, megabytes of JSON that take a
    third of a second to parse, are read once, by the loader every such handle shares. ``client_config``
    (a ``botocore.config.Config``): what every client of the handle gets, unless it is given its own."""
    boto3 = import_boto3()
    import botocore.session

    loader = _models_session().get_component("data_loader")
    core = botocore.session.get_session()
    core.register_component("data_loader", loader)
    core.set_default_client_config(client_config)
    session = boto3.session.Session(botocore_session=core, region_name=region)
    loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))  # boto3 adds its folder again each time
    return session


def service_model(name: str) -> Any:
    """botocore's model of one AWS service, from the shared loader."""
    import_boto3()
    return _models_session().get_service_model(name)
