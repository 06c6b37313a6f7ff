#!/usr/bin/env bash
# What the download scripts (prepare_wmt14_en_fr.sh, prepare_roberta_mnli.sh) share; sourced, not run.
#
# Expects: out_dir (downloads go to OUT_DIR/downloads), offline (1: never download),
# die_prefix (the script's name, for errors). Provides:
#   die MESSAGE                 "PREFIX: error: MESSAGE" on stderr, exit 1
#   download URL FILE MIN_BYTES OUT_DIR/downloads/FILE, checked

die() { echo "${die_prefix:-download}: error: $*" >&2; exit 1; }

# A download is checked three ways: curl fails on HTTP errors, the file must be
# at least MIN_BYTES, and its SHA-256 is recorded in downloads/SHA256SUMS the
# first time and must match on every later run.
download() {  # URL FILE MIN_BYTES
  local url=$1 file=$2 min_bytes=$3
  local path="$out_dir/downloads/$file"
  mkdir -p "$out_dir/downloads"
  if [[ ! -f $path ]]; then
    [[ $offline == 1 ]] && die "OFFLINE=1 and $path is missing (download $url there first)"
    echo "downloading $url" >&2
    curl -fL --retry 3 -o "$path.part" "$url" || die "download failed: $url"
    mv "$path.part" "$path"
  fi
  local size
  size=$(stat -c %s "$path")
  (( size >= min_bytes )) || die "$path is $size bytes, expected at least $min_bytes: delete it and retry"
  local sums="$out_dir/downloads/SHA256SUMS"
  if grep -q "  $file\$" "$sums" 2>/dev/null; then
    (cd "$out_dir/downloads" && grep "  $file\$" SHA256SUMS | sha256sum --check --quiet) \
      || die "$path does not match the checksum recorded in $sums"
  else
    (cd "$out_dir/downloads" && sha256sum "$file") >> "$sums"
  fi
}
