"""This client's own mpi_magic and cloudpickle, shipped with a job whose machines run code of the
notebook's (a SageMaker instance, a Kubernetes pod), so their image needs neither installed and their
versions cannot drift from the notebook's: as an archive, or as a folder on a volume they share."""

from __future__ import annotations

import functools
import hashlib
import inspect
import io
import os
import shutil
import tarfile
import tempfile
from typing import Iterator

import cloudpickle

import mpi_magic


def _sources() -> Iterator[tuple[str, str]]:
    """(path, name in the copy) of every Python source of the packages, in a fixed order."""
    for package in (mpi_magic, cloudpickle):
        root = os.path.dirname(inspect.getfile(package))
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".typed")):
                    path = os.path.join(folder, name)
                    yield path, os.path.relpath(path, os.path.dirname(root))


def archive() -> bytes:
    """A tar.gz of the mpi_magic and cloudpickle packages (Python sources only)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, name in _sources():
            tar.add(path, arcname=name)
    return buffer.getvalue()


def folder_in(parent: str) -> str:
    """The folder under ``parent`` that holds (or would hold) a copy of the packages, named by their contents."""
    return os.path.join(parent, _digest())


@functools.cache
def _digest() -> str:
    """The packages' contents, hashed once a process (not at every cell: they do not change under a kernel)."""
    digest = hashlib.sha256()
    for path, name in _sources():
        with open(path, "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def copied_into(parent: str) -> str:
    """The folder under ``parent`` that holds a copy of the packages (a folder for Python's path),
    named by their contents: made once, whole or not at all, and kept for every later job."""
    files = list(_sources())
    folder = folder_in(parent)
    if os.path.isdir(folder):
        return folder
    os.makedirs(parent, exist_ok=True)
    making = tempfile.mkdtemp(dir=parent, prefix=".making-")
    for path, name in files:
        os.makedirs(os.path.join(making, os.path.dirname(name)), exist_ok=True)
        shutil.copyfile(path, os.path.join(making, name))
    os.chmod(making, 0o755)
    try:
        os.rename(making, folder)
    except OSError:  # another job made it meanwhile
        shutil.rmtree(making, ignore_errors=True)
    return folder
