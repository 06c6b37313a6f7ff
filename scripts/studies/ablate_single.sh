#!/usr/bin/env bash
# The single ablation study: scripts/studies/ablate.sh single DATA_BIN CHECKPOINT SPLIT OUT_DIR [TYPE]
# (see scripts/studies/ablate.sh --help for the options and environment).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/ablate.sh" single "$@"
