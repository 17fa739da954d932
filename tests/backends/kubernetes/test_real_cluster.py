"""--backend kubernetes on a real cluster, where one is given, and skipped (saying what it needs) otherwise:
``MPI_MAGIC_TEST_KUBECONFIG``, a kubeconfig for a cluster with Kubeflow's MPI Operator; and, as a user
sets them, ``MPI_MAGIC_KUBERNETES_IMAGE`` (Python 3, mpi4py, Open MPI, sshd),
``MPI_MAGIC_KUBERNETES_VOLUME`` (``CLAIM:PATH``, mounted here at PATH too) and ``MPI_MAGIC_CACHE_DIR``
(on that volume). ``MPI_MAGIC_KUBERNETES_NAMESPACE`` and the backend's other settings are taken as given."""

from __future__ import annotations

import os

import pytest
from helpers import run, wait_until

from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION

NEEDED = ("MPI_MAGIC_TEST_KUBECONFIG", "MPI_MAGIC_KUBERNETES_IMAGE", "MPI_MAGIC_KUBERNETES_VOLUME", "MPI_MAGIC_CACHE_DIR")
GIVEN = {name: value for name, value in os.environ.items() if name.startswith("MPI_MAGIC_")}  # (before ``ip`` clears them)
MISSING = [name for name in NEEDED if not GIVEN.get(name)]

pytestmark = pytest.mark.skipif(bool(MISSING), reason=(
    f"no real Kubernetes cluster given: set {', '.join(MISSING)} (a kubeconfig for a cluster with the MPI Operator, "
    "the pods' image, a shared volume CLAIM:PATH mounted here at PATH, and a cache folder on it)"))


def test_a_cell_runs_across_two_worker_pods_of_a_real_cluster_and_leaves_no_job(ip, monkeypatch):
    from kubernetes import client, config

    for name, value in GIVEN.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KUBECONFIG", GIVEN["MPI_MAGIC_TEST_KUBECONFIG"])
    run(ip, "--backend kubernetes -i 2 -g 1 --gather --out job --timeout 900",
        "import socket, mpi_magic\nwhere = (mpi_magic.instance(), socket.gethostname())")
    where = ip.user_ns["where"]
    assert [instance for instance, _ in where] == [0, 1] and where[0][1] != where[1][1], "a worker pod each"
    api = config.new_client_from_config(config_file=GIVEN["MPI_MAGIC_TEST_KUBECONFIG"])
    _, context = config.list_kube_config_contexts(config_file=GIVEN["MPI_MAGIC_TEST_KUBECONFIG"])
    namespace = GIVEN.get("MPI_MAGIC_KUBERNETES_NAMESPACE") or context["context"].get("namespace") or "default"
    name = ip.user_ns["job"].name

    def left() -> list[str]:
        jobs = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        return [job["metadata"]["name"] for job in jobs if job["metadata"]["name"] == name]

    assert wait_until(lambda: left() == [], 60), "the job was deleted"
