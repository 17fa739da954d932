"""A SageMaker session at AWS's pace (``--pace aws``: S3 answers in 0.1 s, a log line is readable
5 s after it was written): a cell's end, its results and its output come from rank 0's end record
in S3, without waiting for CloudWatch, and the log's copies of the same lines are not shown again."""

from __future__ import annotations

import os
import time

from helpers import BUCKET, forge_end_record, run, start_session, uploaded, wait_until, waiting_for

from mpi_magic.backends.sagemaker.cell_end import CellEnds
from mpi_magic.backends.sagemaker.session_ranks import SageMakerSessionRanks
from mpi_magic.shared import s3channel
from mpi_magic.testing.aws_pace import AWS

AWS_PACE = "aws"  # the module's servers (conftest's local_aws_env)
INSTANCE_START = 1.0  # seconds, instead of the pace's two minutes

CELL = ("import mpi_magic, sys\n"
        "print(f'rank {mpi_magic.rank()} says {tag}')\n"
        "print(f'rank {mpi_magic.rank()} warns {tag}', file=sys.stderr)\n"
        "said = (mpi_magic.rank(), tag)\n")


def _cell(ip, tag: str) -> tuple[float, object]:
    ip.user_ns["tag"] = tag
    started = time.monotonic()
    run(ip, "--quiet --gather --out job", CELL)
    return time.monotonic() - started, ip.user_ns["job"]


def _records_applied(monkeypatch) -> list[float]:
    """When each end record the notebook read was applied (the cell's end came from it, not from the log)."""
    applied: list[float] = []
    apply = CellEnds.apply

    def counted(self, decode):
        events = apply(self, decode)
        if events is not None:
            applied.append(time.monotonic())
        return events

    monkeypatch.setattr(CellEnds, "apply", counted)
    return applied


def _said(job, tag: str) -> list[str]:
    return [line for rank in range(job.world_size) for line in job.logs(rank).splitlines() if tag in line]


def test_a_cell_ends_from_its_record_before_the_log_could_say_so_and_each_line_shows_once(cloud_sessions, aws,
                                                                                        monkeypatch):
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 2")
    applied = _records_applied(monkeypatch)
    took, job = _cell(ip, "first")
    assert len(applied) == 1, f"{took:.2f}s: the end came from S3, not from the log"
    assert ip.user_ns["said"] == [(rank, "first") for rank in range(4)]
    assert sorted(_said(job, "first")) == sorted([f"rank {r} says first" for r in range(4)] +
                                                 [f"[stderr] rank {r} warns first" for r in range(4)])
    assert job.status == "completed"

    time.sleep(AWS.log_visible + 1.0)  # the log has the first cell's lines now, and the next cell's reads bring them
    took, job = _cell(ip, "second")
    assert len(applied) == 2, f"{took:.2f}s: the end came from S3 again"
    assert not _said(job, "first") and not [line for line in s.said_between_cells(limit=100) if "first" in line], \
        "the log's copies of lines shown from the record are not shown again"
    assert len(_said(job, "second")) == 8
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    assert not [key for key in uploaded(aws, root) if "/results/" in key], "small results came in the end records"

    started = time.monotonic()
    run(ip, "--quiet", "big = bytes(200_000)\n")  # over what a record holds: an object of its own
    assert len(applied) == 3 and ip.user_ns["big"] == bytes(200_000), f"{time.monotonic() - started:.2f}s"
    assert [key for key in uploaded(aws, root) if "/results/" in key]

    monkeypatch.setattr(SageMakerSessionRanks, "end_records", False)  # the cell's end from the log, as before
    took, job = _cell(ip, "third")
    assert took >= AWS.log_visible and len(applied) == 3, "without the record the end waits for CloudWatch"
    assert ip.user_ns["said"] == [(rank, "third") for rank in range(4)] and len(_said(job, "third")) == 8
    assert wait_until(lambda: s.status == "idle", 10)


def test_an_object_someone_else_put_where_the_record_goes_costs_the_cell_neither_its_results_nor_its_speed(
        cloud_sessions, aws, tmp_path, monkeypatch):
    """At AWS's pace the forgery, put as soon as the cell's message can be read, is what the
    notebook reads first; refused, it is looked past, and rank 0's record still ends the cell
    before the log could."""
    ip = cloud_sessions
    s = start_session(ip, "-i 1 -g 2")
    applied = _records_applied(monkeypatch)
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    uri = s3channel.session_uri(f"s3://{BUCKET}/{root}/{s.job_name}")
    marker = str(tmp_path / "forged")
    forged = forge_end_record(aws, uri, s.cells + 1, b"{}", marker=marker)
    started = time.monotonic()
    # the cell ends once the forgery is there and the notebook has had time for a look at it
    run(ip, "--quiet --gather --out job", "import mpi_magic, time\n" + waiting_for(marker) + "time.sleep(1)\n"
        "said = mpi_magic.rank()")
    assert len(applied) == 1, f"{time.monotonic() - started:.2f}s: the end came from rank 0's record, not from the log"
    assert forged.is_set() and ip.user_ns["said"] == [0, 1]
    assert [note for note in ip.user_ns["job"].model.notes if "refused" in note and "not a signed message" in note]
