#!/usr/bin/env bash
# Fetch and prepare what the paper's experiments ran on: the pretrained fairseq
# WMT14 En-Fr big Transformer and its test sets, binarized against its dictionaries.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes (each step skipped when its output is there):
  OUT_DIR/bundle/      model.pt dict.en.txt dict.fr.txt bpecodes (the pretrained model)
  OUT_DIR/raw/         SET.en SET.fr, one sentence per line, for each test set
  OUT_DIR/tok/         the same, Moses-tokenized (sacremoses: normalize, tokenize -a -x)
  OUT_DIR/bpe/         the same with the bundle's BPE codes applied (subword-nmt)
  OUT_DIR/bin/         binarized against the bundle's dictionaries: split SET for each set
Test sets: newstest2009-2014 (sacreBLEU's wmt09-wmt13, wmt14/full) and mtnt (MTNT 1.1 En-Fr test).
See data/README.md for sources, sizes and which study uses what.

environment:
  VENV        virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  OFFLINE=1   never download: every download must already be in place (bundle/ and raw/)
  BUNDLE_URL  default: $default_bundle_url
  MTNT_URL    default: $default_mtnt_url
  SETS        test sets to prepare (default: "$default_sets")
  WORKERS     processes for tokenization and binarization (default: 2)
USAGE
}

default_bundle_url=https://dl.fbaipublicfiles.com/fairseq/models/wmt14.en-fr.joined-dict.transformer.tar.bz2
default_mtnt_url=https://github.com/pmichel31415/mtnt/releases/download/v1.1/MTNT.1.1.tar.gz
default_sets="newstest2009 newstest2010 newstest2011 newstest2012 newstest2013 newstest2014 mtnt"

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 1 ]] || { usage >&2; exit 2; }
out_dir=$1
offline=${OFFLINE:-0}
bundle_url=${BUNDLE_URL:-$default_bundle_url}
mtnt_url=${MTNT_URL:-$default_mtnt_url}
sets=${SETS:-$default_sets}
workers=${WORKERS:-2}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

# shellcheck disable=SC1091
source "$repo/scripts/reproductions/download_common.sh"  # download URL FILE MIN_BYTES, die MESSAGE
die_prefix=prepare_wmt14_en_fr
mkdir -p "$out_dir"/{downloads,bundle,raw,tok,bpe}

# 1. the pretrained model
bundle_files=(model.pt dict.en.txt dict.fr.txt bpecodes)
missing_bundle() { for f in "${bundle_files[@]}"; do [[ -s "$out_dir/bundle/$f" ]] || return 0; done; return 1; }
if missing_bundle; then
  download "$bundle_url" "$(basename "$bundle_url")" 100000000
  echo "extracting the model bundle" >&2
  tar -xjf "$out_dir/downloads/$(basename "$bundle_url")" -C "$out_dir/bundle" --strip-components=1 \
    || die "cannot extract $(basename "$bundle_url")"
  missing_bundle && die "the bundle lacks one of ${bundle_files[*]} (in $out_dir/bundle)"
fi

# 2. raw test sets
for set in $sets; do
  [[ -s "$out_dir/raw/$set.en" && -s "$out_dir/raw/$set.fr" ]] && continue
  [[ $offline == 1 ]] && die "OFFLINE=1 and $out_dir/raw/$set.en or .fr is missing"
  case $set in
    newstest20[0-9][0-9])
      year=${set#newstest20}
      name=wmt$year; [[ $year == 14 ]] && name=wmt14/full
      for side in src ref; do
        lang=en; [[ $side == ref ]] && lang=fr
        sacrebleu -t "$name" -l en-fr --echo "$side" > "$out_dir/raw/$set.$lang.part" \
          || die "sacrebleu could not fetch $name en-fr ($side)"
        mv "$out_dir/raw/$set.$lang.part" "$out_dir/raw/$set.$lang"
      done ;;
    mtnt)
      download "$mtnt_url" "$(basename "$mtnt_url")" 1000000
      tsv=$(tar -tzf "$out_dir/downloads/$(basename "$mtnt_url")" | grep -E 'test/test\.en-fr\.tsv$') \
        || die "no test/test.en-fr.tsv in $(basename "$mtnt_url")"
      # columns: id, English source, French reference
      tar -xzOf "$out_dir/downloads/$(basename "$mtnt_url")" "$tsv" | cut -f2 > "$out_dir/raw/mtnt.en"
      tar -xzOf "$out_dir/downloads/$(basename "$mtnt_url")" "$tsv" | cut -f3 > "$out_dir/raw/mtnt.fr" ;;
    *) die "unknown test set $set (known: $default_sets)" ;;
  esac
  [[ $(wc -l < "$out_dir/raw/$set.en") -eq $(wc -l < "$out_dir/raw/$set.fr") ]] \
    || die "$set: source and reference have different line counts"
done

# 3. Moses tokenization (as fairseq's prepare-wmt14en2fr.sh: normalize, then tokenize -a
#    with escaping), and the bundle's BPE codes
for set in $sets; do
  for lang in en fr; do
    if [[ ! -s "$out_dir/tok/$set.$lang" ]]; then
      sacremoses -q -l "$lang" -j "$workers" normalize tokenize -a -x \
        < "$out_dir/raw/$set.$lang" > "$out_dir/tok/$set.$lang.part" || die "tokenizing $set.$lang failed"
      mv "$out_dir/tok/$set.$lang.part" "$out_dir/tok/$set.$lang"
    fi
    if [[ ! -s "$out_dir/bpe/$set.$lang" ]]; then
      subword-nmt apply-bpe -c "$out_dir/bundle/bpecodes" < "$out_dir/tok/$set.$lang" \
        > "$out_dir/bpe/$set.$lang.part" || die "applying BPE to $set.$lang failed"
      mv "$out_dir/bpe/$set.$lang.part" "$out_dir/bpe/$set.$lang"
    fi
  done
done

# 4. binarize each set as its own split, against the bundle's dictionaries
mkdir -p "$out_dir/bin"
cp "$out_dir/bundle/dict.en.txt" "$out_dir/bundle/dict.fr.txt" "$out_dir/bin/"
for set in $sets; do
  [[ -f "$out_dir/bin/$set.en-fr.fr.idx" ]] && continue
  work="$out_dir/bin/.work-$set"
  rm -rf "$work"
  fairseq-preprocess --source-lang en --target-lang fr --testpref "$out_dir/bpe/$set" \
    --srcdict "$out_dir/bundle/dict.en.txt" --tgtdict "$out_dir/bundle/dict.fr.txt" \
    --destdir "$work" --workers "$workers" > "$out_dir/bin/preprocess-$set.log" 2>&1 \
    || die "fairseq-preprocess failed on $set: see $out_dir/bin/preprocess-$set.log"
  for file in "$work"/test.en-fr.*; do
    mv "$file" "$out_dir/bin/$set.${file##*/test.}"
  done
  rm -rf "$work"
done
echo "prepared: $out_dir/bin (splits: $sets), model: $out_dir/bundle/model.pt"
