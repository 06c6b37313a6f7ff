#!/usr/bin/env bash
# A real-language 6 + 6 Transformer at d = 256 on the gettext En-De pairs, resumable, its test BLEU written beside it.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes, skipping steps already done (an interrupted run resumes where it stopped):
  OUT_DIR/data/          the gettext corpus (scripts/data/prepare_gettext_en_de.sh; LANG_CODE)
  OUT_DIR/checkpoints/   scripts/train/train_demo.sh at LAYERS + LAYERS layers, EMBED_DIM,
                         FFN_DIM, HEADS for EPOCHS epochs (checkpointN.pt each epoch; a killed
                         run resumes from checkpoint_last.pt)
  OUT_DIR/test.bleu      fairseq-generate's BLEU of the last epoch's checkpoint on test
                         (beam 5, --remove-bpe; tokenized BLEU as fairseq computes it)
  OUT_DIR/valid.bleu     the same on valid

environment (defaults: the d = 256 model of the size issue):
  LANG_CODE=de  LAYERS=6 EMBED_DIM=256 FFN_DIM=1024 HEADS=8 EPOCHS=20
  LR=0.001 WARMUP=400 MAX_TOKENS=4096 SEED=1 THREADS=2
  NICE=19       scheduling priority of the training (a long background job)
  VENV          virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
lang=${LANG_CODE:-de}
export LAYERS=${LAYERS:-6} EMBED_DIM=${EMBED_DIM:-256} FFN_DIM=${FFN_DIM:-1024} HEADS=${HEADS:-8}
export EPOCHS=${EPOCHS:-20} LR=${LR:-0.001} WARMUP=${WARMUP:-400}
nice_level=${NICE:-19}
die() { echo "$(basename "$0"): $*" >&2; exit 1; }
[[ $EPOCHS =~ ^[1-9][0-9]*$ ]] || die "EPOCHS must be a positive whole number, got '$EPOCHS'"
[[ $nice_level =~ ^-?[0-9]+$ ]] || die "NICE must be a whole number, got '$nice_level'"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
# shellcheck disable=SC1091
source "$repo/scripts/train/pin_cpu.sh"

LANG_CODE=$lang bash "$repo/scripts/data/prepare_gettext_en_de.sh" "$out_dir/data"
checkpoint=$out_dir/checkpoints/checkpoint$EPOCHS.pt
if [[ ! -f $checkpoint ]]; then
  mkdir -p "$out_dir/checkpoints"
  nice -n "$nice_level" bash "$repo/scripts/train/train_demo.sh" "$out_dir/data/bin" "$out_dir/checkpoints" \
    >> "$out_dir/train.log" 2>&1 || die "training failed: see $out_dir/train.log"
  [[ -f $checkpoint ]] || die "training ended without $checkpoint: see $out_dir/train.log"
fi
for split in valid test; do
  if [[ ! -s $out_dir/$split.bleu ]]; then
    nice -n "$nice_level" fairseq-generate "$out_dir/data/bin" --user-dir "$user_dir" --path "$checkpoint" --gen-subset "$split" \
      --beam 5 --batch-size 64 --remove-bpe --max-len-a 1.2 --max-len-b 10 --required-batch-size-multiple 1 \
      --cpu --quiet > "$out_dir/$split.generate.log" 2>&1 || die "fairseq-generate on $split failed: see $out_dir/$split.generate.log"
    grep -o 'BLEU4 = .*' "$out_dir/$split.generate.log" > "$out_dir/$split.bleu.part" \
      || die "no BLEU in $out_dir/$split.generate.log"
    mv "$out_dir/$split.bleu.part" "$out_dir/$split.bleu"
  fi
  echo "$split: $(cat "$out_dir/$split.bleu")"
done
echo "checkpoint: $checkpoint"
