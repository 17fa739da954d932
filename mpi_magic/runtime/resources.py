"""What each rank uses, sampled on the rank: CPU (percent of one core), resident memory and, where
the rank has a GPU, the GPU memory it holds and that GPU's utilisation.

A thread of the rank's own (``_thread``: ``threading`` costs every rank milliseconds at start-up)
wakes once a second, reads ``time.process_time()`` and ``/proc/self/statm`` (psutil where there is
no ``/proc``), and sends a ``resources`` event only when a figure moved noticeably, so a rank that
idles keeps the wire quiet. Its events go to the rank's stderr, never its stdout, and wait while
that pipe holds unread bytes, so that a line the cell is part way through writing is not cut in
two. (That leaves a race: a line of more than 64 KiB written to stderr just as a sample goes out
can still arrive as two lines.) It keeps its own cost under ``BUDGET`` of a core whatever a sample
costs: a slow sample (NVML on a machine of many GPUs) makes it sleep longer. Every error it meets
is swallowed; it never slows or breaks the cell, and it stops when the rank exits.

NVML (``pynvml``, from the ``nvidia-ml-py`` package) is imported only where an NVIDIA device file
exists and the rank is not hidden from every GPU (``CUDA_VISIBLE_DEVICES=""``); anywhere else, or
when the import or NVML itself fails, the GPU figures stay None.

In a session the thread runs for the rank's whole life, between cells too: an idle rank costs one
wake-up a second and sends nothing, and the session keeps each rank's latest figures, which it hands
to each cell as the cell starts (so a cell that changes nothing still shows them). Sampling only
while a cell runs would leave the session blind to what its ranks hold between cells, for no saving.
"""

from __future__ import annotations

import os
import time
from _thread import allocate_lock  # threading's Lock, without importing threading on every rank

from ..shared import envvars, procs, wire

EVERY = 1.0  # seconds between samples, at the least
BUDGET = 0.005  # of one core: a sample that costs more than this share of its interval stretches the interval
CPU_STEP = 10.0  # percentage points of a core (or a tenth of the figure, if more) that make a CPU change news
MEMORY_STEP = 1 << 20  # bytes (or a twentieth of the figure, if more) that make a memory change news
MEMORY_SHARE = 0.05
UTIL_STEP = 10.0  # percentage points of a GPU's utilisation

TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def interval(text: str | None) -> float | None:
    """Seconds between samples for ``MPI_MAGIC_RESOURCES_EVERY``'s value: ``EVERY`` when unset
    or unreadable, at least ``EVERY``; None (no sampling) for 0, "off", "no" or "false"."""
    if text is None or not text.strip():
        return EVERY
    if text.strip().lower() in ("off", "no", "false"):
        return None
    try:
        seconds = float(text)
    except ValueError:
        return EVERY
    if seconds == 0:
        return None
    return max(EVERY, seconds) if seconds == seconds else EVERY  # NaN: the default


def start(emitter: wire.Emitter, local_rank: int, environ: Mapping[str, str] = os.environ) -> Sampler | None:
    """Sample this rank's resources on a thread of its own, sending each change as an event on a
    private copy of its stderr (the cell's streams are not touched from this thread: a flush there
    would cut a line the cell is still writing); None where ``MPI_MAGIC_RESOURCES_EVERY`` turns
    sampling off, or where it cannot start (no stderr, no thread to be had): the cell runs anyway."""
    every = interval(environ.get(envvars.RESOURCES_EVERY))
    if every is None:
        return None
    try:
        return _start(emitter, local_rank, environ, every)
    except Exception:  # noqa: BLE001 - a rank that cannot sample still runs its cell
        return None


def _start(emitter: wire.Emitter, local_rank: int, environ: Mapping[str, str], every: float) -> Sampler:
    import _thread
    import atexit

    fd = os.dup(2)

    def send(**figures) -> bool:
        if wire.pipe_holds_data(fd):
            return False  # the cell may be mid-way through a long write: the next sample goes instead
        emitter.emit_via(lambda line: wire.write_all(fd, line), wire.RESOURCES, **figures)
        return True

    sampler = Sampler(send, every, lambda: open_gpu(local_rank, environ))
    emitter.hold_across_forks()
    _thread.start_new_thread(sampler.run, ())
    atexit.register(sampler.stop, 0.5)  # no sample while the interpreter is being torn down
    return sampler


class Sampler:
    """One rank's sampling loop: ``run`` on a thread of its own until ``stop``.

    ``send(**figures)`` gets ``cpu``, ``rss``, ``gpu_memory`` and ``gpu_util`` when one of them
    changed noticeably since it last sent them (always the first time); it returns False when it
    could not send them now (they are offered again at the next sample). ``open_gpu`` is called
    once, on the thread, and returns something with ``read() -> (gpu_memory, gpu_util)`` or None.
    """

    def __init__(self, send: Callable[..., bool | None], every: float = EVERY,
                 open_gpu: Callable[[], GpuReader | None] | None = None,
                 clock: Callable[[], float] = time.monotonic, cpu_seconds: Callable[[], float] = time.process_time,
                 resident: Callable[[], int | None] | None = None):
        self.send, self.every = send, every
        self._open_gpu = open_gpu
        self.gpu: GpuReader | None = None
        self.clock, self.cpu_seconds = clock, cpu_seconds
        self.resident = resident or resident_bytes
        self.sent: dict[str, float | int | None] = {}
        self.samples = 0  # taken, sent or not
        self.wait = every  # until the next sample: ``every``, or longer if sampling costs more than its budget
        self._stopping = allocate_lock()
        self._stopping.acquire()  # released by ``stop``: the loop's sleep ends at once
        self._ended = allocate_lock()
        self._ended.acquire()  # released as the loop ends
        self._last: tuple[float, float] | None = None  # (clock, cpu seconds) at the last sample

    def run(self) -> None:
        try:
            if self._open_gpu is not None:
                try:
                    self.gpu = self._open_gpu()
                except Exception:  # noqa: BLE001 - no GPU figures then
                    self.gpu = None
            self._last = (self.clock(), self.cpu_seconds())
            while not self._stopping.acquire(timeout=self.wait):
                spent = time.thread_time()
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - a failed sample must not end the rank's sampling
                    pass
                self.wait = max(self.every, (time.thread_time() - spent) / BUDGET)
        except BaseException:  # noqa: BLE001 - never let this thread print or raise into the rank
            pass
        finally:
            self._ended.release()

    def stop(self, wait: float = 0.0) -> bool:
        """End the loop (its sleep ends at once); True when it has ended within ``wait`` seconds."""
        try:
            self._stopping.release()
        except RuntimeError:  # stopped already
            pass
        if self._ended.acquire(timeout=wait) if wait > 0 else self._ended.acquire(False):
            self._ended.release()
            return True
        return False

    def sample(self) -> dict[str, float | int | None]:
        """The figures now (``cpu``: since the previous sample)."""
        now, cpu_seconds = self.clock(), self.cpu_seconds()
        cpu = None
        if self._last is not None and now > self._last[0]:
            cpu = round(max(0.0, 100.0 * (cpu_seconds - self._last[1]) / (now - self._last[0])), 1)
        self._last = (now, cpu_seconds)
        gpu_memory, gpu_util = self.gpu.read() if self.gpu is not None else (None, None)
        return {"cpu": cpu, "rss": self.resident(), "gpu_memory": gpu_memory, "gpu_util": gpu_util}

    def tick(self) -> bool:
        """Take a sample and send it if it is news; True when sent."""
        figures = self.sample()
        self.samples += 1
        if self.sent and not news(self.sent, figures):
            return False
        if self.send(**figures) is False:
            return False
        self.sent = figures
        return True


def news(before: Mapping[str, float | int | None], now: Mapping[str, float | int | None]) -> bool:
    """True when a figure appeared, went, or moved by more than its step since ``before``."""
    for name, step, share in (("cpu", CPU_STEP, 0.1), ("rss", MEMORY_STEP, MEMORY_SHARE),
                              ("gpu_memory", MEMORY_STEP, MEMORY_SHARE), ("gpu_util", UTIL_STEP, 0.0)):
        old, new = before.get(name), now.get(name)
        if (old is None) != (new is None):
            return True
        if old is not None and new is not None and abs(new - old) >= max(step, share * old):
            return True
    return False


_PAGE = 0


def resident_bytes() -> int | None:
    """This process's resident memory now: /proc/self/statm's second field (Linux), else psutil's
    figure where psutil is installed; None where neither says."""
    global _PAGE
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return _psutil_rss()
    try:
        pages = int(os.read(fd, 200).split()[1])
    finally:
        os.close(fd)
    if not _PAGE:
        _PAGE = os.sysconf("SC_PAGE_SIZE")
    return pages * _PAGE


def _psutil_rss() -> int | None:
    try:
        import psutil  # only where there is no /proc (macOS), and only if installed
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


# -- GPUs, through NVML -----------------------------------------------------------------------


def gpu_present(dev: str = "/dev") -> bool:
    """True where an NVIDIA GPU's device file (``/dev/nvidia0``...) exists."""
    try:
        names = os.listdir(dev)
    except OSError:
        return False
    return any(name.startswith("nvidia") and name[6:].isdigit() for name in names)


def visible_devices(value: str | None, count: int) -> list[int | str]:
    """The GPUs a process sees, in CUDA's order, as NVML indices or UUIDs: all ``count`` when
    ``CUDA_VISIBLE_DEVICES`` is unset, else its entries up to the first that names no device (as
    CUDA reads it: "1,0" is devices 1 then 0; "0,-1,2" is device 0 alone; "" is none)."""
    if value is None:
        return list(range(count))
    devices: list[int | str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < count and int(entry) not in devices:
            devices.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")) and entry not in devices:
            devices.append(entry)
        else:
            break
    return devices


def open_gpu(local_rank: int, environ: Mapping[str, str] = os.environ, dev: str = "/dev") -> GpuReader | None:
    """A reader of this process's GPU figures, or None: no NVIDIA device here, the rank sees no
    GPU, or NVML is not installed or does not start. NVML is imported only when a device exists."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible_devices(visible, 1 << 16):
        return None  # hidden from every GPU (CUDA_VISIBLE_DEVICES="" or "-1")
    if not gpu_present(dev):
        return None
    try:
        import pynvml  # nvidia-ml-py: only where a GPU is

        pynvml.nvmlInit()
        return GpuReader(pynvml, os.getpid(), local_rank, visible)
    except Exception:  # noqa: BLE001 - not installed, no driver, no permission: no GPU figures
        return None


class GpuReader:
    """This process's GPU figures through NVML (``nvml``: the ``pynvml`` module, initialised).

    ``gpu_memory``: what NVML lists for this pid, summed over the devices the rank sees. In a
    container with its own process namespace NVML lists the host's pids, none of which exists
    here; then it is the memory in use on the rank's own device (one rank to a GPU: its own,
    with the driver's share). ``gpu_util``: the busy percent of the device where the rank holds
    the most memory, else of its own device: the one its local rank picks among those it sees
    (``cuda:LOCAL_RANK``; NVML counts devices in PCI order, as CUDA does with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""

    def __init__(self, nvml, pid: int, local_rank: int, visible: str | None,
                 pid_exists: Callable[[int], bool] = procs.alive):
        self.nvml, self.pid, self._pid_exists = nvml, pid, pid_exists
        self.devices = [nvml.nvmlDeviceGetHandleByIndex(device) if isinstance(device, int)
                        else nvml.nvmlDeviceGetHandleByUUID(device.encode())
                        for device in visible_devices(visible, nvml.nvmlDeviceGetCount())]
        if not self.devices:
            raise LookupError("the rank sees no GPU")
        self.own = self.devices[local_rank % len(self.devices)]

    def read(self) -> tuple[int | None, float | None]:
        nvml = self.nvml
        held: dict[int, int] = {}
        elsewhere = False  # NVML listed a process that does not exist here: pids of another namespace
        for index, device in enumerate(self.devices):
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(device)
            except Exception:  # noqa: BLE001 - a device that cannot say (MIG, permissions): the others still do
                continue
            for process in processes:
                if process.pid == self.pid:
                    held[index] = held.get(index, 0) + (process.usedGpuMemory or 0)  # None: not available
                elif not elsewhere and not self._pid_exists(process.pid):
                    elsewhere = True
        device = self.own
        if held:
            memory: int | None = sum(held.values())
            device = self.devices[max(held, key=lambda index: held[index])]
        elif elsewhere:
            try:
                memory = int(nvml.nvmlDeviceGetMemoryInfo(self.own).used)
            except Exception:  # noqa: BLE001
                memory = None
        else:
            memory = 0
        try:
            util: float | None = float(nvml.nvmlDeviceGetUtilizationRates(device).gpu)
        except Exception:  # noqa: BLE001 - not supported on this device
            util = None
        return memory, util
