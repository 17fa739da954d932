"""Test hosts on this machine: N hosts with their own addresses, hostnames and sshd, on a network of their own.

    python -m mpi_magic.testing.hosts up --hosts 4 [--root DIR]   (prints how to reach them)
    python -m mpi_magic.testing.hosts down [--root DIR]          (ends them, removes DIR)

Each host (``algo-1`` ... ``algo-N``, or names given) is a network namespace whose ``eth0`` is one
end of a veth pair; the other ends hang on a bridge inside a switch namespace of the bed's own, so
the hosts reach each other and nothing else: their addresses (a /24 of 10.213.0.0/16 per bed) have
no route out. This machine joins the bed as its login node (``.1``, an interface ``mmN-login``), as
the machine a notebook runs on is on a real cluster's network: the tests' notebook reaches a head
node's slurmctld, and ranks reach the notebook or a forwarded server (``forward``). Each host has a
hostname of its own (a UTS namespace) and, in every process entered into it, its own ``/etc/hosts``
and ``/etc/ssh`` (the bed's, bind-mounted: nothing under ``/etc`` is written), and empty ``/run``
and ``/dev/shm``: what one host's daemons and ranks keep there, no other sees. A host is a fresh
machine, so its shell start-up file (``~/.bashrc``, which bash reads in every ssh session) is
empty: this machine's (a version manager's shims and their lock, say) stays here. ``ssh HOST`` works
inside the hosts as on the SageMaker training images (root, a throwaway key, no host key checks);
``ssh_agent`` is the same ssh for this machine. With ``sshd`` (the default) each host runs the
real ``/usr/sbin/sshd``; without, whatever runs in a host starts it (the SageMaker bootstrap does).
``ssh_environment`` gives the ssh sessions on a host variables of its own (sshd's ``SetEnv``, for
connections to the host's address), as an image's ``/etc/environment`` gives its logins theirs.

Links can be cut (``cut``/``mend``), slowed (``slow``: ``tc`` tbf) and hosts lost (``lose``: its
link down and every process of it killed, a dead machine's silence; ``kill_all`` kills them with the
host still answering). Root is needed (namespaces, interfaces); ``missing()`` says in one
sentence what is missing. Like the test Slurm cluster, a bed that Python brings up is brought down
when that Python ends without doing so (a keeper, ``down --after PID``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ..shared import procs
from . import servers

SUBNET = "10.213"  # each bed takes 10.213.<bed>.0/24
LOGIN = 1  # this machine's address in a bed: .1; hosts from .11
FIRST_HOST = 11
STATE = "bed.json"  # in the root: the bed's number, hosts and the daemons it started
SSHD = "/usr/sbin/sshd"
PROGRAMS = {"ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux", "tc": "iproute2",
            "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
NETNS = "/run/netns"  # where ``ip netns`` keeps named namespaces: a mount it makes on its first namespace
UP_LIMIT = 10.0  # seconds the hosts' sshd get to answer
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL for what runs in a host

# What a process entering a host does first, in a mount namespace of its own (a slave of this
# machine's: what is mounted here later shows there, nothing mounted there shows here).
ENTER = """set -e
mount --bind "$MM_BED/etc-hosts" /etc/hosts
mount --bind "$MM_BED/etc-ssh" /etc/ssh
mount -t tmpfs -o mode=755 mpi_magic-run /run
mkdir -p /run/sshd
mount -t tmpfs -o mode=1777 mpi_magic-shm /dev/shm
home=$(getent passwd "$(id -u)" | cut -d: -f6)
if [ -f "$home/.bashrc" ]; then mount --bind "$MM_BED/empty" "$home/.bashrc"; fi
unset MM_BED home
exec "$@"
"""


class HostsError(RuntimeError):
    """The hosts could not be made (what is missing, or what a command said)."""


def missing() -> str | None:
    """One sentence saying why no bed can be made here, or None when one can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces and interfaces): run as root"
    absent = [name for name in (*PROGRAMS, "sshd") if not shutil.which(name, path=_path())]
    if absent:
        packages = sorted({PROGRAMS.get(name, "openssh-server") for name in absent})
        return f"test hosts need {', '.join(absent)}: apt-get install {' '.join(packages)}"
    return _refused()


@functools.lru_cache(maxsize=1)
def _refused() -> str | None:
    """Why this root may not make network and mount namespaces (a container without the rights), or None."""
    tried = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, env={**os.environ, "PATH": _path()})
    if tried.returncode == 0:
        return None
    return (f"test hosts need the right to make network namespaces, which this root lacks "
            f"({tried.stderr.strip() or 'unshare failed'}): run where root has CAP_SYS_ADMIN and CAP_NET_ADMIN")


def _path(path: str | None = None) -> str:
    """``path`` (this machine's PATH by default) with the system folders the bed's programs are in."""
    return (os.environ.get("PATH", "") if path is None else path) + os.pathsep + "/usr/sbin:/sbin"


class TestHosts:
    """A bed of ``hosts`` hosts (or the hosts ``names``) under ``root``; ``up`` makes it, ``down`` ends it."""

    __test__ = False  # (not a pytest test class)

    def __init__(self, root: str | None = None, hosts: int = 4, names: list[str] | None = None,
                 sshd: bool = True, outlives_me: bool = False,
                 ssh_environment: dict[str, dict[str, str]] | None = None):
        self.names = list(names) if names else [f"algo-{i}" for i in range(1, hosts + 1)]
        if not 1 <= len(self.names) <= 240:
            raise HostsError(f"a bed has 1 to 240 hosts, not {len(self.names)}")
        self.ssh_environment = ssh_environment or {}  # {host: {variable: value}} for the ssh sessions there
        unknown = sorted(set(self.ssh_environment) - set(self.names))
        if unknown:
            raise HostsError(f"ssh_environment names {', '.join(unknown)}, not a host of the bed "
                             f"({', '.join(self.names)})")
        self.root = os.path.abspath(root) if root else None
        self.sshd, self.outlives_me = sshd, outlives_me
        self.number: int | None = None  # the bed's number: its namespaces' names and its subnet
        self._daemons: list[subprocess.Popen] = []  # those this process started, to be waited for
        self._keeper: subprocess.Popen | None = None
        self.started: list[int] = []  # every process this bed started: its daemons and its keeper
        self._forwarders: list[_Forwarder] = []

    # -- addresses and names ----------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return f"mm{self.number}"

    @property
    def switch(self) -> str:
        """The namespace that holds the bridge."""
        return f"{self.prefix}-sw"

    @property
    def login_address(self) -> str:
        """This machine's address in the bed, where the hosts reach it."""
        return f"{SUBNET}.{self.number}.{LOGIN}"

    def address(self, name: str) -> str:
        return f"{SUBNET}.{self.number}.{FIRST_HOST + self.names.index(name)}"

    def namespace(self, name: str) -> str:
        return f"{self.prefix}-{self.names.index(name) + 1}"

    def port(self, name: str) -> str:
        """The bridge's port for host ``name`` (in the switch namespace)."""
        return f"p{self.names.index(name) + 1}"

    @property
    def ssh_agent(self) -> str:
        """An ``ssh`` that reaches the hosts from this machine (mpirun's ``plm_ssh_agent``, say)."""
        return self._file("ssh")

    def _file(self, name: str) -> str:
        assert self.root is not None
        return os.path.join(self.root, name)

    # -- up and down ------------------------------------------------------------------------

    def up(self) -> TestHosts:
        why = missing()
        if why:
            raise HostsError(why)
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="mm-bed-")
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        if os.path.exists(self._file(STATE)):
            raise HostsError(f"a bed is up under {self.root} already: bring it down first")
        if not _mounted(NETNS):  # (the first bed's ``ip netns add`` will make it)
            open(_netns_mount_made(), "a").close()
        self.number = self._claim()
        self._save()
        try:
            if not self.outlives_me:
                self._keeper = servers.start([sys.executable, "-m", __name__, "down", "--root", self.root,
                                              "--after", str(os.getpid())], ends_with_parent=False,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.started.append(self._keeper.pid)
            self._write_files()
            self._make_network()
            if self.sshd:
                for name in self.names:
                    self.spawn(name, [SSHD, "-D", "-e"], log=f"sshd-{name}.log")
                self._wait_for_sshd()
        except BaseException:
            self.down()
            raise
        return self

    def down(self, remove: bool = True) -> None:
        """Every process of every host ended (SIGTERM, then SIGKILL), the namespaces, interfaces and
        hostname anchors removed; with ``remove``, the root folder too."""
        for forwarder in self._forwarders:
            forwarder.close()
        self._forwarders.clear()
        state = self._load()
        if state is None:
            return
        self.number, self.names = state["number"], state["names"]
        namespaces = [self.namespace(name) for name in self.names]
        for signum in (signal.SIGTERM, signal.SIGKILL):
            members = {pid for ns in namespaces for pid in _namespace_pids(ns)} | set(state.get("daemons", []))
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + STOP_GRACE
            while any(map(self._running, members)) and time.monotonic() < deadline:
                time.sleep(0.02)
        for process in self._daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):  # (SIGKILLed: only a stuck kernel keeps it)
                process.wait(timeout=5)
        self._daemons.clear()
        for name in self.names:
            _run("ip", "netns", "delete", self.namespace(name), check=False)
            anchor = self._file(f"{name}.uts")
            if os.path.exists(anchor):
                _run("umount", anchor, check=False)
        _run("ip", "netns", "delete", self.switch, check=False)  # (the login link's ends go with it)
        _run("ip", "link", "delete", f"{self.prefix}-login", check=False)
        _unmount_netns_if_made()
        os.remove(self._file(STATE))
        if remove and self.root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._keeper is not None:  # (last: if this is cut short, the keeper finishes it)
            self._keeper.kill()
            self._keeper.wait()
            self._keeper = None

    @classmethod
    def found(cls, root: str) -> TestHosts | None:
        """The bed another process brought up under ``root``, to look into (its hosts' processes,
        addresses); None where none is up there."""
        bed = cls(root, outlives_me=True)
        state = bed._load()
        if state is None:
            return None
        bed.number, bed.names = state["number"], state["names"]
        return bed

    def _running(self, pid: int) -> bool:
        """Whether process ``pid`` runs on (one this process started, and has not waited for yet, is
        reaped here: it runs on no more once it has ended; another's that has ended waits for its parent,
        or init, to reap it, which may take seconds)."""
        ours = next((process for process in self._daemons if process.pid == pid), None)
        return ours.poll() is None if ours is not None else procs.alive(pid) and not _zombie(pid)

    def __enter__(self) -> TestHosts:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _claim(self) -> int:
        """A bed number no other bed has, its switch namespace made here, atomically; tried from a
        random one on, so that a number just given back is seldom taken again at once (a check that
        a bed left nothing, made by its number, then finds another bed's)."""
        start = random.randrange(254)
        for number in (1 + (start + i) % 254 for i in range(254)):
            made = _run("ip", "netns", "add", f"mm{number}-sw", check=False)
            if made.returncode == 0:
                return number
            if "File exists" not in made.stderr:
                raise HostsError(f"ip netns add failed: {made.stderr.strip()}")
        raise HostsError("no free bed number: 254 beds are up (python -m mpi_magic.testing.hosts down)")

    def _save(self) -> None:
        with open(self._file(STATE), "w") as f:
            json.dump({"number": self.number, "names": self.names,
                       "daemons": [process.pid for process in self._daemons]}, f)

    def _load(self) -> dict | None:
        if self.root is None:
            return None
        try:
            with open(self._file(STATE)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _write_files(self) -> None:
        """/etc/hosts and /etc/ssh as every host sees them, the keys, and the ssh for this machine."""
        open(self._file("empty"), "w").close()  # (a host's ~/.bashrc)
        with open(self._file("etc-hosts"), "w") as f:
            f.write("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                    f"{self.login_address}\tlogin\n")
            f.writelines(f"{self.address(name)}\t{name}\n" for name in self.names)
        etc = self._file("etc-ssh")
        os.makedirs(etc, exist_ok=True)
        for key in ("ssh_host_ed25519_key", "id_ed25519"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "mpi_magic test hosts", "-f",
                 os.path.join(etc, key))
        shutil.copy(os.path.join(etc, "id_ed25519.pub"), os.path.join(etc, "authorized_keys"))
        with open(os.path.join(etc, "sshd_config"), "w") as f:
            f.write(f"""\
HostKey {etc}/ssh_host_ed25519_key
AuthorizedKeysFile {etc}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile /run/sshd.pid
MaxStartups 100:30:200
PrintMotd no
UseDNS no
""")
            for name, variables in self.ssh_environment.items():  # (Match blocks last: they run to the end)
                f.write(f"Match LocalAddress {self.address(name)}\n    SetEnv "
                        + " ".join(_quoted_setting(f"{key}={value}") for key, value in variables.items()) + "\n")
        with open(os.path.join(etc, "ssh_config"), "w") as f:  # as the training images set it
            f.writelines(f"Host {name}\n    HostName {self.address(name)}\n" for name in self.names)  # (for this machine)
            f.write(f"""\
Host *
    User root
    IdentityFile {etc}/id_ed25519
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
""")
        with open(self.ssh_agent, "w") as f:
            f.write(f"#!/bin/sh\nexec ssh -F {shlex.quote(os.path.join(etc, 'ssh_config'))} \"$@\"\n")
        os.chmod(self.ssh_agent, 0o755)

    def _make_network(self) -> None:
        """The bridge, each host's namespace, hostname and link, and this machine's login link, in one
        batch of ``ip`` commands per namespace."""
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for name in self.names:
            _run("ip", "netns", "add", self.namespace(name))
        for name in self.names:
            switch += [f"link add {self.port(name)} type veth peer name eth0 netns {self.namespace(name)}",
                       f"link set {self.port(name)} master br0 up"]
        # the login link's far end goes to this process's namespace: this machine's
        switch += [f"link add login type veth peer name {self.prefix}-login netns {os.getpid()}", "link set login master br0 up"]
        _batch(self.switch, switch)
        _run("ip", "addr", "add", f"{self.login_address}/24", "dev", f"{self.prefix}-login")
        _run("ip", "link", "set", f"{self.prefix}-login", "up")
        for name in self.names:
            _batch(self.namespace(name), ["link set lo up", f"addr add {self.address(name)}/24 dev eth0",
                                          "link set eth0 up"])
            anchor = self._file(f"{name}.uts")
            open(anchor, "w").close()
            _run("unshare", f"--uts={anchor}", "hostname", name)

    # -- what runs in a host ----------------------------------------------------------------

    def enter(self, name: str) -> list[str]:
        """The start of a command line that runs the rest in host ``name`` (as root)."""
        return ["nsenter", f"--net=/run/netns/{self.namespace(name)}", f"--uts={self._file(name + '.uts')}", "--",
                "unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", ENTER, "enter"]

    def popen(self, name: str, argv: list[str], env: dict | None = None, **popen) -> subprocess.Popen:
        """``argv`` in host ``name``, with this machine's environment (or ``env``) and ``MM_BED`` for the entry."""
        env = dict(os.environ if env is None else env)
        env.update(MM_BED=self.root, PATH=_path(env.get("PATH", "")))
        return subprocess.Popen(self.enter(name) + list(argv), env=env, **popen)

    def run(self, name: str, argv: list[str], timeout: float = 60, **popen) -> subprocess.CompletedProcess:
        """``argv`` in host ``name``, to its end."""
        process = self.popen(name, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def spawn(self, name: str, argv: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        """A daemon in host ``name``, in a session of its own, with this machine's environment (or ``env``),
        recorded before it runs on (``down`` ends it)."""
        env = {**(os.environ if env is None else env), "MM_BED": self.root, "PATH": _path()}
        with open(self._file(log), "ab") as out:
            process = servers.start(self.enter(name) + list(argv), ends_with_parent=False, stdout=out,
                                    stderr=subprocess.STDOUT, env=env)
        self._daemons.append(process)
        self.started.append(process.pid)
        self._save()
        return process

    def ssh(self, name: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """``command`` on host ``name`` over ssh, from this machine."""
        return subprocess.run([self.ssh_agent, name, command], capture_output=True, text=True, timeout=timeout)

    def pids(self, name: str) -> list[int]:
        """The processes running in host ``name``."""
        return _namespace_pids(self.namespace(name))

    def _wait_for_sshd(self) -> None:
        deadline = time.monotonic() + UP_LIMIT
        waiting = list(self.names)
        while waiting:
            waiting = [name for name in waiting if not _listening(self.address(name), 22)]
            if waiting and time.monotonic() > deadline:
                said = {name: _last_line(self._file(f"sshd-{name}.log")) for name in waiting}
                raise HostsError(f"sshd did not answer on {', '.join(waiting)} within {UP_LIMIT:g}s: "
                                 + "; ".join(f"{name}: {line}" for name, line in said.items()))
            time.sleep(0.01)

    # -- faults -----------------------------------------------------------------------------

    def lose(self, name: str) -> None:
        """Host ``name`` dies as a machine does: its link goes down, so the others get no refusal from
        it, only silence, and every process in it is killed (``kill_all``)."""
        self.cut(name)
        self.kill_all(name)

    def kill_all(self, name: str) -> None:
        """Every process in host ``name`` is killed at once, the host still answering (a connection to
        it is refused at once); returns once none is left (one forked meanwhile is killed too)."""
        deadline = time.monotonic() + STOP_GRACE
        while (pids := self.pids(name)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def cut(self, name: str) -> None:
        """Host ``name``'s link goes down: a partition (its processes live on, unreachable)."""
        _run("ip", "-n", self.switch, "link", "set", self.port(name), "down")

    def mend(self, name: str) -> None:
        """Host ``name``'s link as it was: up (after ``cut``), at full speed (after ``slow``)."""
        _run("ip", "-n", self.switch, "link", "set", self.port(name), "up")
        _run("tc", "-n", self.namespace(name), "qdisc", "del", "dev", "eth0", "root", check=False)

    def slow(self, name: str, rate: str = "20mbit") -> None:
        """Host ``name``'s link sends at ``rate`` (a token bucket, ``tc ... tbf``)."""
        _run("tc", "-n", self.namespace(name), "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
             "burst", "32kb", "latency", "400ms")

    def bytes_sent(self, name: str) -> int:
        """Bytes host ``name`` has sent onto the bridge."""
        shown = json.loads(_run("ip", "-n", self.switch, "-j", "-s", "link", "show", self.port(name)).stdout)
        return shown[0]["stats64"]["rx"]["bytes"]  # (what the bridge's port received came from the host)

    def forward(self, port: int, target: tuple[str, int] | None = None) -> tuple[str, int]:
        """Make ``target`` (a server of this machine's, ``127.0.0.1:port`` by default) reachable from the
        hosts at the login address: a relay of this process's; returns (address, port) for the hosts."""
        forwarder = _Forwarder((self.login_address, port), target or ("127.0.0.1", port))
        self._forwarders.append(forwarder)
        return forwarder.address


class _Forwarder:
    """A TCP relay: connections accepted at ``listen`` are joined to new ones to ``target``."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server(listen)
        self.address = self.listener.getsockname()[:2]
        self.open: set[socket.socket] = set()  # the sockets of the connections being relayed
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._accept, name="mpi_magic test hosts relay", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.open.update((client, upstream))
            thread = threading.Thread(target=self._relay, args=(client, upstream), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions of one connection, to their ends; then its sockets are closed."""
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
        for sock in (client, upstream):
            self.open.discard(sock)
            sock.close()

    def close(self) -> None:
        """No more connections, and those open are cut."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # (what wakes the accept waiting in its thread)
        self.thread.join()  # (no connection is taken from here on)
        self.listener.close()
        for sock in list(self.open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join(timeout=5)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _quoted_setting(text: str) -> str:
    """``text`` as one word of an OpenSSH configuration line (double quotes; no escapes there)."""
    if '"' in text or "\n" in text:
        raise HostsError(f"an ssh setting cannot hold a double quote or a new line: {text!r}")
    return f'"{text}"'


def _listening(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
        return True
    return False


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended, and is only waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def _unmount_netns_if_made() -> None:
    """The last bed down takes down the mount of ``/run/netns`` a bed made: while another bed's
    namespaces are mounted in it, ``umount`` refuses (busy) and the mount stays."""
    made = _netns_mount_made()
    if not os.path.exists(made):
        return
    if not _mounted(NETNS) or _run("umount", NETNS, check=False).returncode == 0:
        with contextlib.suppress(FileNotFoundError):
            os.remove(made)


def _netns_mount_made() -> str:
    """A file there while the mount of ``/run/netns`` is a bed's to take down: one per mount
    namespace, as the mount is (a bed in a namespace of its own neither sees nor takes another's)."""
    return f"/run/mpi_magic-hosts-made-netns-mount.{os.stat('/proc/self/ns/mnt').st_ino}"


def _mounted(path: str) -> bool:
    """Whether something is mounted at ``path`` (a bind mount of a folder onto itself too, which
    ``os.path.ismount`` does not see)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def _namespace_pids(namespace: str) -> list[int]:
    shown = _run("ip", "netns", "pids", namespace, check=False)
    return [int(pid) for pid in shown.stdout.split()] if shown.returncode == 0 else []


def _last_line(path: str) -> str:
    """The last line of a daemon's log (the folder is removed with the bed)."""
    try:
        with open(path, errors="replace") as f:
            return (f.read().strip().splitlines() or ["(nothing)"])[-1]
    except OSError:
        return "(no log)"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PATH": _path()})
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _batch(namespace: str, commands: list[str]) -> None:
    """``ip`` commands in ``namespace``, in one run of ``ip -batch``."""
    done = subprocess.run(["ip", "-n", namespace, "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, env={**os.environ, "PATH": _path()})
    if done.returncode != 0:
        raise HostsError(f"ip -n {namespace}: {done.stderr.strip()}")


def default_root() -> str:
    return os.path.join(tempfile.gettempdir(), "mpi_magic_hosts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpi_magic.testing.hosts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--hosts", type=int, default=4, help="hosts of the bed (up; default 4)")
    parser.add_argument("--root", default=default_root(), help="its folder (default: %(default)s)")
    parser.add_argument("--after", type=int, metavar="PID", help="down: once process PID has ended")
    args = parser.parse_args(argv)
    bed = TestHosts(args.root, args.hosts, outlives_me=True)
    if args.action == "down":
        if args.after:
            import psutil

            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(args.after).wait()
        bed.down()
        return 0
    try:
        bed.up()
    except HostsError as exc:
        print(f"hosts: {exc}", file=sys.stderr)
        return 1
    for name in bed.names:
        print(f"{name}\t{bed.address(name)}\t{' '.join(shlex.quote(a) for a in bed.enter(name)[:3])} ...")
    print(f"ssh: {bed.ssh_agent} HOST COMMAND   (this machine is {bed.login_address} there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
