"""A failed rank's frames and locals (shared/postmortem.py): bounded in frames, bytes and time."""

from __future__ import annotations

import pickle

import pytest

from mpi_magic.shared import postmortem

CELL = "<a test cell>"


def failure(source: str, namespace: dict | None = None) -> BaseException:
    namespace = {} if namespace is None else namespace
    try:
        exec(compile(source, CELL, "exec"), namespace)  # noqa: S102
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("the source did not raise")


def test_frames_start_at_the_cell_and_the_innermost_are_kept_when_there_are_too_many():
    exc = failure("def down(n):\n    return down(n - 1) if n else 1 / 0\ndown(200)\n")
    record = postmortem.capture(exc, CELL)
    assert len(record["frames"]) == postmortem.FRAMES_LIMIT
    assert record["left_out"] == 202 - postmortem.FRAMES_LIMIT  # the cell's own frame and 201 calls
    kind, data, text = record["frames"][-1]["locals"]["n"]
    assert (kind, pickle.loads(data), text) == (postmortem.VALUE, 0, "0"), "the innermost call's n"
    assert (record["error_type"], record["message"]) == ("ZeroDivisionError", "division by zero")


def test_values_come_within_the_total_budget_and_the_rest_as_reprs(monkeypatch):
    monkeypatch.setattr(postmortem, "TOTAL_LIMIT", 3 * 901_000)
    exc = failure("".join(f"v{i} = bytes(900_000)\n" for i in range(5)) + "raise ValueError\n")
    kinds = [entry[0] for name, entry in sorted(postmortem.capture(exc, CELL)["frames"][0]["locals"].items())]
    assert kinds == [postmortem.VALUE] * 3 + [postmortem.REPR] * 2


def test_past_the_time_limit_locals_come_as_their_type_alone(monkeypatch):
    monkeypatch.setattr(postmortem, "TIME_LIMIT", -1.0)
    exc = failure("x = 1\nraise ValueError\n")
    kind, data, text = postmortem.capture(exc, CELL)["frames"][0]["locals"]["x"]
    assert (kind, data) == (postmortem.REPR, None) and "the time for locals ran out" in text


def test_a_record_is_read_only_with_the_digest_it_was_written_with(tmp_path):
    path = str(tmp_path / "results" / "rank-0.debug")
    digest = postmortem.write(path, postmortem.capture(failure("raise KeyError('k')\n"), CELL))
    assert postmortem.read(path, digest)["error_type"] == "KeyError"
    with pytest.raises(ValueError, match="checksum differs"):
        postmortem.read(path, "0" * 64)
