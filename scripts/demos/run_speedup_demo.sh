#!/usr/bin/env bash
# The main job on the demo model: a copy that decodes twice as fast in CTranslate2, within 1 BLEU.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Makes the demo corpus and model in OUT_DIR (default: results/demo; what
run_demo.sh already made there is reused), then runs

  fairseq-headprune compress OUT_DIR/data/bin --path OUT_DIR/checkpoints/checkpoint_best.pt \\
    --target speedup=TARGET --out-dir OUT_DIR/speedup-TARGET \$GEN

and prints its attempt and result lines; report.md in the run's directory
has the rest. About 50 minutes on 2 CPU cores (the corpus and training 7 to
10 more, where the model is not there yet). Interrupted, the same command resumes it.

environment:
  VENV        virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  TARGET      the speed-up asked for (default: 2x)
  GEN         the generation options (default: --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2
              --max-len-b 10 --required-batch-size-multiple 1)
  EXTRA_ARGS  more options for compress (e.g. --finetune-minutes 10)
  plus those of scripts/data/prepare_demo_data.sh and scripts/train/train_demo.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
(( $# <= 1 )) || { usage >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/demo}
target=${TARGET:-2x}
[[ $target =~ ^[0-9]+(\.[0-9]+)?x$ ]] || { echo "$(basename "$0"): TARGET must be a speed-up such as 2x, got '$target'" >&2; exit 2; }
gen=${GEN:---beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 --required-batch-size-multiple 1}
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

bash "$repo/scripts/data/prepare_demo_data.sh" "$out_dir/data"
if [[ ! -f "$out_dir/checkpoints/checkpoint_best.pt" ]]; then
  bash "$repo/scripts/train/train_demo.sh" "$out_dir/data/bin" "$out_dir/checkpoints" >> "$out_dir/train.log" 2>&1 \
    || { echo "training failed: see $out_dir/train.log" >&2; exit 1; }
fi

run_dir="$out_dir/speedup-$target"
# shellcheck disable=SC2086  # GEN and EXTRA_ARGS are lists of options
fairseq-headprune compress "$out_dir/data/bin" --path "$out_dir/checkpoints/checkpoint_best.pt" \
  --target "speedup=$target" --out-dir "$run_dir" $gen ${EXTRA_ARGS:-} \
  | tee "$run_dir.log" | grep --line-buffered -E "^(attempt|result|compressed|exported|wrote)"
