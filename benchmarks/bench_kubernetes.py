"""Kubernetes: a trivial 4-rank cell (2 worker pods x 2) through %%mpirun_remote --backend kubernetes,
against the same code run as an MPIJob by hand, and a warm cell on a Kubernetes session against one
on a local session of the same shape, on the project's emulated cluster (its nodes test hosts of their
own on this machine, its pods real processes there).

The baselines, measured in the same run, taking turns with the magic: the MPIJob a user would write for
the code (the same shape, image and transports: Open MPI's libfabric left out, as the magic's ranks do
on nodes without a fabric device), created through the API, its launcher pod watched until it ended,
and the job deleted with its pods, as ``kubectl apply``, ``kubectl wait`` and ``kubectl delete`` do;
and bare mpirun over two test hosts of the same kind as the emulator's nodes, started on a third (no
Kubernetes at all), with the same transports. Needs root (the test hosts).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _common import interleaved, median, shell, warm_cells

from mpi_magic.backends import launcher
from mpi_magic.backends.kubernetes import manifest
from mpi_magic.backends.kubernetes.cluster import GROUP, PLURAL, VERSION
from mpi_magic.shared import fabric
from mpi_magic.testing.hosts import TestHosts
from mpi_magic.testing.kubernetes_emulator import IMAGE, KubernetesEmulator

CODE = "from mpi4py import MPI; MPI.COMM_WORLD.allreduce(1)"
CELL = "from mpi4py import MPI\nMPI.COMM_WORLD.allreduce(1)\n"


def bare_mpijob(kubeconfig: str):
    """The code as an MPIJob written by hand: created, its launcher watched to its end, deleted."""
    from kubernetes import client, config, watch

    api = config.new_client_from_config(config_file=kubeconfig)
    objects, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           **{f"OMPI_MCA_{name}": value for name, value in fabric.LEFT_OUT.items()}}
    forwarded = " ".join(f"-x {name}" for name in env)
    # (the image's Python by its full path, PATH passed on: mpirun's ssh sessions have a PATH of their own)
    # and ssh tries again while a worker's sshd is not listening yet (its pod runs a moment before it does)
    launch = ["sh", "-c", f'mpirun --hostfile "$OMPI_MCA_orte_default_hostfile" -np 4 {forwarded} -x PATH '
                          f'--prtemca plm_ssh_args "-o ConnectionAttempts=10" "$(command -v python3)" -c "{CODE}"']
    runs = iter(range(1_000_000))

    def run() -> None:
        name = f"bare-{next(runs)}"
        job = manifest.mpijob(name, IMAGE, launch, env, 2, 2, 0, manifest.PodPlacement())
        version = core.list_namespaced_pod("default").metadata.resource_version
        objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job)
        for change in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version,
                                           label_selector=f"{manifest.JOB_LABEL}={name}", timeout_seconds=60):
            pod = change["object"]
            if pod.metadata.name.endswith("-launcher") and pod.status.phase in ("Succeeded", "Failed"):
                assert pod.status.phase == "Succeeded", core.read_namespaced_pod_log(pod.metadata.name, "default")
                break
        objects.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name,
                                                propagation_policy="Foreground")

    return run


def bare_mpirun(bed):
    """mpirun on the bed's third host over its first two (sshd on each), as a launcher pod runs it."""
    mpirun = launcher.find_launcher(None).path
    hostfile = os.path.join(bed.root, "hostfile")
    with open(hostfile, "w") as f:
        f.write(f"{bed.names[0]} slots=2\n{bed.names[1]} slots=2\n")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           **{f"OMPI_MCA_{name}": value for name, value in fabric.LEFT_OUT.items()}}
    forwarded = [arg for name in fabric.LEFT_OUT for arg in ("-x", f"OMPI_MCA_{name}")]
    argv = [mpirun, "--hostfile", hostfile, "-np", "4", *forwarded, sys.executable, "-c", CODE]

    def run() -> None:
        done = bed.run(bed.names[2], argv, env=env)
        assert done.returncode == 0, done.stderr

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cells", type=int, default=20, help="warm cells timed on each session")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mpi_magic_bench_k8s_") as root:
        cluster = KubernetesEmulator(os.path.join(root, "k8s"), nodes=3).start()
        try:
            os.environ.update(cluster.environ)
            ip = shell()
            magic = lambda: ip.run_cell_magic("mpirun_remote", "--backend kubernetes -i 2 -g 2 --quiet", CELL)  # noqa: E731
            bare = bare_mpijob(cluster.kubeconfig)
            with TestHosts(os.path.join(root, "bed"), hosts=3) as bed:
                across = bare_mpirun(bed)
                magic()  # warm the page cache, and the copy of mpi_magic the pods import
                bare()
                across()
                cell, by_hand, plain = interleaved([magic, bare, across], args.repeats)
            on_pods = warm_cells(ip, "--backend kubernetes -i 2 -g 2", CELL, args.cells)
            here = warm_cells(ip, "-i 2 -g 2", CELL, args.cells)
        finally:
            cluster.stop()
    print(f"one-off cell, 2 worker pods x 2 ranks on the emulated cluster, median of {args.repeats} rounds, "
          "each taking the three in turn:")
    print(f"  %%mpirun_remote --backend kubernetes -i 2 -g 2   {median(cell):6.3f} s  "
          f"(min {min(cell):.3f}, max {max(cell):.3f})")
    print(f"  the MPIJob by hand (create, watch, delete)       {median(by_hand):6.3f} s  "
          f"(min {min(by_hand):.3f}, max {max(by_hand):.3f})")
    print(f"  bare mpirun over two test hosts, from a third      {median(plain):6.3f} s  "
          f"(min {min(plain):.3f}, max {max(plain):.3f}; no Kubernetes)")
    print(f"  ratio magic / by hand = {median(cell) / median(by_hand):.2f}, magic / bare mpirun = "
          f"{median(cell) / median(plain):.2f}")
    print(f"session, warm cell, median of {args.cells}:")
    print(f"  kubernetes session, 2 worker pods x 2   {median(on_pods) * 1000:7.1f} ms  "
          "(cells over the channel, events through the launcher's log)")
    print(f"  local session, 2 x 2                    {median(here) * 1000:7.1f} ms  (the same 4 ranks on this one host)")
    print(f"  ratio kubernetes / local = {median(on_pods) / median(here):.2f}, kubernetes session's warm cell / "
          f"bare mpirun over the test hosts = {median(on_pods) / median(plain):.3f}")


if __name__ == "__main__":
    main()
