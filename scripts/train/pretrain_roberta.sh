#!/usr/bin/env bash
# Pretrain a small RoBERTa with fairseq-train (task masked_lm), as the demo's BERT stand-in.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN SAVE_DIR

Pretrains fairseq's roberta_base architecture at small dimensions with the
masked-LM objective (--task masked_lm --criterion masked_lm, 15% of tokens
masked, samples of whole sentences up to TOKENS_PER_SAMPLE tokens) on
DATA_BIN (OUT_DIR/bin/pretrain of scripts/data/prepare_nli_data.sh) with stock
fairseq-train, the plugin loaded only for fairseq's block data under numpy 2
(see docs/language-models.md, "numpy 2"). Saves checkpoint_last.pt and checkpoint_best.pt in
SAVE_DIR; scripts/train/train_classifier.sh fine-tunes it (RESTORE=SAVE_DIR/checkpoint_best.pt).
An interrupted run resumes. Deterministic for a seed and thread count on one machine.

environment (defaults are the NLI demo's model):
  LAYERS=6 EMBED_DIM=128 FFN_DIM=256 HEADS=8 EPOCHS=10 BATCH_SIZE=32
  LR=0.002 WARMUP=300 SEED=1 TOKENS_PER_SAMPLE=128
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
fairseq-train "$data_bin" --user-dir "$user_dir" --task masked_lm --criterion masked_lm \
  --arch roberta_base --encoder-layers "${LAYERS:-6}" --encoder-embed-dim "${EMBED_DIM:-128}" \
  --encoder-ffn-embed-dim "${FFN_DIM:-256}" --encoder-attention-heads "${HEADS:-8}" \
  --sample-break-mode complete --tokens-per-sample "${TOKENS_PER_SAMPLE:-128}" \
  --dropout 0.1 --attention-dropout 0.0 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.002}" \
  --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-300}" \
  --batch-size "${BATCH_SIZE:-32}" --max-epoch "${EPOCHS:-10}" \
  --seed "${SEED:-1}" --num-workers 0 --save-dir "$save_dir" --no-epoch-checkpoints \
  --log-format simple --log-interval 100 \
  ${EXTRA_ARGS:-}
