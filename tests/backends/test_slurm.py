"""--backend slurm against a real Slurm cluster on this machine (Debian's slurmctld, four slurmd
and munge: ``mpi_magic.testing.slurm_cluster``), with Slurm's commands unchanged: cells run as
one batch job over several nodes, the queue is shown while the job waits, every stop leaves
nothing in ``squeue``, and bad input is one sentence before anything is submitted."""

from __future__ import annotations

import math
import os
import re
import signal
import stat
import textwrap
import time

import pytest
from helpers import (SLURM_GONE_WITHIN, killed_kernel_job, needs_hosts, needs_slurm, node_down, once, once_running,
                     ranks_running, resume, run, slurm_listed, slurm_queue, wait_until)

from mpi_magic.backends.slurm import backend, commands
from mpi_magic import SlurmSetupError
from mpi_magic.errors import JobTimeoutError, RankExitError, RemoteRankError

pytestmark = needs_slurm()

def test_a_cell_runs_as_one_batch_job_of_a_node_per_instance(slurm, slurm_cluster):
    slurm.user_ns["base"] = 10
    run(slurm, "--backend slurm -i 2 -g 2 --gather --env OMPI_MCA_btl=self,sm,tcp --out job", textwrap.dedent("""\
        import os
        import mpi_magic
        from mpi4py import MPI
        node = os.environ["SLURMD_NODENAME"]
        transports = (os.environ["OMPI_MCA_btl"], os.environ["OMPI_MCA_mtl"])
        where = (mpi_magic.instance(), os.environ["RANK"], os.environ["LOCAL_RANK"])
        total = base + MPI.COMM_WORLD.allreduce(mpi_magic.rank())
        """))
    assert slurm.user_ns["node"] == ["n1", "n1", "n2", "n2"]
    # mpi_magic.instance() is the node's index in the allocation (Slurm's SLURM_NODEID is that of the step
    # mpirun started its daemons in); RANK and LOCAL_RANK as elsewhere
    assert slurm.user_ns["where"] == [(0, "0", "0"), (0, "1", "1"), (1, "2", "0"), (1, "3", "1")]
    assert slurm.user_ns["total"] == [16] * 4
    assert slurm.user_ns["transports"] == [("self,sm,tcp", "^ofi")] * 4, "the job's own choice of transports wins"
    job = slurm.user_ns["job"]
    assert job.status == "completed" and [r.host for r in job.ranks] == ["n1", "n1", "n2", "n2"]
    # (its batch shell ends at once)
    assert wait_until(lambda: not slurm_listed(slurm_cluster, job.name), SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


@needs_hosts()
@pytest.mark.parametrize("line", ["", "--srun"], ids=["mpirun", "srun"])
def test_the_ranks_run_on_every_node_of_the_allocation_each_a_host_of_its_own(slurm, slurm_cluster, line):
    """On test hosts: two ranks on each node's host, with its name and address, and MPI's bytes between
    the nodes cross the network (an allreduce of 2 MiB: more than that leaves n2), without Open MPI's
    libfabric transports (the nodes have no fabric device)."""
    bed = slurm_cluster.bed
    slurm.user_ns["login"] = bed.login_address
    before = bed.bytes_sent("n2")
    run(slurm, f"--backend slurm -i 2 -g 2 {line} --gather", textwrap.dedent("""\
        import os
        import socket
        import numpy as np
        from mpi4py import MPI
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((login, 9))  # (nothing is sent: the address this host sends from)
            where = (socket.gethostname(), probe.getsockname()[0])
        total = np.zeros(1 << 18)
        MPI.COMM_WORLD.Allreduce(np.ones(1 << 18), total)
        summed = total[0]
        transports = (os.environ.get("OMPI_MCA_btl"), os.environ.get("OMPI_MCA_mtl"))
        """))
    assert slurm.user_ns["where"] == [("n1", bed.address("n1"))] * 2 + [("n2", bed.address("n2"))] * 2
    assert slurm.user_ns["transports"] == [("^ofi", "^ofi")] * 4
    assert slurm.user_ns["summed"] == [4.0] * 4
    assert bed.bytes_sent("n2") - before > 2 << 20


def test_what_slurm_and_the_batch_script_write_is_private_whatever_the_umask(slurm, slurm_cluster, cache_dir):
    """The launcher's output, errors and exit status in the job folder are 0600 like the rest of it, under
    a umask that would let everyone read them (sbatch hands the notebook's umask to the job)."""
    before = os.umask(0)
    try:
        run(slurm, "--backend slurm -i 1 -g 1 --out job", "print('hi')\n")
    finally:
        os.umask(before)
    job_dir = slurm.user_ns["job"].job_dir
    assert {"job.sh", "launcher.out", "launcher.err", "launcher.exit"} <= set(os.listdir(job_dir))
    modes = {}
    for folder, _, files in os.walk(cache_dir):
        modes[folder] = stat.S_IMODE(os.stat(folder).st_mode)
        modes.update({os.path.join(folder, f): stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) for f in files})
    assert {path: oct(mode) for path, mode in modes.items() if mode != (0o700 if os.path.isdir(path) else 0o600)} == {}


def test_srun_starts_the_ranks_through_slurms_pmix(slurm, slurm_cluster):
    run(slurm, "--backend slurm -i 2 -g 2 --srun --gather", textwrap.dedent("""\
        import os
        from mpi4py import MPI
        step = (os.environ["SLURMD_NODENAME"], os.environ["SLURM_STEP_ID"], MPI.COMM_WORLD.allreduce(1))
        """))
    assert [node for node, _, _ in slurm.user_ns["step"]] == ["n1", "n1", "n2", "n2"]
    assert {(step, size) for _, step, size in slurm.user_ns["step"]} == {("0", 4)}  # one job step of 4 tasks


def test_a_waiting_job_shows_slurms_reason_and_a_cancel_removes_it_at_once(slurm, slurm_cluster):
    blocker = slurm_cluster.run("sbatch", "--parsable", "--exclusive", "-N", "4", "--time=2", "--output=/dev/null",
                                "--wrap=sleep 300")
    assert blocker.returncode == 0, blocker.stderr
    submitted = time.time()
    try:
        run(slurm, "--backend slurm -i 2 -g 1 --async --out job", "x = 1")
        job = slurm.user_ns["job"]
        assert wait_until(lambda: job.model.phase == "queued" and job.model.allocation.reason == "Resources", 30), \
            (job.model.phase, job.model.allocation)
        from mpi_magic.view.summary import headline

        assert "queued" in headline(job.model) and "Slurm: Resources" in headline(job.model)
        # the backfill scheduler estimates a start once it has looked (every second here)
        assert wait_until(lambda: job.model.allocation.starts is not None, 20), job.model.allocation
        # when the blocker's two minutes are up (Slurm's estimate, to its whole seconds)
        assert submitted + 100 <= job.model.allocation.starts <= submitted + 121, job.model.allocation.starts - submitted
        assert "starts about" in headline(job.model)
        assert job.model.waiting(threshold=0) is None  # nobody waits for a rank while Slurm has not started them
        started = time.monotonic()
        job.cancel()
        assert wait_until(lambda: job.status == "stopped", 5) and job.model.stop_reason == "cancel"
        assert time.monotonic() - started < 5
        assert wait_until(lambda: not slurm_listed(slurm_cluster, job.name), SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)
    finally:
        slurm_cluster.run("scancel", blocker.stdout.strip())
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], 30)


@pytest.mark.parametrize("line", ["", "--slurm-args --requeue"])
def test_a_failed_node_is_named_with_slurms_reason_and_the_job_never_runs_again(slurm, slurm_cluster, line):
    """Slurm ends the job (NODE_FAIL) as its node goes down; a cell's job is an allocation salloc holds,
    which Slurm never requeues, so the cell never runs again minutes later with nobody watching, even where
    ``--slurm-args`` asks for it (a batch job's word, left out). Its other node, drained for maintenance
    just before, failed nothing, and is not named."""
    def drain():
        slurm_cluster.run("scontrol", "update", "nodename=n1", "state=drain", "reason=maintenance")

    try:
        with once(lambda: ranks_running(slurm), drain, pause=0), \
                node_down(slurm_cluster, "n2", "disk on fire", lambda: ranks_running(slurm)), \
                pytest.raises(RankExitError) as raised:
            run(slurm, f"--backend slurm -i 2 -g 1 {line} --out job", "import time\ntime.sleep(300)")
    finally:
        resume(slurm_cluster, "n1")
    assert str(raised.value) == ("ranks [0, 1] stopped before the cell finished: node n2 of the job failed "
                                 "(NODE_FAIL; Slurm's reason: disk on fire)")
    job = slurm.user_ns["job"]
    assert [r.host for r in job.ranks] == ["n1", "n2"]
    assert wait_until(lambda: not slurm_listed(slurm_cluster, job.name), SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


def _controller(cluster) -> int:
    """slurmctld's pid: SIGSTOP makes it a controller too busy to answer (Slurm's commands wait for
    it), SIGCONT brings it back."""
    with open(os.path.join(cluster.root, "slurmctld.pid")) as f:
        return int(f.read())


def test_ranks_asked_for_their_stacks_while_slurmctld_does_not_answer_still_end_their_cell(slurm, slurm_cluster,
                                                                                           monkeypatch):
    """After stall_after seconds of quiet the ranks are asked for their stacks (scancel --signal=URG)
    while slurmctld is stopped: the ask times out, and the cell ends when its ranks do."""
    monkeypatch.setattr(commands, "CALL_LIMIT", 1.0)
    slurm.run_line_magic("mpirun_config", "stall_after=2")
    controller = _controller(slurm_cluster)

    def unanswered():
        os.kill(controller, signal.SIGSTOP)
        time.sleep(4)  # (the ask comes 2 s after the ranks started, and gives up 1 s later)
        os.kill(controller, signal.SIGCONT)

    with once_running(slurm, unanswered, pause=0):
        run(slurm, "--backend slurm -i 1 -g 1 --timeout 25 --out job", "import time\ntime.sleep(8)\nanswer = 42")
    assert slurm.user_ns["answer"] == 42


def _followed(cluster, folder, *sbatch_args: str, watcher=None):
    """A batch job of ``sbatch_args`` followed as a cell's job is (its folder ``folder``), once squeue
    says it runs: its id, and the ``SlurmJob``."""
    from mpi_magic.backends.slurm.backend import SlurmJob
    from mpi_magic.backends.slurm.queue import WATCHER
    from mpi_magic.shared import wire
    from mpi_magic.shared.events import StreamDecoder

    job_id = cluster.run("sbatch", "--parsable", f"--output={folder}/slurm.out", *sbatch_args).stdout.strip()
    job = SlurmJob(job_id, "followed", str(folder), StreamDecoder(wire.new_token()), watcher=watcher or WATCHER)
    assert wait_until(lambda: job.state is not None and job.state.state == "RUNNING", 30), slurm_queue(cluster)
    return job_id, job


def test_a_requeued_job_that_slurmctld_does_not_cancel_still_ends_saying_so(slurm_cluster, tmp_path, monkeypatch):
    """Slurm requeued the job, and cancelling it (it would run again with nobody watching) meets a
    slurmctld that does not answer (stopped once squeue listed the job back in the queue): the end
    comes all the same, and says how to cancel the job."""
    from mpi_magic.backends.slurm.queue import REQUEUED_STATES, QueueWatcher
    from mpi_magic.shared.events import LauncherExited

    monkeypatch.setattr(commands, "CALL_LIMIT", 1.0)
    controller = _controller(slurm_cluster)

    class StopsTheController(QueueWatcher):
        ran = False

        def _poll(self, job_ids):
            states = super()._poll(job_ids)
            state = (states or {}).get(job_ids[0])
            self.ran = self.ran or (state is not None and state.state == "RUNNING")
            if self.ran and state is not None and state.state in REQUEUED_STATES:
                os.kill(controller, signal.SIGSTOP)
            return states

    watcher = StopsTheController()
    job_id, job = _followed(slurm_cluster, tmp_path, "--requeue", "--wrap", "sleep 300", watcher=watcher)
    try:
        slurm_cluster.run("scontrol", "requeue", job_id)
        watcher.hurry()
        assert job.over.wait(30), "the job's end never came"
        ends = [event for event in job.poll(0) if isinstance(event, LauncherExited)]
    finally:
        os.kill(controller, signal.SIGCONT)
        slurm_cluster.run("scancel", job_id)
    assert [end.reason for end in ends] == [
        "Slurm put the job back in its queue to run it again later, and cancelling it failed: scancel did not "
        f"answer within 1s: is slurmctld up? (scontrol ping says); cancel it with scancel {job_id}"]


def test_a_stopped_job_whose_cancel_slurmctld_does_not_answer_is_cancelled_all_the_same(slurm_cluster, tmp_path,
                                                                                         monkeypatch):
    """Its processes ignore the SIGINT of a stop, and slurmctld does not answer the cancel when the
    grace after it is over (stopped): no thread dies of it, and the job is cancelled once it answers."""
    monkeypatch.setattr(commands, "CALL_LIMIT", 1.0)
    monkeypatch.setattr(backend, "INTERRUPT_GRACE", 1.0)
    controller = _controller(slurm_cluster)
    job_id, job = _followed(slurm_cluster, tmp_path, "--wrap", "trap '' INT; sleep 300")
    try:
        job.cancel()
        os.kill(controller, signal.SIGSTOP)
        time.sleep(3)  # (the cancel 1 s after the SIGINT gives up 1 s later, and is tried again after 1 s)
        os.kill(controller, signal.SIGCONT)
        assert job.over.wait(30), slurm_queue(slurm_cluster)
    finally:
        os.kill(controller, signal.SIGCONT)
        slurm_cluster.run("scancel", job_id)
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)


@pytest.mark.parametrize("line, said", [("--partition short --time 5", "time left 4:"),
                                        ("--partition debug", "no time limit")])  # (MaxTime=INFINITE)
def test_the_time_left_of_the_limit_is_shown_while_it_runs(slurm, slurm_cluster, line, said):
    from mpi_magic.view.summary import headline

    shown = []
    running = lambda: (job := slurm.user_ns.get("job")) is not None and job.model.time_left() is not None  # noqa: E731
    with once(running, lambda: shown.append(headline(slurm.user_ns["job"].model))):
        run(slurm, f"--backend slurm {line} --out job", "import time\ntime.sleep(6)")
    assert shown and said in shown[0], shown


def test_a_killed_kernel_leaves_no_job_in_the_queue_and_nothing_of_it_running(slurm_cluster, tmp_path):
    import psutil

    def running() -> list[str]:  # salloc (its --job-name), the job's script, mpirun and the ranks (its folder)
        found = []
        for process in psutil.process_iter(["cmdline", "status"]):
            command = " ".join(process.info["cmdline"] or [])
            if name in command and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(command)
        return found

    name = killed_kernel_job(slurm_cluster, str(tmp_path), 'ip.run_cell_magic("mpirun_remote", "--backend slurm -i 2 '
                             '-g 1 --async --out job", "import time\\ntime.sleep(300)")', "job")
    assert wait_until(lambda: not slurm_listed(slurm_cluster, name), SLURM_GONE_WITHIN), slurm_queue(slurm_cluster)
    assert wait_until(lambda: not running(), 10), running()


@pytest.mark.parametrize("line, sentence", [
    ("--partition gpus", "there is no partition 'gpus' on this cluster; its partitions: debug (default), short, "
                         "gpu"),
    ("-i 5", "--instances 5 asks for more nodes than partition debug has (4); lower --instances or choose "
             "another --partition"),
    ("--partition short --time 1:00:00", "--time 1:00:00 is over partition short's limit of 10:00; lower --time "
                                         "or choose another --partition"),
    ("--reservation maintenance", "Slurm would refuse the job: allocation failure: Requested reservation is invalid "
                                  "(sbatch --test-only); nothing was submitted"),
    ("--constraint a100", "Slurm would refuse the job: allocation failure: Invalid feature specification "
                          "(sbatch --test-only); nothing was submitted"),
])
def test_what_slurm_can_tell_is_one_sentence_before_anything_is_submitted(slurm, slurm_cluster, cache_dir, line,
                                                                          sentence):
    with pytest.raises(SlurmSetupError) as raised:
        run(slurm, f"--backend slurm {line}", "x = 1")
    assert str(raised.value) == sentence
    assert slurm_queue(slurm_cluster) == []
    assert not os.path.exists(os.path.join(cache_dir, "jobs")) or os.listdir(os.path.join(cache_dir, "jobs")) == []


def test_an_argument_only_sbatch_takes_is_refused_by_salloc_in_one_sentence(slurm, slurm_cluster):
    """sbatch --test-only checks the shape; salloc, which takes a cell's job, refuses an sbatch word itself."""
    with pytest.raises(SlurmSetupError) as raised:
        run(slurm, "--backend slurm --slurm-args --array=1-2", "x = 1")
    assert str(raised.value) == "Slurm refused the job: unrecognized option '--array=1-2'; nothing was submitted"
    assert slurm_queue(slurm_cluster) == []


def test_without_slurms_commands_the_cell_says_where_to_run(slurm, tmp_path):
    path = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)  # no sbatch, squeue, ... (the ranks' Python is named by path)
    try:
        with pytest.raises(SlurmSetupError) as raised:
            run(slurm, "--backend slurm", "x = 1")
    finally:
        os.environ["PATH"] = path
    assert str(raised.value).startswith("no Slurm client on PATH (sbatch not found): run the notebook where")


def test_dry_run_prints_the_script_and_the_salloc_line_and_submits_nothing(slurm, slurm_cluster, capsys):
    run(slurm, "--backend slurm -i 2 -g 2 --time 5 --account physics --slurm-args '--exclusive' --dry-run", "x = 1")
    printed = capsys.readouterr().out
    assert "#!/bin/bash" in printed and "mpirun -np 4 --tag-output" in printed and "-m mpi_magic.runtime" in printed
    salloc_path = slurm_cluster.run("which", "salloc").stdout.strip()
    salloc = next(line for line in printed.splitlines() if line.startswith(salloc_path))
    for word in ("--nodes=2", "--ntasks-per-node=2", "--time=5", "--account=physics", "--exclusive", "/bin/bash"):
        assert f" {word} " in salloc, salloc
    assert "sbatch --test-only: Job " in printed and "to start at" in printed
    assert slurm_queue(slurm_cluster) == []


def test_rank_0s_address_is_the_first_nodes_and_batch_runs_the_cell_as_a_batch_job_on_the_nodes(slurm, slurm_cluster,
                                                                                                 capsys):
    """By default mpirun runs here, under salloc, and the ranks are told the address Slurm reaches the first node
    at; with --batch (where the nodes cannot reach this machine) the cell is a batch job, mpirun on that node."""
    said = slurm_cluster.run("scontrol", "show", "node", "-o", "n1").stdout
    address = re.search(r"NodeAddr=(\S+)", said)[1]
    cell = "import os\nwhere = (os.environ['SLURMD_NODENAME'], os.environ['MASTER_ADDR'])\n"
    run(slurm, "--backend slurm -i 2 -g 1 --gather --quiet", cell)
    assert slurm.user_ns["where"] == [("n1", address), ("n2", address)]
    run(slurm, "--backend slurm -i 2 -g 1 --batch --gather --quiet", cell)
    assert slurm.user_ns["where"] == [("n1", "n1"), ("n2", "n1")], "the first node's own name, from there"
    capsys.readouterr()
    run(slurm, "--backend slurm -i 2 -g 1 --batch --dry-run", "x = 1")
    printed = capsys.readouterr().out
    assert ", run by sbatch on the allocation's first node:" in printed and "\nsbatch line:\n" in printed
    assert re.search(r"^\S*sbatch --parsable --no-requeue .* --nodes=2 ", printed, re.MULTILINE), printed


def test_one_squeue_a_poll_for_every_job_paced_from_2_to_30_seconds(slurm_cluster, monkeypatch):
    from mpi_magic.backends.slurm import commands, queue

    calls = []
    real_run = commands.run

    def counted(name, *args, **kwargs):
        calls.append((time.monotonic(), name, args))
        return real_run(name, *args, **kwargs)

    monkeypatch.setattr(commands, "run", counted)
    ids = [slurm_cluster.run("sbatch", "--parsable", "--output=/dev/null", "--wrap=sleep 20").stdout.strip()
           for _ in range(3)]
    watcher, seen = queue.QueueWatcher(), {}
    try:
        for job_id in ids:
            watcher.watch(job_id, lambda state, job_id=job_id: seen.setdefault(job_id, []).append(state))
        time.sleep(12)
    finally:
        for job_id in ids:
            watcher.forget(job_id)
            slurm_cluster.run("scancel", job_id)
    polls = [args for _, name, args in calls if name == "squeue"]
    assert polls and all(args[args.index("-j") + 1] == ",".join(ids) for args in polls[1:])  # all jobs in each call
    times = [at for at, name, _ in calls if name == "squeue"]
    gaps = [b - a for a, b in zip(times[1:], times[2:])]  # (the first polls come as the jobs are added)
    assert gaps and all(g >= 1.9 for g in gaps) and gaps == sorted(gaps), gaps  # never under 2 s, and slower and slower
    assert len(polls) <= 8, len(polls)
    assert all(seen[job_id][-1].state == "RUNNING" for job_id in ids)
    assert wait_until(lambda: slurm_queue(slurm_cluster) == [], 30)


def test_a_timeout_while_queued_says_the_job_never_left_the_queue(slurm, slurm_cluster):
    blocker = slurm_cluster.run("sbatch", "--parsable", "--exclusive", "-N", "4", "--output=/dev/null",
                                "--wrap=sleep 300")
    try:
        with pytest.raises(JobTimeoutError) as raised:
            run(slurm, "--backend slurm -i 2 -g 1 --timeout 4", "x = 1")
        assert "still waiting in the scheduler's queue, and was cancelled (--timeout counts the wait too)" in \
            str(raised.value)
    finally:
        slurm_cluster.run("scancel", blocker.stdout.strip())


def test_more_tasks_per_node_than_cpus_is_one_sentence(slurm, slurm_cluster):
    with pytest.raises(SlurmSetupError) as raised:
        run(slurm, "--backend slurm --gpus 3", "x = 1")
    assert str(raised.value) == ("--gpus 3 asks for more tasks per node than partition debug's nodes have CPUs (2); "
                                 "lower --gpus, or let tasks share CPUs with --slurm-args --overcommit")


def test_on_a_gpu_partition_gpus_defaults_to_its_gpus_per_node_and_the_job_asks_for_them(slurm, slurm_cluster, capsys):
    """Partition gpu (n3, n4) counts 2 GPUs a node: --gpus defaults to 2 and sbatch gets --gres=gpu:2,
    so Slurm gives each node's ranks its GPUs (CUDA_VISIBLE_DEVICES; no device is real here)."""
    run(slurm, "--backend slurm -i 2 --partition gpu --dry-run", "x = 1")
    assert " --ntasks-per-node=2 --gres=gpu:2 --partition=gpu " in capsys.readouterr().out
    run(slurm, "--backend slurm -i 2 --partition gpu --gather --out job",
        "import os\ngpus = (os.environ['SLURMD_NODENAME'], os.environ.get('CUDA_VISIBLE_DEVICES'))")
    assert slurm.user_ns["job"].world_size == 4
    assert slurm.user_ns["gpus"] == [("n3", "0,1"), ("n3", "0,1"), ("n4", "0,1"), ("n4", "0,1")]


def test_the_clusters_words_read_as_they_are_written():
    from mpi_magic.backends.slurm.cluster import gpu_count
    from mpi_magic.backends.slurm.queue import parse
    from mpi_magic.shared.slurmtime import clock, seconds

    assert [gpu_count(g) for g in ("gpu:8", "gpu:a100:4(S:0-1)", "(null)", "mps:100,gpu:2")] == [8, 4, 0, 2]
    assert [seconds(t) for t in ("30", "30:00", "1:00:00", "2-12", "1-00:00:01", "UNLIMITED", "N/A")] == [
        1800, 1800, 3600, 216000, 86401, None, None]
    assert [clock(s) for s in (65, 3725, 90000)] == ["1:05", "1:02:05", "1-01:00:00"]
    pending, running, unlimited, a_year = parse("7|PENDING|Priority|N/A|1:00:00|1:00:00|\n"
                                                "8|RUNNING|None|2026-12-05T18:40:00|30:00|29:58|n[1-2]\n"
                                                "9|RUNNING|None|2026-12-05T18:40:00|UNLIMITED|365-00:00:00|n1\n"
                                                "10|RUNNING|None|2026-12-05T18:40:00|365-00:00:00|364-23:59:52|n3\n"
                                                ).values()
    assert (pending.state, pending.reason, pending.starts, pending.time_left) == ("PENDING", "Priority", None, 3600)
    assert running.time_left == 1798 and running.starts == time.mktime((2026, 12, 5, 18, 40, 0, 0, 0, -1))
    assert running.nodes == "n[1-2]" and pending.nodes == ""
    # without a limit, squeue's limit is UNLIMITED or a year (Slurm 22.05, MaxTime=INFINITE), counting down
    assert unlimited.time_left == a_year.time_left == math.inf
    infinite, beyond, invalid, not_set, unreadable = parse("12|RUNNING|None|N/A|INFINITE|INFINITE|n1\n"
                                                           "13|RUNNING|None|N/A|400-00:00:00|399-23:59:00|n1\n"
                                                           "14|RUNNING|None|N/A|INVALID|INVALID|n1\n"
                                                           "15|RUNNING|None|N/A|NOT_SET|NOT_SET|n1\n"
                                                           "16|RUNNING|None|N/A|N/A|N/A|n1\n").values()
    assert infinite.time_left == beyond.time_left == math.inf
    assert invalid.time_left is not_set.time_left is unreadable.time_left is None, "unknown, not \"no time limit\""
    a_year_ahead = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 365 * 86400))
    (unplanned,) = parse(f"11|PENDING|Resources|{a_year_ahead}|1:00:00|1:00:00|\n").values()
    assert unplanned.starts is None, "Slurm's year-ahead estimate means it cannot plan the job: not shown"


def test_a_node_failure_names_each_node_down_with_slurms_reason():
    from mpi_magic.backends.slurm.backend import node_failure

    assert node_failure({"n2": "Not responding", "n3": "Not responding"}) == (
        "nodes n2, n3 of the job failed (NODE_FAIL; Slurm's reason: Not responding)")
    assert node_failure({"n2": "Not responding", "n3": "Kill task failed"}) == (
        "nodes n2, n3 of the job failed (NODE_FAIL; Slurm's reasons: n2: Not responding; n3: Kill task failed)")
    assert node_failure({}) == "a node of the job failed (NODE_FAIL)"  # (sinfo no longer holds it down)


def test_the_nodes_whose_daemon_mpirun_lost_are_named_from_its_own_words():
    """As Open MPI 5's mpirun says it (and Open MPI 4's, ORTE's), for each node it lost (tests/backends/
    test_slurm_faults.py loses one for real)."""
    from mpi_magic.backends.launcher import lost_hosts
    from mpi_magic.backends.slurm.backend import lost_nodes

    def said(runtime: str, daemon: str, node: str) -> str:
        return (f"{runtime} has lost communication with a remote daemon.\n\n  HNP daemon   : {daemon}0] on node n1\n"
                f"  Remote daemon: {daemon}1] on node {node}\n\nThis is usually due to either a failure of the TCP "
                "network\nconnection to the node, ...\n")

    assert lost_hosts(said("PRTE", "[prterun-n1-11872@0,", "n2")) == {"n2": "n1"}
    both = lost_hosts(said("ORTE", "[[53209,0],", "n2") + said("ORTE", "[[53209,0],", "n3"))
    assert lost_nodes(both) == "nodes n2, n3 stopped answering mpirun on n1 (lost, or cut off)"
    assert lost_hosts("Primary job terminated normally, but 1 process returned a non-zero exit code.") == {}


def test_a_flood_of_output_arrives_whole_and_in_order_through_the_job_folder(slurm, slurm_cluster):
    """Far more than one look reads (64 KiB x 64): the launcher's file is read on, line by line."""
    run(slurm, "--backend slurm -i 1 -g 2 --quiet --out job",
        "import mpi_magic\nfor i in range(300_000):\n    print(mpi_magic.rank(), i, 'x' * 40)")
    for rank in (0, 1):
        lines = slurm.user_ns["job"].logs(rank).splitlines()
        assert [line.split()[:2] for line in lines[:2]] == [[str(rank), "0"], [str(rank), "1"]]
        assert len(lines) == 300_000 and lines[-1].split()[:2] == [str(rank), "299999"]


def test_the_folder_of_a_job_still_followed_is_not_pruned(slurm, slurm_cluster, cache_dir):
    """Its ranks write their results there: newer cells' pruning spares it while this kernel follows it."""
    slurm.run_line_magic("mpirun_config", "keep_jobs=2")
    run(slurm, "--backend slurm -i 2 -g 1 --async --out job", "import time\ntime.sleep(6)\nanswer = 42")
    job = slurm.user_ns["job"]
    for _ in range(3):
        run(slurm, "--quiet", "pass")  # local cells, each pruning the oldest folders
    assert os.path.isdir(job.job_dir)
    job.wait()
    assert slurm.user_ns["answer"] == 42
    for _ in range(2):  # (its folder changed last: it is the newest of the old ones until then)
        run(slurm, "--quiet", "pass")
    assert not os.path.isdir(job.job_dir), "once it has ended, its folder is pruned like any other"


def test_a_slurm_job_reopens_in_a_new_python_from_its_folder_in_the_shared_cache(slurm, slurm_cluster, cache_dir):
    from helpers import job_facts, reopened_facts

    with pytest.raises(RemoteRankError):
        run(slurm, "--backend slurm -i 2 -g 1 --out job", textwrap.dedent("""\
            import mpi_magic
            from mpi4py import MPI
            for step in mpi_magic.progress(range(4)):
                mpi_magic.log(loss=1.0 / (step + 1))
            print("on", mpi_magic.instance())
            MPI.COMM_WORLD.barrier()  # (rank 1 fails once rank 0 has logged: the job then stops the rest)
            if mpi_magic.rank() == 1:
                raise ValueError("bad shard")
            """))
    job = slurm.user_ns["job"]
    seen = job_facts(job)
    assert seen["status"] == "failed" and "raised ValueError: bad shard" in seen["summary"]
    assert seen["metrics"]["0"]["loss"][-1] == [3, 0.25] and seen["logs"]["1"].startswith("on 1\n")
    assert reopened_facts(cache_dir, job.name) == seen


def test_an_exported_slurm_job_runs_from_bash_as_a_job_of_the_same_shape(slurm, slurm_cluster, cache_dir,
                                                                               tmp_path):
    import pickle
    import subprocess
    import sys

    slurm.user_ns["base"] = 10
    run(slurm, "--backend slurm -i 2 -g 1 --gather --out job", textwrap.dedent("""\
        import os
        import mpi_magic
        from mpi4py import MPI
        node = os.environ["SLURMD_NODENAME"]
        total = base + MPI.COMM_WORLD.allreduce(mpi_magic.rank())
        print("rank", mpi_magic.rank(), "on", node)
        """))
    folder = tmp_path / "exported"
    slurm.run_line_magic("mpirun_export", f"--to {folder}")
    launch = (folder / "launch.txt").read_text()
    assert launch.startswith(f"script {folder}/job.sh, run here by salloc in the allocation:\n#!") and \
        "--nodes=2" in launch
    done = subprocess.run(["bash", str(folder / "run.sh")], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHON": sys.executable, "MPI_MAGIC_CACHE_DIR": cache_dir})
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] rank 0 on n1", "[rank 1] rank 1 on n2"]
    with open(folder / "results.pickle", "rb") as f:
        assert pickle.load(f) == {name: slurm.user_ns[name] for name in ("node", "total")}
    assert "(slurm, 2 x 1) completed" in done.stderr


@pytest.mark.parametrize("lines, said, shown", [
    (["salloc: Granted job allocation 5", "salloc: Relinquishing job allocation 5",
      "salloc: Job allocation 5 has been revoked."], None, []),  # it ended; salloc gave the allocation back
    (["salloc: Granted job allocation 5", "salloc: Job allocation 5 has been revoked."], backend.REVOKED,
     ["salloc: Job allocation 5 has been revoked."]),  # scancel from elsewhere: squeue may say more
    (["salloc: Pending job allocation 5", "salloc: job 5 queued and waiting for resources",
      "salloc: job 5 has been allocated resources", "salloc: Granted job allocation 5",
      "salloc: error: Node failure on n2", "salloc: Job allocation 5 has been revoked."], "NODE_FAIL",
     ["salloc: error: Node failure on n2", "salloc: Job allocation 5 has been revoked."]),
    (["salloc: Granted job allocation 5",
      "salloc: Job 5 has exceeded its time limit and its allocation has been revoked."], "TIMEOUT",
     ["salloc: Job 5 has exceeded its time limit and its allocation has been revoked."]),
    (["srun: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-12-05T18:35:45 DUE TO TIME LIMIT ***"], "TIMEOUT",
     ["srun: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-12-05T18:35:45 DUE TO TIME LIMIT ***"]),
], ids=["ended", "revoked", "node-failure", "time-limit", "stepd"])
def test_salloc_s_words_are_read_as_slurm_means_them(lines, said, shown):
    """What salloc writes on its errors, line by line as the job follows it: its news is not shown as the
    launcher's, and what remains says how Slurm ended the job."""
    kept, relinquished = [], False
    for line in lines:
        news, relinquished = backend.salloc_news(line, relinquished)
        if not news:
            kept.append(line)
    assert kept == shown
    assert backend.said_in(kept) == said
