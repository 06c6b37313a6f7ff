#!/usr/bin/env bash
# Install what the tests need (first run only) and run the test suite.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--quick] [PYTEST_ARGS...]

Creates .venv (or \$VENV) with the package and the pinned versions of
constraints.txt, then runs pytest on tests/: the full suite (what CI runs),
or with --quick only the tests that need no trained model (a few minutes on
2 cores; for development).  Extra arguments go to pytest (e.g. -k head_mask).

The test files are shared among TEST_WORKERS processes (pytest-xdist, one file
per process at a time, so a file's module fixtures are built once); the trained
models are built once per session and shared by every worker.

environment:
  VENV                  virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  HEADPRUNE_TEST_CACHE  directory to keep the tiny test models between runs
  TEST_WORKERS          test processes (default: 2; 0 runs everything in this one)
  OMP_NUM_THREADS       threads of each test process (default with workers: 1)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
cd "$repo"
if [[ ${1:-} == --quick ]]; then
  shift
  set -- -m "not slow" "$@"
fi
workers=${TEST_WORKERS:-2}
[[ $workers =~ ^[0-9]+$ ]] || { echo "run_tests.sh: TEST_WORKERS must be a number, got '$workers'" >&2; exit 2; }
if (( workers > 0 )); then
  # one thread each: the workers' models and timings share the cores instead of fighting over them
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
  set -- -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
python -m pytest tests "$@"
