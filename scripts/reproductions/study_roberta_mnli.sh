#!/usr/bin/env bash
# The BERT-side studies of Michel et al. (2019) on fairseq's roberta.large.mnli and MultiNLI.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") PREPARED_DIR [OUT_DIR]

Runs, on the model and data scripts/reproductions/prepare_roberta_mnli.sh wrote in PREPARED_DIR
(bundle/model.pt, bin/), writing into OUT_DIR (default: PREPARED_DIR/study):
  importance/  I_h on valid2 (the training subset), never on the evaluation sets
  ablation/    every head masked alone on MNLI-matched (valid) and -mismatched (valid1),
               the paper's t-test (Table 1 / Figure 1(b), Figure 2, section 3.4);
               every layer reduced to one head, chosen on valid2 too (Table 2, appendix A)
  pruning/     pruning curves by importance (once, re-estimated on valid2), by
               single-head ablation and at random (Figure 3(b))
  shrink/      examples/s unpruned, masked and shrunk at 50% of heads removed by
               importance, batch sizes 1 4 16 64 (Table 4)
  report.md    every table, figure and the papers' BERT findings checked
Finished steps are skipped, so an interrupted run continues where it stopped. The
released model has no training checkpoints: the dynamics study needs a model you
fine-tune yourself (prepare with TRAIN=1, then scripts/train/train_classifier.sh).

environment:
  VENV         virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  THREADS      CPU threads (default 2); RANKS: processes the sweeps are sharded over
               with torchrun (default 1; on N GPUs: N, rank r on cuda:r)
  BATCH_SIZE   examples per batch in the sweeps (default 32)
  FAIRSEQ_ARGS further options for every sweep (e.g. --fp16 on a GPU)
  ORDERS       pruning orders (default importance,iterative,ablation,random)
  SPEED_EXAMPLES examples timed per batch size (default 1024); SPEED_REPEATS (default 3)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -ge 1 && $# -le 2 ]] || { usage >&2; exit 2; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prepared=$1
out_dir=${2:-$prepared/study}
data=$prepared/bin
model=$prepared/bundle/model.pt
[[ -f $model ]] || { echo "study_roberta_mnli: error: no $model (run scripts/reproductions/prepare_roberta_mnli.sh first)" >&2; exit 2; }
[[ -f $data/label/valid2.idx ]] || { echo "study_roberta_mnli: error: no $data/label/valid2.idx (run scripts/reproductions/prepare_roberta_mnli.sh first)" >&2; exit 2; }
export RANKS=${RANKS:-1}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir"
# shellcheck disable=SC2206  # FAIRSEQ_ARGS is a list of options
options=(--batch-size "${BATCH_SIZE:-32}" --no-progress ${FAIRSEQ_ARGS:-})

if [[ ! -f "$out_dir/importance/importance.json" ]]; then
  echo "head importance on $(wc -l < "$prepared/text/train5k.label") training pairs (valid2):"
  record importance fairseq-headprune importance "$data" --path "$model" --importance-subset valid2 \
    --out-dir "$out_dir/importance" --batch-size "${BATCH_SIZE:-32}" --no-progress
fi
ablation=(sweep ablate "$data" --path "$model" --gen-subset valid --out-dir "$out_dir/ablation" --test t-test "${options[@]}")
echo "every head masked alone, MNLI-matched and -mismatched (Table 1, Figures 1(b) and 2):"
record ablate-single "${ablation[@]}" --mode cross-domain --cross-subset valid1
echo "every layer reduced to one head; chosen on the training subset too (Table 2, appendix A):"
record ablate-all-but-one "${ablation[@]}" --mode all-but-one --select-subset valid2
echo "pruning by importance, by single-head ablation and at random (Figure 3(b)):"
orders=${ORDERS:-importance,iterative,ablation,random}
pruning=(--orders "$orders" --importance "$out_dir/importance/importance.json")
# what the orders read (prune refuses an option no order uses): iterative re-estimates importance on valid2
[[ ,$orders, == *,iterative,* ]] && pruning+=(--importance-subset valid2)
[[ ,$orders, == *,ablation,* ]] && pruning+=(--ablation "$out_dir/ablation/single.json")
record prune-all sweep prune "$data" --path "$model" --gen-subset valid --out-dir "$out_dir/pruning" \
  "${pruning[@]}" "${options[@]}"
if [[ ! -f "$out_dir/shrink/classifier_speed.json" ]]; then
  echo "examples per second with half of the heads removed (Table 4):"
  record speed python "$repo/scripts/benchmarks/benchmark_classifier_speed.py" --data "$data" --path "$model" --subset valid \
    --importance "$out_dir/importance/importance.json" --examples "${SPEED_EXAMPLES:-1024}" \
    --repeats "${SPEED_REPEATS:-3}" --keep-dir "$out_dir/shrink" --json "$out_dir/shrink/classifier_speed.json"
fi
fairseq-headprune report "$out_dir" --title "fairseq-headprune: roberta.large.mnli on MultiNLI"
