#!/usr/bin/env bash
# Train the demo Transformer on a binarized corpus with fairseq-train.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN SAVE_DIR

Trains with fairseq-train (task fairseq-headprune, architecture of the WMT14
En-Fr big model at small dimensions, shared embeddings) and saves one
checkpoint per epoch (checkpointN.pt) plus checkpoint_best.pt in SAVE_DIR.
An interrupted run resumes from SAVE_DIR/checkpoint_last.pt.

Training is deterministic for a given seed and thread count on one machine:
data order and dropout follow --seed, data loading runs in the main process,
and the CPU thread count is fixed (THREADS), since a different number of
threads sums in another order and so trains another model.  The instruction
set of torch's and MKL's CPU kernels is pinned to AVX2 (ATEN_CPU_CAPABILITY,
MKL_CBWR), so machines with wider vector units take the same code paths.

environment (defaults are the demo model):
  LAYERS=3 EMBED_DIM=128 FFN_DIM=256 HEADS=8 EPOCHS=10 MAX_TOKENS=4096
  LR=0.002 WARMUP=200 SEED=1
  THREADS=2   CPU threads (OMP_NUM_THREADS, MKL_NUM_THREADS)
  ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2  CPU kernels' instruction set
  EXTRA_ARGS  further fairseq-train options (e.g. "--head-mask E:1:1")
USAGE
}

[[ $# -eq 2 ]] || { usage; [[ $# -eq 1 && ( $1 == -h || $1 == --help ) ]] && exit 0 || exit 2; }
data_bin=$1
save_dir=$2
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/demo_model.sh"

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
fairseq-headprune train "$data_bin" "${demo_model_args[@]}" \
  --dropout 0.1 --attention-dropout 0.0 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.002}" \
  --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-200}" \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens "${MAX_TOKENS:-4096}" --max-epoch "${EPOCHS:-10}" \
  --seed "${SEED:-1}" --num-workers 0 --save-dir "$save_dir" \
  --log-format simple --log-interval 50 \
  ${EXTRA_ARGS:-}
