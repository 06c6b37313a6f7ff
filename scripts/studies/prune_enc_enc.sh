#!/usr/bin/env bash
# Pruning curves over the Enc-Enc heads: scripts/studies/prune.sh enc-enc DATA_BIN CHECKPOINT SPLIT OUT_DIR
# (see scripts/studies/prune.sh --help for the options and environment).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/prune.sh" enc-enc "$@"
