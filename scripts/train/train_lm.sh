#!/usr/bin/env bash
# Train a small decoder-only transformer_lm with fairseq-train (task language_modeling).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN SAVE_DIR

Trains fairseq's transformer_lm architecture at small dimensions from scratch
on a language_modeling corpus (scripts/data/prepare_lm_data.sh), one sentence per
sample (--sample-break-mode eos), with stock fairseq-train and the plugin
loaded only for fairseq's LM data under numpy 2 (see docs/language-models.md, "numpy 2"),
saving one checkpoint per epoch and checkpoint_best.pt (lowest validation
loss) in SAVE_DIR. An interrupted run resumes from SAVE_DIR/checkpoint_last.pt.
Deterministic for a seed and thread count on one machine, like
scripts/train/train_demo.sh.

environment (defaults are the demo language model):
  LAYERS=3 EMBED_DIM=128 FFN_DIM=256 HEADS=8 EPOCHS=6 MAX_TOKENS=2048
  LR=0.002 WARMUP=200 SEED=1 TOKENS_PER_SAMPLE=64
  THREADS=2   CPU threads (OMP_NUM_THREADS, MKL_NUM_THREADS)
  ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2  CPU kernels' instruction set
  EXTRA_ARGS  further fairseq-train options
USAGE
}

[[ $# -eq 2 ]] || { usage; [[ $# -eq 1 && ( $1 == -h || $1 == --help ) ]] && exit 0 || exit 2; }
data_bin=$1
save_dir=$2
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/pin_cpu.sh"  # threads, CPU kernels, user_dir

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
fairseq-train "$data_bin" --user-dir "$user_dir" --task language_modeling \
  --arch transformer_lm --decoder-layers "${LAYERS:-3}" --decoder-embed-dim "${EMBED_DIM:-128}" \
  --decoder-ffn-embed-dim "${FFN_DIM:-256}" --decoder-attention-heads "${HEADS:-8}" \
  --share-decoder-input-output-embed --dropout 0.1 --attention-dropout 0.0 \
  --tokens-per-sample "${TOKENS_PER_SAMPLE:-64}" --sample-break-mode eos \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.002}" \
  --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-200}" \
  --max-tokens "${MAX_TOKENS:-2048}" --max-epoch "${EPOCHS:-6}" \
  --seed "${SEED:-1}" --num-workers 0 --save-dir "$save_dir" \
  --log-format simple --log-interval 100 \
  ${EXTRA_ARGS:-}
