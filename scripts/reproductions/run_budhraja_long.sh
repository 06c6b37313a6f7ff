#!/usr/bin/env bash
# Budhraja et al. (2020) at a fine-tuning length that can judge them, over the paper's grid where its claims need it:
# Table 1 at every level, Tables 2 and 3 on the translation demo model; Table 4's 50% and Tables 5 and 6 (every
# middle/top+bottom and top/bottom pair, each pair also tested against each other; Figure 2 over both tables) on the
# BERT-side demo model. Each configuration is fine-tuned as long as the translation model's own training (10
# epochs; the paper's 30) or 3 epochs of the BERT-side classifier's 5 (the paper's 10), and scored along the way.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [OUT_DIR]
       PLAN_ONLY=1 $(basename "$0") [OUT_DIR]   the plan and its estimated hours; nothing is run or trained

Runs, in OUT_DIR (default: results/budhraja-long):
  translation/pruning/  the translation demo model: Table 1's random levels 50, 60 and 75% (DRAWS draws each)
                        and its other levels 25, 35, 55, 81% and one head per layer (the paper's 87%), Table 2's
                        important layers kept or pruned at 5 levels and Table 3's per-type budgets at 4 (TABLES;
                        TABLE_DRAWS draws each, one by default: three make 94 configurations instead of 40, more
                        than twice the time; report.md reads anything drawn fewer than the paper's 3 times
                        inconclusive and says so), the importance-ordered masks at 50, 60, 75% (the project's
                        own comparison: the paper makes none), and the unpruned control, each fine-tuned
                        UPDATES updates, scored at CURVE updates
  bert/pruning/         the BERT-side demo model: 50% at random (DRAWS draws), Tables 5 and 6's whole layers
                        pruned scaled to its depth (BERT_TABLES: top/bottom and middle/top+bottom at each K, even,
                        odd; each pair of Table 5 and odd against the halves also tested against each other), the
                        control, each fine-tuned BERT_UPDATES updates, scored at BERT_CURVE
  translation/seeds/seed-S/   the control and 50% draw 1 fine-tuned again under seed S (SEEDS; prune
                        --finetune-seed S, no curve): what the batches' order alone moves a fine-tuned score
  */pruning/finetune/   results.json (each record's curve, its tests against the control, the unpruned model and
                        its pair), results.md, curves.png (the gap to the control against updates)
  */report.md           the tables and the findings judged on them
The demo models are trained first where DEMO_DIR and BERT_DEMO_DIR do not hold them (the demos' own steps).
Before fine-tuning, prune prints how many configurations there are and what each costs at the checkpoint's own
training speed; PLAN_ONLY=1 prints that plan for each side (the configurations by table, how many are finished)
and stops. Finished configurations and curve points are kept and a killed fine-tune resumes from its last save, so
the script continues where it stopped when run again; the grid of earlier versions (Table 1's 50, 60, 75%, the
importance masks, Table 5's middle:2/4 and top+bottom:2/4) is part of this one and is not redone. The
configurations are dealt over RANKS processes; on several machines give each CONFIG_SHARD=I/K with the same
OUT_DIR (the last to finish merges).

environment:
  DEMO_DIR=results/demo  BERT_DEMO_DIR=results/bert-demo   where the trained demo models are (or go)
  UPDATES=500          fine-tuning updates per translation configuration: 10 epochs, as the demo model trained
                       (490 updates; the paper fine-tunes 30)
  CURVE=25,50,100,150,200,250,300,350,400,450   its recovery curve's points (0 and UPDATES are always points;
                       none: the end only)
  BERT_UPDATES=1875    per BERT-side configuration: 3 epochs of 625 (its best checkpoint trained 3125, 5 epochs;
                       the paper fine-tunes 10)
  BERT_CURVE=125,250,625,1250   its curve's points
  DRAWS=3              draws of the random levels 50, 60, 75% (translation) and 50% (BERT) (the paper: 3)
  TABLES=1,2,3         the translation side's tables (prune --budhraja-tables; empty: Table 1's 50, 60, 75% only)
  TABLE_DRAWS=1        draws of each of their random configurations besides those levels (the paper: 3)
  SEEDS=2,3            the seeds the translation control and 50% draw 1 are fine-tuned under again, beside the
                       grid's (the checkpoint's own, 1 for the demo model); empty: none
  BERT_TABLES=5,6      the BERT side's tables (4 adds Table 4's levels 10-80%, TABLE_DRAWS draws each)
  SIDES="translation bert"   which models to study
  PLAN_ONLY=0          1: print each side's plan and estimated hours, run nothing
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
table_draws=${TABLE_DRAWS:-1}
tables=${TABLES-1,2,3}
bert_tables=${BERT_TABLES-5,6}
seeds=${SEEDS-2,3}
shard=${CONFIG_SHARD:-1/1}
sides=${SIDES:-translation bert}
plan_only=${PLAN_ONLY:-0}
[[ $plan_only == 0 || $plan_only == 1 ]] || { echo "PLAN_ONLY must be 0 or 1, got '$plan_only'" >&2; exit 2; }
for seed in ${seeds//,/ }; do
  [[ $seed =~ ^[0-9]+$ ]] || { echo "SEEDS: '$seed' is not a seed (a whole number)" >&2; exit 2; }
done
for side in $sides; do
  [[ $side == translation || $side == bert ]] || {
    echo "SIDES: unknown side '$side' (expected translation, bert)" >&2; exit 2; }
done
# shellcheck disable=SC1091
source "$repo/scripts/demos/demo_common.sh"

generation=(--beam 5 --lenpen 1 --batch-size 128 --max-len-a 1.2 --max-len-b 10)  # the translation side's

tables_options() {  # TABLES: --budhraja-tables and its draws, or nothing
  [[ -n $1 ]] && printf '%s\n' --budhraja-tables "$1" --budhraja-draws "$table_draws"
  return 0
}

translation_options() {  # the translation side's prune options, in translation_args (the importance file it ranks by)
  importance=$demo_dir/importance/importance.json
  [[ -f $importance ]] || importance=$out_dir/translation/importance/importance.json
  mapfile -t table_args < <(tables_options "$tables")
  translation_args=("$demo_dir/data/bin" --path "$demo_dir/checkpoints/checkpoint_best.pt" --gen-subset test
    --out-dir "$out_dir/translation/pruning"
    --orders importance --importance "$importance" --step-percent 5 --max-percent 75 --finetune-levels 50,60,75
    --random-level 50 --random-level 60 --random-level 75 --draws "$draws" "${table_args[@]}"
    --finetune-updates "${UPDATES:-500}" --finetune-curve "${CURVE:-25,50,100,150,200,250,300,350,400,450}"
    --config-shard "$shard" "${generation[@]}" --no-progress)
}

seeded_finetunes() {  # the translation control and 50% draw 1 fine-tuned again under each of SEEDS, printed
  local seed seed_dir results=()
  for seed in ${seeds//,/ }; do
    seed_dir=$out_dir/translation/seeds/seed-$seed
    record "seed-$seed" sweep prune "$demo_dir/data/bin" --path "$demo_dir/checkpoints/checkpoint_best.pt" \
      --gen-subset test --out-dir "$seed_dir" --orders none --random-level 50 --draws 1 \
      --finetune-updates "${UPDATES:-500}" --finetune-curve none --finetune-seed "$seed" "${generation[@]}" \
      --no-progress > /dev/null
    results+=("$seed_dir/finetune/results.json")
  done
  python - "$out_dir/translation/pruning/finetune/results.json" "${results[@]}" <<'PYTHON'
import json
import statistics
import sys

runs = [{r["label"]: r for r in json.load(open(path, encoding="utf-8"))} for path in sys.argv[1:]]
seeds = ["the checkpoint's" if run["unpruned (control)"].get("seed") is None else run["unpruned (control)"]["seed"]
         for run in runs]
print("fine-tuned again under other seeds (--finetune-seed; the first: the grid's), BLEU by seed "
      f"{', '.join(map(str, seeds))}:")
for label in ("unpruned (control)", "50% draw 1"):
    scores = [run[label]["score_after"] for run in runs]
    print(f"  {label:<28}{'  '.join(f'{score:6.2f}' for score in scores)}  (range {max(scores) - min(scores):.2f},"
          f" std {statistics.stdev(scores):.2f})")
gaps = [run["50% draw 1"]["score_after"] - run["unpruned (control)"]["score_after"] for run in runs]
print(f"  {'50% draw 1 minus the control':<28}{'  '.join(f'{gap:+6.2f}' for gap in gaps)}")
PYTHON
}

bert_options() {  # the BERT side's prune options, in bert_args
  mapfile -t table_args < <(tables_options "$bert_tables")
  bert_args=("$bert_dir/data/bin/nli" --path "$bert_dir/checkpoints/checkpoint_best.pt" --gen-subset test
    --out-dir "$out_dir/bert/pruning" --orders none --random-level 50 --draws "$draws" "${table_args[@]}"
    --finetune-updates "${BERT_UPDATES:-1875}" --finetune-curve "${BERT_CURVE:-125,250,625,1250}"
    --config-shard "$shard" --batch-size 64 --no-progress)
}

if [[ $plan_only == 1 ]]; then  # nothing written, nothing trained
  # shellcheck disable=SC1091
  source "$repo/scripts/dev/setup_env.sh"
  for side in $sides; do
    if [[ $side == translation ]]; then dir=$demo_dir; translation_options; args=("${translation_args[@]}")
    else dir=$bert_dir; bert_options; args=("${bert_args[@]}"); fi
    echo "$side side ($dir):"
    if [[ ! -f $dir/checkpoints/checkpoint_best.pt ]]; then
      echo "  no trained model in $dir yet: the run trains it first (the demos' own steps); plan again after"
      continue
    fi
    fairseq-headprune prune "${args[@]}" --finetune-plan | sed 's/^/  /'
    if [[ $side == translation && -n $seeds ]]; then
      echo "  then the control and 50% draw 1 again under each of SEEDS=$seeds (2 configurations a seed, no curve)"
    fi
  done
  echo "RANKS=${RANKS:-2} processes share the configurations and the machine's cores: the time one at a time is" \
    "about the wall time"
  exit 0
fi

begin_demo "$out_dir/translation" "$out_dir/bert"
began=$SECONDS
for side in $sides; do
  case $side in
    translation)
      ensure_translation_demo_model "$demo_dir"
      translation_options
      [[ -f $importance ]] || record importance fairseq-headprune importance "$demo_dir/data/bin" \
        --path "$demo_dir/checkpoints/checkpoint_best.pt" --importance-subset valid \
        --out-dir "$(dirname "$importance")" --no-progress > /dev/null
      echo "Budhraja et al. at length on the translation demo model (Table 1's 50, 60 and 75% at DRAWS=$draws;" \
        "${tables:+the rest of Tables $tables at TABLE_DRAWS=$table_draws; }importance at 50, 60 and 75%;" \
        "the control), each fine-tuned ${UPDATES:-500} updates:"
      record finetune-translation sweep prune "${translation_args[@]}" | grep --line-buffered -vE "^wrote"
      mkdir -p "$out_dir/translation/commands"
      cp "$out_dir/commands/finetune-translation.sh" "$out_dir/translation/commands/finetune.sh"
      fairseq-headprune report "$out_dir/translation" \
        --title "Budhraja et al. at length on the translation demo model" > /dev/null
      [[ -z $seeds ]] || seeded_finetunes
      ;;
    bert)
      ensure_bert_demo_model "$bert_dir"
      bert_options
      echo "Budhraja et al. at length on the BERT-side demo model (random 50% at DRAWS=$draws;" \
        "${bert_tables:+Tables $bert_tables; }the control), each fine-tuned ${BERT_UPDATES:-1875} updates:"
      record finetune-bert sweep prune "${bert_args[@]}" | grep --line-buffered -vE "^wrote"
      mkdir -p "$out_dir/bert/commands"
      cp "$out_dir/commands/finetune-bert.sh" "$out_dir/bert/commands/finetune.sh"
      fairseq-headprune report "$out_dir/bert" --title "Budhraja et al. at length on the BERT-side demo model" > /dev/null
      ;;
  esac
done
echo "the findings, judged on the fine-tuned configurations (report.md, 'What reproduces'):"
reports=()
for side in $sides; do reports+=("$out_dir/$side/report.md"); done
print_budhraja_findings "${reports[@]}"
echo "the study took $(( (SECONDS - began) / 60 )) minutes in this run; wrote" \
  "$(for side in $sides; do printf '%s ' "$out_dir/$side/report.md"; done)"
