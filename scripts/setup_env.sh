#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the package.
# Source it to get the environment activated:  source scripts/setup_env.sh
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$repo/.venv}
python=${PYTHON:-python3}

if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating virtual environment $venv" >&2
  "$python" -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"

stamp="$venv/.fairseq-headprune-installed"
if [[ ! -f "$stamp" || "$repo/setup.py" -nt "$stamp" ]]; then
  echo "installing fairseq-headprune and its dependencies into $venv" >&2
  pip install --quiet --disable-pip-version-check --upgrade pip
  # torch first, pinned: an unpinned resolve may pull a multi-GB CUDA build
  pip install --quiet --disable-pip-version-check "torch==2.13.0"
  pip install --quiet --disable-pip-version-check -e "$repo[test]"
  touch "$stamp"
fi
