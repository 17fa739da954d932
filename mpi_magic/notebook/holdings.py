"""What a session's ranks hold for each notebook name, so that a value crosses once.

For every name the ranks' globals have, the notebook remembers either the content digest of
the value it sent (``Sent``), or that the ranks' value is their own (``RanksOwn``: the cell
assigned it), together with the notebook object that must not overwrite it: the value that
came back, or whatever the notebook had when the value stayed on the ranks. A cell then
sends a name only when the notebook's value differs from what the ranks hold.

Checking the content costs a pass over the value's bytes (about 0.5 s per GiB here). It is
skipped when the value is the very object sent and no other notebook code has run since:
only code changes a value, and every cell that is not a ``%%mpirun_remote`` cell counts
(``notebook_ran``). A thread of the notebook's that changes a sent value in place between two
session cells is the one case this cannot see: rebind the name, or run any cell, to have it
checked again.
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..shared import payload

ABSENT = object()  # the notebook had no value under the name


def content_digest(packed: payload.Packed) -> str:
    """SHA-1 of a value's pickle and its buffers: a change check, not a signature."""
    hasher = hashlib.sha1(usedforsecurity=False)
    hasher.update(packed.data)
    for buffer in packed.buffers:
        hasher.update(buffer)
    return hasher.hexdigest()


class _Ref:
    """The identity of a notebook object, without keeping it alive where a weak reference can do."""

    def __init__(self, value: Any):
        self._id = id(value)
        try:
            self._weak: Callable[[], Any] | None = weakref.ref(value)
            self._strong = None
        except TypeError:  # dicts, lists, ints: held, so their id cannot be reused
            self._weak, self._strong = None, value

    def is_(self, value: Any) -> bool:
        if self._weak is not None:
            return self._weak() is value
        return self._strong is value


@dataclass
class Sent:
    digest: str
    ref: _Ref
    epoch: int  # the notebook's epoch when the digest was last known to match


@dataclass
class RanksOwn:
    guard: _Ref  # the notebook's object at the time; a new binding replaces the ranks' value


@dataclass
class Selection:
    send: list[payload.Packed] = field(default_factory=list)
    same: list[str] = field(default_factory=list)  # the ranks hold this content already
    records: dict[str, Sent] = field(default_factory=dict)


class Holdings:
    def __init__(self) -> None:
        self._held: dict[str, Sent | RanksOwn] = {}
        self.epoch = 0
        self.bytes_sent = 0

    def notebook_ran(self) -> None:
        """Notebook code that is not a session cell ran: any value may have changed in place."""
        self.epoch += 1

    def keeps(self, name: str, value: Any) -> bool:
        """True when the ranks' value for ``name`` stands without looking at the content:
        their own value the notebook has not rebound, or the object sent, untouched since."""
        held = self._held.get(name)
        if isinstance(held, RanksOwn):
            return held.guard.is_(value)
        return isinstance(held, Sent) and held.epoch == self.epoch and held.ref.is_(value)

    def select(self, packed: list[payload.Packed], namespace: Mapping[str, Any]) -> Selection:
        """Which of the packed values the ranks lack (by content), to send."""
        selection = Selection()
        for item in packed:
            digest = content_digest(item)
            held = self._held.get(item.name)
            if isinstance(held, Sent) and held.digest == digest:
                held.ref, held.epoch = _Ref(namespace[item.name]), self.epoch
                selection.same.append(item.name)
            else:
                selection.send.append(item)
                selection.records[item.name] = Sent(digest, _Ref(namespace[item.name]), self.epoch)
        return selection

    def delivered(self, selection: Selection) -> None:
        """The ranks loaded what ``selection`` sent."""
        self._held.update(selection.records)
        self.bytes_sent += sum(item.size for item in selection.send)

    def assigned(self, names: list[str], returned: Mapping[str, Any], stayed: list[str],
                 namespace: Mapping[str, Any]) -> None:
        """After a cell that succeeded: the ranks' values for ``names`` are their own now.
        Those that came back are guarded by the returned object, those that stayed on the ranks
        by the notebook's binding; a name the ranks do not have (deleted, never bound) is forgotten."""
        for name in names:
            if name in returned:
                self._held[name] = RanksOwn(_Ref(returned[name]))
            elif name in stayed:
                self._held[name] = RanksOwn(_Ref(namespace.get(name, ABSENT)))
            else:
                self._held.pop(name, None)

    def held_names(self) -> list[str]:
        return sorted(self._held)
