#!/usr/bin/env bash
# Set up a virtual environment with everything mpi_magic needs, then run one task:
#   ./dev.sh demo    execute notebooks/quickstart.ipynb headless on the local backend
#   ./dev.sh test    run the test suite, three workers per core (extra arguments go to pytest)
#   ./dev.sh notebooks   re-execute the notebooks (or those named) and store them as they ran
#   ./dev.sh bench   run the benchmarks
set -euo pipefail
cd "$(dirname "$0")"
task="${1:-}"
[ $# -gt 0 ] && shift

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,demo]'
# An editable install leaves the package uncompiled, and where PYTHONDONTWRITEBYTECODE is set every
# rank would compile it again at start-up; a normal install compiles it once, as this does.
.venv/bin/python -m compileall -q mpi_magic

case "$task" in
    demo)
        # headless: no browser renders widgets, so the live view is printed as text lines
        out="$(mktemp -d)"
        MPI_MAGIC_VIEW=text .venv/bin/jupyter nbconvert --to notebook --execute notebooks/quickstart.ipynb \
            --output-dir "$out" --output quickstart
        .venv/bin/python - "$out/quickstart.ipynb" <<'PY'
import re
import sys

import nbformat

for cell in nbformat.read(sys.argv[1], as_version=4).cells:
    if cell.cell_type == "code":
        print("\n>>> " + cell.source.replace("\n", "\n... "))
        for output in cell.outputs:
            if output.output_type == "error":  # the cell that fails on purpose
                print(re.sub("\x1b\\[[0-9;]*m", "", "\n".join(output.traceback)))
                continue
            text = output.get("text") or output.get("data", {}).get("text/plain", "") + "\n"
            print(text, end="")
PY
        rm -rf "$out" ;;
    test)
        # the tests' Slurm cluster (mpi_magic.testing.slurm_cluster) runs Debian's daemons: installed
        # here where they are missing and this is a root shell with apt; elsewhere their tests are skipped
        # (libpmix-dev: Slurm's srun --mpi=pmix loads its unversioned libpmix.so)
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
                && { [ ! -x /usr/sbin/slurmctld ] || ! ls /usr/lib/*/libpmix.so >/dev/null 2>&1; }; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client \
                munge libpmix-dev >/dev/null || echo "Slurm could not be installed; its tests will be skipped"
        fi
        # three workers per core; the tests that share a module's servers go to one worker (tests/conftest.py):
        # most of a test is waiting on kernels, mpirun and the emulated cloud (see docs/development.md);
        # -n 0 runs them in this process
        .venv/bin/python -m pytest -n "$(( 3 * $(nproc) ))" --dist loadscope "$@" ;;
    notebooks)
        .venv/bin/python notebooks/execute.py "$@" ;;
    bench)
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
        for script in benchmarks/bench_*.py; do .venv/bin/python "$script" "$@"; done ;;
    *)
        echo "usage: ./dev.sh demo|test|notebooks|bench" >&2; exit 2 ;;
esac
