"""The sentence naming hosts that went silent mid-job (lost, or cut off), worded once for every backend."""

from __future__ import annotations


def stopped_answering(noun: str, hosts: list[str], listener: str) -> str:
    """``noun`` is the backend's word for a host (instance, node), ``listener`` who stopped hearing them:
    "node n2 stopped answering mpirun on n1 (lost, or cut off)"."""
    return f"{noun}{'s' if len(hosts) > 1 else ''} {', '.join(hosts)} stopped answering {listener} (lost, or cut off)"
