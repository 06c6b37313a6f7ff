"""``fairseq-headprune importance``: I_h = E_x |dL(x)/dxi_h| (Michel et al. section 4.1)."""

import argparse

from fairseq_headprune.commands.common import (
    add_device_arguments,
    add_importance_arguments,
    fairseq_language_args,
    importance_settings,
)
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.importance.scores import summarize
from fairseq_headprune.study.masks.head_mask import parse_head_mask


def command_importance(args: argparse.Namespace) -> int:
    settings = importance_settings(args)  # before the engine (and fairseq) is imported: bad input fails fast
    from fairseq_headprune.engine.checkpoints.info import loaded_head_layout
    from fairseq_headprune.engine.pipelines.importance import importance_prefix, run_importance

    head_mask = None
    if args.head_mask is not None:  # a mask of the model the checkpoint loads as
        try:
            head_mask = parse_head_mask(args.head_mask, loaded_head_layout(args.path))
        except HeadMaskError as error:
            raise HeadMaskError(f"--head-mask: {error}") from error
    result = run_importance(
        args.data, args.path, settings, args.out_dir, head_mask=head_mask, loss_ablation=args.loss_ablation,
        fairseq_args=fairseq_language_args(args), cpu=args.cpu, progress=not args.no_progress,
        head_mask_spec=args.head_mask,
    )
    if result is None:  # a rank other than 0 of a sharded estimate
        return 0
    sentences = int(result.settings["sentences"])
    loss = "plain cross-entropy" if settings.loss == "nll" else f"label-smoothed ({settings.label_smoothing:g})"
    what = "Fisher scores E_x (dL/dxi_h)^2" if settings.method == "fisher" else "importance E_x |dL/dxi_h|"
    print(
        f"{what} estimated on {sentences} sentences ({', '.join(settings.subsets)}), {settings.granularity} level, "
        f"{loss} loss; heads as layer:head"
    )
    for line in summarize(result):
        print(line)
    prefix = importance_prefix(args.out_dir)
    print(f"wrote\t{prefix}.json {prefix}.tsv {prefix}.png")
    return 0


def add_parser(commands) -> None:
    importance = commands.add_parser(
        "importance",
        help="head importance I_h = E_x |dL(x)/dxi_h| (Michel et al. section 4.1)",
        description="Run forward and backward passes of CKPT over the SPLITs of DATA "
        "(no parameter update) with the headprune_importance criterion and write "
        "importance.json, importance.tsv (raw and per-layer l2-normalised scores) and "
        "importance.png (heat maps per attention type) to --out-dir.",
    )
    importance.add_argument("data", metavar="DATA", help="fairseq-preprocess output directory")
    importance.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    importance.add_argument("--out-dir", required=True, metavar="DIR", help="output directory")
    add_importance_arguments(importance, batch_size=True, aliases=True)
    importance.add_argument(
        "--head-mask", metavar="SPEC", help="score the heads of the model with SPEC already masked"
    )
    importance.add_argument(
        "--loss-ablation", action="store_true",
        help="also measure the loss increase when each head alone is masked and report "
        "its Spearman correlation with importance",
    )
    importance.add_argument("-s", "--source-lang", help="source language (default: from DATA)")
    importance.add_argument("-t", "--target-lang", help="target language (default: from DATA)")
    add_device_arguments(importance)
    importance.set_defaults(handler=command_importance)
