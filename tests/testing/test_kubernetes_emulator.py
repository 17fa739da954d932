"""The Kubernetes API emulator, through the unchanged ``kubernetes`` client over real HTTP: what the
Kubernetes backend will ask of a cluster (discovery, the MPIJob resource, pods by label, their logs,
watches, deletion that takes the job's pods with it), and its refusals, as a cluster makes them."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION
from mpi_magic.testing import kubernetes_emulator as emulator



@pytest.fixture
def cluster(tmp_path):
    """A store served on loopback in this process (the test writes what a kubelet would: logs, phases),
    and an API client configured from the kubeconfig it hands out."""
    store = emulator.Store(namespaces=("default", "ml"))
    server = emulator.make_server(store, "secret-token")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(emulator.kubeconfig(f"http://{host}:{port}", "secret-token")))
    api = config.new_client_from_config(config_file=str(path))
    yield store, api
    api.close()
    server.shutdown()
    server.server_close()  # (which ends the threads still serving a client's open connection)
    for thread in [t for t in threading.enumerate() if t.name.endswith("(process_request_thread)")]:
        thread.join(5)


def _mpijob(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MPIJob", "metadata": {"name": name, "labels": {"app": "x"}},
            "spec": {"slotsPerWorker": 2, "mpiReplicaSpecs": {}}}


def test_the_mpijob_resource_is_discovered_created_listed_and_read(cluster):
    store, api = cluster
    groups = client.ApisApi(api).get_api_versions().groups
    assert [g.name for g in groups] == ["scheduling.k8s.io", GROUP, "kueue.x-k8s.io"], "PriorityClasses, the MPI Operator's, Kueue's"
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources
    assert [(r.name, r.kind, r.namespaced) for r in resources] == [(PLURAL, "MPIJob", True)]
    objects = client.CustomObjectsApi(api)
    made = objects.create_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, _mpijob("cell-1"))
    assert made["metadata"]["uid"] and made["metadata"]["namespace"] == "ml"
    assert objects.get_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "cell-1")["spec"]["slotsPerWorker"] == 2
    listed = objects.list_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, label_selector="app=x")["items"]
    assert [item["metadata"]["name"] for item in listed] == ["cell-1"]
    assert objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"] == []
    with pytest.raises(ApiException) as taken:
        objects.create_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, _mpijob("cell-1"))
    assert (taken.value.status, json.loads(taken.value.body)["reason"]) == (409, "AlreadyExists")


def _cell_job(name: str, suspended: bool = False) -> dict:
    """A cell's MPIJob as the backend makes it: 2 workers of 2 slots."""
    from mpi_magic.backends.kubernetes import manifest

    placement = manifest.PodPlacement(namespace="ml", queue="team-a" if suspended else None)
    return manifest.mpijob(name, "img", ["mpirun", "-np", "4", "true"], {}, 2, 2, 0, placement)


def test_the_operator_makes_a_jobs_pods_which_are_listed_by_label_watched_and_go_with_the_job(cluster):
    store, api = cluster
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    version = core.list_namespaced_pod("ml").metadata.resource_version
    seen = []

    def follow() -> None:
        for change in watch.Watch().stream(core.list_namespaced_pod, "ml", label_selector="mpi-magic/job=cell-2",
                                           resource_version=version, timeout_seconds=5):
            if change["type"] != "MODIFIED":
                seen.append((change["type"], change["object"].metadata.name))
            if len(seen) == 6:
                return

    watcher = threading.Thread(target=follow)
    watcher.start()
    objects.create_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, _cell_job("cell-2"))
    core.create_namespaced_pod("ml", {"metadata": {"name": "other", "labels": {"mpi-magic/job": "cell-9"}},
                                      "spec": {"containers": [{"name": "c", "image": "img"}]}})
    workers = core.list_namespaced_pod("ml", label_selector="mpi-magic/job=cell-2,training.kubeflow.org/job-role"
                                                            "!=launcher").items
    assert sorted(p.metadata.name for p in workers) == ["cell-2-worker-0", "cell-2-worker-1"]
    assert workers[0].spec.containers[0].command == ["/usr/sbin/sshd", "-De"], "the template's container"
    hostfile = core.read_namespaced_config_map("cell-2-config", "ml").data["hostfile"]
    assert hostfile == "cell-2-worker-0.cell-2.ml.svc slots=2\ncell-2-worker-1.cell-2.ml.svc slots=2\n"
    # the launcher once every worker runs (launcherCreationPolicy: WaitForWorkersReady), as a kubelet says
    for index, worker in enumerate(("cell-2-worker-0", "cell-2-worker-1")):
        assert core.list_namespaced_pod("ml", label_selector="training.kubeflow.org/job-role=launcher").items == []
        store.update("pods", "ml", worker, lambda pod: pod["status"].update(phase="Running"))
    launcher = core.list_namespaced_pod("ml", label_selector="training.kubeflow.org/job-role=launcher").items
    assert [p.metadata.name for p in launcher] == ["cell-2-launcher"]
    objects.delete_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "cell-2", propagation_policy="Foreground")
    watcher.join(10)
    assert sorted(seen) == sorted([("ADDED", "cell-2-launcher"), ("ADDED", "cell-2-worker-0"),
                                   ("ADDED", "cell-2-worker-1"), ("DELETED", "cell-2-launcher"),
                                   ("DELETED", "cell-2-worker-0"), ("DELETED", "cell-2-worker-1")]), seen
    assert [p.metadata.name for p in core.list_namespaced_pod("ml").items] == ["other"], "only the job's pods went"
    assert core.list_namespaced_config_map("ml").items == [] and core.list_namespaced_secret("ml").items == []


def test_a_suspended_job_gets_its_pods_once_resumed_as_kueue_admits_it(cluster):
    store, api = cluster
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    objects.create_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, _cell_job("cell-3", suspended=True))
    assert core.list_namespaced_pod("ml").items == [], "waiting for admission"
    objects.patch_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "cell-3",
                                           {"spec": {"runPolicy": {"suspend": False}}})
    made = core.list_namespaced_pod("ml", label_selector="mpi-magic/job=cell-3").items
    assert sorted(p.metadata.name for p in made) == ["cell-3-worker-0", "cell-3-worker-1"], "the launcher once they run"


def test_a_pods_log_is_read_whole_or_followed_until_the_pod_ends(cluster):
    store, api = cluster
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {"metadata": {"name": "launcher"},
                                           "spec": {"containers": [{"name": "c", "image": "img"}]}})
    store.log("default", "launcher", ["rank 0 up"])
    assert core.read_namespaced_pod_log("launcher", "default") == "rank 0 up\n"
    stream = core.read_namespaced_pod_log("launcher", "default", follow=True, _preload_content=False)

    def finish() -> None:
        store.log("default", "launcher", ["rank 0 done"])
        store.update("pods", "default", "launcher", lambda pod: pod.setdefault("status", {}).update(phase="Succeeded"))

    threading.Timer(0.3, finish).start()
    assert b"".join(stream.stream()).decode().splitlines() == ["rank 0 up", "rank 0 done"]


def test_a_cluster_refuses_as_kubernetes_does(cluster, tmp_path):
    store, api = cluster
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nope", "ml")
    assert (missing.value.status, json.loads(missing.value.body)["reason"]) == (404, "NotFound")
    with pytest.raises(ApiException) as no_namespace:
        core.create_namespaced_pod("nowhere", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    assert json.loads(no_namespace.value.body)["message"] == 'namespaces "nowhere" not found'
    bad = tmp_path / "bad"
    bad.write_text(json.dumps(emulator.kubeconfig(api.configuration.host, "wrong-token")))
    with pytest.raises(ApiException) as unauthorised:
        client.CoreV1Api(config.new_client_from_config(config_file=str(bad))).list_namespaced_pod("ml")
    assert unauthorised.value.status == 401
    store.mpi_operator = False  # a cluster without Kubeflow's MPI Operator
    assert [g.name for g in client.ApisApi(api).get_api_versions().groups] == ["scheduling.k8s.io", "kueue.x-k8s.io"]
    with pytest.raises(ApiException) as no_crd:
        client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL)
    assert no_crd.value.status == 404


def test_started_alone_it_says_what_a_notebook_needs_and_stop_ends_it(tmp_path):
    root = str(tmp_path / "k8s")
    started = subprocess.run([sys.executable, "-m", "mpi_magic.testing.kubernetes_emulator", "start", "--root", root],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    assert started.stdout.splitlines() == [f"export KUBECONFIG={root}/kubeconfig",
                                           f"export MPI_MAGIC_KUBERNETES_IMAGE={emulator.IMAGE}"]
    try:
        api = config.new_client_from_config(config_file=f"{root}/kubeconfig")
        assert [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items] == ["default"]
        api.close()
    finally:
        stopped = subprocess.run([sys.executable, "-m", "mpi_magic.testing.kubernetes_emulator", "stop", "--root",
                                  root], capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    with open(f"{root}/server.pid") as f:
        pid = int(f.read())
    import psutil

    assert psutil.wait_procs([psutil.Process(pid)] if psutil.pid_exists(pid) else [], timeout=10)[1] == [], \
        "the server ended"


def test_the_tests_start_it_from_python_and_stopping_it_leaves_nothing(tmp_path):
    import psutil

    started = emulator.KubernetesEmulator(str(tmp_path / "k8s")).start()
    pid = started._server.pid
    try:
        api = config.new_client_from_config(config_file=started.environ["KUBECONFIG"])
        assert [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items] == ["default"]
        api.close()
    finally:
        started.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_given_the_crds_schema_an_mpijob_it_does_not_take_is_refused_as_an_api_server_refuses_it():
    import os

    with open(os.path.join(os.path.dirname(__file__), "..", "backends", "kubernetes", "mpijob_crd_v0.5.0.json")) as f:
        store = emulator.Store(mpijob_schema=json.load(f)["openAPIV3Schema"])
    job = _cell_job("cell-5")
    job["metadata"]["namespace"] = "default"
    job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAcountName"] = "typo"
    with pytest.raises(emulator.ApiError) as refused:
        store.create(PLURAL, "default", job)
    assert refused.value.code == 422 and str(refused.value).startswith(
        'MPIJob.kubeflow.org "cell-5" is invalid: spec.mpiReplicaSpecs.Worker.template.spec: Additional properties '
        "are not allowed ('serviceAcountName' was unexpected)")
    del job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["serviceAcountName"]
    assert store.create(PLURAL, "default", job)["metadata"]["name"] == "cell-5", "the job as the backend makes it"
