"""Entrypoint of every instance of an mpi_magic SageMaker training job.

Standard library only until the job's code (this client's mpi_magic) is unpacked; after that
the ranks' events are read with mpi_magic's own decoder, never a copy of the wire format. The
names of mpi_magic's variables (``shared/envvars.py``) and how its ssh reaches other hosts
(``shared/remote_hosts.py``) are inlined into the copy an instance runs
(``package.bootstrap_source``), as nothing of mpi_magic is importable there yet.

The first host leads: it waits until every other host answers over ssh, writes a hostfile
with ``slots=<processes per instance>``, and runs ``mpirun`` over all of them, forwarding the
job's environment with ``-x``. The other hosts start sshd and wait to be released. Whatever
happens, the leader releases them, exits with mpirun's status, and on failure writes the
reason where SageMaker reads it (``output/failure``). mpirun's status 0 is not the ranks' word:
Open MPI 5's mpirun exits with 0 when it loses a host, so the job has failed unless every rank
finished its cell (or, in a session, rank 0 closed it), and a worker that cannot be released
stopped answering (lost, or cut off), which the failure names.

Honours ``SAGEMAKER_BASE_DIR`` (the SageMaker training toolkit's convention) instead of
``/opt/ml``; ``MPI_MAGIC_SSH_AGENT`` names the ssh command mpirun uses (default ``ssh``).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time

from mpi_magic.shared import envvars  # an instance's copy has the module inlined here
from mpi_magic.shared import remote_hosts  # an instance's copy has the module inlined here

BASE = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
CODE_DIR = os.path.join(BASE, "mpi_magic_code")
CODE_CHANNEL, PAYLOAD_CHANNEL = "code", "payload"  # the job's input channels, under input/data
CODE_ARCHIVE = "mpi_magic_code.tar.gz"
REQUIREMENTS = "requirements.txt"  # installed on every instance before the ranks start
SAID = "mpi_magic bootstrap: "
ANNOUNCED_MPIRUN = SAID + "mpirun (Open MPI) "
ALL_RELAYED = SAID + "every line of mpirun's output is above"  # the notebook need not wait for more
TOLD_TO_STOP = SAID + "told to stop (SIGTERM): stopping the ranks"  # a stop, or a spot interruption
UNREACHABLE = SAID + "stopped answering: "  # then the sentence naming the workers that could not be released
# A worker looks every LEADER_LOOK seconds whether its leader still answers over ssh, and takes it for
# gone (lost, or cut off) once it has not for LEADER_SILENCE seconds: longer than the leader takes to give
# up on a silent worker (ssh's alive checks, then one try to release it), so that across a partition
# the leader, which knows more, speaks first.
LEADER_LOOK = 3.0
LEADER_SILENCE = (remote_hosts.ALIVE_COUNT + 1) * remote_hosts.ALIVE_INTERVAL + remote_hosts.CONNECT_TIMEOUT + 6  # 20 s
# A worker's sshd may refuse for a moment: one whose ssh failed at once is asked again, up to
# RELEASE_TRIES times in all while a whole try fits in RELEASE_LIMIT; a silent one, once.
RELEASE_TRIES = 3
RELEASE_PAUSE = 1.0  # seconds between tries
RELEASE_LIMIT = remote_hosts.CONNECT_TIMEOUT + 3  # seconds
RELEASE_FILE = "mpi_magic_release"
RELEASE_COMMAND = 'touch "${SAGEMAKER_BASE_DIR:-/opt/ml}/%s"' % RELEASE_FILE
FORWARDED_PREFIXES = ("AWS_", envvars.PREFIX, "NCCL_", "FI_", "OMP_", "OMPI_", "SM_", "PYTHON", "CUDA_", "LD_LIBRARY_PATH", "PATH")
NOT_FORWARDED = {"SAGEMAKER_BASE_DIR", envvars.SSH_AGENT, "PYTHONPATH", envvars.HOST}
# Each rank finds its own instance's copy of the code and payload, wherever its base dir is; the
# ranks of a session job (which names its S3 channel) wait for cells instead of running one.
RANK_LAUNCH = (
    "import os, sys; base = os.environ.get('SAGEMAKER_BASE_DIR', '/opt/ml'); "
    "sys.path.insert(0, os.path.join(base, 'mpi_magic_code')); "
    "from mpi_magic.runtime import cell_loop, rank; "
    "sys.exit(cell_loop.main(['--s3']) if os.environ.get(%r) else "
    "rank.main([os.path.join(base, 'input', 'data', %r)] + sys.argv[1:]))" % (envvars.SESSION_URI, PAYLOAD_CHANNEL)
)


def say(text):
    print(SAID + text, flush=True)


def announced_tag_style(line):
    """The tag style of the ranks' lines, from the leader's line naming its mpirun; else None."""
    if not line.startswith(ANNOUNCED_MPIRUN):
        return None
    return "openmpi4" if line[len(ANNOUNCED_MPIRUN):].startswith("4.") else "openmpi5"


def main():
    with open(os.path.join(BASE, "input", "config", "resourceconfig.json")) as f:
        config = json.load(f)
    hosts, current = config["hosts"], config["current_host"]
    leading = current == hosts[0]
    start_sshd()  # the leader too: Open MPI may reach its own host over ssh
    try:
        unpack_code()
        install_requirements()
    except Exception as exc:  # noqa: BLE001 - reported where SageMaker shows it, workers released
        if leading:
            release(hosts[1:], os.environ.get(envvars.SSH_AGENT, "ssh"))
        return fail("%s on %s: %s: %s" % ("preparing", current, type(exc).__name__, exc))
    if not leading:
        return serve(hosts[0], current, os.environ.get(envvars.SSH_AGENT, "ssh"))
    return lead(hosts, config.get("network_interface_name"))


def start_sshd():
    if os.environ.get(envvars.SSH_AGENT, "ssh") == "ssh" and os.path.exists("/usr/sbin/sshd"):
        subprocess.run(["/usr/sbin/sshd"], check=False)


def fail(reason):
    with open(os.path.join(BASE, "output", "failure"), "w") as f:
        f.write(reason[:1000])
    say("failed: " + reason)
    return 1


def unpack_code():
    archive = os.path.join(BASE, "input", "data", CODE_CHANNEL, CODE_ARCHIVE)
    os.makedirs(CODE_DIR, exist_ok=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(CODE_DIR, filter="data")
        else:  # Python without extraction filters: the archive holds only regular files we wrote
            tar.extractall(CODE_DIR)
    sys.path.insert(0, CODE_DIR)


def install_requirements():
    requirements = os.path.join(BASE, "input", "data", CODE_CHANNEL, REQUIREMENTS)
    if os.path.exists(requirements):
        say("installing requirements.txt")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-r", requirements], check=True)


def serve(leader, current, agent):
    """A worker: let the leader's mpirun in over ssh, then wait until it releases us, or until the
    leader stops answering over ssh (lost, or cut off), when no release can come."""
    limit = time.monotonic() + float(os.environ.get(envvars.MAX_WAIT, "432000"))
    release = os.path.join(BASE, RELEASE_FILE)
    say("waiting for %s to finish" % leader)
    next_look = answered = time.monotonic()
    while not os.path.exists(release):
        if time.monotonic() > limit:
            say("the leader never released this instance")
            return 1
        if time.monotonic() >= next_look:
            looked_at = time.monotonic()
            answered = looked_at if answers(agent, leader) else answered
            if time.monotonic() - answered >= LEADER_SILENCE and not os.path.exists(release):
                from mpi_magic.shared.unreachable import stopped_answering  # the job's code, unpacked by now

                return fail(stopped_answering("instance", [leader], current))
            next_look = time.monotonic() + LEADER_LOOK
        time.sleep(0.5)
    say("released")
    return 0


def answers(agent, host):
    """Whether ``host`` answers over ssh now (within ``remote_hosts.CONNECT_TIMEOUT``)."""
    return subprocess.run(ssh(agent, host, "true"), capture_output=True).returncode == 0


def lead(hosts, interface=None):
    agent = os.environ.get(envvars.SSH_AGENT, "ssh")
    workers = hosts[1:]
    mpirun = None
    relayed = relay_state()
    unfinished, all_relayed = "", False
    try:
        wait_for(workers, agent)
        per_host = int(os.environ[envvars.PROCS_PER_INSTANCE])
        hostfile = os.path.join(BASE, "mpi_magic_hostfile")
        with open(hostfile, "w") as f:
            f.writelines("%s slots=%d\n" % (host, per_host) for host in hosts)
        argv = mpirun_argv(find_mpirun(), agent, hostfile, per_host * len(hosts), interface)
        if os.geteuid() == 0:  # containers run as root; Open MPI refuses that unless told
            os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
            os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        say("running " + " ".join(shlex.quote(a) for a in argv))
        mpirun = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        signal.signal(signal.SIGTERM, lambda *_: stop(mpirun))
        failures: list = []  # a RankFailure for each rank that raised
        relay = threading.Thread(target=relay_output, args=(mpirun.stdout, failures, relayed), daemon=True)
        relay.start()
        watch = threading.Thread(target=ask_for_stacks, args=(mpirun,), daemon=True)
        watch.start()
        status = mpirun.wait()
        relayed["at"] = time.monotonic()  # from here on, half a second without a line means none is left
        # What mpirun wrote before it exited is read within moments; a daemon left behind may hold
        # the pipe open, but no rank's output can come through it once mpirun is gone.
        until = time.monotonic() + 10
        while relay.is_alive() and time.monotonic() < until and time.monotonic() - relayed["at"] < 0.5:
            relay.join(timeout=0.1)
        all_relayed = not relay.is_alive() or time.monotonic() < until
        failure = first_failure(failures)
        unfinished = unfinished_ranks(relayed, per_host * len(hosts), per_host, hosts)
    except Exception as exc:  # noqa: BLE001 - the reason goes where SageMaker shows it
        failure, status = "%s: %s" % (type(exc).__name__, exc), 1
    finally:
        silent = release(workers, agent)
    lost = unreachable_sentence(silent, hosts[0]) if silent else ""
    # the instances that stopped answering come before ALL_RELAYED, so a reader that stops there has them
    ending = ([UNREACHABLE + lost] if lost else []) + ([ALL_RELAYED] if all_relayed else [])
    if ending:
        print(("" if relayed["whole_lines"] else "\n") + "\n".join(ending), flush=True)  # lines of their own
    if lost:
        return fail("; ".join(filter(None, [lost, failure])))
    if status != 0:
        return fail(failure or "mpirun exited with status %d" % status)
    if unfinished:
        return fail(unfinished + ", though mpirun exited with status 0")
    return 0


def unfinished_ranks(relayed, world_size, per_host, hosts):
    """What of the ranks' work did not end as it should, in a few words ("" if it all did): a session
    ends when rank 0 closes it; a cell when every rank has finished it."""
    if os.environ.get(envvars.SESSION_URI):
        return "" if relayed["closed"] else "the session's ranks ended without rank 0 closing the session"
    missing = [rank for rank in range(world_size) if rank not in relayed["finished"]]
    if not missing:
        return ""
    where = sorted({hosts[rank // per_host] for rank in missing}, key=hosts.index)
    return "ranks %s on %s never finished the cell" % (", ".join(map(str, missing)), ", ".join(where))


def unreachable_sentence(workers, leader):
    """The sentence naming the workers the leader could not reach at the end (``UNREACHABLE`` follows it)."""
    from mpi_magic.shared.unreachable import stopped_answering  # the job's code, unpacked by now

    return stopped_answering("instance", workers, leader)


def unreachable_in(line):
    """The sentence of an ``UNREACHABLE`` line of the leader's log; None for any other line."""
    return line[len(UNREACHABLE):].strip() if line.startswith(UNREACHABLE) else None


def ask_for_stacks(mpirun, nap=1.0):
    """Ask every rank for its stack whenever the notebook asks (``StackRequests``: at a stall, which
    the notebook's follower decides, on Ctrl-C, or %mpirun_stacks): mpirun forwards the signal to the
    ranks on every instance, and each sends its stack as an event through this log
    (``shared/stacks.py``); ranks that have not started yet ignore it."""
    from mpi_magic.shared import stacks  # the job's code, unpacked by now

    requests = StackRequests(os.environ.get(envvars.RESULTS_URI, ""))
    fallback_due = None
    while mpirun.poll() is None:
        time.sleep(nap)
        try:
            if fallback_due is not None and time.monotonic() >= fallback_due:
                fallback_due = None  # the second way, which ranks that answered the first drop
                mpirun.send_signal(getattr(signal, stacks.FALLBACK_NAME))
            if requests.new():
                mpirun.send_signal(getattr(signal, stacks.SIGNAL_NAME))
                fallback_due = time.monotonic() + stacks.FALLBACK_AFTER
        except OSError:
            return


class StackRequests:
    """The notebook's requests for the ranks' stacks: an object it writes under the job's results
    (``layout.stacks_request_uri``), read every ``EVERY`` seconds while ranks run; a request is
    the object written since this instance started, with a body (the notebook's time) other than
    the last one taken."""

    EVERY = 2.0

    def __init__(self, results_uri):
        self.uri, self.s3, self.started, self.taken, self.next = results_uri, None, time.time() - 5, b"", 0.0

    def new(self):
        if not self.uri or time.monotonic() < self.next:
            return False
        self.next = time.monotonic() + self.EVERY
        from mpi_magic.shared.layout import split_s3, stacks_request_uri

        bucket, key = split_s3(stacks_request_uri(self.uri))
        try:
            if self.s3 is None:
                import boto3

                self.s3 = boto3.client("s3")
            found = self.s3.get_object(Bucket=bucket, Key=key)
            written, body = found["LastModified"].timestamp(), found["Body"].read(100)
        except Exception as exc:  # noqa: BLE001 - none yet (404), or none can be read
            status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status != 404:
                say("the notebook's requests for the ranks' stacks cannot be read (%s: %s); the ranks will not "
                    "be asked where they are" % (type(exc).__name__, exc))
                self.uri = ""
            return False
        if written < self.started or body == self.taken:
            return False
        self.taken = body
        return True


def stop(mpirun):
    """SageMaker stops the container (StopTrainingJob, or a spot interruption): say so, then stop mpirun."""
    print(TOLD_TO_STOP, flush=True)
    mpirun.send_signal(signal.SIGTERM)


def on_each(hosts, action):
    """``action(host)`` for every host at once; the hosts for which it did not return True, in order."""
    done = {}
    threads = [threading.Thread(target=lambda host=host: done.update({host: action(host)}), daemon=True)
               for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [host for host in hosts if done.get(host) is not True]


def ssh(agent, host, command):
    """The command line that runs ``command`` on ``host`` through ``agent``, giving up on a silent host."""
    return shlex.split(agent) + remote_hosts.SSH_OPTIONS + [host, command]


def wait_for(workers, agent, limit=600.0):
    deadline = time.monotonic() + limit

    def answering(host):
        while not answers(agent, host):
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True

    silent = on_each(workers, answering)
    if silent:
        raise RuntimeError("instance%s %s did not answer over ssh within %ds"
                           % ("s" if len(silent) > 1 else "", ", ".join(silent), limit))


def release(workers, agent):
    """Tell every worker at once that the job is over (``RELEASE_TRIES``); the workers that could not be told."""
    def tell(host):
        deadline = time.monotonic() + RELEASE_LIMIT
        for tries_left in reversed(range(RELEASE_TRIES)):
            try:
                told = subprocess.run(ssh(agent, host, RELEASE_COMMAND), capture_output=True,
                                      timeout=max(deadline - time.monotonic(), 1))
                said = told.stderr.decode("utf-8", errors="replace").strip().splitlines()
                why = "%s exited with status %d%s" % (agent, told.returncode, ": " + said[-1] if said else "")
            except (OSError, subprocess.SubprocessError) as exc:
                told, why = None, str(exc)
            if told is not None and told.returncode == 0:
                return True
            if not tries_left or time.monotonic() + RELEASE_PAUSE + remote_hosts.CONNECT_TIMEOUT > deadline:
                break
            time.sleep(RELEASE_PAUSE)
        say("could not release %s: %s" % (host, why))
        return False

    return on_each(workers, tell)


def find_mpirun():
    for path in (os.environ.get(envvars.MPIRUN), "/opt/amazon/openmpi/bin/mpirun"):
        if path and os.access(path, os.X_OK):
            return path
    return "mpirun"


def mpirun_argv(mpirun, agent, hostfile, world_size, interface=None):
    """mpirun's command line for this Open MPI (4 or 5): every host of the hostfile, the job's
    environment forwarded, and Open MPI, its daemons and NCCL kept on ``interface``."""
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    # Open MPI 4 says "(OpenRTE)" when its mpirun is called by another name, as the images' wrapper does
    match = re.search(r"\((?:Open MPI|OpenRTE)\) (\d+)\.", version)
    if not match:
        raise RuntimeError("%s is not Open MPI's mpirun (the SageMaker training images ship Open MPI under "
                           "/opt/amazon/openmpi); set MPI_MAGIC_MPIRUN to one" % mpirun)
    print(ANNOUNCED_MPIRUN + version.split(")", 1)[1].strip().splitlines()[0], flush=True)
    major = int(match.group(1))
    if major >= 5:
        launch = ["--prtemca", "plm_ssh_agent", agent, "--prtemca", "plm_ssh_no_tree_spawn", "1"]
    else:
        launch = ["--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1", "--allow-run-as-root"]
    user_names = set(os.environ.get(envvars.ENV_NAMES, "").split())  # the cell's --env
    forwarded = sorted(
        name for name in os.environ
        if (name.startswith(FORWARDED_PREFIXES) or name in user_names) and name not in NOT_FORWARDED
    )
    exports = [arg for name in forwarded for arg in ("-x", name)]
    user_args = shlex.split(os.environ.get(envvars.MPIRUN_ARGS, ""))
    launch += remote_hosts.ssh_args(major, user_args)
    if interface:
        launch += network_args(major, interface, user_args)
        if "NCCL_SOCKET_IFNAME" not in os.environ:  # the job's own (--env) is forwarded above and wins
            exports += ["-x", "NCCL_SOCKET_IFNAME=" + interface]
    launch += ["--bind-to", "none"]  # a rank and its data-loader threads may use every core, as in the toolkit
    launch += forwarded_signals(major, user_args)
    launch += fabric_args(user_args)
    launch += user_args
    digest = os.environ.get(envvars.PAYLOAD_DIGEST, "")
    results = os.environ.get(envvars.RESULTS_URI, "")
    return [mpirun, "--hostfile", hostfile, "-np", str(world_size), "--tag-output", *launch, *exports,
            sys.executable, "-c", RANK_LAUNCH, "--digest", digest, "--results", results]


def network_args(major, interface, user_args=()):
    """Keep MPI traffic and the launch daemons' own channel on the network SageMaker names in
    ``network_interface_name``, as the SageMaker SDK's mpirun does (btl_tcp_if_include,
    oob_tcp_if_include, NCCL_SOCKET_IFNAME; sagemaker/core/modules/train/container_drivers/
    distributed_drivers/mpi_utils.py, get_mpirun_command): on hosts with several interfaces (docker bridges,
    EFA devices) Open MPI may otherwise pick one the other hosts cannot reach, and hang.
    Open MPI 5's daemons are PRRTE's, where the out-of-band setting is ``prte_if_include``
    (``oob_tcp_if_include`` survives there only as a deprecated synonym). A parameter the user's
    --mpirun-args or the environment (``OMPI_MCA_*``, ``PRTE_MCA_*``) set is theirs, an exclude as much
    as an include: Open MPI refuses one given twice, and an include beside an exclude."""
    daemons = ["--prtemca", "prte_if_include"] if major >= 5 else ["--mca", "oob_tcp_if_include"]
    theirs = [*user_args, *(name.lower() for name in os.environ if name.startswith(("OMPI_MCA_", "PRTE_MCA_")))]
    args = []
    for flag_and_name, names in ((["--mca", "btl_tcp_if_include"], ("btl_tcp_if_",)),
                                 (daemons, ("oob_tcp_if_", "prte_if_"))):
        if not any(name in arg for arg in theirs for name in names):
            args += flag_and_name + [interface]
    return args


def forwarded_signals(major, user_args=()):
    """mpirun forwards both of the stack requests' signals to the ranks on every instance."""
    from mpi_magic.shared import stacks  # the job's code, unpacked by now

    return stacks.forwarding_args(major, user_args)


def fabric_args(user_args=()):
    """Open MPI's libfabric transports left out on instances without a fabric device (EFA): there
    they would only slow each rank's start (``mpi_magic.shared.fabric``)."""
    from mpi_magic.shared import fabric  # the job's code, unpacked by now

    return fabric.mca_args(user_args, os.environ)


def first_failure(failures):
    """The failure to give SageMaker: the rank that failed first, as the notebook names it."""
    from mpi_magic.errors import first_failed_first  # the job's code, unpacked by now

    first = first_failed_first(failures)[0] if failures else None
    return first and "rank %d raised %s: %s" % (first.rank, first.error_type, first.message)


def relay_state():
    """What ``relay_output`` notes of mpirun's output, before its first line."""
    now = time.monotonic()
    return {"at": now, "whole_lines": True, "finished": set(), "closed": False}


def relay_output(output, failures, relayed):
    """Copy mpirun's output to this instance's log; note the ranks that failed (and when, by this
    instance's clock: ``ClockOffsets``), when the last line came (``relayed["at"]``), whether it ended
    in a newline, which ranks finished a cell (``relayed["finished"]``) and whether rank 0 closed the
    session (``relayed["closed"]``)."""
    from mpi_magic.errors import RankFailure  # the job's code, unpacked by now
    from mpi_magic.shared.events import ClockOffsets, RankFinished, RankStarted, SessionClosing, StreamDecoder

    clocks, instance_of = ClockOffsets(), {}

    # Open MPI 4's tags differ from 5's by a space the events do not depend on
    decoder = StreamDecoder(os.environ.get(envvars.EVENT_TOKEN, ""))
    for raw in iter(output.readline, b""):
        relayed["at"], relayed["whole_lines"] = time.monotonic(), raw.endswith(b"\n")
        line = raw.decode("utf-8", errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        for event in decoder.feed(line):
            if isinstance(event, RankStarted):
                instance_of[event.rank] = event.instance
            instance = instance_of.get(getattr(event, "rank", -1), -1)
            clocks.heard(instance, getattr(event, "time", 0.0), relayed["at"])
            if isinstance(event, SessionClosing):
                relayed["closed"] = True
            if isinstance(event, RankFinished):
                relayed["finished"].add(event.rank)
                if not event.ok:
                    failures.append(RankFailure(event.rank, instance, error_type=event.error_type,
                                                message=event.message, at=clocks.ours(instance, event.time)))


if __name__ == "__main__":
    sys.exit(main())
