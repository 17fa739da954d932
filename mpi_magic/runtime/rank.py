"""One rank's life: find its place, load the payload, run the cell, report, write results.

Everything the client hears comes through ``events.Emitter`` lines on stdout. A rank whose
cell raises reports the exception and exits without finalizing MPI, which makes the launcher
stop every other rank, including ranks blocked in a collective.
"""

from __future__ import annotations

import ast
import builtins
import linecache
import os
import socket
import sys
import traceback
import types
from dataclasses import dataclass

from .. import events, payload, reporting
from . import tqdm_hook
from .shell import RankShell

CELL_FILENAME = "<mpirun_remote cell>"
VALUE_NAME = "<value>"  # not an identifier, so it never collides with a variable


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    instance: int
    local_rank: int
    procs_per_instance: int
    instances: int


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
    per_instance = max(1, first("MPI_MAGIC_PROCS_PER_INSTANCE", default=world_size))
    instances = first("MPI_MAGIC_INSTANCES", default=max(1, world_size // per_instance))
    return Placement(rank, world_size, rank // per_instance, rank % per_instance, per_instance, instances)


def export_placement(place: Placement, environ) -> None:
    """The variables mpi_magic and common frameworks (torch.distributed env://) read."""
    environ.update({
        "MPI_MAGIC_RANK": str(place.rank),
        "MPI_MAGIC_WORLD_SIZE": str(place.world_size),
        "MPI_MAGIC_LOCAL_RANK": str(place.local_rank),
        "MPI_MAGIC_INSTANCE": str(place.instance),
        "MPI_MAGIC_INSTANCES": str(place.instances),
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.procs_per_instance),
        "GROUP_RANK": str(place.instance),
        "NODE_RANK": str(place.instance),
    })
    environ.setdefault("MASTER_ADDR", environ.get("MPI_MAGIC_MASTER_ADDR", "127.0.0.1"))
    environ.setdefault("MASTER_PORT", environ.get("MPI_MAGIC_MASTER_PORT", "29500"))


def main(argv: list[str]) -> int:
    job_dir = argv[0]
    digest = argv[argv.index("--digest") + 1] if "--digest" in argv else None
    place = placement(dict(os.environ))
    export_placement(place, os.environ)
    out = sys.stdout
    emitter = events.Emitter(place.rank, lambda line: (out.write(line), out.flush()))
    emitter.emit(events.RankStarted, instance=place.instance, local_rank=place.local_rank,
                 world_size=place.world_size, host=socket.gethostname(), pid=os.getpid())
    reporter = reporting.Reporter(emitter)
    reporting.install(reporter)
    tqdm_hook.install(reporter)
    try:
        bundle = payload.read(os.path.join(job_dir, payload.PAYLOAD_FILE), digest)
        namespace = build_namespace(bundle)
        value = run_source(bundle.meta["source"], namespace)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the job stops
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            value = None
        else:
            reporter.flush()
            return _fail(emitter, exc)
    reporter.flush()
    unreturned = {}
    if place.rank == 0 or bundle.meta.get("gather"):
        unreturned = write_results(job_dir, place.rank, bundle.meta, namespace, value)
    emitter.emit(events.RankFinished, ok=True, unreturned=unreturned)
    return 0


def build_namespace(bundle: payload.Bundle) -> dict:
    """The cell's globals: captured values, with notebook functions re-bound to them."""
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = RankShell(namespace).get_ipython
    for name in bundle.raw:
        namespace[name] = bundle.load(name)
    pending = [name for name, value in namespace.items() if _is_notebook_function(value)]
    while pending:  # functions a notebook function calls come along in its globals
        name = pending.pop()
        function = namespace[name]
        for key, val in function.__globals__.items():
            if key not in namespace:
                namespace[key] = val
                if _is_notebook_function(val):
                    pending.append(key)
        namespace[name] = _rebind(function, namespace)
    return namespace


def _is_notebook_function(value) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


def _rebind(function: types.FunctionType, namespace: dict) -> types.FunctionType:
    """Give a notebook function the cell's globals, as it has in the notebook.

    cloudpickle gives each function a private copy of the globals it used; without this a
    cell that changes ``scale`` would call a function that still sees the old one.
    """
    rebound = types.FunctionType(function.__code__, namespace, function.__name__,
                                 function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__dict__.update(function.__dict__)
    rebound.__qualname__ = function.__qualname__
    rebound.__doc__ = function.__doc__
    rebound.__annotations__ = function.__annotations__
    rebound.__module__ = function.__module__
    return rebound


def run_source(source: str, namespace: dict):
    """Run the cell like IPython: the value of a final expression is returned."""
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    tree = ast.parse(source, CELL_FILENAME, "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    sys.argv = [CELL_FILENAME]
    exec(compile(tree, CELL_FILENAME, "exec"), namespace)  # noqa: S102 - running the cell is the point
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), CELL_FILENAME, "eval"), namespace)  # noqa: S307


def write_results(job_dir: str, rank: int, meta: dict, namespace: dict, value) -> dict[str, str]:
    """Pack what the cell assigned; returns {name: reason} for values that cannot come back.

    Modules are sent by name only: the notebook takes them from its own imports.
    """
    values = {name: namespace[name] for name in meta["returns"] if name in namespace}
    if meta.get("display") and value is not None:
        values[VALUE_NAME] = value
    packed, unreturned, modules = [], {}, {}
    for name, val in values.items():
        if isinstance(val, types.ModuleType):
            modules[name] = val.__name__
            continue
        try:
            packed.append(payload.pack(name, val))
        except Exception as exc:  # noqa: BLE001 - reported per name; the rest still come back
            unreturned[name] = f"{type(val).__name__}: {type(exc).__name__}: {exc}"
    os.makedirs(os.path.join(job_dir, "results"), exist_ok=True)
    payload.write(result_path(job_dir, rank), packed, {"rank": rank, "modules": modules}, digest=False)
    return unreturned


def result_path(job_dir: str, rank: int) -> str:
    return os.path.join(job_dir, "results", f"rank-{rank}.bin")


def _fail(emitter: events.Emitter, exc: BaseException) -> int:
    emitter.emit(events.RankFinished, ok=False, error_type=type(exc).__name__,
                 message=str(exc), traceback=format_traceback(exc))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # no MPI_Finalize: the launcher then stops the ranks still waiting on this one


def format_traceback(exc: BaseException) -> str:
    """The traceback from the cell's first frame on, without the runtime's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL_FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
