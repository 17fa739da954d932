"""A cell's job as a folder that runs again without a notebook (``%mpirun_export``): the cell, the
values it reads, the launch for its backend and shape, and ``run.sh``, which runs it from a terminal
or CI through ``python -m mpi_magic.submit`` and writes the results to ``results.pickle``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from typing import Any, Mapping

from IPython.core.error import UsageError

from .. import __version__
from ..backends import registry
from ..options import Config, LaunchOptions
from ..shared import jobdir, payload
from . import capture
from .job import Job
from .pipeline import cell_meta

EXPORT_FILE = "export.json"  # what submit reads: the job's name, options and cell
RESULTS_FILE = "results.pickle"  # {name: value} the cell assigned, as the cell brought them back
LAUNCH_FILE = "launch.txt"
_PER_CELL = ("out", "quiet", "dry_run", "run_async", "job_name", "no_session", "detach")  # not the job's shape


def export(job: Job, namespace: Mapping[str, Any], folder: str, config: Config,
           cell_names: capture.CellNames = lambda filename: None) -> list[str]:
    """Write ``folder`` for ``job`` (a one-off cell of this notebook); what the user should hear about it.

    The values are the job's own payload where its folder kept it (``keep_payloads``), else the
    notebook's values of the names the cell reads, packed as a cell packs them (a value that cannot
    be written raises ``CaptureError`` naming it)."""
    options = job.launch
    if job.reopened:
        raise UsageError(f"job {job.name} was reopened from its folder, which keeps no launch options: "
                         "%mpirun_export exports a job from the notebook that ran it")
    if options is None:
        raise UsageError(f"job {job.name} ran on a session or was attached: %mpirun_export exports a one-off "
                         "cell's job (run the cell with --no-session, then export it)")
    if os.path.exists(folder) and os.listdir(folder) and not os.path.exists(os.path.join(folder, EXPORT_FILE)):
        raise UsageError(f"{folder} holds files of its own: choose an empty or new folder with --to")
    code = capture.analyze(job.source, job.cell_file)
    forget_results(folder)
    kept = os.path.join(job.job_dir, payload.PAYLOAD_FILE)
    captured = None if os.path.exists(kept) else capture.capture(code, namespace, cell_names=cell_names)
    jobdir.make_private_dirs(folder)
    path = os.path.join(folder, payload.PAYLOAD_FILE)
    notes = []
    if captured is None:
        with open(kept, "rb") as src, jobdir.open_private(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        payload.write(path, captured.packed, cell_meta(code, options), digest=False)
        changed = sorted(set(code.assigns) & {packed.name for packed in captured.packed})
        notes.append(f"the values exported are the notebook's now (job {job.name}'s payload was removed when it "
                     "ended: keep_payloads in %mpirun_config keeps it)"
                     + (f"; the cell assigned {', '.join(changed)} after reading them, so they hold what it made of "
                        "them" if changed else ""))
    shape = {name: value for name, value in dataclasses.asdict(options).items() if name not in _PER_CELL}
    shape["settings"] = {name: value for name, value in options.settings.items() if name not in _PER_CELL}
    shape["given"] = sorted(options.given)
    shape["env"] = sorted(options.env)  # names only: the values (tokens, keys) come from where it runs
    copied = {}  # the files the backend's settings name, copied: run.sh runs from any working directory
    for setting, original in _files(options).items():
        copied[setting] = _kept_as(setting, original)
        shape["settings"][setting] = copied[setting]
        try:
            shutil.copyfile(original, os.path.join(folder, copied[setting]))
        except OSError as exc:
            raise UsageError(f"{registry.flag_of(setting)} {original!r}, which job {job.name} ran with, cannot be "
                             f"copied ({exc.strerror}): export from the folder the notebook ran it in") from None
    planned = dataclasses.replace(options, env={name: f"${name}" for name in options.env}, settings={
        **options.settings, **{setting: os.path.join(folder, name) for setting, name in copied.items()}})
    exported = {"name": job.name, "backend": job.backend, "options": shape, "source": code.source,
                "cell_file": code.filename, "returns": code.assigns, "python": payload.python_version(),
                "mpi_magic": __version__}
    _write(folder, EXPORT_FILE, json.dumps(exported, indent=1))
    _write(folder, "cell.py", code.source if code.source.endswith("\n") else code.source + "\n")
    backend = registry.make(options.backend, config, planned)
    digest = payload.file_digest(path) if backend.pins_digest else None
    os.makedirs(os.path.join(folder, "results"), mode=0o700, exist_ok=True)  # where the launch line's ranks write
    _write(folder, LAUNCH_FILE, backend.plan(folder, job.name, digest, planned).removeprefix("would run: ") + "\n")
    _write(folder, "run.sh", RUN_SH, mode=0o700)
    _write(folder, "README.md", readme(job, options))
    return notes


def forget_results(folder: str) -> None:
    """Remove the results of an earlier run, so that ``results.pickle`` is only ever this run's."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, RESULTS_FILE))


def _write(folder: str, name: str, text: str, mode: int = 0o600) -> None:
    with jobdir.open_private(os.path.join(folder, name)) as f:
        f.write(text)
    os.chmod(os.path.join(folder, name), mode)


RUN_SH = """\
#!/usr/bin/env bash
# Runs the exported cell as the notebook ran it: every rank's output here, exit status 1 when a rank
# fails, and what the cell assigned in results.pickle (see README.md). PYTHON chooses the Python;
# SIGTERM (or Ctrl-C) stops the job as the notebook's Ctrl-C does.
set -eu
exec "${PYTHON:-python3}" -m mpi_magic.submit "$(cd "$(dirname "$0")" && pwd)" "$@"
"""


def readme(job: Job, options: LaunchOptions) -> str:
    """What the folder holds and needs, in words."""
    backend = registry.declaration(options.backend)
    needs, launch = backend.export_needs or f"the {backend.name} backend", backend.export_launch
    extra = f", with its `[{backend.extra}]` extra" if backend.extra else ""
    returns = ", ".join(f"`{name}`" for name in capture.analyze(job.source, job.cell_file).assigns) or "nothing"
    env = (f"\nThe cell ran with `--env` {', '.join(f'`{name}`' for name in sorted(options.env))}: the export keeps "
           "their names, not their values, which `run.sh` takes from the environment it runs in (it names any that "
           "is missing and starts nothing).\n" if options.env else "")
    files = "".join(f"- `{_kept_as(setting, original)}`: the file the cell's `{registry.flag_of(setting)}` named.\n"
                    for setting, original in _files(options).items())
    return f"""# {job.name}, exported

The cell of job `{job.name}`, to run again without a notebook: {options.instances} x {options.gpus} ranks on the
{options.backend} backend, as it ran.

```bash
bash run.sh
```
{env}
It prints every rank's output (`[rank N]` before each line) and how the job went, exits with status 1
when a rank fails (its traceback printed), 2 when the job cannot run (one sentence says why: a missing
`--env` variable, a missing file, the backend refusing it), 143 when SIGTERM stopped it (130 for Ctrl-C;
the job is stopped first, so a cancelled CI run leaves nothing running) and 0 when every rank succeeded,
and writes what the cell assigns ({returns}) to `results.pickle`, a dict of name to value as the cell brought them back (rank 0's;
lists by rank with `--gather`):

```python
import pickle
results = pickle.load(open("results.pickle", "rb"))
```

- `cell.py`: the cell, as it ran (for reading: `payload.bin` holds it too).
- `payload.bin`: the cell and the values it reads, pickled (load them only from a source you trust).
- `export.json`: the job's name, backend and options, the Python and mpi_magic versions it was exported with.
{files}- `{LAUNCH_FILE}`: {launch}, as `--dry-run` prints it for this folder; `run.sh` runs the same in a job folder of its
  own (under the cache folder), follows it as the notebook does and collects its results.

It needs Python {payload.python_version()} with mpi_magic {__version__} (`python -m pip install /path/to/mpi_magic`{extra}), cloudpickle,
and what the cell imports (mpi4py for MPI), and {needs}. `PYTHON=/path/to/python bash run.sh` picks the
Python.
"""


def _files(options: LaunchOptions) -> dict[str, str]:
    """{setting: path} of the files the job's backend takes along (``Declaration.files``) that it names."""
    return {setting: options.settings[setting] for setting in registry.declaration(options.backend).files
            if options.settings.get(setting)}


def _kept_as(setting: str, original: str) -> str:
    """The name of a setting's file in the export: ``requirements.txt`` for --requirements a/reqs.txt."""
    return setting + os.path.splitext(original)[1]


def read(folder: str) -> dict[str, Any]:
    """``export.json`` of ``folder``; ``FileNotFoundError`` or ``ValueError`` where there is none."""
    with open(os.path.join(folder, EXPORT_FILE)) as f:
        return json.load(f)


def launch_options(exported: dict[str, Any], folder: str, environ: Mapping[str, str] = os.environ) -> LaunchOptions:
    """The options the exported cell in ``folder`` ran with, for a run of its own: its ``--env`` values
    taken from ``environ`` (``UsageError`` naming those it lacks), the files its settings name the folder's copies."""
    shape = dict(exported["options"])
    shape["settings"] = dict(shape.get("settings", {}))
    for setting in registry.declaration(exported["backend"]).files:
        if shape["settings"].get(setting):
            shape["settings"][setting] = os.path.join(folder, shape["settings"][setting])
    shape["given"] = frozenset(shape.get("given", ()))
    names = sorted(shape.get("env", ()))
    missing = [name for name in names if name not in environ]
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise UsageError(f"the job ran with --env {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                         f"not set here: set {them} in the environment run.sh runs in (an export keeps the names of "
                         "--env variables, not their values)")
    shape["env"] = {name: environ[name] for name in names}
    return LaunchOptions(**{name: value for name, value in shape.items()
                            if name in {f.name for f in dataclasses.fields(LaunchOptions)}})

