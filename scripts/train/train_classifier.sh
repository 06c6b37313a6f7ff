#!/usr/bin/env bash
# Train a small RoBERTa-architecture sentence classifier with fairseq-train (task sentence_prediction).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") DATA_BIN SAVE_DIR

Trains fairseq's roberta_base architecture at small dimensions from scratch
on a sentence_prediction corpus (scripts/data/prepare_acceptability_data.sh) with
stock fairseq-train (--task sentence_prediction, --criterion
sentence_prediction), saving one checkpoint per epoch and checkpoint_best.pt
(best validation accuracy) in SAVE_DIR. An interrupted run resumes from
SAVE_DIR/checkpoint_last.pt. Deterministic for a seed and thread count on
one machine, like scripts/train/train_demo.sh. With RESTORE, fine-tunes a
pretrained model instead (scripts/train/pretrain_roberta.sh; its dimensions must
be given again), as fairseq's RoBERTa GLUE instructions do: --restore-file
with the optimizer, data loader and meters reset, a new classification head.

environment (defaults are the demo classifier):
  LAYERS=4 EMBED_DIM=128 FFN_DIM=256 HEADS=8 EPOCHS=6 BATCH_SIZE=32
  LR=0.0005 WARMUP=200 SEED=1 NUM_CLASSES=2
  ARCH        the architecture (default roberta_base; any of fairseq's roberta family)
  RESTORE     a pretrained checkpoint to fine-tune (default: none, train from scratch)
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
restore=()
if [[ -n ${RESTORE:-} ]]; then
  [[ -f $RESTORE ]] || { echo "RESTORE: no such checkpoint: $RESTORE" >&2; exit 2; }
  # the plugin is loaded only for its torch.load allow-list: fairseq's own checkpoints hold an
  # argparse.Namespace, which torch >= 2.6 refuses to unpickle unless allowed (see docs/installation.md)
  restore=(--user-dir "$user_dir" --restore-file "$(cd "$(dirname "$RESTORE")" && pwd)/$(basename "$RESTORE")"
           --reset-optimizer --reset-dataloader --reset-meters)
fi

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of options
fairseq-train "$data_bin" --task sentence_prediction --criterion sentence_prediction \
  --arch "${ARCH:-roberta_base}" --encoder-layers "${LAYERS:-4}" --encoder-embed-dim "${EMBED_DIM:-128}" \
  --encoder-ffn-embed-dim "${FFN_DIM:-256}" --encoder-attention-heads "${HEADS:-8}" \
  --num-classes "${NUM_CLASSES:-2}" --init-token 0 --separator-token 2 --max-positions 128 \
  --dropout 0.1 --attention-dropout 0.0 \
  --optimizer adam --adam-betas '(0.9,0.98)' --lr "${LR:-0.0005}" \
  --lr-scheduler inverse_sqrt --warmup-updates "${WARMUP:-200}" \
  --batch-size "${BATCH_SIZE:-32}" --max-epoch "${EPOCHS:-6}" \
  --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric \
  --seed "${SEED:-1}" --num-workers 0 --save-dir "$save_dir" \
  --log-format simple --log-interval 100 "${restore[@]}" \
  ${EXTRA_ARGS:-}
