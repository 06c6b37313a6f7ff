"""``fairseq-headprune dynamics``: head importance over training (paper section 6, Figure 5)."""

import argparse
import os

from fairseq_headprune.commands.common import (
    add_curve_arguments,
    add_study_inputs,
    add_sweep_arguments,
    curve_settings,
    sweep_settings,
)
from fairseq_headprune.study.importance.dynamics import dynamics_grid, epoch_checkpoints, parse_epochs
from fairseq_headprune.study.masks.ranges import format_ranges
from fairseq_headprune.study.pruning.settings import DynamicsSettings


def settings_from(args: argparse.Namespace) -> DynamicsSettings:
    from fairseq_headprune.engine.checkpoints.info import checkpoint_family

    epochs = parse_epochs(args.epochs)
    (_, first), *_ = epoch_checkpoints(args.checkpoints, epochs)  # the family of the first epoch's model
    return DynamicsSettings(
        sweep=sweep_settings(args, args.checkpoints, checkpoint_family(first)), checkpoints=args.checkpoints,
        curve=curve_settings(args), epochs=epochs,
    )


def command_dynamics(args: argparse.Namespace) -> int:
    settings = settings_from(args)  # before the engine (and fairseq) is imported: bad input fails fast
    from fairseq_headprune.engine.pipelines.dynamics import run_dynamics

    rows = run_dynamics(settings)
    if rows is None:  # a rank other than 0 of a sharded sweep
        return 0
    grid, label = dynamics_grid(rows), settings.sweep.metric.label
    print(f"{len(grid.epochs)} epochs ({format_ranges(grid.epochs)}); {label} as % of each epoch's unpruned {label}:")
    print("  epoch  unpruned  " + "  ".join(f"{grid.percent[k]:>5.0f}%" for k in grid.levels[1:]))
    for epoch in grid.epochs:
        print(f"  {epoch:>5}  {grid.unpruned_score(epoch):>8.2f}  "
              + "  ".join(f"{100 * grid.cell[(epoch, k)]['relative']:>6.1f}" for k in grid.levels[1:]))
    print(f"wrote\t{os.path.join(settings.sweep.out_dir, 'dynamics')}.{{tsv,json,md,png}} and epochN/ per checkpoint")
    return 0


def add_parser(commands) -> None:
    dynamics = commands.add_parser(
        "dynamics",
        help="head importance over training: the pruning curve at every epoch checkpoint (paper section 6)",
        description="For every epoch checkpoint fairseq-train saved in --checkpoints "
        "(checkpoint1.pt, checkpoint2.pt, ...), estimate head importance on that checkpoint, "
        "prune the least important heads in steps (0-90% in 10% steps by default) and translate "
        "--gen-subset at every step; report BLEU relative to the epoch's unpruned BLEU (Figure 5: "
        "epochs on a log scale, one line per pruning level). Each finished epoch is recorded, so a "
        "rerun continues where it stopped. Any other option is passed to fairseq-generate's parser.",
    )
    add_study_inputs(dynamics)
    dynamics.add_argument("--checkpoints", required=True, metavar="DIR", help="fairseq-train's --save-dir")
    dynamics.add_argument("--epochs", metavar="LIST", help="only these epochs, e.g. '1-10,15,20' (default: all)")
    add_curve_arguments(dynamics)
    add_sweep_arguments(dynamics)
    dynamics.set_defaults(handler=command_dynamics, accepts_fairseq_args=True)
