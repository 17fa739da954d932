"""The rehearsal at AWS's pace (``--pace aws`` of the SageMaker emulator and the moto front), seen
through unchanged boto3: S3 requests, SageMaker's calls, the instances' start and a log line's
visibility each take as long as ``aws_pace.AWS`` says."""

from __future__ import annotations

import sys
import time

from helpers import BUCKET, ROLE

from mpi_magic.testing.aws_pace import AWS

AWS_PACE = "aws"  # the module's servers (conftest's local_aws_env)
INSTANCE_START = 3.0  # seconds, instead of the pace's two minutes


def _timed(call, *args, **kwargs) -> float:
    started = time.monotonic()
    call(*args, **kwargs)
    return time.monotonic() - started


def test_every_s3_request_waits_as_long_as_s3_answers(aws):
    s3 = aws.client("s3")
    took = {"PUT": _timed(s3.put_object, Bucket=BUCKET, Key="paced/one", Body=b"x"),
            "HEAD": _timed(s3.head_object, Bucket=BUCKET, Key="paced/one"),
            "GET": _timed(lambda: s3.get_object(Bucket=BUCKET, Key="paced/one")["Body"].read())}
    assert all(AWS.s3_request <= seconds < AWS.s3_request + 1.0 for seconds in took.values()), took


def test_a_training_job_starts_and_logs_at_aws_pace(aws):
    sagemaker, logs = aws.client("sagemaker"), aws.client("logs")
    name = "paced-job"
    request = {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": "local/emulated", "TrainingInputMode": "File",
                                   "ContainerEntrypoint": [sys.executable, "-c", "print('hello from the instance')"]},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/paced"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 120},
    }
    created_at = time.monotonic()
    assert _timed(sagemaker.create_training_job, **request) >= AWS.sagemaker_call
    assert _timed(sagemaker.describe_training_job, TrainingJobName=name) >= AWS.sagemaker_call
    while sagemaker.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Starting":
        time.sleep(0.2)
    assert time.monotonic() - created_at >= INSTANCE_START, "the instances took their time to start"
    seen = None
    while seen is None and time.monotonic() - created_at < 60:
        try:
            streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs",
                                                logStreamNamePrefix=f"{name}/")["logStreams"]
        except logs.exceptions.ResourceNotFoundException:  # the instances have not written a line yet
            streams = []
        for stream in streams:
            for event in logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs",
                                             logStreamName=stream["logStreamName"], startFromHead=True)["events"]:
                if event["message"] == "hello from the instance":
                    seen = (time.time(), event)
        time.sleep(0.2)
    assert seen is not None, "the line reached the log"
    found_at, event = seen
    written = event["timestamp"] / 1000
    assert event["ingestionTime"] / 1000 - written >= AWS.log_visible - 0.1
    assert found_at - written >= AWS.log_visible - 0.1, "GetLogEvents saw it only once CloudWatch would show it"
    while sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress":
        time.sleep(0.5)
    assert sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Completed"
