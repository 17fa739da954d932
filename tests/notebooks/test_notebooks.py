"""The notebooks execute in a real kernel (nbclient), as stored, and are stored as they last ran.
Those whose cells run on SageMaker are in ``test_notebooks_sagemaker``."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from helpers import needs_hosts, needs_slurm, needs_torch
from notebook_runs import DURATION, NOTEBOOKS, RUNNING_LINE, WIDGET_VIEW, code_cell, execute, executed, stored_notebook, text_of


@pytest.mark.parametrize("name", execute.NOTEBOOKS)
def test_each_notebook_is_stored_as_it_last_ran(name):
    nb = stored_notebook(name)
    assert nb.metadata.get("mpi_magic", {}).get("code_digest") == execute.code_digest(nb), (
        f"{name} changed since it was executed: run python notebooks/execute.py {name}")
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is None
            assert execute.keeps_output(cell) or not cell.outputs, f"{name} keeps an output it should not"
    assert "widgets" not in nb.metadata


def test_the_digest_sees_a_changed_code_cell():
    nb = stored_notebook("quickstart.ipynb")
    before = execute.code_digest(nb)
    code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2 --gather").source += "\nx = 1"
    assert execute.code_digest(nb) != before


def test_the_notebook_runner_names_what_it_runs_and_refuses_a_name_it_does_not_know():
    script = os.path.join(NOTEBOOKS, "execute.py")
    shown = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "quickstart.ipynb" in shown.stdout, shown.stderr
    refused = subprocess.run([sys.executable, script, "quikstart.ipynb"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == (f"execute.py: error: quikstart.ipynb is not one of the notebooks: "
                                               f"{', '.join(execute.NOTEBOOKS)}")


def _comparable(outputs) -> list[dict]:
    """What an output says, without what differs between runs: job names, durations, the host,
    how many progress lines the text view printed while the job ran (one per few seconds), and the
    summary's peak memory line."""
    outputs = [o for o in outputs if not (o.get("name") == "stderr" and all(
        RUNNING_LINE.match(line) for line in o.get("text", "").splitlines()))]
    text = json.dumps([{"type": o.output_type, "name": o.get("name"), "text": o.get("text"),
                        "plain": o.get("data", {}).get("text/plain"), "ename": o.get("ename"),
                        "evalue": o.get("evalue"), "traceback": o.get("traceback")} for o in outputs])
    text = re.sub(r"mpi-\d{8}-\d{6}-[0-9a-f]+", "JOB", text)
    text = re.sub(r"\d+\.\d+s\b", "Ts", text)
    text = re.sub(r"(instance \d+), [^)]+\)", r"\1, HOST)", text)
    text = re.sub(r"\\n  peak memory: [^\\]*", "", text)  # (sampled once a rank has run a second: on a loaded machine)
    return json.loads(text)


def _check_quickstart_results(nb) -> None:
    shown = text_of(code_cell(nb, "print(total)").outputs).splitlines()
    assert shown[0] == "3120.0"
    assert "completed: 4 ranks (4 completed)" in shown[1]
    assert shown[2] == "[(0, 0, 12, 12), (1, 0, 12, 12), (2, 1, 12, 12), (3, 1, 12, 12)]"
    assert text_of(code_cell(nb, "where").outputs) == "[(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]"
    failed = code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2\nfrom mpi4py")
    error = [o for o in failed.outputs if o.output_type == "error"]
    assert [e.ename for e in error] == ["RemoteRankError"]
    assert error[0].evalue.startswith("rank 2 (instance 1, ") and error[0].evalue.endswith("ValueError: shard 2 is empty")
    assert "    raise ValueError(f'shard {mpi_magic.rank()} is empty')" in error[0].traceback
    config = text_of(code_cell(nb, "%mpirun_config instances=2").outputs)
    assert re.search(r"^instances +2 +\(%mpirun_config\)", config, re.MULTILINE), config
    assert text_of(code_cell(nb, "ranks").outputs) == "4", "the cell without options used the defaults set above"


@pytest.mark.timeout(300)
def test_quickstart_in_a_kernel_shows_the_dashboard_then_the_summary_in_its_place(tmp_path):
    nb = executed("quickstart.ipynb", tmp_path, view="auto")
    outputs = code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2 --out job").outputs
    models = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"].values()
    bars = [m["state"] for m in models if m["model_name"] == "FloatProgressModel"]
    main_job = bars[:5]
    assert len(main_job) == 5, "the dashboard was drawn: the aggregate bar and one per rank"
    assert all(b["value"] == b["max"] and b["bar_style"] == "success" for b in main_job[1:])
    kinds = [mime for o in outputs for mime in o.get("data", {})]
    assert WIDGET_VIEW not in kinds, "the saved notebook keeps the summary, not the widget"
    assert outputs[0]["output_type"] == "display_data", "the summary sits above the printed lines"
    summary = outputs[0].data["text/html"].replace(" style='text-align:left'", "")
    assert summary.count("<td>completed</td>") == 4 and summary.count("<td>12/12</td>") == 4
    assert "4 ranks agree: total = 3120.0" in text_of(outputs)
    _check_quickstart_results(nb)


@pytest.mark.timeout(300)
def test_quickstart_headless_prints_each_ranks_progress_and_the_failure_it_stores(tmp_path):
    nb = executed("quickstart.ipynb", tmp_path)
    outputs = code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2 --out job").outputs
    progress = [line for line in text_of(outputs).splitlines() if " running " in line]
    per_rank = [i for i, line in enumerate(progress) if "; ranks 0:" in line and " 3:" in line]
    assert per_rank, "progress lines with every rank's share are printed while the job runs"
    assert len(per_rank) == len(progress) - per_rank[0], "once a rank reports progress, every line lists each rank"
    assert WIDGET_VIEW not in [mime for o in outputs for mime in o.get("data", {})]
    _check_quickstart_results(nb)
    stored = stored_notebook("quickstart.ipynb")
    for ran, kept in zip(nb.cells, stored.cells):
        if execute.keeps_output(kept):
            assert _comparable(ran.outputs) == _comparable(kept.outputs), "the stored output is what execution shows"
    assert socket.gethostname() in text_of(code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2\nfrom").outputs)


@pytest.mark.timeout(300)
@needs_torch()
def test_data_parallel_training_matches_a_single_process_run(tmp_path):
    import torch

    nb = executed("data_parallel_training.ipynb", tmp_path)
    training = text_of(code_cell(nb, "%%mpirun_remote --instances 1 --gpus 2 --out job").outputs)
    assert re.search(rf"completed {DURATION}: 2/2 ranks done", training), training
    # a line every 2 s lists each rank's tqdm share while the job runs, which a short loop can finish
    # between two lines; the summary keeps where each rank's last bar ended
    assert "progress: ranks 0:100% 1:100%" in training, "the ranks' tqdm loops were reported"
    shown = text_of(code_cell(nb, "def train_single_process").outputs)
    steps = int(re.search(r"^(\d+) steps; loss", shown, re.MULTILINE).group(1))
    assert steps == 4 * 2048 // (2 * 32), "epochs x batches of two ranks' samples"
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", shown).groups())
    assert last < first / 10, "the model learned"
    loss_gap, weight_gap = map(float, re.search(r"loss ([\d.e+-]+), weights ([\d.e+-]+)", shown).groups())
    assert loss_gap < 1e-4 and weight_gap < 1e-4
    gpu = text_of(code_cell(nb, "%%mpirun_remote --instances 1\n").outputs)
    if not torch.cuda.is_available():
        assert "no CUDA GPU here" in gpu
    else:
        assert re.search(r"rank 0 of \d+ on .*: loss", gpu)


def test_diagnosing_finds_the_deadlock_inspects_the_failed_rank_follows_the_loss_and_names_the_straggler(tmp_path):
    nb = executed("diagnosing.ipynb", tmp_path)
    deadlock = text_of(code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2 --timeout").outputs)
    assert ("where the ranks are: ranks 0, 1, 3 at cell line 9 in allreduce; rank 2 at cell line 7 in sleep"
            in deadlock), deadlock
    failed = text_of(code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2\nimport mpi_magic").outputs)
    assert "%mpirun_debug opens the debugger on rank 1's frames and locals" in "\n".join(
        line for o in code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2\nimport mpi_magic").outputs
        for line in o.get("traceback", [])), failed
    debugged = re.sub("\x1b\\[[0-9;]*m", "", text_of(code_cell(nb, "%mpirun_debug").outputs))
    assert "(22, 2, 11)" in debugged and "('rank 1', 2)" in debugged, debugged
    followed = text_of(code_cell(nb, "for rank, series in job.metrics.items()").outputs)
    for rank in range(4):  # the cell's loss at its last step, 39, as set_postfix reported it
        last = math.exp(-39 / (8 + 4 * rank)) + 0.01 * rank
        assert re.search(rf"rank {rank}: 40 loss points, last {last:.3f}; accuracy \[([\d.]+, ){{3}}[\d.]+\]", followed)
    peaks = [int(mb) for mb in re.search(r"peak memory per rank \(MB\): \[([\d, ]+)\]", followed).group(1).split(",")]
    assert peaks[3] - peaks[0] > 40, "rank 3 holds 60 MB more than rank 0"
    slow = text_of(code_cell(nb, "%%mpirun_remote --instances 2 --gpus 2\nfrom mpi4py import MPI\nfrom tqdm").outputs)
    assert re.search(rf"\n  straggler: rank 3: \d\.\dx the others' median step time \(\d+ms vs \d+ms\) for {DURATION}, "
                     "until it finished\n", slow), slow
    assert slow.count("straggler:") == 2, "said once while it ran, and in the summary"
    stored = stored_notebook("diagnosing.ipynb")
    for ran, kept in zip(nb.cells, stored.cells):  # (the lines a quiet job prints depend on the machine's pace)
        if execute.keeps_output(kept):
            errors = [_comparable([o for o in cell.outputs if o.output_type == "error"]) for cell in (ran, kept)]
            assert errors[0] == errors[1], "the stored error is what execution shows"


@pytest.mark.timeout(300)
@needs_slurm()
def test_slurm_runs_the_quickstart_on_the_nodes_of_an_allocation_and_names_the_failing_ranks_node(
        tmp_path, slurm_cluster):
    nb = executed("slurm.ipynb", tmp_path, cloud=slurm_cluster.environ)  # SLURM_CONF set: the notebook starts none
    shown = text_of(code_cell(nb, "print(total, nodes)").outputs).splitlines()
    assert shown[0] == "100.0 ['n1', 'n1', 'n2', 'n2']", "2 tasks on each of 2 nodes, summed with mpi4py"
    assert "slurm completed: 4 ranks (4 completed)" in shown[1]
    assert shown[2] == "[(0, 0, 'n1'), (1, 0, 'n1'), (2, 1, 'n2'), (3, 1, 'n2')]", "each rank's host is its node"
    assert text_of(code_cell(nb, "where").outputs) == "[(0, 0, 'n1'), (1, 0, 'n1'), (2, 1, 'n2'), (3, 1, 'n2')]"
    planned = text_of(code_cell(nb, "%%mpirun_remote --backend slurm --instances 2 --gpus 2 --dry-run").outputs)
    assert re.search(r"^\S*salloc .* --nodes=2 --ntasks-per-node=2 /bin/bash \S+/job\.sh$", planned,
                     re.MULTILINE), planned
    assert re.search(r"^\S*mpirun -np 4 .* -m mpi_magic\.runtime ", planned, re.MULTILINE), planned
    assert re.search(r"^sbatch --test-only: Job \d+ to start at .* on nodes n\S+ in partition debug$", planned,
                     re.MULTILINE), planned
    failed = code_cell(nb, "%%mpirun_remote --backend slurm --instances 2 --gpus 2\nfrom mpi4py")
    error = [o for o in failed.outputs if o.output_type == "error"]
    assert [(e.ename, e.evalue) for e in error] == [
        ("RemoteRankError", "rank 3 (instance 1, n2) raised ZeroDivisionError: division by zero")]
    timed = text_of(code_cell(nb, "%%mpirun_remote --backend slurm --instances 2 --gpus 2 --partition short --time 5")
                    .outputs)
    assert re.search(rf"running {DURATION}: .*time left 4:[0-5]\d", timed), "the running job shows its time left"
    assert "completed" in timed and "4/4 ranks done" in timed, timed
    refused = [o for o in code_cell(nb, "%%mpirun_remote --backend slurm --instances 2 --gpus 2 --partition short "
                                        "--time 30").outputs if o.output_type == "error"]
    assert [(e.ename, e.evalue) for e in refused] == [
        ("SlurmSetupError", "--time 30 is over partition short's limit of 10:00; lower --time or choose another "
                            "--partition")]
    stored = stored_notebook("slurm.ipynb")
    for ran, kept in zip(nb.cells, stored.cells):
        if execute.keeps_output(kept):
            errors = [_comparable([o for o in cell.outputs if o.output_type == "error"]) for cell in (ran, kept)]
            assert errors[0] == errors[1], "the stored error is what execution shows"
    deadline = time.monotonic() + 30
    while (queued := slurm_cluster.run("squeue", "-h", "-o", "%i %T").stdout.strip()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not queued, f"the notebook left jobs in the queue: {queued}"


@pytest.mark.timeout(300)
@needs_hosts()
def test_kubernetes_runs_the_quickstart_as_mpijobs_across_worker_pods_and_names_the_failing_ranks_host(
        tmp_path, kubernetes_cluster):
    nb = executed("kubernetes.ipynb", tmp_path, cloud=kubernetes_cluster.environ)  # KUBECONFIG set: it starts none
    shown = text_of(code_cell(nb, "print(total, hosts)").outputs).splitlines()
    assert shown[0] == "100.0 ['node-1', 'node-1', 'node-2', 'node-2']", "2 slots on each of 2 workers, summed"
    assert "kubernetes completed: 4 ranks (4 completed)" in shown[1]
    name = re.search(r"Job (mpi-\S+) kubernetes", shown[1]).group(1)
    assert shown[2] == (f"[(0, 0, '{name}-worker-0 on node-1'), (1, 0, '{name}-worker-0 on node-1'), "
                        f"(2, 1, '{name}-worker-1 on node-2'), (3, 1, '{name}-worker-1 on node-2')]"), \
        "each rank's host is its worker pod and that pod's node"
    assert text_of(code_cell(nb, "where").outputs) == "[(0, 0), (1, 0), (2, 1), (3, 1)]"
    planned = text_of(code_cell(nb, "%%mpirun_remote --backend kubernetes --instances 2 --gpus 2 --dry-run").outputs)
    job = json.loads(planned[planned.index("{"):])
    assert (job["kind"], job["metadata"]["labels"]["team"], job["spec"]["slotsPerWorker"]) == ("MPIJob", "ml", 2)
    failed = code_cell(nb, "%%mpirun_remote --backend kubernetes --instances 2 --gpus 2\nfrom mpi4py")
    errors = [(e.ename, e.evalue) for e in failed.outputs if e.output_type == "error"]
    assert len(errors) == 1 and errors[0][0] == "RemoteRankError" and re.fullmatch(
        r"rank 3 \(instance 1, mpi-\S+-worker-1 on node-2\) raised ZeroDivisionError: division by zero", errors[0][1])
    waited = code_cell(nb, "%%mpirun_remote --backend kubernetes --instances 2 --gpus 2 --node-selector pool=a100")
    assert "Kubernetes: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector." in \
        text_of(waited.outputs)
    assert [e.ename for e in waited.outputs if e.output_type == "error"] == ["JobTimeoutError"]
    stored = stored_notebook("kubernetes.ipynb")
    for ran, kept in zip(nb.cells, stored.cells):
        if execute.keeps_output(kept):
            errors = [_comparable([o for o in cell.outputs if o.output_type == "error"]) for cell in (ran, kept)]
            assert errors[0] == errors[1], "the stored error is what execution shows"
