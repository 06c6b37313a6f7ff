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

environment:
  VENV                  virtual environment to use (default: REPO/.venv)
  HEADPRUNE_TEST_CACHE  directory to keep the tiny test model between runs
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
python -m pytest tests "$@"
