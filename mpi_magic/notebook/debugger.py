"""Post-mortem on a failed rank (``%mpirun_debug``): its traceback rebuilt as real frames here.

The rank kept its frames and their locals (``shared/postmortem.py``). Each frame is made again
by running a line that raises, compiled under the rank's file name and function name and placed
at the rank's line, in a namespace holding the rank's locals; the tracebacks of those runs are
chained outermost first. IPython's debugger then walks them as it walks any traceback: ``up``,
``down``, ``ll`` and ``p name`` work, and the cell's lines read as the cell shows them.
"""

from __future__ import annotations

import builtins
import io
import linecache
import pickle
import sys
import types
from typing import Any, Callable

from ..errors import JobError
from ..shared import cell, postmortem
from ..shared.layout import POST_MORTEM, result_path
from .job import Job

_RAISE = "__mpi_magic_post_mortem__"  # the name the rebuilt line raises; gone from the frame once it has
# Packages whose objects are the rank's own: MPI handles always (here one would start MPI in the
# kernel, and stand for the notebook's world, not the rank's), GPU runtimes unless the notebook
# imported them (loading one would take the GPU the ranks use).
RANKS_OWN = "mpi4py"
GPU_RUNTIMES = frozenset({"torch", "cupy", "jax", "tensorflow"})


class RemoteValue:
    """A local that did not come back as a value: it shows as the rank showed it."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class RankFailed(Exception):
    """What the rebuilt frames raise: the rank's exception, by its type's name and message."""


def failed_ranks(job: Job) -> list[int]:
    """The ranks that raised, the one that failed first first (``JobModel.failed_first``)."""
    return [state.rank for state in job.model.failed_first() if state.failure is not None and state.failure.error_type]


def load(job: Job, rank: int | None) -> tuple[int, dict]:
    """(rank, its record) for ``rank``, or the rank that failed first of those that kept their frames;
    ``JobError`` says why there is none."""
    failed = failed_ranks(job)
    if not failed:
        raise JobError(f"no rank of job {job.name} raised an exception: there is nothing to debug")
    if rank is None:  # the first to fail that kept its frames, as the error says %mpirun_debug opens
        rank = next((r for r in failed if job.ranks[r].post_mortem), failed[0])
    elif rank not in failed:
        raise JobError(f"rank {rank} of job {job.name} did not raise; the ranks that did: "
                       f"{', '.join(map(str, sorted(failed)))}")
    digest = job.ranks[rank].post_mortem
    if not digest:
        why = job.ranks[rank].post_mortem_lost or "it failed before or outside the cell's code"
        raise JobError(f"rank {rank} of job {job.name} kept no frames to debug ({why}); its traceback is in the "
                       "error above")
    path = result_path(job.job_dir, rank, POST_MORTEM)
    try:
        return rank, postmortem.read(path, digest)
    except FileNotFoundError:
        raise JobError(f"rank {rank}'s frames are not in the job's folder ({path}): it was pruned, or they could "
                       "not be fetched when the job ended") from None
    except (OSError, ValueError, pickle.UnpicklingError) as exc:
        raise JobError(f"rank {rank}'s frames could not be read from {path}: {exc}") from None


def traceback_of(record: dict) -> types.TracebackType:
    """The rank's frames as a traceback of real frames, outermost first."""
    exc = RankFailed(f"{record['error_type']}: {record['message']}")
    cell_globals: dict[str, Any] | None = None
    chain: list[types.TracebackType] = []
    for frame in record["frames"]:
        if frame["source"] and not linecache.getlines(frame["filename"]):  # not a file here, nor a cell it ran
            start, lines = frame["source"]
            _remember(frame["filename"], [""] * (start - 1) + [line.rstrip("\n") for line in lines])
        entries = frame["locals"].items()  # values first: loading one may import a module its peers name
        values = {name: value_of(entry) for name, entry in entries if entry[0] != postmortem.MODULE}
        values.update({name: value_of(entry) for name, entry in entries if entry[0] == postmortem.MODULE})
        if frame["in_cell"] and frame["name"] == "<module>":
            cell_globals = values  # the cell's own frame: its locals are its globals
            namespace, local = values, values
        elif frame["in_cell"] or cell.name_of(frame["filename"]):  # its globals are the cell's on the rank
            namespace, local = cell_globals if cell_globals is not None else {}, values
        else:
            namespace, local = {"__name__": frame["filename"]}, values
        chain.append(_raise_in(frame, namespace, local, exc))
    for outer, inner in zip(chain, chain[1:]):
        outer.tb_next = inner
    return chain[0]


def value_of(entry: tuple) -> Any:
    """A local as the rank kept it: the value itself where it came and loads here, the module
    where this notebook has imported it (importing one here, mpi4py.MPI say, could start MPI in
    the kernel), else its repr."""
    kind, data, text = entry
    if kind == postmortem.MODULE:
        return sys.modules.get(data) or RemoteValue(f"{text} (not imported in this notebook)")
    if kind == postmortem.VALUE:
        try:
            return _Unpickler(io.BytesIO(data)).load()  # the record's digest is the one the rank reported
        except Exception as exc:  # noqa: BLE001 - this local shows as its repr instead
            return RemoteValue(f"{text} (not loaded here: {type(exc).__name__}: {exc})")
    return RemoteValue(text)


class _Unpickler(pickle.Unpickler):
    """Loads a rank's local unless it needs what must not start in the notebook (``RANKS_OWN``,
    ``GPU_RUNTIMES``)."""

    def find_class(self, module: str, name: str) -> Any:
        package = module.partition(".")[0]
        if package == RANKS_OWN or (package in GPU_RUNTIMES and package not in sys.modules):
            raise pickle.UnpicklingError(f"it is {module}'s, which stays on the rank")
        return super().find_class(module, name)


def _raise_in(frame: dict, namespace: dict, local: dict, exc: BaseException) -> types.TracebackType:
    """One frame like the rank's: ``frame``'s function, file and line, ``local`` its locals."""
    first, line = frame["firstlineno"], frame["lineno"]
    first = min(first, line)
    code = compile("\n" * (line - first) + f"raise {_RAISE}", frame["filename"], "exec")
    code = code.replace(co_name=frame["name"], co_firstlineno=first)
    namespace.setdefault("__builtins__", builtins)
    local[_RAISE] = exc.with_traceback(None)  # a traceback of this frame alone, for chaining
    try:
        exec(code, namespace, local)  # noqa: S102 - a line that raises, to make the frame
    except RankFailed:
        tb = sys.exc_info()[2]
        assert tb is not None and tb.tb_next is not None
        return tb.tb_next  # the frame of the line run, without this function's
    finally:
        local.pop(_RAISE, None)
    raise AssertionError("the rebuilt line did not raise")


def _remember(filename: str, lines: list[str]) -> None:
    """Lines the debugger shows for ``filename`` (the cell, or a rank's file this machine lacks)."""
    cell.keep_lines(linecache, filename, "".join(line + "\n" for line in lines))


def interact(tb: types.TracebackType, debugger_cls: Callable[[], Any], commands: list[str] | None = None) -> None:
    """IPython's debugger on ``tb``, at its innermost frame, as ``%debug`` opens it; with
    ``commands``, it runs those and returns (a notebook run headless has no one to type them)."""
    pdb = debugger_cls()
    pdb.reset()
    pdb.botframe = tb.tb_frame
    if commands:
        pdb.cmdqueue.extend([*commands, "quit"])
    pdb.interaction(None, tb)
