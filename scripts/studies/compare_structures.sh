#!/usr/bin/env bash
# Heads, FFN neurons, or both: BLEU against the share of the layers' FLOPs removed, untuned and tuned,
# the shrunk models' decoding speed at one level, and one short fine-tune with the structure held.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN CHECKPOINT OUT_DIR FISHER_JSON

FISHER_JSON: importance.json of importance --importance-method fisher --importance-structures heads,ffn.
Writes, skipping what is done:
  OUT_DIR/{heads,ffn,joint}/   prune --structure S --x-axis flops, Fisher order/search, untuned and tuned
                               (mask tuning on --tune-subset valid), paired bootstrap against the unpruned
  OUT_DIR/level-LEVEL/S/       search --structure S --cost flops --budget (100-LEVEL)% (tuned), the shrunk
                               model, and its decoding speed against the unpruned model (benchmark_deploy.py)
  OUT_DIR/finetune-LEVEL/      compress --target flops=(100-LEVEL)% --finetune-updates FINETUNE_UPDATES

environment:
  LEVEL=50             % of the attention and FFN layers' FLOPs removed at the speed and fine-tune point
  MAX_PERCENT=70       the curves' last level (heads: % of heads; ffn, joint: % of the structure's FLOPs)
  TUNE_LIMIT=1500      validation sentences mask tuning reads
  FINETUNE_UPDATES=200 updates of the fine-tune (0: none)
  SPEED_SENTENCES=100  test sentences the speed is measured on (batch 1 and 64, 3 interleaved repeats)
  GENERATION           fairseq-generate options (default: --beam 5 --lenpen 1 --batch-size 100 --max-len-a 1.2
                       --max-len-b 10)
  SWEEP                the command that runs a sweep (default: fairseq-headprune; or a torchrun command line)
USAGE
}
[[ $# -eq 4 && $1 != -h && $1 != --help ]] || { usage; [[ ${1:-} == -h || ${1:-} == --help ]] && exit 0 || exit 2; }
data=$1 checkpoint=$2 out_dir=$3 fisher=$4
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
level=${LEVEL:-50}
kept=$(( 100 - level ))
read -r -a generation <<< "${GENERATION:---beam 5 --lenpen 1 --batch-size 100 --max-len-a 1.2 --max-len-b 10}"
read -r -a sweep <<< "${SWEEP:-fairseq-headprune}"
tuning=(--tune-masks --tune-subset valid --tune-limit "${TUNE_LIMIT:-1500}")
mkdir -p "$out_dir"

declare -A orders=([heads]=fisher-rearranged [ffn]=fisher [joint]=fisher)
for structure in heads ffn joint; do
  echo "$structure: BLEU against the share of the layers' FLOPs removed (${orders[$structure]}, untuned and tuned):"
  "${sweep[@]}" prune "$data" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/$structure" \
    --structure "$structure" --x-axis flops --orders "${orders[$structure]}" --fisher "$fisher" \
    "${tuning[@]}" --tune-orders "${orders[$structure]}" --max-percent "${MAX_PERCENT:-70}" \
    "${generation[@]}" --no-progress | grep -vE "^(wrote|cost)" || true
done

# the level is a share of ALL the attention and FFN layers' FLOPs: a search over one structure gets the FLOPs
# left for it once the other structure's (kept whole) are counted
mkdir -p "$out_dir/level-$level"
read -r attention_flops ffn_flops < <(python - "$data" "$checkpoint" <<'PYTHON'
import sys
from fairseq_headprune import registry
registry.register_components()
from fairseq_headprune.constants import DEFAULT_SEQUENCE_LENGTH, FFN_TYPES
from fairseq_headprune.engine.families import family_of_checkpoint
from fairseq_headprune.engine.search.model_costs import model_architecture, model_flops
_, _, model = family_of_checkpoint(sys.argv[2]).load(sys.argv[1], sys.argv[2], cpu=True)
flops = model_flops(model, model_architecture(model), DEFAULT_SEQUENCE_LENGTH)
full = {ffn: sum(c[-1] for (t, _), c in flops.per_layer.items() if (t in FFN_TYPES) == ffn) for ffn in (False, True)}
print(f"{full[False]:.0f} {full[True]:.0f}")
PYTHON
) 2> "$out_dir/level-$level/flops.log"
[[ -n ${ffn_flops:-} ]] || { echo "cannot count the model's FLOPs: see $out_dir/level-$level/flops.log" >&2; exit 1; }
declare -A budgets=(
  [joint]="$kept%"
  [heads]=$(( (attention_flops + ffn_flops) * kept / 100 - ffn_flops ))
  [ffn]=$(( (attention_flops + ffn_flops) * kept / 100 - attention_flops ))
)
for structure in heads ffn joint; do
  dir="$out_dir/level-$level/$structure"
  if [[ ${budgets[$structure]} == -* ]]; then
    echo "$structure alone cannot remove $level% of the layers' FLOPs (attention $attention_flops, FFN $ffn_flops per token)"
    continue
  fi
  if [[ ! -f "$dir/search.json" ]]; then
    if ! fairseq-headprune search "$data" --path "$checkpoint" --out-dir "$dir" --structure "$structure" \
        --cost flops --budget "${budgets[$structure]}" --fisher "$fisher" "${tuning[@]}" --no-progress \
        > "$dir.log" 2>&1; then
      echo "$structure at $level% of the FLOPs removed: $(tail -1 "$dir.log")"
      continue
    fi
  fi
  [[ -f "$dir/model.pt" ]] || fairseq-headprune shrink --path "$checkpoint" --tuning "$dir/tuning.json" \
    --out "$dir/model.pt" > "$dir/shrink.txt"
  if [[ ! -f "$dir/speed.json" ]]; then
    echo "$structure at $level% of the FLOPs removed: decoding speed of the shrunk model against the unpruned one"
    python "$repo/scripts/benchmarks/benchmark_deploy.py" --data "$data" --path "$checkpoint" --compressed "$dir/model.pt" \
      --sentences "${SPEED_SENTENCES:-100}" --batch-sizes 1 64 --repeats 3 --work "$dir/deploy" --json "$dir/speed.json"
  fi
done

if (( ${FINETUNE_UPDATES:-200} > 0 )) && [[ ! -f "$out_dir/finetune-$level/report.json" ]]; then
  echo "joint at $level% of the FLOPs removed, tuned, then fine-tuned ${FINETUNE_UPDATES:-200} updates with the structure held:"
  fairseq-headprune compress "$data" --path "$checkpoint" --target "flops=$kept%" --out-dir "$out_dir/finetune-$level" \
    --finetune-updates "${FINETUNE_UPDATES:-200}" --tune-limit "${TUNE_LIMIT:-1500}" "${generation[@]}" --no-progress
fi
