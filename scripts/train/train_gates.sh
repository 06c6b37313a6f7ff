#!/usr/bin/env bash
# Learn hard-concrete head gates with an exact head budget on a converged demo-shaped model.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN CHECKPOINT SAVE_DIR HEADS_KEPT

Trains one gate per head of CHECKPOINT with fairseq-train --criterion
headprune_gates (Voita et al. 2019's hard-concrete gates, with a Lagrangian
that holds the expected number of open gates at HEADS_KEPT: a number or a
percentage of the heads), the model's own weights frozen, then exports the
learned mask, exactly HEADS_KEPT heads, to SAVE_DIR/mask.json (for any
command's --head-mask, or shrink). checkpoint_best.pt is the update whose
exact-budget mask had the lowest validation loss. A finished SAVE_DIR is
left as it is.

environment (the architecture must be CHECKPOINT's; defaults are the demo model's):
  LAYERS=3 EMBED_DIM=128 FFN_DIM=256 HEADS=8 MAX_TOKENS=4096 SEED=1
  UPDATES=150      gate updates
  GATE_LR=0.05     Adam learning rate of the gates and multipliers (constant)
  THREADS=2        CPU threads
  EXTRA_ARGS       further fairseq-train options (e.g. --gate-train-model)
USAGE
}

[[ $# -eq 4 ]] || { usage; [[ $# -eq 1 && ( $1 == -h || $1 == --help ) ]] && exit 0 || exit 2; }
data_bin=$1
checkpoint=$2
save_dir=$3
kept=$4
[[ -f $checkpoint ]] || { echo "checkpoint not found: $checkpoint" >&2; exit 2; }
if [[ -f $save_dir/mask.json ]]; then
  exit 0
fi
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/demo_model.sh"
mkdir -p "$save_dir"
start=$(date +%s.%N)

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
fairseq-headprune train "$data_bin" "${demo_model_args[@]}" \
  --dropout 0.0 --attention-dropout 0.0 \
  --restore-file "$checkpoint" --reset-optimizer --reset-dataloader --reset-meters --reset-lr-scheduler \
  --criterion headprune_gates --gate-target-heads "$kept" --label-smoothing 0.1 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${GATE_LR:-0.05}" --lr-scheduler fixed \
  --max-tokens "${MAX_TOKENS:-4096}" --max-update "${UPDATES:-150}" \
  --seed "${SEED:-1}" --num-workers 0 --save-dir "$save_dir" --no-epoch-checkpoints \
  --log-format simple --log-interval 25 \
  ${EXTRA_ARGS:-} > "$save_dir/train.log" 2>&1 || { echo "gate training failed: see $save_dir/train.log" >&2; exit 1; }
# what training cost: wall seconds and sentences seen (per epoch: batch size x updates, from the log)
python - "$save_dir" "$start" "$(date +%s.%N)" <<'PYTHON'
import json, re, sys

save_dir, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
sentences, previous = 0.0, 0
for line in open(f"{save_dir}/train.log", encoding="utf-8"):
    match = re.search(r"(?:INFO:train:|\| train \| )epoch .*\| bsz ([\d.]+) \| num_updates (\d+)", line)
    if match:
        sentences += float(match.group(1)) * (int(match.group(2)) - previous)
        previous = int(match.group(2))
json.dump({"seconds": round(end - start, 1), "updates": previous, "sentences": int(round(sentences))},
          open(f"{save_dir}/cost.json", "w"))
PYTHON
fairseq-headprune mask --from-gates "$save_dir/checkpoint_best.pt" --path "$checkpoint" --out "$save_dir/mask.json"
