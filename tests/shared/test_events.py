"""The wire format and the decoder that serves local pipes and re-read cloud logs alike."""

from __future__ import annotations

import pytest

from mpi_magic.shared import wire
from mpi_magic.shared.events import (LauncherOutput, Output, Progress, RankFinished, RankStarted, Resources,
                                     StreamDecoder, encode, parse_tag)
from mpi_magic.shared.wire import marker

TOKEN = "0123456789abcdef"
MARKER = marker(TOKEN)


def test_tags_of_open_mpi_5_and_4_and_mpich():
    assert parse_tag("[1,3]<stdout>: hello") == (3, "stdout", "hello")
    assert parse_tag("[1,3]<stdout>:  indented", style="openmpi5") == (3, "stdout", " indented")
    assert parse_tag("[1,12]<stderr>:text", style="openmpi4") == (12, "stderr", "text")
    assert parse_tag("[7] from mpich", "stderr", style="mpich") == (7, "stderr", "from mpich")
    assert parse_tag("[7] from mpich") is None  # not a tag for Open MPI
    assert parse_tag("plain launcher text") is None


def test_a_decoder_told_the_tag_style_later_reads_lines_in_it():
    """A SageMaker job's log says which Open MPI tags its lines after the decoder was made."""
    decoder = StreamDecoder(TOKEN)
    decoder.style = "openmpi4"
    assert decoder.feed("[1,3]<stdout>: indented") == [Output(3, "stdout", " indented")]
    sent = Progress(rank=3, n=2, total=4, seq=0, time=1.0)
    assert decoder.feed(f"[1,3]<stdout>:{encode(sent, TOKEN)}") == [sent]


def test_events_round_trip_through_tagged_lines():
    finished = RankFinished(rank=2, ok=False, error_type="ValueError", message="bad", traceback="Traceback...\n", seq=4, time=1.5)
    decoder = StreamDecoder(TOKEN)
    assert decoder.feed(f"[1,2]<stdout>: {encode(finished, TOKEN)}\n") == [finished]


def test_duplicates_are_dropped_and_gaps_counted():
    decoder = StreamDecoder(TOKEN)
    lines = [f"[1,0]<stdout>: {encode(Progress(rank=0, n=i, total=10, seq=i), TOKEN)}" for i in range(6)]
    got = []
    for line in [lines[0], lines[1], lines[1], lines[4], lines[0], lines[5]]:
        got += decoder.feed(line)
    assert [e.seq for e in got] == [0, 1, 4, 5]
    assert decoder.duplicates == 2
    assert decoder.gaps == {0: 2}
    assert [e.seq for e in decoder.feed(lines[2])] == [2]  # a late line fills part of the gap
    assert decoder.gaps == {0: 1}


def test_text_before_the_marker_is_output_of_that_rank():
    started = RankStarted(rank=1, instance=0, local_rank=1, world_size=2, seq=0, time=1.0)
    got = StreamDecoder(TOKEN).feed(f"[1,1]<stdout>: partial line{encode(started, TOKEN)}")
    assert got == [Output(1, "stdout", "partial line"), started]


def test_malformed_and_foreign_lines_become_plain_output():
    decoder = StreamDecoder(TOKEN)
    assert decoder.feed(f"[1,0]<stdout>: {MARKER}{{not json") == [Output(0, "stdout", f"{MARKER}{{not json")]
    assert decoder.feed(f'[1,0]<stdout>: {MARKER}{{"v":99,"k":"started","rank":0}}')[0].__class__ is Output
    assert decoder.feed(f'[1,0]<stdout>: {MARKER}{{"v":2,"k":"nonsense"}}')[0].__class__ is Output
    assert decoder.feed("prterun noticed that ...") == [LauncherOutput("prterun noticed that ...")]
    assert decoder.feed("\x00\xff garbage") == [LauncherOutput("\x00\xff garbage")]


def test_emitter_numbers_events_per_rank():
    lines = []
    emitter = wire.Emitter(3, lines.append, TOKEN)
    emitter.emit(wire.PROGRESS, n=1, total=2)
    emitter.emit(wire.PROGRESS, n=2, total=2)
    decoded = [StreamDecoder(TOKEN).feed(f"[1,3]<stdout>: {line}")[0] for line in lines]
    assert [(e.rank, e.seq, e.n) for e in decoded] == [(3, 0, 1), (3, 1, 2)]


def test_progress_round_trips_whatever_its_description_holds():
    decoder = StreamDecoder(TOKEN)
    for seq, desc in enumerate(["epoch 1, batch 2", "line\nbreak", "", "ünïcödé,,,"]):
        sent = Progress(rank=1, n=2.5, total=None if seq % 2 else 10, desc=desc, bar=3, closed=bool(seq % 2), seq=seq,
                        time=12.25)
        (got,) = decoder.feed(f"[1,1]<stdout>: {encode(sent, TOKEN)}")
        assert got == Progress(**{**sent.__dict__, "desc": desc.replace("\n", " ")})


def test_numpy_numbers_in_progress_travel_as_plain_numbers():
    import numpy as np

    sent = Progress(rank=0, n=np.float64(1.5), total=np.int64(4), seq=0, time=1.0)
    (got,) = StreamDecoder(TOKEN).feed(f"[1,0]<stdout>: {encode(sent, TOKEN)}")
    assert (got.n, got.total) == (1.5, 4.0)


def test_a_line_holding_only_a_progress_record_decodes_as_the_general_path_decodes_its_record():
    """The decoder reads the usual progress line in one match; what it believes, and what it
    rejects, is what ``decode_payload`` and the rank check make of the same record."""
    import random

    from mpi_magic.shared.events import BadEvent, decode_payload

    rng = random.Random(3)
    fields = ["3", "7", "12.5", "1733224567.123456", "100", "", "0", "1", "1e-05", "9" * 16, "9" * 40, "1" * 400 + ".5",
              "1.2.3", "05", "-1", "inf", "nan", " 2", "٣", "x" * 1001, "ü,ü", "a\nb", "0.00012345678901234568",
              "0." + "1" * 24, "0." + "1" * 25]
    for _ in range(3000):  # a valid record (rank, seq, time, n, total, bar, closed, desc), one or two fields changed
        record = ["3", "7", "12.5", "5", "100", "0", "1", "epoch 1"]
        for _ in range(rng.randint(1, 2)):
            at = rng.randrange(len(record))
            record[at] = rng.choice(["4", "٣", "03", "2"] if at == 0 else fields)
        record = "p" + ",".join(record)
        decoder = StreamDecoder(TOKEN)
        got = decoder.feed(f"[1,3]<stdout>: {MARKER}{record}")
        try:
            expected = decode_payload(record)
        except BadEvent:
            expected = None
        if expected is not None and expected.rank == 3:
            assert got == [expected] and decoder.rejected == 0, record
            assert [type(getattr(got[0], f)) for f in ("n", "total", "time")] == \
                [type(getattr(expected, f)) for f in ("n", "total", "time")], f"the same numbers' types: {record}"
        else:
            assert got == [Output(3, "stdout", MARKER + record)] and decoder.rejected == 1, record


def test_the_decoders_of_every_job_share_one_pattern_and_each_believes_only_its_own_marker():
    """A cell's decoder compiles nothing: the job's marker is checked apart from the pattern that reads
    the lines, which every job's decoder shares; a progress record under another job's marker is output."""
    other = "fedcba9876543210"
    ours, theirs = StreamDecoder(TOKEN), StreamDecoder(other)
    assert ours._tagged is theirs._tagged
    sent = Progress(rank=0, n=1, total=2, seq=0, time=1.0)
    line = f"[1,0]<stdout>: {encode(sent, other)}"
    assert theirs.feed(line) == [sent]
    assert ours.feed(line) == [Output(0, "stdout", encode(sent, other))] and ours.rejected == 0
    assert ours.feed(f"[1,0]<stdout>: {encode(sent, TOKEN)}") == [sent]


def test_the_lines_of_a_read_decode_at_once_as_they_do_one_at_a_time():
    """The local backend decodes a read's lines in one call; what comes out, in what order, and
    what is dropped or rejected is what feeding them one by one gives."""
    started = RankStarted(rank=1, instance=0, local_rank=1, world_size=2, seq=0, time=1.0)
    progress = [encode(Progress(rank=r, n=i, total=4, seq=i + (r == 1), time=2.0 + i), TOKEN) for i in range(4)
                for r in (0, 1)]
    lines = [f"[1,1]<stdout>: {encode(started, TOKEN)}", *(f"[1,{i % 2}]<stdout>: {p}" for i, p in enumerate(progress)),
             "[1,0]<stdout>: " + progress[2],  # a duplicate
             f"[1,1]<stderr>: warning{encode(Progress(rank=1, n=9, seq=5, time=9.0), TOKEN)}",
             f"[1,1]<stdout>: {progress[0]}",  # rank 0's record in rank 1's line
             f"[1,0]<stdout>: {MARKER}{{not json", "prterun says something", "", "[1,0]<stdout>: plain ü\r"]
    one_by_one, at_once = StreamDecoder(TOKEN), StreamDecoder(TOKEN)
    expected = [event for line in lines for event in one_by_one.feed(line)]
    assert at_once.feed_lines(lines) == expected
    assert [type(e).__name__ for e in expected].count("Progress") == 9
    assert (at_once.duplicates, at_once.rejected) == (one_by_one.duplicates, one_by_one.rejected) == (1, 2)


def test_a_ranks_resources_round_trip_with_or_without_gpu_figures():
    decoder = StreamDecoder(TOKEN)
    on_a_cpu = Resources(rank=2, cpu=97.3, rss=1_288_490_188, seq=5, time=12.5)
    on_a_gpu = Resources(rank=2, cpu=310.0, rss=2 << 30, gpu_memory=40 << 30, gpu_util=88.0, seq=6, time=13.5)
    for sent in (on_a_cpu, on_a_gpu):
        line = encode(sent, TOKEN)
        assert decoder.feed(f"[1,2]<stdout>: {line}") == [sent]
    assert "gpu" not in encode(on_a_cpu, TOKEN), "figures a rank does not have take no room on the wire"
    emitted = []
    wire.Emitter(2, emitted.append, TOKEN).emit(wire.RESOURCES, cpu=0.0, rss=0)  # an idle rank's zeros are figures
    (got,) = StreamDecoder(TOKEN).feed(f"[1,2]<stdout>: {emitted[0]}")
    assert (got.cpu, got.rss, got.gpu_memory, got.gpu_util) == (0.0, 0, None, None)


def test_resources_out_of_range_or_of_the_wrong_type_are_not_believed():
    """Each field is checked: finite, not negative, bytes as whole numbers, a GPU busy at most 100%."""
    bad = ['"cpu":-1', '"cpu":NaN', '"cpu":Infinity', '"cpu":1e300', '"cpu":"97"', '"cpu":true', '"rss":-5',
           '"rss":1.5', '"rss":9007199254740993', '"rss":false', '"rss":[1]', '"gpu_memory":-1', '"gpu_memory":2.5',
           '"gpu_util":100.5', '"gpu_util":-0.1', '"gpu_util":{}', '"swap":1', '"rank":3']
    for field in bad:
        decoder = StreamDecoder(TOKEN)
        line = f'[1,2]<stdout>: {MARKER}{{"v":2,"k":"resources","rank":2,"seq":0,"time":1.0,{field}}}'
        assert decoder.feed(line) == [Output(2, "stdout", line.partition(": ")[2])], field
        assert decoder.rejected == 1, field
    fine = f'[1,2]<stdout>: {MARKER}{{"v":2,"k":"resources","rank":2,"seq":0,"time":1.0,"cpu":0,"rss":0,"gpu_util":100}}'
    assert StreamDecoder(TOKEN).feed(fine) == [Resources(rank=2, cpu=0, rss=0, gpu_util=100, seq=0, time=1.0)]


def test_a_ranks_stacks_event_is_believed_only_whole_and_a_repeat_is_the_same_answer_again():
    from mpi_magic.shared.events import RankStacks

    decoder = StreamDecoder(TOKEN)
    sent = RankStacks(rank=2, frames=[["<mpirun_remote cell>", 8, "<module>"], ["/lib/mpi.py", 1, "allreduce"]],
                      time=5.0)
    line = f"[1,2]<stderr>: {encode(sent, TOKEN)}"
    assert decoder.feed(line) == [sent] and decoder.feed(line) == [sent], \
        "outside the rank's numbering (its sender is a process of its own)"
    for frames in ([["f", -1, "g"]], [["f", 1]], [["f", "1", "g"]], "f:1:g", [["f", 1, "g"]] * 201,
                   [["x" * 4001, 1, "g"]]):
        bad = encode(RankStacks(rank=2, frames=frames), TOKEN)
        assert decoder.feed(f"[1,2]<stderr>: {bad}") == [Output(2, "stderr", bad)]
    other = encode(RankStacks(rank=3, frames=[]), TOKEN)
    assert decoder.feed(f"[1,2]<stderr>: {other}") == [Output(2, "stderr", other)], "rank 2 cannot speak for 3"
    assert decoder.rejected == 7


def test_the_ranks_json_is_the_json_modules_own_without_importing_it():
    """What a rank writes (events, a results file's header) and reads (a payload's header) is what
    ``json.dumps(value, separators=(",", ":"))`` writes and ``json.loads`` reads, whatever the value;
    what json refuses, these refuse with a ValueError or TypeError too."""
    import json
    import math
    import random

    rng = random.Random(5)
    atoms = [0, -1, 1 << 60, 2.5, -0.0, 1e-300, math.inf, -math.inf, math.nan, True, False, None, "", "plain",
             'quo"te\\back\nslash\t', "ünïcödé ✓ \U0001f600", "\x00\x1f\x7f", "\ud800"]

    def value(depth: int = 0):
        kind = rng.random()
        if depth < 4 and kind < 0.2:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        if depth < 4 and kind < 0.4:
            return {rng.choice(["k", "ü", "", "a b"]) + str(i): value(depth + 1) for i in range(rng.randint(0, 4))}
        return rng.choice(atoms)

    for _ in range(500):
        sent = value()
        text = wire.dumps(sent)
        assert text == json.dumps(sent, separators=(",", ":"))
        assert repr(wire.loads(text)) == repr(json.loads(text))  # (repr: nan is not nan)
    assert wire.dumps({1: 2, 2.5: None, True: 0, None: 1}) == json.dumps({1: 2, 2.5: None, True: 0, None: 1},
                                                                          separators=(",", ":"))
    for unwritable in ({"set": {1}}, [object()], {("tuple",): 1}):
        with pytest.raises(TypeError):
            wire.dumps(unwritable)
    for spaced in [" 1", "[1] ", '\t{"a" : [ 1 , 2 ] }\r\n']:
        assert wire.loads(spaced) == json.loads(spaced)
    for unreadable in ["", " ", "{", '{"a":1}x', "[1,]", "{'a':1}", '"\\x"', "nul", "01", '"\x01"', "1 2"]:
        with pytest.raises(ValueError):
            json.loads(unreadable)
        with pytest.raises(ValueError):
            wire.loads(unreadable)
