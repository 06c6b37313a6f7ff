#!/usr/bin/env bash
# Beyond Michel et al. on the demo model: Kwon et al.'s Fisher search, rearrangement and mask tuning,
# learned gates, FFN neurons and heads against the layers' FLOPs, and the shrunk models' speed.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs scripts/demos/run_demo.sh in OUT_DIR (default: results/demo; its finished
steps are skipped, so after a demo run this starts at once), then on the same
trained model: hard-concrete gates trained to keep exactly the heads of
GATE_LEVELS in gates/, the comparison of pruning methods (importance,
iterative, Fisher search, rearranged, tuned, gates, random) in comparison/,
heads, FFN neurons and both against the layers' FLOPs with the shrunk models'
speed in fairseq and CTranslate2 and a short fine-tune in structures/
(scripts/studies/compare_structures.sh), and report.md again with all of it.
About 25 minutes on 2 cores after the demo. Finished steps are skipped.

environment:
  GATE_LEVELS  % of heads pruned the learned gates are trained for (default "30 50 70")
  plus those of scripts/demos/run_demo.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/demo}
bash "$repo/scripts/demos/run_demo.sh" "$out_dir"
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo
importance_dir="$out_dir/importance"

# beyond the paper: Kwon et al.'s (2022) Fisher search, rearrangement and mask tuning, and hard-concrete
# gates trained to keep exactly the heads of three pruning levels, on the same curves as importance and random
total_heads=$(( 3 * ${LAYERS:-3} * ${HEADS:-8} ))
gate_masks=()
for percent in ${GATE_LEVELS:-30 50 70}; do
  pruned=$(( (percent * total_heads + 99) / 100 ))  # rounded up, as the pruning levels are
  record gates bash "$repo/scripts/train/train_gates.sh" "$out_dir/data/bin" "$out_dir/checkpoints/checkpoint_best.pt" \
    "$out_dir/gates/pruned-$percent" "$(( total_heads - pruned ))" > /dev/null
  gate_masks+=("$out_dir/gates/pruned-$percent/mask.json")
done
echo "pruning to a budget: Fisher search, rearranged, tuned; learned gates; against importance and random:"
record comparison sweep prune "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt" \
  --gen-subset test --out-dir "$out_dir/comparison" --importance "$importance_dir/importance.json" \
  --orders importance,iterative,fisher,fisher-rearranged,random --tune-masks --tune-orders fisher-rearranged \
  --gate-masks "${gate_masks[@]}" --max-percent 70 \
  --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 --no-progress

# beyond the paper, for speed: heads, FFN neurons or both (Kwon et al.'s joint search) against the share of the
# attention and FFN layers' FLOPs removed, untuned and tuned; at half the FLOPs the shrunk models' decoding speed
# in fairseq and CTranslate2 (float32, int8), and one short fine-tune with the structure held
fisher_dir="$out_dir/importance-fisher"
if [[ ! -f "$fisher_dir/importance.json" ]]; then
  echo "Fisher information of every head and FFN neuron on the validation set:"
  record importance-fisher fairseq-headprune importance "$out_dir/data/bin" \
    --path "$out_dir/checkpoints/checkpoint_best.pt" --importance-subset valid --importance-method fisher \
    --importance-structures heads,ffn --out-dir "$fisher_dir" --no-progress > /dev/null
fi
GENERATION="--beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10" TUNE_LIMIT=500 \
  record structures bash "$repo/scripts/studies/compare_structures.sh" "$out_dir/data/bin" \
  "$out_dir/checkpoints/checkpoint_best.pt" "$out_dir/structures" "$fisher_dir/importance.json"

fairseq-headprune report "$out_dir" --title "fairseq-headprune: the demo study"
