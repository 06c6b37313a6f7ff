"""``fairseq-headprune prune``: pruning curves and random head budgets."""

import argparse
from typing import Optional

from fairseq_headprune.commands.common import (
    add_curve_arguments,
    add_finetune_resources,
    add_study_inputs,
    add_sweep_arguments,
    add_tuning_arguments,
    curve_settings,
    sweep_settings,
    tuning_settings,
)
from fairseq_headprune.constants import (
    DEFAULT_DRAWS,
    DEFAULT_PRUNING_SEED,
    DEFAULT_SEQUENCE_LENGTH,
    ORDERS,
    PRUNED_STRUCTURES,
    SCOPES,
    STRUCTURE_ORDERS,
    X_AXES,
)
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.budhraja.budgets import draws_text
from fairseq_headprune.study.budhraja.configurations import parse_tables, requested_budgets
from fairseq_headprune.study.budhraja.finetune_plan import check_finetune_levels
from fairseq_headprune.study.finetune.settings import (
    DEFAULT_CURVE_UPDATES,
    FINETUNE_LR_SHARE,
    FINETUNE_WARMUP_SHARE,
    FinetuneSettings,
)
from fairseq_headprune.study.pruning.curves import curve_orders
from fairseq_headprune.study.pruning.settings import PruneSettings
from fairseq_headprune.study.settings import parse_choices
from fairseq_headprune.study.statistics.significance import p_value_text


def settings_from(args: argparse.Namespace) -> PruneSettings:
    settings = _settings(args)
    if settings.has_budgets or settings.finetune_levels:  # refused before fairseq is imported: budgets the model
        from fairseq_headprune.engine.checkpoints.info import (
            checkpoint_head_layout,  # cannot take, levels that are no step
        )

        layout = checkpoint_head_layout(args.path)
        requested_budgets(settings, layout)
        check_finetune_levels(settings.finetune_levels, settings.scopes, layout, settings.curve.step_percent,
                              settings.curve.max_percent)
    return settings


def _settings(args: argparse.Namespace) -> PruneSettings:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_family

    orders = parse_choices(args.orders, ORDERS, "orders")
    tune_orders = []
    if args.tune_orders and not args.tune_masks:
        raise SettingsError("--tune-orders needs --tune-masks")
    if args.tune_masks:
        tune_orders = parse_choices(args.tune_orders, ORDERS, "tune_orders") if args.tune_orders else list(orders)
    return PruneSettings(
        sweep=sweep_settings(args, args.path, checkpoint_family(args.path)),
        curve=curve_settings(args),
        orders=orders,
        scopes=parse_choices(args.scopes, SCOPES, "scopes"),
        importance_file=args.importance,
        ablation_file=args.ablation,
        draws=args.draws,
        pruning_seed=args.pruning_seed,
        layer_budgets=list(args.layer_budget or []),
        type_budgets=list(args.type_budget or []),
        random_levels=list(args.random_level or []),
        layer_strategies=list(args.layer_strategy or []),
        budhraja_tables=parse_tables(args.budhraja_tables) if args.budhraja_tables else [],
        budhraja_draws=args.budhraja_draws,
        fisher_file=args.fisher,
        tuning=tuning_settings(args),
        tune_orders=tune_orders,
        gate_masks=list(args.gate_masks or []),
        finetune=FinetuneSettings(args.finetune_updates, args.finetune_lr, args.finetune_warmup, args.finetune_epochs,
                                  curve=parse_curve(args.finetune_curve), seed=args.finetune_seed,
                                  processes=args.finetune_processes, memory_gb=args.finetune_memory),
        finetune_levels=parse_levels(args.finetune_levels) if args.finetune_levels else [],
        config_shard=parse_config_shard(args.config_shard),
        structure=args.structure,
        x_axis=args.x_axis,
        sequence_length=args.sequence_length,
    )


def parse_levels(text: str):
    """``25,50`` -> [25.0, 50.0]."""
    try:
        return [float(item) for item in text.replace(" ", "").split(",") if item]
    except ValueError:
        raise SettingsError(f"--finetune-levels {text}: expected percentages, comma-separated (e.g. 25,50)") from None


def parse_curve(text):
    """``40,100`` -> [40, 100]; ``none`` -> [] (no curve); None -> None (the default points)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    try:
        return [int(item) for item in text.replace(" ", "").split(",") if item]
    except ValueError:
        raise SettingsError(f"--finetune-curve {text}: expected update counts, comma-separated (e.g. 40,100,200), "
                            "or none") from None


def parse_config_shard(text: str):
    """``I/K`` -> (I, K)."""
    parts = str(text).split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise SettingsError(f"--config-shard {text}: expected I/K (this process's share I of K, e.g. 2/8)")
    return int(parts[0]), int(parts[1])


def print_finetuned(outcome, label: str, resamples: Optional[int]) -> None:
    """Each fine-tuned configuration's score without and with fine-tuning, and against the fine-tuned control (a
    bootstrap's p of 0 as ``p < 1/resamples``)."""
    records = outcome.finetune_records
    print(f"fine-tuned with the pruned heads held at zero ({records[0].finetune} each; Budhraja et al.'s "
          f"protocol), {label} without -> with fine-tuning:")
    for record in records:
        against = ""
        control = record.tests.get("control")
        if control is not None:
            against = (f"  ({control.delta:+.2f} vs the fine-tuned unpruned model, "
                       f"{p_value_text(control.p_value, resamples)})")
        print(f"  {record.label:<28} {record.score_before:6.2f} -> {record.score_after:6.2f}{against}")
    pairs = [(record, other, test) for record in records for other, test in record.paired.items()]
    if pairs:
        print("the pairs the paper sets side by side, tested against each other (first minus second):")
    for record, other, test in pairs:
        interval = f" [{test.low:+.2f}, {test.high:+.2f}]" if test.low is not None else ""
        print(f"  {record.label} minus {other}: {test.delta:+.2f}{interval}, {p_value_text(test.p_value, resamples)}")
    if records[0].missing_configurations:
        print(f"  {records[0].missing_configurations} configurations are another shard's and not done yet")
    print(f"wrote\t{outcome.finetune_results}")


def command_prune(args: argparse.Namespace) -> int:
    settings = settings_from(args)  # before the engine (and fairseq) is imported: bad input fails fast
    if args.finetune_plan:
        if settings.finetune is None or not settings.finetune.enabled:
            raise SettingsError("--finetune-plan plans the fine-tunes: add --finetune-updates/--finetune-epochs N")
        from fairseq_headprune.engine.pipelines.finetune_plan import finetune_plan

        print(finetune_plan(settings))
        return 0
    from fairseq_headprune.engine.pipelines.prune import run_prune

    outcome = run_prune(settings)
    if outcome is None:  # a rank other than 0 of a sharded sweep
        return 0
    label, column = settings.sweep.metric.label, settings.sweep.metric.column
    if outcome.curve_summary:
        print(f"unpruned {label} {outcome.baseline_score:.2f} on {outcome.split}; "
              f"{label} with x% of {outcome.x_title}:")

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
        drawn = [row["draws"] for row in outcome.budget_summary if row["kind"] != "layers"]
        print(f"random heads within budgets (heads kept), {draws_text(drawn or [settings.draws])}"
              + (" each:" if len(set(drawn)) <= 1 else ":"))
        for row in outcome.budget_summary:
            note = f"  [{row['note']}]" if row.get("note") else ""
            print(f"  {row['budget']:<24} {row['percent']:5.1f}% pruned  {label} {row[column]:.2f} "
                  f"± {row[column + '_std']:.2f}"
                  f"  ({row['delta']:+.2f}; {row['significant']} of {row['draws']} draws significant){note}")
        print(f"wrote\t{outcome.budget_files}")
    if outcome.finetune_records:
        print_finetuned(outcome, label, settings.sweep.test.resamples)
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
    _add_finetune_arguments(prune)
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
    prune.add_argument("--ablation", metavar="FILE",
                       help="single.json (or .tsv) of ablate --mode single, for --orders ablation")
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
    prune.add_argument(
        "--random-level", action="append", type=float, metavar="PERCENT",
        help="PERCENT of all heads pruned at random, at least one head kept in every layer of every attention "
        "type (Budhraja et al. Tables 1 and 4; rounded up to whole heads); repeatable",
    )
    prune.add_argument(
        "--layer-strategy", action="append", metavar="STRATEGY",
        help="every head of whole layers pruned by position: [TYPE:]NAME[:K] with NAME top, bottom, top+bottom, "
        "middle (K layers) or even, odd, e.g. 'middle:2', 'enc-enc:top:1' (Budhraja et al. Tables 5 and 6; "
        "without TYPE every attention type); repeatable",
    )
    prune.add_argument(
        "--budhraja-tables", metavar="TABLES",
        help="every configuration of these tables of Budhraja et al. (2020) derived for the model's depth and "
        "heads (docs/pruning.md): 1 random levels 25-81%% and one head per layer; 2 important layers kept or "
        "pruned; 3 per-type budgets; 4 BERT's levels 10-90%%; 5, 6 layer strategies; comma-separated or 'all'",
    )
    prune.add_argument(
        "--budhraja-draws", type=int, metavar="N",
        help="random draws of each --budhraja-tables configuration (default: --draws); one also given by "
        "--random-level, --layer-budget or --type-budget keeps --draws (e.g. Table 1's 50%% with 3 draws, its "
        "other levels with 1)",
    )


def _add_finetune_arguments(prune) -> None:
    """Budhraja et al.'s protocol: every configuration fine-tuned with its pruned heads held at zero."""
    group = prune.add_argument_group(
        "fine-tuning every configuration (Budhraja et al. 2020's protocol)",
        "Every budget's draws and layer strategies (and the curves' steps at --finetune-levels) are fine-tuned "
        "from the checkpoint with their heads held at zero, on the training split of DATA, with the checkpoint's "
        "own optimizer, criterion and batch size, then scored again; the unpruned model fine-tuned alike is the "
        "control. Results in OUT/finetune/results.json; finished configurations are kept, a killed fine-tune "
        "resumes from its last save.")
    length = group.add_mutually_exclusive_group()
    length.add_argument("--finetune-updates", type=int, default=0, metavar="N",
                        help="fine-tune each configuration for N updates (default 0: no fine-tuning)")
    length.add_argument("--finetune-epochs", type=int, default=0, metavar="N",
                        help="or for N epochs (the paper: 30 for its Transformer, 10 for BERT)")
    group.add_argument("--finetune-lr", type=float, metavar="LR",
                       help=f"constant learning rate after the warm-up (default: {FINETUNE_LR_SHARE:g} of the "
                       "checkpoint's peak rate)")
    group.add_argument("--finetune-warmup", type=int, metavar="N",
                       help=f"linear warm-up updates (default: {FINETUNE_WARMUP_SHARE:g} of --finetune-updates; "
                       "0 with --finetune-epochs)")
    add_finetune_resources(group)
    group.add_argument("--finetune-seed", type=int, metavar="SEED",
                       help="fairseq's --seed for the fine-tunes: the order of their batches and their dropout "
                       "(default: the checkpoint's own). Draw d of a random budget trains under SEED + d - 1, as the "
                       "paper fine-tunes each draw anew; the control and the configurations without draws under "
                       "SEED. The control fine-tuned under a few seeds, each into its own --out-dir, measures how "
                       "far the order alone moves a fine-tuned score")
    group.add_argument("--finetune-curve", metavar="U,...",
                       help="the recovery curve: score every fine-tune after these numbers of updates too, from "
                       "checkpoints saved on the way (OUT/finetune/NAME/curve/), and plot the gap to the fine-tuned "
                       "control against updates (OUT/finetune/curves.png); 'none' scores only the end (default: "
                       + ", ".join(str(u) for u in DEFAULT_CURVE_UPDATES[:5]) + ", ... below --finetune-updates; "
                       "with --finetune-epochs, every epoch's end)")
    group.add_argument("--finetune-levels", metavar="P,...",
                       help="also fine-tune every curve's step at these %% of heads pruned (e.g. 50,60)")
    group.add_argument("--finetune-plan", action="store_true",
                       help="print the fine-tuning plan and exit, scoring and fine-tuning nothing: the configurations "
                       "by where they come from, how many are finished in OUT, and what the rest cost at the "
                       "checkpoint's training speed")
    group.add_argument("--config-shard", default="1/1", metavar="I/K",
                       help="fine-tune only the I-th of K shares of the configurations (a Slurm array task: "
                       "I=$SLURM_ARRAY_TASK_ID+1); every share writes to the same OUT, and the last to finish "
                       "merges results.json (default 1/1)")
