#!/usr/bin/env bash
# Install what the tests need (first run only) and run the test suite.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [PYTEST_ARGS...]

Creates .venv (or \$VENV) with the package and its pinned dependencies, then
runs pytest on tests/.  Extra arguments go to pytest (e.g. -k head_mask).

environment:
  VENV                  virtual environment to use (default: REPO/.venv)
  HEADPRUNE_TEST_CACHE  directory to keep the tiny test model between runs
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/setup_env.sh"
cd "$repo"
python -m pytest tests "$@"
