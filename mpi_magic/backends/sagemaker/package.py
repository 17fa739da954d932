"""The bootstrap every instance runs, as it runs it (the code it unpacks is ``shipped_code.archive``)."""

from __future__ import annotations

import os

from mpi_magic.shared import envvars, remote_hosts


ENVVARS_IMPORT = "from mpi_magic.shared import envvars  # an instance's copy has the module inlined here\n"
REMOTE_HOSTS_IMPORT = "from mpi_magic.shared import remote_hosts  # an instance's copy has the module inlined here\n"


def bootstrap_source() -> bytes:
    """The bootstrap as an instance runs it: a script that needs nothing of mpi_magic installed,
    so the names from ``shared/envvars.py`` and the module ``shared/remote_hosts.py`` (standard
    library only) are inlined where the bootstrap imports them."""
    with open(os.path.join(os.path.dirname(__file__), "bootstrap.py"), encoding="utf-8") as f:
        source = f.read()
    names = {name: getattr(envvars, name) for name in ["PREFIX", *envvars.names()]}
    inlined = f"import types  # mpi_magic/shared/envvars.py, inlined\nenvvars = types.SimpleNamespace(**{names!r})\n"
    with open(remote_hosts.__file__, encoding="utf-8") as f:
        module = f.read()
    inlined_module = (f"remote_hosts = types.ModuleType('remote_hosts')  # mpi_magic/shared/remote_hosts.py, inlined\n"
                      f"exec({module!r}, remote_hosts.__dict__)\n")
    for line in (ENVVARS_IMPORT, REMOTE_HOSTS_IMPORT):
        assert source.count(line) == 1, f"bootstrap.py imports each inlined module once, on a line of its own: {line}"
    return source.replace(ENVVARS_IMPORT, inlined).replace(REMOTE_HOSTS_IMPORT, inlined_module).encode("utf-8")
