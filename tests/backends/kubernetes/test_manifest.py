"""A cell's MPIJob, checked against Kubeflow's MPI Operator's own CRD schema: that of release v0.5.0
(commit 7c625160e9f561ddf18a7c6d16ecf8cf40889e19), the operator SageMaker HyperPod's EKS clusters
ship. ``mpijob_crd_v0.5.0.json`` is the ``openAPIV3Schema`` of its
``manifests/base/kubeflow.org_mpijobs.yaml``, descriptions left out (Apache-2.0, as the operator)."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from mpi_magic.backends.kubernetes import manifest
from mpi_magic.backends.kubernetes.manifest import PodPlacement
from mpi_magic.testing.kubernetes_emulator import strict

with open(os.path.join(os.path.dirname(__file__), "mpijob_crd_v0.5.0.json"), encoding="utf-8") as _f:
    SCHEMA = strict(json.load(_f)["openAPIV3Schema"])
LAUNCH = ["mpirun", "-np", "8", "--tag-output", "python", "-m", "mpi_magic.runtime", "/fsx/alice/jobs/mpi-1"]



def _checked(job: dict) -> dict:
    jsonschema.Draft7Validator(SCHEMA).validate(job)
    return job


@pytest.mark.parametrize("placement, gpus", [
    (PodPlacement(), 0),
    (PodPlacement(namespace="ml", service_account="trainer", node_selector={"node.kubernetes.io/instance-type":
                                                                          "ml.g5.12xlarge"},
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               queue="team-a", priority_class="high", labels={"team": "a"},
               annotations={"sagemaker.amazonaws.com/enable-job-auto-resume": "true"}), 4),
], ids=["defaults", "every-option"])
def test_a_cells_mpijob_is_what_the_operators_schema_takes(placement, gpus):
    job = _checked(manifest.mpijob("mpi-1", "ghcr.io/alice/train:1", LAUNCH, {"MPI_MAGIC_JOB": "mpi-1"}, 2, 4, gpus,
                                   placement))
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert spec["slotsPerWorker"] == 4 and spec["mpiImplementation"] == "OpenMPI"
    assert spec["runPolicy"]["backoffLimit"] == 0, "a cell's job is never retried"
    assert spec["runPolicy"]["suspend"] is bool(placement.queue), "a queued job waits for Kueue to admit it"
    launcher, workers = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and workers["replicas"] == 2
    (run,) = launcher["template"]["spec"]["containers"]
    assert [*run["command"], *run["args"]] == LAUNCH
    (serve,) = workers["template"]["spec"]["containers"]
    assert serve["command"] == ["/usr/sbin/sshd", "-De"]
    assert serve.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", "0") == str(gpus), "a quantity"
    for pod in (launcher, workers):
        assert pod["template"]["metadata"]["labels"]["mpi-magic/job"] == "mpi-1", "one label selects every pod"
        assert pod["template"]["spec"].get("serviceAccountName") == placement.service_account
    if placement.queue:
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert job["metadata"]["annotations"] == placement.annotations


@pytest.mark.parametrize("field, value", [
    (("spec", "mpiImplementation"), "OpenMPI5"),
    (("spec", "slotsPerWorker"), "four"),
    (("spec", "runPolicy", "cleanPodPolicy"), 3),
    (("spec", "runPolicy", "backoffLimits"), 0),  # (a field it does not name)
])
def test_the_schema_refuses_what_the_operator_would(field, value):
    """(So the check above can fail: the schema is the operator's, not a copy of what this module writes.)"""
    job = manifest.mpijob("mpi-1", "img", LAUNCH, {}, 2, 4, 0, PodPlacement())
    parent = job
    for key in field[:-1]:
        parent = parent[key]
    parent[field[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        _checked(job)
