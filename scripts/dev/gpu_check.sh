#!/usr/bin/env bash
# On a machine with a GPU: the tiny-model equivalence tests there, then the
# sweep and speed benchmarks in fp32, fp16 and bf16. Never part of CI.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--quick] [OUT_DIR]

--quick (or STEPS=quick): only the equivalence checks, in a few minutes, on the
test suite's tiny model prepared beforehand on any machine (the CPU is enough:
bash scripts/dev/prepare_gpu_check.sh CACHE_DIR) and read from CACHE:
scripts/dev/device_check.py, masked = zeroed for the three attention types in
fp32 and fp16 (logits, and the sweep's batched translations), importance
against the CPU's, a fine-tune step with heads held against the CPU's. The GPU
trains nothing. DEVICE=cpu runs the same checks on the CPU path.

Otherwise, when a GPU is present, runs on it:
  1. the tests whose commands take the GPU when one is present: masked
     fairseq-generate/validate/train against stock fairseq, ablate's
     hypotheses against fairseq-generate --head-mask, encoder reuse against
     one encoder pass per configuration, fused attention against fairseq's
     path (tests/test_fairseq_cli.py, tests/test_ablate_cli.py,
     tests/test_encoder_reuse.py, tests/test_masked_attention.py);
  2. scripts/benchmarks/benchmark_ablation.py in fp32 and fp16 (processes and in one
     process) and bf16 (in one process), on the demo model;
  3. scripts/benchmarks/benchmark_speed.py (unpruned / masked / shrunk at 50%);
  4. scripts/benchmarks/benchmark_batching.py in fp16: the default batching
     (chosen for the device) against a grid of configurations x sentences per
     batch and the authors' loop, on BATCHING_CONFIGURATIONS (24) of the demo
     model's configurations.
Measurements go to OUT_DIR (default: results/gpu-check) as JSON, the console
output to OUT_DIR/gpu_check.log. Without a GPU it says so and exits 0.

environment:
  VENV        virtual environment to use (default: REPO/.venv); "system": the
              python3 on PATH as it is, nothing installed (a machine with no
              network, with fairseq and this package already importable)
  STEPS       which steps to run, of: quick tests ablation-fp32 ablation-fp16
              ablation-bf16 speed batching (default: all but quick, in that
              order); e.g. STEPS="quick batching" for issue 64's figures
  CACHE       --quick: the prepared tiny model (default: \$HEADPRUNE_TEST_CACHE, else
              REPO/results/gpu-check/cache)
  DEVICE      --quick: cuda (default) or cpu
  DEMO_DIR    a finished demo (scripts/demos/run_demo.sh) to benchmark (default: REPO/results/demo)
  BATCH_SIZE  sentences per batch in the ablation benchmark (default: 128)
  CONFIGS     configurations per batch in the ablation benchmark (default: 8)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
steps=${STEPS:-tests ablation-fp32 ablation-fp16 ablation-bf16 speed batching}
if [[ ${1:-} == --quick ]]; then
  steps=quick
  shift
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/gpu-check}
demo_dir=${DEMO_DIR:-$repo/results/demo}
device=${DEVICE:-cuda}
# shellcheck disable=SC1091  # VENV=system: the python3 on PATH as it is
source "$repo/scripts/dev/setup_env.sh"
steps=" $steps "
wanted() { [[ $steps == *" $1 "* ]]; }
cd "$repo"
if wanted quick; then
  cache=${CACHE:-${HEADPRUNE_TEST_CACHE:-$repo/results/gpu-check/cache}}
  if [[ $device == cuda ]] && ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no GPU visible to torch $(python -c 'import torch; print(torch.__version__)'): nothing to check (DEVICE=cpu checks the CPU path)"
    exit 0
  fi
  mkdir -p "$out_dir"
  [[ $device == cuda ]] && { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; }
  start=$(date +%s)
  status=0
  python scripts/dev/device_check.py --cache "$cache" --device "$device" --json "$out_dir/quick_check.json" \
    2>&1 | tee "$out_dir/quick_check.log" || status=$?
  echo "quick check: $(( $(date +%s) - start )) s in all; wrote $out_dir/quick_check.log and quick_check.json" \
    | tee -a "$out_dir/quick_check.log"
  [[ $steps == " quick " || $status != 0 ]] && exit "$status"
fi
if ! python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no GPU visible to torch $(python -c 'import torch; print(torch.__version__)'): nothing to check"
  exit 0
fi
if [[ ! -f $demo_dir/checkpoints/checkpoint_best.pt ]]; then
  echo "$(basename "$0"): error: no demo model in $demo_dir (run scripts/demos/run_demo.sh, or set DEMO_DIR)" >&2
  exit 1
fi
mkdir -p "$out_dir"
exec > >(tee "$out_dir/gpu_check.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if wanted tests; then
  echo "== equivalence tests on the GPU"
  HEADPRUNE_TEST_GPU=1 python -m pytest -p no:cacheprovider -q \
    tests/test_fairseq_cli.py tests/test_encoder_reuse.py tests/test_masked_attention.py \
    tests/test_ablate_cli.py::test_sweep_matches_fairseq_generate
fi

data=$demo_dir/data/bin
checkpoint=$demo_dir/checkpoints/checkpoint_best.pt
common=(--data "$data" --path "$checkpoint" --batch-size "${BATCH_SIZE:-128}" --configs-per-batch "${CONFIGS:-8}")
if wanted ablation-fp32; then
  echo "== ablation sweep, fp32"
  python scripts/benchmarks/benchmark_ablation.py "${common[@]}" --json "$out_dir/ablation-fp32.json"
fi
if wanted ablation-fp16; then
  echo "== ablation sweep, fp16"
  python scripts/benchmarks/benchmark_ablation.py "${common[@]}" --fp16 --json "$out_dir/ablation-fp16.json"
fi
if wanted ablation-bf16; then
  echo "== ablation sweep, bf16 (in one process: fairseq-generate has no bf16 inference)"
  python scripts/benchmarks/benchmark_ablation.py "${common[@]}" --bf16 --skip-processes --json "$out_dir/ablation-bf16.json"
fi
if wanted speed; then
  echo "== speed: unpruned, masked, shrunk (fused and fairseq's attention path)"
  python scripts/benchmarks/benchmark_speed.py --data "$data" --path "$checkpoint" \
    --importance "$demo_dir/importance/importance.json" --fractions 0.5 --batch-sizes 1 4 16 64 \
    --json "$out_dir/speed.json"
fi
if wanted batching; then
  echo "== batching: the defaults (chosen for the device) against a grid and the authors' loop, fp16"
  configurations=${BATCHING_CONFIGURATIONS:-24}
  python scripts/benchmarks/benchmark_batching.py --data "$data" --path "$checkpoint" \
    --configurations "$configurations" --configs-grid 4 $((configurations / 2)) "$configurations" \
    --batch-grid 64 256 --rounds 2 --generate-configurations 2 --json "$out_dir/batching-fp16.json" \
    -- --beam 5 --lenpen 1 --fp16
fi
echo "wrote $out_dir: gpu_check.log and the JSON of each step run ($steps)"
