#!/usr/bin/env bash
# Make a local stand-in for the pretrained WMT14 En-Fr bundle (no internet needed),
# so that everything after the download can be run and tested offline.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes, in the layout prepare_wmt14_en_fr.sh expects once its downloads are done:
  OUT_DIR/bundle/model.pt      the released model's old checkpoint format (args
                               Namespace, transformer_vaswani_wmt_en_fr_big, packed
                               in_proj_weight), at tiny dimensions, trained on the
                               BPE-segmented demo corpus with a joined dictionary
  OUT_DIR/bundle/dict.en.txt, dict.fr.txt, bpecodes
  OUT_DIR/raw/newstest2013.{en,fr}, mtnt.{en,fr}   raw test sentences (demo test and
                               domain-shifted test sets, first SENTENCES lines)
Then: OFFLINE=1 bash scripts/reproductions/prepare_wmt14_en_fr.sh OUT_DIR  (with SETS="newstest2013 mtnt").

environment:
  SCALE=0.2 MERGES=150 SENTENCES=200   corpus size, BPE merges, test sentences
  LAYERS=2 EMBED_DIM=32 FFN_DIM=64 HEADS=4 EPOCHS=2   the model (see train_demo.sh)
  DICT_SIZE    the joined dictionary's size (fairseq's len(), its 4 special symbols included), padded with
               fairseq's own filler words (madeupwordNNNNN) after the corpus's (default: the corpus's own)
  MAX_UPDATE   stop training after this many updates (default: EPOCHS whole epochs)

The paper's model at its size (6 + 6 layers, d 1024, FFN 4096, 16 heads, the released bundle's 44,512-word
dictionary, about 220 M parameters), two updates from random weights; its translations do not stop, so
decode it at a fixed length (fairseq's --min-len and --max-len-b, compress's plan already does):
  LAYERS=6 EMBED_DIM=1024 FFN_DIM=4096 HEADS=16 DICT_SIZE=44512 MAX_UPDATE=2 $(basename "$0") OUT_DIR
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 1 ]] || { usage >&2; exit 2; }
out_dir=$1
merges=${MERGES:-150}
sentences=${SENTENCES:-200}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
work="$out_dir/standin-work"
mkdir -p "$work/bpe" "$out_dir/bundle" "$out_dir/raw"

if [[ ! -s "$out_dir/bundle/model.pt" ]]; then
  [[ -f "$work/corpus/train.fr" ]] || fairseq-headprune corpus "$work/corpus" --scale "${SCALE:-0.2}" > /dev/null
  cat "$work/corpus/train.en" "$work/corpus/train.fr" | subword-nmt learn-bpe -s "$merges" > "$work/bpecodes" 2> "$work/learn-bpe.log"
  for split in train valid; do
    for lang in en fr; do
      subword-nmt apply-bpe -c "$work/bpecodes" < "$work/corpus/$split.$lang" > "$work/bpe/$split.$lang"
    done
  done
  rm -rf "$work/bin" "$work/dict"
  dictionary=()
  if [[ -n ${DICT_SIZE:-} ]]; then
    fairseq-preprocess --source-lang en --target-lang fr --trainpref "$work/bpe/train" --destdir "$work/dict" \
      --joined-dictionary --dict-only --workers 2 > "$work/preprocess.log" 2>&1 \
      || { echo "fairseq-preprocess failed: see $work/preprocess.log" >&2; exit 1; }
    words=$(wc -l < "$work/dict/dict.en.txt")
    (( DICT_SIZE - 4 >= words )) || { echo "DICT_SIZE=$DICT_SIZE is below the corpus's $((words + 4)) words" >&2; exit 2; }
    for ((i = 0; i < DICT_SIZE - 4 - words; i++)); do printf 'madeupword%05d 0\n' "$i"; done >> "$work/dict/dict.en.txt"
    dictionary=(--srcdict "$work/dict/dict.en.txt")
  fi
  fairseq-preprocess --source-lang en --target-lang fr --trainpref "$work/bpe/train" \
    --validpref "$work/bpe/valid" --destdir "$work/bin" --joined-dictionary "${dictionary[@]}" --workers 2 \
    >> "$work/preprocess.log" 2>&1 || { echo "fairseq-preprocess failed: see $work/preprocess.log" >&2; exit 1; }
  LAYERS=${LAYERS:-2} EMBED_DIM=${EMBED_DIM:-32} FFN_DIM=${FFN_DIM:-64} HEADS=${HEADS:-4} \
    EPOCHS=${EPOCHS:-2} WARMUP=${WARMUP:-50} LR=${LR:-0.003} \
    EXTRA_ARGS="${MAX_UPDATE:+--max-update $MAX_UPDATE --no-save-optimizer-state}" \
    bash "$repo/scripts/train/train_demo.sh" "$work/bin" "$work/checkpoints" > "$work/train.log" 2>&1 \
    || { echo "training failed: see $work/train.log" >&2; exit 1; }
  cp "$work/bin/dict.en.txt" "$work/bin/dict.fr.txt" "$work/bpecodes" "$out_dir/bundle/"
  python "$(dirname "${BASH_SOURCE[0]}")/legacy_checkpoints.py" translation \
    "$work/checkpoints/checkpoint_last.pt" "$out_dir/bundle/model.pt.part"
  mv "$out_dir/bundle/model.pt.part" "$out_dir/bundle/model.pt"
fi
for lang in en fr; do
  head -n "$sentences" "$work/corpus/test.$lang" > "$out_dir/raw/newstest2013.$lang"
  head -n "$sentences" "$work/corpus/test-shifted.$lang" > "$out_dir/raw/mtnt.$lang"
done
echo "stand-in bundle: $out_dir/bundle; raw test sets: $out_dir/raw"
