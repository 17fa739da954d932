"""The Kubernetes emulator's nodes: a test host each (``hosts.TestHosts``), a scheduler that binds
pods to them and a kubelet that runs the pods' commands there as real processes, so that an MPIJob's
launcher reaches its workers' sshd over a real network.

What a node does, as a cluster's nodes do it: the scheduler binds a pod to a node that has the GPUs
it asks for (``nvidia.com/gpu``) and matches its ``nodeSelector``, else leaves it Pending with the
scheduler's own sentence ("0/4 nodes are available: 4 Insufficient nvidia.com/gpu."); the kubelet
pulls the image (only the emulator's ``images`` exist: another is refused as a registry refuses it,
ErrImagePull then ImagePullBackOff), starts the container's command with the pod's environment,
keeps its output as the pod's log, and records its exit (phase, exit code, reason). A deleted pod's
processes are stopped (SIGTERM, then SIGKILL after ``GRACE``). Events say each step, as the
scheduler's and kubelet's do.

What differs, said where it matters: an image is a folder of this machine (its programs come first
on the container's PATH) rather than a filesystem of its own; a pod has its node's address, not one
of its own, so a node runs one MPIJob worker (its sshd) at a time; the operator's hostfile is a file
of the pod's own that ``OMPI_MCA_orte_default_hostfile`` names (the operator mounts it at
``/etc/mpi/hostfile``, and nothing under ``/etc`` is written here); and mpirun's ssh reaches the
workers with the test hosts' key rather than the job's Secret. Pod names resolve on every node to
their node's address (``<pod>.<job>.<namespace>.svc``, as the operator's hostfile names them).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter

import psutil

from ..backends.kubernetes.bootstrap import HOSTFILE_VARIABLE
from ..backends.kubernetes.manifest import GPU_RESOURCE as GPU
from ..backends.kubernetes.manifest import JOB_NAME, JOB_ROLE
from .hosts import TestHosts

GRACE = 2.0  # seconds a deleted pod's processes get between SIGTERM and SIGKILL
PULL_BACKOFF = 1.0  # seconds from ErrImagePull to ImagePullBackOff


def _container_status(container: dict, state: dict, pulled: bool = False) -> dict:
    """A container's status as the kubelet reports it (``imageID`` empty until the image is pulled)."""
    image = container.get("image", "")
    digest = hashlib.sha256(image.encode()).hexdigest() if pulled else ""
    return {"name": container["name"], "image": image, "imageID": f"{image}@sha256:{digest}" if pulled else "",
            "ready": "running" in state, "restartCount": 0, "started": "running" in state, "state": state}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Nodes:
    """``hosts`` nodes (``node-1`` ...) with ``gpus`` GPUs each, running pods whose image is one of
    ``images`` ({image: the folder of its programs}); ``store`` is the API server's."""

    def __init__(self, store, root: str, hosts: int = 4, gpus: int = 0, images: dict[str, str] | None = None):
        self.store = store
        self.bed = TestHosts(os.path.join(root, "bed"), names=[f"node-{i}" for i in range(1, hosts + 1)], sshd=False)
        self.root = root
        self.gpus = gpus
        self.images = dict(images or {})
        self._running: dict[tuple[str, str], subprocess.Popen] = {}  # (namespace, pod): its container's process
        self._bound: dict[tuple[str, str], str] = {}  # (namespace, pod): its node, while it is not over
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Nodes:
        self.bed.up()
        for name in self.bed.names:
            allocatable = {"cpu": str(os.cpu_count() or 1), "memory": f"{psutil.virtual_memory().total // 1024}Ki",
                           "pods": "110", **({GPU: str(self.gpus)} if self.gpus else {})}
            self.store.create("nodes", "", {
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
                "status": {"capacity": allocatable, "allocatable": allocatable,
                           "addresses": [{"type": "InternalIP", "address": self.bed.address(name)},
                                         {"type": "Hostname", "address": name}],
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}})
        self._thread = threading.Thread(target=self._follow, name="kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            running = list(self._running.items())
        for key, process in running:
            self._stop_process(process)
        self.bed.down()

    # -- the scheduler ----------------------------------------------------------------------

    def _follow(self) -> None:
        """Every change to a pod, in order: a new pod is scheduled, a deleted one stopped, and a pod
        that waits for room is tried again once a pod ended or went."""
        for change in self.store.changes("pods", None, "", 0, float("inf")):
            if self._stopping.is_set():
                return
            pod = change["object"]
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            if change["type"] == "DELETED":
                with self._lock:
                    process = self._running.pop(key, None)
                    self._bound.pop(key, None)
                if process is not None:
                    threading.Thread(target=self._stop_process, args=(process,), daemon=True).start()
                self._schedule_waiting()
            elif change["type"] == "ADDED":
                self._schedule(pod)
            elif pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                with self._lock:
                    freed = self._bound.pop(key, None)
                if freed:
                    self._schedule_waiting()

    def _schedule_waiting(self) -> None:
        waiting, _ = self.store.listed("pods", None)
        for pod in waiting:
            if not pod.get("spec", {}).get("nodeName") and pod.get("status", {}).get("phase") == "Pending":
                self._schedule(pod)

    def _schedule(self, pod: dict) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        node, unfit = self._fit(pod)
        if node is None:
            reasons = ", ".join(sorted(f"{count} {reason}" for reason, count in Counter(unfit.values()).items()))
            message = f"0/{len(self.bed.names)} nodes are available: {reasons}."
            said = pod.get("status", {}).get("conditions", [])
            if not any(c.get("message") == message for c in said):
                self._update_pod(namespace, name, lambda p: p["status"].update(conditions=[
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastTransitionTime": _now()}]))
                self._event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            return
        with self._lock:
            self._bound[(namespace, name)] = node

        def bind(p: dict) -> None:
            p["spec"]["nodeName"] = node
            p["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]

        if self._update_pod(namespace, name, bind) is None:
            with self._lock:
                self._bound.pop((namespace, name), None)
            return
        self._event(pod, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}",
                    "default-scheduler")
        threading.Thread(target=self._run, args=(pod, node), name=f"pod {name}", daemon=True).start()

    def _fit(self, pod: dict) -> tuple[str | None, dict[str, str]]:
        """The node for ``pod`` (the one with fewest pods among those it fits), else why each node does not fit."""
        spec = pod.get("spec", {})
        wanted = sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0)) for c in spec.get("containers", []))
        selector = spec.get("nodeSelector") or {}
        worker = (pod["metadata"].get("labels") or {}).get(JOB_ROLE) == "worker"
        with self._lock:
            bound = dict(self._bound)
        pods_on = Counter(bound.values())
        unfit: dict[str, str] = {}
        for node in self.bed.names:
            labels = self.store.get("nodes", "", node)["metadata"]["labels"]
            used = sum(self._gpus_of(key) for key, on in bound.items() if on == node)
            if any(labels.get(key) != value for key, value in selector.items()):
                unfit[node] = "node(s) didn't match Pod's node affinity/selector"
            elif wanted and used + wanted > self.gpus:
                unfit[node] = f"Insufficient {GPU}"
            elif worker and any(self._is_worker(key) for key, on in bound.items() if on == node):
                unfit[node] = "node(s) run a worker already (a pod has its node's address here)"
        fits = [node for node in self.bed.names if node not in unfit]
        return (min(fits, key=lambda node: pods_on[node]) if fits else None), unfit

    def _gpus_of(self, key: tuple[str, str]) -> int:
        try:
            pod = self.store.get("pods", *key)
        except Exception:  # noqa: BLE001 - gone meanwhile
            return 0
        return sum(int(c.get("resources", {}).get("limits", {}).get(GPU, 0))
                   for c in pod.get("spec", {}).get("containers", []))

    def _is_worker(self, key: tuple[str, str]) -> bool:
        try:
            return (self.store.get("pods", *key)["metadata"].get("labels") or {}).get(JOB_ROLE) == "worker"
        except Exception:  # noqa: BLE001 - gone meanwhile
            return False

    # -- the kubelet ------------------------------------------------------------------------

    def _run(self, pod: dict, node: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        image = container.get("image", "")
        self._event(pod, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet", node)
        if image not in self.images:
            return self._refuse_image(pod, node, container)
        self._event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine', "kubelet", node)
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        env = {"PATH": f"{self.images[image]}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "HOSTNAME": name, "KUBERNETES_SERVICE_HOST": "kubernetes.default.svc"}
        env.update({v["name"]: v.get("value", "") for v in container.get("env", [])})
        env.update(self._operator_files(pod))
        self._add_name(pod, node)
        try:
            process = self.bed.popen(node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        except OSError as exc:
            return self._ended(pod, node, 128, "StartError", str(exc))
        with self._lock:
            deleted = (namespace, name) not in self._bound  # (meanwhile)
            if not deleted:
                self._running[(namespace, name)] = process
        if deleted:  # (stopped without the lock: that takes seconds)
            self._stop_process(process)
            return
        self._event(pod, "Normal", "Created", f"Created container {container['name']}", "kubelet", node)
        started = _now()
        self._update_pod(namespace, name, lambda p: p["status"].update(
            phase="Running", hostIP=self.bed.address(node), podIP=self.bed.address(node), startTime=started,
            containerStatuses=[_container_status(container, {"running": {"startedAt": started}}, pulled=True)]))
        self._event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet", node)
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self.store.log(namespace, name, [raw.decode("utf-8", errors="replace").rstrip("\n")])
        code = process.wait()
        with self._lock:
            self._running.pop((namespace, name), None)
        if code < 0:  # killed: a container's status is 128 + the signal
            code = 128 - code
        self._ended(pod, node, code, "Completed" if code == 0 else "Error", "")

    def _refuse_image(self, pod: dict, node: str, container: dict) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        image = container.get("image", "")
        said = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
                f'reference "{image}": {image}: not found')
        for reason, message in (("ErrImagePull", said), ("ImagePullBackOff", f'Back-off pulling image "{image}"')):
            waiting = _container_status(container, {"waiting": {"reason": reason, "message": message}})
            if self._update_pod(namespace, name, lambda p: p["status"].update(containerStatuses=[waiting])) is None:
                return
            self._event(pod, "Warning", "Failed" if reason == "ErrImagePull" else "BackOff",
                        f'Failed to pull image "{image}": {said}' if reason == "ErrImagePull" else message,
                        "kubelet", node)
            time.sleep(PULL_BACKOFF)

    def _ended(self, pod: dict, node: str, code: int, reason: str, message: str) -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        ended = {"exitCode": code, "reason": reason, "finishedAt": _now(), **({"message": message} if message else {})}
        self._update_pod(namespace, name, lambda p: p["status"].update(
            phase="Succeeded" if code == 0 else "Failed",
            containerStatuses=[_container_status(container, {"terminated": ended}, pulled=True)]))

    def _operator_files(self, pod: dict) -> dict[str, str]:
        """The operator's hostfile, for the launcher: a file of the pod's own, named as the operator names it."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get(JOB_ROLE) != "launcher":
            return {}
        namespace = pod["metadata"]["namespace"]
        config = self.store.get("configmaps", namespace, f"{labels[JOB_NAME]}-config")
        folder = os.path.join(self.root, "pods", namespace, pod["metadata"]["name"])
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "hostfile")
        with open(path, "w") as f:
            f.write(config["data"]["hostfile"])
        return {HOSTFILE_VARIABLE: path, "K_MPI_JOB_ROLE": "launcher"}

    def _add_name(self, pod: dict, node: str) -> None:
        """The pod's name resolves on every node to its node's address (the job's headless Service)."""
        labels = pod["metadata"].get("labels") or {}
        job, namespace = labels.get(JOB_NAME), pod["metadata"]["namespace"]
        if not job:
            return
        assert self.bed.root is not None
        with self._lock, open(os.path.join(self.bed.root, "etc-hosts"), "a") as f:  # (in place: it is bind-mounted)
            f.write(f"{self.bed.address(node)}\t{pod['metadata']['name']}.{job}.{namespace}.svc\n")

    def _stop_process(self, process: subprocess.Popen) -> None:
        """The container's process and everything it started (sshd's sessions and what they run)."""
        try:
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for each in tree:
                with contextlib.suppress(psutil.Error):
                    each.send_signal(signum)
            gone, tree = psutil.wait_procs(tree, timeout=GRACE)
            if not tree:
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=GRACE)

    # -- the API server's records -----------------------------------------------------------

    def _update_pod(self, namespace: str, name: str, change) -> dict | None:
        """The pod changed as ``change`` says; None where it is gone."""
        try:
            return self.store.update("pods", namespace, name, lambda p: (p.setdefault("status", {}), change(p)))
        except Exception:  # noqa: BLE001 - deleted meanwhile
            return None

    def _event(self, pod: dict, kind: str, reason: str, message: str, component: str, node: str = "") -> None:
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.store.create("events", namespace, {
            "metadata": {"generateName": f"{name}."}, "type": kind, "reason": reason, "message": message,
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": pod["metadata"]["uid"]},
            "source": {"component": component, **({"host": node} if node else {})},
            "firstTimestamp": _now(), "lastTimestamp": _now(), "count": 1})
