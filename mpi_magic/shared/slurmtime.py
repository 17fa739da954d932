"""Durations as Slurm writes them (``sbatch --time``, ``sinfo``'s limits, ``squeue``'s time left)."""

from __future__ import annotations

import re

_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|"
                   r"(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")


def seconds(text: str) -> float | None:
    """A Slurm time in seconds; None for no limit (UNLIMITED, infinite, NOT_SET, INVALID).
    "30" is minutes, "30:00" minutes:seconds, "1:00:00" hours:minutes:seconds, "2-12" days-hours."""
    match = _TIME.match(text.strip())
    if match is None:
        return None
    if match["days"] is not None:
        return ((int(match["days"]) * 24 + int(match["dh"])) * 60 + int(match["dm"] or 0)) * 60 + int(match["ds"] or 0)
    a, b, c = match["a"], match["b"], match["c"]
    if c is not None:
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:
        return int(a) * 60 + int(b)
    return int(a) * 60


def clock(seconds_left: float) -> str:
    """3725 -> '1:02:05', 65 -> '1:05', 90000 -> '1-01:00:00'."""
    s = max(0, int(seconds_left))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    return f"{hours}:{minutes:02d}:{s:02d}" if hours else f"{minutes}:{s:02d}"
