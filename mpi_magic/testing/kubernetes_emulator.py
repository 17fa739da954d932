"""A Kubernetes API server for the subset the Kubernetes backend uses, over real HTTP, for the
unchanged ``kubernetes`` client: discovery, namespaces, Kubeflow's ``MPIJob`` resource
(``kubeflow.org/v2beta1``), pods listed and watched by label selector, their logs (followed while
they run), events, and deletion that takes an object's dependents with it (owner references, as the
garbage collector does for ``propagationPolicy: Foreground``). A bearer token guards it, as a real
cluster's service account does.

    python -m mpi_magic.testing.kubernetes_emulator start --nodes 4   # prints export KUBECONFIG=...
    python -m mpi_magic.testing.kubernetes_emulator stop

From Python, ``KubernetesEmulator(root).start()`` and its ``environ``. As the MPI Operator does, an
MPIJob that is not suspended gets its ssh Secret, its hostfile ConfigMap, a pod per worker and the
launcher's pod, each owned by the job; one suspended (waiting for Kueue) gets them once it is resumed
(a merge patch of ``spec.runPolicy.suspend``); once its launcher runs or ends, the job's conditions
say so, and the workers go once it ended. With ``--nodes N`` (root), N test hosts are the cluster's
nodes: a scheduler and a kubelet (``kubernetes_nodes``) run each pod's command there, the launcher's
mpirun reaching the workers' sshd over the hosts' network; without, the pods stay Pending.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import secrets
import sys
import threading
import time
import socket
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

from ..backends.kubernetes.manifest import JOB_NAME, JOB_ROLE, REPLICA_INDEX  # (the operator's labels)
from ..shared import envvars
from . import servers

MODULE = "mpi_magic.testing.kubernetes_emulator"  # (run as ``python -m``, its __name__ is __main__)
MPIJOBS = ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob")
LOCAL_QUEUES = ("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue")  # Kueue's, where a job waits for admission
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMIT_AFTER = 1.0  # seconds Kueue takes to admit a job whose local queue is not held
CORE = {"pods": "Pod", "events": "Event", "namespaces": "Namespace", "secrets": "Secret", "configmaps": "ConfigMap",
        "nodes": "Node", "serviceaccounts": "ServiceAccount"}
PRIORITY_CLASSES = ("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass")
CLUSTER_SCOPED = ("namespaces", "nodes", "priorityclasses")
# the MPI Operator's labels on an MPIJob's pods (``training.kubeflow.org/...``)
VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-mpi-magic", "platform": "linux/amd64"}
USER = "system:serviceaccount:default:notebook"  # whom the bearer token names, in a 403's words
STOP_LIMIT = 30.0  # seconds ``stop`` waits for the server to end, its nodes brought down
WATCH_LIMIT = 300.0  # seconds a watch lasts unless the client asks for less (timeoutSeconds)
_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$")


class ApiError(Exception):
    """Answered as Kubernetes answers a refusal: a ``Status`` object with its HTTP code and reason."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason = code, reason

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": str(self),
                "reason": self.reason, "code": self.code}


class Store:
    """Every object, by (plural, namespace, name), with one resource version counter and the change
    log that watches read from."""

    def __init__(self, namespaces: tuple[str, ...] = ("default",), mpi_operator: bool = True, kueue: bool = True,
                 forbidden: tuple[tuple[str, str, str], ...] = (), mpijob_schema: dict | None = None):
        self.mpi_operator, self.kueue = mpi_operator, kueue
        # the MPIJob CRD's openAPIV3Schema: a job it does not take is refused, a field it does not name too
        self._validator = _strict_validator(mpijob_schema) if mpijob_schema else None
        self.forbidden = set(forbidden)  # (verb, plural, namespace) the user may not do, answered 403
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._changes: list[tuple[int, str, str, dict]] = []  # (resource version, type, plural, object)
        self._version = 0
        self._changed = threading.Condition()
        self.logs: dict[tuple[str, str], list[str]] = {}  # (namespace, pod): its lines, for the log endpoint
        self._logged = threading.Condition()  # notified as lines come, and as a pod ends
        self.log_follow_limit: float | None = None  # seconds after which a followed log is ended (as a proxy cuts it)
        for name in namespaces:  # (each with its default service account, as the cluster makes it)
            self.create("namespaces", "", {"metadata": {"name": name}})
            self.create("serviceaccounts", name, {"metadata": {"name": "default"}})

    def _next(self) -> str:
        self._version += 1
        return str(self._version)

    def create(self, plural: str, namespace: str, body: dict) -> dict:
        if plural == MPIJOBS[2] and self._validator is not None:
            errors = sorted(self._validator.iter_errors(body), key=lambda e: list(e.absolute_path))
            if errors:
                where = ".".join(str(part) for part in errors[0].absolute_path) or "(the object)"
                raise ApiError(422, "Invalid", f'MPIJob.kubeflow.org "{body.get("metadata", {}).get("name")}" is '
                                               f"invalid: {where}: {errors[0].message}")
        metadata = body.setdefault("metadata", {})
        name = metadata.get("name") or (metadata.get("generateName", "") + secrets.token_hex(3))
        with self._changed:
            if plural not in CLUSTER_SCOPED and ("namespaces", "", namespace) not in self._objects:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
            if (plural, namespace, name) in self._objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
            metadata.update(name=name, uid=str(uuid.uuid4()), resourceVersion=self._next(),
                            creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if namespace:
                metadata["namespace"] = namespace
            self._objects[(plural, namespace, name)] = body
            self._record("ADDED", plural, body)
            if plural == MPIJOBS[2]:
                self._operate(body)
            return json.loads(json.dumps(body))

    def patch(self, plural: str, namespace: str, name: str, patch: dict) -> dict:
        """A JSON merge patch (RFC 7386), as ``kubectl patch --type merge`` sends."""
        with self._changed:
            found = self.update(plural, namespace, name, lambda obj: _merge(obj, patch))
            if plural == MPIJOBS[2]:
                self._operate(self._live(plural, namespace, name))
            if plural == LOCAL_QUEUES[2]:
                self._admit_waiting(namespace, name)
        return found

    def served(self) -> list[tuple[str, str, str, str]]:
        """The custom resources this cluster has: (group, version, plural, kind)."""
        return [PRIORITY_CLASSES] + [MPIJOBS] * self.mpi_operator + [LOCAL_QUEUES] * self.kueue

    def _admission(self, job: dict) -> None:
        """Kueue's part: a suspended job whose local queue exists and is not held is admitted (resumed)
        after ``ADMIT_AFTER``."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        held = self._objects.get((LOCAL_QUEUES[2], namespace, queue or ""), {}).get("spec", {}).get("stopPolicy")
        if queue and (LOCAL_QUEUES[2], namespace, queue) in self._objects and held in (None, "None"):
            threading.Timer(ADMIT_AFTER, self._admit, args=(namespace, name)).start()

    def _admit(self, namespace: str, name: str) -> None:
        try:
            self.patch(MPIJOBS[2], namespace, name, {"spec": {"runPolicy": {"suspend": False}}})
        except ApiError:  # deleted meanwhile
            pass

    def _admit_waiting(self, namespace: str, queue: str) -> None:
        for job in self.listed(MPIJOBS[2], namespace, f"{QUEUE_LABEL}={queue}")[0]:
            if job.get("spec", {}).get("runPolicy", {}).get("suspend"):
                self._admission(job)

    def _operate(self, job: dict) -> None:
        """What the MPI Operator does for an MPIJob: nothing while it is suspended (Kueue has not admitted
        it); then, once, its ssh Secret, its hostfile (``slotsPerWorker`` slots on each worker) and its
        pods, each owned by the job, labelled as the operator labels them and as the job's templates say
        (the launcher's once every worker runs, where ``launcherCreationPolicy`` says WaitForWorkersReady)."""
        metadata, spec = job["metadata"], job.get("spec", {})
        namespace, name = metadata["namespace"], metadata["name"]
        if spec.get("runPolicy", {}).get("suspend"):
            return self._admission(job) if self.kueue else None
        if ("secrets", namespace, f"{name}-ssh") in self._objects:
            return
        _condition(job, "Created", "MPIJobCreated", f"MPIJob {namespace}/{name} is created.")
        owner = _owned_by(job)
        replicas = spec.get("mpiReplicaSpecs", {})
        workers = int(replicas.get("Worker", {}).get("replicas", 0))
        slots = int(spec.get("slotsPerWorker", 1))
        self.create("secrets", namespace, {"metadata": {"name": f"{name}-ssh", "ownerReferences": owner},
                                           "type": "kubernetes.io/ssh-auth"})
        hostfile = "".join(f"{name}-worker-{i}.{name}.{namespace}.svc slots={slots}\n" for i in range(workers))
        self.create("configmaps", namespace, {"metadata": {"name": f"{name}-config", "ownerReferences": owner},
                                              "data": {"hostfile": hostfile}})
        for index in range(workers):
            self._make_pod(job, "worker", index)
        if spec.get("launcherCreationPolicy") != "WaitForWorkersReady" or not workers:
            self._make_pod(job, "launcher")

    def _make_pod(self, job: dict, role: str, index: int = 0) -> None:
        """One of the job's pods, from its template, owned by it and labelled as the operator labels them."""
        metadata, spec = job["metadata"], job.get("spec", {})
        namespace, name = metadata["namespace"], metadata["name"]
        owner = _owned_by(job)
        template = spec.get("mpiReplicaSpecs", {}).get(role.capitalize(), {}).get("template", {})
        labels = {**template.get("metadata", {}).get("labels", {}), JOB_NAME: name, JOB_ROLE: role,
                  **({REPLICA_INDEX: str(index)} if role == "worker" else {})}
        pod_name = f"{name}-worker-{index}" if role == "worker" else f"{name}-launcher"
        self.create("pods", namespace, {"metadata": {"name": pod_name, "labels": labels, "ownerReferences": owner},
                                        "spec": json.loads(json.dumps(template.get("spec", {}))),
                                        "status": {"phase": "Pending"}})

    def _launch_once_workers_run(self, namespace: str, job_name: str) -> None:
        try:
            job = self.get(MPIJOBS[2], namespace, job_name)
        except ApiError:
            return
        workers, _ = self.listed("pods", namespace, f"{JOB_NAME}={job_name},{JOB_ROLE}=worker")
        wanted = int(job.get("spec", {}).get("mpiReplicaSpecs", {}).get("Worker", {}).get("replicas", 0))
        if len(workers) == wanted and all(w.get("status", {}).get("phase") == "Running" for w in workers) and \
                ("pods", namespace, f"{job_name}-launcher") not in self._objects:
            self._make_pod(job, "launcher")

    def get(self, plural: str, namespace: str, name: str) -> dict:
        """A copy of the object (taken while no change is made to it)."""
        with self._changed:
            return json.loads(json.dumps(self._live(plural, namespace, name)))

    def _live(self, plural: str, namespace: str, name: str) -> dict:
        """The object itself, to change (under the lock)."""
        found = self._objects.get((plural, namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
        return found

    def update(self, plural: str, namespace: str, name: str, change) -> dict:
        """``change(object)`` applied in place, as a new resource version."""
        with self._changed:
            found = self._live(plural, namespace, name)
            phase = found.get("status", {}).get("phase")
            change(found)
            found["metadata"]["resourceVersion"] = self._next()
            self._record("MODIFIED", plural, found)
            if plural == "pods" and found.get("status", {}).get("phase") != phase:
                self._launcher_moved(found)
            return json.loads(json.dumps(found))

    def _launcher_moved(self, pod: dict) -> None:
        """What the MPI Operator does when a pod of its job moves: the launcher is made once every worker
        runs (``launcherCreationPolicy: WaitForWorkersReady``); when the launcher runs or ends, the job's
        conditions say so, and once it ended the workers still running go (``cleanPodPolicy`` Running or All)."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get(JOB_ROLE) == "worker" and pod["status"].get("phase") == "Running":
            self._launch_once_workers_run(pod["metadata"]["namespace"], labels[JOB_NAME])
        if labels.get(JOB_ROLE) != "launcher":
            return
        namespace, job = pod["metadata"]["namespace"], labels[JOB_NAME]
        phase = pod["status"]["phase"]
        kind = {"Running": "Running", "Succeeded": "Succeeded", "Failed": "Failed"}.get(phase)
        try:
            found = self.get(MPIJOBS[2], namespace, job)
        except ApiError:
            return
        if kind is None:
            return
        said = {"Running": "is running", "Succeeded": "successfully completed", "Failed": "has failed"}[kind]
        self.update(MPIJOBS[2], namespace, job, lambda j: _condition(j, kind, f"MPIJob{kind}",
                                                                     f"MPIJob {namespace}/{job} {said}."))
        if kind != "Running" and found.get("spec", {}).get("runPolicy", {}).get("cleanPodPolicy") in ("Running", "All"):
            workers, _ = self.listed("pods", namespace, f"{JOB_NAME}={job},{JOB_ROLE}=worker")
            for worker in workers:
                if worker.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                    self.delete("pods", namespace, worker["metadata"]["name"])

    def listed(self, plural: str, namespace: str | None, selector: str = "") -> tuple[list[dict], str]:
        matches = _selector(selector)
        with self._changed:
            items = [obj for (kind, ns, _), obj in self._objects.items()
                     if kind == plural and (namespace is None or ns == namespace)
                     and matches(obj["metadata"].get("labels") or {})]
            return json.loads(json.dumps(items)), str(self._version)  # (copies, taken while nothing changes)

    def delete(self, plural: str, namespace: str, name: str) -> dict:
        """The object and, first, every object it owns (the garbage collector's foreground deletion)."""
        with self._changed:
            found = self._live(plural, namespace, name)
            uid = found["metadata"]["uid"]
            owned = [(kind, ns, other) for (kind, ns, other), obj in self._objects.items()
                     if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))]
            for key in owned:
                self.delete(*key)
            del self._objects[(plural, namespace, name)]
            found["metadata"]["resourceVersion"] = self._next()
            self._record("DELETED", plural, found)
        return found

    def log(self, namespace: str, pod: str, lines: list[str]) -> None:
        """Lines a pod's container wrote (the kubelet's part), for its log's followers."""
        with self._logged:
            self.logs.setdefault((namespace, pod), []).extend(lines)
            self._logged.notify_all()

    def wait_for_log(self, namespace: str, pod: str, read: int, timeout: float) -> None:
        """Until the pod has more than ``read`` lines, or changed (at most ``timeout`` seconds)."""
        with self._logged:
            if len(self.logs.get((namespace, pod), [])) == read:
                self._logged.wait(timeout)

    def _record(self, kind: str, plural: str, obj: dict) -> None:
        self._changes.append((self._version, kind, plural, json.loads(json.dumps(obj))))
        self._changed.notify_all()
        if plural == "pods":
            with self._logged:
                self._logged.notify_all()

    def changes(self, plural: str, namespace: str | None, selector: str, since: int, until: float) -> Iterator[dict]:
        """The watch: each change to a matching object after resource version ``since``, as it comes,
        until the monotonic time ``until``."""
        matches = _selector(selector)
        with self._changed:  # (the log is in resource version order: a watch reads on from where it was)
            read = bisect.bisect_right(self._changes, since, key=lambda change: change[0])
        while True:
            with self._changed:
                fresh = self._changes[read:]
                if not fresh:
                    left = until - time.monotonic()
                    if left <= 0:
                        return
                    self._changed.wait(min(left, 1.0))
                    continue
            read += len(fresh)
            for _, kind, which, obj in fresh:
                if which == plural and (namespace is None or obj["metadata"].get("namespace") == namespace) \
                        and matches(obj["metadata"].get("labels") or {}):
                    yield {"type": kind, "object": obj}


def strict(schema):
    """A CRD's schema as an API server that validates fields strictly takes it (``fieldValidation=Strict``):
    a field the schema does not name is refused, not pruned (a misspelt ``serviceAccountName`` would
    otherwise vanish without a word)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    taken = {key: strict(value) for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and \
            not schema.get("x-kubernetes-preserve-unknown-fields"):
        taken["additionalProperties"] = False
    return taken


def _strict_validator(schema: dict):
    import jsonschema  # type: ignore[import-untyped]  # (the test extra's)

    return jsonschema.Draft7Validator(strict(schema))


def _owned_by(job: dict) -> list[dict]:
    """The owner reference that makes an object the job's (deleted with it)."""
    return [{"apiVersion": "/".join(MPIJOBS[:2]), "kind": MPIJOBS[3], "name": job["metadata"]["name"],
             "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]


def _condition(job: dict, kind: str, reason: str, message: str) -> None:
    """The MPIJob's condition ``kind`` made true (the operator's ``status.conditions``)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [c for c in job.setdefault("status", {}).get("conditions", []) if c["type"] != kind]
    if kind in ("Succeeded", "Failed"):
        conditions = [{**c, "status": "False"} if c["type"] == "Running" else c for c in conditions]
    job["status"]["conditions"] = conditions + [{"type": kind, "status": "True", "reason": reason, "message": message,
                                                 "lastTransitionTime": now, "lastUpdateTime": now}]


def _merge(target: dict, patch: dict) -> None:
    """``patch`` merged into ``target`` as RFC 7386 says: objects merged, None removes, the rest replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _selector(selector: str):
    """A label selector's test (equality-based: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, comma-joined)."""
    terms: list[tuple[str, str, str]] = []  # (key, how, value)
    for term in filter(None, (part.strip() for part in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif term.startswith("!"):
            terms.append((term[1:].strip(), "absent", ""))
        else:
            terms.append((term, "present", ""))

    def matches(labels: dict) -> bool:
        for key, how, value in terms:
            if (how == "=" and labels.get(key) != value) or (how == "!=" and labels.get(key) == value) or \
                    (how == "absent" and key in labels) or (how == "present" and key not in labels):
                return False
        return True

    return matches


def _discovery(store: Store, path: str) -> dict | None:
    """What ``/version``, ``/api``, ``/apis`` and each group version say (None: not one of those)."""
    verbs = ["create", "delete", "get", "list", "patch", "watch"]
    if path == "/version":
        return VERSION
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": plural, "singularName": kind.lower(), "namespaced": plural not in CLUSTER_SCOPED, "kind": kind,
             "verbs": verbs} for plural, kind in CORE.items()] + [
            {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]}]}
    served = store.served()
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": group, "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
             "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version}}
            for group, version, _, _ in served]}
    for group, version, plural, kind in served:
        if path == f"/apis/{group}/{version}":
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}", "resources": [
                {"name": plural, "singularName": kind.lower(), "namespaced": plural not in CLUSTER_SCOPED, "kind": kind,
                 "verbs": verbs}]}
    return None


class Server(ThreadingHTTPServer):
    """Its connections kept (clients hold them open between requests), so that closing it ends every
    thread that serves one."""

    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self.connections: set = set()
        super().__init__(*args, **kwargs)

    def server_close(self) -> None:
        super().server_close()
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def make_server(store: Store, token: str, host: str = "127.0.0.1", port: int = 0) -> Server:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.server.connections.add(self.connection)  # type: ignore[attr-defined]

        def finish(self) -> None:
            self.server.connections.discard(self.connection)  # type: ignore[attr-defined]
            super().finish()

        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _answer(self, method: str) -> None:
            try:
                if self.headers.get("Authorization") != f"Bearer {token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                url = urlsplit(self.path)
                path = url.path.rstrip("/") or "/"  # (the client asks for /apis/)
                query = {key: values[-1] for key, values in parse_qs(url.query).items()}
                found = _discovery(store, path) if method == "GET" else None
                if found is not None:
                    return self._send(200, found)
                self._resource(method, path, query)
            except ApiError as exc:
                self._send(exc.code, exc.status())

        def _resource(self, method: str, path: str, query: dict) -> None:
            match = _PATH.match(path)
            custom = {served[:3]: served[3] for served in store.served()}
            if match is None or not (match["plural"] in CORE if not match["group"] else
                                     (match["group"], match["version"], match["plural"]) in custom):
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            plural = match["plural"]
            namespace, name, sub = match["namespace"] or "", match["name"], match["sub"]
            verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method) or (
                "get" if name else "watch" if query.get("watch") in ("true", "1") else "list")
            if (verb, plural, namespace) in store.forbidden:
                group = f" in API group \"{match['group']}\"" if match["group"] else " in API group \"\""
                raise ApiError(403, "Forbidden", f"{plural}{'.' + match['group'] if match['group'] else ''}"
                               f"{f' {name!r}' if name else ''} is forbidden: User \"{USER}\" cannot {verb} resource "
                               f"\"{plural}\"{group} in the namespace \"{namespace}\"")
            if method == "POST" and name is None:
                length = int(self.headers.get("Content-Length") or 0)
                return self._send(201, store.create(plural, namespace, json.loads(self.rfile.read(length) or b"{}")))
            if method == "GET" and name and sub == "log":
                return self._log(namespace, name, query.get("follow") in ("true", "1"))
            if method == "GET" and name:
                return self._send(200, store.get(plural, namespace, name))
            if method == "DELETE" and name:
                return self._send(200, store.delete(plural, namespace, name))
            if method == "PATCH" and name:
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    raise ApiError(415, "UnsupportedMediaType", "only merge patches are taken here")
                length = int(self.headers.get("Content-Length") or 0)
                return self._send(200, store.patch(plural, namespace, name, json.loads(self.rfile.read(length))))
            if method == "GET":
                scope = namespace if match["namespace"] else None
                if query.get("watch") in ("true", "1"):
                    return self._watch(plural, scope, query)
                items, version = store.listed(plural, scope, query.get("labelSelector", ""))
                kind = CORE.get(plural) or custom[(match["group"], match["version"], plural)]
                return self._send(200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata":
                                        {"resourceVersion": version}, "items": items})
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

        def _stream(self, chunks: Iterator[bytes], content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _watch(self, plural: str, namespace: str | None, query: dict) -> None:
            limit = min(float(query.get("timeoutSeconds") or WATCH_LIMIT), WATCH_LIMIT)
            since = int(query.get("resourceVersion") or 0)
            changes = store.changes(plural, namespace, query.get("labelSelector", ""), since, time.monotonic() + limit)
            self._stream((json.dumps(change).encode() + b"\n" for change in changes), "application/json")

        def _log(self, namespace: str, name: str, follow: bool) -> None:
            store.get("pods", namespace, name)

            def lines() -> Iterator[bytes]:
                sent = 0
                cut_at = time.monotonic() + store.log_follow_limit if store.log_follow_limit else None
                while True:
                    try:  # (looked at before the lines: a pod that has ended wrote its last line before)
                        phase = store.get("pods", namespace, name).get("status", {}).get("phase")
                    except ApiError:
                        phase = "gone"
                    fresh = store.logs.get((namespace, name), [])[sent:]
                    sent += len(fresh)  # (not the length after sending: lines come meanwhile)
                    for line in fresh:
                        yield line.encode() + b"\n"
                    if not follow or phase in ("Succeeded", "Failed", "gone"):
                        return
                    if cut_at is not None and time.monotonic() > cut_at:
                        return  # (the pod runs on: a follower has to ask again)
                    store.wait_for_log(namespace, name, sent, 1.0)

            self._stream(lines(), "text/plain")

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

    return Server((host, port), Handler)


def kubeconfig(server: str, token: str, namespace: str = "default") -> dict:
    """A kubeconfig for ``server``, its user holding ``token``, as a cluster's admin hands out."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "emulated",
            "clusters": [{"name": "emulated", "cluster": {"server": server}}],
            "users": [{"name": "emulated", "user": {"token": token}}],
            "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "emulated",
                                                          "namespace": namespace}}]}


IMAGE = "mpi-magic-test:local"
NOTEBOOK_HOST = "notebook_host"  # a file in its folder, with nodes: this machine's address on their network  # the image the emulator has: this Python's environment (its folder of programs)


class KubernetesEmulator:
    """The API server in a process of its own (``start``/``stop``), its kubeconfig in ``root``; with
    ``nodes``, that many nodes (test hosts, root needed) of ``gpus`` GPUs each run its pods."""

    def __init__(self, root: str, nodes: int = 0, gpus: int = 0, mpijob_schema: str | None = None,
                 log_follow_limit: float | None = None):
        self.root = root
        self.kubeconfig = os.path.join(root, "kubeconfig")
        self.nodes, self.gpus, self.mpijob_schema = nodes, gpus, mpijob_schema
        self.log_follow_limit = log_follow_limit
        self._server = None

    @property
    def environ(self) -> dict[str, str]:
        """What a notebook needs to reach it, and the image its nodes have."""
        return environ(self.root)

    def start(self) -> KubernetesEmulator:
        self._server = _started(self.root, ends_with_parent=True, nodes=self.nodes, gpus=self.gpus,
                                schema=self.mpijob_schema, log_follow_limit=self.log_follow_limit)
        if self._server is None:
            raise RuntimeError(f"the Kubernetes emulator did not start (see {self.root}/server.log)")
        return self

    def stop(self) -> None:
        if self._server is not None:
            servers.stop(self._server)
            if self._server.stdout is not None:
                self._server.stdout.close()
            self._server = None


def environ(root: str) -> dict[str, str]:
    """What a notebook needs to reach the emulator whose folder is ``root``: its kubeconfig, the image its
    nodes have and, where it has nodes, this machine's address on their network (a session's rank 0
    connects to the notebook there)."""
    found = {"KUBECONFIG": os.path.join(root, "kubeconfig"), envvars.PREFIX + "KUBERNETES_IMAGE": IMAGE}  # (kubernetes_image)
    try:
        with open(os.path.join(root, NOTEBOOK_HOST)) as f:
            found[envvars.PREFIX + "KUBERNETES_NOTEBOOK_HOST"] = f.read().strip()  # (kubernetes_notebook_host)
    except FileNotFoundError:
        pass
    return found


def _started(root: str, ends_with_parent: bool, nodes: int = 0, gpus: int = 0, schema: str | None = None,
             log_follow_limit: float | None = None):
    """The server's process, once it said it serves (None where it did not); what it says after that
    goes to ``server.log`` in ``root``, so that whoever started it need not read on."""
    import subprocess

    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "server.log"), "ab") as log:
        server = servers.start([sys.executable, "-m", MODULE, "serve", "--root", root, "--nodes", str(nodes),
                                "--gpus", str(gpus), *(["--mpijob-schema", schema] if schema else []),
                                *(["--log-follow-limit", repr(log_follow_limit)] if log_follow_limit else [])],
                               ends_with_parent=ends_with_parent, stdout=subprocess.PIPE, stderr=log, text=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() == "ready":
        return server
    servers.stop(server)
    server.stdout.close()
    return None


def _serve(root: str, nodes: int, gpus: int, schema_file: str | None, log_follow_limit: float | None = None) -> int:
    import signal

    token = secrets.token_hex(16)
    schema = None
    if schema_file:
        with open(schema_file, encoding="utf-8") as f:
            schema = json.load(f)["openAPIV3Schema"]
    store = Store(mpijob_schema=schema)
    store.log_follow_limit = log_follow_limit
    server = make_server(store, token)
    if nodes:
        from .kubernetes_nodes import Nodes

        cluster = Nodes(store, root, hosts=nodes, gpus=gpus, images={IMAGE: os.path.dirname(sys.executable)}).start()
        with open(os.path.join(root, NOTEBOOK_HOST), "w") as f:
            f.write(cluster.bed.login_address)

        def stop(*_) -> None:
            cluster.stop()
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    config = os.path.join(root, "kubeconfig")
    with open(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(kubeconfig(f"http://{host!s}:{port}", token), f)  # (JSON is YAML)
    with open(os.path.join(root, "server.pid"), "w") as f:
        f.write(str(os.getpid()))
    print("ready", flush=True)
    server.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "stop", "serve"))
    parser.add_argument("--nodes", type=int, default=0,
                        help="nodes (test hosts, as root) that run the pods; with none they stay Pending")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs (nvidia.com/gpu) each node has")
    parser.add_argument("--log-follow-limit", type=float, metavar="SECONDS",
                        help="end every followed log after this long, as a proxy's timeout does")
    parser.add_argument("--mpijob-schema", metavar="JSON",
                        help="a file whose openAPIV3Schema (the MPIJob CRD's) every MPIJob created must pass, "
                             "fields it does not name refused (jsonschema needed)")
    parser.add_argument("--root", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "mpi_magic_kubernetes"),
                        help="its folder: the kubeconfig and the server's pid (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.action == "serve":
        return _serve(args.root, args.nodes, args.gpus, args.mpijob_schema, args.log_follow_limit)
    if args.action == "stop":
        import signal

        import psutil

        try:
            with open(os.path.join(args.root, "server.pid")) as f:
                server = psutil.Process(int(f.read()))
            server.send_signal(signal.SIGTERM)
        except (OSError, ValueError, psutil.Error):
            print(f"kubernetes_emulator: none runs from {args.root}", file=sys.stderr)
            return 1
        psutil.wait_procs([server], timeout=STOP_LIMIT)  # (its nodes go down first)
        return 0
    if _started(args.root, ends_with_parent=False, nodes=args.nodes, gpus=args.gpus, schema=args.mpijob_schema,
                log_follow_limit=args.log_follow_limit) is None:
        print(f"kubernetes_emulator: it did not start (see {args.root}/server.log)", file=sys.stderr)
        return 1
    for name, value in environ(args.root).items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
