#!/usr/bin/env bash
# Pruning curves over the Dec-Dec heads: scripts/studies/prune.sh dec-dec DATA_BIN CHECKPOINT SPLIT OUT_DIR
# (see scripts/studies/prune.sh --help for the options and environment).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/prune.sh" dec-dec "$@"
