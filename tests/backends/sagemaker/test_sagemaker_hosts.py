"""SageMaker jobs whose instances are hosts of their own (``mpi_magic.testing.hosts``): the emulator
runs each instance in a test host, the bootstrap starts the real sshd, and the leader's mpirun
reaches the others over real ssh and a network of the job's own. Unchanged boto3 against a moto
server and mpi_magic's SageMaker emulator, one of each for the module (``local_aws_env``); each
test keeps to its own S3 prefix and its own jobs."""

from __future__ import annotations

import ipaddress
import os
import threading

from helpers import leader_log, needs_hosts, once_running, run, waiting_for

from mpi_magic.testing.sagemaker_emulator import instance_fault

pytestmark = needs_hosts()

SENT_BYTES = (  # cell code: what this rank's host has sent on its network, from its own /proc
    "def sent_bytes():\n"
    "    with open('/proc/net/dev') as f:\n"
    "        return next(int(line.split(':')[1].split()[8]) for line in f if line.strip().startswith('eth0:'))\n"
)


def test_ranks_run_on_hosts_of_their_own_and_their_allreduce_crosses_the_network(ip, cloud):
    run(ip, "-i 2 -g 2 --gather --out job", SENT_BYTES + (
        "import socket, numpy, psutil\n"
        "from mpi4py import MPI\n"
        "address = next(a.address for a in psutil.net_if_addrs()['eth0'] if a.family == socket.AF_INET)\n"
        "data = numpy.full(1 << 19, float(MPI.COMM_WORLD.rank))  # 4 MiB\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "before = sent_bytes()\n"
        "MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, data)\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "where = (socket.gethostname(), address, float(data[-1]), sent_bytes() - before)\n"
        "import os\n"
        "bed = os.path.join(os.path.dirname(os.environ['SAGEMAKER_BASE_DIR']), 'hosts-1')  # (the job's folder)\n"
        "bed_up = os.path.isdir(bed)\n"
    ))
    assert all(ip.user_ns["bed_up"]) and not os.path.exists(ip.user_ns["bed"][0]), "the job's hosts end with it"
    where = ip.user_ns["where"]
    assert [name for name, *_ in where] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert [rank.host for rank in ip.user_ns["job"].ranks] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    addresses = [ipaddress.ip_address(address) for _, address, *_ in where]
    assert addresses[0] == addresses[1] != addresses[2] == addresses[3]
    assert ipaddress.ip_network(f"{addresses[0]}/24", strict=False) == ipaddress.ip_network(f"{addresses[2]}/24",
                                                                                            strict=False)
    assert [total for _, _, total, _ in where] == [0.0 + 1 + 2 + 3] * 4
    assert all(sent >= 4 << 20 for *_, sent in where), f"the allreduce's 4 MiB did not leave each host: {where}"
    log = leader_log(cloud, ip.user_ns["job"].name)
    launch = next(line for line in log if line.startswith("mpi_magic bootstrap: running mpirun"))
    assert "plm_ssh_agent ssh " in launch and "btl_tcp_if_include eth0" in launch and "OMPI_MCA_coll" not in launch


def test_a_slow_link_slows_the_collectives_yet_the_cell_completes_and_its_progress_stays_live(ip, cloud, local_aws_env,
                                                                                              tmp_path):
    slowed = str(tmp_path / "slowed")  # the cell's collectives start once algo-2's link is slow

    def slow() -> None:
        instance_fault(local_aws_env["AWS_ENDPOINT_URL_SAGEMAKER"], ip.user_ns["job"].name, "algo-2", "slow", "20mbit")
        open(slowed, "w").close()

    seen, over = [], threading.Event()  # rank 2's progress (on algo-2) as the notebook shows it while the cell runs

    def watch() -> None:
        while not over.wait(0.1):
            job = ip.user_ns.get("job")
            if job is not None and job.status == "running":
                seen.append(job.ranks[2].n)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with once_running(ip, slow):
            run(ip, "-i 2 -g 2 --gather --out job", waiting_for(slowed) + (
                "import time, numpy, mpi_magic\n"
                "from mpi4py import MPI\n"
                "took = []\n"
                "for step in mpi_magic.progress(range(10)):\n"
                "    started = time.monotonic()\n"
                "    MPI.COMM_WORLD.Allreduce(numpy.ones(1 << 16), numpy.empty(1 << 16))  # 512 KiB\n"
                "    took.append(time.monotonic() - started)\n"
                "    time.sleep(0.3)\n"
            ))
    finally:
        over.set()
        watcher.join()
    job = ip.user_ns["job"]
    assert job.status == "completed" and [(s.n, s.total) for s in job.ranks] == [(10, 10)] * 4
    median = sorted(ip.user_ns["took"][2])[len(ip.user_ns["took"][2]) // 2]
    assert median > 0.1, f"512 KiB at 20 Mbit/s take 0.2 s, not {median:.3f} s: the link was not slowed"
    live = sorted({n for n in seen if 0 < n < 10})
    assert len(live) >= 3, f"rank 2's progress came in bursts, not step by step: {seen}"


REUSED_BUFFERS = (  # the same arrays for every large allreduce, then many small ones
    "import numpy\n"
    "from mpi4py import MPI\n"
    "world = MPI.COMM_WORLD\n"
    "send, got = numpy.full(4096, world.rank + 1.0), numpy.empty(4096)  # 32 KiB\n"
    "for _ in range(20):\n"
    "    world.Allreduce(send, got)\n"
    "large = float(got[-1])\n"
    "one, total = numpy.ones(1), numpy.empty(1)\n"
    "for _ in range(200):\n"
    "    world.Allreduce(one, total)\n"
    "small = float(total[0])\n"
    "import socket\n"
    "host = socket.gethostname()\n"
)


def test_one_rank_per_instance_on_two_hosts_completes_large_then_small_allreduces_on_reused_buffers(ip, cloud):
    run(ip, "-i 2 -g 1 --gather", REUSED_BUFFERS)
    assert ip.user_ns["host"] == ["algo-1", "algo-2"]
    assert ip.user_ns["large"] == [1.0 + 2.0] * 2 and ip.user_ns["small"] == [2.0] * 2


def test_one_rank_per_instance_on_four_hosts_completes_its_collectives(ip, cloud):
    run(ip, "-i 4 -g 1 --gather", REUSED_BUFFERS)
    assert ip.user_ns["host"] == ["algo-1", "algo-2", "algo-3", "algo-4"]
    assert ip.user_ns["large"] == [1.0 + 2.0 + 3.0 + 4.0] * 4 and ip.user_ns["small"] == [4.0] * 4
