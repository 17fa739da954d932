"""Sessions on SageMaker over real HTTP: unchanged boto3 against a moto server (S3, CloudWatch
Logs) and mpi_magic's SageMaker emulator, which runs the session's training job until it is
stopped or ends itself. One server of each for the module (``local_aws_env``); each test keeps
to its own S3 prefix and its own jobs. A session that loses its notebook or its instances is in
``test_sagemaker_session_faults``."""

from __future__ import annotations

import _thread
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import BUCKET, described, forge_end_record, leader_log, once, run, start_session, wait_until, waiting_for
from IPython.core.error import UsageError

import mpi_magic
from mpi_magic.shared import payload, s3channel
from mpi_magic.backends.sagemaker import session_ranks
from mpi_magic.backends.sagemaker.pricing import PRICES
from mpi_magic.shared.cost import dollars
from mpi_magic.errors import RemoteRankError

def test_a_4x2_session_keeps_state_sends_a_value_once_and_stop_ends_in_stopped(cloud_sessions, aws, capsys):
    ip = cloud_sessions
    s = start_session(ip, "-i 4 -g 2")
    assert (s.status, s.world_size, s.backend, s.job_name) == ("idle", 8, "sagemaker", s.name)
    assert described(aws, s.job_name)["TrainingJobStatus"] == "InProgress"
    pids = {r.pid for r in s.ranks}
    run(ip, "--quiet", "import mpi_magic, os\ncounter = 10 * mpi_magic.rank()")
    ip.user_ns["weights"] = np.arange(200_000, dtype=np.float64)  # 1.6 MB
    run(ip, "--quiet", "counter += 1\nfirst = float(weights.sum())")
    sent = s.bytes_sent
    run(ip, "--quiet --gather", "seen = (counter, float(weights[-1]), os.getpid(), os.environ['SAGEMAKER_BASE_DIR'][-6:])")
    assert ip.user_ns["seen"] == [(10 * r + 1, 199_999.0, ip.user_ns["seen"][r][2], f"algo-{r // 2 + 1}")
                                  for r in range(8)]
    assert {seen[2] for seen in ip.user_ns["seen"]} == pids, "the same processes ran every cell"
    assert ip.user_ns["first"] == float(ip.user_ns["weights"].sum())
    assert s.bytes_sent == sent and s.cells == 3
    s3 = aws.client("s3")
    prefix = s3channel.session_uri(f"jobs/{s.job_name}")  # under this test's s3_root
    sizes = {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in
             s3.list_objects_v2(Bucket=BUCKET, Prefix=os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1])["Contents"]
             if "/payloads/" in o["Key"]}
    assert sizes["00000002.bin"] > 1_600_000, "the weights crossed S3 once, as an object of their own"
    assert "00000003.bin" not in sizes, "a small payload comes in the cell's signed message"
    assert prefix  # the layout's owner names it

    with pytest.raises(UsageError, match=f"this cell asks for --instance-type ml.g5.xlarge, but session {s.name} runs"):
        run(ip, "--instance-type ml.g5.xlarge", "x = 1")  # its job has its instances already
    run(ip, "--quiet --instance-type ml.m5.xlarge", "same_type = 1")  # the session's own: fine

    capsys.readouterr()
    ip.run_line_magic("mpirun_session", "")
    shown = capsys.readouterr().out
    assert f"session {s.name}: sagemaker, 4 x 2 = 8 ranks, idle" in shown
    assert f"training job: {s.job_name}, InProgress (Training)" in shown
    assert "ranks alive: 8/8, cells run: 4, idle for:" in shown
    # the instance time billed so far, at the shipped table's price (rounded to the second shown)
    billed = re.search(r"billable instance time: (\d+)s \(4 x ml.m5.xlarge\), about (\S+)", shown)
    hourly = PRICES[aws.session.Session().region_name]["ml.m5.xlarge"]
    assert billed and billed[2] in {dollars(hourly * (int(billed[1]) + d) / 3600) for d in (-1, 0, 1)}
    run(ip, "--quiet --out job", "y = 1")  # a short cell's view starts from what has been billed so far
    assert ip.user_ns["job"].model.billable_seconds() >= int(billed[1])
    ip.run_line_magic("mpirun_session", "stop")
    shown = capsys.readouterr().out
    assert "stopped: 5 cells run" in shown and f"training job: {s.job_name}, Stopped" in shown
    assert s.status == "stopped" and described(aws, s.job_name)["TrainingJobStatus"] == "Stopped"
    assert s.ended_reason == "stopped from the notebook", "as a local session's says"


def test_failures_interrupts_and_a_cell_not_signed_by_the_notebook(cloud_sessions, aws, tmp_path, capsys, monkeypatch):
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 1")
    run(ip, "--quiet", "import mpi_magic\nkept = 'state'")
    with pytest.raises(RemoteRankError) as raised:
        run(ip, "--quiet", "seen = kept * 2\nif mpi_magic.rank() == 1:\n    raise ValueError('bad input on 1')\nother = 1")
    assert raised.value.failures[0].rank == 1 and "bad input on 1" in str(raised.value)
    assert s.status == "idle", "a failure every rank got back from keeps the session"
    monkeypatch.setattr(sys, "stdin", io.StringIO("p seen\nq\n"))  # the failed rank's frames, through S3
    capsys.readouterr()
    ip.run_line_magic("mpirun_debug", "")
    assert "'statestate'" in capsys.readouterr().out

    # Someone who may write to the bucket puts the next cell there, signed by a key of their own.
    marker = tmp_path / "forged-cell-ran"
    forged = tmp_path / "forged"
    forged.mkdir()
    digest = payload.write(str(forged / payload.PAYLOAD_FILE), [],
                           {"source": f"open({str(marker)!r}, 'w').write('ran')\n", "returns": [], "gather": False,
                            "display": False})
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    uri = s3channel.session_uri(f"s3://{BUCKET}/{root}/{s.job_name}")
    intruder = s3channel.NotebookEnd(aws.client("s3"), uri, s.job_name, s3channel.Signer())
    assert digest
    intruder.send_cell(3, str(forged / payload.PAYLOAD_FILE))
    assert wait_until(lambda: any("refused" in line for line in leader_log(aws, s.job_name)), 20)
    refusal = [line for line in leader_log(aws, s.job_name) if "refused" in line]
    assert f"refused {s3channel.message_uri(uri, 3)}: not signed by the notebook's key; it was not run" in refusal[0]
    run(ip, "--quiet --out job", "third = kept")  # the notebook's own cell 3 takes the place of the forged one
    assert ip.user_ns["third"] == "state" and not marker.exists()
    # said between cells, so the log brings it (before the cell, with it, or at the idle session's next read)
    assert wait_until(lambda: any("not signed by the notebook's key; it was not run" in line for line in
                                  s.said_between_cells(limit=50) + ip.user_ns["job"].logs(0).splitlines()), 30)

    with once(lambda: s.status == "running", _thread.interrupt_main, pause=2), pytest.raises(KeyboardInterrupt):
        run(ip, "--quiet", "import time\ncaught = True\nif mpi_magic.rank() == 1:  # rank 0 is back at once\n"
                           "    caught = False\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n"
                           "        caught = True\n        raise")
    assert s.status == "idle" and described(aws, s.job_name)["TrainingJobStatus"] == "InProgress"
    assert "interrupted on every rank; session" in capsys.readouterr().err
    run(ip, "--quiet --gather", "back = (kept, caught)")
    assert ip.user_ns["back"] == [("state", True)] * 2

    with pytest.raises(mpi_magic.MpiMagicError):
        run(ip, "--quiet", "import os\nif mpi_magic.rank() == 1:\n    os._exit(3)\nimport time\ntime.sleep(30)")
    assert s.status == "stopped" and s.ended_reason
    assert described(aws, s.job_name)["TrainingJobStatus"] == "Failed"


def test_a_cell_whose_log_tells_its_end_before_its_record_is_read_still_gets_its_results_and_each_line_once(
        cloud_sessions, monkeypatch):
    """S3 slower than CloudWatch for once (stood for here: the notebook's reads of end records find
    nothing for 2 s after each cell is sent): the log ends the cell first, and the small results,
    which are only in the record, are waited for."""
    hidden_until = [0.0]
    send_cell, end_record = s3channel.NotebookEnd.send_cell, s3channel.NotebookEnd.end_record

    def sent(self, *args, **kwargs):
        record = send_cell(self, *args, **kwargs)
        hidden_until[0] = time.monotonic() + 2.0
        return record

    def slow(self, *args, **kwargs):
        return None if time.monotonic() < hidden_until[0] else end_record(self, *args, **kwargs)

    ip = cloud_sessions
    start_session(ip, "-i 2 -g 1")
    monkeypatch.setattr(s3channel.NotebookEnd, "send_cell", sent)
    monkeypatch.setattr(s3channel.NotebookEnd, "end_record", slow)
    started = time.monotonic()
    run(ip, "--quiet --gather --out job", "import mpi_magic\nprint('hello from', mpi_magic.rank())\n"
                                          "value = mpi_magic.rank() * 10")
    assert time.monotonic() - started >= 2.0, "the results waited for the record"
    assert ip.user_ns["value"] == [0, 10]
    job = ip.user_ns["job"]
    assert [job.logs(rank).splitlines() for rank in range(2)] == [["hello from 0"], ["hello from 1"]]


def test_an_end_record_someone_else_put_never_costs_a_cell_its_results(cloud_sessions, aws, monkeypatch, tmp_path):
    """Objects put where a cell's end record goes (signed by another key, unsigned, over 16 MiB)
    are refused. Put while the cell runs, rank 0's record replaces them and the notebook, which
    kept looking, reads it. Put after rank 0's record (which the notebook had not read: S3 answered
    it late, stood for here), the record is gone: the cell says so in one sentence, and the names
    it assigned keep the notebook's values from before it, which are not sent over the ranks' own."""
    ip = cloud_sessions
    s = start_session(ip, "-i 2 -g 1")
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    uri = s3channel.session_uri(f"s3://{BUCKET}/{root}/{s.job_name}")
    ip.user_ns["value"] = "stale"
    run(ip, "--quiet", "import mpi_magic, time")
    record = {"cell": 0, "job": s.job_name, "ranks": []}
    forgeries = {"not signed by rank 0's key": s3channel.Signer().sign(record),
                 "not a signed message": json.dumps(record).encode(),
                 f"larger than {s3channel.MAX_END_RECORD} bytes": b"{" * (s3channel.MAX_END_RECORD + 1)}
    for reason, forgery in forgeries.items():
        cell = s.cells + 1
        marker = str(tmp_path / f"forged-{cell}")
        forged = forge_end_record(aws, uri, cell, forgery, marker=marker)
        # the cell ends once the forgery is there and the notebook has had time for a look at it
        run(ip, "--quiet --gather --out job", waiting_for(marker) + f"time.sleep({session_ranks.END_LOOK_SLOW + 0.5})\n"
            f"value = ({cell}, mpi_magic.rank())")
        assert forged.is_set()
        assert ip.user_ns["value"] == [(cell, 0), (cell, 1)], reason
        assert [note for note in ip.user_ns["job"].model.notes if "refused" in note and reason in note], \
            f"the notebook read the forgery ({reason}) before rank 0's record"

    cell = s.cells + 1
    forged = forge_end_record(aws, uri, cell, forgeries["not a signed message"], after_rank0=True)
    end_record = s3channel.NotebookEnd.end_record
    with monkeypatch.context() as late:
        late.setattr(session_ranks, "RECORD_WAIT", 3.0)  # (20 s) for the record that cannot come any more
        late.setattr(s3channel.NotebookEnd, "end_record",
                     lambda self, *args, **kwargs: end_record(self, *args, **kwargs) if forged.is_set() else None)
        with pytest.raises(mpi_magic.MpiMagicError) as lost:
            run(ip, "--quiet --gather", f"value = ({cell}, mpi_magic.rank())\nalso = 'new'")
    assert forged.is_set()
    said = str(lost.value)
    assert said.startswith(f"the results of cell {cell} could not be read: the object where its end record goes is "
                           "not rank 0's record (not a signed message") and "\n" not in said, said
    assert said.endswith("; here value, also keep what they held before the cell, and later cells use the ranks' "
                         "values (rebind a name here to send yours)")
    assert ip.user_ns["value"] == [(cell - 1, 0), (cell - 1, 1)] and "also" not in ip.user_ns, "nothing assigned"
    run(ip, "--quiet --gather", "again = (value, also)")
    assert ip.user_ns["again"] == [((cell, 0), "new"), ((cell, 1), "new")], "the ranks kept what the cell assigned"


def test_a_kernel_that_exits_cleanly_stops_its_session_at_once(aws, cloud_settings, local_aws_env, tmp_path):
    env = {**os.environ, **local_aws_env, **cloud_settings, "MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache")}
    script = ("from IPython.core.interactiveshell import InteractiveShell\n"
              "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'mpi_magic')\n"
              "ip.run_line_magic('mpirun_session', 'start -i 1 -g 1 --out s --quiet')\n"
              "print('JOB', ip.user_ns['s'].job_name, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    job_name = out.stdout.split("JOB ")[1].split()[0]
    assert described(aws, job_name)["TrainingJobStatus"] in ("Stopping", "Stopped"), "StopTrainingJob at exit"
    assert wait_until(lambda: described(aws, job_name)["TrainingJobStatus"] == "Stopped", 30)


def test_what_cannot_start_or_be_taken_over_is_one_sentence(cloud_sessions, aws, monkeypatch):
    ip = cloud_sessions
    monkeypatch.setenv("MPI_MAGIC_HEARTBEAT_LIMIT", "1")
    with pytest.raises(mpi_magic.MpiMagicError, match=r"heartbeat_limit \(1s\) must be longer than heartbeat \(1s\)"):
        ip.run_line_magic("mpirun_session", "start -i 1 -g 1")
    root = os.environ["MPI_MAGIC_S3_ROOT"].split(BUCKET + "/")[1]
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=root), "nothing uploaded"
    with pytest.raises(mpi_magic.MpiMagicError, match="no training job 'no-such-session'") as refused:
        ip.run_line_magic("mpirun_session", "attach no-such-session")
    assert "\n" not in str(refused.value)


def test_two_notebooks_never_both_hold_a_session_the_later_claim_wins(aws, tmp_path):
    uri, job = f"s3://{BUCKET}/jobs/{tmp_path.name}/session", "held-job"
    signer = s3channel.Signer()
    first = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)
    first.beat()
    time.sleep(0.01)
    later = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)  # %mpirun_session attach
    first.beat()  # the first one may beat once more before the later one's first beat
    later.beat()
    with pytest.raises(s3channel.TakenOver, match=f"another notebook took session {job} over"):
        first.beat()
    with pytest.raises(s3channel.TakenOver):
        first.check_held()  # as before sending a cell
    later.beat()
    later.check_held()


def test_ranks_started_again_never_run_a_cell_sent_before(aws, tmp_path):
    """After a restart, rank 0 waits for the cell after the last one the notebook sent."""
    uri, job = f"s3://{BUCKET}/jobs/{tmp_path.name}/session", "spot-job"
    (tmp_path / payload.PAYLOAD_FILE).write_bytes(b"payload")
    signer = s3channel.Signer()
    notebook = s3channel.NotebookEnd(aws.client("s3"), uri, job, signer)
    for cell in (1, 2):
        notebook.send_cell(cell, str(tmp_path / payload.PAYLOAD_FILE))
    rank0 = s3channel.S3RankEnd(uri, signer.public_text, None, job)
    rank0.skip_cells_sent()
    assert rank0.receive(timeout=0.5) is None
    notebook.send_cell(3, str(tmp_path / payload.PAYLOAD_FILE))
    assert rank0.receive(timeout=5)["cell"] == 3


