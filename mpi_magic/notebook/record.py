"""A job's events, kept in its folder as they arrive (``logs/events.jsonl``), so that the job can be
reopened after the kernel that followed it has gone (``Job.load``): its model is folded again from
them, not read from a second copy of its state.

The first line says what the model was made with; each other line is one event and when it came,
in seconds since the job began by the notebook's clock. The ranks' output is not repeated here:
it is in the job's logs, whose last lines the reopened job reads. The record stays small: a
bar's progress and a rank's resources are kept at most twice a second (a bar's start, end and
reset, and a rank's new peak, always; the latest when the job ends), stacks sent through the log
only as the roll-call made of them, and past ``LIMIT`` bytes only what stood at the end.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Iterator

from ..shared import events

FILE = "events.jsonl"  # in the job folder's logs/
VERSION = 1
THIN_SECONDS = 0.5  # a bar's progress and a rank's resources: at most one kept per this (the model looks as often)
LIMIT = 32 << 20  # bytes; past them only what stands at the end is kept

_CLASSES = {cls.__name__: cls for cls in (*typing.get_args(events.Event), events.CellEnded)}
_IN_THE_LOGS = (events.Output, events.LauncherOutput)  # the logs hold them already
_UNKEPT = (*_IN_THE_LOGS, events.RankStacks)  # kept as the roll-call made of them
_THINNED = (events.Progress, events.Resources, events.Metrics)


def header(name: str, backend: str, world_size: int, procs_per_instance: int, stall_after: float) -> str:
    """The record's first line (without its newline): what ``JobModel`` was made with."""
    return _line({"record": VERSION, "name": name, "backend": backend, "world_size": world_size,
                  "procs_per_instance": procs_per_instance, "stall_after": stall_after})


class Recorder:
    """Turns each event the model folds into a record line, thinning the frequent ones;
    ``write(line)`` takes each line (without its newline), in order."""

    def __init__(self, write: typing.Callable[[str], None]):
        self.write = write
        self.size = 0
        self.full = False
        self._kept_at: dict[tuple, float] = {}  # when the last of each bar's progress (or rank's resources) was kept
        self._kept: dict[tuple, events.Event] = {}
        self._held: dict[tuple, tuple[float, events.Event]] = {}  # the latest not kept yet

    def __call__(self, event: events.Event, at: float) -> None:
        if isinstance(event, _UNKEPT):
            return
        if isinstance(event, _THINNED):
            key = (type(event).__name__, event.rank, getattr(event, "bar", 0))
            if self.full or not self._worth_keeping(key, event, at):
                self._held[key] = (at, self._standing(key, event))
                return
            self._held.pop(key, None)
            self._keep(key, event, at)
            return
        if not self.full or isinstance(event, events.LauncherExited):
            for key, (held_at, held) in list(self._held.items()):
                self._keep(key, held, held_at)
            self._held.clear()
        self._put(event, at)

    def _worth_keeping(self, key: tuple, event: events.Event, at: float) -> bool:
        last = self._kept.get(key)
        if last is None or at - self._kept_at[key] >= THIN_SECONDS or isinstance(event, events.Metrics):
            return True
        if isinstance(event, events.Progress):
            assert isinstance(last, events.Progress)
            return event.closed or event.n < last.n or event.total != last.total  # a bar's end or reset, a new total
        assert isinstance(event, events.Resources) and isinstance(last, events.Resources)
        return (event.rss or 0) > (last.rss or 0) or (event.gpu_memory or 0) > (last.gpu_memory or 0)  # a new peak

    def _standing(self, key: tuple, event: events.Event) -> events.Event:
        """What stands for ``event`` and those held before it: a bar's or a rank's latest, and of a
        rank's metrics (held only past ``LIMIT``) the latest point of each series."""
        if not isinstance(event, events.Metrics):
            return event
        held = self._held.get(key)
        points = dict(held[1].points) if held and isinstance(held[1], events.Metrics) else {}
        points.update({name: series[-1:] for name, series in event.points.items() if series})
        return dataclasses.replace(event, points=points)

    def _keep(self, key: tuple, event: events.Event, at: float) -> None:
        self._kept_at[key], self._kept[key] = at, event
        self._put(event, at)

    def _put(self, event: events.Event, at: float) -> None:
        line = _line({"at": round(at, 6), "k": type(event).__name__, **vars(event)})
        self.size += len(line)
        self.write(line)
        if not self.full and self.size > LIMIT:
            self.full = True
            self._put(events.Note(f"the job's record reached {LIMIT >> 20} MiB at {at:.0f}s: its progress, resources "
                                  "and metrics after that were kept as they stood at the end"), at)


def _line(fields: dict) -> str:
    return json.dumps(fields, separators=(",", ":"), default=str)


class RecordError(ValueError):
    """A job folder has no record to reopen the job from, or one that cannot be read (one sentence)."""


def read(job_dir: str) -> tuple[dict, Iterator[tuple[float, events.Event]]]:
    """The record's header, and its events with when each came; ``RecordError`` where there is none."""
    path = os.path.join(job_dir, "logs", FILE)
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path} is missing: the job ran before jobs were recorded, or its folder was "
                          "emptied") from None
    first = f.readline()
    try:
        head = json.loads(first)
        if head.get("record") != VERSION:
            raise ValueError
    except ValueError:
        f.close()
        raise RecordError(f"{path} is not a job record this version of mpi_magic reads") from None
    return head, _events(f, path)


def _events(f, path: str) -> Iterator[tuple[float, events.Event]]:
    """Each event of the open record ``f``; ``RecordError`` at one whose fields another version wrote."""
    with f:
        for line in f:
            try:
                fields = json.loads(line)
                at, cls = fields.pop("at"), _CLASSES[fields.pop("k")]
            except (ValueError, KeyError):
                continue  # a line cut short when the kernel that wrote it died
            if issubclass(cls, events.LauncherExited):
                fields["reports"] = {int(rank): text for rank, text in fields.get("reports", {}).items()}
            try:
                event = cls(**fields)
            except TypeError:
                raise RecordError(f"{path} holds a {cls.__name__} event this version of mpi_magic does not read "
                                  "(another version wrote it)") from None
            yield at, event
