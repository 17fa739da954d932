"""Ranks as one MPIJob of Kubeflow's MPI Operator: ``--instances`` worker pods of ``--gpus`` slots
each, and a launcher pod whose mpirun runs the ranks on them over the operator's ssh (``bootstrap.py``).

The payload, the results and this notebook's own mpi_magic travel through the cache folder, on a
volume the notebook and the pods share (``--volume``). The launcher's log, followed, carries every
rank's events; one watch of the job's pods says where it waits (Kueue's admission, the scheduler's
reason, an image pull) and how its launcher ended. Stopping is deleting the job with its pods
(foreground): the kubelet sends mpirun SIGTERM, which stops the ranks. A process beside the notebook
deletes the job if the kernel dies.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable

from ...errors import LauncherNotFound
from ...shared import envvars, wire
from ...shared.events import QUEUED, RUNNING, Allocation, Event, LauncherExited, RankStarted, StreamDecoder
from ...shared.layout import RESULTS
from .. import follow, shipped_code
from .. import launcher as launchers
from ..follow import EventQueue, Tally
from . import cluster, manifest
from .bootstrap import STACKS_REQUEST, announced_version
from .cluster import GROUP, PLURAL, VERSION, KubernetesSetupError

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from ..base import BackendJob, SessionBackend
    from .session_ranks import KubernetesSessionRanks

QUEUE_SIZE = 16  # batches of events waiting to be polled: a flooding rank is slowed, not this process's memory
WATCH_SECONDS = 5  # a watch of the job's pods is renewed this often, and the job looked at (is it still there?)
WATCH_RETRIES = 5  # a watch that fails this many times in a row (the API unreachable) ends the cell
ADMISSION_LOOK = 1.0  # seconds between looks at a job Kueue has not admitted yet
LOG_WAIT = 5.0  # seconds the launcher's log gets to be read to its end once the launcher has ended
# a pod's container waiting for one of these will not start by itself ({reason: what it means}); a failed pull
# (ErrImagePull) may be a registry's moment, and is taken for good once the kubelet backs off from it
NEVER_STARTS = {"ImagePullBackOff": "the nodes cannot pull the image {image}",
                "InvalidImageName": "the image name {image} is not valid",
                "CreateContainerConfigError": "the container of image {image} cannot be made"}
PYTHON = "python3"  # the image's Python, on its PATH
JOB_NAME_MOST = 45  # characters of a job's name: its pods' names add "-launcher" or "-worker-N" and stay DNS labels
_JOB_NAME = re.compile(rf"^[a-z][-a-z0-9]{{0,{JOB_NAME_MOST - 2}}}[a-z0-9]$")


class KubernetesBackend:
    """The payload leaves this notebook's private folder for a volume the cluster's pods share, so
    ranks check its digest."""

    name = "kubernetes"
    pins_digest = True
    stop_description = "the MPIJob deleted: its pods get SIGTERM (mpirun stops the ranks), then SIGKILL"

    def __init__(self, config: Config, options: LaunchOptions):
        settings = options.settings
        self.image: str = settings.get("image") or ""
        if not self.image:
            raise KubernetesSetupError("no image for the pods: name one with --image (or %mpirun_config "
                                       "kubernetes_image=...), with Python 3, mpi4py, Open MPI's mpirun and sshd")
        if options.job_name and not _JOB_NAME.match(options.job_name):
            raise KubernetesSetupError(f"--job-name {options.job_name!r} cannot name an MPIJob: lower-case letters, "
                                       f"digits and '-', at most {JOB_NAME_MOST}, starting with a letter")
        self.cache_dir = os.path.realpath(config.get("cache_dir"))
        self.volume = settings.get("volume")
        if self.volume and not (self.cache_dir + "/").startswith(os.path.realpath(self.volume[1]).rstrip("/") + "/"):
            raise KubernetesSetupError(f"the cache folder {self.cache_dir} is not on the volume --volume mounts at "
                                       f"{self.volume[1]}, so the pods would not see the job: %mpirun_config "
                                       f"cache_dir={self.volume[1].rstrip('/')}/{getpass.getuser()}/mpi_magic puts it there")
        self.api, default_namespace = cluster.connect()
        try:
            self.namespace = settings.get("namespace") or default_namespace
            cluster.check(self.api, self.namespace, settings.get("queue"), settings.get("priority_class"),
                          settings.get("service_account"))
            self.placement = manifest.PodPlacement(
                namespace=self.namespace, service_account=settings.get("service_account"),
                node_selector=settings.get("node_selector") or {}, tolerations=settings.get("tolerations") or [],
                queue=settings.get("queue"), priority_class=settings.get("priority_class"),
                labels=settings.get("labels") or {}, annotations=settings.get("annotations") or {},
                volume=self.volume)
            self.gpus = self._gpus_per_worker(options)
        except BaseException:
            self.api.close()
            raise

    def _gpus_per_worker(self, options: LaunchOptions) -> int:
        """GPUs each worker asks for: one per rank where the nodes have GPUs (none where none has, or
        where they cannot be listed); a job whose workers more nodes would have to hold than there are is refused."""
        gpus = cluster.node_gpus(self.api, self.placement.node_selector)  # (one list of the nodes)
        if not gpus or not any(gpus):
            return 0  # no node has a GPU (or none can be listed): the ranks run on the CPUs
        room = sum(count // options.procs_per_instance for count in gpus)
        if room < options.instances:
            raise KubernetesSetupError(
                f"the job's {options.instances} workers of {options.procs_per_instance} GPUs each do not fit the "
                f"cluster's nodes{' that match --node-selector' if self.placement.node_selector else ''}, which hold "
                f"{room} such workers at most; lower --instances or --gpus")
        return options.procs_per_instance

    def check(self, options: LaunchOptions) -> list[str]:
        return []

    def unpriced(self, options: LaunchOptions) -> str | None:
        return "a Kubernetes cluster's nodes are priced by whoever runs them, which the meter does not know"

    def _job(self, folder: str, job_name: str, runs: list[str], options: LaunchOptions, token: str,
             copy_code: bool = True) -> dict:
        """The MPIJob whose launcher runs the bootstrap on ``folder`` with ``runs`` (a cell's digest, or a
        session's address); this notebook's mpi_magic copied to the shared volume first (``copy_code``)."""
        code_folder = os.path.join(self.cache_dir, "code")
        code = shipped_code.copied_into(code_folder) if copy_code else shipped_code.folder_in(code_folder)
        env = {**launchers.job_environment(job_name, token, options.instances, options.procs_per_instance),
               envvars.STACKS_EVENTS: "1", envvars.ENV_NAMES: " ".join(sorted(options.env)), **options.env,
               "PYTHONPATH": os.pathsep.join(filter(None, [code, options.env.get("PYTHONPATH")]))}
        launch = [PYTHON, "-m", "mpi_magic.backends.kubernetes.bootstrap", folder, *runs, "--", *options.mpirun_args]
        return manifest.mpijob(job_name, self.image, launch, env, options.instances, options.procs_per_instance,
                               self.gpus, self.placement)

    def plan(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> str:
        """What --dry-run prints: the MPIJob, as ``kubectl apply -f`` takes it."""
        job = self._job(job_dir, job_name, _digest_args(digest), options, "<event token>", copy_code=False)
        return f"MPIJob for namespace {self.namespace} (kubectl apply -f takes it):\n" + json.dumps(job, indent=2)

    def submit(self, job_dir: str, job_name: str, digest: str | None, options: LaunchOptions) -> KubernetesJob:
        return self.create(job_dir, job_name, _digest_args(digest), options)

    def start_session(self, name: str, options: LaunchOptions, config: Config) -> KubernetesSessionRanks:
        """One MPIJob whose ranks wait for cells from this notebook's channel (``session_ranks.py``)."""
        from .session_ranks import start

        return start(self, name, options, config)

    def create(self, folder: str, job_name: str, runs: list[str], options: LaunchOptions) -> KubernetesJob:
        """Create the MPIJob (see ``_job``), and follow it."""
        token = wire.new_token()
        job = self._job(folder, job_name, runs, options, token)
        k8s = cluster.kubernetes()
        objects = k8s.client.CustomObjectsApi(self.api)
        try:
            objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, job)
        except k8s.client.exceptions.ApiException as exc:
            self.api.close()  # (nothing follows a job that was not made)
            if exc.status == 409:
                raise KubernetesSetupError(f"an MPIJob named {job_name} is in namespace {self.namespace} already: "
                                           f"delete it (kubectl delete mpijob {job_name} -n {self.namespace}) or "
                                           "choose another --job-name") from None
            raise cluster.refusal(exc, "create", f"{PLURAL}.{GROUP}", self.namespace) from None
        return KubernetesJob(self.api, self.namespace, job_name, folder, StreamDecoder(token), self.placement.queue)


class KubernetesJob:
    """An MPIJob, followed through one watch of its pods and its launcher's log."""

    abort_grace = 3.0  # after a rank's failure mpirun ends the job; if it has not, the job is deleted
    linger = 10.0  # after every rank succeeded mpirun ends within this, else the job is deleted
    launcher = None  # (mpirun runs in the launcher pod)
    stacks_dir = None

    def __init__(self, api, namespace: str, name: str, job_dir: str, decoder: StreamDecoder, queue: str | None = None):
        k8s = cluster.kubernetes()
        self._api = api
        self._core, self._objects = k8s.client.CoreV1Api(api), k8s.client.CustomObjectsApi(api)
        self._watch_module, self._api_exception = k8s.watch, k8s.client.exceptions.ApiException
        self.namespace, self.name, self.job_dir, self._decoder, self._queue = namespace, name, job_dir, decoder, queue
        self._events = EventQueue(QUEUE_SIZE)
        self._tally = Tally()
        self._pods: dict[str, Any] = {}  # name: the pod as last seen
        self._pull_failed: dict[str, tuple[str, str]] = {}  # pod: the kubelet's last ErrImagePull (reason, message)
        self._log_failed = ""  # why the launcher's log could not be read to its end
        self._announced = False  # the log's first line (the image's mpirun) was read
        self._said: tuple | None = None  # the last Allocation's (state, reason), not to say twice
        self._log: threading.Thread | None = None
        self._log_done = threading.Event()
        self._stopping = threading.Event()  # deleted from here (a stop)
        self._finished = False
        self.over = threading.Event()  # set once the end is known (then delivered: ``finished``)
        self._deleted = False
        self._watchdog = follow.watchdog([sys.executable, "-m", "mpi_magic.backends.kubernetes.watchdog", namespace,
                                          name])  # (deletes the job if the kernel dies)
        threading.Thread(target=self._follow, name=f"mpi_magic {name} pods", daemon=True).start()

    # -- the pods ---------------------------------------------------------------------------

    def _follow(self) -> None:
        """Watch the job's pods until its launcher has ended and its log is read, then deliver the end."""
        try:
            end = self._watch_until_the_end()
        except Exception as exc:  # noqa: BLE001 - the API went away: the job is stopped, and the user told why
            self._delete()
            end = LauncherExited(None, reason=f"the cluster stopped answering about the job ({type(exc).__name__}: "
                                              f"{exc}); it was deleted")
        if self._log is not None:
            self._log_done.wait(LOG_WAIT)
        self._delete()  # (its launcher, kept for its log; a job's end leaves nothing of it)
        follow.release(self._watchdog)
        self._api.close()
        self.over.set()  # (the end is known: a stop that waits for it need not wait for room in the queue)
        self._events.put([*self._decoder.rejections(), end])
        self._finished = True

    def _watch_until_the_end(self) -> LauncherExited:
        """One watch of the job's pods at a time, renewed every ``WATCH_SECONDS`` (listed again where the
        server has forgotten where it was: 410 Gone), until the launcher ended, the job went, or it was
        stopped; the job looked at between watches, so that one deleted before it had a pod is seen."""
        listed = self._pods_once_admitted()
        if isinstance(listed, LauncherExited):
            return listed
        version, end = self._take(listed.items, listed.metadata.resource_version)
        failures = 0
        while end is None:
            if self._stopping.is_set() and not self._pods:
                return self._tally.ended(None)  # stopped before the operator made any pod (or once all went)
            try:
                version, end = self._watch_once(version)
                failures = 0
            except self._api_exception as exc:
                if exc.status == 410:  # expired: list again, and watch from there
                    listed = self._core.list_namespaced_pod(self.namespace, label_selector=self._selector)
                    version, end = self._take(listed.items, listed.metadata.resource_version)
                    continue
                if exc.status in (401, 403):
                    self._delete()
                    return LauncherExited(None, reason=f"{cluster.refusal(exc, 'watch', 'pods', self.namespace)}; "
                                                       "the job was deleted")
                failures += 1
                if failures >= WATCH_RETRIES:
                    raise
                self._stopping.wait(1.0)
            except OSError:  # (urllib3's errors are): the connection broke
                failures += 1
                if failures >= WATCH_RETRIES:
                    raise
                self._stopping.wait(1.0)
            if end is None and not self._job_exists():
                return self._tally.ended(None) if self._stopping.is_set() else LauncherExited(
                    None, reason="the MPIJob was deleted from outside this notebook")
        return end

    @property
    def _selector(self) -> str:
        return f"{manifest.JOB_LABEL}={self.name}"

    def _take(self, pods: list, version: str) -> tuple[str, LauncherExited | None]:
        """The listed pods looked at; (the version to watch from, the job's end if they show it)."""
        self._pods = {pod.metadata.name: pod for pod in pods}
        for pod in pods:
            end = self._look(pod)
            if end is not None:
                return version, end
        return version, None

    def _watch_once(self, version: str) -> tuple[str, LauncherExited | None]:
        """The pods' changes for up to ``WATCH_SECONDS``; (the version read up to, the job's end if one showed it)."""
        watcher = self._watch_module.Watch()
        for change in watcher.stream(self._core.list_namespaced_pod, self.namespace, label_selector=self._selector,
                                     resource_version=version, timeout_seconds=WATCH_SECONDS,
                                     allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30):
            pod = change["object"]
            version = pod.metadata.resource_version
            if change["type"] == "BOOKMARK":
                continue
            if change["type"] == "DELETED":
                self._pods.pop(pod.metadata.name, None)
                stopped = self._stopping.is_set() and not self._pods  # (a launcher not made yet is not waited for)
                if stopped or _role(pod) == "launcher" or \
                        not self._stopping.is_set() and _phase(pod) not in ("Succeeded", "Failed"):
                    watcher.stop()
                    return version, self._gone(pod)
                continue
            self._pods[pod.metadata.name] = pod
            end = self._look(pod)
            if end is not None:
                watcher.stop()
                return version, end
        return version, None

    def _job_exists(self) -> bool:
        try:
            self._objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        except self._api_exception as exc:
            return exc.status != 404
        except OSError:
            pass
        return True

    def _pods_once_admitted(self):
        """The job's pods as listed once it has any, or at once where no Kueue queue holds it; while Kueue
        has not admitted it, the view says so. The job's end instead where it went meanwhile."""
        while True:
            listed = self._core.list_namespaced_pod(self.namespace, label_selector=self._selector)
            if listed.items or not self._queue:
                return listed
            try:
                job = self._objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
            except self._api_exception as exc:
                if exc.status != 404:
                    raise
                return self._tally.ended(None) if self._stopping.is_set() else LauncherExited(
                    None, reason="the MPIJob was deleted from outside this notebook before Kueue admitted it")
            if job.get("spec", {}).get("runPolicy", {}).get("suspend"):
                self._say(QUEUED, f"waiting in Kueue's local queue {self._queue} for admission", "Kueue")
            if self._stopping.wait(ADMISSION_LOOK if job.get("spec", {}).get("runPolicy", {}).get("suspend") else 0.2):
                self._delete()
                return self._tally.ended(None)

    def _look(self, pod) -> LauncherExited | None:
        """What this pod's news means for the job: where it waits, whether its launcher runs or ended."""
        waiting = _waiting(pod)
        if waiting is not None and waiting[0] == "ErrImagePull":
            self._pull_failed[pod.metadata.name] = waiting
        if waiting is not None and waiting[0] in NEVER_STARTS:
            self._delete()
            reason, message = self._pull_failed.get(pod.metadata.name, waiting)  # (the kubelet's reason, not its back-off)
            what = NEVER_STARTS[waiting[0]].format(image=_image(pod))
            return LauncherExited(None, reason=f"{what} ({reason}: {message}); the job was deleted")
        if pod.status.reason == "Evicted":
            self._delete()
            return LauncherExited(None, reason=f"pod {pod.metadata.name} was evicted from node {pod.spec.node_name} "
                                               f"({pod.status.message})")
        if _role(pod) == "launcher" and _phase(pod) in ("Running", "Succeeded", "Failed") and self._log is None:
            self._log = threading.Thread(target=self._read_log, args=(pod.metadata.name,), daemon=True,
                                         name=f"mpi_magic {self.name} log")
            self._log.start()
        unscheduled = _unscheduled(pod)
        if unscheduled:
            self._say(QUEUED, unscheduled, "Kubernetes")
        elif waiting is not None:
            self._say("starting", f"pod {pod.metadata.name}: {waiting[0]}" + (f" ({waiting[1]})" if waiting[1] else ""),
                      "Kubernetes")
        elif all(_phase(p) == "Running" for p in self._pods.values()) and len(self._pods) > 1:
            self._say(RUNNING, "", "Kubernetes")
        if _role(pod) == "launcher" and _phase(pod) in ("Succeeded", "Failed"):
            if self._log is not None:
                self._log_done.wait(LOG_WAIT)
            ended = self._tally.ended(_ended(pod)[0])
            if self._log_failed and not ended.reports:
                ended.reason = f"the launcher's log could not be read to its end ({self._log_failed})"
            return ended
        if _role(pod) == "worker" and _phase(pod) == "Failed" and not self._stopping.is_set():
            self._delete()
            return LauncherExited(None, reason=f"worker pod {pod.metadata.name} on node {pod.spec.node_name} failed "
                                               f"({_ended(pod)[1]}); the job was deleted")
        return None

    def _gone(self, pod) -> LauncherExited:
        if self._stopping.is_set():
            return self._tally.ended(None)
        self._delete()
        return LauncherExited(None, reason=f"pod {pod.metadata.name} of the job was deleted from outside this notebook"
                                           f"{f' (on node {pod.spec.node_name})' if pod.spec.node_name else ''}")

    def _say(self, state: str, reason: str, queue: str) -> None:
        if (state, reason) != self._said:
            self._said = (state, reason)
            self._events.put([Allocation(state, reason, queue=queue)])

    # -- the launcher's log -------------------------------------------------------------------

    def _read_log(self, pod: str) -> None:
        """The launcher's log, followed to its end: its first line names the image's mpirun (whose tags the
        ranks' lines carry), the rest are the ranks' and mpirun's. A stream that ends while the launcher
        runs (a connection cut by a proxy, a server's limit) is opened again, the lines read already skipped."""
        read = 0  # whole lines delivered
        tries = 0
        while True:
            stream = None
            try:
                stream = self._core.read_namespaced_pod_log(pod, self.namespace, follow=True, _preload_content=False)
                skip, pending = read, b""
                for chunk in stream.stream(amt=1 << 16):
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    skipped = min(skip, len(lines))
                    skip -= skipped
                    fresh = lines[skipped:]
                    read += len(fresh)
                    self._deliver([line.decode("utf-8", errors="replace") for line in fresh])
                if not self._launcher_runs(pod):
                    if pending and not skip:
                        self._deliver([pending.decode("utf-8", errors="replace")])
                    break
            except self._api_exception as exc:
                if exc.status in (401, 403) or not self._launcher_runs(pod) or tries >= WATCH_RETRIES:
                    self._log_failed = str(cluster.refusal(exc, "get", "pods/log", self.namespace)) if exc.status in (
                        401, 403) else f"{exc.status} {exc.reason}"
                    break
            except Exception as exc:  # noqa: BLE001 - the connection broke, or the pod went (deleted)
                if not self._launcher_runs(pod) or tries >= WATCH_RETRIES:
                    self._log_failed = f"{type(exc).__name__}: {exc}"  # (what was read stands)
                    break
            finally:
                if stream is not None:
                    stream.release_conn()
            tries += 1
            if self._stopping.wait(0.1 * tries):
                break
        self._log_done.set()

    def _launcher_runs(self, pod: str) -> bool:
        """Whether the launcher's container still runs, as the API says now (its log may have more to come)."""
        if self._stopping.is_set():
            return False
        try:
            return self._core.read_namespaced_pod(pod, self.namespace).status.phase in ("Pending", "Running")
        except Exception:  # noqa: BLE001 - gone, or the API unreachable: nothing more to read
            return False

    def _deliver(self, lines: list[str]) -> None:
        if lines and not self._announced:
            self._announced = True
            version = announced_version(lines[0])
            if version is not None:
                try:
                    self._decoder.style = launchers.parse_version("mpirun", version).tag_style
                    lines = lines[1:]
                except LauncherNotFound:  # not Open MPI's or MPICH's: the line stays the launcher's to show
                    pass
        if not lines:
            return
        decoded = self._decoder.feed_lines(lines, "stdout")
        for event in decoded:
            if isinstance(event, RankStarted):  # where it runs, as the cluster names it: its pod and node
                event.host = self._where(event.instance, event.host)
        self._tally.take(decoded)
        if decoded:
            self._events.put(decoded)

    def _where(self, instance: int, said: str) -> str:
        """"POD on NODE" for the worker pod of ``instance`` (a rank's own hostname, ``said``, is its pod's
        name on a cluster, its node's on the emulator); ``said`` where the pod is not known."""
        pod = f"{self.name}-worker-{instance}"
        found = self._pods.get(pod)
        node = found.spec.node_name if found is not None and found.spec else None
        return f"{pod} on {node}" if node else said

    # -- the notebook's side ----------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self._finished

    def poll(self, timeout: float) -> list[Event]:
        return self._events.take(timeout)

    def cancel(self) -> None:
        """Delete the job with its pods (foreground): the kubelet stops their processes, and the watch
        of the pods sees them go (``finished``)."""
        self._stopping.set()
        self._delete()

    def _delete(self) -> None:
        if self._deleted:
            return
        self._deleted = True
        try:
            self._objects.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                          propagation_policy="Foreground")
        except Exception:  # noqa: BLE001 - gone already
            pass

    def new_cell(self) -> None:
        """A session's next cell: its ranks report anew."""
        self._tally.new_cell()

    def request_stacks(self) -> bool:
        """The launcher watches a file in the job folder while mpirun runs; writing it asks every rank
        through mpirun (``bootstrap.ask_for_stacks``), the answers coming through the log."""
        with open(os.path.join(self.job_dir, STACKS_REQUEST), "w") as f:
            f.write(repr(time.time()))
        return True

    def fetch_results(self, job_dir: str, ranks: Iterable[int], kind: str = RESULTS) -> None:
        """The ranks wrote them into the job folder, on the volume this machine shares."""


def _digest_args(digest: str | None) -> list[str]:
    return ["--digest", digest] if digest else []


def _role(pod) -> str:
    return (pod.metadata.labels or {}).get(manifest.JOB_ROLE, "")


def _phase(pod) -> str:
    return pod.status.phase if pod.status else ""


def _image(pod) -> str:
    return pod.spec.containers[0].image


def _waiting(pod) -> tuple[str, str] | None:
    """(reason, message) of the pod's container waiting to start (pulling its image, say); None otherwise."""
    for status in pod.status.container_statuses or []:
        if status.state and status.state.waiting:
            return status.state.waiting.reason or "", status.state.waiting.message or ""
    return None


def _unscheduled(pod) -> str:
    """The scheduler's reason a pod waits for a node ("0/4 nodes are available: ..."); "" once it has one."""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or condition.reason or "no node fits the pod yet"
    return ""


def _ended(pod) -> tuple[int | None, str]:
    """(exit status, how it ended in words) of the pod's container; (None, the pod's reason) where it has
    not ended by itself."""
    for status in pod.status.container_statuses or []:
        if status.state and status.state.terminated:
            ended = status.state.terminated
            return ended.exit_code, f"{ended.reason or 'exited'} with status {ended.exit_code}"
    return None, pod.status.reason or pod.status.message or "failed"


if TYPE_CHECKING:  # read by the type checker only
    def _is_backend(backend: KubernetesBackend) -> SessionBackend:
        return backend

    def _is_backend_job(job: KubernetesJob) -> BackendJob:
        return job
