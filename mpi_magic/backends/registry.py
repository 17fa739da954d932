"""Every backend, each declared once in its own folder (``<name>/declaration.py``) and listed here:
the magic's options and help, %mpirun_config's settings, the session checks and the backend a cell
runs on are all built from this list. A backend registered later (``register``) is one like the others."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import shlex

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, construct_parser

from ..errors import BackendNotAvailable
from ..options import (CELL, COMMON_OPTIONS, COMMON_SETTINGS, DEFAULT_BACKEND, JOB, LINE, ONE_OFF, Config,
                       LaunchOptions, Option, Setting, check_job_name, check_out, joined_args, mlflow_experiment,
                       option, parse_env, with_suggestion)
from .base import AttachableBackend, Backend, Declaration
from .kubernetes.declaration import KUBERNETES
from .local.declaration import LOCAL
from .sagemaker.declaration import SAGEMAKER
from .slurm.declaration import SLURM

_DECLARED: dict[str, Declaration] = {d.name: d for d in (LOCAL, SAGEMAKER, SLURM, KUBERNETES)}
_generation = 0  # counts changes, so what is built from the list is built again after one
_MAGICS: list = []  # the magics whose options come from here (``launch_arguments``), whose parsers follow a change


def register(declaration: Declaration) -> None:
    """Add a backend (or replace the one of that name): from now on ``--backend NAME`` runs on it,
    and the magics' options and help say so."""
    _DECLARED[declaration.name] = declaration
    _changed()


def unregister(name: str) -> None:
    _DECLARED.pop(name, None)
    _changed()


def _changed() -> None:
    global _generation
    _generation += 1
    for func in _MAGICS:
        func.__doc__ = func.own_doc
        func.parser = construct_parser(_arguments(func, func.registry_session))


def declared() -> list[Declaration]:
    return list(_DECLARED.values())


def declaration(name: str) -> Declaration:
    if name not in _DECLARED:
        raise BackendNotAvailable(f"there is no {name!r} backend; use one of {', '.join(_DECLARED)}")
    return _DECLARED[name]


def _backend_name(given: str, what: str) -> str:
    if given not in _DECLARED:
        close = difflib.get_close_matches(given, _DECLARED, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; choose one of {', '.join(_DECLARED)}"
        raise UsageError(f"{what} {given!r} is not a backend{hint}")
    return given


def settings() -> dict[str, Setting]:
    """Every setting: the backend, those all backends share, then each backend's own."""
    return _every_setting(_generation)


@functools.lru_cache(maxsize=1)
def _every_setting(generation: int) -> dict[str, Setting]:
    """``settings()`` as the list is in ``generation`` (made once for each)."""
    backend = Setting("backend", DEFAULT_BACKEND, _backend_name,
                      "where ranks run: " + ", ".join(f"{d.name} ({d.about})" for d in _DECLARED.values()))
    table = {"backend": backend, **COMMON_SETTINGS}
    for declared_backend in _DECLARED.values():
        table.update((s.name, s) for s in declared_backend.settings)
    idle = [f"{d.name} {d.idle_default:g}" for d in _DECLARED.values() if d.idle_default]
    if idle:
        table["max_idle"] = dataclasses.replace(table["max_idle"],
                                                help=f"{table['max_idle'].help} (default: {', '.join(idle)})")
    return table


def config(environ: dict[str, str] | None = None) -> Config:
    """The defaults behind every cell, knowing every backend's settings."""
    return Config(environ, settings)


SESSION_OPTIONS = [
    option(LINE, "--max-idle", "--idle-timeout", default=None, metavar="SECONDS",
           help="End the session after this many seconds without a cell (--idle-timeout is its former name)."),
    option(LINE, "--detach", action="store_true",
           help="Keep the session's job when the kernel shuts down (until the heartbeat limit), for "
                "%%mpirun_session attach from another kernel; for backends whose jobs outlive the kernel."),
]


def options(session: bool = False) -> list[Option]:
    """The options of %%mpirun_remote (``session``: of %mpirun_session start), in the order --help lists them."""
    return list(_every_option(_generation, session))


@functools.lru_cache(maxsize=4)
def _every_option(generation: int, session: bool) -> tuple[Option, ...]:
    """``options(session)`` as the list is in ``generation`` (made once for each)."""
    largest = ", ".join(f"{d.max_ranks} on {d.name}" for d in _DECLARED.values())
    shape = [dataclasses.replace(o, declaration={**o.declaration, "help": o.declaration["help"] +
                                                 f" World size is instances x gpus: at most {largest}."})
             if o.dest == "gpus" else o for o in COMMON_OPTIONS[:2]]
    backend = option(JOB, "--backend", default=None,
                     help="Where the ranks run: " + ", ".join(f"{d.name} ({d.about})" for d in _DECLARED.values()) +
                          f"; default {DEFAULT_BACKEND}.")
    own = [o for d in _DECLARED.values() for o in d.options]
    return tuple(shape + [backend] + COMMON_OPTIONS[2:] + own + (SESSION_OPTIONS if session else []))


def flag_of(dest: str) -> str:
    """The option as the user writes it: ``run_async`` -> ``--async``."""
    flags = {o.dest: o.flag for o in options(session=True)}
    return flags.get(dest) or "--" + dest.replace("_", "-")


def cell_only() -> frozenset[str]:
    """The options of a cell's own, refused on %mpirun_session start."""
    return frozenset(o.dest for o in options() if o.scope in (CELL, ONE_OFF))


def _arguments(func, session: bool):
    """Give ``func`` the registry's options as IPython's argument decorators (its help is built from them)."""
    if "own_doc" not in func.__dict__:
        func.own_doc = func.__doc__
        _MAGICS.append(func)
    func.registry_session = session
    func.has_arguments, func.decorators = True, []
    for each in reversed(options(session)):
        hidden = {"help": argparse.SUPPRESS} if session and each.scope in (CELL, ONE_OFF) else {}
        func = argument(*each.flags, **{**each.declaration, **hidden})(func)
    return func


def launch_arguments(func):
    """The options of %%mpirun_remote, from the registry."""
    return _arguments(func, session=False)


def session_start_arguments(func):
    """The options of ``%mpirun_session start``: a cell's own (CELL, ONE_OFF) are parsed, to be refused
    with a sentence that says where they go, but left out of the help."""
    return _arguments(func, session=True)


def refused_on_session(session: LaunchOptions, cell: LaunchOptions) -> list[Option]:
    """The options a cell's line gives that the session it runs on cannot take, decided by their
    declared scope: a one-off job's own, or one that shapes the job with another value than the
    session's, whose ranks run already (the session's own value is fine)."""
    return [o for o in options() if o.dest in cell.given and
            (o.scope == ONE_OFF or (o.scope == JOB and cell.value(o.dest) != session.value(o.dest)))]


def parse_line(magic_func, line: str, config: Config, session: LaunchOptions | None = None) -> LaunchOptions:
    """The magic's line -> validated ``LaunchOptions`` (``UsageError`` otherwise). ``session``: the
    options of the session the cell runs on unless it says --no-session or names a --backend: its
    backend and processes per instance are the cell's defaults."""
    every = options(session=True)
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"the options {line!r} cannot be split ({exc}); check their quotes") from None
    attached = {f for o in every if o.attached for f in o.flags}
    magic_parser = magic_func.parser
    magic_parser.allow_abbrev = False  # `--gpu 2` must not silently mean `--gpus 2`
    try:
        args = magic_parser.parse_args(_attach_values(argv, attached))  # shell-style quoting, unlike parse_argstring
    except UsageError as exc:
        raise UsageError(with_suggestion(str(exc), magic_parser)) from None
    env = parse_env(args.env)
    out = check_out(args.out)
    follows = session if session is not None and not args.no_session and args.backend is None else None
    backend = declaration(follows.backend if follows else config.pick("backend", args.backend))
    for each in every:
        if each.only and each.only != backend.name and getattr(args, each.dest, None) not in (None, False):
            raise UsageError(f"{each.flag} applies to --backend {each.only} only; add --backend {each.only} or drop it")
    own = backend.values(args, config)
    gpus = config.pick("gpus", args.gpus) or (follows.gpus if follows else backend.default_gpus(own)) or 1
    instances = config.pick("instances", args.instances)
    if instances * gpus > backend.max_ranks:
        raise UsageError(f"{instances * gpus} ranks ({instances} x {gpus}) is more than the {backend.name} backend "
                         f"runs ({backend.max_ranks} at most: {backend.why_max}); lower --instances or --gpus")
    extra = joined_args(config.get("mpirun_args"), args.mpirun_args and config.pick("mpirun_args", args.mpirun_args))
    if not backend.one_host and instances > 1 and "--oversubscribe" in shlex.split(extra):
        raise UsageError("--oversubscribe in the mpirun arguments puts every rank on the first instance (Open MPI 5 "
                         "then maps by core, not by each host's slots): use --map-by slot:oversubscribe instead")
    return LaunchOptions(
        instances=instances, gpus=gpus, backend=backend.name, gather=args.gather,
        out=out, env=env, timeout=config.pick("timeout", args.timeout), mpirun_args=shlex.split(extra),
        quiet=args.quiet, dry_run=args.dry_run, settings=own, job_name=check_job_name(args.job_name),
        run_async=args.run_async, no_session=args.no_session,
        mlflow=mlflow_experiment(args.mlflow, config),
        max_cost=config.pick("max_cost", args.max_cost) if args.max_cost is not None or backend.prices else None,
        max_idle=config.pick("max_idle", getattr(args, "max_idle", None)) or backend.idle_default,
        detach=getattr(args, "detach", False),
        given=frozenset(k for k, v in vars(args).items() if v not in (None, False, [])),
    )


def _attach_values(argv: list[str], attached: set[str]) -> list[str]:
    """``--mpirun-args --report-bindings`` -> ``--mpirun-args=--report-bindings`` for the options that
    take launcher arguments: argparse would take a lone value that starts with '-' for an option and refuse it."""
    joined, words = [], iter(argv)
    for word in words:
        value = next(words, None) if word in attached else None
        joined.append(word if value is None else f"{word}={value}")
    return joined


def make(name: str, config: Config, options: LaunchOptions) -> Backend:
    """The backend called ``name``, checked to be usable here (raises before anything starts)."""
    return declaration(name).make(config, options)


def attachable(config: Config) -> AttachableBackend:
    """The backend whose jobs another kernel can follow or take over (they outlive the kernel)."""
    for declared_backend in _DECLARED.values():
        if declared_backend.attach is not None:
            return declared_backend.attach(config)
    raise BackendNotAvailable("no backend's jobs outlive the kernel that started them, so none can be attached")


def attachable_names() -> list[str]:
    """The backends whose jobs outlive the kernel that started them."""
    return [d.name for d in _DECLARED.values() if d.attach is not None]
