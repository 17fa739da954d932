"""The follower's every branch on a scripted backend and a fake clock: no mpirun, no sleeping."""

from __future__ import annotations

import io
import time

import pytest

import mpi_magic
from mpi_magic.shared import cell, jobdir, payload
from mpi_magic.shared.events import Billing, LauncherExited, LauncherOutput, Output, RankFinished, RankGone, RankStarted
from mpi_magic.notebook.pipeline import FollowSettings, Follower
from mpi_magic.notebook.job import Job
from mpi_magic.view.model import JobModel
from mpi_magic.runtime.rank import result_path
from mpi_magic.testing.scripted import FakeClock, ScriptedJob
from mpi_magic.view.console import ConsoleEcho


def started(rank: int) -> RankStarted:
    return RankStarted(rank=rank, instance=0, local_rank=rank, world_size=2, pid=1000 + rank, time=1.0)


def ok(rank: int, digest: str = "") -> RankFinished:
    return RankFinished(rank=rank, ok=True, results_digest=digest, seq=1, time=2.0)


def results(values: dict):
    """What rank 0 writes when it succeeds, and the digest it would report."""
    def write(job_dir: str) -> str:
        return payload.write(result_path(job_dir, 0), [payload.pack(k, v) for k, v in values.items()], {"rank": 0})
    return write


@pytest.fixture
def world(tmp_path):
    clock = FakeClock()
    jobdir.prepare(str(tmp_path / "cache"))
    job_dir = jobdir.create(str(tmp_path / "cache"), "scripted-job")
    err = io.StringIO()

    def follow(script, returns=(), timeout=None, max_cost=None, **job_options):
        backend_job = ScriptedJob(clock, script, **job_options)
        job = Job("scripted-job", "scripted", 2, 2, clock)
        job.start(job_dir, backend_job.cancel, backend_job.stacks_dir, request_stacks=backend_job.request_stacks)
        settings = FollowSettings(list(returns), False, {}, timeout, "a scripted stop", ConsoleEcho(io.StringIO(), err),
                                  clock, max_cost=max_cost)
        return job, backend_job, Follower(job, backend_job, settings)

    started_at = time.monotonic()
    yield clock, job_dir, err, follow
    assert time.monotonic() - started_at < 2, "scripted runs take no real time"


def test_success_brings_the_values_back(world):
    clock, job_dir, err, follow = world
    digest = results({"x": 42})(job_dir)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, Output(0, "stdout", "hi")),
                                         (2.0, ok(0, digest)), (2.0, ok(1)), (2.2, LauncherExited(0))], returns=["x"])
    run = follower.run()
    assert run.values == {"x": 42} and job.status == "completed"
    assert backend_job.fetched == [[0]] and backend_job.cancels == []
    assert job.logs(0) == "hi\n"


def test_timeout_stops_the_job_at_its_time(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1))], timeout=5)
    with pytest.raises(mpi_magic.JobTimeoutError, match="ran past --timeout 5s; all 2 ranks were stopped"):
        follower.run()
    assert len(backend_job.cancels) == 1 and 5.0 <= backend_job.cancels[0] < 5.2
    assert job.status == "stopped" and all(r.status == "stopped" for r in job.ranks)


def test_a_budget_stops_the_job_once_its_cost_reaches_it(world):
    clock, job_dir, err, follow = world
    # two instances at $3.60 an instance-hour spend $0.002 a second: $0.01 five seconds into training
    training = Billing(instances=2, instance_seconds=0.0, running=True, hourly_price=3.6)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, training)], max_cost=0.01)
    with pytest.raises(mpi_magic.JobError) as caught:
        follower.run()
    assert str(caught.value) == ("job scripted-job: its cost reached --max-cost $0.01 (about $0.01 at list price); "
                                 "all 2 ranks were stopped (raise --max-cost to let it run longer)")
    assert len(backend_job.cancels) == 1 and 6.0 <= backend_job.cancels[0] < 6.2
    assert job.status == "stopped" and job.model.stop_reason == "budget"


def test_a_job_without_a_price_runs_on_whatever_its_budget(world):
    clock, job_dir, err, follow = world
    digest = results({"x": 1})(job_dir)
    unpriced = Billing(instances=2, instance_seconds=0.0, running=True, hourly_price=None)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, unpriced),
                                         (30.0, ok(0, digest)), (30.0, ok(1)), (30.1, LauncherExited(0))],
                                        returns=["x"], max_cost=0.01)
    assert follower.run().values == {"x": 1} and backend_job.cancels == []


def test_a_failure_stops_the_others_after_the_grace(world):
    clock, job_dir, err, follow = world
    failed = RankFinished(rank=0, ok=False, error_type="ValueError", message="bad", traceback="tb", seq=1, time=1.0)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, failed)], abort_grace=3.0)
    with pytest.raises(mpi_magic.RemoteRankError, match="rank 0 .* raised ValueError: bad"):
        follower.run()
    assert 4.0 <= backend_job.cancels[0] < 4.3, "the launcher did not stop the others, so the follower does"
    assert job.status == "failed" and job.ranks[1].status == "stopped"


def test_a_launcher_still_running_after_every_rank_succeeded_is_stopped_and_the_job_completes(world):
    clock, job_dir, err, follow = world
    digest = results({"y": 1})(job_dir)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, ok(0, digest)), (1.0, ok(1))],
                                        returns=["y"], linger=3.0)
    assert follower.run().values == {"y": 1}
    assert 4.0 <= backend_job.cancels[0] < 4.3
    assert job.status == "completed"


def test_an_interrupt_stops_the_job_and_is_raised(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (2.0, KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        follower.run()
    assert job.status == "stopped" and job.model.stop_reason == "interrupt"
    said = err.getvalue()
    assert "interrupted: stopping job scripted-job (2 ranks: a scripted stop)" in said
    assert "stopped; nothing of it is left running" in said


def test_a_second_interrupt_while_stopping_ends_the_wait_not_the_stop(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (2.0, KeyboardInterrupt()), (3.0, KeyboardInterrupt())],
                                        stops_after=None)
    with pytest.raises(KeyboardInterrupt):
        follower.run()
    assert len(backend_job.cancels) == 1 and clock.elapsed < 4
    assert job.status == "stopped"
    assert "was asked to stop (a scripted stop) and is still stopping" in err.getvalue()


def test_a_job_that_never_confirms_its_stop_is_waited_for_up_to_the_limit(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (1.0, KeyboardInterrupt())], stops_after=None)
    follower.settings.stop_limit = 30.0
    with pytest.raises(KeyboardInterrupt):
        follower.run()
    assert 31.0 <= clock.elapsed < 31.3 and job.status == "stopped"


def test_cancel_on_the_handle_ends_the_cell_with_a_job_error(world):
    clock, job_dir, err, follow = world
    box = {}
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, lambda: box["job"].cancel())])
    box["job"] = job
    with pytest.raises(mpi_magic.JobError, match="was cancelled; all 2 ranks were stopped"):
        follower.run()
    assert backend_job.cancels == [pytest.approx(1.0, abs=0.11)] and job.status == "stopped"


def test_results_whose_digest_was_never_reported_are_named_not_unpickled(world):
    clock, job_dir, err, follow = world
    results({"z": 3})(job_dir)
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, ok(0)), (1.0, ok(1)),
                                         (1.1, LauncherExited(0))], returns=["z"])
    assert follower.run().values == {}
    assert "its digest was never reported" in job.unreturned["(all)"]
    assert "(all) was not brought back: " in err.getvalue() and "rank 0's results could not be read" in err.getvalue()


def test_a_rank_gone_without_reporting_fails_when_the_launcher_has_exited(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, ok(0)), (1.0, RankGone(1)),
                                         (5.0, LauncherExited(0, {1: "exited before the cell finished"}))])
    with pytest.raises(mpi_magic.RankExitError, match=r"rank 1 \(instance 0\) exited before the cell finished"):
        follower.run()
    assert backend_job.cancels == [], "a gone rank is no failure until its output has drained"


def test_a_launcher_that_started_no_rank_says_why(world):
    clock, job_dir, err, follow = world
    refusal = "An unrecognized option was included on the mpirun command line: Option: --bad"
    job, backend_job, follower = follow([(0.1, LauncherOutput(refusal)), (0.2, LauncherExited(213, {}, refusal))])
    with pytest.raises(mpi_magic.RankExitError, match="the launcher refused to start the job: An unrecognized option"):
        follower.run()
    assert job.status == "failed"


def _sleeping(line: int) -> dict[int, list[tuple[str, int, str]]]:
    """Both ranks' frames when they are in the cell's ``time.sleep`` at ``line``."""
    return {rank: [(cell.FILENAME, line, "<module>"), ("time", 0, "sleep")] for rank in (0, 1)}


def test_quiet_ranks_are_asked_once_per_quiet_spell_and_their_answers_make_the_stall_roll_call(world):
    """The follower alone decides a stall (stall_after: 30 s on the fake clock), from the events the
    view shows; ranks asked through their job's channel answer with events, folded as they come."""
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (1.0, Output(0, "stdout", "a")),
                                         (50.0, Output(1, "stdout", "b")), (95.0, ok(0)), (95.0, ok(1)),
                                         (95.1, LauncherExited(0))], stacks=_sleeping(3))
    follower.run()
    first, second = backend_job.asked
    assert 31.0 <= first < 31.5 and 80.0 <= second < 80.5, "once per quiet spell, stall_after after its start"
    assert job.model.roll_call == "ranks 0, 1 at cell line 3 in sleep"
    assert job.model.roll_call_quiet is not None and job.model.roll_call_quiet >= 30, "taken for the stall"


def test_an_interrupt_takes_the_roll_call_of_ranks_asked_through_their_job(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(0.1, started(0)), (0.1, started(1)), (2.0, KeyboardInterrupt())],
                                        stacks=_sleeping(3), answer_after=1.5)
    with pytest.raises(KeyboardInterrupt):
        follower.run()
    said = err.getvalue()
    assert backend_job.asked == [2.0] and "where the ranks were: ranks 0, 1 at cell line 3 in sleep" in said, said
    assert "asking the ranks of job scripted-job where they are (up to 10s" in said, "the wait is announced"
    assert said.index("where the ranks were") < said.index("interrupted: stopping job"), "before the stop"
    assert job.status == "stopped"


def test_an_interrupt_before_any_rank_started_stops_without_a_roll_call(world):
    clock, job_dir, err, follow = world
    job, backend_job, follower = follow([(2.0, KeyboardInterrupt())], stacks=_sleeping(3))
    with pytest.raises(KeyboardInterrupt):
        follower.run()
    assert "where the ranks" not in err.getvalue() and "interrupted: stopping job" in err.getvalue()


def test_a_run_of_output_lines_is_folded_and_logged_as_each_line_would_be(tmp_path):
    """A flood's lines are taken a poll's run at a time (``Follower.show_all``): the model and the
    logs end the same as when each line is taken alone, a line of a rank beyond the world included."""
    lines = [Output(n % 3, "stdout" if n % 4 else "stderr", f"line {n}" if n % 5 else "  ") for n in range(40)]
    lines.append(Output(9, "stdout", "no such rank"))
    jobs = []
    jobdir.prepare(str(tmp_path))
    for name in ("one-by-one", "at-once"):
        job = Job(name, "scripted", 3, 3, FakeClock())
        job.job_dir = jobdir.create(str(tmp_path), name)
        if name == "one-by-one":
            for line in lines:
                job.record_lines([line])
        else:
            job.record_lines(lines)
        jobs.append(job)
    one, many = jobs
    folded = JobModel("one-by-one", "scripted", 3, 3, FakeClock())  # each line through the model's own fold
    for line in lines:
        folded.fold(line)
    assert many.model.version == folded.version == 40, "the line of no rank changes nothing"
    assert many.model.last_activity == folded.last_activity
    assert list(many.model.tail) == list(folded.tail) and many.model.outputs == folded.outputs == 40
    for a, b in zip(folded.ranks, many.ranks):
        assert (list(a.tail), a.outputs, a.last_line) == (list(b.tail), b.outputs, b.last_line)
    assert [many.logs(r) for r in (0, 1, 2, None)] == [one.logs(r) for r in (0, 1, 2, None)]
    assert "[rank 1] [stderr] line 4\n" in many.logs()
