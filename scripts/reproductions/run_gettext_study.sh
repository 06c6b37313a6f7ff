#!/usr/bin/env bash
# A second model that speaks a real language: English -> German from the system's gettext
# catalogs, trained with stock fairseq, and the pruning studies that matter for speed on it.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs in OUT_DIR (default: results/gettext-en-de): the corpus (scripts/data/prepare_gettext_en_de.sh: about
32,000 English -> German message pairs, Moses-tokenized, 8,000 joint BPE merges) in data/, a 3+3-layer
Transformer (d=128, FFN 512, 8 heads) trained with fairseq-train in checkpoints/ (EPOCHS epochs: about
18 minutes on 2 CPU cores), its BLEU on the 500 test pairs in generate/, Fisher scores of heads and
FFN neurons in importance-fisher/, the pruning curves of heads (importance and Fisher search, untuned
and tuned) in pruning/, the heads / FFN neurons / joint comparison against the share of layer FLOPs
removed in structures/ (scripts/studies/compare_structures.sh), and everything in report.md. Finished steps
are skipped.

environment:
  VENV, THREADS, RANKS  as for scripts/demos/run_demo.sh
  EPOCHS=12  LAYERS=3 EMBED_DIM=128 FFN_DIM=512 HEADS=8  the model (scripts/train/train_demo.sh)
  LANG_CODE=de LOCALE_DIR=/usr/share/locale  the catalogs (scripts/data/prepare_gettext_en_de.sh)
  TUNE_LIMIT=1500  validation sentences mask tuning reads (the first of them)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/gettext-en-de}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/generate"
export LAYERS=${LAYERS:-3} EMBED_DIM=${EMBED_DIM:-128} FFN_DIM=${FFN_DIM:-512} HEADS=${HEADS:-8}
export EPOCHS=${EPOCHS:-12} WARMUP=${WARMUP:-400}

bash "$repo/scripts/data/prepare_gettext_en_de.sh" "$out_dir/data"
checkpoint="$out_dir/checkpoints/checkpoint$EPOCHS.pt"
if [[ ! -f $checkpoint ]]; then
  record train bash "$repo/scripts/train/train_demo.sh" "$out_dir/data/bin" "$out_dir/checkpoints" \
    2>&1 | tee -a "$out_dir/train.log" | grep --line-buffered -E "valid on|done training" || true
fi
[[ -f $checkpoint ]] || { echo "training failed: see $out_dir/train.log" >&2; exit 1; }
{ grep -o "done training in [0-9.]* seconds" "$out_dir/train.log" || true; } | tail -n 1

generation=(--beam 5 --lenpen 1 --batch-size 100 --max-len-a 1.2 --max-len-b 10 --remove-bpe)
if ! grep -q 'BLEU4 = ' "$out_dir/generate/no-mask.txt" 2> /dev/null; then
  record generate fairseq-headprune generate "$out_dir/data/bin" --path "$checkpoint" --gen-subset test \
    --required-batch-size-multiple 1 \
    "${generation[@]}" > "$out_dir/generate/no-mask.tmp" 2> "$out_dir/generate/no-mask.log"
  mv "$out_dir/generate/no-mask.tmp" "$out_dir/generate/no-mask.txt"
fi
echo "unpruned, test: $(grep -o 'BLEU4 = .*' "$out_dir/generate/no-mask.txt")"

if [[ ! -f "$out_dir/importance/importance.json" ]]; then
  echo "head importance (Michel et al.) on the validation set:"
  record importance fairseq-headprune importance "$out_dir/data/bin" --path "$checkpoint" \
    --importance-subset valid --out-dir "$out_dir/importance" --no-progress > /dev/null
fi
fisher_dir="$out_dir/importance-fisher"
if [[ ! -f "$fisher_dir/importance.json" ]]; then
  echo "Fisher information of every head and FFN neuron on the validation set:"
  record importance fairseq-headprune importance "$out_dir/data/bin" --path "$checkpoint" \
    --importance-subset valid --importance-method fisher --importance-structures heads,ffn \
    --out-dir "$fisher_dir" --no-progress > /dev/null
fi

echo "pruning heads by importance and by Fisher search, untuned and tuned on validation sentences:"
record pruning sweep prune "$out_dir/data/bin" --path "$checkpoint" --gen-subset test --out-dir "$out_dir/pruning" \
  --importance "$out_dir/importance/importance.json" --fisher "$fisher_dir/importance.json" \
  --orders importance,fisher-rearranged --tune-masks \
  --tune-orders fisher-rearranged --tune-subset valid --tune-limit "${TUNE_LIMIT:-1500}" --max-percent 70 \
  "${generation[@]}" --no-progress | grep -vE "^(wrote|cost)" || true

GENERATION="${generation[*]}" TUNE_LIMIT=${TUNE_LIMIT:-1500} \
  record structures bash "$repo/scripts/studies/compare_structures.sh" "$out_dir/data/bin" "$checkpoint" "$out_dir/structures" \
  "$fisher_dir/importance.json"

fairseq-headprune report "$out_dir" --title "fairseq-headprune: English -> German (gettext catalogs)"
