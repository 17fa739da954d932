"""Ranks as one multi-instance SageMaker training job: the request, the files it needs in S3,
and submitting it. boto3 is imported only in this package."""

from __future__ import annotations

import hashlib
import json
import os

from . import package
from .history import record_job
from .job import SageMakerJob
from .request import BOOTSTRAP, CODE_ARCHIVE, CloudSettings, job_prefix, split_s3, training_job_request, validate
from .settings import instance_gpus


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

    def request(self, job_name: str, digest: str, options) -> dict:
        code_digests = (hashlib.sha256(self.bootstrap).hexdigest(), hashlib.sha256(self.archive).hexdigest())
        request = training_job_request(self.settings, job_name, options.instances, options.gpus, digest, options.env,
                                       options.mpirun_args, code_digests)
        validate(request)
        return request

    def submit(self, job_dir: str, job_name: str, digest: str | None, options) -> "SageMakerJob":
        request = self.request(job_name, digest or "", options)
        bucket, prefix = split_s3(job_prefix(self.settings, job_name))
        s3 = self.session.client("s3")
        s3.put_object(Bucket=bucket, Key=f"{prefix}/code/{BOOTSTRAP}", Body=self.bootstrap)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/code/{CODE_ARCHIVE}", Body=self.archive)
        if self.requirements:
            s3.upload_file(self.requirements, bucket, f"{prefix}/code/requirements.txt")
        s3.upload_file(os.path.join(job_dir, "payload.bin"), bucket, f"{prefix}/payload/payload.bin")
        job = SageMakerJob(self.session, job_name, f"{job_prefix(self.settings, job_name)}/results")
        job.create(request)
        try:
            record_job(job_name, self.settings.region)
        except BaseException:  # an interrupt right after creating must not leave the job running
            job.cancel()
            raise
        return job
