#!/usr/bin/env bash
# The paper's pruning curves (section 4.2, Figures 3 and 4) on the pretrained WMT14 En-Fr model, then report.md.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") WMT_DIR STUDY_DIR

WMT_DIR    output of scripts/reproductions/prepare_wmt14_en_fr.sh (bundle/model.pt, bin/)
STUDY_DIR  the study directory the other WMT scripts write to (e.g. results/wmt14):
           its importance/importance.json is estimated first where missing (as
           wmt_importance.sh does with its defaults); pruning curves go to
           STUDY_DIR/pruning, the report to STUDY_DIR/report.md. An interrupted
           run continues where it stopped.

Figure 3: all 288 heads pruned in 10% steps by importance I_h, and by each
head's single-head ΔBLEU (the paper's dashed lines) where wmt_ablation.sh's
single study is in STUDY_DIR/ablation/single.json.
Figure 4: one attention type at a time (Enc-Enc, Enc-Dec, Dec-Dec) by
importance. Scored on newstest2013 with the paper's settings (beam 5, length
penalty 1, --remove-bpe, tokenized BLEU).

environment:
  VENV        virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  MAX_TOKENS  tokens per batch (default: 8000; GPU-sized)
  ORDERS      orders of Figure 3 (default: importance,ablation where the ablation
              exists, else importance; add random for this project's random baseline)
  IMPORTANCE_SUBSETS  as for wmt_importance.sh
  PRECISION   fp16 (default on a GPU), bf16, or fp32 (default on a CPU)
  EXTRA_ARGS  further fairseq-headprune prune / fairseq-generate options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 2 ]] || { usage >&2; exit 2; }
wmt_dir=$1 study_dir=$2

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/reproductions/wmt_common.sh"

importance="$study_dir/importance/importance.json"
if [[ ! -f $importance ]]; then
  echo "head importance on $importance_subsets (section 4.1):"
  estimate_importance "$study_dir/importance" 4000  # wmt_importance.sh's batch; MAX_TOKENS and EXTRA_ARGS are prune's
fi
ablation="$study_dir/ablation/single.json"
if [[ -f $ablation ]]; then
  orders=${ORDERS:-importance,ablation} ablation_flags=(--ablation "$ablation")
else
  orders=${ORDERS:-importance} ablation_flags=()
  echo "no $ablation (wmt_ablation.sh WMT_DIR STUDY_DIR single): Figure 3 without the oracle order" >&2
fi

prune() {  # prune options...
  # shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
  fairseq-headprune prune "$wmt_dir/bin" --path "$model" --gen-subset newstest2013 --out-dir "$study_dir/pruning" \
    --importance "$importance" --beam 5 --lenpen 1 --remove-bpe --max-tokens "${MAX_TOKENS:-8000}" \
    --step-percent 10 "${precision_flags[@]}" "$@" ${EXTRA_ARGS:-}
}
echo "pruning all heads in 10% steps, orders $orders (Figure 3):"
prune --scopes all --orders "$orders" "${ablation_flags[@]}"
cat <<'PAPER'
paper (section 4.2, Figure 3(a)): up to 20% of the heads can be pruned by importance without
  a noticeable loss of BLEU (36.05 on newstest2013), which drops sharply beyond; ordering by the
  single-head ΔBLEU of section 3.2 (dashed) does worse than importance.
PAPER
echo "pruning one attention type at a time by importance (Figure 4):"
prune --scopes enc-enc,enc-dec,dec-dec --orders importance
cat <<'PAPER'
paper (section 5, Figure 4): BLEU drops much faster when Enc-Dec heads are pruned; more than 60%
  of them pruned is catastrophic, while Enc-Enc and Dec-Dec attention still give reasonable
  translations (BLEU around 30) with 20% of their heads.
PAPER
fairseq-headprune report "$study_dir" --title "fairseq-headprune: the WMT14 En-Fr model of Michel et al."
