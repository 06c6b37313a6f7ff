#!/usr/bin/env bash
# The cross-domain ablation study: scripts/studies/ablate.sh cross-domain DATA_BIN CHECKPOINT SPLIT OUT_DIR [TYPE]
# (see scripts/studies/ablate.sh --help for the options and environment).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/ablate.sh" cross-domain "$@"
