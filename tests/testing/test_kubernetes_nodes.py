"""The Kubernetes emulator's nodes (mpi_magic.testing.kubernetes_nodes), through the unchanged client:
an MPIJob's pods are scheduled onto test hosts, run as real processes there (the launcher's mpirun
reaching the workers' sshd across hosts), end with their exit status and go with the job; a pod that
cannot be placed or whose image cannot be pulled says why, as a cluster says it."""

from __future__ import annotations

import os

import psutil
import pytest
from helpers import needs_hosts, wait_until
from kubernetes import client, config

from mpi_magic.backends.kubernetes import manifest
from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION
from mpi_magic.testing.hosts import TestHosts
from mpi_magic.testing.kubernetes_emulator import IMAGE, KubernetesEmulator

pytestmark = needs_hosts()


@pytest.fixture
def cluster(tmp_path):
    emulator = KubernetesEmulator(str(tmp_path / "k8s"), nodes=3).start()
    api = config.new_client_from_config(config_file=emulator.kubeconfig)
    try:
        yield emulator, client.CustomObjectsApi(api), client.CoreV1Api(api)
    finally:
        api.close()
        emulator.stop()
    assert not os.path.exists(tmp_path / "k8s" / "bed"), "the nodes went down with the emulator"


def _job(objects, name: str, launch: str, image: str = IMAGE, gpus: int = 0) -> None:
    job = manifest.mpijob(name, image, ["sh", "-c", launch], {"GREETING": "hello"}, 2, 2, gpus,
                          manifest.PodPlacement())
    objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job)


def _phase(core, pod: str) -> str | None:
    found = [p for p in core.list_namespaced_pod("default").items if p.metadata.name == pod]
    return found[0].status.phase if found else None


def _events(core, pod: str) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in core.list_namespaced_event("default").items
            if e.involved_object.name == pod]


def test_the_launchers_mpirun_reaches_the_workers_on_other_nodes_and_the_job_ends_with_it(cluster):
    emulator, objects, core = cluster
    _job(objects, "cell-1", 'mpirun --allow-run-as-root --hostfile "$OMPI_MCA_orte_default_hostfile" -np 4 '
                            '--tag-output -x GREETING sh -c \'echo "$(hostname) $GREETING"\' && echo "mpirun: $?"')
    assert wait_until(lambda: _phase(core, "cell-1-launcher") in ("Succeeded", "Failed"), 60), "the launcher ended"
    pods = {p.metadata.name: p for p in core.list_namespaced_pod("default").items}
    assert pods["cell-1-launcher"].status.phase == "Succeeded", core.read_namespaced_pod_log("cell-1-launcher", "default")
    log = core.read_namespaced_pod_log("cell-1-launcher", "default").splitlines()
    assert log[-1] == "mpirun: 0"
    # two slots per worker, each worker on a node of its own, the job's environment passed on by mpirun
    said = sorted(line.split(": ", 1)[1] for line in log if line.startswith("[1,"))
    assert said == ["node-1 hello", "node-1 hello", "node-2 hello", "node-2 hello"], log
    launcher = pods["cell-1-launcher"]
    assert launcher.spec.node_name == "node-3", "the launcher ran on the node with fewest pods"
    assert launcher.status.container_statuses[0].state.terminated.exit_code == 0
    assert [reason for reason, _ in _events(core, "cell-1-launcher")] == ["Scheduled", "Pulling", "Pulled",
                                                                         "Created", "Started"]
    conditions = objects.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cell-1")["status"]["conditions"]
    assert [(c["type"], c["status"]) for c in conditions][-1] == ("Succeeded", "True")
    assert wait_until(lambda: _phase(core, "cell-1-worker-0") is None and _phase(core, "cell-1-worker-1") is None, 10), \
        "the workers went once the launcher ended"
    assert _phase(core, "cell-1-launcher") == "Succeeded", "the launcher stays, its log to be read"


def test_deleting_the_job_stops_every_process_of_its_pods(cluster):
    emulator, objects, core = cluster
    _job(objects, "cell-2", "sleep 613")
    assert wait_until(lambda: _phase(core, "cell-2-launcher") == "Running", 30), "the launcher runs"
    bed = TestHosts.found(os.path.join(emulator.root, "bed"))
    running = {name: bed.pids(name) for name in bed.names}
    assert all(running.values()), "the workers' sshd and the launcher's command run, one on each node"
    assert any("613" in psutil.Process(pid).cmdline() for pid in running["node-3"])
    objects.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cell-2", propagation_policy="Foreground")
    assert core.list_namespaced_pod("default").items == []
    assert wait_until(lambda: not any(bed.pids(name) for name in bed.names), 10), "nothing of the pods runs"


def test_a_pod_that_no_node_fits_waits_with_the_schedulers_reason(cluster):
    emulator, objects, core = cluster
    _job(objects, "cell-3", "sleep 30", gpus=8)
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert wait_until(lambda: ("FailedScheduling", said) in _events(core, "cell-3-worker-0"), 10), "the scheduler said why"
    worker = core.read_namespaced_pod("cell-3-worker-0", "default")
    assert worker.status.phase == "Pending" and worker.spec.node_name is None
    assert (worker.status.conditions[0].reason, worker.status.conditions[0].message) == ("Unschedulable", said)


def test_an_image_the_nodes_cannot_pull_leaves_the_pod_waiting_with_the_kubelets_reason(cluster):
    emulator, objects, core = cluster
    _job(objects, "cell-4", "true", image="example.com/no-such-image:1")

    def waiting() -> str | None:
        statuses = core.read_namespaced_pod("cell-4-worker-0", "default").status.container_statuses
        return statuses[0].state.waiting.reason if statuses and statuses[0].state.waiting else None

    assert wait_until(lambda: waiting() == "ImagePullBackOff", 10), "the kubelet backed off"
    failed = [message for reason, message in _events(core, "cell-4-worker-0") if reason == "Failed"]
    assert failed and 'failed to pull and unpack image "example.com/no-such-image:1"' in failed[0]
    assert _phase(core, "cell-4-worker-0") == "Pending"
    assert _phase(core, "cell-4-launcher") is None, "the launcher waits for its workers to run"
