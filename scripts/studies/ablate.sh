#!/usr/bin/env bash
# Run one ablation study of Michel et al. (2019, section 3) with fairseq-headprune ablate.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") STUDY DATA_BIN CHECKPOINT SPLIT OUT_DIR [TYPE]

STUDY     single (Table 1, Figure 1), all-but-one (Table 2) or cross-domain (Figure 2)
DATA_BIN  fairseq-preprocess output directory
SPLIT     test split to translate (e.g. test, or newstest2013 for the WMT model)
OUT_DIR   results directory; an interrupted run continues where it stopped
TYPE      enc-enc, enc-dec or dec-dec (default: all three)

environment:
  VENV            virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  GEN_ARGS        fairseq-generate options (default: "--beam 5 --lenpen 1 --batch-size 128")
  BLEU            tokenized (default) or sacrebleu
  TEST            bootstrap (default), compare-mt, sacrebleu-bs or sacrebleu-ar
  SAMPLES         bootstrap resamples (default: 1000)
  SEED            resampling seed (default: 12345)
  ALPHA           significance level (default: 0.01)
  CROSS_SUBSET    cross-domain: the out-of-domain split (default: test1)
  CROSS_DATA      cross-domain: its data directory (default: DATA_BIN)
  SELECT_SUBSET   all-but-one: choose each layer's head on this split too (appendix A)
  EXTRA_ARGS      further fairseq-headprune ablate options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 5 || $# -eq 6 ]] || { usage >&2; exit 2; }
study=$1 data_bin=$2 checkpoint=$3 split=$4 out_dir=$5 type=${6:-}
case $study in single|all-but-one|cross-domain) ;; *) echo "unknown study: $study" >&2; usage >&2; exit 2 ;; esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

args=(--mode "$study" --gen-subset "$split" --out-dir "$out_dir"
      --bleu "${BLEU:-tokenized}" --test "${TEST:-bootstrap}" --samples "${SAMPLES:-1000}"
      --seed "${SEED:-12345}" --alpha "${ALPHA:-0.01}")
[[ -n $type ]] && args+=(--types "$type")
if [[ $study == cross-domain ]]; then
  args+=(--cross-subset "${CROSS_SUBSET:-test1}")
  [[ -n ${CROSS_DATA:-} ]] && args+=(--cross-data "$CROSS_DATA")
fi
[[ $study == all-but-one && -n ${SELECT_SUBSET:-} ]] && args+=(--select-subset "$SELECT_SUBSET")

# shellcheck disable=SC2086  # GEN_ARGS and EXTRA_ARGS are lists of options
fairseq-headprune ablate "$data_bin" --path "$checkpoint" "${args[@]}" \
  ${GEN_ARGS:---beam 5 --lenpen 1 --batch-size 128} ${EXTRA_ARGS:-}
