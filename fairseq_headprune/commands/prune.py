"""``fairseq-headprune prune``: pruning curves and random head budgets."""

import argparse

from ..constants import (
    DEFAULT_DRAWS,
    DEFAULT_PRUNING_SEED,
    DEFAULT_SEQUENCE_LENGTH,
    ORDERS,
    PRUNED_STRUCTURES,
    SCOPES,
    STRUCTURE_ORDERS,
    X_AXES,
)
from ..errors import SettingsError
from ..study.settings import PruneSettings, parse_choices
from .common import (
    add_curve_arguments,
    add_study_inputs,
    add_sweep_arguments,
    add_tuning_arguments,
    curve_settings,
    sweep_settings,
    tuning_settings,
)
from ..study.methods.pruning import curve_orders


def settings_from(args: argparse.Namespace) -> PruneSettings:
    from ..engine.checkpoints.info import checkpoint_family

    orders = parse_choices(args.orders, ORDERS, "--orders")
    tune_orders = []
    if args.tune_orders and not args.tune_masks:
        raise SettingsError("--tune-orders needs --tune-masks")
    if args.tune_masks:
        tune_orders = parse_choices(args.tune_orders, ORDERS, "--tune-orders") if args.tune_orders else list(orders)
    return PruneSettings(
        sweep=sweep_settings(args, args.path, checkpoint_family(args.path)),
        curve=curve_settings(args),
        orders=orders,
        scopes=parse_choices(args.scopes, SCOPES, "--scopes"),
        importance_file=args.importance,
        ablation_file=args.ablation,
        draws=args.draws,
        pruning_seed=args.pruning_seed,
        layer_budgets=list(args.layer_budget or []),
        type_budgets=list(args.type_budget or []),
        fisher_file=args.fisher,
        tuning=tuning_settings(args),
        tune_orders=tune_orders,
        gate_masks=list(args.gate_masks or []),
        structure=args.structure,
        x_axis=args.x_axis,
        sequence_length=args.sequence_length,
    )


def command_prune(args: argparse.Namespace) -> int:
    settings = settings_from(args)  # before the engine (and fairseq) is imported: bad input fails fast
    from ..engine.pipelines.prune import run_prune

    outcome = run_prune(settings)
    if outcome is None:  # a rank other than 0 of a sharded sweep
        return 0
    label, column = settings.sweep.metric.label, settings.sweep.metric.column
    if outcome.curve_summary:
        print(f"unpruned {label} {outcome.baseline_score:.2f} on {outcome.split}; {label} with x% of {outcome.x_title}:")

        width = max(10, *(len(r["order"]) for r in outcome.curve_summary))
        for scope in outcome.curve_scopes:
            for order in curve_orders(r["order"] for r in outcome.curve_summary if r["scope"] == scope):
                points = [r for r in outcome.curve_summary if r["scope"] == scope and r["order"] == order]
                text = "  ".join(f"{r['percent']:.0f}%:{r[column]:.2f}" for r in points)
                print(f"  {scope:<7} {order:<{width}} {text}")
        costs = outcome.method_costs
        if any(c["seconds"] for c in costs.values()):
            print("cost of finding the masks: " + "; ".join(
                f"{order} {c['seconds']:.1f} s ({c['sentences']} sentences"
                + (f", tuned on {c['tuning_sentences']}" if "tuning_sentences" in c else "") + ")"
                for order, c in costs.items() if c["seconds"]))
        print(f"wrote\t{settings.sweep.out_dir}: " + " ".join(outcome.curve_files))
    if outcome.budget_summary:
        print(f"random heads within budgets (heads kept), {settings.draws} draws each:")
        for row in outcome.budget_summary:
            print(f"  {row['budget']:<24} {row['percent']:5.1f}% pruned  {label} {row[column]:.2f} ± {row[column + '_std']:.2f}"
                  f"  ({row['delta']:+.2f}; {row['significant']} of {row['draws']} draws significant)")
        print(f"wrote\t{outcome.budget_files}")
    return 0


def add_parser(commands) -> None:
    prune = commands.add_parser(
        "prune",
        help="pruning curves by importance, ablation score or at random; random head budgets "
        "(paper sections 4.2 and 5; Budhraja et al. 2020)",
        description="Prune heads in steps (default 10% of the heads in scope per step, rounded "
        "up) and translate --gen-subset at every step (a classifier or language-model checkpoint: "
        "score it, by accuracy or Matthews correlation, perplexity), testing each against the unpruned "
        "model. Orders: importance (I_h estimated once on the unpruned model, lowest first; "
        "default), iterative (I_h re-estimated on the pruned model after each step), ablation "
        "(the head whose masking alone cost the least first, from ablate --mode single), "
        "random (seeded, --draws permutations, mean and std), fisher (Kwon et al.'s mask search with the "
        "diagonal Fisher information at each level: the heads of largest F_h kept), fisher-rearranged (the same, "
        "then each layer's heads swapped with its block of the Fisher matrix). --tune-masks draws a second curve "
        "of each order with every mask tuned by least squares. Scopes: all heads together, or "
        "one attention type. --layer-budget / --type-budget add Budhraja et al.'s random "
        "configurations. Results are stored per mask as they finish: a rerun continues where "
        "it stopped. --structure ffn prunes FFN neurons instead, in steps of the FFN layers' FLOPs, by "
        "their importance or Fisher scores (the importance file's neuron scores, or estimated), at random, or by "
        "the search (fisher); --structure joint searches heads and neurons together at each level of the "
        "attention and FFN layers' FLOPs. --x-axis flops draws any curve against the share of those FLOPs "
        "removed. Any other option is passed to fairseq-generate's parser (fairseq-validate's "
        "for a classifier, fairseq-eval-lm's for a language model).",
    )
    add_study_inputs(prune)
    prune.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    _add_curve_arguments(prune)
    _add_score_file_arguments(prune)
    _add_budget_arguments(prune)
    add_tuning_arguments(
        prune, "also draw each curve of --tune-orders (default: every --orders) with each mask tuned "
        "by least squares (Kwon et al. 2022): the order named ORDER+tuned; tunings are stored under OUT/tuning",
    )
    add_sweep_arguments(prune)
    prune.set_defaults(handler=command_prune, accepts_fairseq_args=True)


def _add_curve_arguments(prune) -> None:
    """The curves: orders, scopes, what is pruned and on which axis, the levels."""
    prune.add_argument(
        "--orders", default="importance", metavar="ORDERS",
        help=f"pruning orders, comma-separated, from {', '.join(ORDERS)}, or none "
        "(only budgets) (default: importance)",
    )
    prune.add_argument(
        "--scopes", default="all", metavar="SCOPES",
        help=f"heads to prune, comma-separated, from {', '.join(SCOPES)}: all types together "
        "(Figure 3) or one type (Figure 4) (default: all)",
    )
    prune.add_argument(
        "--structure", choices=PRUNED_STRUCTURES, default="heads",
        help="what the curves prune: heads (default); ffn: FFN neurons, orders "
        f"{', '.join(STRUCTURE_ORDERS['ffn'])}; joint: heads and neurons searched together, orders "
        f"{', '.join(STRUCTURE_ORDERS['joint'])} (both: --scopes all, steps in %% of the structure's FLOPs)",
    )
    prune.add_argument(
        "--x-axis", choices=X_AXES,
        help="the curves' x-axis: units, the share of the heads (or neurons) pruned (default; not for joint), or "
        "flops, the share of the attention and FFN layers' FLOPs per token removed (default for joint)",
    )
    prune.add_argument(
        "--sequence-length", type=int, default=DEFAULT_SEQUENCE_LENGTH, metavar="N",
        help=f"attended positions per token of the attention FLOPs, for FLOPs steps and axes (default "
        f"{DEFAULT_SEQUENCE_LENGTH})",
    )
    add_curve_arguments(prune)
    prune.add_argument(
        "--draws", type=int, default=DEFAULT_DRAWS, metavar="N",
        help=f"random draws per random curve or budget (default {DEFAULT_DRAWS})",
    )
    prune.add_argument(
        "--pruning-seed", type=int, default=DEFAULT_PRUNING_SEED, metavar="SEED",
        help=f"seed of the random orders and budgets (default {DEFAULT_PRUNING_SEED})",
    )


def _add_score_file_arguments(prune) -> None:
    """The stored scores and masks the orders rank by."""
    prune.add_argument(
        "--importance", metavar="FILE",
        help="importance.json (from the importance command) to rank by; default: estimate it "
        "on --importance-subset and store it under OUT/importance",
    )
    prune.add_argument("--ablation", metavar="FILE", help="single.json (or .tsv) of ablate --mode single, for --orders ablation")
    prune.add_argument(
        "--gate-masks", nargs="+", metavar="FILE",
        help="masks learned by fairseq-train --criterion headprune_gates (mask --from-gates ... --out FILE), one "
        "per budget trained: the curve 'gates' through them (what training them cost is read from a cost.json "
        "beside each, as scripts/train/train_gates.sh writes it)",
    )
    prune.add_argument(
        "--fisher", metavar="FILE",
        help="importance.json of importance --importance-method fisher, for the fisher orders; default: estimate "
        "it on --importance-subset and store it under OUT/importance-fisher (--structure ffn or joint: "
        "OUT/importance-fisher-ffn)",
    )



def _add_budget_arguments(prune) -> None:
    """Budhraja et al.'s configurations: heads kept at random within budgets."""
    prune.add_argument(
        "--layer-budget", action="append", metavar="BUDGET",
        help="heads kept per layer, one group per attention type (Enc-Enc, Enc-Dec, Dec-Dec), "
        "one digit per layer or comma-separated numbers, e.g. '888444 444888 888444' "
        "(Budhraja et al. Table 2); repeatable",
    )
    prune.add_argument(
        "--type-budget", action="append", metavar="BUDGET",
        help="heads kept in each attention type, e.g. '(14,31,30)' (Budhraja et al. Table 3); repeatable",
    )
