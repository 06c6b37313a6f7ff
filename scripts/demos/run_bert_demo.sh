#!/usr/bin/env bash
# The BERT-side demo: a small RoBERTa pretrained here (masked LM) and fine-tuned on a
# synthetic 3-way NLI task, and every study of the paper's BERT half on it, to report.md.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs the encoder-only study in OUT_DIR (default: results/bert-demo): corpus in
data/ (scripts/data/prepare_nli_data.sh: premise/hypothesis pairs labelled
entailment/neutral/contradiction, a matched test set and a mismatched one of
another domain, and text to pretrain on), a RoBERTa pretrained with the
masked-LM objective in pretrain/ (scripts/train/pretrain_roberta.sh) and fine-tuned
in checkpoints/ (scripts/train/train_classifier.sh, one checkpoint per epoch), then:
accuracy with heads masked through fairseq-validate in validate/, head
importance in importance/, ablation tables and figures in ablation/ (t-test;
matched test and mismatched test1; one head kept per layer, also chosen on
valid), pruning curves and random budgets in pruning/, the shrunk model and
its speed at the paper's batch sizes in shrink/ (Table 4), training dynamics
over the fine-tuning epochs in dynamics/, the commands in commands/, and
everything in report.md. Finished steps are skipped, so an interrupted run
continues where it stopped.

Seeded, on a fixed number of CPU threads with the CPU kernels' instruction set
pinned, as scripts/demos/run_demo.sh: two runs on one machine print the same tables.

environment:
  VENV       virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  THREADS    CPU threads for training and every study (default 2)
  RANKS      processes the sweeps are sharded over with torchrun (default 2; 1: no torchrun)
  LAYERS=6 HEADS=8 EMBED_DIM=128 FFN_DIM=256   the model
  PRETRAIN_EPOCHS=6 EPOCHS=6 LR=0.0003 WARMUP=150   pretraining and fine-tuning
  EPOCHS_STUDIED  fine-tuning epochs of the training-dynamics study (default 1-EPOCHS)
  HEAD_MASK  the masked configuration to validate (default: "E:1:1")
  plus those of scripts/data/prepare_nli_data.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/bert-demo}
head_mask=${HEAD_MASK:-E:1:1}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/validate"

export LAYERS=${LAYERS:-6} HEADS=${HEADS:-8} EMBED_DIM=${EMBED_DIM:-128} FFN_DIM=${FFN_DIM:-256}
epochs=${EPOCHS:-6}
data=$out_dir/data/bin/nli
checkpoint=$out_dir/checkpoints/checkpoint_best.pt
bash "$repo/scripts/data/prepare_nli_data.sh" "$out_dir/data"
echo "pretraining (masked LM, ${PRETRAIN_EPOCHS:-6} epochs):"
EPOCHS=${PRETRAIN_EPOCHS:-6} bash "$repo/scripts/train/pretrain_roberta.sh" "$out_dir/data/bin/pretrain" "$out_dir/pretrain" \
  2>&1 | tee -a "$out_dir/pretrain.log" | grep --line-buffered -E "valid on|done training" || true
[[ -f "$out_dir/pretrain/checkpoint_best.pt" ]] || { echo "pretraining failed: see $out_dir/pretrain.log" >&2; exit 1; }
echo "fine-tuning on NLI ($epochs epochs):"
RESTORE=$out_dir/pretrain/checkpoint_best.pt NUM_CLASSES=3 EPOCHS=$epochs LR=${LR:-0.0003} WARMUP=${WARMUP:-150} \
  bash "$repo/scripts/train/train_classifier.sh" "$data" "$out_dir/checkpoints" \
  2>&1 | tee -a "$out_dir/train.log" | grep --line-buffered -E "valid on|done training" || true
[[ -f "$checkpoint" ]] || { echo "fine-tuning failed: see $out_dir/train.log" >&2; exit 1; }

validate() {  # NAME SUBSET [fairseq-validate options...]
  local name=$1 subset=$2; shift 2
  if ! grep -q 'accuracy' "$out_dir/validate/$name.txt" 2> /dev/null; then
    record validate fairseq-headprune validate "$data" --path "$checkpoint" --valid-subset "$subset" \
      --batch-size 64 --required-batch-size-multiple 1 "$@" > "$out_dir/validate/$name.log" 2>&1 \
      || { echo "fairseq-validate failed: see $out_dir/validate/$name.log" >&2; exit 1; }
    grep -o "valid on '$subset' subset | loss .*" "$out_dir/validate/$name.log" | sed 's/ | wps.*//' \
      > "$out_dir/validate/$name.txt"
  fi
  printf '%-32s %s\n' "$name" "$(cat "$out_dir/validate/$name.txt")"
}
echo "fairseq-validate on the matched (test) and mismatched (test1) sets:"
validate "matched" test
validate "mismatched" test1
validate "matched-mask-${head_mask//[^A-Za-z0-9,=-]/_}" test --head-mask "$head_mask"
validate "matched-mask-E_last_layer_all" test --head-mask "E:$LAYERS:*"

importance_dir=$out_dir/importance
if [[ ! -f "$importance_dir/importance.json" ]]; then
  echo "head importance on the validation set (and the loss increase when each head alone is masked):"
  record importance fairseq-headprune importance "$data" --path "$checkpoint" \
    --importance-subset valid --out-dir "$importance_dir" --loss-ablation --no-progress
fi

ablation=(sweep ablate "$data" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/ablation"
          --test t-test --batch-size 64 --no-progress)
echo "every head masked alone, matched and mismatched (Table 1, Figures 1(b) and 2):"
record ablate-single "${ablation[@]}" --mode cross-domain --cross-subset test1
echo "every layer reduced to one head, the head also chosen on valid (Table 2, appendix A):"
record ablate-all-but-one "${ablation[@]}" --mode all-but-one --select-subset valid

echo "pruning by importance (once / re-estimated), by single-head Δaccuracy, at random (Figure 3(b)),"
echo "and random heads within budgets (Budhraja et al.):"
record prune-all sweep prune "$data" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/pruning" \
  --importance "$importance_dir/importance.json" --importance-subset valid \
  --orders importance,iterative,ablation,random --ablation "$out_dir/ablation/single.json" \
  --layer-budget 444444 --layer-budget 222666 --layer-budget 666222 --type-budget "(24)" \
  --batch-size 64 --no-progress

if [[ ! -f "$out_dir/shrink/classifier_speed.json" ]]; then
  echo "removing the least important half of the heads for real: examples per second (Table 4):"
  record speed python "$repo/scripts/benchmarks/benchmark_classifier_speed.py" --data "$data" --path "$checkpoint" \
    --subset test --importance "$importance_dir/importance.json" --examples 512 --repeats 3 \
    --keep-dir "$out_dir/shrink" --json "$out_dir/shrink/classifier_speed.json"
fi

echo "importance over fine-tuning: the pruning curve at epochs ${EPOCHS_STUDIED:-1-$epochs} (Figure 5):"
record dynamics sweep dynamics "$data" --checkpoints "$out_dir/checkpoints" --epochs "${EPOCHS_STUDIED:-1-$epochs}" \
  --out-dir "$out_dir/dynamics" --gen-subset test --importance-subset valid --batch-size 64 --no-progress

fairseq-headprune report "$out_dir" --title "fairseq-headprune: the BERT-side (NLI) demo"
