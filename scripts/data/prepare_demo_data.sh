#!/usr/bin/env bash
# Write the synthetic En-Fr demo corpus and binarize it with fairseq-preprocess.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes OUT_DIR/raw/{train,valid,test,test-shifted}.{en,fr} and the binarized
corpus in OUT_DIR/bin (joined dictionary; test-shifted becomes split 'test1').
Skips work already done.

environment:
  SEED   corpus seed (default 1)
  SCALE  multiply every split's size (default 1.0: 16000/500/300/300 pairs)
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
seed=${SEED:-1}
scale=${SCALE:-1.0}

if [[ ! -f "$out_dir/raw/test-shifted.fr" ]]; then
  fairseq-headprune corpus "$out_dir/raw" --seed "$seed" --scale "$scale"
fi
if [[ ! -f "$out_dir/bin/test1.en-fr.fr.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  fairseq-preprocess --source-lang en --target-lang fr \
    --trainpref "$out_dir/raw/train" --validpref "$out_dir/raw/valid" \
    --testpref "$out_dir/raw/test,$out_dir/raw/test-shifted" \
    --destdir "$out_dir/bin.tmp" --joined-dictionary --workers 2 \
    > "$out_dir/preprocess.log" 2>&1 || { echo "fairseq-preprocess failed: see $out_dir/preprocess.log" >&2; exit 1; }
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "binarized demo corpus: $out_dir/bin"
