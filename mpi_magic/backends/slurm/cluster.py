"""What the cluster says about itself (``sinfo``): its partitions, their sizes, time limits and
GPUs, read once per cell so that a mistake is one sentence before anything is submitted."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import LaunchOptions
from ...shared.slurmtime import clock, seconds
from . import commands
from .commands import SlurmSetupError


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: int
    max_time: float | None  # seconds; None: no limit
    gpus_per_node: int  # the fewest GPUs (gres gpu) any of its nodes has; 0: none
    cpus_per_node: int  # the fewest CPUs any of its nodes has


def partitions() -> dict[str, Partition]:
    """Every partition this user may see, by name."""
    shown = commands.run("sinfo", "-h", "-o", "%P|%D|%l|%G|%c")
    if shown.returncode != 0:
        raise SlurmSetupError(f"sinfo failed: {commands.said(shown)}; is this machine a client of the cluster "
                              "(SLURM_CONF, munge)?")
    rows: dict[str, list[tuple[int, str, int, int]]] = {}
    defaults = set()
    for line in shown.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        name, nodes, limit, gres, cpus = parts
        if name.endswith("*"):
            name = name[:-1]
            defaults.add(name)
        rows.setdefault(name, []).append((int(nodes or 0), limit, gpu_count(gres), int(cpus.rstrip("+") or 0)))
    return {name: Partition(name, name in defaults, sum(r[0] for r in found), seconds(found[0][1]),
                            min(r[2] for r in found), min(r[3] for r in found))
            for name, found in rows.items()}


def gpu_count(gres: str) -> int:
    """GPUs per node in sinfo's GRES column: "gpu:8", "gpu:a100:4(S:0-1)", "(null)" -> 8, 4, 0."""
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) > 1 and fields[-1].isdigit():
            return int(fields[-1])
    return 0


def default_gpus(partition: str | None) -> int:
    """The GPUs per node of ``partition`` (the default one if None), 0 where it has none or where
    Slurm cannot be asked (the backend then says why, before anything starts)."""
    try:
        known = partitions()
    except SlurmSetupError:
        return 0
    found = known.get(partition) if partition else next((p for p in known.values() if p.default), None)
    return found.gpus_per_node if found else 0


def chosen(options: LaunchOptions, known: dict[str, Partition]) -> Partition:
    """The partition the job goes to, checked against what the job asks; one sentence otherwise."""
    settings = options.settings
    name = settings.get("partition")
    listing = ", ".join(p.name + (" (default)" if p.default else "") for p in known.values()) or "none"
    if name is None:
        default = next((p for p in known.values() if p.default), None)
        if default is None:
            raise SlurmSetupError(f"the cluster has no default partition; choose one with --partition ({listing})")
        partition = default
    elif name not in known:
        raise SlurmSetupError(f"there is no partition {name!r} on this cluster; its partitions: {listing}")
    else:
        partition = known[name]
    if options.instances > partition.nodes:
        raise SlurmSetupError(f"--instances {options.instances} asks for more nodes than partition {partition.name} "
                              f"has ({partition.nodes}); lower --instances or choose another --partition")
    overcommit = {"-O", "--overcommit"} & set(settings.get("slurm_args", []))
    if options.procs_per_instance > partition.cpus_per_node and not overcommit:
        raise SlurmSetupError(f"--gpus {options.procs_per_instance} asks for more tasks per node than partition "
                              f"{partition.name}'s nodes have CPUs ({partition.cpus_per_node}); lower --gpus, or let "
                              "tasks share CPUs with --slurm-args --overcommit")
    asked = seconds(settings["time"]) if settings.get("time") else None
    if asked is not None and partition.max_time is not None and asked > partition.max_time:
        raise SlurmSetupError(f"--time {settings['time']} is over partition {partition.name}'s limit of "
                              f"{clock(partition.max_time)}; lower --time or choose another --partition")
    return partition


def down_nodes(nodes: str) -> dict[str, str]:
    """Which of ``nodes`` (Slurm's node list, "n[1-2]") are down or failing, each with Slurm's reason
    ({"n2": "Not responding"}); {} where sinfo cannot say. A node drained (for maintenance) did not fail."""
    try:
        shown = commands.run("sinfo", "-h", "-R", "-N", "-t", "down,fail", "-n", nodes, "-o", "%N|%E")
    except SlurmSetupError:
        return {}
    found = {}
    for line in shown.stdout.splitlines():  # (a row per node and partition)
        node, _, reason = line.strip().partition("|")
        if node:
            found[node] = reason
    return found
