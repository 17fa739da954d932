"""Every job reopened later: ``mpi_magic.Job.load`` and ``%mpirun_jobs JOB_NAME`` fold a job that ended
again from the events its folder kept, in a new Python as after a kernel restart, and show what the
cell showed; the record stays small, and the jobs kept are as many as ``keep_jobs``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import job_facts, reopened_facts, run

import mpi_magic
from mpi_magic.notebook import record
from mpi_magic.shared import events, jobdir
from mpi_magic.view.model import JobModel

CELL = textwrap.dedent("""\
    import sys, time
    import mpi_magic
    for step in mpi_magic.progress(range(6), desc="train"):
        mpi_magic.log(loss=1.0 / (step + 1), lr=0.1)
        time.sleep(0.05)
    print("rank", mpi_magic.rank(), "done")
    print("a warning", file=sys.stderr)
    """)


def test_a_completed_job_reopens_in_a_new_python_as_the_cell_left_it(ip, cache_dir, capsys):
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 3 --out job", CELL)
    job = ip.user_ns["job"]
    assert job.status == "completed" and job.metrics[2]["loss"][-1] == (5, 1 / 6)
    seen = job_facts(job)
    assert sorted(seen["logs"]["1"].splitlines()) == ["[stderr] a warning", "rank 1 done"]
    assert reopened_facts(cache_dir, job.name) == seen


def test_a_failed_job_reopens_with_its_failure_last_lines_and_roll_call(ip, cache_dir):
    ip.run_line_magic("mpirun_config", "view=text")
    with pytest.raises(mpi_magic.RemoteRankError) as raised:
        run(ip, "-g 2 --out job", CELL + textwrap.dedent("""\
            if mpi_magic.rank() == 1:
                raise ValueError("bad batch")
            time.sleep(30)
            """))
    job = ip.user_ns["job"]
    job.model.fold(events.RollCall("rank 0 at cell line 11 in <module>; rank 1 has failed"))  # as a stall's would be
    seen = job_facts(job)
    assert seen["status"] == "failed" and seen["error"] == f"RemoteRankError: {raised.value}"
    assert "raised ValueError: bad batch" in seen["summary"] and "its last lines" in seen["html"]
    assert "where the ranks were: rank 0 at cell line 11" in seen["summary"]
    assert reopened_facts(cache_dir, job.name) == seen


def test_a_reopened_job_is_read_only_and_percent_mpirun_jobs_lists_and_shows_it(ip, cache_dir, capsys):
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 2 --out job", "x = 1\n")
    name = ip.user_ns["job"].name
    capsys.readouterr()
    ip.run_line_magic("mpirun_jobs", "")
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "jobs kept here (%mpirun_jobs JOB_NAME reopens one):"
    assert listed[1].startswith(name) and listed[1].endswith("completed   local, 1 x 2")
    ip.run_line_magic("mpirun_jobs", f"{name} --out again")
    shown = capsys.readouterr().out
    assert shown.startswith(f"mpi_magic: job {name} (local, 1 x 2) completed ")
    again = ip.user_ns["again"]
    assert again.reopened and again.status == "completed"
    with pytest.raises(mpi_magic.JobError) as cancelled:
        again.cancel()
    assert str(cancelled.value) == f"job {name} was reopened after it ended (completed): there is nothing left to cancel"
    with pytest.raises(mpi_magic.JobError) as asked:
        again.roll_call()
    assert str(asked.value) == (f"job {name} was reopened after it ended (completed): its ranks are gone, so they "
                                "cannot be asked where they are; its summary shows the last roll-call taken")


def test_only_keep_jobs_jobs_are_kept_and_a_pruned_one_is_named_as_gone(ip, cache_dir):
    ip.run_line_magic("mpirun_config", "view=text keep_jobs=1")
    run(ip, "-g 1 --out first", "x = 1\n")
    run(ip, "-g 1 --out second", "x = 2\n")
    first, second = ip.user_ns["first"].name, ip.user_ns["second"].name
    assert mpi_magic.Job.load(second, cache_dir).status == "completed"
    with pytest.raises(mpi_magic.JobError) as gone:
        mpi_magic.Job.load(first, cache_dir)
    assert str(gone.value) == (f"no job named {first!r} is kept in {cache_dir}/jobs: the jobs kept are {second} "
                               "(%mpirun_jobs lists them; keep_jobs in %mpirun_config says how many are kept)")
    with pytest.raises(Exception, match=f"^no job named 'nothing' is kept in {cache_dir}/jobs: ") as unknown:
        ip.run_line_magic("mpirun_jobs", "nothing")
    assert type(unknown.value).__name__ == "UsageError"


def test_the_record_keeps_a_bars_progress_twice_a_second_and_stops_growing_at_its_limit(monkeypatch):
    lines: list[str] = []
    recorder = record.Recorder(lines.append)
    for i in range(10_001):  # a bar moving every millisecond for 10 s
        recorder(events.Progress(0, i, 10_000, seq=i, time=100 + i / 1000), i / 1000)
    recorder(events.RankFinished(0, True, time=111.0), 10.5)
    assert len(lines) <= 10 / record.THIN_SECONDS + 3
    assert '"n":10000' in lines[-2] and '"RankFinished"' in lines[-1]  # the bar's latest before the rank's end

    monkeypatch.setattr(record, "LIMIT", 10_000)
    lines.clear()
    recorder = record.Recorder(lines.append)
    for i in range(1000):
        recorder(events.Metrics(0, {"loss": [[i, 1.0]]}, seq=i, time=100.0 + i), float(i))
    recorder(events.LauncherExited(0), 1000.0)
    assert sum(len(line) for line in lines) < 10_000 + 500
    assert "the job's record reached 0 MiB" in lines[-3]
    assert '"points":{"loss":[[999,1.0]]}' in lines[-2]  # the latest, as it stood at the end


def test_past_its_limit_the_record_keeps_each_ranks_latest_metrics_as_they_stood_at_the_end(monkeypatch, tmp_path):
    monkeypatch.setattr(record, "LIMIT", 10_000)
    (tmp_path / "logs").mkdir()
    lines = [record.header("job", "local", 2, 2, 60.0)]
    recorder = record.Recorder(lines.append)
    for step in range(1000):
        for rank in (0, 1):
            points = {"loss": [[step, 1.0 / (step + 1)]], **({"lr": [[step, 0.1]]} if step == 500 else {})}
            recorder(events.Metrics(rank, points, seq=step, time=100.0 + step), float(step))
    recorder(events.LauncherExited(0), 1000.0)
    assert sum(len(line) for line in lines) < 10_000 + 1000
    (tmp_path / "logs" / record.FILE).write_text("\n".join(lines) + "\n")
    model = JobModel("job", "local", 2, 2, lambda: 0.0)
    for _, event in record.read(str(tmp_path))[1]:
        model.fold(event)
    for rank in (0, 1):
        assert model.metrics.as_dict()[rank]["loss"][-1] == (999, 1 / 1000)
        assert model.metrics.as_dict()[rank]["lr"][-1] == (500, 0.1)


def test_a_record_another_version_wrote_is_named_in_one_sentence(ip, cache_dir):
    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 1 --out job", "x = 1\n")
    name = ip.user_ns["job"].name
    path = os.path.join(cache_dir, "jobs", name, "logs", record.FILE)
    with open(path) as f:
        lines = f.read().splitlines()
    finished = next(i for i, line in enumerate(lines) if '"k":"RankFinished"' in line)
    lines[finished] = lines[finished][:-1] + ',"colour":"green"}'  # a field another version's event has
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(mpi_magic.JobError) as refused:
        mpi_magic.Job.load(name, cache_dir)
    assert str(refused.value) == (f"job {name} cannot be reopened: {path} holds a RankFinished event this version of "
                                  "mpi_magic does not read (another version wrote it)")


def test_a_job_whose_kernel_died_is_listed_and_reopened_as_stopped(ip, cache_dir, capsys):
    script = textwrap.dedent("""\
        import time
        from IPython.core.interactiveshell import InteractiveShell
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpi_magic")
        ip.run_line_magic("mpirun_config", "view=text")
        ip.run_cell_magic("mpirun_remote", "-g 1 --async --out job",
                          "import time\\nfor _ in range(600):\\n    print('.', flush=True)\\n    time.sleep(0.1)\\n")
        time.sleep(2)  # its record is written as the job's output comes
        print(ip.user_ns["job"].name, flush=True)
        time.sleep(60)
        """)
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env={**os.environ, "MPI_MAGIC_CACHE_DIR": cache_dir})
    try:
        name = kernel.stdout.readline().strip()
    finally:
        kernel.kill()  # the kernel dies with its job running
        kernel.communicate()
    job_dir = os.path.join(cache_dir, "jobs", name)
    deadline = time.monotonic() + 30
    while jobdir.is_running(jobdir.read_record(job_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)  # its launcher follows it (it dies with its parent)
    reopened = mpi_magic.Job.load(name, cache_dir)
    assert reopened.status != "running"
    capsys.readouterr()
    ip.run_line_magic("mpirun_jobs", "")
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert row.split()[3] == reopened.status


def test_this_kernels_running_job_and_a_reopened_one_are_named_as_they_are(ip, cache_dir):
    from IPython.core.error import UsageError

    ip.run_line_magic("mpirun_config", "view=text")
    run(ip, "-g 1 --async --out job", "import time\ntime.sleep(30)\n")
    job = ip.user_ns["job"]
    try:
        with pytest.raises(mpi_magic.JobError) as running:
            mpi_magic.Job.load(job.name, cache_dir)
        assert str(running.value) == (f"job {job.name} is still running, followed by this kernel: its cell's handle "
                                      "(--out) has it now; Job.load reopens a job once it has ended")
    finally:
        job.cancel()
        with pytest.raises(mpi_magic.JobError):
            job.wait(30)
    ip.user_ns["again"] = mpi_magic.Job.load(job.name, cache_dir)
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("mpirun_export", "again")
    assert str(refused.value) == (f"job {job.name} was reopened from its folder, which keeps no launch options: "
                                  "%mpirun_export exports a job from the notebook that ran it")
