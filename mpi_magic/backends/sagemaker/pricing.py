"""SageMaker training's on-demand list prices, shipped with the package, and what a job's
instance time costs at them: an estimate shown beside the billable time, never a bill.

The figures are USD per instance-hour for training jobs (usage type ``<REGION>-Train:<type>``)
from AWS's public price list for the ``AmazonSageMaker`` offer, publication of 2026-09-24
(https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonSageMaker/current/<region>/index.csv),
as transcribed, per region and instance type, in a public project's notes that parsed that file;
the file itself could not be fetched where this table was written. Only the figures found there
are listed: a type or region without one is shown as "cost unknown", never guessed. Prices
change; AWS's pricing page (https://aws.amazon.com/sagemaker/ai/pricing/) is the authority.

Spot training is billed below on demand at a rate that varies, so its cost is shown as an upper
bound ("at most $X"). Storage, data transfer and taxes are not included.
"""

from __future__ import annotations

import math

from ...shared.cost import SECONDS_PER_HOUR, Cost, dollars, estimate

TABLE_DATE = "2026-09-24"
BUDGET_GRACE = 30  # seconds a job may train past its budget's time before SageMaker stops it: the notebook
# stops it first, with its sentence, unless the notebook is gone

# region -> instance type -> USD per instance-hour, on demand
PRICES: dict[str, dict[str, float]] = {
    "us-east-1": {
        "ml.m5.xlarge": 0.23, "ml.m5.4xlarge": 0.922,
        "ml.g4dn.xlarge": 0.736, "ml.g5.xlarge": 1.408, "ml.g6.xlarge": 1.127,
    },
    "us-west-2": {},  # no figure found for any type
    "eu-west-1": {},  # no figure found for any type
    "ap-south-1": {
        "ml.m5.xlarge": 0.242, "ml.m5.4xlarge": 0.97,
        "ml.g4dn.xlarge": 0.811, "ml.g5.xlarge": 1.69, "ml.g6.xlarge": 1.353,
    },
}


def hourly_price(instance_type: str, region: str) -> float | None:
    """The on-demand price of one instance-hour of training; None where the table has none."""
    return PRICES.get(region, {}).get(instance_type)


def cost(instance_type: str, region: str, instance_seconds: float, spot: bool = False) -> Cost | None:
    """What ``instance_seconds`` of training on ``instance_type`` in ``region`` cost at list price
    (an upper bound with ``spot``); None where the price is unknown. ``str(cost)`` words it."""
    return estimate(hourly_price(instance_type, region), instance_seconds, spot)


def budget_runtime(max_cost: float, instance_type: str, region: str, instances: int) -> int | None:
    """The MaxRuntimeInSeconds that keeps a job within ``max_cost`` when no notebook watches it any
    more: the seconds of training that cost that much at list price, and ``BUDGET_GRACE``; None
    where the price is unknown."""
    hourly = hourly_price(instance_type, region)
    if hourly is None:
        return None
    return math.ceil(max_cost / (hourly * instances) * SECONDS_PER_HOUR) + BUDGET_GRACE


def plan_line(training_plan: str) -> str:
    """What --dry-run says about the price of a job on a training plan's reserved capacity."""
    return (f"Price: the job runs on training plan {training_plan.rpartition('/')[2]}'s reserved capacity, paid for "
            "when the plan was bought: no charge by the hour for its instances")


def price_line(instance_type: str, region: str, instances: int, spot: bool = False) -> str:
    """What --dry-run says about the price before anything is paid for."""
    hourly = hourly_price(instance_type, region)
    if hourly is None:
        return f"Price: mpi_magic's table has none for {instance_type} in {region}; see the SageMaker pricing page"
    per_hour = cost(instance_type, region, instances * SECONDS_PER_HOUR, spot)
    return (f"Price: {instance_type} in {region} lists at {dollars(hourly)} per instance-hour on demand "
            f"(AWS price list of {TABLE_DATE}); {instances} instance{'s' if instances != 1 else ''}: "
            f"{per_hour} an hour")
