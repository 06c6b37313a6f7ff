#!/usr/bin/env bash
# Write the demo corpus's French side and binarize it for fairseq's language_modeling task.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes the demo translation corpus (fairseq-headprune corpus) to OUT_DIR/raw
and binarizes its French side, one sentence per line, as fairseq's
language_modeling task reads it: OUT_DIR/bin/{train,valid,test,test1}
(dictionary built on the training split; test-shifted, the shifted domain,
becomes split 'test1'). Skips work already done.

environment:
  SEED   corpus seed (default 1)
  SCALE  multiply every split's size (default 1.0: 16000/500/300/300 sentences)
  LM_LANG  side of the corpus to model, fr or en (default fr)
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
raw=$out_dir/raw
side=${LM_LANG:-fr}

if [[ ! -f "$raw/test-shifted.$side" ]]; then
  fairseq-headprune corpus "$raw" --seed "${SEED:-1}" --scale "${SCALE:-1.0}"
fi
if [[ ! -f "$out_dir/bin/test1.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  log=$out_dir/preprocess.log
  fairseq-preprocess --only-source \
    --trainpref "$raw/train.$side" --validpref "$raw/valid.$side" \
    --testpref "$raw/test.$side,$raw/test-shifted.$side" \
    --destdir "$out_dir/bin.tmp" --workers 2 > "$log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $log" >&2; exit 1; }
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "binarized language-model corpus: $out_dir/bin"
