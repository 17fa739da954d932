"""A real IPython shell with the extension loaded, the rehearsal AWS a module's tests share,
and a check that nothing outlives a test."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time

import psutil
import pytest
from helpers import BUCKET, ROLE, held_folders
from IPython.core.interactiveshell import InteractiveShell

from mpi_magic.options import Config

# Servers a module-scoped fixture started for all of that module's tests, stopped at its end,
# and the folders their jobs run in (searched for left-over ranks as a test's own folder is).
_MODULE_SERVERS: set[int] = set()
_MODULE_ROOTS: set[str] = set()


# The files whose tests share a module's fixture (its moto server and SageMaker emulator, its mypy
# check): under ``./dev.sh test`` (``--dist loadscope``) each goes to one worker whole, as one unit;
# every other test is a unit of its own, so the short ones fill the last minute on whichever
# workers are free. A test that uses a module's fixture in a file not named here is refused.
SHARED_BY_FILE = {"test_sagemaker_watch.py", "test_sagemaker.py", "test_notebooks_sagemaker.py",
                  "test_sagemaker_instances.py", "test_sagemaker_session.py", "test_sagemaker_session_faults.py",
                  "test_notebook_sessions.py", "test_sagemaker_session_spot.py", "test_types.py"}
# Units are handed out in this order of their files, longest first (``--no-loadscope-reorder`` in
# pyproject.toml keeps it): the emulated clouds' files, which mostly wait, start beside the tests that
# keep the cores busy (browsers, kernels, many ranks).
LONGEST_FIRST = ["test_sagemaker_watch.py", "test_sagemaker.py", "test_notebooks_sagemaker.py",
                 "test_sagemaker_instances.py", "test_sagemaker_session.py", "test_sagemaker_session_faults.py",
                 "test_browser_layouts.py", "test_browser.py", "test_notebook_sessions.py",
                 "test_sagemaker_session_spot.py", "test_notebooks.py", "test_types.py", "test_hardening.py",
                 "test_magic_local.py", "test_sessions.py"]


def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope, with a whole file as the unit only where its tests share a module's fixture."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrTest(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if os.path.basename(path) in SHARED_BY_FILE else nodeid

    return FileOrTest(config, log)


def pytest_collection_modifyitems(items):
    def place(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    for item in items:
        fixtures = item._fixtureinfo.name2fixturedefs.values()  # pytest's own record of what a test uses
        if item.path.name not in SHARED_BY_FILE and any(d.scope == "module" for ds in fixtures for d in ds):
            raise pytest.UsageError(f"{item.nodeid} uses a module-scoped fixture: add {item.path.name} to "
                                    "SHARED_BY_FILE in tests/conftest.py, so that its tests run on one worker")
    items.sort(key=place)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def shell() -> InteractiveShell:
    ip = InteractiveShell.instance()
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
    magics.defaults = Config()
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
def local_aws_env(tmp_path_factory):
    """A moto server and the SageMaker emulator for one module's tests, which keep apart by
    their own S3 prefixes and job names; the environment that points boto3 at them."""
    from mpi_magic.testing.local_aws import local_aws

    root = str(tmp_path_factory.mktemp("local_aws"))
    before = _children()
    with local_aws(root=root) as env:
        servers = _children() - before
        _MODULE_SERVERS.update(servers)
        _MODULE_ROOTS.add(root)
        try:
            yield env
        finally:
            _MODULE_SERVERS.difference_update(servers)
            _MODULE_ROOTS.discard(root)


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
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            command = " ".join(proc.info["cmdline"] or [])
            if (proc.info["status"] != psutil.STATUS_ZOMBIE and proc.pid not in _MODULE_SERVERS
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


@pytest.fixture(autouse=True)
def nothing_leaks(request, tmp_path):
    """Fail a test that leaves a child process, a rank, or a thread of ours running, or a temporary
    folder held (a module's shared servers are not the test's; what they run for it is)."""
    threads_before, folders_before = set(threading.enumerate()), held_folders()
    yield
    deadline = time.monotonic() + 5
    while True:
        children = [p for p in psutil.Process().children(recursive=True)
                    if p.pid not in _MODULE_SERVERS and p.status() != psutil.STATUS_ZOMBIE]
        ranks = _job_processes([str(tmp_path), *_MODULE_ROOTS])
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        folders = held_folders() - folders_before
        if not (children or ranks or threads or folders) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for proc in children + ranks:
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
            proc.kill()
    assert not children, f"left running: {[p.cmdline() for p in children]}"
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

    assert os.path.exists(CHROMIUM), (f"the browser tests need Chromium at {CHROMIUM} (apt-get install chromium); "
                                      "deselect them with -m 'not browser'")
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
