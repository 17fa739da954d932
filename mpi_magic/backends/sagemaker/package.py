"""The code every instance runs: our bootstrap, and this client's own mpi_magic and cloudpickle,
so the image needs neither installed and their versions cannot drift from the notebook's."""

from __future__ import annotations

import inspect
import io
import os
import tarfile

import cloudpickle

import mpi_magic
from mpi_magic.shared import envvars


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


ENVVARS_IMPORT = "from mpi_magic.shared import envvars  # an instance's copy has the module inlined here\n"


def bootstrap_source() -> bytes:
    """The bootstrap as an instance runs it: a script that needs nothing of mpi_magic installed,
    so the names from ``shared/envvars.py`` are inlined where the module imports them."""
    with open(os.path.join(os.path.dirname(__file__), "bootstrap.py"), encoding="utf-8") as f:
        source = f.read()
    names = {name: getattr(envvars, name) for name in ["PREFIX", *envvars.names()]}
    inlined = f"import types  # mpi_magic/shared/envvars.py, inlined\nenvvars = types.SimpleNamespace(**{names!r})\n"
    assert source.count(ENVVARS_IMPORT) == 1, "bootstrap.py imports envvars once, on a line of its own"
    return source.replace(ENVVARS_IMPORT, inlined).encode("utf-8")
