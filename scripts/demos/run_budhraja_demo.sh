#!/usr/bin/env bash
# Budhraja et al. (2020) with their protocol: every configuration pruned, fine-tuned with its heads held at
# zero, then scored; Tables 1-3 on the translation demo model, Tables 4-6 and Figure 2 on the BERT-side one.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs, in OUT_DIR (default: results/budhraja-demo):
  translation/pruning/  prune --budhraja-tables 1,2,3 on the translation demo model (random levels 25-81%
                        and one head per layer; the important layers kept or pruned; per-type budgets),
                        every configuration and the unpruned control fine-tuned FINETUNE_UPDATES updates
  bert/pruning/         prune --budhraja-tables 4,5,6 on the BERT-side demo model (random levels 10-90%;
                        whole layers by position), fine-tuned BERT_FINETUNE_UPDATES updates
  */finetune/NAME/compensation.{json,png}   how each head's W_q, W_k, W_v moved (Figure 2)
  */report.md           the tables and the findings judged on the fine-tuned configurations
The demo models are trained first if DEMO_DIR and BERT_DEMO_DIR do not hold them (the training steps of
run_demo.sh and run_bert_demo.sh). The fine-tunes are far shorter than the paper's 30 (Transformer) and
10 (BERT) epochs, so that the whole demo runs in about 21 minutes on 2 cores once the models are trained; the paper-length command is in
docs/reproductions.md. Finished configurations are skipped, a killed fine-tune resumes.

environment:
  DEMO_DIR=results/demo  BERT_DEMO_DIR=results/bert-demo   where the trained demo models are (or go)
  FINETUNE_UPDATES=40  BERT_FINETUNE_UPDATES=40   updates of each configuration's fine-tune
  DRAWS=1              random draws per random configuration (the paper: 3)
  THREADS, RANKS       as scripts/demos/run_demo.sh (the configurations are dealt over RANKS processes)
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/budhraja-demo}
demo_dir=${DEMO_DIR:-$repo/results/demo}
bert_dir=${BERT_DEMO_DIR:-$repo/results/bert-demo}
draws=${DRAWS:-1}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/translation" "$out_dir/bert"

# the translation demo model (run_demo.sh's corpus and training; skipped when trained)
checkpoint=$demo_dir/checkpoints/checkpoint_best.pt
ensure_translation_demo_model "$demo_dir"
echo "Budhraja et al. Tables 1-3 on the translation demo model, each configuration fine-tuned" \
  "${FINETUNE_UPDATES:-40} updates:"
record finetune-translation sweep prune "$demo_dir/data/bin" --path "$checkpoint" --gen-subset test \
  --out-dir "$out_dir/translation/pruning" --orders none --budhraja-tables 1,2,3 --draws "$draws" \
  --finetune-updates "${FINETUNE_UPDATES:-40}" --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 \
  --no-progress | grep --line-buffered -vE "^wrote"
mkdir -p "$out_dir/translation/commands" && cp "$out_dir/commands/finetune-translation.sh" "$out_dir/translation/commands/finetune.sh"
fairseq-headprune report "$out_dir/translation" --title "Budhraja et al. on the translation demo model" > /dev/null

# the BERT-side demo model (run_bert_demo.sh's corpus, pretraining and fine-tuning; skipped when trained)
bert_checkpoint=$bert_dir/checkpoints/checkpoint_best.pt
ensure_bert_demo_model "$bert_dir"
echo "Budhraja et al. Tables 4-6 on the BERT-side demo model, each configuration fine-tuned" \
  "${BERT_FINETUNE_UPDATES:-40} updates:"
record finetune-bert sweep prune "$bert_dir/data/bin/nli" --path "$bert_checkpoint" --gen-subset test \
  --out-dir "$out_dir/bert/pruning" --orders none --budhraja-tables 4,5,6 --draws "$draws" \
  --finetune-updates "${BERT_FINETUNE_UPDATES:-40}" --batch-size 64 --no-progress | grep --line-buffered -vE "^wrote"
mkdir -p "$out_dir/bert/commands" && cp "$out_dir/commands/finetune-bert.sh" "$out_dir/bert/commands/finetune.sh"
fairseq-headprune report "$out_dir/bert" --title "Budhraja et al. on the BERT-side demo model" > /dev/null

echo "the findings, judged on the fine-tuned configurations (report.md, 'What reproduces'):"
print_budhraja_findings "$out_dir/translation/report.md" "$out_dir/bert/report.md"
echo "wrote $out_dir/translation/report.md $out_dir/bert/report.md"
