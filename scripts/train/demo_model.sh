#!/usr/bin/env bash
# What train_demo.sh and train_gates.sh share; sourced, not run.
#
# Provides demo_model_args: the demo model's architecture (the WMT14 En-Fr big
# model's at LAYERS=3 EMBED_DIM=128 FFN_DIM=256 HEADS=8, shared embeddings), and
# pins the CPU threads (THREADS=2) and the kernels' instruction set
# (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2) that training is deterministic under.

# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/pin_cpu.sh"
demo_model_args=(
  --arch transformer_vaswani_wmt_en_fr_big --share-all-embeddings
  --encoder-layers "${LAYERS:-3}" --decoder-layers "${LAYERS:-3}"
  --encoder-embed-dim "${EMBED_DIM:-128}" --decoder-embed-dim "${EMBED_DIM:-128}"
  --encoder-ffn-embed-dim "${FFN_DIM:-256}" --decoder-ffn-embed-dim "${FFN_DIM:-256}"
  --encoder-attention-heads "${HEADS:-8}" --decoder-attention-heads "${HEADS:-8}"
)
