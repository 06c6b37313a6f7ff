#!/usr/bin/env bash
# Write the NLI demo corpus and its pretraining text, and binarize them for fairseq's masked_lm and sentence_prediction tasks.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes OUT_DIR/raw (fairseq-headprune corpus --kind nli: English
premise/hypothesis pairs labelled entailment, neutral or contradiction,
{train,valid,test,test-mismatched}.{input0,input1,label}, and the
pretraining text pretrain.{train,valid}.txt), then binarizes, as fairseq's
RoBERTa pretraining and GLUE fine-tuning instructions do:
  OUT_DIR/bin/pretrain         masked_lm data; its dict.txt is the model's vocabulary
  OUT_DIR/bin/nli/input0,input1  premise and hypothesis, with that dictionary
  OUT_DIR/bin/nli/label        the labels
test-mismatched becomes split 'test1' (test is the matched set). Skips work
already done.

environment:
  SEED   corpus seed (default 1)
  SCALE  multiply every split's size (default 1.0: 20000/1000/1000/1000 pairs,
         40000/1000 pretraining sentences)
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
raw=$out_dir/raw
log=$out_dir/preprocess.log

preprocess() {  # fairseq-preprocess OPTIONS..., its output in the log
  fairseq-preprocess --only-source --workers 2 "$@" >> "$log" 2>&1 \
    || { echo "fairseq-preprocess failed: see $log" >&2; exit 1; }
}

if [[ ! -f "$raw/pretrain.valid.txt" ]]; then
  fairseq-headprune corpus "$raw" --kind nli --seed "${SEED:-1}" --scale "${SCALE:-1.0}"
fi
mkdir -p "$out_dir"
if [[ ! -f "$out_dir/bin/nli/label/test1.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  : > "$log"
  preprocess --trainpref "$raw/pretrain.train.txt" --validpref "$raw/pretrain.valid.txt" \
    --destdir "$out_dir/bin.tmp/pretrain"
  for column in input0 input1; do
    preprocess --srcdict "$out_dir/bin.tmp/pretrain/dict.txt" \
      --trainpref "$raw/train.$column" --validpref "$raw/valid.$column" \
      --testpref "$raw/test.$column,$raw/test-mismatched.$column" --destdir "$out_dir/bin.tmp/nli/$column"
  done
  preprocess --trainpref "$raw/train.label" --validpref "$raw/valid.label" \
    --testpref "$raw/test.label,$raw/test-mismatched.label" --destdir "$out_dir/bin.tmp/nli/label"
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "binarized NLI corpus: $out_dir/bin/nli; pretraining text: $out_dir/bin/pretrain"
