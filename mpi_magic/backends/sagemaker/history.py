"""The SageMaker jobs started from this machine, remembered for ``%mpirun_jobs``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ...shared import envvars, jobdir
from ...shared.cost import estimate
from ...options import Config
from .aws import import_boto3
from .training_job import billing_of

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
    """The jobs recorded here, newest first, with their status from DescribeTrainingJob, and for
    each that still runs a ``warning`` saying what it has cost so far and how to reach it."""
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
            if record["status"] in ("InProgress", "Stopping"):
                record["warning"] = still_running(described, record["region"])
        except Exception as exc:  # noqa: BLE001 - shown in the listing
            record["status"], record["secondary"] = "unknown", str(exc)[:60]
    return records


def still_running(described: dict, region: str) -> str:
    """A job or session that still runs, what it has cost so far, and how to reach it from here."""
    name, config = described["TrainingJobName"], described["ResourceConfig"]
    billing = billing_of(described, region)
    shape = f"({config['InstanceCount']} x {config['InstanceType']})"
    if billing is None:
        spent = f"not billed yet {shape}"
    elif billing.training_plan:
        spent = f"on its training plan's capacity {shape}"
    else:
        cost = estimate(billing.hourly_price, billing.instance_seconds, billing.spot)
        spent = (f"{cost} so far at list price {shape}" if cost is not None else
                 f"{billing.instance_seconds:.0f} instance-seconds so far {shape}, at a price mpi_magic does not know")
    if described.get("Environment", {}).get(envvars.SESSION_URI):
        return f"session {name} still runs, {spent}; %mpirun_session attach {name} takes it over, to stop it"
    return f"job {name} still runs, {spent}; %mpirun_attach {name} follows it (an interrupt there stops it)"
