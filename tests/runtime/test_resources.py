"""Each rank's resources, sampled on the rank: the sampler's rules on a scripted clock, its thread
for real, the GPU figures through a stand-in for NVML (no GPU here), and real jobs and a session
reporting them."""

from __future__ import annotations

import _thread
import os
import sys
import time

import psutil
import pytest
from helpers import run, start_session, wait_until

from mpi_magic.runtime import resources
from mpi_magic.shared import envvars, wire
from mpi_magic.runtime.resources import BUDGET, GpuReader, Sampler, interval, news, open_gpu, visible_devices

GIB, MIB = 1 << 30, 1 << 20


class Scripted:
    """A clock, CPU seconds and resident bytes that the test moves on by hand."""

    def __init__(self):
        self.now, self.cpu, self.rss = 100.0, 5.0, 100 * MIB

    def sampler(self, sent: list, **kwargs) -> Sampler:
        sampler = Sampler(lambda **figures: sent.append(figures), clock=lambda: self.now, cpu_seconds=lambda: self.cpu,
                          resident=lambda: self.rss, **kwargs)
        sampler._last = (self.now, self.cpu)  # as ``run`` starts it
        return sampler

    def wait(self, seconds: float, busy: float) -> None:
        """``seconds`` pass, ``busy`` of a core used meanwhile."""
        self.now += seconds
        self.cpu += seconds * busy


def test_the_interval_is_a_second_at_the_least_and_zero_turns_sampling_off():
    assert [interval(text) for text in (None, "", " ", "1", "2.5", "0.1", "abc", "nan", "0", "0.0", "off", "OFF")] == \
        [1.0, 1.0, 1.0, 1.0, 2.5, 1.0, 1.0, 1.0, None, None, None, None]


def test_a_sample_is_sent_the_first_time_and_then_only_when_a_figure_moved_noticeably():
    scripted, sent = Scripted(), []
    sampler = scripted.sampler(sent)
    scripted.wait(1.0, busy=0.973)
    assert sampler.tick() and sent == [{"cpu": 97.3, "rss": 100 * MIB, "gpu_memory": None, "gpu_util": None}]
    for busy in (1.0, 0.9, 1.06):  # a busy rank's CPU wanders by a few points: no news
        scripted.wait(1.0, busy)
        assert not sampler.tick()
    scripted.rss += 4 * MIB  # 4% more memory: no news either
    scripted.wait(1.0, busy=1.0)
    assert not sampler.tick()
    scripted.rss = 300 * MIB  # a cell allocated 200 MB
    scripted.wait(1.0, busy=1.0)
    assert sampler.tick() and sent[-1]["rss"] == 300 * MIB
    scripted.wait(2.0, busy=0.0)  # the rank went idle
    assert sampler.tick() and sent[-1]["cpu"] == 0.0
    for _ in range(5):  # and stays idle: the wire stays quiet
        scripted.wait(1.0, busy=0.0)
        assert not sampler.tick()
    assert (len(sent), sampler.samples) == (3, 12)


def test_a_sample_that_could_not_go_out_is_offered_again_at_the_next():
    scripted, sent, busy = Scripted(), [], [True]

    def send(**figures):
        if busy[0]:
            return False
        sent.append(figures)
        return True

    sampler = Sampler(send, clock=lambda: scripted.now, cpu_seconds=lambda: scripted.cpu, resident=lambda: scripted.rss)
    sampler._last = (scripted.now, scripted.cpu)
    scripted.wait(1.0, busy=0.5)
    assert not sampler.tick() and sampler.sent == {}
    busy[0] = False
    scripted.wait(1.0, busy=0.5)
    assert sampler.tick() and sent == [{"cpu": 50.0, "rss": 100 * MIB, "gpu_memory": None, "gpu_util": None}]


def test_a_pipe_holding_unread_bytes_is_seen_as_such(tmp_path):
    read_end, write_end = os.pipe()
    try:
        assert not wire.pipe_holds_data(write_end)
        os.write(write_end, b"half a line")
        assert wire.pipe_holds_data(write_end)
        os.read(read_end, 100)
        assert not wire.pipe_holds_data(write_end)
    finally:
        os.close(read_end), os.close(write_end)
    with open(tmp_path / "file", "w") as f:
        assert not wire.pipe_holds_data(f.fileno()), "a file is no pipe"


def test_what_counts_as_news():
    before = {"cpu": 100.0, "rss": GIB, "gpu_memory": None, "gpu_util": None}
    assert not news(before, {**before, "cpu": 109.0})
    assert news(before, {**before, "cpu": 111.0}) and news(before, {**before, "cpu": 89.0})
    assert not news({**before, "cpu": 1600.0}, {**before, "cpu": 1500.0}), "a tenth of many busy cores"
    assert news({**before, "cpu": 5.0}, {**before, "cpu": 15.0}) and not news({**before, "cpu": 5.0}, {**before, "cpu": 0.0})
    assert not news(before, {**before, "rss": GIB + 50 * MIB}) and news(before, {**before, "rss": GIB + 52 * MIB})
    assert news({**before, "rss": 10 * MIB}, {**before, "rss": 11 * MIB}), "a mebibyte is news for a small rank"
    assert news(before, {**before, "gpu_memory": 0, "gpu_util": 0.0}), "a GPU appeared"
    on_gpu = {**before, "gpu_memory": 10 * GIB, "gpu_util": 50.0}
    assert not news(on_gpu, {**on_gpu, "gpu_util": 59.0}) and news(on_gpu, {**on_gpu, "gpu_util": 61.0})
    assert news(on_gpu, {**on_gpu, "gpu_memory": 11 * GIB})


def test_resident_bytes_are_this_processes_and_grow_with_what_it_holds():
    before = resources.resident_bytes()
    assert before == pytest.approx(psutil.Process().memory_info().rss, abs=8 * MIB)
    held = bytearray(64 * MIB)  # zeroed: every page touched
    assert resources.resident_bytes() - before > 60 * MIB
    del held


def _wait_for(condition, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_sampling_thread_sends_survives_failures_and_stops_at_once():
    sent, failures = [], []

    def send(**figures):
        if not failures:  # the first send fails (a closed pipe, say): sampling goes on
            failures.append(figures)
            raise OSError("broken pipe")
        sent.append(figures)

    sampler = Sampler(send, every=0.02)
    _thread.start_new_thread(sampler.run, ())
    _wait_for(lambda: sent)
    assert failures and sent and sent[0]["rss"] > 10 * MIB and sent[0]["cpu"] >= 0
    started = time.monotonic()
    assert sampler.stop(wait=5.0) and time.monotonic() - started < 1.0, "the sleep ends at once"
    assert sampler.stop(wait=1.0), "stopping twice is fine"


def test_a_rank_samples_onto_a_copy_of_its_stderr_and_starts_its_cell_even_where_it_cannot(capfd):
    from mpi_magic.shared.events import Resources, StreamDecoder

    token = "0123456789abcdef"
    emitter = wire.Emitter(3, lambda line: None, token)
    sampler = resources.start(emitter, 0, {})
    _wait_for(lambda: sampler.sent)
    assert sampler.stop(wait=5.0)
    (line,) = capfd.readouterr().err.splitlines()
    (event,) = StreamDecoder(token).feed(f"[1,3]<stderr>: {line}")
    assert isinstance(event, Resources) and event.rss > 10 * MIB and event.cpu >= 0
    assert resources.start(emitter, 0, {envvars.RESOURCES_EVERY: "0"}) is None
    stderr = os.dup(2)
    os.close(2)  # a rank started without a stderr
    try:
        assert resources.start(emitter, 0, {}) is None
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)


def test_a_sample_that_costs_much_stretches_the_interval_to_keep_within_its_budget():
    def slow_resident() -> int:
        spent = time.thread_time()
        while time.thread_time() - spent < 0.02:  # 20 ms of CPU for each sample
            pass
        return 1

    sampler = Sampler(lambda **figures: None, every=0.01, resident=slow_resident)
    _thread.start_new_thread(sampler.run, ())
    _wait_for(lambda: sampler.samples >= 1)
    time.sleep(0.1)
    assert sampler.samples == 1 and sampler.wait >= 0.02 / BUDGET, "the next sample waits for 4 s"
    assert sampler.stop(wait=5.0)


def test_a_sampler_stopped_before_its_thread_runs_ends_at_once():
    sampler = Sampler(lambda **figures: None, every=0.01)
    sampler.stop()
    _thread.start_new_thread(sampler.run, ())
    assert sampler.stop(wait=5.0) and sampler.samples == 0


# -- GPUs ----------------------------------------------------------------------------------------


class FakeNvmlForTests:
    """A stand-in for the ``pynvml`` module (nvidia-ml-py), which needs an NVIDIA driver and GPU that
    this machine lacks: devices with the processes NVML would list on each, and their utilisation.
    Only the calls ``GpuReader`` makes, with NVML's names and return shapes."""

    class NVMLError(Exception):
        pass

    class _Process:
        def __init__(self, pid, used):
            self.pid, self.usedGpuMemory = pid, used

    class _Utilization:
        def __init__(self, gpu):
            self.gpu, self.memory = gpu, 0

    class _Memory:
        def __init__(self, used):
            self.used, self.total, self.free = used, 80 * GIB, 80 * GIB - used

    def __init__(self, devices: list[dict]):
        """``devices``: per device in PCI order, {"uuid", "processes": [(pid, bytes or None)], "util",
        "used", "fails"}."""
        self.devices = devices
        self.calls: list[str] = []

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.devices):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        assert isinstance(uuid, bytes), "older nvidia-ml-py takes bytes only"
        for index, device in enumerate(self.devices):
            if device.get("uuid", "").encode() == uuid:
                return index
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self.calls.append(f"processes {handle}")
        if self.devices[handle].get("fails"):
            raise self.NVMLError("Not Supported")
        return [self._Process(pid, used) for pid, used in self.devices[handle].get("processes", [])]

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.calls.append(f"utilization {handle}")
        return self._Utilization(self.devices[handle].get("util", 0))

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._Memory(self.devices[handle].get("used", 0))


PID, OTHER_RANK = os.getpid(), os.getppid()  # a pid that is not this process but exists here too


def test_the_gpus_a_rank_sees_are_read_as_cuda_reads_its_visible_devices():
    assert visible_devices(None, 4) == [0, 1, 2, 3]
    assert visible_devices("2,0", 4) == [2, 0]
    assert visible_devices(" 1 , 3", 4) == [1, 3]
    assert visible_devices("0,-1,2", 4) == [0], "CUDA stops at the first entry that names no device"
    assert visible_devices("0,7,1", 4) == [0] and visible_devices("1,1", 4) == [1]
    assert visible_devices("", 4) == [] and visible_devices("-1", 4) == [] and visible_devices("NoDevFiles", 4) == []
    assert visible_devices("GPU-aa,1,MIG-bb", 4) == ["GPU-aa", 1, "MIG-bb"]


def test_gpu_memory_is_what_nvml_lists_for_this_process_on_every_device_it_sees():
    nvml = FakeNvmlForTests([
        {"processes": [(OTHER_RANK, 9 * GIB)], "util": 40},
        {"processes": [(PID, 3 * GIB), (OTHER_RANK, GIB)], "util": 97},  # its own device
        {"processes": [(PID, 500 * MIB)], "util": 5},  # a context made on another device by mistake
        {"fails": True},
    ])
    reader = GpuReader(nvml, PID, local_rank=1, visible=None)
    assert reader.read() == (3 * GIB + 500 * MIB, 97.0), "the busy percent of the device where it holds the most"
    assert nvml.calls[-1] == "utilization 1"


def test_the_local_rank_picks_its_device_among_the_visible_ones_until_it_holds_memory():
    nvml = FakeNvmlForTests([{"util": 10, "uuid": "GPU-a"}, {"util": 20, "uuid": "GPU-b"}, {"util": 30, "uuid": "GPU-c"},
                             {"util": 40, "uuid": "GPU-d"}])
    assert GpuReader(nvml, PID, local_rank=0, visible=None).read() == (0, 10.0)
    assert GpuReader(nvml, PID, local_rank=1, visible="3,2").read() == (0, 30.0), "cuda:1 is the second visible"
    assert GpuReader(nvml, PID, local_rank=5, visible="3,2").read() == (0, 30.0), "local ranks wrap round the GPUs"
    assert GpuReader(nvml, PID, local_rank=0, visible="GPU-c").read() == (0, 30.0)
    with pytest.raises(LookupError):
        GpuReader(nvml, PID, local_rank=0, visible="-1")


def test_in_a_container_whose_pids_nvml_does_not_list_the_rank_gets_its_own_devices_memory():
    """Docker and SageMaker give a container its own process namespace; NVML lists the host's pids."""
    nvml = FakeNvmlForTests([{"processes": [(4_000_001, 7 * GIB)], "used": 7 * GIB + 300 * MIB, "util": 99},
                             {"processes": [(4_000_002, 6 * GIB)], "used": 6 * GIB, "util": 98}])
    assert GpuReader(nvml, PID, local_rank=0, visible=None, pid_exists=lambda pid: pid in (PID, OTHER_RANK)).read() \
        == (7 * GIB + 300 * MIB, 99.0)
    nvml.devices[0]["processes"] = [(OTHER_RANK, 7 * GIB)]  # another rank of this machine, seen by its pid
    nvml.devices[1]["processes"] = []
    assert GpuReader(nvml, PID, local_rank=0, visible=None).read() == (0, 99.0), "this rank holds none"


def test_memory_nvml_cannot_say_counts_as_none_and_a_device_that_fails_is_skipped():
    nvml = FakeNvmlForTests([{"processes": [(PID, None)], "util": 50}, {"fails": True}])
    assert GpuReader(nvml, PID, local_rank=1, visible=None).read() == (0, 50.0)


def test_nvml_is_imported_only_where_an_nvidia_device_exists_and_the_rank_sees_one(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    assert open_gpu(0, {}, dev=str(tmp_path)) is None and "pynvml" not in sys.modules, "no device file: no import"
    assert open_gpu(0, {}, dev=str(tmp_path / "missing")) is None
    (tmp_path / "nvidiactl").touch()
    (tmp_path / "nvidia-uvm").touch()
    assert not resources.gpu_present(str(tmp_path)), "the driver's other files are no GPU"
    (tmp_path / "nvidia0").touch()
    assert resources.gpu_present(str(tmp_path))
    assert open_gpu(0, {"CUDA_VISIBLE_DEVICES": ""}, dev=str(tmp_path)) is None and "pynvml" not in sys.modules
    assert open_gpu(0, {"CUDA_VISIBLE_DEVICES": "-1"}, dev=str(tmp_path)) is None and "pynvml" not in sys.modules
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a device file, but no nvidia-ml-py: no GPU figures, no error
    assert open_gpu(0, {}, dev=str(tmp_path)) is None


def test_a_sampler_sends_the_gpu_figures_of_its_reader():
    scripted, sent = Scripted(), []

    class Reader:
        figures = (2 * GIB, 75.0)

        def read(self):
            return self.figures

    sampler = scripted.sampler(sent)
    sampler.gpu = Reader()
    scripted.wait(1.0, busy=1.0)
    sampler.tick()
    assert sent[-1] == {"cpu": 100.0, "rss": 100 * MIB, "gpu_memory": 2 * GIB, "gpu_util": 75.0}
    Reader.figures = (2 * GIB, 40.0)
    scripted.wait(1.0, busy=1.0)
    assert sampler.tick() and sent[-1]["gpu_util"] == 40.0


# -- real jobs -----------------------------------------------------------------------------------


def test_a_job_reports_each_ranks_resources_and_the_rank_that_holds_more_shows_it(ip):
    run(ip, "-i 1 -g 3 --quiet --out job", (
        "import time, mpi_magic\n"
        "if mpi_magic.rank() == 1:\n"
        "    held = bytearray(200 * 1024 * 1024)  # zeroed: resident\n"
        "time.sleep(2.5)\n"
    ))
    ranks = ip.user_ns["job"].ranks
    assert all(isinstance(r.cpu, float) and r.cpu >= 0 for r in ranks), [r.cpu for r in ranks]
    assert all(r.gpu_memory is None and r.gpu_util is None for r in ranks), "no GPU here"
    others = [ranks[0].rss, ranks[2].rss]
    assert ranks[1].rss - max(others) > 150 * MIB, [r.rss for r in ranks]
    assert ranks[1].peak_rss >= ranks[1].rss


def test_long_lines_of_a_sampling_rank_come_through_whole(ip):
    """Open MPI takes seconds to pass a 4 MB line on: the rank's samples, on its stderr, must not
    cut its stdout's lines (a flush from the sampler's thread did), nor its stderr's."""
    run(ip, "-g 2 --quiet --out job", (
        "import sys, time\n"
        "print('y' * 4_000_000)\n"
        "print('z' * 4_000_000, file=sys.stderr)\n"
        "time.sleep(1.5)\n"
    ))
    job = ip.user_ns["job"]
    for rank in range(2):
        assert sorted(job.logs(rank).split("\n")) == ["", "[stderr] " + "z" * 4_000_000, "y" * 4_000_000]
        assert job.ranks[rank].rss > 4_000_000, "the samples went once the line was through"


def test_sampling_can_be_turned_off(ip):
    run(ip, f"-g 2 --quiet --out job --env {envvars.RESOURCES_EVERY}=0", "import time\ntime.sleep(1.5)\n")
    assert [(r.cpu, r.rss) for r in ip.user_ns["job"].ranks] == [(None, None)] * 2


def test_a_session_cell_shows_what_its_ranks_use_from_its_start(sessions):
    """A rank sends its figures as they change; a cell too short to see a change still has the latest."""
    ip = sessions
    session = start_session(ip, "-i 1 -g 2")
    assert wait_until(lambda: all(r.rss for r in session.model.ranks), 30), "each rank has sampled once"
    run(ip, "--quiet --out job", "x = 1")
    ranks = ip.user_ns["job"].ranks
    assert all(r.rss and r.rss > 10 * MIB and r.cpu is not None for r in ranks), [(r.cpu, r.rss) for r in ranks]
