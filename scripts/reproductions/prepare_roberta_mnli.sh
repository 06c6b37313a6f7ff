#!/usr/bin/env bash
# Fetch and prepare the BERT side of the paper at its real size: fairseq's roberta.large.mnli
# and MultiNLI, binarized as fairseq's RoBERTa GLUE instructions do.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes (each step skipped when its output is there):
  OUT_DIR/bundle/   model.pt dict.txt (roberta.large.mnli: 24 layers x 16 heads, MNLI
                    fine-tuned; its classification head is named mnli), encoder.json
                    vocab.bpe (GPT-2 BPE)
  OUT_DIR/raw/MNLI/ train.tsv dev_matched.tsv dev_mismatched.tsv (GLUE's MNLI)
  OUT_DIR/text/     SPLIT.raw.input0/.raw.input1 (sentence1, sentence2) and SPLIT.label
                    for dev_matched, dev_mismatched and train5k, a seeded random subset
                    of SUBSET training pairs (appendix A of Michel et al.: the head kept
                    per layer is chosen on it), and train with TRAIN=1
  OUT_DIR/bpe/      the same, GPT-2 BPE ids (fairseq's multiprocessing_bpe_encoder)
  OUT_DIR/bin/      input0 input1 label, binarized against the bundle's dictionary:
                    valid = MNLI-matched dev, valid1 = MNLI-mismatched dev, valid2 =
                    train5k (train = the whole training set with TRAIN=1)
The label dictionary is written in the order the released model's head predicts
(contradiction, neutral, entailment: fairseq-preprocess's count order on MNLI's
training labels, with which it was fine-tuned). Then: scripts/reproductions/study_roberta_mnli.sh.

environment:
  VENV          virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  OFFLINE=1     never download: bundle/ and raw/MNLI/ must be in place (without
                bundle/model.pt only the data is prepared)
  MODEL_URL     default: $default_model_url
  BPE_URL       default: $default_bpe_url (encoder.json, vocab.bpe)
  MNLI_URL      default: $default_mnli_url
  SUBSET=5000   training pairs in train5k;  SEED=1  its seed
  TRAIN=1       also binarize the whole training set (for fine-tuning a model of your own)
  WORKERS       processes for BPE and binarization (default: 2)
USAGE
}

default_model_url=https://dl.fbaipublicfiles.com/fairseq/models/roberta.large.mnli.tar.gz
default_bpe_url=https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe
default_mnli_url=https://dl.fbaipublicfiles.com/glue/data/MNLI.zip

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 1 ]] || { usage >&2; exit 2; }
out_dir=$1
offline=${OFFLINE:-0}
model_url=${MODEL_URL:-$default_model_url}
bpe_url=${BPE_URL:-$default_bpe_url}
mnli_url=${MNLI_URL:-$default_mnli_url}
subset=${SUBSET:-5000}
seed=${SEED:-1}
workers=${WORKERS:-2}
[[ $subset =~ ^[1-9][0-9]*$ ]] || { echo "SUBSET must be a positive integer, got '$subset'" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"
# shellcheck disable=SC1091
source "$repo/scripts/reproductions/download_common.sh"  # download URL FILE MIN_BYTES, die MESSAGE
die_prefix=prepare_roberta_mnli
mkdir -p "$out_dir"/{downloads,bundle,raw,text,bpe}

# 1. the released model and GPT-2's BPE
if [[ ! -s "$out_dir/bundle/model.pt" || ! -s "$out_dir/bundle/dict.txt" ]]; then
  if [[ $offline == 1 ]]; then
    [[ -s "$out_dir/bundle/dict.txt" ]] || die "OFFLINE=1 and $out_dir/bundle/dict.txt is missing"
    echo "note: no $out_dir/bundle/model.pt: preparing the data only" >&2
  else
    download "$model_url" "$(basename "$model_url")" 500000000
    echo "extracting the model bundle" >&2
    tar -xzf "$out_dir/downloads/$(basename "$model_url")" -C "$out_dir/bundle" --strip-components=1 \
      || die "cannot extract $(basename "$model_url")"
    [[ -s "$out_dir/bundle/model.pt" && -s "$out_dir/bundle/dict.txt" ]] \
      || die "the bundle lacks model.pt or dict.txt (in $out_dir/bundle)"
  fi
fi
for file in encoder.json vocab.bpe; do
  [[ -s "$out_dir/bundle/$file" ]] && continue
  [[ $offline == 1 ]] && die "OFFLINE=1 and $out_dir/bundle/$file is missing"
  download "$bpe_url/$file" "$file" 400000
  cp "$out_dir/downloads/$file" "$out_dir/bundle/$file"
done

# 2. MultiNLI as GLUE distributes it
mnli=$out_dir/raw/MNLI
if [[ ! -s "$mnli/dev_mismatched.tsv" ]]; then
  [[ $offline == 1 ]] && die "OFFLINE=1 and $mnli/dev_mismatched.tsv is missing"
  download "$mnli_url" "$(basename "$mnli_url")" 100000000
  python -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
    "$out_dir/downloads/$(basename "$mnli_url")" "$out_dir/raw" || die "cannot extract $(basename "$mnli_url")"
fi
for split in train dev_matched dev_mismatched; do
  [[ -s "$mnli/$split.tsv" ]] || die "$mnli/$split.tsv is missing"
done

# 3. the columns fairseq's preprocess_GLUE_tasks.sh takes for MNLI: sentence1 (9), sentence2 (10),
#    gold_label (12 in train, 16 in dev); the header line dropped
columns() {  # TSV NAME LABEL_COLUMN
  local tsv=$1 name=$2 label_column=$3
  [[ -s "$out_dir/text/$name.label" ]] && return
  tail -n +2 "$tsv" | cut -f9 > "$out_dir/text/$name.raw.input0"
  tail -n +2 "$tsv" | cut -f10 > "$out_dir/text/$name.raw.input1"
  tail -n +2 "$tsv" | cut -f"$label_column" > "$out_dir/text/$name.label.part"
  mv "$out_dir/text/$name.label.part" "$out_dir/text/$name.label"
}
columns "$mnli/dev_matched.tsv" dev_matched 16
columns "$mnli/dev_mismatched.tsv" dev_mismatched 16
splits=(dev_matched dev_mismatched train5k)
if [[ ! -s "$out_dir/text/train5k.label" ]]; then
  python - "$mnli/train.tsv" "$out_dir/text/train5k" "$subset" "$seed" <<'PYTHON' || die "cannot draw train5k"
import random, sys
tsv, prefix, size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [line.rstrip("\n").split("\t") for line in open(tsv, encoding="utf-8")][1:]
if size > len(rows):
    sys.exit(f"SUBSET={size} is more than the {len(rows)} training pairs")
chosen = sorted(random.Random(seed).sample(range(len(rows)), size))
for suffix, column in (("raw.input0", 8), ("raw.input1", 9), ("label", 11)):
    with open(f"{prefix}.{suffix}", "w", encoding="utf-8") as out:
        out.writelines(rows[i][column] + "\n" for i in chosen)
PYTHON
fi
if [[ ${TRAIN:-0} == 1 ]]; then
  columns "$mnli/train.tsv" train 12
fi

# 4. GPT-2 BPE with the bundle's encoder, as fairseq's instructions do
for name in "${splits[@]}" $([[ ${TRAIN:-0} == 1 ]] && echo train); do
  if [[ ! -s "$out_dir/bpe/$name.input1" ]]; then  # both columns in one pass: their lines correspond
    python -m fairseq.examples.roberta.multiprocessing_bpe_encoder \
      --encoder-json "$out_dir/bundle/encoder.json" --vocab-bpe "$out_dir/bundle/vocab.bpe" \
      --inputs "$out_dir/text/$name.raw.input0" "$out_dir/text/$name.raw.input1" \
      --outputs "$out_dir/bpe/$name.input0.part" "$out_dir/bpe/$name.input1.part" \
      --keep-empty --workers "$workers" > /dev/null || die "BPE encoding of $name failed"
    mv "$out_dir/bpe/$name.input0.part" "$out_dir/bpe/$name.input0"
    mv "$out_dir/bpe/$name.input1.part" "$out_dir/bpe/$name.input1"
  fi
  cp "$out_dir/text/$name.label" "$out_dir/bpe/$name.label"
done

# 5. binarize against the bundle's dictionary; labels in the released head's order
if [[ ! -f "$out_dir/bin/label/valid2.idx" || ( ${TRAIN:-0} == 1 && ! -f "$out_dir/bin/label/train.idx" ) ]]; then
  rm -rf "$out_dir/bin.tmp"
  mkdir -p "$out_dir/bin.tmp"
  printf 'contradiction 3\nneutral 2\nentailment 1\n' > "$out_dir/bin.tmp/label.dict.txt"
  validpref=$(printf "$out_dir/bpe/%s.COLUMN," "${splits[@]}")
  validpref=${validpref%,}
  for column in input0 input1 label; do
    dictionary=$out_dir/bundle/dict.txt
    [[ $column == label ]] && dictionary=$out_dir/bin.tmp/label.dict.txt
    trainpref=()
    [[ ${TRAIN:-0} == 1 ]] && trainpref=(--trainpref "$out_dir/bpe/train.$column")
    fairseq-preprocess --only-source --srcdict "$dictionary" "${trainpref[@]}" \
      --validpref "${validpref//COLUMN/$column}" --destdir "$out_dir/bin.tmp/$column" --workers "$workers" \
      > "$out_dir/bin.tmp/preprocess-$column.log" 2>&1 \
      || die "fairseq-preprocess failed on $column: see $out_dir/bin.tmp/preprocess-$column.log"
  done
  for column in input0 input1 label; do
    [[ -f "$out_dir/bin.tmp/$column/valid2.idx" ]] || die "binarizing $column wrote no valid2"
  done
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "prepared: $out_dir/bin (valid: MNLI-matched dev, valid1: mismatched dev, valid2: $subset training pairs)"
[[ -s "$out_dir/bundle/model.pt" ]] && echo "model: $out_dir/bundle/model.pt (classification head 'mnli')"
exit 0
