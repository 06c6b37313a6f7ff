#!/usr/bin/env bash
# A checkpoint of the paper's WMT14 En-Fr model's shape, for measuring what compress costs at that size.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes, skipping steps already done:
  OUT_DIR/corpus/   the demo corpus (scripts/data/prepare_demo_data.sh; SCALE, SEED)
  OUT_DIR/dict.txt  its joined dictionary padded with unused symbols to DICT_SIZE
                    entries, fairseq's four special symbols included (the released
                    wmt14.en-fr.joined-dict.transformer bundle's size)
  OUT_DIR/bin/      the corpus binarized with that dictionary (fairseq-preprocess)
  OUT_DIR/checkpoints/checkpoint_last.pt
                    transformer_vaswani_wmt_en_fr_big with shared embeddings at its
                    own dimensions (6 + 6 layers, d 1024, FFN 4096, 16 heads; about
                    220 M parameters) after UPDATES updates of stock fairseq-train
                    from a random start: the released checkpoint's format and size,
                    not its quality (its output does not stop; time it at a fixed
                    length). No optimizer state is saved (about 0.9 GB on disk).

environment:
  DICT_SIZE=44512   dictionary entries
  UPDATES=2         fairseq-train updates
  MAX_TOKENS=1024   tokens per batch
  ARCH_ARGS         further architecture options (e.g. "--encoder-layers 2" for a smaller try)
  THREADS=2         CPU threads; the kernels pinned as in train_demo.sh (scripts/train/pin_cpu.sh)
  VENV              virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
dict_size=${DICT_SIZE:-44512}
updates=${UPDATES:-2}
die() { echo "$(basename "$0"): $*" >&2; exit 1; }
[[ $dict_size =~ ^[0-9]+$ ]] || die "DICT_SIZE must be a whole number, got '$dict_size'"
[[ $updates =~ ^[1-9][0-9]*$ ]] || die "UPDATES must be a positive whole number, got '$updates'"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
# shellcheck disable=SC1091
source "$repo/scripts/train/pin_cpu.sh"

bash "$repo/scripts/data/prepare_demo_data.sh" "$out_dir/corpus"
if [[ ! -s "$out_dir/dict.txt" ]]; then
  # fairseq's Dictionary holds <s> <pad> </s> <unk> before the file's entries
  words=$(wc -l < "$out_dir/corpus/bin/dict.en.txt")
  (( words + 4 <= dict_size )) || die "DICT_SIZE $dict_size is below the corpus's $((words + 4)) symbols"
  { cat "$out_dir/corpus/bin/dict.en.txt"
    for ((i = 0; i < dict_size - 4 - words; i++)); do printf 'madeupword%05d 0\n' "$i"; done
  } > "$out_dir/dict.txt.part"
  mv "$out_dir/dict.txt.part" "$out_dir/dict.txt"
fi
if [[ ! -f "$out_dir/bin/test1.en-fr.fr.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  raw=$out_dir/corpus/raw
  fairseq-preprocess --source-lang en --target-lang fr --srcdict "$out_dir/dict.txt" --joined-dictionary \
    --trainpref "$raw/train" --validpref "$raw/valid" --testpref "$raw/test,$raw/test-shifted" \
    --destdir "$out_dir/bin.tmp" --workers "${THREADS:-2}" > "$out_dir/preprocess.log" 2>&1 \
    || die "fairseq-preprocess failed: see $out_dir/preprocess.log"
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
if [[ ! -f "$out_dir/checkpoints/checkpoint_last.pt" ]]; then
  # shellcheck disable=SC2086  # ARCH_ARGS is a list of options
  fairseq-headprune train "$out_dir/bin" --arch transformer_vaswani_wmt_en_fr_big --share-all-embeddings \
    ${ARCH_ARGS:-} --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0005 \
    --lr-scheduler inverse_sqrt --warmup-updates 4000 --criterion label_smoothed_cross_entropy \
    --label-smoothing 0.1 --max-tokens "${MAX_TOKENS:-1024}" --max-update "$updates" --seed 1 --num-workers 0 \
    --save-dir "$out_dir/checkpoints" --no-epoch-checkpoints --no-save-optimizer-state --disable-validation \
    --log-format simple --log-interval 1 > "$out_dir/train.log" 2>&1 \
    || die "fairseq-train failed: see $out_dir/train.log"
fi
echo "paper-shaped checkpoint: $out_dir/checkpoints/checkpoint_last.pt (data: $out_dir/bin)"
