"""A failed rank's frames and locals (shared/postmortem.py): bounded in frames, bytes and time."""

from __future__ import annotations

import pickle
import re
import threading
import time

import pytest

from mpi_magic.shared import postmortem

CELL = "<a test cell>"
SLACK = 3.0  # seconds a loaded machine (many test workers on 2 cores) may add to a capture's bound; what the
# bounds rule out, waiting on a bad local to end, takes far longer or forever


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


BAD_LOCALS = (
    "import time\n"
    "class Spinning:\n"
    "    def __repr__(self):\n"
    "        repr_calls.append(1)\n"
    "        while True:\n"
    "            pass\n"
    "class Sleepy:\n"
    "    def __getstate__(self):\n"
    "        release.wait()\n"
    "        return {}\n"
    "class Failing:\n"
    "    def __repr__(self):\n"
    "        raise RuntimeError('no repr')\n"
    "    def __reduce__(self):\n"
    "        raise TypeError('no pickle')\n"
    "def inner(item):\n"
    "    number = 7\n"
    "    raise ValueError\n"
    "spinning, sleepy, failing, word = Spinning(), Sleepy(), Failing(), 'kept'\n"
    "inner(spinning)\n"
)


def timed_capture(source: str, namespace: dict) -> tuple[dict, float]:
    exc = failure(source, namespace)
    started = time.monotonic()
    record = postmortem.capture(exc, CELL)
    return record, time.monotonic() - started


def test_a_repr_that_never_ends_or_a_pickle_that_sleeps_costs_only_itself(monkeypatch):
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 0.5)
    release, repr_calls = threading.Event(), []
    try:
        record, took = timed_capture(BAD_LOCALS, {"release": release, "repr_calls": repr_calls})
    finally:
        release.set()  # the thread left behind ends, as the rank's would when it exits
    outer, inner = (frame["locals"] for frame in record["frames"])
    assert took < 2 * 0.5 + SLACK, "each of the two bad locals cost its own time and no more"
    assert len(repr_calls) == 1, "the spinning local is given up on once, in the first frame that holds it"
    assert outer["spinning"] == inner["item"] == (postmortem.REPR, None, "<Spinning: unavailable: took longer than 0.5 s>")
    kind, data, text = outer["sleepy"]
    assert (kind, data) == (postmortem.REPR, None)
    assert re.fullmatch(r"<Sleepy object at 0x\w+> \(its value unavailable: took longer than 0\.5 s\)", text)
    assert outer["failing"][:2] == (postmortem.REPR, None) and outer["failing"][2].startswith("<Failing instance at 0x")
    assert pickle.loads(outer["word"][1]) == "kept" and pickle.loads(inner["number"][1]) == 7
    assert "Spinning" in outer and "time" in outer  # the class (by value) and the module (by name) came too


def test_a_slow_local_that_finishes_in_its_time_comes_as_its_value(monkeypatch):
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 2.0)
    record, took = timed_capture("import time\nclass Slow:\n    def __getstate__(self):\n"
                                 "        time.sleep(0.3)\n        return {'done': True}\n"
                                 "slow = Slow()\nraise ValueError\n", {})
    kind, data, text = record["frames"][0]["locals"]["slow"]
    assert kind == postmortem.VALUE and pickle.loads(data).__dict__ == {"done": True}


def test_a_repr_that_swallows_being_stopped_is_left_behind_and_the_capture_still_ends_in_time(monkeypatch):
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 0.3)
    release = threading.Event()
    source = ("class Stubborn:\n    def __repr__(self):\n        while not release.is_set():\n"
              "            try:\n                time.sleep(0.01)\n            except BaseException:\n"
              "                pass\n        return 'released'\n"
              "stubborn, after = Stubborn(), 'kept'\nraise ValueError\n")
    try:
        record, took = timed_capture(source, {"release": release, "time": time})
    finally:
        release.set()  # the thread left behind ends, as the rank's would when it exits
    assert took < 0.3 + SLACK
    frame = record["frames"][0]["locals"]
    assert frame["stubborn"][2] == "<Stubborn: unavailable: took longer than 0.3 s>"
    assert pickle.loads(frame["after"][1]) == "kept"


def test_many_bad_locals_take_the_time_for_all_of_them_at_most_and_the_rest_come_as_their_type(monkeypatch):
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 0.3)
    monkeypatch.setattr(postmortem, "TIME_LIMIT", 1.0)
    count = 40  # 12 s of their own limits: far past the time for all of them and its slack
    record, took = timed_capture("class Spinning:\n    def __repr__(self):\n        while True:\n            pass\n"
                                 + "".join(f"s{i} = Spinning()\n" for i in range(count))
                                 + "last = 1\nraise ValueError\n", {})
    assert took < 1.0 + SLACK
    frame = record["frames"][0]["locals"]
    slow, ran_out = "<Spinning: unavailable: took longer than 0.3 s>", "<{}: not brought back, the time for locals ran out>"
    assert frame["s0"][2] == slow
    assert {frame[f"s{i}"][2] for i in range(count)} == {slow, ran_out.format("Spinning")}
    assert frame["last"] == (postmortem.REPR, None, ran_out.format("int"))


def test_a_local_that_raises_while_it_is_worked_out_comes_at_once_with_what_it_raised(monkeypatch):
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 5.0)
    monkeypatch.setattr(postmortem, "TIME_LIMIT", 60.0)
    record, took = timed_capture("class Lazy:\n    def __getattr__(self, name):\n"  # a proxy that loads on use
                                 "        raise RuntimeError('not loaded yet')\n"
                                 "class Classless:\n    @property\n    def __class__(self):\n"
                                 "        raise ValueError('no class')\n"
                                 "lazy, classless, word = Lazy(), Classless(), 'kept'\nraise ValueError\n", {})
    assert took < postmortem.LOCAL_TIME_LIMIT, "neither waited for its time to run out"
    frame = record["frames"][0]["locals"]
    assert re.fullmatch(r"<\S*Lazy object at 0x\w+> \(its value unavailable: it raised RuntimeError: not loaded yet\)",
                        frame["lazy"][2])
    assert re.fullmatch(r"<\S*Classless object at 0x\w+> \(its value unavailable: it raised ValueError: no class\)",
                        frame["classless"][2])
    assert frame["lazy"][:2] == frame["classless"][:2] == (postmortem.REPR, None)
    assert pickle.loads(frame["word"][1]) == "kept"


def test_a_bad_local_costs_only_its_own_time_when_its_thread_is_slow_to_start(monkeypatch):
    """As on a loaded machine: the watch is already waiting when the thread takes up the first local."""
    monkeypatch.setattr(postmortem, "LOCAL_TIME_LIMIT", 0.5)
    work = postmortem._Worker._work

    def slow_to_start(self):
        time.sleep(0.2)
        work(self)

    monkeypatch.setattr(postmortem._Worker, "_work", slow_to_start)
    release = threading.Event()

    class Sleepy:
        def __getstate__(self):
            release.wait()
            return {}

    try:
        record, took = timed_capture("raise ValueError\n", {"sleepy": Sleepy()})
    finally:
        release.set()  # the thread left behind ends, as the rank's would when it exits
    assert took < 0.2 + 0.5 + SLACK / 2, "the sleeping local cost its own limit, not the limit for all locals"
    assert record["frames"][0]["locals"]["sleepy"][2].endswith("(its value unavailable: took longer than 0.5 s)")
