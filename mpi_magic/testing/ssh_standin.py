"""An ``ssh`` for simulated instances on one machine: ``ssh [options] HOST COMMAND...`` runs
COMMAND here, in a shell whose ``SAGEMAKER_BASE_DIR`` is that host's own folder.

The SageMaker emulator points Open MPI's ``plm_ssh_agent`` (and the bootstrap) at it, so
mpirun on the leading instance starts its daemons "on" the other instances.
"""

from __future__ import annotations

import os
import sys
from ..shared import envvars

# ssh options that take a value; any other option is a flag
_WITH_VALUE = set("bcDEeFIiJLlmOopQRSWw")


def split(argv: list[str]) -> tuple[str, str]:
    """(host, command) from an ssh command line."""
    args = list(argv)
    while args and args[0].startswith("-") and len(args[0]) > 1:
        option = args.pop(0)
        if option[1] in _WITH_VALUE and len(option) == 2:
            args.pop(0)
    if not args:
        raise SystemExit("ssh stand-in: no host given")
    host, command = args[0], " ".join(args[1:])
    return host.split("@")[-1], command


def private_tmp(base: str) -> dict[str, str]:
    """The environment that gives an emulated instance its own temporary folder, as a container
    has: Open MPI's launcher and PMIx keep their temporary files there, so neither those of another
    instance nor those a killed launcher left on an earlier attempt are found by a later one."""
    tmp = os.path.join(base, "tmp")
    os.makedirs(tmp, exist_ok=True)
    return {"TMPDIR": tmp, "PRTE_MCA_prte_tmpdir_base": tmp, "PMIX_MCA_pmix_server_tmpdir": tmp}


def main(argv: list[str] | None = None) -> None:
    host, command = split(sys.argv[1:] if argv is None else argv)
    hosts_root = os.environ[envvars.EMULATED_HOSTS]
    base = os.path.join(hosts_root, host)
    if not os.path.isdir(base):
        sys.stderr.write(f"ssh: Could not resolve hostname {host}: Name or service not known\n")
        raise SystemExit(255)
    # As with a real sshd, the command starts from a login environment, not the caller's:
    # whatever the ranks need must be forwarded by mpirun (-x).
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "USER") if name in os.environ}
    # Daemons and ranks of different "instances" must not share temporary folders or shared
    # memory segments, as they would on one machine: each instance gets its own folder.
    env.update(private_tmp(base), SAGEMAKER_BASE_DIR=base)
    env[envvars.HOST] = host
    env["OMPI_MCA_btl_sm_backing_directory"] = env["TMPDIR"]
    os.execve("/bin/sh", ["/bin/sh", "-c", command or "true"], env)


if __name__ == "__main__":
    main()
