"""How long AWS takes, for the rehearsal: ``--pace aws`` of the SageMaker emulator and of the moto
front delays what they answer by these figures; ``--pace none`` (the default, for the fast tests)
answers at once.

Each figure says where it comes from. Where AWS publishes none, the figure is an assumption and
says so; ``--instance-start`` sets the one a rehearsal most often wants shorter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AwsPace:
    s3_request: float  # seconds an S3 request (GET, PUT, HEAD, LIST) of a small object takes to its first byte
    sagemaker_call: float  # seconds SageMaker takes to answer CreateTrainingJob, DescribeTrainingJob, ...
    log_visible: float  # seconds from writing a log line until GetLogEvents and Live Tail can see it
    instance_start: float  # seconds from CreateTrainingJob until the instances run the job's entrypoint


NONE = AwsPace(s3_request=0.0, sagemaker_call=0.0, log_visible=0.0, instance_start=0.0)

AWS = AwsPace(
    # S3's whitepaper "Best Practices Design Patterns: Optimizing Amazon S3 Performance", section
    # "Timeouts and Retries for Latency-Sensitive Applications": small requests (under 512 KB) have
    # "median latencies ... often in the range of tens of milliseconds"; the S3 User Guide's
    # "Optimizing S3 Express One Zone performance": single-digit millisecond first-byte latencies,
    # "up to 10x faster than S3 Standard". The top of that range, so as not to flatter.
    s3_request=0.1,
    # AWS publishes no latency for SageMaker's control-plane calls: an assumption, a few times an S3
    # request's, as for a regional JSON API reached over TLS.
    sagemaker_call=0.2,
    # Measured by others, not published by AWS: Kevin Lin, "How Real-Time is Amazon CloudWatch Logs
    # Live Tail?" (2023, screen recordings against currentmillis.com, and GetLogEvents' timestamp
    # against ingestionTime): ingestion takes "between 5s to 20s", 7.5 s in the sample event shown;
    # Shuichi, "Visualize CloudWatch Logs ingestion lag with Logs Insights" (dev.to, @ingestionTime -
    # @timestamp over two weeks): "several seconds". The low end of those. Live Tail then sends what
    # was ingested once a second (the StartLiveTail API reference), which the moto front does too.
    log_visible=5.0,
    # AWS publishes no figure for a cold start; its blog "Best practices for Amazon SageMaker Training
    # Managed Warm Pools" calls it "fairly low" beside the "under 20 seconds" warm pools aim at. A bare
    # EC2 launch alone measured 25.8 s on average (brevdev/ec2-coldboot-research: three launches, API
    # call to SSH), before SageMaker pulls the image and starts the container: an assumption above that.
    instance_start=120.0,
)

PACES = {"none": NONE, "aws": AWS}


def pace(name: str, instance_start: float | None = None) -> AwsPace:
    """The pace called ``name``, with its instance start replaced when ``instance_start`` is given."""
    chosen = PACES[name]
    return chosen if instance_start is None else replace(chosen, instance_start=instance_start)


def add_arguments(parser) -> None:
    """``--pace`` and ``--instance-start``, for both servers' command lines."""
    parser.add_argument("--pace", choices=sorted(PACES), default="none",
                        help="answer as fast as AWS does (aws), or at once (none, the default)")
    parser.add_argument("--instance-start", type=float, default=None,
                        help="seconds the instances take to start, instead of the pace's figure")
