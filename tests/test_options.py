"""Every bad option is one UsageError sentence, before anything is packed or started."""

from __future__ import annotations

import os
import re
import time
import tracemalloc

import pytest
from IPython.core.error import UsageError

from mpi_magic.backends import registry
from mpi_magic.magic import MpiMagics
from mpi_magic.notebook import pipeline
from mpi_magic.notebook.session import Session
from mpi_magic.options import CELL, JOB, LINE, ONE_OFF, Config, LaunchOptions, Option


@pytest.mark.parametrize(("line", "message"), [
    ("-i 0", "--instances must be 1 or more, not 0"),
    ("-g -1", "--gpus must be 1 or more, not -1"),
    ("--gpus two", "--gpus must be a whole number, not 'two'"),
    ("--backend locl", "--backend 'locl' is not a backend; did you mean 'local'?"),
    ("--backend azure", "--backend 'azure' is not a backend; choose one of local, sagemaker"),
    ("--env NOEQUALS", "--env 'NOEQUALS' is not KEY=VALUE"),
    ("--env 1BAD=x", "--env '1BAD=x' is not KEY=VALUE"),
    ("--gpu 2", "unrecognized arguments: --gpu 2; did you mean --gpus?"),
    ("--instnces 2", "unrecognized arguments: --instnces 2; did you mean --instances?"),
    ("--timeout 0", "--timeout must be more than 0 seconds"),
    ("--timeout soon", "--timeout must be a number of seconds, not 'soon'"),
    ("--max-cost -3", "--max-cost must be a number of US dollars above 0, like 25 or 0.5, not '-3'"),
    ("--max-cost lots", "--max-cost must be a number of US dollars above 0, like 25 or 0.5, not 'lots'"),
    ("--max-cost inf", "--max-cost must be a number of US dollars above 0, like 25 or 0.5, not 'inf'"),
    ("--max-cost 5", "--max-cost $5.00 cannot be kept: the local backend's ranks run on this machine, which the "
     "meter puts no price on; drop it"),
    ("--out 2job", "--out '2job' is not a valid variable name"),
    ("--out class", "--out 'class' is not a valid variable name"),
    ('--mpirun-args "--mca btl', "cannot be split"),
    ("--view text", "unrecognized arguments: --view text"),
    ("--quiet extra", "unrecognized arguments: extra"),
    ("--backend slurm -i 2 --mpirun-args=--oversubscribe", "--oversubscribe in the mpirun arguments puts every rank "
     "on the first instance (Open MPI 5 then maps by core, not by each host's slots): use --map-by slot:oversubscribe"),
    ('--backend sagemaker -i 2 --mpirun-args "-v --oversubscribe"', "use --map-by slot:oversubscribe instead"),
])
def test_invalid_options_raise_one_usage_error_before_anything_starts(ip, cache_dir, line, message):
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("mpirun_remote", line, "x = 1")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))
    assert "x" not in ip.user_ns


def test_cloud_options_need_the_sagemaker_backend(ip, cache_dir):
    with pytest.raises(UsageError, match="--instance-type applies to --backend sagemaker only"):
        ip.run_cell_magic("mpirun_remote", "--instance-type ml.g5.xlarge", "x = 1")
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))


def test_a_missing_configured_mpirun_is_one_clear_sentence(ip, monkeypatch, cache_dir):
    monkeypatch.setenv("MPI_MAGIC_MPIRUN", "/nowhere/mpirun")
    with pytest.raises(UsageError, match="the configured mpirun '/nowhere/mpirun' is not an executable file"):
        ip.run_cell_magic("mpirun_remote", "", "x = 1")
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))


def test_mpirun_config_sets_shows_and_resets_defaults(ip, capsys):
    ip.run_line_magic("mpirun_config", "instances=2 gpus=3")
    ip.run_cell_magic("mpirun_remote", "--gather --quiet", "import mpi_magic\nr = (mpi_magic.num_instances(), mpi_magic.world_size())")
    assert ip.user_ns["r"] == [(2, 6)] * 6
    ip.run_line_magic("mpirun_config", "")
    shown = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in shown if line.split()[0] in ("instances", "gpus")] == [
        ["instances", "2", "(%mpirun_config)"], ["gpus", "3", "(%mpirun_config)"]]
    ip.run_line_magic("mpirun_config", "--reset")
    assert "(%mpirun_config)" not in capsys.readouterr().out


@pytest.mark.parametrize(("line", "message"), [
    ("instance=2", "'instance' is not a setting; did you mean instances?"),
    ("gpus=0", "gpus must be 1 or more"),
    ("backend=cloud", "is not a backend"),
    ("gpus", "'gpus' is not key=value"),
    ('mpirun_args="--mca btl', "cannot be split"),
    ("view=fancy", "'fancy' is not a view; choose one of auto, widgets, text"),
    ("max_cost=-1", r"max_cost must be a number of US dollars above 0, like 25 or 0.5, not '-1'"),
    ("max_idle=0", "max_idle must be more than 0 seconds"),
])
def test_mpirun_config_rejects_bad_settings_and_keeps_the_old_ones(ip, line, message):
    ip.run_line_magic("mpirun_config", "gpus=2")
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("mpirun_config", line)
    assert ip.magics_manager.registry["MpiMagics"].defaults.get("gpus") == 2


def test_environment_variables_give_defaults_and_cell_options_win(ip, monkeypatch):
    monkeypatch.setenv("MPI_MAGIC_GPUS", "3")
    ip.run_cell_magic("mpirun_remote", "--quiet", "import mpi_magic\nn = mpi_magic.world_size()")
    assert ip.user_ns["n"] == 3
    ip.run_cell_magic("mpirun_remote", "--quiet -g 2", "import mpi_magic\nn = mpi_magic.world_size()")
    assert ip.user_ns["n"] == 2


def test_a_bad_environment_default_names_the_variable(ip, monkeypatch):
    monkeypatch.setenv("MPI_MAGIC_INSTANCES", "many")
    with pytest.raises(UsageError, match="MPI_MAGIC_INSTANCES must be a whole number, not 'many'"):
        ip.run_cell_magic("mpirun_remote", "", "x = 1")


def test_config_precedence_without_a_shell():
    config = Config(environ={"MPI_MAGIC_BACKEND": "local", "MPI_MAGIC_KEEP_JOBS": "5"})
    assert config.lookup("keep_jobs") == (5, "MPI_MAGIC_KEEP_JOBS")
    config.update("keep_jobs=7")
    assert config.lookup("keep_jobs") == (7, "%mpirun_config")
    config.update("keep_jobs=")
    assert config.lookup("keep_jobs") == (5, "MPI_MAGIC_KEEP_JOBS")
    assert set(registry.settings()) >= {"backend", "instances", "gpus", "mpirun", "cache_dir", "keep_jobs", "timeout"}


def test_a_settings_former_name_still_sets_it():
    assert Config(environ={"MPI_MAGIC_IDLE_TIMEOUT": "90"}).lookup("max_idle") == (90.0, "MPI_MAGIC_IDLE_TIMEOUT")
    config = Config(environ={"MPI_MAGIC_IDLE_TIMEOUT": "90", "MPI_MAGIC_MAX_IDLE": "60"})
    assert config.lookup("max_idle") == (60.0, "MPI_MAGIC_MAX_IDLE"), "the new name wins"
    config.update("idle_timeout=30")
    assert config.lookup("max_idle") == (30.0, "%mpirun_config")


def test_help_lists_every_option(ip):
    doc = ip.magics_manager.magics["cell"]["mpirun_remote"].__doc__
    for option in ("-i INSTANCES, --instances INSTANCES", "-g GPUS, --gpus GPUS", "--backend", "--gather", "--out",
                   "--env", "--timeout", "--mpirun-args", "--quiet"):
        assert option in doc


@pytest.mark.parametrize("line", ["", "job-1 job-2", "job-1 --out", "--out handle", "job-1 --bogus", "job-1 --o handle",
                                  "'job-1"])
def test_attach_without_a_job_name_or_with_other_words_is_one_sentence(ip, line):
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("mpirun_attach", line)
    assert str(caught.value) == "usage: %mpirun_attach JOB_NAME [--out NAME]; %mpirun_jobs lists your recent jobs"


def test_attach_help_lists_its_arguments(ip):
    doc = ip.magics_manager.magics["line"]["mpirun_attach"].__doc__
    assert "JOB_NAME" in doc and "--out NAME" in doc and "(see %mpirun_jobs)" in doc


@pytest.mark.parametrize(("line", "passed"), [
    ('--mpirun-args "--report-bindings"', "--report-bindings"),
    ("--mpirun-args --report-bindings", "--report-bindings"),
    ("--mpirun-args=--report-bindings", "--report-bindings"),
    ("--mpirun-args -v", "-v"),
    ('--mpirun-args "--mca btl self,sm"', "--mca btl self,sm"),
])
def test_mpirun_args_may_be_a_single_flag(ip, capsys, cache_dir, line, passed):
    ip.run_cell_magic("mpirun_remote", line + " --dry-run", "x = 1")
    command = capsys.readouterr().out
    assert f" --tag-output {passed} " in command
    assert "x" not in ip.user_ns


@pytest.mark.parametrize(("line", "message"), [
    ("-i 2 -g 513 --dry-run", "1026 ranks (2 x 513) is more than the local backend runs (1024 at most"),
    ("-i 100000 -g 100000 --dry-run", "10000000000 ranks (100000 x 100000) is more than the local backend runs"),
    ("--backend sagemaker -i 100000 -g 100000 --dry-run",
     "10000000000 ranks (100000 x 100000) is more than the sagemaker backend runs (65536 at most"),
])
def test_absurd_world_sizes_are_refused_at_once(ip, cache_dir, line, message):
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("mpirun_remote", line, "x = 1")
    assert time.monotonic() - started < 1
    assert message in str(caught.value) and str(caught.value).endswith("; lower --instances or --gpus")
    assert "\n" not in str(caught.value)
    assert not os.path.exists(os.path.join(cache_dir, "jobs"))


def test_a_dry_run_builds_nothing_per_rank(cache_dir, capsys):
    """The plan of a million ranks costs what the plan of one does: no per-rank state is made for it."""
    config = Config(environ={"MPI_MAGIC_CACHE_DIR": cache_dir})
    options = LaunchOptions(instances=1000, gpus=1000, dry_run=True)
    tracemalloc.start()
    try:
        pipeline.run_cell("x = 1", {}, options, config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "-np 1000000 " in capsys.readouterr().out
    assert peak < 5 * 2**20


def _two_values(option: Option, tmp_path) -> tuple[str, str]:
    """Two values the line takes for an option: 7 and 8, except where the form is checked as it is parsed."""
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/plan-"
    requirements = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path in requirements:
        path.write_text("numpy\n")
    checked = {"backend": ("local", "sagemaker"), "env": ("A=7", "A=8"), "tags": ("team=7", "team=8"),
               "training_plan": (plan + "7", plan + "8"), "requirements": tuple(map(str, requirements)),
               "max_wait": ("7 --spot", "8 --spot"),  # (--max-wait needs --spot)
               "labels": ("a=7", "a=8"), "annotations": ("a=7", "a=8"), "node_selector": ("a=7", "a=8"),
               "volume": ("claim:/7", "claim:/8")}
    return checked.get(option.dest, ("7", "8"))


def _session(line: str, tmp_path) -> Session:
    """A session's handle as %mpirun_session start makes it for this line; the rule needs no ranks."""
    options = registry.parse_line(MpiMagics.mpirun_session, line, registry.config())
    return Session("s", options.backend, options, 5.0, str(tmp_path))


def _cell(line: str, session: Session) -> LaunchOptions:
    return registry.parse_line(MpiMagics.mpirun_remote, line, registry.config(), session.options)


@pytest.mark.parametrize("option", [o for o in registry.options() if o.scope == JOB], ids=lambda o: o.flag)
def test_a_session_cell_giving_another_value_of_an_option_that_shapes_the_job_is_refused(option, tmp_path):
    """Every JOB option declared, whichever backend it applies to: the session's own value is taken."""
    start = f"--backend {option.only or 'local'} -g 1"
    if option.declaration.get("action") == "store_true":
        without, given = _session(start, tmp_path), _session(f"{start} {option.flag}", tmp_path)
        refusal, taken = without.mismatch(_cell(option.flag, without)), given.mismatch(_cell(option.flag, given))
    else:
        own, other = _two_values(option, tmp_path)
        session = _session(f"{start} {option.flag} {own}", tmp_path)
        refusal = session.mismatch(_cell(f"{option.flag} {other}", session))
        taken = session.mismatch(_cell(f"{option.flag} {own}", session))
    assert refusal is not None and taken is None
    assert option.flag in refusal and "--no-session" in refusal and "\n" not in refusal
    if option.dest != "env":  # (--env's sentence says how to set a variable in the cell instead)
        assert refusal.startswith("this cell asks for ") and ", but session s runs " in refusal


@pytest.mark.parametrize("option", [o for o in registry.options() if o.scope != JOB], ids=lambda o: o.flag)
def test_a_session_cell_gives_its_own_options_except_those_of_a_one_off_job(option, tmp_path):
    session = _session("-g 1", tmp_path)
    value = {"out": " job"}.get(option.dest, "" if option.declaration.get("action") == "store_true" else " 7")
    refusal = session.mismatch(_cell(option.flag + value, session))
    if option.scope in (CELL, LINE):
        assert refusal is None
    else:
        assert refusal == (f"{option.flag} applies to one-off cells, not to a session's; run the cell as a "
                           "one-off job with --no-session")


def _named(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_session_help_lists_only_the_options_start_takes(ip):
    """``%mpirun_session?`` shows, in its usage and its list of options, what ``%mpirun_session start``
    accepts: a cell's own options (CELL and ONE_OFF, which start refuses) are not among them."""
    doc = ip.magics_manager.magics["line"]["mpirun_session"].__doc__
    usage, _, rest = doc.partition("\n\n")
    listed = usage + rest[rest.index("\noptions:"):]
    assert {o.flag for o in registry.options() if _named(o.flag, listed)} == {o.flag for o in registry.options() if o.scope in (LINE, JOB)}
    assert _named("--max-idle", listed) and _named("--detach", listed)


@pytest.mark.parametrize("option", [o for o in registry.options() if o.scope in (CELL, ONE_OFF)], ids=lambda o: o.flag)
def test_a_cells_own_option_on_session_start_says_where_it_goes(ip, option):
    value = "" if option.declaration.get("action") == "store_true" else " 7"
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("mpirun_session", f"start {option.flag}{value}")
    assert str(caught.value) == (f"{option.flag} applies to cells, not to %mpirun_session start; give it on a "
                                 "%%mpirun_remote cell's line")
