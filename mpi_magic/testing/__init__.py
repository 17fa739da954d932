"""Stand-ins for what cannot run on a developer machine (AWS, a second host) and scripted
backends for tests; shipped so that users can rehearse their notebooks offline too."""

from __future__ import annotations

__all__ = ["rehearse"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .local_aws import rehearse


def __getattr__(name: str):
    """``rehearse``, imported from its module on first use (PEP 562), so that ``python -m
    mpi_magic.testing.local_aws`` does not find that module imported already."""
    if name != "rehearse":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .local_aws import rehearse

    return rehearse
