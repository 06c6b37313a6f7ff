#!/usr/bin/env bash
# Pruning curves of Michel et al. (2019, sections 4.2 and 5) with fairseq-headprune prune.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") SCOPE DATA_BIN CHECKPOINT SPLIT OUT_DIR

SCOPE     all (every head, Figure 3), enc-enc, enc-dec or dec-dec (one type, Figure 4)
DATA_BIN  fairseq-preprocess output directory
SPLIT     test split to translate (e.g. test, or newstest2013 for the WMT model)
OUT_DIR   results directory; an interrupted run continues where it stopped. Run
          the four scopes into the same OUT_DIR: prune_types.png (Figure 4) and
          prune_curves.md then hold every scope.

environment:
  VENV               virtual environment (default: REPO/.venv); system: the python3 on PATH as it is
  ORDERS             pruning orders (default: importance,iterative,random, plus
                     ablation when ABLATION is set)
  ABLATION           single.json of ablate --mode single (the paper's dashed lines)
  IMPORTANCE         importance.json to rank by (default: estimated on IMPORTANCE_SUBSET)
  IMPORTANCE_SUBSET  splits to estimate importance on (default: valid)
  STEP               pruning step, % of the heads in scope (default: 10)
  MAX                largest pruning level, % (default: 90)
  DRAWS              random draws (default: 3, as Budhraja et al.)
  PRUNING_SEED       seed of the random orders and budgets (default: 1)
  LAYER_BUDGETS      Budhraja et al.'s per-layer budgets, separated by ';'
                     (e.g. "888444 444888 888444;444888 888444 444888")
  TYPE_BUDGETS       per-type budgets, separated by ';' (e.g. "(14,31,30);(31,14,30)")
  GEN_ARGS           fairseq-generate options (default: "--beam 5 --lenpen 1 --batch-size 128")
  BLEU, TEST, SAMPLES, SEED, ALPHA   significance test, as in scripts/studies/ablate.sh
  EXTRA_ARGS         further fairseq-headprune prune options
USAGE
}

[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -eq 5 ]] || { usage >&2; exit 2; }
scope=$1 data_bin=$2 checkpoint=$3 split=$4 out_dir=$5
case $scope in all|enc-enc|enc-dec|dec-dec) ;; *) echo "unknown scope: $scope" >&2; usage >&2; exit 2 ;; esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC1091
source "$repo/scripts/dev/setup_env.sh"

orders=${ORDERS:-importance,iterative,random${ABLATION:+,ablation}}
args=(--scopes "$scope" --orders "$orders" --gen-subset "$split" --out-dir "$out_dir"
      --step-percent "${STEP:-10}" --max-percent "${MAX:-90}" --draws "${DRAWS:-3}"
      --pruning-seed "${PRUNING_SEED:-1}"
      --bleu "${BLEU:-tokenized}" --test "${TEST:-bootstrap}" --samples "${SAMPLES:-1000}"
      --seed "${SEED:-12345}" --alpha "${ALPHA:-0.01}")
[[ -n ${ABLATION:-} ]] && args+=(--ablation "$ABLATION")
[[ -n ${IMPORTANCE:-} ]] && args+=(--importance "$IMPORTANCE")
# where the importance is estimated (without IMPORTANCE; prune refuses the option beside a file it only reads)
# shellcheck disable=SC2206  # IMPORTANCE_SUBSET is a list of splits
[[ -z ${IMPORTANCE:-} || -n ${IMPORTANCE_SUBSET:-} ]] && args+=(--importance-subset ${IMPORTANCE_SUBSET:-valid})
IFS=';' read -r -a layer_budgets <<< "${LAYER_BUDGETS:-}"
for budget in "${layer_budgets[@]}"; do [[ -n $budget ]] && args+=(--layer-budget "$budget"); done
IFS=';' read -r -a type_budgets <<< "${TYPE_BUDGETS:-}"
for budget in "${type_budgets[@]}"; do [[ -n $budget ]] && args+=(--type-budget "$budget"); done

# shellcheck disable=SC2086  # GEN_ARGS and EXTRA_ARGS are lists of options
fairseq-headprune prune "$data_bin" --path "$checkpoint" "${args[@]}" \
  ${GEN_ARGS:---beam 5 --lenpen 1 --batch-size 128} ${EXTRA_ARGS:-}
