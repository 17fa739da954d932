"""What a job's watchdog (``follow.watchdog``) runs once the kernel exited or was killed without
ending the job: delete it, with its pods.

    python -m mpi_magic.backends.kubernetes.watchdog NAMESPACE JOB
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    namespace, name = (sys.argv[1:] if argv is None else argv)[:2]
    from .cluster import GROUP, PLURAL, VERSION, connect, kubernetes

    api, _ = connect()
    try:
        kubernetes().client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Foreground")
    except Exception:  # noqa: BLE001 - gone already
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
