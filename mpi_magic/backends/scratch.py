"""Private temporary folders that the notebook process holds while it uses them.

A killed kernel cannot remove its folders (what it started dies with it). Each folder holds a
lock its notebook process keeps from making it to removing it; the operating system frees the
lock when that process dies, whatever its process number or namespace. Making a folder of a kind
first removes the folders of that kind whose lock is free.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading

LOCK_NAME = ".held"


class ScratchFolder:
    """A new folder ``mpi_magic_<kind>_*`` in the temporary folder (0700, and a short path: Unix
    socket paths are limited), held until ``remove()``."""

    def __init__(self, kind: str):
        prefix = f"mpi_magic_{kind}_"
        remove_abandoned(prefix)
        staging = tempfile.mkdtemp(prefix="." + prefix)  # named for the sweep only once it is locked
        self._held: int | None = os.open(os.path.join(staging, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._held, fcntl.LOCK_EX)
        self.path = os.path.join(os.path.dirname(staging), os.path.basename(staging)[1:])
        os.rename(staging, self.path)
        self._removing = threading.Lock()

    def remove(self) -> None:
        """Remove the folder and let go of it; again, from any thread, does nothing."""
        with self._removing:
            if self._held is None:
                return
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._held)
            self._held = None


def remove_abandoned(prefix: str) -> None:
    """Remove the folders named ``prefix*`` whose lock no process holds (one this user cannot
    open, one being made and not locked yet, and one in use are left alone)."""
    root = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        path = os.path.join(root, name)
        try:
            lock = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held
            os.close(lock)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)
