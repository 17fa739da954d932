"""The package type-checks, and the check sees the seams: a backend, a running job or a view
missing a member of its protocol fails it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
# a first check, with no cache yet (a fresh clone), takes minutes on a loaded 2-core machine: as long as mypy may
pytestmark = pytest.mark.timeout(300)


def _mypy(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def package_check() -> tuple[subprocess.CompletedProcess, str]:
    """mypy's check of the package (files and strictness from pyproject.toml), and its cache.

    The cache is mypy's own, ``.mypy_cache`` in the checkout, as ``python -m mypy`` keeps it: mypy
    re-reads only what changed since, so the stubs of every library are analysed once per
    checkout, not at every run. A check of a changed copy starts from a copy of it."""
    return _mypy(), os.path.join(ROOT, ".mypy_cache")


def test_the_package_type_checks(package_check):
    result, _ = package_check
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_class_missing_a_member_of_its_protocol_fails_the_check(tmp_path, package_check):
    shutil.copytree(package_check[1], tmp_path / "cache")
    shutil.copytree(os.path.join(ROOT, "mpi_magic"), tmp_path / "mpi_magic", ignore=shutil.ignore_patterns("__pycache__"))
    missing = [("backends/local/backend.py", "fetch_results", "LocalJob", "BackendJob"),
               ("backends/sagemaker/backend.py", "plan", "SageMakerBackend", "SessionBackend"),
               ("view/widgets.py", "close", "WidgetView", "View"),
               ("backends/local/backend.py", "start_session", "LocalBackend", "SessionBackend"),
               ("backends/sagemaker/backend.py", "attach_session", "SageMakerJobs", "AttachableBackend")]
    for module, member, _, _ in missing:
        path = tmp_path / "mpi_magic" / module
        source, renamed = re.subn(rf"(\n    def ){member}\(", rf"\1{member}_gone(", path.read_text(), count=1)
        assert renamed == 1, f"{module} has no method {member}"
        path.write_text(source)
    result = _mypy("--config-file", os.path.join(ROOT, "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
                   "mpi_magic", cwd=str(tmp_path))
    assert result.returncode == 1
    for _, member, cls, protocol in missing:
        assert re.search(rf'"{cls}" is missing following "{protocol}" protocol member:\n.*note:\s+{member}\n',
                         result.stdout), result.stdout
