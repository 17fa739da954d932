"""The Kubernetes backend, as the registry knows it: its options and settings, checked for form while
the line is parsed (the cluster says whether a namespace or queue exists, when the backend is made)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Callable

from IPython.core.error import UsageError

from ...options import JOB, Option, Setting, text
from ..base import Declaration

if TYPE_CHECKING:
    from ...options import Config, LaunchOptions
    from .backend import KubernetesBackend

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
IDLE_DEFAULT = 1800.0  # seconds a session's job may sit without a cell, unless --max-idle says
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a namespace, a queue: a DNS label
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")  # a label's key


def _option(*flags: str, **declaration) -> Option:
    return Option(JOB, flags, declaration, only="kubernetes")


def dns_label(value: str, what: str) -> str:
    if not _NAME.match(value) or len(value) > 63:
        raise UsageError(f"{what} {value!r} is not a Kubernetes name: lower-case letters, digits and '-', "
                         "at most 63, starting and ending with a letter or digit")
    return value


def key_values(value: str, what: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}."""
    found = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not _KEY.match(key.strip()):
            raise UsageError(f"{what} {value!r} is not KEY=VALUE,KEY=VALUE; for example {what} team=ml,project=x")
        found[key.strip()] = val.strip()
    return found


def tolerations(value: str, what: str) -> list[dict]:
    """``key=value:NoSchedule,key:NoExecute,key`` -> the pods' tolerations (a key alone tolerates every
    taint of that key, as ``operator: Exists`` does)."""
    found = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        taint, _, effect = item.partition(":")
        key, sep, val = taint.partition("=")
        if not _KEY.match(key) or (effect and effect not in EFFECTS):
            raise UsageError(f"{what} {value!r} is not KEY[=VALUE][:EFFECT],...: effects are {', '.join(EFFECTS)}; "
                             f"for example {what} nvidia.com/gpu:NoSchedule")
        found.append({"key": key, "operator": "Equal" if sep else "Exists", **({"value": val} if sep else {}),
                      **({"effect": effect} if effect else {})})
    return found


def volume(value: str, what: str) -> tuple[str, str]:
    """``CLAIM:/mount/path`` -> (claim, path)."""
    claim, sep, path = value.partition(":")
    if not sep or not _NAME.match(claim) or not path.startswith("/"):
        raise UsageError(f"{what} {value!r} is not CLAIM:/PATH (a PersistentVolumeClaim the notebook's machine "
                         f"mounts at /PATH too); for example {what} fsx-claim:/fsx")
    return claim, path.rstrip("/") or "/"


# (setting, its flag, how it is parsed, help)
_OWN: tuple[tuple[str, str, Callable, str, str], ...] = (
    ("namespace", "--namespace", dns_label, "NAME", "namespace of the job (default: the kubeconfig context's, or "
                                                    "the notebook pod's own)"),
    ("image", "--image", text, "IMAGE", "the pods' image: Python 3 with mpi4py, Open MPI's mpirun and sshd "
                                        "(mpi_magic itself comes with the job)"),
    ("service_account", "--service-account", dns_label, "NAME", "service account the pods run as"),
    ("node_selector", "--node-selector", key_values, "KEY=VALUE,...", "labels the pods' nodes must have"),
    ("tolerations", "--tolerations", tolerations, "KEY[=VALUE][:EFFECT],...", "taints the pods tolerate"),
    ("queue", "--queue", dns_label, "NAME", "Kueue local queue: the job is created suspended and waits "
                                            "for Kueue to admit it"),
    ("priority_class", "--priority-class", dns_label, "NAME", "the pods' PriorityClass"),
    ("labels", "--labels", key_values, "KEY=VALUE,...", "labels of the job and its pods"),
    ("annotations", "--annotations", key_values, "KEY=VALUE,...", "annotations of the job (e.g. HyperPod's "
                                                                  "auto-resume)"),
    ("volume", "--volume", volume, "CLAIM:PATH", "a ReadWriteMany claim every pod mounts at PATH, where this "
                                                 "machine mounts it too and the cache folder is (FSx for Lustre "
                                                 "on HyperPod)"),
)
OPTIONS = tuple(_option(flag, default=None, metavar=metavar, help=f"kubernetes: {about}.")
                for _, flag, _, metavar, about in _OWN)
SETTINGS = tuple(Setting(f"kubernetes_{name}", None, parse, f"kubernetes: {about}") for name, _, parse, _, about in _OWN) + (
    Setting("kubernetes_notebook_host", None, text, "kubernetes sessions: the name or address the pods reach this "
                                                    "notebook at (default: this machine's name)"),)


def values(args: argparse.Namespace, config: Config) -> dict:
    """The job's settings from the cell (and %mpirun_config), checked for form only."""
    found = {}
    for name, flag, parse, _, _ in _OWN:
        given = getattr(args, name)
        found[name] = parse(given, flag) if given is not None else config.get(f"kubernetes_{name}")
    return found


def _make(config: Config, options: LaunchOptions) -> KubernetesBackend:
    from .backend import KubernetesBackend

    return KubernetesBackend(config, options)


KUBERNETES = Declaration(
    name="kubernetes", about="an MPIJob of Kubeflow's MPI Operator", make=_make, default_gpus=lambda settings: 1,
    max_ranks=65536, why_max="the notebook keeps live state for every rank",
    options=OPTIONS, settings=SETTINGS, values=values, idle_default=IDLE_DEFAULT, extra="kubernetes",
    export_needs="a kubeconfig reaching the cluster the job ran on, and the cache folder (`MPI_MAGIC_CACHE_DIR`) on "
                 "the volume its pods share",
    export_launch="the job's MPIJob manifest",
)
