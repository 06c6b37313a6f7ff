#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the package with the
# exact versions of constraints.txt. Run it, or source it to get the environment activated:
#   source scripts/dev/setup_env.sh
# Sourcing leaves your shell's options as they were.
#
# VENV=system uses the python3 on PATH as it is (a cluster's CUDA environment, a machine
# without network): nothing is created or installed, fairseq-headprune must import there.

_headprune_setup() (
  set -euo pipefail
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  venv=${VENV:-$repo/.venv}
  python=${PYTHON:-python3}
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating virtual environment $venv" >&2
    "$python" -m venv "$venv"
  fi
  stamp="$venv/.fairseq-headprune-installed"
  if [[ ! -f "$stamp" || "$repo/setup.py" -nt "$stamp" || "$repo/constraints.txt" -nt "$stamp" ]]; then
    echo "installing fairseq-headprune and its pinned dependencies into $venv" >&2
    pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
    "${pip[@]}" install --upgrade pip
    # torch first, pinned: an unpinned resolve may pull a multi-GB CUDA build
    "${pip[@]}" install -c "$repo/constraints.txt" torch
    "${pip[@]}" install -c "$repo/constraints.txt" -e "$repo[fairseq,ctranslate2,test]"
    touch "$stamp"
  fi
)

if [[ ${VENV:-} == system ]]; then
  unset -f _headprune_setup
  if ! python3 -c "import fairseq_headprune, fairseq" 2>/dev/null; then
    echo "setup_env.sh: error: VENV=system, but $(command -v python3 || echo python3) cannot import fairseq_headprune and fairseq (pip install -e REPO[fairseq,ctranslate2] there, or leave VENV unset)" >&2
    return 1 2>/dev/null || exit 1
  fi
  command -v python > /dev/null || python() { python3 "$@"; }
else
  _headprune_setup || { echo "setup_env.sh: installation failed" >&2; return 1 2>/dev/null || exit 1; }
  unset -f _headprune_setup
  # shellcheck disable=SC1091
  source "${VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv}/bin/activate"
fi
