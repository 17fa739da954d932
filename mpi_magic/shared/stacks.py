"""Every rank's stack, on request: where each rank is now, even one blocked inside MPI's C code.

Each rank answers ``SIGNAL`` with a ``faulthandler`` dump of every thread's stack. The signal is
taken by a thread of the rank's own, so asking changes nothing the rank does: a handler interrupts
the call its thread is in, and ``sleep``, ``poll`` or a driver's wait in C would return early.
That thread dumps holding the GIL, so no thread runs Python while its frames are read (a dump
without it reads frames that a running thread frees meanwhile, and the rank dies of SIGSEGV).
A rank blocked in C that holds the GIL (mpi4py's lower-case collectives do) cannot let that thread
run, so an asker that has no answer after ``FALLBACK_AFTER`` seconds asks again with
``FALLBACK_NAME``, which ``faulthandler``'s C handler answers on that thread without the GIL:
safe there, since the rank's one Python runner is the blocked thread that holds it.

Where the notebook shares the ranks' machine (``MPI_MAGIC_STACKS_DIR``), each rank dumps into its
own file; the notebook sends the signal to each rank's process, reads what the dump appended, keeps
the main thread's frames (innermost last), and groups the ranks by where they are: the roll-call.
Where it does not (SageMaker, Slurm: ``MPI_MAGIC_STACKS_EVENTS``), the signals come through mpirun,
which forwards them to every rank on every instance, or through Slurm, and each rank dumps into a
pipe that a process of its own reads and sends on as a ``stacks`` event on the rank's stderr, the
way every other event reaches the notebook. A process the rank forks (a data loader's worker) does
not answer for it: it forgets the handler.

Both signals are ignored by default, so a rank that has not registered yet (still starting), and
every other process Slurm signals, ignores them instead of dying. Open MPI 5's mpirun forwards
SIGURG by itself; the fallback, and on Open MPI 4 both, only when told (``forwarding_args``).
"""

from __future__ import annotations

import os
import time

from . import envvars

SIGNAL_NAME = "SIGURG"
FALLBACK_NAME = "SIGWINCH"  # the second ask, answered without the GIL
FALLBACK_AFTER = 0.5  # seconds an asker waits for a rank's answer before it asks the second way (100 GIL switches)
# seconds after an answer in which a second ask is taken and dropped, never dumped, where it goes to
# every rank (Slurm's scancel, mpirun's forwarding) and so also to those that answered the first; where
# the notebook asks each rank alone it sends the second only to one that has not begun to answer
GRACE_WHERE_ASKED_ALL = FALLBACK_AFTER + 1.0
HEADER = "mpi_magic stacks: main thread "
ANSWER_LIMIT = 3.0  # seconds every rank gets to answer before the others' stacks are reported without it
SETTLED = 0.05  # seconds a dump file's size must stay put for its dump to count as written
MAX_DUMP = 1 << 20  # bytes of one dump read back (a thread's stack holds at most 100 frames)

_registered = None  # the rank's open dump file (or pipe), kept for as long as the handler writes to it
EVENT_FRAMES = 60  # innermost frames of the main thread a stacks event carries
WRITE_WAIT = 2.0  # seconds a stacks event waits for the rank's stderr to be read before it goes anyway

WAITING_FOR_CELL = "_next_message"  # the function a session's rank waits in between cells (runtime/cell_loop.py)

Frame = tuple[str, int, str]  # (filename, line, function), as ``job.stacks()`` gives them
# (patterns, compiled where dumps are read: compiling them would cost every rank's start-up)
_FRAME = r'^\s+File "(.*)", line (\d+) in (.*)$'
_THREAD = r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$"


def dump_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}.stacks")


def install(rank: int, token: str = "", environ=os.environ) -> None:
    """On a rank: answer ``SIGNAL`` with a dump of every thread's stack into this rank's file in
    the folder ``MPI_MAGIC_STACKS_DIR`` names, or, where ``MPI_MAGIC_STACKS_EVENTS`` is set, as a
    ``stacks`` event with the job's ``token`` on the rank's stderr (which a cell writes to less than
    its stdout), sent by a process of its own (nothing where neither is set)."""
    global _registered
    folder = environ.get(envvars.STACKS_DIR)
    if folder:
        try:
            fd = os.open(dump_path(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError:
            return  # the folder went with its job: no stacks, and the cell runs as ever
    elif environ.get(envvars.STACKS_EVENTS):
        sender = _start_sender(rank, os.dup(2), token)  # a copy, which the cell's own redirections leave alone
        if sender is None:
            return
        fd = sender
    else:
        return
    import _signal  # type: ignore[import-not-found]  # signal's C part: its enums, as threading, cost ranks milliseconds
    import _thread
    import faulthandler

    signum, fallback = getattr(_signal, SIGNAL_NAME), getattr(_signal, FALLBACK_NAME)
    _registered = os.fdopen(fd, "w")
    if folder:
        _registered.write(f"{HEADER}{_thread.get_ident():#018x}\n")  # called on the main thread
        _registered.flush()
    faulthandler.register(fallback, file=_registered, all_threads=True, chain=False)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {signum, fallback})  # here, and in every thread started from here on
    grace = 0.0 if folder else GRACE_WHERE_ASKED_ALL
    _thread.start_new_thread(_take_the_signals, (signum, fallback, grace))
    os.register_at_fork(after_in_child=_forget)


def _take_the_signals(signum: int, fallback: int, grace: float) -> None:
    """The one thread of the rank that takes the signals, so that the call a signal interrupts is
    this thread's wait, never one of the cell's: ``sleep``, ``poll``, a driver's wait in C return
    early when a handler runs in their thread, whatever SA_RESTART says. It waits for ``signum``
    without the GIL and answers it holding the GIL. ``fallback`` reaches it only while it waits for
    the GIL after an ask (the rank holds the GIL in C), and answers in C. With a ``grace``, a
    ``fallback`` that comes within it after an answer of its own is taken and dropped, never dumped
    while Python runs. It does not keep the rank from ending.

    Known limits: with a ``grace``, an ask to a rank that went into C holding the GIL within it after
    an answer is answered only when that call returns (the thread waits for the GIL with ``fallback``
    blocked); and a rank answered the second way also answers the first once it runs again (an asker
    takes the first answer after it asked)."""
    import _signal
    import faulthandler

    def dump() -> None:
        if _registered is not None:
            try:
                faulthandler.dump_traceback(file=_registered, all_threads=True)
            except (OSError, ValueError):
                pass  # the rank's file or pipe is gone: it is ending

    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {fallback})
    while True:
        asked = _signal.sigwaitinfo({signum})
        if not grace:
            dump()  # (a second ask meanwhile is answered in C while this thread holds the GIL: as safe)
            continue
        _signal.pthread_sigmask(_signal.SIG_BLOCK, {fallback})
        until = time.monotonic() + grace
        while asked is not None:
            if asked.si_signo == signum:
                dump()
                until = time.monotonic() + grace
            asked = _signal.sigtimedwait({signum, fallback}, max(0.0, until - time.monotonic()))
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {fallback})


def _forget() -> None:
    """In a process the rank forks: the signals, which Open MPI may send the rank's whole process
    group, are ignored there again and no longer blocked, and the rank's dump file or pipe is closed."""
    global _registered
    import _signal
    import faulthandler

    signals = {getattr(_signal, SIGNAL_NAME), getattr(_signal, FALLBACK_NAME)}
    try:
        for signum in signals:
            faulthandler.unregister(signum)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, signals)
        if _registered is not None:
            _registered.close()
    except (OSError, ValueError):
        pass
    _registered = None


def _start_sender(rank: int, event_fd: int, token: str) -> int | None:
    """Fork the process that sends this rank's dumps on as events; the pipe's end to dump into.

    A thread of the rank could not: a rank blocked in a collective may hold the GIL (mpi4py's
    lower-case collectives do) for as long as it waits. Forked at start-up, before the cell or MPI
    runs and while the rank has no other thread; it dies with the rank. It keeps none of the rank's
    files open: it opens the rank's ``event_fd`` through /proc for each dump, so the rank's output
    ends the moment the rank does (a launcher may stop reading it then)."""
    import _thread

    main = f"{_thread.get_ident():#018x}"
    parent = os.getpid()
    read_end, write_end = os.pipe()
    _roomy(write_end)
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the sender
        try:
            import signal

            from . import procs

            procs.die_with_parent(signal.SIGKILL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the rank; the sender ends with it
            os.closerange(0, read_end)
            os.closerange(read_end + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16)
            if os.getppid() == parent:
                _send_dumps(read_end, main, rank, f"/proc/{parent}/fd/{event_fd}", token)
        finally:
            os._exit(0)
    os.close(read_end)
    return write_end


def _roomy(fd: int) -> None:
    """A pipe that holds a whole dump, so the handler never waits on the reader (Linux; elsewhere
    the reader drains it as it comes)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), MAX_DUMP)
    except (ImportError, OSError):
        pass


def _send_dumps(read_end: int, main_thread: str, rank: int, events: str, token: str) -> None:
    """The sender: each dump that comes through the pipe, once it has settled, is written to the
    rank's ``events`` stream (its path under /proc) as a ``stacks`` event of the main thread's
    innermost frames. Blocked in ``read`` between dumps."""
    import select

    from . import wire

    while True:
        try:
            chunks = [os.read(read_end, MAX_DUMP)]
            if not chunks[0]:
                return  # the rank has ended
            kept = len(chunks[0])
            while select.select([read_end], [], [], SETTLED)[0]:  # the whole dump, however large
                chunk = os.read(read_end, MAX_DUMP)
                if not chunk:
                    return
                if kept < MAX_DUMP:  # (beyond that, read and dropped, so the next dump starts clean)
                    chunks.append(chunk)
                    kept += len(chunk)
        except OSError:
            return
        frames = parse(b"".join(chunks).decode("utf-8", errors="replace"), main_thread)
        fields = {"rank": rank, "seq": 0, "time": time.time(), "frames": [list(f) for f in frames[-EVENT_FRAMES:]]}
        try:
            event_fd = os.open(events, os.O_WRONLY)
        except OSError:
            return  # the rank has ended
        try:
            until = time.monotonic() + WRITE_WAIT
            while wire.pipe_holds_data(event_fd) and time.monotonic() < until:
                time.sleep(0.02)  # the rank may be part way through a long line there
            wire.write_all(event_fd, wire.encode(wire.STACKS, fields, token) + "\n")
        except OSError:
            return
        finally:
            os.close(event_fd)


def request(folder: str, pids: dict[int, int], limit: float = ANSWER_LIMIT,
            alive=None) -> tuple[dict[int, list[Frame]], dict[int, str]]:
    """Ask each rank ({rank: pid}) for its stack, and again the second way each that has not begun
    to answer after ``FALLBACK_AFTER`` seconds (or half the limit); ({rank: frames}, {rank: why it
    gave none}), within ``limit`` seconds whatever the ranks do."""
    import signal

    sizes: dict[int, int] = {}
    missing: dict[int, str] = {}
    for rank, pid in sorted(pids.items()):
        try:
            sizes[rank] = os.path.getsize(dump_path(folder, rank))
        except OSError:
            missing[rank] = "it has not set up its stack dump (still starting?)"
            continue
        why = _signal_rank(pid, getattr(signal, SIGNAL_NAME))
        if why:
            missing[rank] = why
            del sizes[rank]
    stacks: dict[int, list[Frame]] = {}
    asked_at = time.monotonic()
    deadline = asked_at + limit
    fallback_at: float | None = asked_at + min(FALLBACK_AFTER, limit / 2)
    seen: dict[int, tuple[int, float]] = {}
    while sizes and time.monotonic() < deadline:
        now = time.monotonic()
        for rank in list(sizes):
            path = dump_path(folder, rank)
            try:
                size = os.path.getsize(path)
            except OSError:
                size = sizes[rank]
            if size == sizes[rank]:
                continue
            last = seen.get(rank)
            if last is None or last[0] != size:
                seen[rank] = (size, now)
            elif now - last[1] >= SETTLED:
                stacks[rank] = _read(path, sizes.pop(rank))
        if fallback_at is not None and now >= fallback_at:  # (after the look: one begun to answer is not asked again)
            fallback_at = None
            for rank in [rank for rank in sizes if rank not in seen]:
                _signal_rank(pids[rank], getattr(signal, FALLBACK_NAME))
        time.sleep(0.01)
    for rank in sizes:
        gone = alive is not None and not alive(pids[rank])
        missing[rank] = "its process has ended" if gone else f"it did not answer within {limit:g}s"
    return stacks, missing


def _signal_rank(pid: int, signum: int) -> str | None:
    """Send a rank ``signum``; why it could not be asked, or None."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return "its process has ended"
    except PermissionError:
        return f"its process {pid} is not this user's"
    return None


def forwarding_args(major: int, user_args=(), environ=os.environ) -> list[str]:
    """Open MPI's mpirun arguments that forward both asks to the ranks (its daemons pass on only the
    signals listed), unless the user's own arguments or environment list the forwarded signals
    (then a rank blocked in C holding the GIL gives no stack). Open MPI 5's list replaces its
    defaults, which forward SIGURG and not the fallback (a signal it knows only by number), so it
    names them too; Open MPI 4's adds to its own."""
    import signal

    theirs = [*user_args, *(name.lower() for name in environ if name.startswith(("OMPI_MCA_", "PRTE_MCA_")))]
    if any("ess_base_forward_signals" in arg for arg in theirs):
        return []
    ours = f"{SIGNAL_NAME},{int(getattr(signal, FALLBACK_NAME))}"
    if major >= 5:
        return ["--prtemca", "ess_base_forward_signals", f"{OPEN_MPI_5_FORWARDED},{ours}"]
    return ["--mca", "ess_base_forward_signals", ours]


OPEN_MPI_5_FORWARDED = "SIGTSTP,SIGUSR1,SIGUSR2,SIGABRT,SIGALRM,SIGCONT"  # its defaults, as its help lists them


def _read(path: str, offset: int) -> list[Frame]:
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline()
        f.seek(offset)
        dump = f.read(MAX_DUMP)
    main = header[len(HEADER):].strip() if header.startswith(HEADER) else None
    return parse(dump, main)


def parse(dump: str, main_thread: str | None) -> list[Frame]:
    """The main thread's frames in a faulthandler dump, innermost last (the dump lists them
    innermost first); the first thread's where the main one is not named; where two dumps ran
    together, the later one's."""
    import re

    threads: dict[str, list[Frame]] = {}
    current: list[Frame] | None = None
    for line in dump.splitlines():
        thread = re.match(_THREAD, line)
        if thread:
            current = threads[thread.group(1)] = []  # a thread named again: a later dump, which wins
            continue
        frame = re.match(_FRAME, line)
        if frame and current is not None:
            current.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    if not threads:
        return []
    chosen = next((frames for ident, frames in threads.items() if main_thread and int(ident, 16) == int(main_thread, 16)),
                  next(iter(threads.values())))
    return list(reversed(chosen))


def place(frames: list[Frame], cell_file: str, cell_lines: list[str]) -> str:
    """Where a rank is, in the notebook's words: "at cell line 7 in allreduce", or "at Cell In[3],
    line 4 in sleep" inside a function from an earlier cell (the innermost frame of the notebook's
    code, and the function running there: the Python one it called, else the call the line makes,
    as a C function such as MPI's has no frame of its own)."""
    at = max((i for i, (filename, line, _) in enumerate(frames) if _named_line(filename, line, cell_file)),
             default=None)
    if at is None:
        if not frames:
            return "in no Python frame"
        if any(function == WAITING_FOR_CELL for _, _, function in frames):
            return "waiting for a cell"
        filename, line, function = frames[-1]
        return f"at {os.path.basename(filename)}:{line} in {function}"
    filename, line, _ = frames[at]
    inner = frames[at + 1][2] if at + 1 < len(frames) else _called(_source_line(filename, line, cell_file, cell_lines))
    return f"at {_named_line(filename, line, cell_file)}" + (f" in {inner}" if inner else "")


def _named_line(filename: str, line: int, cell_file: str) -> str | None:
    """A line of the notebook's code as the roll-call names it, "cell line 7" in the cell, "Cell In[3],
    line 4" in a function from an earlier cell; None for other code."""
    if filename == cell_file:
        return f"cell line {line}"
    from .cell import name_of

    name = name_of(filename)
    return None if name is None else f"{name}, line {line}"


def _source_line(filename: str, line: int, cell_file: str, cell_lines: list[str]) -> str:
    if filename == cell_file:
        return cell_lines[line - 1] if 0 < line <= len(cell_lines) else ""
    import linecache  # where the notebook keeps its cells' lines

    return linecache.getline(filename, line)


def _called(text: str) -> str:
    """The last function a line calls (``comm.allreduce(x)`` -> ``allreduce``)."""
    import re

    names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", text)
    return names[-1] if names else ""


class Snapshot:
    """Where every rank was when asked: {rank: frames} and {rank: why it gave none}. Its text is
    the roll-call, the ranks grouped by where they are: "ranks 0, 1, 3 at cell line 7 in
    allreduce; rank 2 at cell line 12 in recv; rank 4 gave no stack: its process has ended"."""

    def __init__(self, stacks: dict[int, list[Frame]], missing: dict[int, str], cell_file: str,
                 cell_lines: list[str]):
        self.stacks = stacks
        # one thing per rank: one that answered and has ended by the time the others did is where it answered
        self.missing = {rank: why for rank, why in missing.items() if rank not in stacks}
        self._cell_file, self._cell_lines = cell_file, cell_lines

    def groups(self) -> list[tuple[list[int], str]]:
        """[(ranks, where they are)], in the order of each group's first rank."""
        groups: dict[str, list[int]] = {}
        for rank, frames in sorted(self.stacks.items()):
            groups.setdefault(place(frames, self._cell_file, self._cell_lines), []).append(rank)
        return sorted(((ranks, where) for where, ranks in groups.items()), key=lambda group: group[0])

    def lines(self, frames: bool = False) -> list[str]:
        """One line per group; with ``frames``, each followed by its first rank's frames, outermost first."""
        from ..errors import ranks_phrase  # only where a snapshot is read, never on a rank

        lines = []
        for ranks, where in self.groups():
            lines.append(f"{ranks_phrase(ranks)} {where}")
            if frames:
                lines += [f"    {text}" for text in self._frames(self.stacks[ranks[0]])]
        reasons: dict[str, list[int]] = {}
        for rank, why in sorted(self.missing.items()):
            reasons.setdefault(why, []).append(rank)
        return lines + [f"{ranks_phrase(ranks)} gave no stack: {why}" for why, ranks in reasons.items()]

    def _frames(self, frames: list[Frame]) -> list[str]:
        """A rank's frames as a traceback shows them, from the cell's outermost frame on where
        the cell is running (the runtime's frames above it say nothing of the cell)."""
        first = next((i for i, frame in enumerate(frames) if frame[0] == self._cell_file), 0)
        lines = []
        for filename, line, function in frames[first:]:
            named = _named_line(filename, line, self._cell_file)
            if named:
                code = _source_line(filename, line, self._cell_file, self._cell_lines).strip()
                lines.append(f"{named} in {function}" + (f": {code}" if code else ""))
            else:
                lines.append(f"{filename}:{line} in {function}")
        return lines

    def __str__(self) -> str:
        return "; ".join(self.lines())

    __repr__ = __str__

