#!/usr/bin/env bash
# Set up a virtual environment with everything mpi_magic needs, then run one task:
#   ./dev.sh demo    execute notebooks/quickstart.ipynb headless on the local backend
#   ./dev.sh test    run the test suite, three workers per core (extra arguments go to pytest), after
#                    installing with apt, as root, the Debian packages it uses where they are missing
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

# apt-get install PACKAGES where this is a root shell with apt; never fails the task: whatever could not
# be installed leaves the tests that need it skipped, each saying what to install
apt_updated=
apt_install() {
    local what="$1"
    shift
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        return 0
    fi
    if [ -z "$apt_updated" ]; then
        apt-get update -qq || true  # (lists from before may still do)
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
        || echo "$what could not be installed (apt-get install $*); its tests will be skipped"
}

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
        # what the suite runs beyond Python comes from Debian, installed here where it is missing (as root,
        # with apt): the tests' Slurm cluster runs Debian's daemons (mpi_magic.testing.slurm_cluster;
        # libpmix-dev: Slurm's srun --mpi=pmix loads its unversioned libpmix.so), MPICH is the second
        # launcher, Playwright drives Debian's Chromium in the browser tests (no browser is downloaded), and the
        # test hosts (mpi_magic.testing.hosts) each run Debian's sshd
        if [ ! -x /usr/sbin/slurmctld ] || ! ls /usr/lib/*/libpmix.so >/dev/null 2>&1; then
            apt_install Slurm slurmctld slurmd slurm-client munge libpmix-dev
        fi
        [ -x /usr/bin/mpiexec.mpich ] || apt_install MPICH mpich
        [ -x /usr/bin/chromium ] || apt_install Chromium chromium
        [ -x /usr/sbin/sshd ] || apt_install "The test hosts' sshd" openssh-server
        # three workers per core; the tests that share a module's servers go to one worker (tests/conftest.py):
        # most of a test is waiting on kernels, mpirun and the emulated cloud (see docs/development.md);
        # -n 0 runs them in this process. exec: pytest takes this shell's place, so an interrupt or a
        # SIGTERM sent to this script reaches it (and its fixtures stop every server they started)
        exec .venv/bin/python -m pytest -n "$(( 3 * $(nproc) ))" --dist loadscope "$@" ;;
    notebooks)
        .venv/bin/python notebooks/execute.py "$@" ;;
    bench)
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
        for script in benchmarks/bench_*.py; do .venv/bin/python "$script" "$@"; done ;;
    *)
        echo "usage: ./dev.sh demo|test|notebooks|bench" >&2; exit 2 ;;
esac
