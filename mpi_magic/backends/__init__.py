"""Where ranks run. A backend submits a job and yields events; it never imports the view."""

from __future__ import annotations

from ..errors import BackendNotAvailable
from .base import Backend, BackendJob


def get_backend(name: str, config, options) -> Backend:
    """The backend called ``name``, checked to be usable here (raises before anything starts)."""
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(config)
    if name == "sagemaker":
        from .sagemaker.backend import SageMakerBackend
        from .sagemaker.settings import resolve

        settings, aws = resolve(options.cloud)
        return SageMakerBackend(settings, aws, options.requirements, config.get("live_tail"))
    raise BackendNotAvailable(f"there is no {name!r} backend; use local or sagemaker")


__all__ = ["Backend", "BackendJob", "get_backend"]
