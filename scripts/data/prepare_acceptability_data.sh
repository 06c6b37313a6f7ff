#!/usr/bin/env bash
# Write the acceptability demo corpus and binarize it for fairseq's sentence_prediction task.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes OUT_DIR/raw/{train,valid,test,test-shifted}.{input0,label}
(fairseq-headprune corpus --kind acceptability: does the French main verb
agree with its subject?) and binarizes them as fairseq's sentence_prediction
task reads them: OUT_DIR/bin/input0 (dictionary built on the training split)
and OUT_DIR/bin/label; test-shifted becomes split 'test1'. Skips work
already done.

environment:
  SEED   corpus seed (default 1)
  SCALE  multiply every split's size (default 1.0: 16000/500/300/300 sentences)
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
raw=$out_dir/raw

if [[ ! -f "$raw/test-shifted.label" ]]; then
  fairseq-headprune corpus "$raw" --kind acceptability --seed "${SEED:-1}" --scale "${SCALE:-1.0}"
fi
if [[ ! -f "$out_dir/bin/label/test1.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  log=$out_dir/preprocess.log
  : > "$log"
  for column in input0 label; do
    fairseq-preprocess --only-source \
      --trainpref "$raw/train.$column" --validpref "$raw/valid.$column" \
      --testpref "$raw/test.$column,$raw/test-shifted.$column" \
      --destdir "$out_dir/bin.tmp/$column" --workers 2 >> "$log" 2>&1 \
      || { echo "fairseq-preprocess failed: see $log" >&2; exit 1; }
  done
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "binarized acceptability corpus: $out_dir/bin"
