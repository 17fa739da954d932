"""Helpers shared by the tests."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import psutil
import pytest

BUCKET = "mpi-magic-tests"  # on each test module's own moto server (the ``aws`` fixture)
ROLE = "arn:aws:iam::123456789012:role/mpi-magic-test"
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def run(ip, line: str, cell: str):
    """Run ``cell`` under ``%%mpirun_remote line`` in the shell ``ip``."""
    return ip.run_cell_magic("mpirun_remote", line, cell)


def remote_cell(ip, line: str, cell: str) -> tuple[str, BaseException | None]:
    """Run ``cell`` under ``%%mpirun_remote line`` as the notebook's next numbered cell, as a notebook
    runs it: (its name as IPython's tracebacks give it, "Cell In[5]"; what it raised, None if nothing)."""
    result = ip.run_cell(f"%%mpirun_remote {line}\n{cell}", store_history=True)
    return f"Cell In[{ip.execution_count - 1}]", result.error_in_exec


@contextlib.contextmanager
def once(ready, *actions, pause: float = 0.3, limit: float = 60.0):
    """While the block runs a cell: once ``ready()`` holds (or after ``limit`` seconds), do each
    action, ``pause`` seconds apart (``_thread.interrupt_main`` is Ctrl-C)."""
    def act():
        deadline = time.monotonic() + limit
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        for action in actions:
            time.sleep(pause)
            action()

    thread = threading.Thread(target=act)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def ranks_running(ip) -> bool:
    """Whether every rank of the job named ``job`` in the notebook runs."""
    job = ip.user_ns.get("job")
    return job is not None and all(r.status == "running" for r in job.ranks)


def once_running(ip, *actions, pause: float = 0.3, limit: float = 60.0):
    """``once`` every rank of the job named ``job`` in the notebook runs."""
    return once(lambda: ranks_running(ip), *actions, pause=pause, limit=limit)


def held_folders(pid: int | str = "self") -> set[str]:
    """The scratch folders (``mpi_magic.backends.scratch``) process ``pid`` holds, read from its open files."""
    from mpi_magic.backends.scratch import LOCK_NAME

    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own, for this process)
            continue
        if target.endswith("/" + LOCK_NAME):
            held.add(os.path.dirname(target))
    return held


# -- sessions, here and on the rehearsal cloud -------------------------------------------------

def start_session(ip, line: str = "-i 2 -g 2"):
    """Start a session with ``line``'s options; its handle."""
    ip.run_line_magic("mpirun_session", f"start {line} --out s --quiet")
    return ip.user_ns["s"]


def described(aws, job_name: str) -> dict:
    """DescribeTrainingJob's answer."""
    return aws.client("sagemaker").describe_training_job(TrainingJobName=job_name)


def uploaded(aws, prefix: str) -> list[str]:
    """The keys of every S3 object under a test's ``prefix``."""
    return [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])]


def training_jobs(aws) -> list[str]:
    """The names of every training job the rehearsal cloud has seen."""
    pages = aws.client("sagemaker").get_paginator("list_training_jobs").paginate()
    return [job["TrainingJobName"] for page in pages for job in page["TrainingJobSummaries"]]


def leader_log(aws, job_name: str) -> list[str]:
    """Every line of the job's first instance's log, from the start."""
    logs = aws.client("logs")
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/algo-1-")
    name = streams["logStreams"][0]["logStreamName"]
    lines, token = [], None
    while True:
        reply = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=name,
                                    **({"nextToken": token} if token else {"startFromHead": True}))
        lines += [e["message"] for e in reply["events"]]
        if not reply["events"] or reply["nextForwardToken"] == token:
            return lines
        token = reply["nextForwardToken"]


def forge_end_record(aws, uri: str, cell: int, forgery: bytes, after_rank0: bool = False,
                     marker: str | None = None) -> threading.Event:
    """Someone who may read and write a SageMaker session's prefix (``uri``), from a thread: once the
    notebook's message for ``cell`` is there (with ``after_rank0``, once rank 0's end record of the
    cell is there too), ``forgery`` is put where that record goes; the event returned is set then,
    and the file ``marker`` made, which a cell can wait for (``waiting_for(marker)``)."""
    import json

    from mpi_magic.shared import s3channel
    from mpi_magic.shared.layout import split_s3

    s3, forged = aws.client("s3"), threading.Event()

    def found(at: str) -> bytes | None:
        bucket, key = split_s3(at)
        try:
            return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None

    def forge():
        message = s3channel.message_uri(uri, cell)
        if not wait_until(lambda: found(message) is not None, 60):
            return
        body = json.loads(json.loads(found(message))["body"])  # readable, if not forgeable
        record = s3channel.end_uri(uri, cell, body["end_nonce"])
        if after_rank0 and not wait_until(lambda: found(record) is not None, 60):
            return
        bucket, key = split_s3(record)
        s3.put_object(Bucket=bucket, Key=key, Body=forgery)
        forged.set()
        if marker:
            open(marker, "w").close()

    threading.Thread(target=forge, name="end record forger", daemon=True).start()
    return forged


def waiting_for(marker: str, seconds: float = 30) -> str:
    """Cell code that waits (``seconds`` at most) until the file ``marker`` exists: a cell's end
    ordered after something a test does meanwhile, on however loaded a machine."""
    return (f"import os as _os, time as _time\nfor _ in range({int(seconds / 0.05)}):\n"
            f"    if _os.path.exists({marker!r}):\n        break\n    _time.sleep(0.05)\n")


def job_story(aws, job_name: str) -> str:
    """What a job went through, for a failing assertion: its status, transitions and each stream's last lines."""
    job = described(aws, job_name)
    lines = [f"{job['TrainingJobStatus']} {job.get('FailureReason', '')}"]
    lines += [f"  {t['Status']}: {t.get('StatusMessage', '')}" for t in job["SecondaryStatusTransitions"]]
    logs = aws.client("logs")
    for stream in logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=job_name)["logStreams"]:
        reply = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream["logStreamName"], startFromHead=False)
        lines += [f"{stream['logStreamName']}:"] + [f"  {e['message'].rstrip()}" for e in reply["events"][-30:]]
    return "\n".join(lines)


def slurm_missing() -> str | None:
    """Why a Slurm cluster cannot run on this machine, saying how to install Slurm; None where it can."""
    from mpi_magic.testing.slurm_cluster import PACKAGES, missing_programs

    if not missing_programs():
        return None
    return f"Slurm is not installed here: apt-get install {PACKAGES} (./dev.sh test installs it, as root)"


def needs_slurm():
    """The mark of a test that runs a Slurm cluster on this machine: skipped where Slurm is not installed."""
    missing = slurm_missing()
    return pytest.mark.skipif(missing is not None, reason=missing or "")


BUSY_CELL = (  # ranks that talk to each other until the test is over (a fault test's cell)
    "import time\n"
    "from mpi4py import MPI\n"
    "for step in range(1200):\n"
    "    MPI.COMM_WORLD.allreduce(step)\n"
    "    time.sleep(0.05)\n"
)


def needs_hosts():
    """The mark of a test that runs on test hosts (mpi_magic.testing.hosts): skipped, with the bed's own
    sentence, where they cannot be made (not root, or a program missing)."""
    from mpi_magic.testing.hosts import missing

    why = missing()
    return pytest.mark.skipif(why is not None, reason=why or "")


def kubernetes_left(cluster, job_name: str | None = None) -> list[str]:
    """What of the MPIJob ``job_name`` (of any job, without) is on the Kubernetes emulator ``cluster``: the
    job and its pods, by name."""
    from kubernetes import client, config

    from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION
    from mpi_magic.backends.kubernetes.manifest import JOB_LABEL

    api = config.new_client_from_config(config_file=cluster.kubeconfig)
    try:
        jobs = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
        pods = client.CoreV1Api(api).list_namespaced_pod(
            "default", label_selector=f"{JOB_LABEL}={job_name}" if job_name else "").items
        return [j["metadata"]["name"] for j in jobs if job_name in (None, j["metadata"]["name"])] + \
            [p.metadata.name for p in pods]
    finally:
        api.close()


def needs_torch():
    """The mark of a test that trains with torch: skipped, saying how to install its CPU build, where torch
    is not installed (.ci/run installs it; a large download that a test run need not make)."""
    import importlib.util

    return pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                              reason="torch is not installed here: .venv/bin/pip install torch "
                                     "--index-url https://download.pytorch.org/whl/cpu")


SLURM_GONE_WITHIN = 10.0  # seconds after a stop by which squeue must show nothing of the job


def killed_kernel_job(cluster, cache_dir: str, start: str, handle: str) -> str:
    """The name of the Slurm job a kernel left when SIGKILLed: a Python with an IPython shell ``ip``
    runs ``start`` (which keeps its job handle under ``handle``), and is killed once squeue lists the job."""
    import subprocess
    import sys
    import textwrap

    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import os, time
        from IPython.core.interactiveshell import InteractiveShell
        os.environ["MPI_MAGIC_CACHE_DIR"] = {cache_dir!r}
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpi_magic")
        ip.run_line_magic("mpirun_config", "view=text")
        {start}
        print(ip.user_ns[{handle!r}].name, flush=True)
        time.sleep(300)
        """)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **cluster.environ})
    try:
        name = kernel.stdout.readline().strip()
        assert name and wait_until(lambda: slurm_listed(cluster, name), 30), slurm_queue(cluster)
    finally:
        kernel.kill()
        kernel.wait()
        kernel.stdout.close()
    return name


def slurm_queue(cluster) -> list[str]:
    """The jobs squeue lists on ``cluster`` (pending, running, completing), as 'id name state reason'."""
    return [line for line in cluster.run("squeue", "-h", "-o", "%i %j %T %r").stdout.splitlines() if line.strip()]


def slurm_listed(cluster, job_name: str) -> bool:
    return any(line.split()[1] == job_name for line in slurm_queue(cluster))


@contextlib.contextmanager
def node_down(cluster, node: str, reason: str, ready):
    """While the block runs a cell: once ``ready()`` holds, Slurm is told that ``node`` is down for
    ``reason`` (as slurmctld marks a node that stopped answering); the node is back in service after."""
    down = lambda: cluster.run("scontrol", "update", f"nodename={node}", "state=down", f"reason={reason}")  # noqa: E731
    try:
        with once(ready, down):
            yield
    finally:
        resume(cluster, node)


def resume(cluster, node: str) -> None:
    """``node`` back in service, once slurmctld has heard from it again (until then it takes no job, and
    the next test's would go to other nodes)."""
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    assert wait_until(lambda: cluster.run("sinfo", "-h", "-n", node, "-o", "%t").stdout.split()[:1] == ["idle"], 30), \
        cluster.run("sinfo", "-h", "-n", node, "-o", "%t %E").stdout


def command_of(process: psutil.Process) -> str:
    """A process's command line, or "" when it ended (or is a zombie) since it was listed."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def wait_until(check, limit: float) -> bool:
    """Whether ``check()`` came true within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


# -- jobs reopened later ---------------------------------------------------------------------

def job_facts(job) -> dict:
    """What a job handle shows of a job that ended (status, ranks, logs, metrics, failure, summary), as JSON
    reads it back: the same from the cell's handle and from ``mpi_magic.Job.load`` in another Python."""
    import json

    error = job.model.error()
    facts = {"name": job.name, "status": job.status, "backend": job.backend,
             "ranks": [(r.rank, r.instance, r.host, r.status, r.n, r.total, r.peak_rss, r.rss) for r in job.ranks],
             "logs": {rank: job.logs(rank) for rank in range(job.world_size)}, "all": job.logs(),
             "metrics": job.metrics, "error": None if error is None else f"{type(error).__name__}: {error}",
             "roll_call": job.model.roll_call, "summary": repr(job.summary), "html": job.summary._repr_html_()}
    return json.loads(json.dumps(facts))


def reopened_facts(cache_dir: str, name: str) -> dict:
    """``job_facts`` of job ``name`` reopened with ``mpi_magic.Job.load`` in a new Python (a kernel restarted)."""
    import json
    import subprocess
    import sys

    script = ("import json, sys\n"
              f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
              "import mpi_magic\n"
              "from helpers import job_facts\n"
              f"print(json.dumps(job_facts(mpi_magic.Job.load({name!r}))))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MPI_MAGIC_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
