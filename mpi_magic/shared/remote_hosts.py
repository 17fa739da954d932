"""How a job's own ssh and mpirun's reach its other hosts: ssh as it comes waits minutes on a host
that went silent (a connection for TCP's timeout, an open session for ever), so every ssh of a job
across hosts (the wait for the workers, their release, mpirun's sessions to its daemons) gives up on
such a host by itself, whatever the image's ssh configuration says.

Standard library only, and no import of the package: the SageMaker bootstrap runs it inlined, before
any of mpi_magic is unpacked on the instance."""

import os

CONNECT_TIMEOUT = 5  # seconds to connect; a host on the job's network answers in milliseconds
ALIVE_INTERVAL = 3  # seconds without a word from the host before ssh asks whether it is there
ALIVE_COUNT = 2  # asks unanswered before ssh ends the session: a silent host is given up in about 6 s
SSH_OPTIONS = ["-o", "ConnectTimeout=%d" % CONNECT_TIMEOUT, "-o", "ServerAliveInterval=%d" % ALIVE_INTERVAL,
               "-o", "ServerAliveCountMax=%d" % ALIVE_COUNT]


def ssh_args(major, user_args=(), environ=None):
    """mpirun's ssh sessions to its daemons give up on a silent host as the job's own do
    (``SSH_OPTIONS``), unless the job's --mpirun-args or environment set ssh's arguments already
    (Open MPI ``major`` 5 names them PRRTE's way)."""
    environ = os.environ if environ is None else environ
    theirs = [*user_args, *(name.lower() for name in environ if name.startswith(("OMPI_MCA_", "PRTE_MCA_")))]
    if any(name in arg for arg in theirs for name in ("plm_ssh_args", "plm_rsh_args")):
        return []
    return (["--prtemca", "plm_ssh_args"] if major >= 5 else ["--mca", "plm_rsh_args"]) + [" ".join(SSH_OPTIONS)]
