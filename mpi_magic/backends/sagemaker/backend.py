"""Ranks as one multi-instance SageMaker training job: submit, watch (status and CloudWatch
logs), stop, and fetch every rank's results. boto3 is imported only here."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import sys
import time

from ... import events as wire
from ... import jobdir
from ...errors import BackendNotAvailable, SageMakerSetupError
from ...events import Event, LauncherOutput, Note, Phase, RankFinished, RankStarted, StreamDecoder
from ...launcher import LauncherLog
from . import package, sdk
from .request import BOOTSTRAP, CODE_ARCHIVE, CloudSettings, job_prefix, split_s3, training_job_request, validate

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
DESCRIBE_EVERY = 3.0  # seconds between DescribeTrainingJob calls
LOGS_EVERY = 1.0  # seconds between reads of the leader's log stream
FULL_PAGE = 1000  # a GetLogEvents reply this long may have more behind it
LOG_LAG = 15.0  # seconds to keep reading an ended job's log for lines still arriving
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")

# GPUs per instance of the types people train on: the default processes per instance. Other valid
# types run too (with --gpus); names that are not training instance types are refused.
GPUS = {
    "ml.p4d.24xlarge": 8, "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8, "ml.p5en.48xlarge": 8,
    "ml.p3.2xlarge": 1, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8,
    "ml.g4dn.xlarge": 1, "ml.g4dn.2xlarge": 1, "ml.g4dn.4xlarge": 1, "ml.g4dn.12xlarge": 4,
    "ml.g5.xlarge": 1, "ml.g5.2xlarge": 1, "ml.g5.4xlarge": 1, "ml.g5.8xlarge": 1, "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4, "ml.g5.48xlarge": 8, "ml.g6.xlarge": 1, "ml.g6.12xlarge": 4, "ml.g6.48xlarge": 8,
    "ml.trn1.32xlarge": 0, "ml.m5.large": 0, "ml.m5.xlarge": 0, "ml.m5.2xlarge": 0, "ml.m5.4xlarge": 0,
    "ml.m5.12xlarge": 0, "ml.m5.24xlarge": 0, "ml.c5.xlarge": 0, "ml.c5.4xlarge": 0, "ml.c5.18xlarge": 0,
}


try:
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:  # without boto3, _boto3() below says what to install
    BotoCoreError = ClientError = OSError


def _boto3():
    try:
        import boto3
    except ImportError:
        raise BackendNotAvailable(
            "the sagemaker backend needs boto3, which is not installed: pip install 'mpi-magic[sagemaker]'"
        ) from None
    return boto3


def training_instance_types() -> list[str]:
    """Every training instance type in botocore's SageMaker service model."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return list(model.shape_for("TrainingInstanceType").enum)


def instance_gpus(instance_type: str) -> int | None:
    """GPUs of a known type; None for a valid type mpi_magic has no count for; an error otherwise."""
    known = training_instance_types()
    if instance_type not in known:
        close = difflib.get_close_matches(instance_type, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; for example --instance-type ml.g5.12xlarge"
        raise SageMakerSetupError(f"{instance_type!r} is not a SageMaker training instance type{hint}")
    return GPUS.get(instance_type)


def _from_sdk(find, *args):
    """A default the SageMaker SDK finds; a clear sentence when it cannot."""
    *args, option = args
    try:
        return find(*args)
    except (sdk.SdkMissing, LookupError) as exc:
        raise SageMakerSetupError(f"{exc}; or pass {option}") from None
    except Exception as exc:  # noqa: BLE001 - the SDK raises many kinds; the user needs the option
        raise SageMakerSetupError(f"the SageMaker SDK could not find a default ({type(exc).__name__}: {exc}); "
                                  f"pass {option}") from None


def resolve(values: dict) -> tuple[CloudSettings, object]:
    """Settings from the cell's options and defaults, checked; (settings, boto3 session)."""
    boto3 = _boto3()
    session = boto3.session.Session(region_name=values.get("region"))
    region = session.region_name
    if not region:
        raise SageMakerSetupError("no AWS region: pass --region us-east-1 or set AWS_DEFAULT_REGION")
    if session.get_credentials() is None:
        raise SageMakerSetupError("no AWS credentials found: run `aws configure`, set AWS_PROFILE, "
                                  "or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    values = {**{k: v for k, v in sdk.config_defaults().items()}, **{k: v for k, v in values.items() if v}}
    instance_type = values.get("instance_type")
    if not instance_type:
        raise SageMakerSetupError("no instance type: pass --instance-type, for example ml.g5.12xlarge")
    instance_gpus(instance_type)
    role = values.get("role") or _from_sdk(sdk.execution_role, session, "--role arn:aws:iam::ACCOUNT:role/NAME")
    if not role:
        raise SageMakerSetupError("no execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME "
                                  "(or set it once with %mpirun_config role=...)")
    if not _ROLE_ARN.match(role):
        raise SageMakerSetupError(f"--role {role!r} is not an IAM role ARN like arn:aws:iam::123456789012:role/Name")
    image_uri = values.get("image_uri") or _from_sdk(sdk.default_image, region, instance_type, "--image-uri")
    tagged = re.search(r"-py3(\d+)-?", image_uri)
    if tagged and int(tagged.group(1)) != sys.version_info[1]:
        raise SageMakerSetupError(
            f"the image {image_uri} runs Python 3.{tagged.group(1)} but this notebook runs Python "
            f"3.{sys.version_info[1]}; pickled values only load under the same minor version: choose a py3"
            f"{sys.version_info[1]} image")
    s3_root = (values.get("s3_root") or "").rstrip("/")
    if not s3_root:
        s3_root = f"s3://{_from_sdk(sdk.default_bucket, session, '--s3-root s3://your-bucket/prefix')}/mpi-magic"
    try:
        bucket, _ = split_s3(s3_root)
    except ValueError as exc:
        raise SageMakerSetupError(f"--s3-root: {exc}") from None
    s3 = session.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - botocore raises several kinds here
        raise SageMakerSetupError(f"the bucket {bucket!r} of --s3-root cannot be used ({exc}); "
                                  "create it or pass another --s3-root") from None
    settings = CloudSettings(
        region=region, role=role, image_uri=image_uri, instance_type=instance_type, s3_root=s3_root,
        volume_size=int(values.get("volume_size") or 100), max_runtime=int(values.get("max_runtime") or 86400),
        spot=bool(values.get("spot")), max_wait=values.get("max_wait"), keep_alive=values.get("keep_alive"),
        subnets=tuple(values.get("subnets") or ()), security_groups=tuple(values.get("security_groups") or ()),
        kms_key=values.get("kms_key"), tags=dict(values.get("tags") or {}),
    )
    return settings, session


class SageMakerBackend:
    name = "sagemaker"
    pins_digest = True  # the payload travels through S3
    stop_description = "StopTrainingJob"

    def __init__(self, settings: CloudSettings, session, requirements: str | None = None):
        self.settings, self.session, self.requirements = settings, session, requirements
        self.bootstrap, self.archive = package.bootstrap_source(), package.code_archive()

    def check(self, options) -> list[str]:
        """Warnings: an instance type with fewer GPUs than processes per instance is allowed."""
        gpus = instance_gpus(self.settings.instance_type)
        if gpus is None:
            return [f"mpi_magic does not know how many GPUs {self.settings.instance_type} has; "
                    f"running {options.gpus} processes per instance as asked"]
        if gpus == 0:
            return [f"{self.settings.instance_type} has no GPU; its {options.gpus} processes per instance run on its CPUs"]
        if options.gpus > gpus:
            return [f"{self.settings.instance_type} has {gpus} GPU{'s' if gpus != 1 else ''} but --gpus asks for "
                    f"{options.gpus} processes per instance; they will share"]
        return []

    def plan(self, job_dir: str, job_name: str, digest: str | None, options) -> str:
        """What --dry-run prints: the exact request and the S3 objects that would be written."""
        prefix = job_prefix(self.settings, job_name)
        objects = [f"{prefix}/code/{BOOTSTRAP}", f"{prefix}/code/{CODE_ARCHIVE}", f"{prefix}/payload/payload.bin"]
        if self.requirements:
            objects.insert(2, f"{prefix}/code/requirements.txt")
        request = json.dumps(self.request(job_name, digest or "", options), indent=2)
        return "CreateTrainingJob request:\n" + request + "\nS3 objects:\n" + "\n".join(objects)

    def request(self, job_name: str, digest: str, options, token: str = "<event token>") -> dict:
        code_digests = (hashlib.sha256(self.bootstrap).hexdigest(), hashlib.sha256(self.archive).hexdigest())
        request = training_job_request(self.settings, job_name, options.instances, options.gpus, digest, options.env,
                                       options.mpirun_args, code_digests)
        request["Environment"][wire.TOKEN_VARIABLE] = token  # MPI_MAGIC_* reaches every rank
        validate(request)
        return request

    def submit(self, job_dir: str, job_name: str, digest: str | None, options) -> "SageMakerJob":
        token = wire.new_token()
        request = self.request(job_name, digest or "", options, token)
        bucket, prefix = split_s3(job_prefix(self.settings, job_name))
        s3 = self.session.client("s3")
        s3.put_object(Bucket=bucket, Key=f"{prefix}/code/{BOOTSTRAP}", Body=self.bootstrap)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/code/{CODE_ARCHIVE}", Body=self.archive)
        if self.requirements:
            s3.upload_file(self.requirements, bucket, f"{prefix}/code/requirements.txt")
        s3.upload_file(os.path.join(job_dir, "payload.bin"), bucket, f"{prefix}/payload/payload.bin")
        job = SageMakerJob(self.session, job_name, f"{job_prefix(self.settings, job_name)}/results", token)
        job.create(request)
        try:
            record_job(job_name, self.settings.region)
        except BaseException:  # an interrupt right after creating must not leave the job running
            job.cancel()
            raise
        return job


class SageMakerJob:
    """A submitted training job, seen through DescribeTrainingJob and the leader's log stream.

    The bootstrap stops every rank when one fails and the job ends by itself (uploading can
    take a while), so nothing here stops a job early: only an interrupt or cancel() does.
    """

    abort_grace = None
    linger = None

    def __init__(self, session, name: str, results_uri: str, token: str):
        from botocore.config import Config

        config = Config(retries={"mode": "standard", "max_attempts": 10})  # throttling: retried with backoff
        self.name, self.results_uri, self.host = name, results_uri, "algo-1"
        self.sagemaker = session.client("sagemaker", config=config)
        self.logs = session.client("logs", config=config)
        self.s3 = session.client("s3", config=config)
        self.api_calls = 0
        for client in (self.sagemaker, self.logs, self.s3):
            client.meta.events.register("before-call", self._count)
        self._decoder = StreamDecoder(token, "openmpi5")
        self._launcher_log = LauncherLog()
        self._stream: str | None = None
        self._token: str | None = None
        self._status = "InProgress"
        self._secondary = ""
        self._next_describe = 0.0
        self._next_logs = 0.0
        self._finished = False
        self._ended_status: str | None = None
        self._quiet_since: float | None = None
        self._reported: set[int] = set()
        self._world_size: int | None = None

    @property
    def _all_reported(self) -> bool:
        return self._world_size is not None and len(self._reported) >= self._world_size

    def _count(self, **_) -> None:
        self.api_calls += 1

    def create(self, request: dict) -> None:
        self.sagemaker.create_training_job(**request)

    @property
    def finished(self) -> bool:
        return self._finished

    def poll(self, timeout: float) -> list[Event]:
        deadline = time.monotonic() + timeout
        events: list[Event] = []
        while not events and not self._finished:
            now = time.monotonic()
            try:
                if now >= self._next_describe:
                    self._next_describe = now + DESCRIBE_EVERY
                    events += self._describe()
                if now >= self._next_logs or self._ended_status:
                    self._next_logs = now + LOGS_EVERY
                    events += self._read_logs()
            except (BotoCoreError, ClientError) as exc:
                # watching failed (permissions, network, expired credentials): say so, keep the job
                events.append(Note(f"could not read the job's status or logs ({type(exc).__name__}: {exc}); retrying"))
                self._next_describe = self._next_logs = now + 10 * LOGS_EVERY
            if self._ended_status and not events and self._drained(now):
                events += self._end()
            if events or time.monotonic() >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return events

    def _drained(self, now: float) -> bool:
        """After the job ended, its last log lines may still be on their way to CloudWatch."""
        if self._quiet_since is None:
            self._quiet_since = now
        return self._all_reported or now - self._quiet_since > LOG_LAG

    def _describe(self) -> list[Event]:
        described = self.sagemaker.describe_training_job(TrainingJobName=self.name)
        self._status = described["TrainingJobStatus"]
        events: list[Event] = []
        if described.get("SecondaryStatus") != self._secondary:
            self._secondary = described["SecondaryStatus"]
            # SageMaker's own words ("Training", "Completed"): the job's outcome is settled from the ranks
            events.append(Phase(self._secondary, f"SageMaker: {self._secondary}"))
        if self._status in ("Completed", "Failed", "Stopped") and not self._ended_status:
            self._ended_status = self._status
            self._described = described
            self._next_logs = 0.0
        return events

    def _end(self) -> list[Event]:
        described = self._described
        events: list[Event] = []
        if described.get("FailureReason"):
            events.append(LauncherOutput(f"SageMaker FailureReason: {described['FailureReason']}"))
            events.append(Note(f"SageMaker FailureReason: {described['FailureReason']}"))
        if "BillableTimeInSeconds" in described:
            events.append(Note(f"SageMaker billable time: {described['BillableTimeInSeconds']}s"))
        code = {"Completed": 0, "Failed": 1, "Stopped": -15}[self._ended_status]
        events.append(self._launcher_log.ended(code, self._world_size is not None))
        self._finished = True
        return events

    def _read_logs(self) -> list[Event]:
        if self._stream is None:
            paginator = self.logs.get_paginator("describe_log_streams")
            try:
                for page in paginator.paginate(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.name}/algo-1-"):
                    for stream in page.get("logStreams", []):
                        self._stream = stream["logStreamName"]
            except self.logs.exceptions.ResourceNotFoundException:
                return []
            if self._stream is None:
                return []
        events: list[Event] = []
        while True:
            kwargs = {"nextToken": self._token} if self._token else {"startFromHead": True}
            reply = self.logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=self._stream, **kwargs)
            for item in reply.get("events", []):
                line = item["message"]
                if line.startswith("mpi_magic bootstrap: mpirun (Open MPI) 4."):
                    self._decoder.style = "openmpi4"
                decoded = self._decoder.feed(line)
                self._quiet_since = None
                for event in decoded:
                    if isinstance(event, RankFinished):
                        self._reported.add(event.rank)
                    elif isinstance(event, RankStarted):
                        self._world_size = event.world_size
                    elif isinstance(event, LauncherOutput):
                        self._launcher_log.add(event.text)
                events += decoded
            if reply.get("nextForwardToken") in (None, self._token):
                return events
            self._token = reply["nextForwardToken"]
            if len(reply.get("events", [])) < FULL_PAGE:  # caught up: ask again at the next read
                return events

    def cancel(self) -> None:
        """StopTrainingJob; polling then sees Stopping and Stopped."""
        if self._ended_status:
            return
        try:
            self.sagemaker.stop_training_job(TrainingJobName=self.name)
        except ClientError:
            pass  # it ended meanwhile
        self._next_describe = 0.0

    def fetch_results(self, job_dir: str, ranks) -> None:
        """Copy each rank's results from its own S3 key into the job folder."""
        bucket, prefix = split_s3(self.results_uri)
        for rank in ranks:
            path = os.path.join(job_dir, "results", f"rank-{rank}.bin")
            try:
                self.s3.download_file(bucket, f"{prefix}/rank-{rank}.bin", path)
            except Exception:  # noqa: BLE001 - a missing result is reported when it is read
                pass


def attach(name: str, region: str | None) -> tuple[SageMakerJob, dict]:
    """An existing job (started by any notebook), with what is needed to follow it to its end."""
    boto3 = _boto3()
    session = boto3.session.Session(region_name=region)
    if not session.region_name:
        raise SageMakerSetupError("no AWS region: pass --region us-east-1 or set AWS_DEFAULT_REGION")
    sagemaker = session.client("sagemaker")
    try:
        described = sagemaker.describe_training_job(TrainingJobName=name)
    except sagemaker.exceptions.ClientError as exc:
        raise SageMakerSetupError(f"no training job {name!r} in {session.region_name} ({exc})") from None
    environment = described.get("Environment", {})
    if "MPI_MAGIC_RESULTS_URI" not in environment:
        raise SageMakerSetupError(f"training job {name!r} was not started by mpi_magic")
    channel = next(c for c in described["InputDataConfig"] if c["ChannelName"] == "payload")
    bucket, key = split_s3(channel["DataSource"]["S3DataSource"]["S3Uri"].rstrip("/") + "/payload.bin")
    s3 = session.client("s3")
    head = s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-15")["Body"].read()
    length = int.from_bytes(head[8:16], "little")
    header = json.loads(s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=16-{15 + length}")["Body"].read())
    info = {"instances": int(environment["MPI_MAGIC_INSTANCES"]),
            "procs_per_instance": int(environment["MPI_MAGIC_PROCS_PER_INSTANCE"]),
            "returns": header["meta"]["returns"], "gather": header["meta"].get("gather", False)}
    job = SageMakerJob(session, name, environment["MPI_MAGIC_RESULTS_URI"], environment.get(wire.TOKEN_VARIABLE, ""))
    return job, info  # reads the log from its start


JOBS_RECORD = "sagemaker_jobs.json"


def _record_path() -> str:
    from ...options import Config

    return os.path.join(Config().get("cache_dir"), JOBS_RECORD)


def record_job(name: str, region: str) -> None:
    """Remember a job this user started, for %mpirun_jobs (newest 100 kept)."""
    path = _record_path()
    try:
        with open(path) as f:
            records = json.load(f)
    except (OSError, ValueError):
        records = []
    records = ([{"name": name, "region": region, "created": time.time()}] + records)[:100]
    jobdir.make_private_dirs(os.path.dirname(path))
    with jobdir.open_private(path) as f:
        json.dump(records, f)


def recent_jobs(limit: int = 20) -> list[dict]:
    """The jobs recorded here, newest first, with their status from DescribeTrainingJob."""
    try:
        with open(_record_path()) as f:
            records = json.load(f)[:limit]
    except (OSError, ValueError):
        return []
    boto3 = _boto3()
    clients: dict[str, object] = {}
    for record in records:
        client = clients.setdefault(record["region"], boto3.client("sagemaker", region_name=record["region"]))
        try:
            described = client.describe_training_job(TrainingJobName=record["name"])
            record["status"] = described["TrainingJobStatus"]
            record["secondary"] = described.get("SecondaryStatus", "")
        except Exception as exc:  # noqa: BLE001 - shown in the listing
            record["status"], record["secondary"] = "unknown", str(exc)[:60]
    return records
