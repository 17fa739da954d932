"""Ranks as one multi-instance SageMaker training job: the request, the files it needs in S3,
and submitting it. boto3 is imported only in this package."""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from ...errors import counted
from ...shared import wire
from ...shared.layout import split_s3
from ...shared.payload import PAYLOAD_FILE
from .. import shipped_code
from . import package, pricing
from .bootstrap import CODE_ARCHIVE, CODE_CHANNEL, PAYLOAD_CHANNEL, REQUIREMENTS
from .history import record_job
from .training_job import SageMakerJob
from .request import BOOTSTRAP, CloudSettings, input_uri, results_uri, training_job_request, validate
from .settings import accelerators
from ...shared import envvars

if TYPE_CHECKING:
    from ..base import AttachableBackend, SessionBackend
    from ...options import Config, LaunchOptions
    from .session_ranks import SageMakerSessionRanks



class SageMakerBackend:
    name = "sagemaker"
    pins_digest = True  # the payload travels through S3
    stop_description = "StopTrainingJob"

    def __init__(self, settings: CloudSettings, aws, requirements: str | None = None, live_tail: bool = True):
        self.settings, self.aws, self.requirements = settings, aws, requirements
        self.live_tail = live_tail  # follow a job's log through CloudWatch Live Tail (``livetail``)
        self.bootstrap, self.archive = package.bootstrap_source(), shipped_code.archive()

    def check(self, options: LaunchOptions) -> list[str]:
        """Warnings: more processes per instance than it has GPUs (or NeuronCores) is allowed.
        A type without a known count was refused while parsing, unless --gpus was given."""
        instance_type = self.settings.instance_type
        known = accelerators(instance_type)
        if known is None:
            return []
        count, kind = known
        if count == 0:
            return [f"{instance_type} has no GPU: its {counted(options.gpus, 'process', 'processes')} per instance "
                    f"{'runs' if options.gpus == 1 else 'run'} on its CPUs"]
        if options.gpus > count:
            return [f"{instance_type} has {counted(count, kind)} but --gpus asks for "
                    f"{options.gpus} processes per instance; they will share"]
        return []

    def unpriced(self, options: LaunchOptions) -> str | None:
        """A type or region the shipped table has no price for; a training plan, which bills no hours."""
        settings = self.settings
        if settings.training_plan:
            return ("a job on a training plan runs on capacity paid for when the plan was bought, with no charge "
                    "by the hour to meter (--max-runtime bounds its time)")
        if pricing.hourly_price(settings.instance_type, settings.region) is None:
            return f"mpi_magic's price table has no list price for {settings.instance_type} in {settings.region}"
        return None

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints: the exact request, the S3 objects that would be written, and the
        instance type's list price."""
        objects = [uri for uri, _ in self._uploads(job_dir, job_name)]
        request = json.dumps(self.request(job_name, digest or "", options), indent=2)
        price = (pricing.plan_line(self.settings.training_plan) if self.settings.training_plan else
                 pricing.price_line(self.settings.instance_type, self.settings.region, options.instances,
                                    self.settings.spot))
        return "CreateTrainingJob request:\n" + request + "\nS3 objects:\n" + "\n".join(objects) + "\n" + price

    def _uploads(self, job_dir: str | None, job_name: str) -> list[tuple[str, bytes | str]]:
        """(S3 URI, the bytes or a local file's path) of every file the instances read; a session
        (no ``job_dir``) has no payload yet."""
        files: list[tuple[str, str, bytes | str]] = [(CODE_CHANNEL, BOOTSTRAP, self.bootstrap),
                                                     (CODE_CHANNEL, CODE_ARCHIVE, self.archive)]
        if self.requirements:
            files.append((CODE_CHANNEL, REQUIREMENTS, self.requirements))
        if job_dir is not None:
            files.append((PAYLOAD_CHANNEL, PAYLOAD_FILE, os.path.join(job_dir, PAYLOAD_FILE)))
        return [(input_uri(self.settings, job_name, channel, name), body) for channel, name, body in files]

    def upload(self, s3, job_name: str, job_dir: str | None) -> None:
        """Put every file the instances read in S3 (a session's: ``job_dir`` None)."""
        for uri, body in self._uploads(job_dir, job_name):
            bucket, key = split_s3(uri)
            if isinstance(body, bytes):
                s3.put_object(Bucket=bucket, Key=key, Body=body)
            else:
                s3.upload_file(body, bucket, key)

    def request(self, job_name: str, digest: str, options: LaunchOptions, token: str = "<event token>",
                session: dict[str, str] | None = None) -> dict:
        code_digests = (hashlib.sha256(self.bootstrap).hexdigest(), hashlib.sha256(self.archive).hexdigest())
        request = training_job_request(self.settings, job_name, options.instances, options.procs_per_instance, digest,
                                       options.env, options.mpirun_args, code_digests, session)
        request["Environment"][envvars.EVENT_TOKEN] = token  # MPI_MAGIC_* reaches every rank
        request["Environment"][envvars.STACKS_EVENTS] = "1"  # a rank asked for its stack sends it as an event
        if options.max_cost is not None and not self.settings.training_plan:  # a budget outlives the notebook
            capped = pricing.budget_runtime(options.max_cost, self.settings.instance_type, self.settings.region,
                                            options.instances)
            stopping = request["StoppingCondition"]
            if capped is not None and capped < stopping["MaxRuntimeInSeconds"]:
                stopping["MaxRuntimeInSeconds"] = capped
        validate(request)
        return request

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> SageMakerJob:
        token = wire.new_token()
        request = self.request(job_name, digest or "", options, token)
        self.upload(self.aws.client("s3"), job_name, job_dir)
        job = SageMakerJob(self.aws, job_name, results_uri(self.settings, job_name), token, self.live_tail)
        job.create(request)
        try:
            record_job(job_name, self.settings.region)
        except BaseException:  # an interrupt right after creating must not leave the job running
            job.cancel()
            raise
        return job

    def start_session(self, name: str, options: LaunchOptions, config: Config) -> SageMakerSessionRanks:
        """One training job whose ranks wait for cells (``session_ranks.py``); returns once it is created."""
        from .session_ranks import start

        return start(self, name, options, options.max_idle,
                     config.get("heartbeat"), config.get("heartbeat_limit"), config.get("cache_dir"))


class SageMakerJobs:
    """Training jobs started earlier (by this kernel or another), found by name: a one-off job to
    follow to its end, or a session to take over. Needs no settings beyond the region."""

    name = "sagemaker"
    stop_description = "StopTrainingJob"

    def __init__(self, config: Config):
        self.config = config

    def attach(self, job_name: str) -> tuple[SageMakerJob, dict]:
        from .training_job import attach

        return attach(job_name, self.config.get("region"), self.config.get("live_tail"))

    def attach_session(self, job_name: str) -> tuple[SageMakerSessionRanks, dict]:
        from .session_ranks import attach

        return attach(job_name, self.config.get("region"), self.config.get("cache_dir"), self.config.get("heartbeat"))

    def recent_jobs(self) -> list[dict]:
        from .history import recent_jobs

        return recent_jobs()


if TYPE_CHECKING:  # read by the type checker only
    def _is_backend(backend: SageMakerBackend) -> SessionBackend:
        return backend

    def _is_attachable(jobs: SageMakerJobs) -> AttachableBackend:
        return jobs
