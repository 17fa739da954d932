"""A real IPython shell with the extension loaded, the rehearsal AWS a module's tests share,
and a check that nothing outlives a test."""

from __future__ import annotations

import atexit
import collections
import contextlib
import gc
import json
import os
import shutil
import statistics
import tempfile
import threading
import time

import psutil
import pytest
from helpers import BUCKET, ROLE, held_folders
from IPython.core.interactiveshell import InteractiveShell

from mpi_magic.backends import registry

# Servers a module-scoped fixture started for all of that module's tests, stopped at its end,
# and the folders their jobs run in (searched for left-over ranks as a test's own folder is).
_MODULE_SERVERS: set[int] = set()
_MODULE_ROOTS: set[str] = set()


# How the tests are spread over xdist's workers (``./dev.sh test`` runs ``--dist loadscope``): a file
# whose tests share a module-scoped fixture (a moto server and SageMaker emulator, the mypy check)
# goes to one worker whole, as one unit; every other test is a unit of its own. Units are handed out
# longest first (``--no-loadscope-reorder`` keeps the collection's order), by the seconds each test
# took when ``--store-durations`` last measured them (durations.json); a test not measured yet counts
# as the median. The workers find which files share a fixture as they collect, and tell the
# controller through a file (``pytest_configure_node``), so no list of files is kept by hand.
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")
_UNITS_KEY = "mpi_magic_shared_files"


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each test's seconds (setup, call, teardown) to tests/durations.json, which orders "
                          "the work given to xdist's workers")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controller: where this worker writes the files whose tests share a module's fixture."""
    node.workerinput[_UNITS_KEY] = _units_file(node.config)


def _units_file(config) -> str:
    if not hasattr(config, "_mpi_magic_units"):
        folder = tempfile.mkdtemp(prefix="mpi_magic_units_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        config._mpi_magic_units = os.path.join(folder, "shared_files.json")
    return config._mpi_magic_units


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope, with a whole file as the unit only where its tests share a module's fixture."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTest(LoadScopeScheduling):
        shared: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.shared is None:  # called once every worker has collected (and so written the file)
                with open(_units_file(config), encoding="utf-8") as f:
                    self.shared = set(json.load(f))
            path = nodeid.split("::", 1)[0]
            return path if path in self.shared else nodeid

    return FileOrTest(config, log)


def pytest_collection_modifyitems(config, items):
    shared = sorted({item.nodeid.split("::", 1)[0] for item in items
                     if any(d.scope == "module" for ds in item._fixtureinfo.name2fixturedefs.values() for d in ds)})
    target = getattr(config, "workerinput", {}).get(_UNITS_KEY)
    if target:
        written = f"{target}.{os.getpid()}"
        with open(written, "w", encoding="utf-8") as f:
            json.dump(shared, f)
        os.replace(written, target)  # every worker collects the same tests, so writes the same list
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            measured = json.load(f)
    except FileNotFoundError:
        measured = {}
    unknown = statistics.median(measured.values()) if measured else 1.0

    def unit(item) -> str:
        path = item.nodeid.split("::", 1)[0]
        return path if path in shared else item.nodeid

    seconds: dict[str, float] = {}
    for item in items:
        seconds[unit(item)] = seconds.get(unit(item), 0.0) + measured.get(item.nodeid, unknown)
    items.sort(key=lambda item: -seconds[unit(item)])  # stable: a file's tests keep their order


def pytest_configure(config):
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(), "mpi_magic_durations")


class DurationRecorder:
    """Each test's seconds, summed over setup, call and teardown (the controller gets every
    worker's reports), written to durations.json at the end of the run."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        """Merged into what was measured before, so that a run of some tests keeps the others' figures."""
        try:
            with open(DURATIONS, encoding="utf-8") as f:
                measured = json.load(f)
        except FileNotFoundError:
            measured = {}
        measured.update({nodeid: round(seconds, 2) for nodeid, seconds in self.seconds.items()})
        with open(DURATIONS, "w", encoding="utf-8") as f:
            json.dump(measured, f, indent=0, sort_keys=True)
            f.write("\n")


@pytest.fixture(scope="session")
def shell() -> InteractiveShell:
    """One shell for the run; its history in memory, so that no history thread of IPython's runs
    (one that a fork restarts would read as a thread a test left running)."""
    from traitlets.config import Config as ShellConfig

    settings = ShellConfig()
    settings.HistoryManager.hist_file = ":memory:"
    ip = InteractiveShell.instance(config=settings)
    ip.run_line_magic("load_ext", "mpi_magic")
    return ip


@pytest.fixture
def cache_dir(tmp_path) -> str:
    path = tmp_path / "cache"
    return str(path)


@pytest.fixture
def ip(shell, cache_dir, monkeypatch):
    """The session's shell with an empty namespace and defaults of its own for this test."""
    for name in [n for n in os.environ if n.startswith("MPI_MAGIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", cache_dir)
    shell.reset(new_session=False)
    magics = shell.magics_manager.registry["MpiMagics"]
    magics.defaults = registry.config()
    magics.recent_jobs.clear()
    return shell


@pytest.fixture
def sessions(ip):
    """The shell, with whatever session a test starts stopped at its end."""
    magics = ip.magics_manager.registry["MpiMagics"]
    magics.session = None
    yield ip
    if magics.session is not None:
        magics.session.stop()
        magics.session = None


@pytest.fixture(scope="module")
def local_aws_env(tmp_path_factory, request):
    """A moto server and the SageMaker emulator for one module's tests, which keep apart by
    their own S3 prefixes and job names; the environment that points boto3 at them. At once,
    unless the module sets ``AWS_PACE = "aws"`` (and ``INSTANCE_START``, seconds): ``aws_pace``."""
    from mpi_magic.testing.local_aws import local_aws

    root = str(tmp_path_factory.mktemp("local_aws"))
    before = _children()
    with local_aws(root=root, pace=getattr(request.module, "AWS_PACE", "none"),
                   instance_start=getattr(request.module, "INSTANCE_START", None)) as env:
        servers = _children() - before
        _MODULE_SERVERS.update(servers)
        _MODULE_ROOTS.add(root)
        try:
            yield env
        finally:
            _MODULE_SERVERS.difference_update(servers)
            _MODULE_ROOTS.discard(root)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A Slurm cluster of four nodes n1..n4 (partitions debug; short, with a 10-minute limit; gpu, n3 and
    n4 counting 2 GPUs each), for one module's tests: on test hosts of their own where they can be made
    (root), else all on this machine; its environment (SLURM_CONF, which points Slurm's commands at it,
    and on test hosts the notebook's address there) is set meanwhile."""
    import tempfile

    from mpi_magic.testing.slurm_cluster import SlurmCluster

    root = tempfile.mkdtemp(prefix="mpi_magic_slurm_")  # short: munge's socket path must be
    before = _children()
    cluster = SlurmCluster(root, nodes=4).start()
    servers = _children() - before
    _MODULE_SERVERS.update(servers)
    _MODULE_ROOTS.add(root)
    environ = {name: os.environ.get(name) for name in cluster.environ}
    os.environ.update(cluster.environ)
    try:
        yield cluster
    finally:
        for name, value in environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cluster.stop(remove=True)
        _MODULE_SERVERS.difference_update(servers)
        _MODULE_ROOTS.discard(root)


@pytest.fixture(scope="module")
def kubernetes_cluster(tmp_path_factory):
    """The Kubernetes API emulator with three nodes on test hosts of their own (root), for one module's
    tests: a launcher and two workers fit at once."""
    from mpi_magic.testing.kubernetes_emulator import KubernetesEmulator

    before = _children()
    schema = os.path.join(os.path.dirname(__file__), "backends", "kubernetes", "mpijob_crd_v0.5.0.json")
    # (every MPIJob a test's cell creates must pass the MPI Operator's own schema, strictly)
    cluster = KubernetesEmulator(str(tmp_path_factory.mktemp("k8s")), nodes=3, mpijob_schema=schema).start()
    servers = _children() - before  # (its pods' processes are its own: a test's ranks are found by their job folder)
    _MODULE_SERVERS.update(servers)
    try:
        yield cluster
    finally:
        cluster.stop()
        _MODULE_SERVERS.difference_update(servers)


@pytest.fixture
def kubernetes(kubernetes_cluster, monkeypatch):
    """The module's Kubernetes emulator, with what a notebook needs to reach it set (KUBECONFIG, the image)."""
    for name, value in kubernetes_cluster.environ.items():
        monkeypatch.setenv(name, value)
    return kubernetes_cluster


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on loopback for one module's tests (a SQLite store, artifacts in a folder
    of its own), with ``MLFLOW_TRACKING_URI`` pointing at it meanwhile; its URI. Its start takes
    about 15 s on a loaded 2-core machine (MLflow's import and the store's migrations)."""
    import signal
    import subprocess
    import sys
    import urllib.request

    from mpi_magic.shared.procs import free_port
    from mpi_magic.testing import servers

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{free_port()}"
    before = _children()
    with open(root / "server.log", "wb") as log:
        server = servers.start(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/store.db",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", uri.rsplit(":", 1)[1],
             "--workers", "1"],
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # (no job runner processes)
            stdout=log, stderr=subprocess.STDOUT)
    servers_here = _children() - before
    _MODULE_SERVERS.update(servers_here)
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.2)
        os.environ["MLFLOW_TRACKING_URI"] = uri
        yield uri
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        _MODULE_SERVERS.difference_update(servers_here)


@pytest.fixture
def slurm(ip, slurm_cluster, monkeypatch):
    """The shell, its cells on the module's Slurm cluster shown as text (its sessions' rank 0 reaching the
    notebook where the cluster says); the test fails if it leaves a job in the queue for 10 s."""
    from helpers import SLURM_GONE_WITHIN, slurm_queue, wait_until

    for name, value in slurm_cluster.environ.items():
        monkeypatch.setenv(name, value)
    ip.run_line_magic("mpirun_config", "view=text")
    yield ip
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], SLURM_GONE_WITHIN), \
        f"a test left a job in the queue: {slurm_queue(slurm_cluster)}"


@pytest.fixture
def aws(local_aws_env, monkeypatch):
    """boto3, pointed at the module's moto server and SageMaker emulator on loopback, with the tests' bucket."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in local_aws_env.items():
        monkeypatch.setenv(name, value)
    import boto3

    s3 = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    return boto3


@pytest.fixture
def prefix(tmp_path) -> str:
    """This test's own folder in the shared bucket."""
    return f"jobs/{tmp_path.name}"


@pytest.fixture
def cloud(ip, aws, prefix):
    """The shell, set to run cells on the SageMaker emulator with this test's S3 folder."""
    ip.run_line_magic("mpirun_config", f"backend=sagemaker instance_type=ml.m5.xlarge image_uri=local/emulated "
                                       f"role={ROLE} s3_root=s3://{BUCKET}/{prefix}")
    return aws


@pytest.fixture
def cloud_settings(tmp_path) -> dict[str, str]:
    """The MPI_MAGIC_* settings of this test's sessions (its own S3 prefix), small safeguard limits."""
    return {"MPI_MAGIC_BACKEND": "sagemaker", "MPI_MAGIC_INSTANCE_TYPE": "ml.m5.xlarge",
            "MPI_MAGIC_IMAGE_URI": "local/emulated", "MPI_MAGIC_ROLE": ROLE,
            "MPI_MAGIC_S3_ROOT": f"s3://{BUCKET}/jobs/{tmp_path.name}", "MPI_MAGIC_HEARTBEAT": "1",
            "MPI_MAGIC_HEARTBEAT_LIMIT": "60"}


@pytest.fixture
def cloud_sessions(sessions, aws, cloud_settings, monkeypatch):
    """The shell on the rehearsal cloud, with whatever session a test starts stopped at its end."""
    for name, value in cloud_settings.items():
        monkeypatch.setenv(name, value)
    return sessions


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def _job_processes(markers: list[str]) -> list[psutil.Process]:
    found, servers = [], _MODULE_SERVERS | _cluster_daemons()
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            command = " ".join(proc.info["cmdline"] or [])
            if (proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid not in servers
                    and any(marker in command for marker in markers)):
                found.append(proc)
        except psutil.Error:
            pass
    return found


@pytest.fixture(autouse=True)
def old_objects_frozen():
    """What a worker holds by now (botocore's service models, the SageMaker SDK, the modules earlier
    tests loaded) is left out of garbage collection from here on: otherwise every full collection,
    IPython's reset among them, walks it all again (0.3 s each in a worker that ran SageMaker tests).
    What a test makes is collected as usual; a cycle an earlier test left, once frozen, stays (a
    little memory in a test worker)."""
    gc.collect(1)
    gc.freeze()


def _command(process: psutil.Process) -> list[str] | int:
    try:
        return process.cmdline()
    except psutil.Error:
        return process.pid


def _process_tree() -> dict[int, list[int]]:
    """Each process's children, from one look at the process table."""
    tree: dict[int, list[int]] = collections.defaultdict(list)
    for process in psutil.process_iter(["ppid"]):
        tree[process.info["ppid"]].append(process.pid)
    return tree


def _descendants(tree: dict[int, list[int]], roots) -> set[int]:
    found, waiting = set(), list(roots)
    while waiting:
        for child in tree.get(waiting.pop(), ()):
            if child not in found:
                found.add(child)
                waiting.append(child)
    return found


def _left_children(tree: dict[int, list[int]]) -> list[psutil.Process]:
    """This worker's processes that are neither a module's shared servers (a Slurm node's slurmd that a
    test started again among them) nor what they run (a Slurm node's job steps: their ranks are found
    by their job folder instead)."""
    served = set(_MODULE_SERVERS) | _cluster_daemons()
    served |= _descendants(tree, served)
    left = []
    for pid in sorted(_descendants(tree, [os.getpid()]) - served):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if _alive(process):
                left.append(process)
    return left


def _cluster_daemons() -> set[int]:
    """The daemons a module's Slurm cluster recorded in its folder."""
    from mpi_magic.testing.slurm_cluster import PIDS

    recorded = set()
    for root in _MODULE_ROOTS:
        with contextlib.suppress(FileNotFoundError), open(os.path.join(root, PIDS)) as f:
            recorded.update(int(line) for line in f if line.strip())
    return recorded


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(autouse=True)
def nothing_leaks(request, tmp_path):
    """Fail a test that leaves a child process, a rank, or a thread of ours running, or a temporary
    folder held (a module's shared servers are not the test's; what they run for it is)."""
    threads_before, folders_before = set(threading.enumerate()), held_folders()
    yield
    deadline = time.monotonic() + 5
    while True:
        children = _left_children(_process_tree())
        ranks = _job_processes([str(tmp_path), *_MODULE_ROOTS])
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        folders = held_folders() - folders_before
        if not (children or ranks or threads or folders) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for proc in children + ranks:
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
            proc.kill()
    assert not children, f"left running: {[_command(p) for p in children]}"
    assert not ranks, f"ranks left running: {[p.pid for p in ranks]}"
    assert not threads, f"threads left running: {threads}"
    assert not folders, f"temporary folders left: {folders}"


@pytest.fixture(autouse=True)
def kernel_sigint_handler():
    """Interrupts reach the test as they reach a cell: a Jupyter kernel installs Python's
    default SIGINT handler even where it was started with SIGINT ignored."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> str:
    """Where the browser tests save their screenshots (``MPI_MAGIC_SCREENSHOTS``, else a temporary folder)."""
    folder = os.environ.get("MPI_MAGIC_SCREENSHOTS") or str(tmp_path_factory.mktemp("screenshots"))
    os.makedirs(folder, exist_ok=True)
    return folder


@pytest.fixture
def jupyter(tmp_path, monkeypatch, screenshots):
    """Starts a Jupyter server over a folder of notebooks for this test; stops it at the end."""
    from browser import CHROMIUM, Server

    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"the browser tests need Chromium at {CHROMIUM}: apt-get install chromium "
                    "(./dev.sh test installs it, as root)")
    for name in [n for n in os.environ if n.startswith("MPI_MAGIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", str(tmp_path / "cache"))  # the kernel's jobs live in this test's folder
    root = tmp_path / "notebooks"
    root.mkdir()
    servers: list[Server] = []

    def start(theme: str | None = None) -> Server:
        server = Server(str(root), str(tmp_path / f"jupyter-{len(servers)}"), theme)
        servers.append(server)
        return server

    print(f"screenshots: {screenshots}")
    yield start
    for server in servers:
        server.stop()
