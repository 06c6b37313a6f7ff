#!/usr/bin/env bash
# The all-but-one ablation study: scripts/studies/ablate.sh all-but-one DATA_BIN CHECKPOINT SPLIT OUT_DIR [TYPE]
# (see scripts/studies/ablate.sh --help for the options and environment).
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/ablate.sh" all-but-one "$@"
