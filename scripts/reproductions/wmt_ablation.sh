#!/usr/bin/env bash
# The paper's ablation studies (section 3) on the pretrained WMT14 En-Fr model.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") WMT_DIR OUT_DIR [STUDY...]

WMT_DIR   output of scripts/reproductions/prepare_wmt14_en_fr.sh (bundle/model.pt, bin/)
OUT_DIR   results; an interrupted run continues where it stopped
STUDY     single, all-but-one, appendix-a, cross-domain (default: all four)

Paper settings: beam 5, length penalty 1, --remove-bpe, tokenized BLEU
(fairseq's scorer on Moses-tokenized text), paired bootstrap with 1000
resamples, p < 0.01. After each study the paper's figures are printed for
comparison.

environment:
  VENV               virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  MAX_TOKENS         tokens per batch (default: 8000; GPU-sized)
  CONFIGS_PER_BATCH  masked configurations translated together (default: 2)
  TEST               bootstrap (default) or compare-mt (the paper's tool)
  PRECISION          fp16 (default on a GPU), bf16, or fp32 (default on a CPU)
  EXTRA_ARGS         further fairseq-headprune ablate / fairseq-generate options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -ge 2 ]] || { usage >&2; exit 2; }
wmt_dir=$1 out_dir=$2; shift 2
studies=${*:-single all-but-one appendix-a cross-domain}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/reproductions/wmt_common.sh"

ablate() {  # OUT_SUBDIR [ablate options...]
  local dir=$1; shift
  # shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
  fairseq-headprune ablate "$wmt_dir/bin" --path "$model" --out-dir "$out_dir/$dir" \
    --beam 5 --lenpen 1 --remove-bpe --max-tokens "${MAX_TOKENS:-8000}" \
    --configs-per-batch "${CONFIGS_PER_BATCH:-2}" --test "${TEST:-bootstrap}" --samples 1000 "${precision_flags[@]}" "$@" ${EXTRA_ARGS:-}
}

for study in $studies; do
  case $study in
    single)
      ablate ablation --mode single --gen-subset newstest2013
      cat <<'PAPER'
paper (Michel et al. 2019, Table 1 and Figure 1), newstest2013, tokenized BLEU 36.05 unmasked:
  Enc-Enc: 8 of 96 heads change BLEU significantly when masked alone, half of them upwards;
  the largest drops are -0.53 (layer 1, head 6), -0.33 (1, 8), -0.31 (5, 1), -0.31 (6, 3).
  Over all 288 heads, most leave BLEU within about 0.5 of 36.05.
PAPER
      ;;
    all-but-one)
      ablate ablation --mode all-but-one --gen-subset newstest2013
      cat <<'PAPER'
paper (Table 2), best ΔBLEU per layer when one head is kept (layers 1-6):
  Enc-Enc -1.31 -0.16 0.12 -0.15 0.02 -0.36
  Enc-Dec  0.24  0.06 0.05 -0.24 -1.55 -13.56
  Dec-Dec -0.03  0.12 0.18  0.17 -0.04  0.24
PAPER
      ;;
    appendix-a)
      ablate appendix-a --mode all-but-one --gen-subset newstest2014 --select-subset newstest2013
      cat <<'PAPER'
paper (appendix A): each layer's head chosen on newstest2013, scored on newstest2014:
  keeping only that head changes BLEU not significantly in 50% of the layers.
PAPER
      ;;
    cross-domain)
      ablate ablation --mode cross-domain --gen-subset newstest2013 --cross-subset mtnt
      cat <<'PAPER'
paper (Figure 2): ΔBLEU per head on newstest2013 against MTNT correlates positively
  (r > 0.5, p < 0.01); the heads that matter most on one matter most on the other.
PAPER
      ;;
    *) echo "unknown study: $study" >&2; usage >&2; exit 2 ;;
  esac
done
