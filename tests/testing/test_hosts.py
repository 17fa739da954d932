"""Test hosts (mpi_magic.testing.hosts): hosts of their own names, addresses, sshd and network on this
machine, that reach each other and nothing else, and leave nothing behind."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from helpers import needs_hosts, wait_until

from mpi_magic.testing import hosts as hosts_module
from mpi_magic.testing.hosts import TestHosts


def _etc_digest() -> str:
    digest = hashlib.sha256()
    for path in ("/etc/hosts", "/etc/hostname", *(os.path.join("/etc/ssh", n) for n in sorted(os.listdir("/etc/ssh")))):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(path.encode() + f.read())
    return digest.hexdigest()


def _traces(bed: TestHosts, root: str) -> list[str]:
    """What of a bed this machine still shows: namespaces, interfaces, mounts, processes, its folder."""
    prefix = f"mm{bed.number}-"
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.split("\n")
    with open("/proc/self/mountinfo") as f:
        mounts = [line for line in f if root in line or f"/run/netns/{prefix}" in line]
    found = [line for line in namespaces if line.startswith(prefix)]
    found += [line for line in links if f" {prefix}login" in line]
    found += mounts
    found += [f"process {pid}" for pid in bed.started if os.path.exists(f"/proc/{pid}")]
    return found + ([root] if os.path.exists(root) else [])


@needs_hosts()
def test_four_hosts_have_their_own_names_addresses_sshd_and_files_and_go_down_without_a_trace():
    etc_before = _etc_digest()
    bed = TestHosts(hosts=4)
    with bed:
        root = bed.root
        assert bed.run("algo-1", ["hostname"]).stdout == "algo-1\n"
        # from this machine over ssh into algo-1, from there over ssh (as the images do) into algo-2
        shown = bed.ssh("algo-1", "ssh algo-2 'hostname; ip -4 -o addr show eth0'")
        assert shown.returncode == 0, shown.stderr
        name, address = shown.stdout.split("\n")[:2]
        assert name == "algo-2" and f"inet {bed.address('algo-2')}/24" in address
        # /dev/shm is each host's own, and nothing reaches past the bed: no route out
        assert bed.ssh("algo-1", "touch /dev/shm/mine && ls /dev/shm").stdout == "mine\n"
        # a fresh machine's shell start-up: none of this machine's runs in an ssh session
        assert bed.ssh("algo-1", "wc -c < ~/.bashrc 2>/dev/null || echo 0").stdout == "0\n"
        assert bed.ssh("algo-2", "ls /dev/shm").stdout == "" and not os.path.exists("/dev/shm/mine")
        out = bed.run("algo-3", ["ip", "route", "get", "192.0.2.1"])
        assert out.returncode != 0 and "unreachable" in out.stderr
        # a cut link parts the host from the rest until it is mended
        bed.cut("algo-4")  # (the bed's ssh waits as long as ssh does: a connection gets 5 s here)
        cut = subprocess.run([bed.ssh_agent, "-o", "ConnectTimeout=5", "algo-4", "true"], capture_output=True, timeout=20)
        assert cut.returncode == 255
        bed.mend("algo-4")
        assert bed.ssh("algo-4", "hostname").stdout == "algo-4\n"
    assert _traces(bed, root) == []
    assert _etc_digest() == etc_before, "nothing under /etc was written"


@needs_hosts()
def test_two_beds_are_up_at_once_on_networks_that_do_not_meet():
    with TestHosts(hosts=2) as one, TestHosts(hosts=2) as other:
        assert one.number != other.number and one.address("algo-1") != other.address("algo-1")
        assert one.ssh("algo-2", "hostname").stdout == other.ssh("algo-2", "hostname").stdout == "algo-2\n"
        crossed = one.run("algo-1", [sys.executable, "-c", "import socket; "
                                     f"socket.create_connection(({other.address('algo-2')!r}, 22), timeout=1)"])
        assert "OSError" in crossed.stderr or "timed out" in crossed.stderr, "one bed's hosts reach the other's"


@needs_hosts()
def test_the_ssh_sessions_on_a_host_get_the_variables_given_for_it_and_no_other_hosts():
    with TestHosts(hosts=3, sshd=False, ssh_environment={"algo-2": {"BASE_DIR": "/data/algo 2", "STAGE": "eval"}}) as bed:
        for name in bed.names:  # started as the SageMaker bootstrap starts it: daemonized, the host's config
            assert bed.run(name, ["/usr/sbin/sshd"]).returncode == 0
        shown = bed.run("algo-1", ["sh", "-c", "ssh algo-2 'echo \"$BASE_DIR|$STAGE\"'; "
                                               "ssh algo-3 'echo \"$BASE_DIR|$STAGE\"'"])
        assert shown.stdout == "/data/algo 2|eval\n|\n", shown.stderr
    with pytest.raises(hosts_module.HostsError, match="ssh_environment names algo-9, not a host of the bed"):
        TestHosts(hosts=2, ssh_environment={"algo-9": {"A": "1"}})


@needs_hosts()
def test_a_lost_host_has_nothing_left_running_and_its_relays_reach_this_machine(tmp_path):
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with TestHosts(hosts=2) as bed:
            address, port = bed.forward(server.server_address[1])
            fetched = bed.run("algo-2", [sys.executable, "-c", f"import urllib.request; print(urllib.request."
                                         f"urlopen('http://{address}:{port}/').status)"])
            assert fetched.stdout == "200\n", fetched.stderr
            assert bed.pids("algo-1")
            bed.lose("algo-1")  # a dead machine: nothing runs there, and nothing answers, not even a refusal
            assert bed.pids("algo-1") == []
            assert _connecting(bed, "algo-2", bed.address("algo-1")) == "TimeoutError"
            bed.mend("algo-1")  # (its neighbours may still hold it unreachable for a moment: EHOSTUNREACH)
            assert wait_until(lambda: _connecting(bed, "algo-2", bed.address("algo-1")) == "ConnectionRefusedError", 10)
            bed.kill_all("algo-2")  # every process killed, the host still answering: refused at once
            assert bed.pids("algo-2") == []
            assert _connecting(bed, "algo-1", bed.address("algo-2")) == "ConnectionRefusedError"
    finally:
        server.shutdown()
        server.server_close()


@needs_hosts()
def test_the_last_bed_down_takes_down_the_mount_of_run_netns_a_bed_made():
    """``ip netns add`` mounts /run/netns on its first namespace. Seen from a mount namespace of its own,
    where nothing is mounted there whatever other beds run on this machine."""
    script = ("import subprocess\n"
              "from mpi_magic.testing.hosts import NETNS, TestHosts, _mounted\n"
              "subprocess.run(['umount', '--lazy', NETNS], capture_output=True)\n"
              "before = _mounted(NETNS)\n"
              "with TestHosts(hosts=1, sshd=False):\n"
              "    during = _mounted(NETNS)\n"
              "print(before, during, _mounted(NETNS))\n")
    seen = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert seen.stdout == "False True False\n", seen.stderr


def _connecting(bed: TestHosts, host: str, address: str) -> str:
    """What a connection from ``host`` to sshd's port at ``address`` meets within 2 s: the error's name."""
    tried = bed.run(host, [sys.executable, "-c", "import socket\ntry:\n    socket.create_connection("
                           f"({address!r}, 22), timeout=2)\nexcept OSError as exc:\n    print(type(exc).__name__)"])
    return tried.stdout.strip() or tried.stderr


def test_without_root_the_bed_says_so_in_one_sentence_and_makes_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    assert hosts_module.main(["up", "--hosts", "2", "--root", str(tmp_path / "bed")]) == 1
    assert capsys.readouterr() == ("", "hosts: test hosts need root (network namespaces and interfaces): run as root\n")
    assert not os.path.exists(tmp_path / "bed")


def test_a_bed_has_at_least_one_host():
    with pytest.raises(hosts_module.HostsError, match="a bed has 1 to 240 hosts, not 0"):
        TestHosts(names=[], hosts=0)
