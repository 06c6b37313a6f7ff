#!/usr/bin/env bash
# What every training script shares; sourced, not run.
#
# Pins the CPU threads (THREADS, default 2) and the instruction set of torch's and
# MKL's CPU kernels (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AVX2), under which training is
# deterministic for a seed on one machine, and sets user_dir, the plugin's --user-dir
# (for fairseq-train's torch.load allow-list of the project's checkpoints).

export OMP_NUM_THREADS=${THREADS:-2} MKL_NUM_THREADS=${THREADS:-2}
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} MKL_CBWR=${MKL_CBWR:-AVX2}
# shellcheck disable=SC2034  # used by the scripts that source this file
user_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../fairseq_headprune" && pwd)
