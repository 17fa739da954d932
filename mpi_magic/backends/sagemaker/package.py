"""The code every instance runs: our bootstrap, and this client's own mpi_magic and cloudpickle,
so the image needs neither installed and their versions cannot drift from the notebook's."""

from __future__ import annotations

import inspect
import io
import os
import tarfile

import cloudpickle

import mpi_magic


def code_archive() -> bytes:
    """A tar.gz of the mpi_magic and cloudpickle packages (Python sources only)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for package in (mpi_magic, cloudpickle):
            root = os.path.dirname(inspect.getfile(package))
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".typed")):
                        path = os.path.join(folder, name)
                        tar.add(path, arcname=os.path.relpath(path, os.path.dirname(root)))
    return buffer.getvalue()


def bootstrap_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "bootstrap.py"), "rb") as f:
        return f.read()
