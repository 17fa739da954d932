"""A rehearsal AWS on loopback: a moto server (S3, CloudWatch Logs with Live Tail streamed as AWS
streams it, STS) and the SageMaker emulator, with the environment that points unchanged boto3 at them.

    with local_aws() as env:
        os.environ.update(env)      # then %%mpirun_remote --backend sagemaker ... runs here
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from ..shared.procs import free_port


def _wait_for_port(port: int, process: subprocess.Popen, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {limit:g}s")


@contextlib.contextmanager
def local_aws(root: str | None = None, region: str = "us-east-1", pace: str = "none",
              instance_start: float | None = None):
    """Start both servers (at ``pace``: ``aws_pace``); yield the environment for boto3; stop them
    (and their jobs) on exit."""
    moto_port, emulator_port = free_port(), free_port()
    own_root = root is None
    root = root or tempfile.mkdtemp(prefix="mpi_magic_local_aws_")
    env = {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": region,
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{moto_port}",
        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": f"http://127.0.0.1:{moto_port}",
        "AWS_ENDPOINT_URL_STS": f"http://127.0.0.1:{moto_port}",
        "AWS_ENDPOINT_URL_SAGEMAKER": f"http://127.0.0.1:{emulator_port}",
        "AWS_CONFIG_FILE": os.path.join(root, "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(root, "no-credentials"),
    }
    child_env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION")}
    child_env.update(env)
    paced = ["--pace", pace] + ([] if instance_start is None else ["--instance-start", repr(instance_start)])
    servers = [
        subprocess.Popen([sys.executable, "-m", "mpi_magic.testing.moto_live_tail", "--port", str(moto_port)] + paced,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env),
        subprocess.Popen([sys.executable, "-m", "mpi_magic.testing.sagemaker_emulator", "--port", str(emulator_port),
                          "--root", os.path.join(root, "emulated"), "--region", region] + paced,
                         stdout=subprocess.DEVNULL, env=child_env),
    ]
    try:
        _wait_for_port(moto_port, servers[0])
        _wait_for_port(emulator_port, servers[1])
        yield env
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
