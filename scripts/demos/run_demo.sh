#!/usr/bin/env bash
# The embedded default: the whole study on the demo task, from the synthetic
# corpus to results/demo/report.md.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs the demo study in OUT_DIR (default: results/demo): corpus in data/,
checkpoints (one per epoch) in checkpoints/, translations in generate/, head
importance in importance/, ablation tables and figures in ablation/, pruning
curves and random budgets in pruning/, the shrunk model and its speed in
shrink/, training dynamics in dynamics/, the commands in commands/, and
everything in report.md: Michel et al.'s studies, 22 to 28 minutes on 2 cores.
What goes beyond the paper on the same model (Fisher search, mask tuning,
learned gates, FFN neurons, the shrunk models' speed in CTranslate2) is
scripts/demos/run_compression_demo.sh.  Finished steps are skipped, so an interrupted run
continues where it stopped and a finished one reruns in under a minute.

Every step is seeded and runs on a fixed number of CPU threads with the CPU
kernels' instruction set pinned (see scripts/train/train_demo.sh), so two runs on one
machine print the same tables; environment.txt records the versions, the
thread counts, the instruction sets and the CPU. The sweeps (ablate, prune,
dynamics) run as RANKS processes under torchrun, each translating its share of
the configurations on THREADS/RANKS threads (on 2 cores that is about 1.3x
faster than one process on 2 threads); every configuration's translation is
the one a single process makes.

environment:
  VENV       virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  THREADS    CPU threads for training and every study (default 2)
  RANKS      processes the sweeps are sharded over with torchrun (default 2; 1: no torchrun)
  EPOCHS_STUDIED  epoch checkpoints of the training-dynamics study (default 3-5,7,10: epochs 1-2 translate nothing yet)
  HEAD_MASK  the masked configuration to compare (default: "E:1:1", one head)
  plus those of scripts/data/prepare_demo_data.sh and scripts/train/train_demo.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/demo}
head_mask=${HEAD_MASK:-E:1:1}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/generate"

bash "$repo/scripts/data/prepare_demo_data.sh" "$out_dir/data"
bash "$repo/scripts/train/train_demo.sh" "$out_dir/data/bin" "$out_dir/checkpoints" \
  2>&1 | tee -a "$out_dir/train.log" | grep --line-buffered -E "valid on|done training" || true
[[ -f "$out_dir/checkpoints/checkpoint_best.pt" ]] || { echo "training failed: see $out_dir/train.log" >&2; exit 1; }

translate() {  # NAME [fairseq-generate options...]
  local name=$1; shift
  if ! grep -q 'BLEU4 = ' "$out_dir/generate/$name.txt" 2> /dev/null; then
    record generate fairseq-headprune generate "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt" \
      --gen-subset test --beam 5 --lenpen 1 --batch-size 128 "$@" > "$out_dir/generate/$name.tmp" \
      2> "$out_dir/generate/$name.log" || { echo "fairseq-generate failed: see $out_dir/generate/$name.log" >&2; exit 1; }
    mv "$out_dir/generate/$name.tmp" "$out_dir/generate/$name.txt"
  fi
  printf '%-28s %s\n' "$name" "$(grep -o 'BLEU4 = .*' "$out_dir/generate/$name.txt")"
}

echo "tokenized BLEU on the demo test set (fairseq's bleu scorer):"
# the ceiling: the test sentences with every word's most frequent translation,
# scored against the sampled references (no model can expect more)
[[ -f "$out_dir/data/majority/test.fr" ]] || \
  fairseq-headprune corpus "$out_dir/data/majority" --majority --seed "${SEED:-1}" --scale "${SCALE:-1.0}" > /dev/null
fairseq-score --sys "$out_dir/data/majority/test.fr" --ref "$out_dir/data/raw/test.fr" 2> /dev/null \
  | grep 'BLEU4 = ' > "$out_dir/generate/ceiling-majority-references.txt"
printf '%-28s %s\n' "ceiling (majority refs)" "$(grep -o 'BLEU4 = .*' "$out_dir/generate/ceiling-majority-references.txt")"
translate "no-mask"
translate "mask-${head_mask//[^A-Za-z0-9,=-]/_}" --head-mask "$head_mask"
translate "mask-A_last_layer_all" --head-mask "A:$(( ${LAYERS:-3} )):*"

importance_dir="$out_dir/importance"
if [[ ! -f "$importance_dir/importance.json" ]]; then
  echo "head importance on the validation set (and the loss increase when each head alone is masked):"
  record importance fairseq-headprune importance "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt" \
    --importance-subset valid --out-dir "$importance_dir" --loss-ablation --no-progress
fi
# the same with the label-smoothed loss the model was trained on: how well each
# loss's gradient predicts the increase of that loss when a head is masked
if [[ ! -f "$importance_dir-label-smoothed/importance.json" ]]; then
  echo "the same with label-smoothed cross-entropy (ε = 0.1) as the loss:"
  record importance fairseq-headprune importance "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt" \
    --importance-subset valid --out-dir "$importance_dir-label-smoothed" --importance-loss label_smoothed --loss-ablation --no-progress \
    | grep -E "^(estimated|spearman)"
fi

# ablation studies (paper section 3): the sweeps are stored per configuration,
# so a rerun only recomputes the tables
ablation=(sweep ablate "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt"
          --gen-subset test --out-dir "$out_dir/ablation" --beam 5 --lenpen 1 --batch-size 128 --no-progress)
echo "every head masked alone, on the test set and the domain-shifted one (Table 1, Figures 1 and 2):"
record ablate-single "${ablation[@]}" --mode cross-domain --cross-subset test1
echo "every head kept alone in its layer (Table 2):"
record ablate-all-but-one "${ablation[@]}" --mode all-but-one

# pruning curves (paper sections 4.2 and 5, Budhraja et al.): every order over all
# heads, the importance order per attention type, random heads within budgets.
# A pruned model can babble up to fairseq's 200-token limit; the demo's sentences
# have at most 27 tokens, so output is capped at 1.2 x source + 10 tokens.
pruning=(sweep prune "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt"
         --gen-subset test --out-dir "$out_dir/pruning" --importance "$importance_dir/importance.json"
         --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 --no-progress)
echo "pruning all heads by importance (once / re-estimated), by single-head ΔBLEU, at random (Figure 3):"
record prune-all "${pruning[@]}" --scopes all --orders importance,iterative,ablation,random --ablation "$out_dir/ablation/single.json"
echo "pruning one attention type at a time by importance (Figure 4), and random heads within budgets:"
record prune-types "${pruning[@]}" --scopes enc-enc,enc-dec,dec-dec --orders importance \
  --layer-budget "642 246 642" --layer-budget "246 642 246" \
  --type-budget "(6,15,15)" --type-budget "(15,6,15)" --type-budget "(15,15,6)"

# real removal of the least important half of the heads, and translation speed
if [[ ! -f "$out_dir/shrink/speed.json" ]]; then
  echo "removing the least important half of the heads for real, and timing translation:"
  record speed python "$repo/scripts/benchmarks/benchmark_speed.py" --data "$out_dir/data/bin" \
    --path "$out_dir/checkpoints/checkpoint_best.pt" --importance "$importance_dir/importance.json" \
    --fractions 0.5 --batch-sizes 1 64 --sentences 50 --repeats 3 \
    --keep-dir "$out_dir/shrink" --json "$out_dir/shrink/speed.json"
fi

# training dynamics (paper section 6): importance (on the validation set) and the
# pruning curve on the test set at epoch checkpoints spaced for Figure 5's log scale
echo "importance over training: the pruning curve at epochs ${EPOCHS_STUDIED:-3-5,7,10} (Figure 5):"
record dynamics sweep dynamics "$out_dir/data/bin" --checkpoints "$out_dir/checkpoints" \
  --epochs "${EPOCHS_STUDIED:-3-5,7,10}" \
  --out-dir "$out_dir/dynamics" --gen-subset test --importance-subset valid \
  --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 --no-progress

fairseq-headprune report "$out_dir" --title "fairseq-headprune: the demo study"
echo "beyond the paper on the same model (Fisher search, tuning, gates, FFN neurons, speed): bash scripts/demos/run_compression_demo.sh"
