"""The sessions notebook executes in a real kernel: one local session, several cells, its end; then
the same on SageMaker, on the rehearsal cloud (moto and the SageMaker emulator on loopback),
chosen by the documented settings that notebooks/execute.py also uses."""

from __future__ import annotations

import re

import boto3
from notebook_runs import execute, executed, text_of


def test_sessions_notebook_runs_cells_on_one_session_and_stops_it(tmp_path, local_aws_env):
    cloud = execute.rehearsal_settings(local_aws_env)
    nb = executed("sessions.ipynb", tmp_path, cloud=cloud)
    code = [c for c in nb.cells if c.cell_type == "code"]
    shown = [(c.source.splitlines()[0] if not c.source.startswith("%%time") else c.source, text_of(c.outputs)) for c in code]
    local = dict(shown[:shown.index(next(s for s in shown if "--backend sagemaker" in s[0]))])
    assert "4 ranks ready in" in local["%mpirun_session start -i 2 -g 2 --max-idle 600 --out session"]
    assert "2000000 [3. 3. 3. 3. 3. 3. 3. 3.]" in local["print(count, mean.round(2))"]
    sent = re.search(r"bytes sent: (\d+) then (\d+)", "".join(local.values()))
    assert sent and sent[1] == sent[2] and int(sent[1]) > 0, "weights crossed once"
    status = local["%mpirun_session"]
    assert ", idle" in status and "ranks alive: 4/4, cells run: 5" in status
    assert "stopped: 5 cells run, nothing of it is left running" in local["%mpirun_session stop"]

    on_sagemaker = dict(shown[len(local):])
    started = on_sagemaker["%mpirun_session start --backend sagemaker -i 2 -g 2 --max-idle 1800 --out cloud"]
    # SageMaker's phases as the job passes them (which ones are seen depends on when it is asked)
    assert "SageMaker: " in started and "4 ranks ready in" in started
    assert "[3. 3. 3. 3. 3. 3. 3. 3.]" in on_sagemaker["print(cloud_mean.round(1))"]
    job_name = re.search(r"training job: (session-\S+), InProgress \(Training\)", on_sagemaker["%mpirun_session"])[1]
    assert "sagemaker, 2 x 2 = 4 ranks, idle" in on_sagemaker["%mpirun_session"]
    assert "billable instance time: " in on_sagemaker["%mpirun_session"]
    assert f"training job: {job_name}, Stopped" in on_sagemaker["%mpirun_session stop"]
    sagemaker = boto3.client("sagemaker", region_name=cloud["AWS_DEFAULT_REGION"],
                             endpoint_url=cloud["AWS_ENDPOINT_URL_SAGEMAKER"], aws_access_key_id="testing",
                             aws_secret_access_key="testing")
    assert sagemaker.describe_training_job(TrainingJobName=job_name)["TrainingJobStatus"] == "Stopped"
