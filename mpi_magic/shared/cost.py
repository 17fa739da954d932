"""What a job's instance time is estimated to cost, and the words for it.

Neutral ground: the SageMaker backend prices its jobs with it (``backends.sagemaker.pricing``)
and the view words the figure with it, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Cost:
    """An estimate in US dollars. ``upper_bound``: the real figure is at most this (spot
    capacity is billed below the on-demand price the estimate uses)."""

    amount: float
    upper_bound: bool = False

    def __str__(self) -> str:
        return ("at most " if self.upper_bound else "about ") + dollars(self.amount)


def estimate(hourly_price: float | None, instance_seconds: float, spot: bool = False) -> Cost | None:
    """``instance_seconds`` at an on-demand ``hourly_price`` per instance; None when the price is unknown."""
    if hourly_price is None:
        return None
    return Cost(hourly_price * instance_seconds / SECONDS_PER_HOUR, upper_bound=spot)


def budget_reached(spent: Cost, budget: float) -> str:
    """Why a job or a session was stopped at its budget (``--max-cost``), as both say it."""
    return f"its cost reached --max-cost {dollars(budget)} ({spent} at list price)"


def dollars(amount: float) -> str:
    """'$0.0042', '$1.23', '$1,234.56': cents, or the first figures of a smaller amount."""
    if 0 < amount < 0.01:
        return f"${amount:.2g}"
    return f"${amount:,.2f}"

