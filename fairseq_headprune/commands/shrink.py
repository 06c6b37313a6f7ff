"""``fairseq-headprune shrink``: remove heads for real (paper section 4.3)."""

import argparse

from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import parse_head_mask
from fairseq_headprune.study.masks.layer_drop import layout_after_drop, parse_layer_drop
from fairseq_headprune.study.output.files import write_text


def shrink_masks(args: argparse.Namespace):
    """The layers to drop, the head mask and the FFN mask the options give (None where not given), parsed against
    the checkpoint: the masks number the layers that stay."""
    if args.head_mask is None and args.ffn_mask is None and args.drop_layers is None:
        return None, None, None
    from fairseq_headprune.engine.checkpoints.shrink import shrink_layouts

    depths, head_layout, ffn_layout = shrink_layouts(args.path)
    dropped = None if args.drop_layers is None else parse_layer_drop(args.drop_layers, depths)
    head_mask = None if args.head_mask is None else parse_head_mask(args.head_mask,
                                                                     layout_after_drop(head_layout, dropped))
    ffn_mask = None if args.ffn_mask is None else parse_ffn_mask(args.ffn_mask, layout_after_drop(ffn_layout, dropped))
    return dropped, head_mask, ffn_mask


def command_shrink(args: argparse.Namespace) -> int:
    from fairseq_headprune.engine.checkpoints.shrink import shrink_checkpoint

    dropped, head_mask, ffn_mask = shrink_masks(args)
    outcome = shrink_checkpoint(args.path, args.out, head_mask, args.tuning, ffn_mask, dropped)
    if outcome.dropped_layers is not None:
        depths = ", ".join(f"{stack} {before} -> {after}" for stack, (before, after) in outcome.depths.items())
        print(f"removed\tlayers {outcome.dropped_layers} ({depths} layers)")
    if outcome.recorded:
        print(f"recorded\tthe checkpoint's masked heads ({outcome.recorded}) are removed too")
    if outcome.recorded_neurons:
        print(f"recorded\tthe checkpoint's masked FFN neurons ({outcome.recorded_neurons}) are removed too")
    if outcome.heads_pruned or args.head_mask is not None or args.tuning is not None:
        print(f"removed\t{outcome.heads_pruned} of {outcome.heads_total} heads: {outcome.spec}")
    if outcome.ffn_spec is not None:
        print(f"removed\t{outcome.neurons_pruned} of {outcome.neurons_total} FFN neurons: {outcome.ffn_spec}")
    for line in outcome.report:
        print(line)
    if args.report:
        write_text("\n".join(outcome.report) + "\n", args.report)
    print(f"wrote\t{args.out}")
    return 0


def add_parser(commands) -> None:
    shrink = commands.add_parser(
        "shrink",
        help="remove heads (and FFN neurons) for real: write a smaller checkpoint (paper section 4.3)",
        description="Remove the heads --head-mask masks from CKPT: their rows of the query/key/value "
        "projections and columns of the output projection (a layer left with no head keeps "
        "only its output bias); and the FFN neurons --ffn-mask masks: their rows of fc1 and columns of "
        "fc2 (an FFN left with none outputs fc2's bias); and the whole layers --drop-layers names (attention, FFN, "
        "layer norms and all: the model gets shallower), removed first, so that --head-mask and --ffn-mask "
        "number the layers that stay. At least one of --head-mask, --ffn-mask, --drop-layers, --tuning. "
        "The pruned checkpoint records what was removed; load it with "
        "the plugin's task (fairseq-headprune generate, or fairseq-generate --user-dir "
        "fairseq_headprune --task fairseq-headprune). Optimizer state is dropped: fine-tune "
        "with --reset-optimizer.",
    )
    shrink.add_argument("--path", required=True, metavar="CKPT", help="checkpoint to prune")
    shrink.add_argument("--head-mask", metavar="SPEC", help="heads to remove (spec or mask file)")
    shrink.add_argument("--ffn-mask", metavar="SPEC",
                        help="FFN neurons to remove (spec or mask file): their rows of fc1 and columns of fc2")
    shrink.add_argument(
        "--tuning", metavar="TUNING.json",
        help="a tuned mask (search --tune-masks): fold its scales and output-bias corrections into out_proj and "
        "fc2 and remove its heads and FFN neurons, so the smaller checkpoint computes the tuned masked model",
    )
    shrink.add_argument(
        "--drop-layers", metavar="SPEC",
        help="whole layers to remove, 1-based: 'decoder:2-3', 'encoder:1 decoder:3'; each stack keeps at least one "
        "(compress --drop-decoder-layers N chooses them by the validation loss)",
    )
    shrink.add_argument("--out", required=True, metavar="PRUNED.pt", help="pruned checkpoint to write")
    shrink.add_argument("--report", metavar="FILE.tsv", help="also write the parameter report here")
    shrink.set_defaults(handler=command_shrink)
