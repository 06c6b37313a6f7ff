#!/usr/bin/env bash
# Prepare, on any machine (the CPU is enough), the tiny model that the quick GPU check
# (gpu_check.sh --quick) reads, so that the GPU only runs the checks.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [CACHE_DIR]

Trains the test suite's tiny model (tests/conftest.py: prepare_demo_data.sh and
train_demo.sh at tiny sizes, a few minutes on 2 cores) into CACHE_DIR, unless it
is there already, then runs the quick check once on the CPU path
(scripts/dev/device_check.py --device cpu, through tests/test_device_check.py),
so that a cache that reaches the GPU is known to work. The check reads
CACHE_DIR/bin and CACHE_DIR/checkpoints/checkpoint_last.pt (about 6 MB); carry
those to the GPU machine and run there:
  CACHE=CACHE_DIR bash scripts/dev/gpu_check.sh --quick

CACHE_DIR defaults to \$HEADPRUNE_TEST_CACHE, else REPO/results/gpu-check/cache
(the tests' own cache works: it holds the same model).

environment:
  VENV             virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  OMP_NUM_THREADS  threads (default: 1)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${1:-${HEADPRUNE_TEST_CACHE:-$repo/results/gpu-check/cache}}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
cd "$repo"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HEADPRUNE_TEST_CACHE=$cache \
  python -m pytest -p no:cacheprovider -q tests/test_device_check.py
echo "prepared $cache: $(du -sh "$cache/bin" | cut -f1) of data, $(du -sh "$cache/checkpoints/checkpoint_last.pt" | cut -f1) checkpoint; on the GPU: CACHE=$cache bash scripts/dev/gpu_check.sh --quick"
