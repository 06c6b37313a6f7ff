#!/usr/bin/env bash
# A real-language English -> German corpus from the system's gettext catalogs, tokenized, BPE'd, binarized.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") OUT_DIR

Writes, skipping steps already done:
  OUT_DIR/raw/{train,valid,test}.{en,LANG}   message pairs (fairseq-headprune corpus --kind gettext;
                                             32,075/1,500/500 from Debian 12's German catalogs)
  OUT_DIR/tok/   Moses-tokenized (sacremoses normalize tokenize -a -x)
  OUT_DIR/bpe/   joint BPE (subword-nmt, MERGES merges learnt on train) and OUT_DIR/bpe/codes
  OUT_DIR/bin/   fairseq-preprocess output (joined dictionary)

environment:
  LANG_CODE=de          target language of the catalogs
  LOCALE_DIR=/usr/share/locale
  MERGES=8000           BPE merge operations
  WORKERS=2
USAGE
}

[[ $# -eq 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -eq 1 ]] && exit 0 || exit 2; }
out_dir=$1
lang=${LANG_CODE:-de}
locale_dir=${LOCALE_DIR:-/usr/share/locale}
merges=${MERGES:-8000}
workers=${WORKERS:-2}
die() { echo "$(basename "$0"): $*" >&2; exit 1; }

mkdir -p "$out_dir"/{tok,bpe}
if [[ ! -s "$out_dir/raw/train.$lang" ]]; then
  fairseq-headprune corpus "$out_dir/raw" --kind gettext --language "$lang" --locale-dir "$locale_dir"
fi
for split in train valid test; do
  for side in en "$lang"; do
    if [[ ! -s "$out_dir/tok/$split.$side" ]]; then
      sacremoses -q -l "$side" -j "$workers" normalize tokenize -a -x \
        < "$out_dir/raw/$split.$side" > "$out_dir/tok/$split.$side.part" || die "tokenizing $split.$side failed"
      mv "$out_dir/tok/$split.$side.part" "$out_dir/tok/$split.$side"
    fi
  done
done
if [[ ! -s "$out_dir/bpe/codes" ]]; then
  cat "$out_dir/tok/train.en" "$out_dir/tok/train.$lang" \
    | subword-nmt learn-bpe -s "$merges" > "$out_dir/bpe/codes.part" || die "learning BPE failed"
  mv "$out_dir/bpe/codes.part" "$out_dir/bpe/codes"
fi
for split in train valid test; do
  for side in en "$lang"; do
    if [[ ! -s "$out_dir/bpe/$split.$side" ]]; then
      subword-nmt apply-bpe -c "$out_dir/bpe/codes" < "$out_dir/tok/$split.$side" \
        > "$out_dir/bpe/$split.$side.part" || die "applying BPE to $split.$side failed"
      mv "$out_dir/bpe/$split.$side.part" "$out_dir/bpe/$split.$side"
    fi
  done
done
if [[ ! -f "$out_dir/bin/test.en-$lang.$lang.idx" ]]; then
  rm -rf "$out_dir/bin.tmp"
  fairseq-preprocess --source-lang en --target-lang "$lang" \
    --trainpref "$out_dir/bpe/train" --validpref "$out_dir/bpe/valid" --testpref "$out_dir/bpe/test" \
    --destdir "$out_dir/bin.tmp" --joined-dictionary --workers "$workers" \
    > "$out_dir/preprocess.log" 2>&1 || die "fairseq-preprocess failed: see $out_dir/preprocess.log"
  rm -rf "$out_dir/bin"
  mv "$out_dir/bin.tmp" "$out_dir/bin"
fi
echo "binarized gettext En-$lang corpus: $out_dir/bin"
