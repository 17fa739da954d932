"""A rehearsal AWS on loopback: a moto server (S3, CloudWatch Logs with Live Tail streamed as AWS
streams it, STS) and the SageMaker emulator, with the environment that points unchanged boto3 at them.

    python -m mpi_magic.testing.local_aws -- jupyter lab    # for as long as the command runs
    python -m mpi_magic.testing.local_aws       # prints the export lines, serves until Ctrl-C

    from mpi_magic.testing import rehearse      # in a notebook: until the kernel exits
    rehearse()

    with local_aws() as env:                    # in a program: the servers, for the block
        os.environ.update(env)
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..backends.registry import settings as every_setting
from ..shared.procs import free_port
from . import servers as serving

BUCKET = "mpi-magic-rehearsal"  # made on the rehearsal's moto server
ROLE = "arn:aws:iam::123456789012:role/mpi-magic-rehearsal"  # the emulator takes any role's ARN
IMAGE = "local/emulated"  # the emulator runs the job's entrypoint with this Python: no image is pulled


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
        serving.start([sys.executable, "-m", "mpi_magic.testing.moto_live_tail", "--port", str(moto_port)] + paced,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env),
        serving.start([sys.executable, "-m", "mpi_magic.testing.sagemaker_emulator", "--port", str(emulator_port),
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
            serving.stop(server)
        if own_root:
            shutil.rmtree(root, ignore_errors=True)


def rehearsal_settings(env: dict[str, str]) -> dict[str, str]:
    """The ``MPI_MAGIC_*`` settings that send SageMaker cells to the rehearsal cloud ``env`` points at
    (``local_aws``): its bucket, made there now, its role and image."""
    import boto3

    s3 = boto3.client("s3", region_name=env["AWS_DEFAULT_REGION"], endpoint_url=env["AWS_ENDPOINT_URL_S3"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    if BUCKET not in [bucket["Name"] for bucket in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    known = every_setting()
    return {known["role"].env_var: ROLE, known["s3_root"].env_var: f"s3://{BUCKET}/jobs",
            known["image_uri"].env_var: IMAGE}


class Rehearsal:
    """The rehearsal cloud ``rehearse()`` started: its servers, and the environment it set for them."""

    def __init__(self, pace: str, instance_start: float | None):
        self._servers = contextlib.ExitStack()
        aws = self._servers.enter_context(local_aws(pace=pace, instance_start=instance_start))
        try:
            self.environ = {**aws, **rehearsal_settings(aws)}
        except BaseException:  # no bucket (or no boto3): the servers end here, not with the kernel
            self._servers.close()
            raise
        self._before = {name: os.environ.get(name) for name in self.environ}
        os.environ.update(self.environ)
        atexit.register(self.stop)

    def stop(self) -> None:
        """End the servers (and the jobs on them) and put the environment back as it was."""
        global _rehearsal
        atexit.unregister(self.stop)
        self._servers.close()
        for name, value in self._before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if _rehearsal is self:
            _rehearsal = None

    def __repr__(self) -> str:
        return (f"rehearsal cloud: moto (S3, CloudWatch Logs, STS) at {self.environ['AWS_ENDPOINT_URL_S3']}, the "
                f"SageMaker emulator at {self.environ['AWS_ENDPOINT_URL_SAGEMAKER']}, bucket {BUCKET}; "
                "%%mpirun_remote --backend sagemaker runs there until this Python exits (or .stop())")


_rehearsal: Rehearsal | None = None


def rehearse(pace: str = "none", instance_start: float | None = None) -> Rehearsal:
    """Start the rehearsal cloud for the rest of this Python's life (a notebook's kernel) and point
    this process at it: AWS's variables (endpoints, dummy credentials, region) and the SageMaker
    settings (``MPI_MAGIC_ROLE``, ``MPI_MAGIC_S3_ROOT``, ``MPI_MAGIC_IMAGE_URI``). Started once; call it from
    the main thread (a kernel's cells run there): the servers end with the thread that started them."""
    global _rehearsal
    if _rehearsal is None:
        _rehearsal = Rehearsal(pace, instance_start)
    return _rehearsal


def main(argv: list[str] | None = None) -> int:
    """Serve the rehearsal cloud for as long as COMMAND runs, with the environment that points at it; with
    no COMMAND, print the lines that point a shell (and Jupyter or IPython started from it) at it and
    serve until Ctrl-C (or SIGTERM)."""
    from .aws_pace import add_arguments

    parser = argparse.ArgumentParser(description="Serve a rehearsal AWS on loopback (moto and the SageMaker emulator) "
                                                 "for as long as COMMAND runs, pointed at it; without COMMAND, print "
                                                 "the environment that points at it and serve until Ctrl-C.")
    add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="what to run against it, such as: -- jupyter lab")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # ended as by Ctrl-C: the servers are stopped
    try:
        with local_aws(pace=args.pace, instance_start=args.instance_start) as aws:
            environ = {**aws, **rehearsal_settings(aws)}
            if command:
                signal.signal(signal.SIGINT, lambda *_: None)  # Ctrl-C is the command's to answer; it ends, then this
                return subprocess.run(command, env={**os.environ, **environ}).returncode
            print("# the rehearsal cloud: run these where Jupyter or IPython starts, then\n"
                  "# %%mpirun_remote --backend sagemaker --instance-type ml.m5.xlarge ... runs its cells here")
            for name, value in environ.items():
                print(f"export {name}={shlex.quote(value)}")
            print("serving until Ctrl-C", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
