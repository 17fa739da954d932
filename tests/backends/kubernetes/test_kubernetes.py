"""--backend kubernetes through the magic, with the unchanged ``kubernetes`` client over real HTTP: against
the project's API emulator whose pods run as real processes on test hosts (the launcher's mpirun
reaching the workers' sshd across hosts), and, for what the API says before anything is created, an
emulated API server alone. Every cell's MPIJob and pods are gone once the cell has ended."""

from __future__ import annotations

import json
import os
import textwrap
import threading

import pytest
from helpers import kubernetes_left, needs_hosts, run, wait_until
from kubernetes import client, config

from mpi_magic.backends.kubernetes import cluster as k8s_cluster
from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION
from mpi_magic import KubernetesSetupError
from mpi_magic.errors import JobTimeoutError, RankExitError, RemoteRankError
from mpi_magic.testing import kubernetes_emulator as emulator

GONE_WITHIN = 10.0  # seconds after a cell's end by which nothing of its job may be left


@pytest.fixture
def k8s(ip, kubernetes):
    """The shell, its cells on the emulated cluster shown as text; the test fails if a job or pod is left."""
    ip.run_line_magic("mpirun_config", "view=text")
    yield ip
    assert wait_until(lambda: kubernetes_left(kubernetes) == [], GONE_WITHIN), f"left: {kubernetes_left(kubernetes)}"


# a cell whose two ranks each say they run (a file in ``started``), then talk to each other until the test is over
BOTH_RUNNING_CELL = textwrap.dedent("""\
    import os, time, mpi_magic
    from mpi4py import MPI
    open(os.path.join(started, str(mpi_magic.rank())), "w").close()
    for step in range(6000):
        MPI.COMM_WORLD.allreduce(step)
        time.sleep(0.05)
    """)


def _once_both_run(ip, tmp_path, action) -> threading.Thread:
    """A thread that calls ``action()`` once both ranks of the next ``BOTH_RUNNING_CELL`` run; its ``waited``
    says whether they did (within 30 s)."""
    started = tmp_path / "started"
    started.mkdir()
    ip.user_ns["started"] = str(started)  # (the pods share this machine's files)

    def wait_then_act() -> None:
        thread.waited = wait_until(lambda: len(os.listdir(started)) == 2, 30)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def _bed(cluster):
    from mpi_magic.testing.hosts import TestHosts

    bed = TestHosts.found(os.path.join(cluster.root, "bed"))
    assert bed is not None, "the emulator's nodes are up"
    return bed


@needs_hosts()
def test_a_cell_runs_as_an_mpijob_across_worker_pods_and_brings_its_values_back(k8s, capsys):
    k8s.user_ns["base"] = 10
    run(k8s, "--backend kubernetes -i 2 -g 2 --gather --env GREETING=hi", textwrap.dedent("""\
        import os
        import socket
        import mpi_magic
        from mpi4py import MPI
        where = (socket.gethostname(), mpi_magic.instance(), os.environ["GREETING"])
        total = base + MPI.COMM_WORLD.allreduce(mpi_magic.rank())
        """))
    # two workers of two slots, on nodes of their own (the launcher on the third); --env reaches every rank
    assert k8s.user_ns["where"] == [("node-1", 0, "hi"), ("node-1", 0, "hi"), ("node-2", 1, "hi"),
                                    ("node-2", 1, "hi")]
    assert k8s.user_ns["total"] == [16] * 4
    assert "(kubernetes, 2 x 2) completed" in capsys.readouterr().err


@needs_hosts()
def test_a_failing_rank_is_named_with_its_pod_and_node_and_the_job_goes(k8s):
    with pytest.raises(RemoteRankError) as raised:
        run(k8s, "--backend kubernetes -i 2 -g 2 --out job", textwrap.dedent("""\
            from mpi4py import MPI
            if MPI.COMM_WORLD.rank == 3:
                raise KeyError("missing shard")
            MPI.COMM_WORLD.barrier()
            """))
    name = k8s.user_ns["job"].name
    assert str(raised.value).startswith(f"rank 3 (instance 1, {name}-worker-1 on node-2) raised KeyError: 'missing shard'")


@needs_hosts()
def test_timeout_deletes_the_job_with_its_pods(k8s, kubernetes_cluster):
    with pytest.raises(JobTimeoutError):
        run(k8s, "--backend kubernetes -i 2 -g 1 --timeout 3", "import time\ntime.sleep(600)")
    bed = _bed(kubernetes_cluster)
    assert wait_until(lambda: not any(bed.pids(name) for name in bed.names), GONE_WITHIN), \
        "nothing of the job's pods runs on the nodes"


@needs_hosts()
def test_an_image_the_nodes_cannot_pull_ends_the_cell_with_the_kubelets_reason(k8s):
    with pytest.raises(RankExitError) as raised:
        run(k8s, "--backend kubernetes -i 2 -g 1 --image registry.example.com/team/missing:1", "x = 1")
    assert str(raised.value) == (
        "the job ended before its ranks started: the nodes cannot pull the image registry.example.com/team/missing:1 "
        '(ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/team/'
        'missing:1": failed to resolve reference "registry.example.com/team/missing:1": registry.example.com/team/'
        "missing:1: not found); the job was deleted")


# -- what the API says before anything is created ----------------------------------------------

@pytest.fixture
def api_server(tmp_path, monkeypatch):
    """An emulated API server alone (no nodes), in this process: ``serve(**store options)`` starts it and
    points KUBECONFIG at it; its store, to see that nothing was created."""
    started = []

    def serve(**options) -> emulator.Store:
        store = emulator.Store(**options)
        server = emulator.make_server(store, "token")
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(emulator.kubeconfig("http://%s:%d" % server.server_address[:2], "token")))
        monkeypatch.setenv("KUBECONFIG", str(path))
        monkeypatch.setenv("MPI_MAGIC_KUBERNETES_IMAGE", emulator.IMAGE)
        return store

    yield serve
    for server in started:
        server.shutdown()
        server.server_close()


def _refused(ip, line: str) -> str:
    with pytest.raises(KubernetesSetupError) as raised:
        run(ip, f"--backend kubernetes -i 2 -g 1 {line}", "x = 1")
    return str(raised.value)


def test_without_a_kubeconfig_or_a_service_account_one_sentence_says_what_to_do(ip, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert _refused(ip, "--image img") == (
        "no Kubernetes cluster to talk to: there is no kubeconfig (KUBECONFIG, ~/.kube/config) and this is not a pod "
        "with a service account; point KUBECONFIG at the cluster's (on SageMaker HyperPod's EKS clusters: aws eks "
        "update-kubeconfig --name CLUSTER)")


def test_a_cluster_without_the_mpi_operator_or_the_namespace_or_the_queue_is_named_before_anything_is_made(
        ip, api_server):
    store = api_server(mpi_operator=False)
    assert _refused(ip, "") == k8s_cluster.NO_OPERATOR
    store.mpi_operator = True
    assert _refused(ip, "--namespace ml") == ("the cluster has no namespace ml: name another with --namespace "
                                              "(kubectl get namespaces lists them), or create it")
    assert _refused(ip, "--queue team-a") == ("there is no Kueue local queue team-a in namespace default "
                                              "(kubectl get localqueues -n default lists them)")
    store.kueue = False
    assert _refused(ip, "--queue team-a") == ("--queue team-a names a Kueue queue, but the cluster has no Kueue "
                                              "(no kueue.x-k8s.io API): drop --queue, or install Kueue")
    assert store.listed(PLURAL, None)[0] == [], "nothing was created"


def test_a_priority_class_or_service_account_the_cluster_lacks_is_named_before_anything_is_made(ip, api_server):
    store = api_server()
    assert _refused(ip, "--priority-class urgent") == ("the cluster has no PriorityClass urgent (kubectl get "
                                                       "priorityclasses lists them)")
    assert _refused(ip, "--service-account trainer") == ("there is no service account trainer in namespace default "
                                                         "(kubectl get serviceaccounts -n default lists them)")
    store.create("priorityclasses", "", {"metadata": {"name": "urgent"}, "value": 1000})
    store.create("serviceaccounts", "default", {"metadata": {"name": "trainer"}})
    ip.run_cell_magic("mpirun_remote", "--backend kubernetes -i 2 -g 1 --priority-class urgent --service-account "
                                       "trainer --dry-run", "x = 1")  # (taken: the job would be made)
    assert store.listed(PLURAL, None)[0] == []


def test_a_verb_the_cluster_forbids_is_named_with_its_resource_and_namespace(ip, api_server):
    store = api_server(forbidden=(("create", "mpijobs", "default"),))
    assert _refused(ip, "") == (
        'the cluster forbids you to create mpijobs.kubeflow.org in namespace default (mpijobs.kubeflow.org is '
        'forbidden: User "system:serviceaccount:default:notebook" cannot create resource "mpijobs" in API group '
        '"kubeflow.org" in the namespace "default"); ask its admin for a Role that grants it (kubectl auth can-i '
        'create mpijobs.kubeflow.org -n default says whether you may)')
    assert store.listed(PLURAL, None)[0] == []


def test_more_gpu_workers_than_the_nodes_hold_are_refused_and_no_image_is_asked_for(ip, api_server, monkeypatch):
    store = api_server()
    for name in ("gpu-1", "gpu-2"):
        store.create("nodes", "", {"metadata": {"name": name, "labels": {"pool": "gpu"}},
                                   "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert _refused(ip, "-i 3 -g 8 --node-selector pool=gpu") == (
        "the job's 3 workers of 8 GPUs each do not fit the cluster's nodes that match --node-selector, which hold "
        "2 such workers at most; lower --instances or --gpus")
    monkeypatch.delenv("MPI_MAGIC_KUBERNETES_IMAGE")
    assert _refused(ip, "") == ("no image for the pods: name one with --image (or %mpirun_config kubernetes_image=...), "
                                "with Python 3, mpi4py, Open MPI's mpirun and sshd")
    assert store.listed(PLURAL, None)[0] == []


def test_dry_run_prints_the_mpijob_and_creates_nothing(ip, api_server, capsys):
    from test_manifest import _checked

    store = api_server()
    run(ip, "--backend kubernetes -i 2 -g 1 --dry-run --labels team=ml --tolerations nvidia.com/gpu:NoSchedule "
            "--annotations sagemaker.amazonaws.com/enable-job-auto-resume=true", "x = 1")
    out = capsys.readouterr().out
    job = _checked(json.loads(out[out.index("{"):]))
    assert job["metadata"]["labels"]["team"] == "ml"
    assert job["metadata"]["annotations"] == {"sagemaker.amazonaws.com/enable-job-auto-resume": "true"}
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert store.listed(PLURAL, None)[0] == []


@pytest.mark.parametrize("line, said", [
    ("--node-selector pool", "--node-selector 'pool' is not KEY=VALUE,KEY=VALUE; for example --node-selector "
                             "team=ml,project=x"),
    ("--tolerations gpu:Sometimes", "--tolerations 'gpu:Sometimes' is not KEY[=VALUE][:EFFECT],...: effects are "
                                    "NoSchedule, PreferNoSchedule, NoExecute; for example --tolerations "
                                    "nvidia.com/gpu:NoSchedule"),
    ("--volume fsx", "--volume 'fsx' is not CLAIM:/PATH (a PersistentVolumeClaim the notebook's machine mounts at "
                     "/PATH too); for example --volume fsx-claim:/fsx"),
    ("--namespace ML", "--namespace 'ML' is not a Kubernetes name: lower-case letters, digits and '-', at most 63, "
                       "starting and ending with a letter or digit"),
])
def test_an_option_of_the_wrong_form_is_one_sentence(ip, line, said):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError) as raised:
        run(ip, f"--backend kubernetes {line}", "x = 1")
    assert str(raised.value) == said


def test_a_cache_folder_off_the_shared_volume_is_refused(ip, api_server):
    api_server()
    assert _refused(ip, "--volume fsx:/fsx").startswith("the cache folder ")


@needs_hosts()
def test_a_job_waits_in_kueues_queue_then_runs_once_admitted(k8s, kubernetes_cluster, capsys):
    api = config.new_client_from_config(config_file=kubernetes_cluster.kubeconfig)
    objects = client.CustomObjectsApi(api)
    queues = ("kueue.x-k8s.io", "v1beta1", "default", "localqueues")
    objects.create_namespaced_custom_object(*queues, {"metadata": {"name": "team-a"}, "spec": {"stopPolicy": "Hold"}})
    held = []

    def release() -> None:  # once the job has waited in the held queue for a while, the queue lets its jobs in
        def suspended() -> bool:
            jobs = objects.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
            return any(job["spec"]["runPolicy"]["suspend"] for job in jobs)
        held.append(wait_until(suspended, 30) and not wait_until(lambda: not suspended(), 2))
        objects.patch_namespaced_custom_object(*queues, "team-a", {"spec": {"stopPolicy": None}})

    try:
        releaser = threading.Thread(target=release)
        releaser.start()
        run(k8s, "--backend kubernetes -i 2 -g 1 --queue team-a", "import mpi_magic\nwhere = mpi_magic.instance()")
        releaser.join()
        assert held == [True], "the job waited, suspended, while its queue was held"
        assert "Kueue: waiting in Kueue's local queue team-a for admission" in capsys.readouterr().err
        assert k8s.user_ns["where"] == 0
    finally:
        objects.delete_namespaced_custom_object(*queues, "team-a")
        api.close()


@needs_hosts()
def test_a_pod_no_node_takes_shows_the_schedulers_reason_until_the_cell_is_stopped(k8s, capsys):
    with pytest.raises(JobTimeoutError):
        run(k8s, "--backend kubernetes -i 2 -g 1 --node-selector pool=gpu --timeout 4", "x = 1")
    assert ("Kubernetes: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
            in capsys.readouterr().err)


@needs_hosts()
def test_a_killed_kernel_leaves_nothing_of_its_job(kubernetes_cluster, tmp_path):
    """SIGKILL: no atexit, no goodbye; the watchdog beside the kernel deletes the job."""
    import subprocess
    import sys

    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import os
        from IPython.core.interactiveshell import InteractiveShell
        os.environ["MPI_MAGIC_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        ip = InteractiveShell.instance()
        ip.run_line_magic("load_ext", "mpi_magic")
        ip.run_line_magic("mpirun_config", "view=text")
        ip.run_cell_magic("mpirun_remote", "--backend kubernetes -i 2 -g 1", "import time\\ntime.sleep(600)")
        """)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **kubernetes_cluster.environ})
    try:
        assert wait_until(lambda: len(kubernetes_left(kubernetes_cluster)) == 4, 60), "the job and its 3 pods are up"
    finally:
        kernel.kill()
        kernel.wait()
    assert wait_until(lambda: kubernetes_left(kubernetes_cluster) == [], GONE_WITHIN), \
        f"left: {kubernetes_left(kubernetes_cluster)}"


@needs_hosts()
def test_a_worker_pod_deleted_from_outside_ends_the_cell_naming_the_pod_and_its_node(k8s, kubernetes_cluster,
                                                                                     tmp_path):
    api = config.new_client_from_config(config_file=kubernetes_cluster.kubeconfig)
    core = client.CoreV1Api(api)

    def delete_a_worker() -> None:  # as kubectl delete pod would
        worker = next(p for p in core.list_namespaced_pod("default").items if p.metadata.name.endswith("-worker-1"))
        core.delete_namespaced_pod(worker.metadata.name, "default")

    deleter = _once_both_run(k8s, tmp_path, delete_a_worker)
    try:
        with pytest.raises(RankExitError) as raised:
            run(k8s, "--backend kubernetes -i 2 -g 1 --out job", BOTH_RUNNING_CELL)
    finally:
        deleter.join()
        api.close()
    assert deleter.waited, "both ranks ran when the pod was deleted"
    name = k8s.user_ns["job"].name
    assert str(raised.value) == (f"ranks [0, 1] stopped before the cell finished: pod {name}-worker-1 of the job was "
                                 "deleted from outside this notebook (on node node-2)")


@needs_hosts()
def test_a_lost_node_ends_the_cell_naming_its_worker_pod_and_node(k8s, kubernetes_cluster, tmp_path):
    bed = _bed(kubernetes_cluster)
    loser = _once_both_run(k8s, tmp_path, lambda: bed.lose("node-2"))  # its link down, every process of it killed
    try:
        with pytest.raises(RankExitError) as raised:
            run(k8s, "--backend kubernetes -i 2 -g 1 --out job", BOTH_RUNNING_CELL)
    finally:
        loser.join()
        bed.mend("node-2")
    assert loser.waited, "both ranks ran when the node was lost"
    name = k8s.user_ns["job"].name
    assert str(raised.value).startswith(f"ranks [0, 1] stopped before the cell finished: worker pod {name}-worker-1 "
                                        "on node node-2 failed ("), str(raised.value)


def test_a_job_name_that_cannot_name_an_mpijob_or_names_one_that_exists_is_refused(ip, api_server):
    store = api_server()
    assert _refused(ip, "--job-name NightlyRun") == ("--job-name 'NightlyRun' cannot name an MPIJob: lower-case "
                                                      "letters, digits and '-', at most 45, starting with a letter")
    store.create(PLURAL, "default", {"metadata": {"name": "nightly"}, "spec": {}})
    assert _refused(ip, "--job-name nightly") == (
        "an MPIJob named nightly is in namespace default already: delete it (kubectl delete mpijob nightly -n default) "
        "or choose another --job-name")


@needs_hosts()
def test_a_job_stopped_while_kueue_holds_it_ends_at_once_and_leaves_nothing(k8s, kubernetes_cluster):
    api = config.new_client_from_config(config_file=kubernetes_cluster.kubeconfig)
    queues = ("kueue.x-k8s.io", "v1beta1", "default", "localqueues")
    objects = client.CustomObjectsApi(api)
    objects.create_namespaced_custom_object(*queues, {"metadata": {"name": "held"}, "spec": {"stopPolicy": "Hold"}})
    try:
        with pytest.raises(JobTimeoutError, match="still waiting in the scheduler's queue"):
            run(k8s, "--backend kubernetes -i 2 -g 1 --queue held --timeout 3", "x = 1")
    finally:
        objects.delete_namespaced_custom_object(*queues, "held")
        api.close()


@needs_hosts()
def test_a_launchers_log_cut_while_it_runs_is_followed_again_and_nothing_is_lost_or_said_twice(ip, tmp_path,
                                                                                               monkeypatch, capsys):
    cut = emulator.KubernetesEmulator(str(tmp_path / "k8s"), nodes=3, log_follow_limit=1.0).start()  # (as a proxy)
    try:
        for name, value in cut.environ.items():
            monkeypatch.setenv(name, value)
        ip.run_line_magic("mpirun_config", "view=text")
        run(ip, "--backend kubernetes -i 2 -g 1 --gather", textwrap.dedent("""\
            import time, mpi_magic
            for step in range(8):
                print(f"step {step} of rank {mpi_magic.rank()}", flush=True)
                time.sleep(0.5)
            done = mpi_magic.rank()
            """))
        assert ip.user_ns["done"] == [0, 1], "both ranks' ends came through"
        said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
        assert said == [f"step {step} of rank 0" for step in range(8)], "rank 0's prints, each once, in order"
    finally:
        cut.stop()


@needs_hosts()
def test_an_exported_kubernetes_job_runs_from_bash_as_an_mpijob_of_the_same_shape(k8s, kubernetes, cache_dir, tmp_path):
    import pickle
    import subprocess
    import sys

    k8s.user_ns["base"] = 10
    run(k8s, "--backend kubernetes -i 2 -g 1 --gather --out job", textwrap.dedent("""\
        import mpi_magic
        from mpi4py import MPI
        total = base + MPI.COMM_WORLD.allreduce(mpi_magic.rank())
        print("rank", mpi_magic.rank(), "of instance", mpi_magic.instance())
        """))
    folder = tmp_path / "exported"
    k8s.run_line_magic("mpirun_export", f"--to {folder}")
    launch = (folder / "launch.txt").read_text()
    manifest = json.loads(launch[launch.index("{"):])
    assert manifest["kind"] == "MPIJob" and manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    done = subprocess.run(["bash", str(folder / "run.sh")], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHON": sys.executable, "MPI_MAGIC_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] rank 0 of instance 0", "[rank 1] rank 1 of instance 1"]
    with open(folder / "results.pickle", "rb") as f:
        assert pickle.load(f) == {"total": k8s.user_ns["total"]}
    assert "(kubernetes, 2 x 1) completed" in done.stderr
