#!/usr/bin/env bash
# Head importance (paper section 4.1) of the pretrained WMT14 En-Fr model on newstest2009-2012.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") WMT_DIR OUT_DIR

WMT_DIR   output of scripts/reproductions/prepare_wmt14_en_fr.sh (bundle/model.pt, bin/)
OUT_DIR   importance.json/.tsv/.png are written here

The paper estimates I_h on newstest2009-2012 (sentence level, the training
loss). Add --loss-ablation to EXTRA_ARGS to also measure each head's loss
increase when masked alone (288 passes over the sets). I_h is estimated in
fp32 on any device (docs/importance.md).

environment:
  VENV        virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  MAX_TOKENS  tokens per batch (default: 4000; GPU-sized)
  IMPORTANCE_SUBSETS  the sets I_h is estimated on (default: newstest2009 ... newstest2012)
  EXTRA_ARGS  further fairseq-headprune importance options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 2 ]] || { usage >&2; exit 2; }
wmt_dir=$1 out_dir=$2
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PRECISION=fp32  # I_h is estimated in fp32 on any device, whatever PRECISION the other studies run at
# shellcheck disable=SC1091
source "$repo/scripts/reproductions/wmt_common.sh"

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
estimate_importance "$out_dir" "${MAX_TOKENS:-4000}" ${EXTRA_ARGS:-}
