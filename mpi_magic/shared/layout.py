"""Where a job's results are, and how they are named: written by the ranks, read by the notebook.

A job folder holds ``results/rank-N.bin`` (and a failed rank's ``rank-N.debug``); a SageMaker
job's ranks upload theirs to ``<results URI>/rank-N.bin``. Standard library only: the rank runtime imports it too.
"""

from __future__ import annotations

import os

VALUE_NAME = "<value>"  # the cell's value among its results; not an identifier, so no variable collides


RESULTS = "bin"  # what a rank's cell assigned
POST_MORTEM = "debug"  # a failed rank's frames and their locals (shared/postmortem.py)


def result_file(rank: int, kind: str = RESULTS) -> str:
    return f"rank-{rank}.{kind}"


def result_path(job_dir: str, rank: int, kind: str = RESULTS) -> str:
    return os.path.join(job_dir, "results", result_file(rank, kind))


def result_uri(results_uri: str, rank: int, kind: str = RESULTS) -> str:
    """One rank's own key under a job's results prefix: no rank overwrites another's."""
    return f"{results_uri.rstrip('/')}/{result_file(rank, kind)}"


def stacks_request_uri(results_uri: str) -> str:
    """Where the notebook asks a SageMaker job's ranks for their stacks: the leader watches it."""
    return f"{results_uri.rstrip('/')}/stacks.request"


def split_s3(uri: str) -> tuple[str, str]:
    """('bucket', 'key/prefix') of 's3://bucket/key/prefix'."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// address")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key
