"""A job as one MLflow run (``--mlflow EXPERIMENT``): real cells on the local backend, a real
``mlflow server`` on loopback (the module's ``mlflow_server``), read back through MLflow's own client."""

from __future__ import annotations

import _thread
import contextlib
import socket
import sys
import threading
import time
import urllib.request

import mlflow  # (the test extra installs it: a missing MLflow fails here, never skips)
import pytest
from helpers import once_running, run, start_session, wait_until
from IPython.core.error import UsageError

from mpi_magic.errors import JobError, JobTimeoutError, RemoteRankError
from mpi_magic.notebook.tracking import PROBE_SECONDS
from mpi_magic.options import Config

LOGGING_CELL = """
import time
import mpi_magic
for step in range(5):
    mpi_magic.log(loss=1.0 / (step + 1) + mpi_magic.rank())
time.sleep(1.5)  # a resource sample or two
print("done")
total = 7
"""


def only_run(uri: str, experiment: str):
    client = mlflow.MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def ended_runs(client, experiment: str) -> bool:
    """Whether the experiment is there and every run of it has ended."""
    found = client.get_experiment_by_name(experiment)
    return found is not None and all(r.info.status != "RUNNING" for r in client.search_runs([found.experiment_id]))


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def artifact_text(uri: str, found, path: str) -> str:
    """A file of the run, as the server serves it (MLflow's client would download it on a thread pool
    of its own, which outlives the test)."""
    where = found.info.artifact_uri.removeprefix("mlflow-artifacts:/")
    with urllib.request.urlopen(f"{uri}/api/2.0/mlflow-artifacts/artifacts/{where}/{path}", timeout=30) as answer:
        return answer.read().decode()


def artifacts(client, run_id: str, path: str | None = None) -> set[str]:
    found = set()
    for item in client.list_artifacts(run_id, path):
        found |= artifacts(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def test_a_job_is_one_run_with_its_options_metrics_peaks_summary_and_logs(ip, mlflow_server):
    run(ip, "-i 2 -g 2 --mlflow one-job --out job --timeout 60", LOGGING_CELL)
    job = ip.user_ns["job"]
    assert ip.user_ns["total"] == 7
    client, found = only_run(mlflow_server, "one-job")
    assert found.info.run_name == job.name
    assert found.info.status == "FINISHED"
    params = found.data.params
    assert {name: params[name] for name in ("backend", "instances", "procs_per_instance", "world_size", "timeout")} \
        == {"backend": "local", "instances": "2", "procs_per_instance": "2", "world_size": "4", "timeout": "60.0"}
    for rank in range(4):  # rank 0's under its own name, the others' under theirs
        key = "loss" if rank == 0 else f"rank{rank}/loss"
        assert history(client, found.info.run_id, key) == job.metrics[rank]["loss"]
        assert [step for step, _ in history(client, found.info.run_id, key)] == [0, 1, 2, 3, 4]
    peaks = {state.rank: state.peak_rss for state in job.ranks if state.peak_rss is not None}
    assert peaks, "no rank sampled its memory"
    for rank, peak in peaks.items():
        assert found.data.metrics["peak_memory_bytes" if rank == 0 else f"rank{rank}/peak_memory_bytes"] == peak
    assert any(key.endswith("system/cpu_percent") for key in found.data.metrics)
    files = artifacts(client, found.info.run_id)
    assert {"summary.html", "logs/all.log"} <= files
    assert job.name in artifact_text(mlflow_server, found, "summary.html")
    assert "[rank 3] done" in artifact_text(mlflow_server, found, "logs/all.log")


def test_a_failing_cell_is_a_failed_run_that_names_the_rank(ip, mlflow_server):
    cell = "import mpi_magic\nif mpi_magic.rank() == 1:\n    raise ValueError('boom')\n"
    with pytest.raises(RemoteRankError):
        run(ip, "-i 2 -g 2 --mlflow failing-job", cell)
    client, found = only_run(mlflow_server, "failing-job")
    assert found.info.status == "FAILED"
    tags = found.data.tags
    assert tags["mpi_magic.failed_ranks"] == "1"
    assert "rank 1" in tags["mpi_magic.failure"] and "ValueError: boom" in tags["mpi_magic.failure"]
    assert "ValueError: boom" in artifact_text(mlflow_server, found, "failure.txt")


def test_a_cell_stopped_at_its_timeout_is_a_killed_run(ip, mlflow_server):
    with pytest.raises(JobTimeoutError):
        run(ip, "-i 1 -g 2 --mlflow stopped-job --timeout 2", "import time\ntime.sleep(60)\n")
    _, found = only_run(mlflow_server, "stopped-job")
    assert found.info.status == "KILLED"
    assert "ran past --timeout 2s" in found.data.tags["mpi_magic.failure"]


def test_names_mlflow_refuses_are_cleaned_and_a_refused_batch_costs_only_itself(ip, mlflow_server, capsys):
    cell = """
import time
import mpi_magic
for step in range(3):
    mpi_magic.log(**{"loss\u00b7avg": float(step)})  # an identifier, with a character MLflow refuses
time.sleep(2.5)  # the writer sends what came so far
mpi_magic.log(step=1e30, late=1.0)  # a step past MLflow's 64 bits
time.sleep(2.5)
mpi_magic.log(after=1.0)
"""
    run(ip, "-i 1 -g 2 --mlflow odd-names", cell)
    client, found = only_run(mlflow_server, "odd-names")
    assert found.info.status == "FINISHED"
    assert history(client, found.info.run_id, "loss_avg") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert history(client, found.info.run_id, "after") == [(0, 1.0)]
    assert "late" not in found.data.metrics
    assert "summary.html" in artifacts(client, found.info.run_id)
    said = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(said) == 1 and said[0].startswith("mpi_magic: MLflow refused part of the run of job "), said


def test_a_session_is_one_run_whose_cells_follow_each_other(sessions, mlflow_server):
    ip = sessions
    start_session(ip, "-i 2 -g 2 --mlflow a-session")
    cell = "import mpi_magic\nfor step in range(3):\n    mpi_magic.log(loss=float(step))\n"
    run(ip, "", cell)
    run(ip, "", cell)
    ip.run_line_magic("mpirun_session", "stop")
    client, found = only_run(mlflow_server, "a-session")
    assert found.info.status == "FINISHED"
    assert history(client, found.info.run_id, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 0.0), (4, 1.0), (5, 2.0)]
    assert [step for step, _ in history(client, found.info.run_id, "rank3/loss")] == [0, 1, 2, 3, 4, 5]
    assert found.data.tags["mpi_magic.cell1.status"] == found.data.tags["mpi_magic.cell2.status"] == "completed"
    assert {"cells/cell1/summary.html", "cells/cell2/summary.html"} <= artifacts(client, found.info.run_id)


def test_a_session_ended_under_a_cell_keeps_that_cells_record_in_its_failed_run(sessions, mlflow_server):
    ip = sessions
    start_session(ip, "-i 1 -g 2 --mlflow lost-session")
    cell = """
import os, signal, mpi_magic
from mpi4py import MPI
if mpi_magic.rank() == 0:
    for line in range(50_000):  # logs that take the cell's record a while to write after the session's end
        print(f"line {line}")
MPI.COMM_WORLD.Barrier()
if mpi_magic.rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
"""
    with pytest.raises(JobError):  # the rank's death ends the session's launcher, and with it the session
        run(ip, "", cell)
    assert ip.magics_manager.registry["MpiMagics"].session.status == "stopped"
    client = mlflow.MlflowClient(mlflow_server)
    # the session's end is its pump's, which waits for nothing: the run is written in the background
    assert wait_until(lambda: ended_runs(client, "lost-session"), 30), "the session's run was never ended"
    client, found = only_run(mlflow_server, "lost-session")
    assert found.info.status == "FAILED"
    assert found.data.tags["mpi_magic.cell1.status"] == "failed"
    assert "mpi_magic.cell1.failure" in found.data.tags
    assert "cells/cell1/summary.html" in artifacts(client, found.info.run_id)


def test_a_tracking_server_that_is_down_leaves_the_cell_to_complete_with_one_warning(ip, monkeypatch, capsys):
    from mpi_magic.shared.procs import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    run(ip, "-i 2 -g 2 --mlflow nowhere", "import mpi_magic\nmpi_magic.log(loss=1.0)\nvalue = 3\n")
    assert ip.user_ns["value"] == 3
    said = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(said) == 1 and said[0].startswith("mpi_magic: MLflow did not take the run of job "), said
    assert "nothing answers at" in said[0]


def test_a_tracking_server_that_never_answers_holds_the_cell_up_only_for_its_probe(ip, monkeypatch, capsys):
    with socket.socket() as listening:  # takes connections (the backlog) and answers none
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{listening.getsockname()[1]}")
        started = time.monotonic()
        run(ip, "-i 1 -g 2 --mlflow silent --out job", "import mpi_magic\nmpi_magic.log(loss=1.0)\nvalue = 4\n")
        took = time.monotonic() - started
    assert ip.user_ns["value"] == 4
    job = ip.user_ns["job"].model
    # the probe runs beside the job: at worst the cell waits for all of it after the job (not FINISH_WAIT)
    assert took < (job.ended_at - job.started_at) + PROBE_SECONDS + 3.0, (took, job.ended_at - job.started_at)
    said = [line for line in capsys.readouterr().err.splitlines() if "MLflow" in line]
    assert len(said) == 1 and "nothing answers at" in said[0] and "timed out" in said[0], said


@contextlib.contextmanager
def server_silent_after_its_probe():
    """A tracking server that answers the probe (``/health``) and then holds every request unanswered
    until the block ends, when it goes away; its URI."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.settimeout(0.1)
    held: list[socket.socket] = []
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                connection, _ = listening.accept()
            except TimeoutError:
                continue
            if connection.recv(65536).startswith(b"GET /health"):
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
                connection.close()
            else:
                held.append(connection)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        listening.close()
        for connection in held:
            connection.close()


def test_an_interrupted_cell_does_not_wait_for_its_run_and_the_writer_gives_a_lost_server_up_soon(ip, monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # unset, and as it was after the test
    interrupted = []
    with server_silent_after_its_probe() as uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        with once_running(ip, lambda: interrupted.append(time.monotonic()), _thread.interrupt_main, pause=0.5), \
                pytest.raises(KeyboardInterrupt):
            run(ip, "-i 1 -g 2 --mlflow held --out job", "import time\ntime.sleep(60)\n")
        took = time.monotonic() - interrupted[0]
        writers = [thread for thread in threading.enumerate() if thread.name.startswith("mpi_magic tracking")]
        assert took < 5.0, took  # the job's stop, not FINISH_WAIT more for a run the server holds
        assert writers and all(writer.is_alive() for writer in writers)
    gone = time.monotonic()  # the server is gone: the writer's requests fail and are tried again a little only
    for writer in writers:
        writer.join(30)
    assert not any(writer.is_alive() for writer in writers), "the writer still retries"
    assert time.monotonic() - gone < 20, time.monotonic() - gone


def test_the_option_without_an_experiment_is_one_sentence(ip):
    with pytest.raises(UsageError, match="expected one argument") as missing:
        run(ip, "--mlflow", "x = 1")
    with pytest.raises(UsageError, match="--mlflow takes the name of an MLflow experiment") as empty:
        run(ip, "--mlflow ''", "x = 1")
    assert "\n" not in str(missing.value) + str(empty.value)


def test_without_mlflow_the_option_says_what_installs_it(ip, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(UsageError) as refused:
        run(ip, "--mlflow an-experiment", "x = 1")
    assert str(refused.value) == "--mlflow needs MLflow, which is not installed: pip install 'mlflow>=2.16'"


def test_mlflows_own_variables_choose_the_experiment():
    chosen = Config({"MLFLOW_TRACKING_URI": "http://tracking", "MLFLOW_EXPERIMENT_NAME": "theirs"})
    assert chosen.lookup("mlflow") == ("theirs", "MLFLOW_EXPERIMENT_NAME")
    assert Config({"MLFLOW_EXPERIMENT_NAME": "theirs"}).get("mlflow") is None  # no tracking URI: MLflow's own store


def test_the_missing_package_is_named_with_the_extras_own_requirement():
    import os
    import tomllib

    from mpi_magic.errors import INSTALL_MLFLOW

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["optional-dependencies"]["mlflow"]
    assert INSTALL_MLFLOW == "pip install " + " ".join(f"'{requirement}'" for requirement in declared)
