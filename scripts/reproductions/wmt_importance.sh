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
increase when masked alone (288 passes over the sets).

environment:
  VENV        virtual environment to use (default: REPO/.venv)
  MAX_TOKENS  tokens per batch (default: 4000; GPU-sized)
  EXTRA_ARGS  further fairseq-headprune importance options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 2 ]] || { usage >&2; exit 2; }
wmt_dir=$1 out_dir=$2
[[ -f "$wmt_dir/bundle/model.pt" ]] || { echo "no $wmt_dir/bundle/model.pt: run scripts/reproductions/prepare_wmt14_en_fr.sh $wmt_dir first" >&2; exit 1; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
fairseq-headprune importance "$wmt_dir/bin" --path "$wmt_dir/bundle/model.pt" \
  --importance-subset newstest2009 newstest2010 newstest2011 newstest2012 --out-dir "$out_dir" \
  --max-tokens "${MAX_TOKENS:-4000}" ${EXTRA_ARGS:-}
