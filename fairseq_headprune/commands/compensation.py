"""``fairseq-headprune compensation``: how much each head's weights moved while a pruned model was fine-tuned."""

import argparse
import os

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.budhraja.compensation import MEASURES, PAPER_SPREAD
from fairseq_headprune.study.masks.head_mask import parse_head_mask
from fairseq_headprune.study.output.files import write_json

MEASURE_TITLES = {"mean_abs_change": "mean |ΔW|", "relative_change": "‖ΔW‖/‖W‖"}


def command_compensation(args: argparse.Namespace) -> int:
    if not args.out.lower().endswith(".json"):
        raise SettingsError(f"--out must end in .json: {args.out}")
    plot = args.plot if args.plot is not None else os.path.splitext(args.out)[0] + ".png"
    if plot and not plot.lower().endswith((".png", ".pdf", ".svg")):
        raise SettingsError(f"--plot must end in .png, .pdf or .svg: {plot}")
    from fairseq_headprune.engine.checkpoints.info import checkpoint_head_layout
    from fairseq_headprune.engine.pipelines.compensation import checkpoint_compensation
    from fairseq_headprune.study.output.plots import plot_compensation

    pruned = None if args.head_mask is None else parse_head_mask(args.head_mask, checkpoint_head_layout(args.before))
    compensation = checkpoint_compensation(args.before, args.after, pruned)
    print(f"pruned\t{len(compensation.pruned)} heads"
          f"{': ' + ' '.join(compensation.pruned) if compensation.pruned else ''}")
    for line in compensation_lines(compensation):
        print(line)
    write_json(dict(compensation.to_dict(), before=args.before, after=args.after), args.out, indent=1)
    written = [args.out]
    if plot:
        plot_compensation(compensation, plot, "change of each head's W_q, W_k, W_v during fine-tuning")
        written.append(plot)
    print("wrote\t" + " ".join(written))
    return 0


def compensation_lines(compensation):
    """Per type and layer the unpruned heads' mean change, and the spread between layers beside the paper's."""
    lines = [f"{'type':<8} {'layer':>5} " + " ".join(f"{MEASURE_TITLES[m]:>12}" for m in MEASURES)]
    for attention_type in compensation.layer_means[MEASURES[0]]:
        columns = [compensation.layer_means[m][attention_type] for m in MEASURES]
        for layer, values in enumerate(zip(*columns)):
            cells = " ".join(f"{'(pruned)' if v is None else format(v, '.3g'):>12}" for v in values)
            lines.append(f"{attention_type:<8} {layer + 1:>5} {cells}")
    for measure in MEASURES:
        spreads = {t: compensation.spread(measure, t) for t in compensation.layer_means[measure]}
        text = ", ".join(f"{t} {'-' if s is None else format(s, '.1%')}" for t, s in spreads.items())
        overall = compensation.spread(measure)
        lines.append(f"layer spread ({MEASURE_TITLES[measure]}; (max - min) / min of the layers' means): "
                     f"{text}; all layers {'-' if overall is None else format(overall, '.1%')} "
                     f"(paper: < {PAPER_SPREAD:.0%})")
    return lines


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compensation",
        help="how much each head's W_q, W_k, W_v moved between two checkpoints (Budhraja et al. 2020, Figure 2)",
        description="For every head, the change of its rows of the query, key and value in-projections "
        "(rows h*d_h ... (h+1)*d_h - 1; biases left out) from --before to --after, two checkpoints of one "
        "architecture (the start and a fine-tuned one): the mean absolute change of the entries (the paper's "
        "'average change') and ||ΔW|| / ||W||. Prints each layer's mean over its unpruned heads and the "
        "layer spread (largest relative difference between two layers' means), which Budhraja et al. put "
        "below 10%; writes a JSON keyed by head (E:3:5, 1-based) and heat maps like their Figure 2.",
    )
    parser.add_argument("--before", required=True, metavar="CKPT", help="the checkpoint fine-tuning started from")
    parser.add_argument("--after", required=True, metavar="CKPT", help="the fine-tuned checkpoint")
    parser.add_argument("--out", required=True, metavar="FILE.json", help="where the per-head changes go")
    parser.add_argument("--head-mask", metavar="SPEC",
                        help="the heads pruned during fine-tuning (spec or mask file; default: the mask --after "
                        "records, as `train --head-mask` saves it); left out of the layers' means")
    parser.add_argument("--plot", metavar="FILE",
                        help="heat maps of the mean absolute change (default: --out with .png; '' for none)")
    parser.set_defaults(handler=command_compensation)
