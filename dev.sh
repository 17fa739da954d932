#!/usr/bin/env bash
# Set up a virtual environment with everything mpi_magic needs, then run one task:
#   ./dev.sh demo    execute notebooks/quickstart.ipynb headless on the local backend
#   ./dev.sh test    run the test suite (extra arguments go to pytest)
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
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'

case "$task" in
    demo)
        # headless: no browser renders widgets, so the live view is printed as text lines
        MPI_MAGIC_VIEW=text .venv/bin/jupyter nbconvert --to markdown --stdout --execute notebooks/quickstart.ipynb ;;
    test)
        .venv/bin/python -m pytest "$@" ;;
    bench)
        for script in benchmarks/bench_*.py; do .venv/bin/python "$script" "$@"; done ;;
    *)
        echo "usage: ./dev.sh demo|test|bench" >&2; exit 2 ;;
esac
