"""The notebooks whose cells run on SageMaker execute in a real kernel (nbclient), on the
rehearsal cloud (a moto server and the SageMaker emulator on loopback, one of each for the module),
chosen by the documented settings that notebooks/execute.py also uses."""

from __future__ import annotations

import json
import re

import pytest
from helpers import needs_torch
from notebook_runs import code_cell, execute, executed, text_of


@pytest.fixture(scope="module")
def cloud(local_aws_env):
    return execute.rehearsal_settings(local_aws_env)


@pytest.mark.timeout(300)
def test_mpi4py_patterns_and_the_same_cell_on_sagemaker(tmp_path, cloud):
    import boto3

    nb = executed("mpi4py_patterns.ipynb", tmp_path, cloud=cloud)
    import numpy as np

    expected = repr(np.sqrt(np.linspace(0.0, 1.0, 1_000_000))[:4])
    assert text_of(code_cell(nb, "assert np.allclose(result").outputs) == expected, "rank 0 gathered every rank's slice"
    assert text_of(code_cell(nb, "total, largest").outputs) == f"({sum(range(40))}, 39)"
    local, remote = [text_of(c.outputs) for c in nb.cells if c.cell_type == "code" and "pi is about" in c.source]
    assert local == remote and re.match(r"pi is about 3\.1\d+; hits by rank: \[\d+, \d+, \d+, \d+\]$", local.strip())
    moved = code_cell(nb, "%%mpirun_remote --backend sagemaker")
    job_name = re.search(r"job (mpi-\d{8}-\d{6}-[0-9a-f]+) \(sagemaker, 2 x 2\) completed", text_of(moved.outputs)).group(1)
    sagemaker = boto3.client("sagemaker", region_name=cloud["AWS_DEFAULT_REGION"], endpoint_url=cloud["AWS_ENDPOINT_URL_SAGEMAKER"],
                             aws_access_key_id="testing", aws_secret_access_key="testing")
    described = sagemaker.describe_training_job(TrainingJobName=job_name)
    assert described["TrainingJobStatus"] == "Completed" and described["ResourceConfig"]["InstanceCount"] == 2


@pytest.mark.timeout(300)
@needs_torch()
def test_sagemaker_multinode_runs_on_the_rehearsal_cloud_at_its_sizes(tmp_path, cloud):
    nb = executed("sagemaker_multinode.ipynb", tmp_path, cloud=cloud)
    config = text_of(code_cell(nb, "import os").outputs)
    assert re.search(r"^instances +2 +\(MPI_MAGIC_INSTANCES\)", config, re.MULTILINE), "the environment's sizes won"
    dry_run = text_of(code_cell(nb, "%%mpirun_remote --backend sagemaker --dry-run").outputs)
    request = json.loads(dry_run[dry_run.index("{"):dry_run.index("\nS3 objects:")])
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["Environment"]["MPI_MAGIC_PROCS_PER_INSTANCE"] == "2"
    assert request["RoleArn"] == cloud["MPI_MAGIC_ROLE"]
    started = text_of(code_cell(nb, "print(job.name, job.status)").outputs).split()
    assert started[1] == "running", "--async returned while the job ran"
    # An --async job that ends while a later cell runs shows its summary in that cell's output too:
    # what a cell printed is looked for in each of its outputs.
    listed = code_cell(nb, "%mpirun_jobs").outputs
    assert any(o.get("text", "").startswith(started[0]) for o in listed), "%mpirun_jobs lists the job"
    assert f"job {started[0]} (sagemaker, 2 x 2) completed" in text_of(listed)
    printed = [match for o in code_cell(nb, "job.wait()").outputs for match in re.finditer(
        r"^4 ranks, 128 steps; loss [\d.]+ -> [\d.]+; largest difference from one process (\S+)$", o.get("text", ""),
        re.MULTILINE)]
    assert len(printed) == 1 and float(printed[0][1]) < 1e-4
    # the budget stops a job that would run for ten minutes, and says so in the cell's error
    budget = code_cell(nb, "%%mpirun_remote --backend sagemaker --instance-type ml.g5.xlarge").outputs
    (error,) = [o for o in budget if o.output_type == "error"]
    assert error.ename == "JobError" and re.fullmatch(
        r"job \S+: its cost reached --max-cost \$0\.002 \(about \$[\d.]+ at list price\); all 2 ranks were stopped "
        r"\(raise --max-cost to let it run longer\)", error.evalue), error.evalue
