"""The SageMaker jobs started from this machine, remembered for ``%mpirun_jobs``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ...shared import jobdir
from ...options import Config
from .aws import import_boto3

JOBS_RECORD = "sagemaker_jobs.json"


def _record_path() -> str:
    return os.path.join(Config().get("cache_dir"), JOBS_RECORD)


def record_job(name: str, region: str) -> None:
    """Remember a job this user started, for %mpirun_jobs (newest 100 kept)."""
    path = _record_path()
    try:
        with open(path) as f:
            records = json.load(f)
    except (OSError, ValueError):
        records = []
    records = ([{"name": name, "region": region, "created": time.time()}] + records)[:100]
    jobdir.make_private_dirs(os.path.dirname(path))
    with jobdir.open_private(path) as f:
        json.dump(records, f)


def recent_jobs(limit: int = 20) -> list[dict]:
    """The jobs recorded here, newest first, with their status from DescribeTrainingJob."""
    try:
        with open(_record_path()) as f:
            records = json.load(f)[:limit]
    except (OSError, ValueError):
        return []
    boto3 = import_boto3()
    clients: dict[str, Any] = {}
    for record in records:
        client = clients.setdefault(record["region"], boto3.client("sagemaker", region_name=record["region"]))
        try:
            described = client.describe_training_job(TrainingJobName=record["name"])
            record["status"] = described["TrainingJobStatus"]
            record["secondary"] = described.get("SecondaryStatus", "")
        except Exception as exc:  # noqa: BLE001 - shown in the listing
            record["status"], record["secondary"] = "unknown", str(exc)[:60]
    return records
