#!/usr/bin/env bash
# The language-model demo: every study on a small transformer_lm trained on the
# demo corpus's French side, from the corpus to results/lm-demo/report.md.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs the decoder-only study in OUT_DIR (default: results/lm-demo): corpus in
data/ (scripts/data/prepare_lm_data.sh), checkpoints (one per epoch) in
checkpoints/ (scripts/train/train_lm.sh), perplexities in eval-lm/, head importance
in importance/, ablation tables and figures in ablation/ (test, and the
domain-shifted test1), pruning curves and random budgets in pruning/, the
shrunk model and its speed (tokens/s scoring and generating) in shrink/,
training dynamics in dynamics/, the commands in commands/, and everything in
report.md. Perplexity is the metric throughout (lower is better); every
sample is one sentence (--sample-break-mode eos, as the model was trained).
Finished steps are skipped, so an interrupted run continues where it stopped.

Seeded, on a fixed number of CPU threads with the CPU kernels' instruction set
pinned, as scripts/demos/run_demo.sh: two runs on one machine print the same tables.

environment:
  VENV       virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  THREADS    CPU threads for training and every study (default 2)
  RANKS      processes the sweeps are sharded over with torchrun (default 2; 1: no torchrun)
  EPOCHS_STUDIED  epoch checkpoints of the training-dynamics study (default 1-6)
  HEAD_MASK  the masked configuration to compare (default: "D:1:1", one head)
  plus those of scripts/data/prepare_lm_data.sh and scripts/train/train_lm.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/lm-demo}
head_mask=${HEAD_MASK:-D:1:1}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/eval-lm"

data=$out_dir/data/bin
checkpoint=$out_dir/checkpoints/checkpoint_best.pt
lm_options=(--sample-break-mode eos --max-tokens 4096)
bash "$repo/scripts/data/prepare_lm_data.sh" "$out_dir/data"
bash "$repo/scripts/train/train_lm.sh" "$data" "$out_dir/checkpoints" \
  2>&1 | tee -a "$out_dir/train.log" | grep --line-buffered -E "valid on|done training" || true
[[ -f "$checkpoint" ]] || { echo "training failed: see $out_dir/train.log" >&2; exit 1; }

evaluate() {  # NAME [fairseq-eval-lm options...]
  local name=$1; shift
  if ! grep -q 'Perplexity: ' "$out_dir/eval-lm/$name.txt" 2> /dev/null; then
    record eval-lm fairseq-headprune eval-lm "$data" --path "$checkpoint" --gen-subset test "${lm_options[@]}" "$@" \
      > "$out_dir/eval-lm/$name.log" 2>&1 || { echo "fairseq-eval-lm failed: see $out_dir/eval-lm/$name.log" >&2; exit 1; }
    grep -o 'Loss (base 2): .*' "$out_dir/eval-lm/$name.log" > "$out_dir/eval-lm/$name.txt"
  fi
  printf '%-28s %s\n' "$name" "$(cat "$out_dir/eval-lm/$name.txt")"
}

echo "fairseq-eval-lm on the demo LM's test set:"
evaluate "no-mask"
evaluate "mask-${head_mask//[^A-Za-z0-9,=-]/_}" --head-mask "$head_mask"
evaluate "mask-D_last_layer_all" --head-mask "D:$(( ${LAYERS:-3} )):*"

importance_dir="$out_dir/importance"
if [[ ! -f "$importance_dir/importance.json" ]]; then
  echo "head importance on the validation set (and the loss increase when each head alone is masked):"
  record importance fairseq-headprune importance "$data" --path "$checkpoint" \
    --importance-subset valid --out-dir "$importance_dir" --loss-ablation --no-progress
fi

ablation=(sweep ablate "$data" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/ablation"
          "${lm_options[@]}" --no-progress)
echo "every head masked alone, on the test set and the domain-shifted one (Table 1, Figures 1 and 2):"
record ablate-single "${ablation[@]}" --mode cross-domain --cross-subset test1
echo "every head kept alone in its layer (Table 2):"
record ablate-all-but-one "${ablation[@]}" --mode all-but-one

pruning=(sweep prune "$data" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/pruning"
         --importance "$importance_dir/importance.json" "${lm_options[@]}" --no-progress)
echo "pruning all heads by importance (once / re-estimated), by single-head Δperplexity, at random (Figure 3),"
echo "and random heads within budgets (Budhraja et al.):"
record prune-all "${pruning[@]}" --scopes all --orders importance,iterative,ablation,random \
  --ablation "$out_dir/ablation/single.json" --importance-subset valid \
  --layer-budget "642" --layer-budget "246" --layer-budget "444" --type-budget "(12)"

if [[ ! -f "$out_dir/shrink/lm_speed.json" ]]; then
  echo "removing the least important half of the heads for real: tokens/s scoring and generating:"
  record speed python "$repo/scripts/benchmarks/benchmark_lm_speed.py" --data "$data" --path "$checkpoint" \
    --importance "$importance_dir/importance.json" --fractions 0.5 --batch-sizes 1 64 --sentences 128 \
    --sampling-topk 10 --repeats 3 --keep-dir "$out_dir/shrink" --json "$out_dir/shrink/lm_speed.json"
fi

echo "importance over training: the pruning curve at epochs ${EPOCHS_STUDIED:-1-6} (Figure 5):"
record dynamics sweep dynamics "$data" --checkpoints "$out_dir/checkpoints" --epochs "${EPOCHS_STUDIED:-1-6}" \
  --out-dir "$out_dir/dynamics" --gen-subset test --importance-subset valid "${lm_options[@]}" --no-progress

fairseq-headprune report "$out_dir" --title "fairseq-headprune: the language-model demo"
