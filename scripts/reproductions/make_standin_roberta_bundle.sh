#!/usr/bin/env bash
# Make a local stand-in for roberta.large.mnli, GPT-2's BPE and GLUE's MNLI (no internet needed),
# so that everything after the downloads of prepare_roberta_mnli.sh can be run and tested offline.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes, in the layout prepare_roberta_mnli.sh expects once its downloads are done:
  OUT_DIR/bundle/model.pt     the released model's format (args Namespace, arch
                              roberta_large, encoder keys under decoder., one
                              classification head named mnli that the config does
                              not name), at tiny dimensions, fine-tuned on the demo
                              NLI corpus (scripts/train/train_classifier.sh)
  OUT_DIR/bundle/dict.txt, encoder.json, vocab.bpe   a byte-level BPE in GPT-2's
                              format learned on the corpus (scripts/reproductions/make_standin_gpt2_bpe.py)
                              and fairseq's dictionary of its ids
  OUT_DIR/raw/MNLI/{train,dev_matched,dev_mismatched}.tsv   the demo NLI corpus in
                              GLUE's MNLI columns (dev_mismatched: the shifted domain)
and prepares the data with OFFLINE=1 TRAIN=1 scripts/reproductions/prepare_roberta_mnli.sh OUT_DIR
(the training set binarized too, to fine-tune the stand-in on). Then:
scripts/reproductions/study_roberta_mnli.sh OUT_DIR.

environment:
  SCALE=0.1 MERGES=300 SUBSET=300    corpus size, BPE merges, train5k's size
  LAYERS=2 EMBED_DIM=32 FFN_DIM=64 HEADS=4 EPOCHS=3   the model (see train_classifier.sh)
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 1 ]] || { usage >&2; exit 2; }
out_dir=$1
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
work=$out_dir/standin-work
mkdir -p "$work" "$out_dir/bundle" "$out_dir/raw/MNLI"

if [[ ! -s "$out_dir/raw/MNLI/dev_mismatched.tsv" ]]; then
  fairseq-headprune corpus "$work/corpus" --kind nli --scale "${SCALE:-0.1}" > /dev/null
  python - "$work/corpus" "$out_dir/raw/MNLI" <<'PYTHON'
import os, sys
corpus, mnli = sys.argv[1:]
# GLUE's MNLI: 12 columns in train (gold_label last), 16 in dev (five annotator labels, then gold_label)
train_header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
dev_header = train_header[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
for split, name, header in (("train", "train", train_header), ("test", "dev_matched", dev_header),
                            ("test-mismatched", "dev_mismatched", dev_header)):
    columns = [open(os.path.join(corpus, f"{split}.{c}"), encoding="utf-8").read().splitlines()
               for c in ("input0", "input1", "label")]
    with open(os.path.join(mnli, f"{name}.tsv"), "w", encoding="utf-8") as out:
        out.write("\t".join(header) + "\n")
        for index, (premise, hypothesis, label) in enumerate(zip(*columns)):
            genre = "shifted" if "mismatched" in name else "news"
            row = [str(index), str(index), f"{index}e", genre, "( x )", "( y )", "(ROOT x)", "(ROOT y)",
                   premise, hypothesis] + [label] * (len(header) - 10)
            out.write("\t".join(row) + "\n")
PYTHON
fi

if [[ ! -s "$out_dir/bundle/model.pt" ]]; then
  python "$repo/scripts/reproductions/make_standin_gpt2_bpe.py" "$work/corpus/pretrain.train.txt" \
    --merges "${MERGES:-300}" --out-dir "$out_dir/bundle" > /dev/null
  # fairseq's dictionary of BPE ids, as GPT-2's dict.txt is: ids by frequency on the pretraining text
  python -m fairseq.examples.roberta.multiprocessing_bpe_encoder --encoder-json "$out_dir/bundle/encoder.json" \
    --vocab-bpe "$out_dir/bundle/vocab.bpe" --inputs "$work/corpus/pretrain.train.txt" \
    --outputs "$work/pretrain.bpe" --keep-empty --workers 1 > /dev/null
  rm -rf "$work/dict"
  fairseq-preprocess --only-source --trainpref "$work/pretrain.bpe" --destdir "$work/dict" --dict-only \
    > "$work/dict.log" 2>&1 || { echo "fairseq-preprocess failed: see $work/dict.log" >&2; exit 1; }
  cp "$work/dict/dict.txt" "$out_dir/bundle/dict.txt"

  # the data as the real pipeline prepares it (with the training set), to fine-tune on
  OFFLINE=1 TRAIN=1 SUBSET=${SUBSET:-300} bash "$repo/scripts/reproductions/prepare_roberta_mnli.sh" "$out_dir" > "$work/prepare.log" 2>&1 \
    || { echo "preparing the stand-in data failed: see $work/prepare.log" >&2; exit 1; }
  ARCH=roberta_large LAYERS=${LAYERS:-2} EMBED_DIM=${EMBED_DIM:-32} FFN_DIM=${FFN_DIM:-64} HEADS=${HEADS:-4} \
    EPOCHS=${EPOCHS:-3} WARMUP=${WARMUP:-50} LR=${LR:-0.002} NUM_CLASSES=3 \
    EXTRA_ARGS="--classification-head-name mnli --no-epoch-checkpoints" \
    bash "$repo/scripts/train/train_classifier.sh" "$out_dir/bin" "$work/checkpoints" > "$work/train.log" 2>&1 \
    || { echo "training failed: see $work/train.log" >&2; exit 1; }
  python "$(dirname "${BASH_SOURCE[0]}")/legacy_checkpoints.py" roberta \
    "$work/checkpoints/checkpoint_last.pt" "$out_dir/bundle/model.pt.part"
  mv "$out_dir/bundle/model.pt.part" "$out_dir/bundle/model.pt"
fi
echo "stand-in bundle: $out_dir/bundle; MNLI: $out_dir/raw/MNLI"
