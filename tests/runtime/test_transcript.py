"""A SageMaker session rank's transcript of a cell (for its end record): the event lines its emitter
writes and the lines its Python writes to stdout and stderr, bounded, with what was left out counted."""

from __future__ import annotations

import sys

from mpi_magic.runtime import transcript as module
from mpi_magic.runtime.transcript import Transcript
from mpi_magic.shared import wire


def test_a_cell_transcript_keeps_events_and_whole_lines_of_each_stream(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after the test, tee and all
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    written: list[str] = []
    emitter = wire.Emitter(3, written.append, "token")
    kept = Transcript()
    kept.install(emitter)
    print("before the cell")
    kept.begin()
    print("one")
    print("two", end="")
    print(" halves")
    print("warned", file=sys.stderr)
    sys.stdout.write("unfinished")
    emitter.emit(wire.FINISHED, ok=True)
    record = kept.record()
    assert record["output"] == {"stdout": ["one", "two halves"], "stderr": ["warned"]}
    assert record["dropped"] == {"stdout": 0, "stderr": 0} and record["whole"]
    assert record["events"] == [line.rstrip("\n") for line in written] and len(written) == 1
    assert capsys.readouterr().out == "before the cell\none\ntwo halves\nunfinished", "the cell's output still goes out"


def test_only_the_last_lines_are_kept_and_a_long_line_marks_the_record(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    kept = Transcript()
    kept.install(wire.Emitter(0, lambda line: None, "token"))
    kept.begin()
    for i in range(module.LINES_KEPT + 5):
        print(i)
    record = kept.record()
    assert record["output"]["stdout"] == [str(i) for i in range(5, module.LINES_KEPT + 5)]
    assert record["dropped"]["stdout"] == 5 and record["whole"]
    print("x" * (module.LINE_LIMIT + 1))
    assert not kept.record()["whole"], "a line cut short is the log's to bring whole"
    kept.begin()
    assert kept.record() == {"events": [], "output": {"stdout": [], "stderr": []},
                             "dropped": {"stdout": 0, "stderr": 0}, "whole": True}
    capsys.readouterr()
