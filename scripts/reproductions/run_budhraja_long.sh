#!/usr/bin/env bash
# Budhraja et al. (2020)'s central claims at a fine-tuning length that can judge them: random pruning at
# Table 1's levels (and Table 4's 50%, Table 5's middle against top+bottom on the BERT side), each configuration
# fine-tuned as long as the translation model's own training (10 epochs; the paper's 30) or 3 epochs of the BERT-side
# classifier's 5 (the paper's 10), and scored along the way (the recovery curves).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]

Runs, in OUT_DIR (default: results/budhraja-long):
  translation/pruning/  the translation demo model: random levels 50, 60 and 75% (DRAWS draws each, one head
                        kept in every layer of every attention type), the importance-ordered masks at the same
                        levels (the project's own comparison: the paper makes none), and the unpruned control,
                        each fine-tuned UPDATES updates and scored at CURVE updates on the way
  bert/pruning/         the BERT-side demo model: 50% at random (DRAWS draws), middle:K against top+bottom:K
                        (K in STRATEGY_K) and the control, each fine-tuned BERT_UPDATES updates, scored at BERT_CURVE
  */pruning/finetune/   results.json (each record's curve, its tests against the control and the unpruned
                        model), results.md, curves.png (the gap to the control against updates)
  */report.md           the tables and the findings judged on them
The demo models are trained first where DEMO_DIR and BERT_DEMO_DIR do not hold them (the demos' own steps).
Before fine-tuning, prune prints how many configurations there are and what each costs at the checkpoint's own
training speed. Finished configurations and curve points are kept and a killed fine-tune resumes from its last
save, so the script continues where it stopped when run again. The configurations are dealt over RANKS
processes; on several machines give each CONFIG_SHARD=I/K with the same OUT_DIR (the last to finish merges).

environment:
  DEMO_DIR=results/demo  BERT_DEMO_DIR=results/bert-demo   where the trained demo models are (or go)
  UPDATES=500          fine-tuning updates per translation configuration: 10 epochs, as the demo model trained
                       (490 updates; the paper fine-tunes 30)
  CURVE=25,50,100,150,200,250,300,350,400,450   its recovery curve's points (0 and UPDATES are always points)
  BERT_UPDATES=1875    per BERT-side configuration: 3 epochs of 625 (its best checkpoint trained 3125, 5 epochs;
                       the paper fine-tunes 10)
  BERT_CURVE=125,250,625,1250   its curve's points
  DRAWS=3              random draws per random level (the paper: 3)
  STRATEGY_K=2,4       Table 5's K: middle:K against top+bottom:K (K even keeps top+bottom balanced)
  SIDES="translation bert"   which models to study
  CONFIG_SHARD=1/1     this process's share of the configurations (I/K)
  THREADS, RANKS       as scripts/demos/run_demo.sh
USAGE
}
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
(( $# <= 1 )) || { usage >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out_dir=${1:-$repo/results/budhraja-long}
demo_dir=${DEMO_DIR:-$repo/results/demo}
bert_dir=${BERT_DEMO_DIR:-$repo/results/bert-demo}
draws=${DRAWS:-3}
shard=${CONFIG_SHARD:-1/1}
sides=${SIDES:-translation bert}
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"
begin_demo "$out_dir/translation" "$out_dir/bert"
began=$SECONDS

for side in $sides; do
  case $side in
    translation)
      ensure_translation_demo_model "$demo_dir"
      importance=$demo_dir/importance/importance.json
      if [[ ! -f $importance ]]; then
        importance=$out_dir/translation/importance/importance.json
        [[ -f $importance ]] || record importance fairseq-headprune importance "$demo_dir/data/bin" \
          --path "$demo_dir/checkpoints/checkpoint_best.pt" --importance-subset valid \
          --out-dir "$out_dir/translation/importance" --no-progress > /dev/null
      fi
      echo "Budhraja et al. Table 1 at length on the translation demo model (random 50, 60, 75%, $draws draws;" \
        "importance at the same levels; the control), each fine-tuned ${UPDATES:-500} updates:"
      record finetune-translation sweep prune "$demo_dir/data/bin" --path "$demo_dir/checkpoints/checkpoint_best.pt" \
        --gen-subset test --out-dir "$out_dir/translation/pruning" \
        --orders importance --importance "$importance" --step-percent 5 --max-percent 75 \
        --finetune-levels 50,60,75 --random-level 50 --random-level 60 --random-level 75 --draws "$draws" \
        --finetune-updates "${UPDATES:-500}" --finetune-curve "${CURVE:-25,50,100,150,200,250,300,350,400,450}" \
        --config-shard "$shard" --beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10 \
        --no-progress | grep --line-buffered -vE "^wrote"
      mkdir -p "$out_dir/translation/commands"
      cp "$out_dir/commands/finetune-translation.sh" "$out_dir/translation/commands/finetune.sh"
      fairseq-headprune report "$out_dir/translation" \
        --title "Budhraja et al. at length on the translation demo model" > /dev/null
      ;;
    bert)
      ensure_bert_demo_model "$bert_dir"
      strategies=()
      strategy_k=${STRATEGY_K:-2,4}
      for k in ${strategy_k//,/ }; do strategies+=(--layer-strategy "middle:$k" --layer-strategy "top+bottom:$k"); done
      echo "Budhraja et al. Tables 4 and 5 at length on the BERT-side demo model (random 50%, $draws draws;" \
        "middle against top+bottom; the control), each fine-tuned ${BERT_UPDATES:-1875} updates:"
      record finetune-bert sweep prune "$bert_dir/data/bin/nli" --path "$bert_dir/checkpoints/checkpoint_best.pt" \
        --gen-subset test --out-dir "$out_dir/bert/pruning" --orders none \
        --random-level 50 --draws "$draws" "${strategies[@]}" \
        --finetune-updates "${BERT_UPDATES:-1875}" --finetune-curve "${BERT_CURVE:-125,250,625,1250}" \
        --config-shard "$shard" --batch-size 64 --no-progress | grep --line-buffered -vE "^wrote"
      mkdir -p "$out_dir/bert/commands"
      cp "$out_dir/commands/finetune-bert.sh" "$out_dir/bert/commands/finetune.sh"
      fairseq-headprune report "$out_dir/bert" --title "Budhraja et al. at length on the BERT-side demo model" > /dev/null
      ;;
    *) echo "SIDES: unknown side '$side' (expected translation, bert)" >&2; exit 2 ;;
  esac
done
echo "the findings, judged on the fine-tuned configurations (report.md, 'What reproduces'):"
reports=()
for side in $sides; do reports+=("$out_dir/$side/report.md"); done
print_budhraja_findings "${reports[@]}"
echo "the study took $(( (SECONDS - began) / 60 )) minutes in this run; wrote" \
  "$(for side in $sides; do printf '%s ' "$out_dir/$side/report.md"; done)"
