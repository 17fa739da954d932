"""The SageMaker backend, as the registry knows it: its options and settings, checked for form
while the line is parsed. Nothing of boto3 is imported here (``make`` does, when a job is asked for)."""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ...options import JOB, Option, Setting, positive_float, positive_int, text, yes_no
from ..base import Declaration

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from .backend import SageMakerBackend, SageMakerJobs

IDLE_DEFAULT = 1800.0  # seconds a session may sit without a cell, unless --max-idle says
_TRAINING_PLAN = re.compile(r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.+$")  # (the API's)


def _option(*flags: str, **declaration) -> Option:
    return Option(JOB, flags, declaration, only="sagemaker")


OPTIONS = (
    _option("--instance-type", default=None, metavar="TYPE", help="sagemaker: instance type."),
    _option("--image-uri", default=None, metavar="URI", help="sagemaker: training image."),
    _option("--role", default=None, metavar="ARN", help="sagemaker: execution role ARN."),
    _option("--s3-root", default=None, metavar="S3URI", help="sagemaker: s3://bucket/prefix for job files."),
    _option("--region", default=None, help="sagemaker: AWS region."),
    _option("--volume-size", default=None, metavar="GB", help="sagemaker: EBS volume per instance (100)."),
    _option("--max-runtime", default=None, metavar="SECONDS", help="sagemaker: stop the job after this long."),
    _option("--spot", action="store_true", help="sagemaker: managed spot training."),
    _option("--max-wait", default=None, metavar="SECONDS", help="sagemaker: with --spot, longest wait for capacity."),
    _option("--checkpoint-s3", default=None, metavar="S3URI",
            help="sagemaker: s3://bucket/prefix kept in step with each instance's mpi_magic.checkpoint_dir(), "
                 "and copied back there when the job starts again (spot restarts)."),
    _option("--keep-alive", default=None, metavar="SECONDS", help="sagemaker: warm pool keep-alive period."),
    _option("--training-plan", default=None, metavar="ARN",
            help="sagemaker: run on a training plan's reserved capacity (paid for by the plan)."),
    _option("--subnets", default=None, metavar="IDS", help="sagemaker: comma-separated VPC subnet ids."),
    _option("--security-groups", default=None, metavar="IDS", help="sagemaker: comma-separated security groups."),
    _option("--kms-key", default=None, metavar="KEY", help="sagemaker: KMS key for output and volumes."),
    _option("--tags", default=None, metavar="K=V,...", help="sagemaker: tags for the training job."),
    _option("--requirements", default=None, metavar="FILE",
            help="sagemaker: a requirements.txt installed on every instance before the ranks start."),
)

SETTINGS = (
    Setting("heartbeat", 60.0, positive_float, "sagemaker sessions: seconds between the notebook's heartbeats"),
    Setting("heartbeat_limit", 600.0, positive_float,
            "sagemaker sessions: the job ends itself when the notebook's heartbeat is older than this"),
    Setting("live_tail", True, yes_no,
            "sagemaker: follow a job's log through CloudWatch Live Tail ($0.01 a minute); no: read it, a second later"),
    Setting("instance_type", None, text, "sagemaker: instance type, e.g. ml.g5.12xlarge"),
    Setting("image_uri", None, text, "sagemaker: training image (Open MPI, sshd, boto3, the notebook's Python)"),
    Setting("role", None, text, "sagemaker: execution role ARN"),
    Setting("s3_root", None, text, "sagemaker: s3://bucket/prefix for the jobs' files"),
    Setting("region", None, text, "sagemaker: AWS region (default: the AWS configuration's)"),
)


def values(args: argparse.Namespace, config: Config) -> dict:
    """The training job's settings from the cell (and %mpirun_config), parsed but not yet checked
    against AWS (``settings.resolve`` does, when the backend is made)."""
    def ids(given):
        return tuple(i.strip() for i in given.split(",") if i.strip()) if given else ()

    def whole(given, what):
        return positive_int(given, what) if given is not None else None

    tags = {}
    for item in (args.tags.split(",") if args.tags else []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--tags {args.tags!r} is not KEY=VALUE,KEY=VALUE; for example --tags team=ml,project=x")
        tags[key.strip()] = value.strip()
    if args.max_wait and not args.spot:
        raise UsageError("--max-wait applies to --spot training only; add --spot or drop it")
    if args.training_plan and not _TRAINING_PLAN.match(args.training_plan):
        raise UsageError(f"--training-plan {args.training_plan!r} is not a training plan's ARN, like "
                         "arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan")
    if args.training_plan and args.spot:
        raise UsageError("--spot does not apply to a training plan, whose capacity is reserved; drop one of them")
    if args.requirements and not os.path.isfile(args.requirements):
        raise UsageError(f"--requirements {args.requirements!r} is not a file; give the path of a requirements.txt")
    return {
        "instance_type": config.pick("instance_type", args.instance_type),
        "image_uri": config.pick("image_uri", args.image_uri), "role": config.pick("role", args.role),
        "s3_root": config.pick("s3_root", args.s3_root), "region": config.pick("region", args.region),
        "volume_size": whole(args.volume_size, "--volume-size"),
        "max_runtime": whole(args.max_runtime, "--max-runtime"),
        "spot": args.spot, "max_wait": whole(args.max_wait, "--max-wait"),
        "checkpoint_s3": args.checkpoint_s3,
        "keep_alive": whole(args.keep_alive, "--keep-alive"), "subnets": ids(args.subnets),
        "security_groups": ids(args.security_groups), "kms_key": args.kms_key, "tags": tags,
        "training_plan": args.training_plan, "requirements": args.requirements,
    }


def _default_gpus(settings: dict) -> int:
    """The instance type's accelerators (an unknown count is an error)."""
    from .settings import default_processes

    return default_processes(settings.get("instance_type"))


def _make(config: Config, options: LaunchOptions) -> SageMakerBackend:
    from .backend import SageMakerBackend
    from .settings import resolve

    settings, aws = resolve(options.settings)
    return SageMakerBackend(settings, aws, options.settings.get("requirements"), config.get("live_tail"))


def _jobs(config: Config) -> SageMakerJobs:
    from .backend import SageMakerJobs

    return SageMakerJobs(config)


SAGEMAKER = Declaration(
    name="sagemaker", about="a multi-instance Amazon SageMaker training job", make=_make,
    default_gpus=_default_gpus, max_ranks=65536, why_max="the notebook keeps live state for every rank",
    options=OPTIONS, settings=SETTINGS, values=values, idle_default=IDLE_DEFAULT, prices=True, attach=_jobs,
    extra="sagemaker", files=("requirements",),
    export_needs="AWS credentials that may create training jobs and write the job's S3 folder, and the settings "
                 "the cell ran with (`MPI_MAGIC_ROLE`, `MPI_MAGIC_S3_ROOT`, ... as in `export.json`)",
    export_launch="the CreateTrainingJob request",
)
