#!/usr/bin/env bash
# What the WMT study scripts share (wmt_ablation.sh, wmt_importance.sh, wmt_pruning.sh); sourced, not run.
#
# Expects: repo (the checkout), wmt_dir (prepare_wmt14_en_fr.sh's output). Provides:
#   the environment of scripts/dev/setup_env.sh (VENV; VENV=system: the python3 on PATH as it is)
#   model             WMT_DIR/bundle/model.pt, checked to exist
#   precision_flags   the fairseq flag of PRECISION: fp16 (the default where torch sees a GPU, the
#                     precision docs/reproductions.md's timing plan was measured in), bf16, or fp32
#                     (no flag; the default on a CPU)
#   importance_subsets  the sets I_h is estimated on (IMPORTANCE_SUBSETS; the paper's newstest2009-2012)
#   estimate_importance OUT_DIR MAX_TOKENS [OPTION...]   I_h of the model on them (always in fp32)

model="$wmt_dir/bundle/model.pt"
[[ -f $model ]] || { echo "no $model: run scripts/reproductions/prepare_wmt14_en_fr.sh $wmt_dir first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

if python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then gpu=1; else gpu=0; fi
precision=${PRECISION:-$([[ $gpu == 1 ]] && echo fp16 || echo fp32)}
case $precision in
  fp32) precision_flags=() ;;
  fp16 | bf16)
    [[ $gpu == 1 ]] || { echo "PRECISION=$precision needs a GPU, and torch sees none (PRECISION=fp32 on a CPU)" >&2; exit 2; }
    precision_flags=("--$precision") ;;
  *) echo "PRECISION must be fp32, fp16 or bf16, got '$precision'" >&2; exit 2 ;;
esac
echo "WMT model $model, precision $precision" >&2

importance_subsets=${IMPORTANCE_SUBSETS:-newstest2009 newstest2010 newstest2011 newstest2012}
estimate_importance() {  # OUT_DIR MAX_TOKENS [importance options...]
  local out=$1 max_tokens=$2; shift 2
  # shellcheck disable=SC2086  # the subsets are a list
  fairseq-headprune importance "$wmt_dir/bin" --path "$model" --importance-subset $importance_subsets \
    --out-dir "$out" --max-tokens "$max_tokens" "$@"
}
