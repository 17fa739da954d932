"""The MPIJob (``kubeflow.org/v2beta1``, Kubeflow's MPI Operator) of one cell: ``--instances`` worker
pods of ``--gpus`` slots each, whose containers run sshd as the operator's workers do, and a launcher
pod that runs mpirun over the operator's ssh, reading the hostfile the operator writes. A cell's job is
never retried (``backoffLimit: 0``), its workers go once the launcher ended (``cleanPodPolicy:
Running``; the launcher stays until its log is read, and goes with the job, which the notebook deletes),
and where a Kueue queue is named the job is created suspended, for Kueue to admit.

The schema it is checked against is the operator's own CRD, of the release SageMaker HyperPod's EKS
clusters ship (``tests/backends/kubernetes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

API_VERSION, KIND = "kubeflow.org/v2beta1", "MPIJob"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # Kueue's: the local queue a job waits in for admission
JOB_LABEL = "mpi-magic/job"  # every pod of the job carries it: one list or watch finds them all
# the MPI Operator's labels on a job's pods
JOB_NAME, JOB_ROLE, REPLICA_INDEX = ("training.kubeflow.org/job-name", "training.kubeflow.org/job-role",
                                     "training.kubeflow.org/replica-index")
GPU_RESOURCE = "nvidia.com/gpu"
WORKER_COMMAND = ["/usr/sbin/sshd", "-De"]  # a worker serves mpirun's ssh until the launcher is done
STOP_GRACE = 5  # seconds a deleted pod's processes get between SIGTERM and SIGKILL (mpirun stops the ranks at once)
VOLUME = "mpi-magic-jobs"


@dataclass(frozen=True)
class PodPlacement:
    """Where the job's pods may run and how they are admitted: what the cell's options and
    ``%mpirun_config`` say (``--namespace``, ``--service-account``, ``--node-selector``, ...)."""

    namespace: str = "default"
    service_account: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    queue: str | None = None  # Kueue's local queue: the job is created suspended and waits for admission
    priority_class: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)  # e.g. HyperPod's auto-resume
    volume: tuple[str, str] | None = None  # (claim, path): the volume every pod mounts, where the job folder is


def mpijob(name: str, image: str, launch: list[str], env: dict[str, str], instances: int, slots: int,
           gpus_per_worker: int, placement: PodPlacement) -> dict:
    """The MPIJob of one cell: ``launch`` (mpirun and every rank's runtime) in the launcher, ``env`` in
    every container, ``gpus_per_worker`` GPUs asked for each worker (0: none)."""
    labels = {**placement.labels, JOB_LABEL: name}
    metadata = {"name": name, "namespace": placement.namespace,
                "labels": {**labels, **({QUEUE_LABEL: placement.queue} if placement.queue else {})}}
    if placement.annotations:
        metadata["annotations"] = dict(placement.annotations)
    variables = [{"name": key, "value": value} for key, value in sorted(env.items())]
    worker: dict = {"name": "worker", "image": image, "command": WORKER_COMMAND, "env": variables}
    if gpus_per_worker:
        worker["resources"] = {"limits": {GPU_RESOURCE: str(gpus_per_worker)}}  # (a quantity)
    launcher = {"name": "launcher", "image": image, "command": launch[:1], "args": launch[1:], "env": variables}
    return {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",  # (mpirun's ssh finds the workers' sshd up)
            "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "Running", "suspend": bool(placement.queue)},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never",
                             "template": _template(labels, launcher, placement)},
                "Worker": {"replicas": instances, "restartPolicy": "Never",
                           "template": _template(labels, worker, placement)},
            },
        },
    }


def _template(labels: dict[str, str], container: dict, placement: PodPlacement) -> dict:
    container = dict(container)
    spec: dict = {"containers": [container], "terminationGracePeriodSeconds": STOP_GRACE}
    if placement.volume:
        claim, path = placement.volume
        spec["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}]
        container["volumeMounts"] = [{"name": VOLUME, "mountPath": path}]
    if placement.service_account:
        spec["serviceAccountName"] = placement.service_account
    if placement.node_selector:
        spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        spec["tolerations"] = list(placement.tolerations)
    if placement.priority_class:
        spec["priorityClassName"] = placement.priority_class
    return {"metadata": {"labels": dict(labels)}, "spec": spec}
