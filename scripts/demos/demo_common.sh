#!/usr/bin/env bash
# What the demo scripts share (and scripts/reproductions/run_budhraja_long.sh); sourced, not run.
#
# Expects: repo (the checkout) and out_dir (the study directory). Provides:
#   begin_demo DIR...   the virtual environment, OUT_DIR/commands and DIRs, the thread and rank
#                       counts (THREADS, RANKS: sets ranks and rank_threads), OUT_DIR/environment.txt
#   write_environment   OUT_DIR/environment.txt: versions, threads, kernels, CPU
#   record NAME CMD...  note CMD in OUT_DIR/commands/NAME.sh (for the report), then run it
#   sweep STUDY ARGS... fairseq-headprune STUDY ARGS, under torchrun with `ranks` processes when > 1
#   ensure_translation_demo_model DIR, ensure_bert_demo_model DIR   the demo models, trained where missing
#   print_budhraja_findings REPORT...   the findings a report judged on fine-tuned configurations

begin_demo() {
  # shellcheck disable=SC1091
  source "$repo/scripts/dev/setup_env.sh"
  mkdir -p "$out_dir/commands" "$@"
  export THREADS=${THREADS:-2}
  ranks=${RANKS:-2}
  [[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "RANKS must be a positive integer, got '$ranks'" >&2; exit 2; }
  rank_threads=$(( THREADS / ranks > 0 ? THREADS / ranks : 1 ))
  # shellcheck disable=SC1091
  source "$repo/scripts/train/pin_cpu.sh"  # THREADS threads, the CPU kernels pinned
  write_environment
}

write_environment() {
  RANKS=$ranks RANK_THREADS=$rank_threads python - > "$out_dir/environment.txt" <<'PYTHON'
import logging
import os
import platform

logging.getLogger("fairseq").setLevel(logging.WARNING)  # its import's notices are not the demo's output
import fairseq, numpy, sacrebleu, torch

cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
           platform.processor() or "unknown")
print(f"torch {torch.__version__}, fairseq {fairseq.__version__}, numpy {numpy.__version__}, "
      f"sacrebleu {sacrebleu.__version__}; {torch.get_num_threads()} CPU threads on {cpu} "
      f"(kernels: ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')}, "
      f"MKL_CBWR={os.environ.get('MKL_CBWR')}); sweeps: {os.environ['RANKS']} ranks of "
      f"{os.environ['RANK_THREADS']} thread(s); "
      f"Python {platform.python_version()}")
PYTHON
}

declare -A recorded
record() {  # NAME COMMAND...: note the command in commands/NAME.sh (for the report), then run it
  local name=$1; shift
  [[ -n ${recorded[$name]:-} ]] || : > "$out_dir/commands/$name.sh"
  recorded[$name]=1
  local quoted prefix=""
  if [[ $1 == sweep ]]; then  # as the sweep function runs it
    printf -v quoted '%q ' fairseq-headprune "${@:2}"
    (( ranks > 1 )) && { prefix="OMP_NUM_THREADS=$rank_threads torchrun --standalone --nproc-per-node $ranks "
                         quoted='"$(command -v fairseq-headprune)" '"${quoted#fairseq-headprune }"; }
  else
    printf -v quoted '%q ' "$@"
  fi
  echo "$prefix${quoted% }" | sed "s|$repo/||g" >> "$out_dir/commands/$name.sh"
  "$@"
}

# the sweeps: RANKS processes of RANK_THREADS threads each under torchrun (torchrun_sweep.py: torchrun, a failed
# rank's one-line error without torchrun's traceback after it, and that rank's exit status)
sweep() {  # STUDY-COMMAND OPTIONS...
  if (( ranks > 1 )); then
    OMP_NUM_THREADS=$rank_threads MKL_NUM_THREADS=$rank_threads python "$repo/scripts/demos/torchrun_sweep.py" \
      --standalone --nproc-per-node "$ranks" "$(command -v fairseq-headprune)" "$@"
  else
    fairseq-headprune "$@"
  fi
}

# the demo models, trained with the demos' own steps where DIR does not hold one yet (Budhraja et al.'s scripts)
ensure_translation_demo_model() {  # DIR: run_demo.sh's corpus and training into DIR
  local dir=$1
  [[ -f $dir/checkpoints/checkpoint_best.pt ]] && return 0
  echo "training the translation demo model in $dir:"
  bash "$repo/scripts/data/prepare_demo_data.sh" "$dir/data"
  bash "$repo/scripts/train/train_demo.sh" "$dir/data/bin" "$dir/checkpoints" \
    2>&1 | tee -a "$dir/train.log" | grep --line-buffered -E "done training" || true
  [[ -f $dir/checkpoints/checkpoint_best.pt ]] || { echo "training failed: see $dir/train.log" >&2; exit 1; }
}

ensure_bert_demo_model() {  # DIR: run_bert_demo.sh's corpus, pretraining and fine-tuning into DIR
  local dir=$1
  [[ -f $dir/checkpoints/checkpoint_best.pt ]] && return 0
  echo "training the BERT-side demo model in $dir:"
  (
    export LAYERS=${LAYERS:-6} HEADS=${HEADS:-8} EMBED_DIM=${EMBED_DIM:-128} FFN_DIM=${FFN_DIM:-256}
    bash "$repo/scripts/data/prepare_nli_data.sh" "$dir/data"
    EPOCHS=${PRETRAIN_EPOCHS:-6} bash "$repo/scripts/train/pretrain_roberta.sh" "$dir/data/bin/pretrain" \
      "$dir/pretrain" >> "$dir/pretrain.log" 2>&1
    RESTORE=$dir/pretrain/checkpoint_best.pt NUM_CLASSES=3 EPOCHS=${EPOCHS:-6} LR=${LR:-0.0003} \
      WARMUP=${WARMUP:-150} bash "$repo/scripts/train/train_classifier.sh" "$dir/data/bin/nli" \
      "$dir/checkpoints" >> "$dir/train.log" 2>&1
  )
  [[ -f $dir/checkpoints/checkpoint_best.pt ]] || { echo "training failed: see $dir/train.log" >&2; exit 1; }
}

print_budhraja_findings() {  # REPORT.md...: the rows of "What reproduces" judged on fine-tuned configurations
  python - "$@" <<'PYTHON'
import sys

for path in sys.argv[1:]:
    for line in open(path, encoding="utf-8"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and cells[4].startswith("fine-tuned"):
            finding, _, study, margin, evidence, rule, verdict = cells
            print(f"  {finding}: {verdict}\n    {study}\n    {evidence}; contradicted by: {margin}; rule: {rule}")
PYTHON
}
