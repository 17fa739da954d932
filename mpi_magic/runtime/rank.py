"""One rank's life: find its place, load the payload, run the cell, report, write results.

Everything the client hears comes through ``wire.Emitter`` lines on stdout. A rank whose
cell raises reports the exception and exits without finalizing MPI, which makes the launcher
stop every other rank, including ranks blocked in a collective.
"""

from __future__ import annotations

import builtins
import os
import sys
import time
import types
from ..shared import envvars
TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up
if TYPE_CHECKING:
    from typing import NoReturn

from ..shared import cell, fabric, payload, procs, reporting, stacks, wire
from ..shared.layout import POST_MORTEM, VALUE_NAME, result_path, result_uri, split_s3
from . import on_import, resources, tqdm_hook

CELL_FILENAME = cell.FILENAME
CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect on every rank


class Placement:
    """Where a rank sits in the job (a plain class: dataclasses cost every rank milliseconds at start-up)."""

    __slots__ = ("rank", "world_size", "instance", "local_rank", "procs_per_instance", "instances")

    def __init__(self, rank: int, world_size: int, instance: int, local_rank: int, procs_per_instance: int,
                 instances: int):
        self.rank, self.world_size, self.instance, self.local_rank = rank, world_size, instance, local_rank
        self.procs_per_instance, self.instances = procs_per_instance, instances


def placement(environ: dict[str, str]) -> Placement:
    """Where this rank sits, from the launcher's variables (Open MPI, PMIx, MPICH).

    Ranks are placed by slot, ``procs_per_instance`` to an instance, so on one machine the
    ranks are grouped into the same simulated instances a multi-instance job would have.
    """
    def first(*names: str, default: int) -> int:
        for name in names:
            if environ.get(name, "").isdigit():
                return int(environ[name])
        return default

    rank = first("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", default=0)
    world_size = first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1)
    per_instance = max(1, first(envvars.PROCS_PER_INSTANCE, default=world_size))
    instances = first(envvars.INSTANCES, default=max(1, world_size // per_instance))
    return Placement(rank, world_size, rank // per_instance, rank % per_instance, per_instance, instances)


def export_placement(place: Placement, environ) -> None:
    """The variables mpi_magic and common frameworks (torch.distributed env://) read."""
    environ.update({
        envvars.RANK: str(place.rank),
        envvars.WORLD_SIZE: str(place.world_size),
        envvars.LOCAL_RANK: str(place.local_rank),
        envvars.INSTANCE: str(place.instance),
        envvars.INSTANCES: str(place.instances),
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.procs_per_instance),
        "GROUP_RANK": str(place.instance),
        "NODE_RANK": str(place.instance),
    })
    environ.setdefault("MASTER_ADDR", environ.get(envvars.MASTER_ADDR, "127.0.0.1"))
    environ.setdefault("MASTER_PORT", environ.get(envvars.MASTER_PORT, "29500"))


def main(argv: list[str]) -> int:
    job_dir = argv[0]
    digest = _option(argv, "--digest")
    results_uri = _option(argv, "--results")
    place, emitter, reporter = start_up()
    try:
        if not os.path.isdir(job_dir):  # (a launcher that runs elsewhere than the ranks, with the folder there)
            raise FileNotFoundError(f"the job folder {job_dir} is not on node {this_host()}: is it on a filesystem "
                                    "every node shares? (%mpirun_config cache_dir=...)")
        bundle = payload.read(os.path.join(job_dir, payload.PAYLOAD_FILE), digest)
        namespace = build_namespace(bundle)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the job stops
        _fail(emitter, reporter, exc)
    cell_file = bundle.meta["cell_file"]
    try:
        value = run_source(bundle.meta["source"], bundle.meta["code"], namespace, cell_file, bundle.meta["cell_name"])
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the job stops
        failed_at = time.time()  # keeping the frames may take seconds: the failure is when it was raised

        def publish(path: str) -> None:
            if results_uri:
                upload(path, result_uri(results_uri, place.rank, POST_MORTEM))

        _fail(emitter, reporter, exc, keep_post_mortem(exc, cell_file, _scratch_dir() if results_uri else job_dir,
                                                       place.rank, publish), failed_at, cell_file)
    reporter.flush()
    unreturned: dict[str, str] = {}
    results_digest = ""
    try:
        if place.rank == 0 or bundle.meta.get("gather"):
            results_dir = _scratch_dir() if results_uri else job_dir
            unreturned, results_digest = write_results(results_dir, place.rank, bundle.meta, namespace, value)
            if results_uri:
                upload(result_path(results_dir, place.rank), result_uri(results_uri, place.rank))
    except BaseException as exc:  # noqa: BLE001 - a rank whose results are lost has failed
        _fail(emitter, reporter, exc)
    emitter.emit(wire.FINISHED, ok=True, unreturned=unreturned, results_digest=results_digest)
    return 0


def start_up() -> tuple[Placement, wire.Emitter, reporting.Reporter]:
    """What every rank does first: die with the launcher, leave out the fabric transports its node
    cannot use, take the event token out of the environment, export its place, report that it
    started, start sampling its resources, and hook progress reporting."""
    _die_with_launcher()
    fabric.leave_out(os.environ)  # (before the cell, or the session's loop, starts MPI in this process)
    token = os.environ.pop(envvars.EVENT_TOKEN, "")  # the cell and what it starts never see it
    place = placement(dict(os.environ))
    export_placement(place, os.environ)
    for stream in (sys.stdout, sys.stderr):  # one write per line: launchers tag chunks, not lines
        stream.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    stacks.install(place.rank, token)  # (which may fork a process: before any thread starts)
    emitter = wire.Emitter(place.rank, event_writer(os.dup(1)), token)
    announce(emitter, place)
    resources.start(emitter, place.local_rank)
    reporter = reporting.Reporter(emitter)
    reporting.install(reporter)
    tqdm_hook.install(reporter)
    import gc

    gc.freeze()  # what is loaded by now lives as long as the rank: no collection need walk it again (ms a rank)
    gc.enable()  # (off while the runtime started: __main__)
    return place, emitter, reporter


def announce(emitter: wire.Emitter, place: Placement) -> None:
    emitter.emit(wire.STARTED, instance=place.instance, local_rank=place.local_rank,
                 world_size=place.world_size, host=this_host(), pid=os.getpid())


def this_host() -> str:
    """Under Slurm, the node's name in the cluster (what squeue and scontrol show), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def event_writer(fd: int, stream_name: str = "stdout"):
    """Events go to a private copy of the rank's stdout (or stderr), so a cell that closes or
    replaces it cannot silence them; the cell's buffered text goes first, to keep the order."""
    def write(line: str) -> None:
        try:
            getattr(sys, stream_name).flush()
        except Exception:  # noqa: BLE001 - the cell's stream may be closed or replaced
            pass
        data = line.encode("utf-8", errors="replace")
        while data:
            data = data[os.write(fd, data):]

    return write


def _die_with_launcher() -> None:
    """SIGKILL when the launcher that started this rank dies, so no rank outlives a killed
    notebook, even one that ignores SIGINT and SIGTERM."""
    import _signal  # type: ignore[import-not-found]  # signal's C part: the module's enums cost every rank milliseconds

    procs.die_with_parent(_signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before the call: nothing would send the signal
        os._exit(1)


def _scratch_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="mpi_magic_results_")


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] or None if name in argv else None


def upload(path: str, uri: str) -> None:
    """Put one rank's results where the notebook reads them (its own key: no rank overwrites another)."""
    import boto3  # only on cloud instances, where the image has it

    bucket, key = split_s3(uri)
    boto3.client("s3").upload_file(path, bucket, key)


def build_namespace(bundle: payload.Bundle) -> dict:
    """The cell's globals: captured values, with notebook functions re-bound to them."""
    namespace = new_namespace()
    load_into(bundle, namespace)
    return namespace


def new_namespace() -> dict:
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    shells: list = []

    def get_ipython():
        """The rank's shell over the cell's namespace, made on first use (most cells have no % or ! line)."""
        if not shells:
            from .shell import RankShell

            shells.append(RankShell(namespace))
        return shells[0]

    namespace["get_ipython"] = get_ipython
    return namespace


def load_into(bundle: payload.Bundle, namespace: dict) -> None:
    """Unpickle the bundle's values into ``namespace``, re-binding notebook functions to it."""
    for name in bundle.raw:
        try:
            namespace[name] = bundle.load(name)
        except Exception as exc:
            raise NotebookValueError(
                f"the notebook's {name} could not be loaded on this rank ({type(exc).__name__}: {exc}); "
                "if it needs a module from the notebook's folder or sys.path, make that importable on the "
                "ranks (for example --env PYTHONPATH=...)"
            ) from None
    if bundle.raw:  # (a cell that reads no notebook value has no function to rebind)
        from ..shared.rebind import rebind_all

        rebind_all(list(bundle.raw), namespace)


class NotebookValueError(RuntimeError):
    """A captured value did not load on the rank."""


def run_source(source: str, code: str, namespace: dict, filename: str = CELL_FILENAME, name: str | None = None):
    """Run the cell like IPython, as the notebook compiled it as ``filename`` (``code``:
    ``cell.compiled``): the value of its final expression is returned; top-level ``await`` works,
    as it does in a notebook. Tracebacks and warnings quote ``source`` and call it ``name``, the
    notebook's name of the cell, where it has one."""
    cell.remember(source, filename)
    on_import.after_import("linecache", cell.give_lines)  # read when a line is quoted
    if name is not None:
        cell.name_cell(filename, name)
    on_import.after_import("warnings", cell.name_cells_in_warnings)
    sys.argv = [filename]
    statements, expression = cell.code_of(code)
    _run(statements, namespace)
    if expression is None:
        return None
    return _run(expression, namespace)


def _run(code: types.CodeType, namespace: dict):
    result = eval(code, namespace)  # noqa: S307 - running the cell is the point
    if code.co_flags & CO_COROUTINE:  # the cell awaits at top level
        import asyncio  # only then: importing it costs a rank ~30 ms at start-up

        result = asyncio.run(result)
    return result


def write_results(job_dir: str, rank: int, meta: dict, namespace: dict, value) -> tuple[dict[str, str], str]:
    """Pack what the cell assigned; returns ({name: reason} for values that cannot come back,
    the results file's SHA-256).

    Modules are sent by name only: the notebook takes them from its own imports. A value
    larger than ``meta["return_limit"]`` bytes (a session's setting) does not come back either.
    """
    limit = meta.get("return_limit")
    values = {name: namespace[name] for name in meta["returns"] if name in namespace}
    if meta.get("value_at") and value is not None:
        values[VALUE_NAME] = value
    packed, unreturned, modules = [], {}, {}
    for name, val in values.items():
        if isinstance(val, types.ModuleType):
            modules[name] = val.__name__
            continue
        try:
            packed_value = payload.pack_result(name, val)
        except Exception as exc:  # noqa: BLE001 - reported per name; the rest still come back
            unreturned[name] = f"{type(val).__name__}: {type(exc).__name__}: {exc}"
            continue
        if limit is not None and packed_value.size > limit:
            unreturned[name] = (f"{type(val).__name__}, {payload.size_text(packed_value.size)}, more than the "
                                f"{payload.size_text(limit)} return_limit")
        else:
            packed.append(packed_value)
    path = result_path(job_dir, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    digest = payload.write(path, packed, {"rank": rank, "modules": modules})
    return unreturned, digest or ""


POST_MORTEM_LIMIT = 20.0  # seconds the frames may take to keep and send before the failure is reported without


def keep_post_mortem(exc: BaseException, cell_file: str, results_dir: str, rank: int, publish) -> dict[str, str]:
    """Write the failed cell's frames (its code compiled as ``cell_file``) and their locals for
    %mpirun_debug (``publish(path)`` sends them where the notebook reads them); what the failure
    reports of them: their SHA-256 (``post_mortem``), or why there are none (``post_mortem_lost``).
    Whatever goes wrong here, the failure is still reported, within ``POST_MORTEM_LIMIT`` seconds
    however long the upload takes (the locals take ``postmortem.TIME_LIMIT`` at most)."""
    if isinstance(exc, KeyboardInterrupt):  # stopped from outside: nothing of the cell's to inspect
        return {}
    import _thread

    kept: list[str] = []
    lost: list[str] = []
    done = _thread.allocate_lock()
    done.acquire()

    def keep() -> None:
        try:
            from ..shared import postmortem  # only on failure

            path = result_path(results_dir, rank, POST_MORTEM)
            digest = postmortem.write(path, postmortem.capture(exc, cell_file))
            publish(path)
            kept.append(digest)
        except BaseException as error:  # noqa: BLE001 - the traceback still goes to the notebook as an event
            lost.append(_cap(f"keeping them failed: {_safe(lambda: f'{type(error).__name__}: {error}', 'an error')}",
                             500))
        finally:
            done.release()

    try:
        _thread.start_new_thread(keep, ())
    except RuntimeError as error:
        return {"post_mortem_lost": f"keeping them failed: {error}"}
    if not done.acquire(timeout=POST_MORTEM_LIMIT):
        return {"post_mortem_lost": f"keeping them took longer than {POST_MORTEM_LIMIT:g} s"}
    if kept:
        return {"post_mortem": kept[0]}
    return {"post_mortem_lost": lost[0] if lost else "keeping them failed, and so did working out why"}


def _fail(emitter: wire.Emitter, reporter: reporting.Reporter, exc: BaseException,
          post_mortem: dict[str, str] | None = None, failed_at: float | None = None,
          cell_file: str = CELL_FILENAME) -> NoReturn:
    """Report the failure and end the rank without finalizing MPI, so the launcher stops the
    ranks still waiting on this one. Whatever goes wrong while reporting, the rank still ends."""
    try:
        report_failure(emitter, reporter, exc, post_mortem, failed_at, cell_file)
    finally:
        os._exit(1)


def report_failure(emitter: wire.Emitter, reporter: reporting.Reporter, exc: BaseException,
                   post_mortem: dict[str, str] | None = None, failed_at: float | None = None,
                   cell_file: str = CELL_FILENAME) -> None:
    """Report how the cell (compiled as ``cell_file``) failed, with what ``keep_post_mortem`` said of
    its frames, stamped ``failed_at`` (when it was raised; now if not given). Nothing here may depend
    on the cell's objects behaving."""
    try:
        try:
            reporter.flush()
        except BaseException:  # noqa: BLE001 - progress is the least of what matters now
            pass
        if isinstance(exc, KeyboardInterrupt):  # stopped from outside: not the cell's failure
            emitter.emit(wire.FINISHED, ok=False, error_type="KeyboardInterrupt", message="interrupted")
        else:
            error_type, message, trace = describe_failure(exc, emitter.rank, cell_file)
            emitter.emit(wire.FINISHED, ok=False, error_type=error_type, message=message, traceback=trace,
                         **(post_mortem or {}), **({"time": failed_at} if failed_at else {}))
    finally:
        flush_streams()


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed stream must not keep the rank alive
            pass


def describe_failure(exc: BaseException, rank: int, cell_file: str = CELL_FILENAME) -> tuple[str, str, str]:
    """(type name, message, traceback) of a failure, each falling back to what can be said
    when the exception's own ``__str__`` or traceback formatting fails."""
    error_type = _safe(lambda: type(exc).__name__, "BaseException")
    if isinstance(exc, SystemExit):
        code = _safe(lambda: repr(exc.code) if exc.code is not None else "", "")
        message = f"rank {rank} called sys.exit({code}) before the cell finished"
    else:
        message = _cap(_safe(lambda: str(exc), f"(the {error_type}'s message could not be shown)"), 2000)
    trace = _cap(_safe(lambda: format_traceback(exc, cell_file), ""), 8000)
    return error_type, message, trace


def _safe(describe, fallback: str) -> str:
    try:
        text = describe()
        return text if isinstance(text, str) else fallback
    except BaseException:  # noqa: BLE001 - any failure here is the cell's object misbehaving
        return fallback


def _cap(text: str, limit: int) -> str:
    """Keep an event line short enough for log agents that split long lines (the end matters most)."""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def format_traceback(exc: BaseException, cell_file: str = CELL_FILENAME) -> str:
    """The traceback from the first frame of the cell (compiled as ``cell_file``) on, without the
    runtime's own frames; the frames of code from the notebook's cells named as the notebook names them."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != cell_file:
        tb = tb.tb_next
    import traceback  # only when a cell fails

    from ..shared import notebook_cells

    return notebook_cells.renamed("".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__)))
