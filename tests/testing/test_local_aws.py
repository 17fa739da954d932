"""The rehearsal cloud as a user starts it: one command that prints the environment to export, or one
line in a notebook; either way its servers end with what started them, and nothing else ends them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import nbformat
import psutil
import pytest
from helpers import command_of, run, wait_until
from notebook_runs import execute, text_of

from mpi_magic.testing import sagemaker_emulator

SERVERS = ("mpi_magic.testing.moto_live_tail", "mpi_magic.testing.sagemaker_emulator")
ENDPOINTS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SAGEMAKER")
CELL_ON_THE_CLOUD = ("--backend sagemaker --instance-type ml.m5.xlarge -i 2 -g 1 --quiet",
                     "import mpi_magic\nsize = mpi_magic.world_size()\n")


def servers_of(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if any(s in command_of(p) for s in SERVERS)]


def answers(endpoint: str) -> bool:
    host, port = endpoint.rsplit("//", 1)[1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def gone(processes: list[psutil.Process], endpoints: list[str], limit: float = 30) -> bool:
    return wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)
                      and not any(answers(e) for e in endpoints), limit)


def test_the_command_prints_what_to_export_serves_a_cell_and_ends_its_servers_on_ctrl_c(ip, monkeypatch):
    command = subprocess.Popen([sys.executable, "-m", "mpi_magic.testing.local_aws"], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)  # a terminal of its own
    try:
        printed = []
        for line in command.stdout:
            printed.append(line)
            if not line.startswith(("export ", "#")):
                break
        exports = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in printed
                       if line.startswith("export "))
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", *ENDPOINTS,
                "MPI_MAGIC_ROLE", "MPI_MAGIC_S3_ROOT", "MPI_MAGIC_IMAGE_URI"} <= set(exports), printed
        servers = servers_of(command.pid)
        assert len(servers) == 2
        for name, value in exports.items():  # as the user's shell would have them, after the export lines
            monkeypatch.setenv(name, value)
        run(ip, *CELL_ON_THE_CLOUD)
        assert ip.user_ns["size"] == 2
        os.killpg(command.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert command.wait(60) == 0
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        command.stdout.close()
    assert gone(servers, [exports[e] for e in ENDPOINTS])


def test_the_command_serves_the_command_it_is_given_and_ends_with_it():
    script = ("import boto3, json, os, sys\n"
              "print(json.dumps({'buckets': [b['Name'] for b in boto3.client('s3').list_buckets()['Buckets']],\n"
              "                  'endpoints': [os.environ[name] for name in %r]}))\n"
              "sys.exit(3)\n" % (ENDPOINTS,))
    done = subprocess.run([sys.executable, "-m", "mpi_magic.testing.local_aws", "--", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr  # the command's own
    seen = json.loads(done.stdout)
    assert seen["buckets"] == ["mpi-magic-rehearsal"] and not any(answers(e) for e in seen["endpoints"])


def test_one_line_in_a_notebook_rehearses_there_until_the_kernel_exits_and_an_interrupt_leaves_it_up(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        "from mpi_magic.testing import rehearse\nrehearse()",
        "import json, os, psutil\n"
        "print(json.dumps({'pids': [p.pid for p in psutil.Process().children(recursive=True)],\n"
        "                  'endpoints': [os.environ[name] for name in %r]}))" % (ENDPOINTS,),
        # Jupyter interrupts a kernel by signalling its process group
        "import signal, time\ntry:\n    os.killpg(os.getpgrp(), signal.SIGINT)\n    time.sleep(5)\n"
        "except KeyboardInterrupt:\n    print('interrupted')",
        "%load_ext mpi_magic",
        f"%%mpirun_remote {CELL_ON_THE_CLOUD[0]}\n{CELL_ON_THE_CLOUD[1]}",
        "print(size)",
    )])
    path = tmp_path / "rehearsal.ipynb"
    nbformat.write(nb, path)
    ran = execute.run(str(path), {"MPI_MAGIC_CACHE_DIR": str(tmp_path / "cache"), "MPI_MAGIC_VIEW": "text"},
                      str(tmp_path))
    outputs = [text_of(cell.outputs) for cell in ran.cells]
    assert "SageMaker emulator" in outputs[0] and outputs[2].strip() == "interrupted"
    assert outputs[5].strip() == "2", "the cloud served the cell after the interrupt"
    started = json.loads(outputs[1])
    servers = [psutil.Process(pid) for pid in started["pids"] if psutil.pid_exists(pid)]
    assert gone(servers, started["endpoints"]), "the servers ended with the kernel"


def test_the_servers_end_when_the_python_that_started_them_is_killed():
    script = ("import json, os, sys, time\nfrom mpi_magic.testing import rehearse\nrehearse()\n"
              "print(json.dumps([os.environ[name] for name in %r]), flush=True)\ntime.sleep(600)\n" % (ENDPOINTS,))
    started = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(started.stdout.readline())
        servers = servers_of(started.pid)
        assert len(servers) == 2 and all(answers(e) for e in endpoints)
    finally:
        started.kill()
        started.wait()
        started.stdout.close()
    assert gone(servers, endpoints)


def test_a_rehearsal_told_to_keep_its_instances_on_this_machine_runs_them_all_here(ip, monkeypatch):
    """As where no test host can be made (not root): every instance on this machine, the ssh stand-in between them."""
    from mpi_magic.testing.local_aws import local_aws, rehearsal_settings

    monkeypatch.setenv("MPI_MAGIC_EMULATOR_HOSTS", "stand-in")
    with local_aws() as env:
        for name, value in {**env, **rehearsal_settings(env)}.items():
            monkeypatch.setenv(name, value)
        run(ip, "--backend sagemaker --instance-type ml.m5.xlarge -i 2 -g 2 --gather --quiet",
            "import os, socket\nwhere = (socket.gethostname(), os.path.basename(os.environ['SAGEMAKER_BASE_DIR']))\n")
    assert ip.user_ns["where"] == [(socket.gethostname(), f"algo-{rank // 2 + 1}") for rank in range(4)]


def test_the_emulator_says_in_a_sentence_where_its_instances_cannot_run(monkeypatch):
    emulator = [sys.executable, "-m", "mpi_magic.testing.sagemaker_emulator", "--port", "0"]
    done = subprocess.run(emulator, env={**os.environ, "MPI_MAGIC_EMULATOR_HOSTS": "elsewhere"}, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.endswith(": error: MPI_MAGIC_EMULATOR_HOSTS is auto, test-hosts or stand-in, not 'elsewhere'\n")
    monkeypatch.setattr(os, "geteuid", lambda: 65534)  # (not root: no test hosts)
    with pytest.raises(ValueError) as refused:
        sagemaker_emulator.hosts_choice("test-hosts")
    assert str(refused.value) == ("the emulated instances cannot run on test hosts here: test hosts need root "
                                  "(network namespaces and interfaces): run as root")
