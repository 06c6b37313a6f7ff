"""``fairseq-headprune importance``: I_h = E_x |dL(x)/dxi_h| (Michel et al. section 4.1)."""

import argparse

from ..constants import (
    DEFAULT_GRANULARITY,
    DEFAULT_IMPORTANCE_LOSS,
    DEFAULT_IMPORTANCE_METHOD,
    DEFAULT_LABEL_SMOOTHING,
    GRANULARITIES,
    IMPORTANCE_LOSSES,
    IMPORTANCE_METHODS,
)
from ..study.settings import ImportanceSettings
from .common import add_device_arguments, fairseq_language_args


def settings_from(args: argparse.Namespace) -> ImportanceSettings:
    return ImportanceSettings(
        subsets=list(args.subset), limit=args.limit, max_tokens=args.max_tokens, max_sentences=args.max_sentences,
        granularity=args.granularity, loss=args.loss, label_smoothing=args.label_smoothing,
        method=args.importance_method,
    )


def command_importance(args: argparse.Namespace) -> int:
    from ..engine.importance_study import importance_prefix, run_importance
    from ..study.importance import summarize

    settings = settings_from(args)
    result = run_importance(
        args.data, args.path, settings, args.out_dir, head_mask=args.head_mask, loss_ablation=args.loss_ablation,
        fairseq_args=fairseq_language_args(args), cpu=args.cpu, progress=not args.no_progress,
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
    importance.add_argument(
        "--subset", nargs="+", default=["valid"], metavar="SPLIT",
        help="splits to estimate on (default: valid; the paper uses newstest2009-2012)",
    )
    importance.add_argument("--out-dir", default="importance", help="output directory (default: importance)")
    importance.add_argument(
        "--granularity", choices=GRANULARITIES, default=DEFAULT_GRANULARITY,
        help="|dL/dxi_h| per sentence (the paper, default), per target token (the "
        "authors' code) or per batch",
    )
    importance.add_argument(
        "--importance-method", choices=IMPORTANCE_METHODS, default=DEFAULT_IMPORTANCE_METHOD,
        help="gradient (default): I_h = E_x |dL(x)/dxi_h|, the paper's importance; fisher: F_h = E_x "
        "(dL(x)/dxi_h)^2, the mask's diagonal Fisher information (Kwon et al. 2022), from the same backward pass",
    )
    importance.add_argument(
        "--loss", choices=IMPORTANCE_LOSSES, default=DEFAULT_IMPORTANCE_LOSS,
        help="loss to differentiate (default: nll, plain cross-entropy as the authors' code; "
        "label_smoothed: label-smoothed cross-entropy with --label-smoothing)",
    )
    importance.add_argument(
        "--label-smoothing", type=float, default=DEFAULT_LABEL_SMOOTHING,
        help=f"label smoothing epsilon of --loss label_smoothed (default {DEFAULT_LABEL_SMOOTHING:g})",
    )
    importance.add_argument("--max-tokens", type=int, help="tokens per batch")
    importance.add_argument(
        "--max-sentences", "--batch-size", dest="max_sentences", type=int,
        help="sentences per batch (default 64 when --max-tokens is not given)",
    )
    importance.add_argument("--limit", type=int, help="use only the first N sentences of each split")
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
