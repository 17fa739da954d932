"""A session cell's end from its end record beside the log (``cell_end.CellEnds``): each output line
and each event is passed on once, whichever brings it first; a record that cannot stand for the log
is set aside. Events are real wire lines decoded by the job's decoder."""

from __future__ import annotations

import base64

from mpi_magic.backends.sagemaker.cell_end import CellEnds
from mpi_magic.shared import wire
from mpi_magic.shared.events import Output, RankFinished, RankReady, StreamDecoder
from mpi_magic.shared.layout import RESULTS, result_path

TOKEN = "0123456789abcdef"


def _events(rank: int) -> list[str]:
    lines: list[str] = []
    emitter = wire.Emitter(rank, lambda line: lines.append(line.rstrip("\n")), TOKEN)
    emitter.emit(wire.FINISHED, ok=True)
    emitter.emit(wire.READY, cell=1)
    return lines


def _record(stdout: list[str], dropped: int = 0, whole: bool = True, results: dict | None = None) -> dict:
    return {"cell": 1, "job": "j", "ranks": [{"rank": 0, "events": _events(0), "output": {"stdout": stdout, "stderr": []},
                                             "dropped": {"stdout": dropped, "stderr": 0}, "whole": whole,
                                             "results": results or {}}]}


def _shown(events) -> list[str]:
    return [e.text for e in events if isinstance(e, Output)]


def test_the_record_shows_what_the_log_has_not_and_the_log_then_shows_nothing_twice():
    decoder, ends = StreamDecoder(TOKEN), CellEnds()
    ends.begin()
    assert _shown(ends.from_log([Output(0, "stdout", "a"), Output(0, "stdout", "b")])) == ["a", "b"]
    ends.record = _record(["a", "b", "c", "d"])
    applied = ends.apply(decoder.feed_rank)
    assert _shown(applied) == ["c", "d"]
    assert [type(e) for e in applied if not isinstance(e, Output)] == [RankFinished, RankReady]
    assert ends.apply(decoder.feed_rank) is None, "applied once"
    # the log brings the rest later, events included: none of it is passed on again
    later = ends.from_log([Output(0, "stdout", "c"), Output(0, "stdout", "d"), Output(0, "stdout", "next cell")])
    assert _shown(later) == ["next cell"]
    assert decoder.feed_lines([f"[1,0]<stdout>:{line}" for line in _events(0)]) == [], "the log's copies of the events"


def test_a_record_whose_tail_starts_past_what_the_log_brought_waits_for_the_log():
    decoder, ends = StreamDecoder(TOKEN), CellEnds()
    ends.begin()
    ends.from_log([Output(0, "stdout", "1")])
    ends.record = _record(["4", "5"], dropped=3)  # lines 1, 2, 3 came before the record's tail
    assert ends.apply(decoder.feed_rank) is None
    ends.from_log([Output(0, "stdout", "2"), Output(0, "stdout", "3")])
    assert _shown(ends.apply(decoder.feed_rank)) == ["4", "5"]


def test_a_record_with_a_line_cut_short_is_set_aside():
    ends = CellEnds()
    ends.begin()
    ends.record = _record(["x" * 10], whole=False)
    assert ends.apply(StreamDecoder(TOKEN).feed_rank) is None


def test_results_come_from_the_record_where_it_holds_them(tmp_path):
    ends = CellEnds()
    ends.begin()
    assert ends.fetch_results(str(tmp_path), [0, 1], RESULTS) == [0, 1], "no record yet"
    ends.record = _record([], results={RESULTS: base64.b64encode(b"pickled").decode()}, whole=False)
    assert ends.apply(StreamDecoder(TOKEN).feed_rank) is None
    assert ends.fetch_results(str(tmp_path), [0, 1], RESULTS) == [1], "a record set aside still holds the results"
    with open(result_path(str(tmp_path), 0, RESULTS), "rb") as f:
        assert f.read() == b"pickled"
