"""The ``fairseq-headprune`` command.

Study sub-commands are plain functions over fairseq's own code; the
``train``/``generate``/``validate``/``interactive`` sub-commands run fairseq's
own commands with this plugin and its task already selected.
"""

import argparse
import os
import sys
from typing import List, Optional

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# sub-command -> fairseq_cli module whose cli_main runs it
FAIRSEQ_COMMANDS = {
    "train": "fairseq_cli.train",
    "generate": "fairseq_cli.generate",
    "validate": "fairseq_cli.validate",
    "interactive": "fairseq_cli.interactive",
}


class CommandError(Exception):
    """Bad input to a sub-command: reported as one line, exit status 2."""


def run_fairseq_command(command: str, args: List[str]) -> int:
    """Run a fairseq command with ``--user-dir`` and ``--task`` filled in."""
    import importlib

    from .tasks.fairseq_headprune import TASK_NAME

    argv = list(args)
    if not any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        argv += ["--user-dir", PACKAGE_DIR]
    if not any(a == "--task" or a.startswith("--task=") for a in argv):
        argv += ["--task", TASK_NAME]
    module = importlib.import_module(FAIRSEQ_COMMANDS[command])
    sys.argv = [f"fairseq-{command}"] + argv
    module.cli_main()
    return 0


def command_corpus(args) -> int:
    from .demo_corpus import write_demo_corpus

    if args.scale <= 0:
        raise CommandError(f"--scale must be positive, got {args.scale}")
    counts = write_demo_corpus(args.out_dir, seed=args.seed, scale=args.scale)
    for split, count in counts.items():
        print(f"{split}\t{count} sentence pairs\t{os.path.join(args.out_dir, split)}.{{en,fr}}")
    return 0


def command_mask(args) -> int:
    from .checkpoint_info import checkpoint_head_layout
    from .head_mask import count_masked, head_mask_to_spec, masked_heads, parse_head_mask, write_mask_file

    layout = checkpoint_head_layout(args.path)
    head_mask = parse_head_mask(args.spec, layout)
    total = sum(layers * heads for layers, heads in layout.values())
    print("layout\t" + " ".join(f"{t}={l}x{h}" for t, (l, h) in layout.items()))
    print(f"masked\t{count_masked(head_mask)} of {total} heads")
    print(f"spec\t{head_mask_to_spec(head_mask)}")
    if args.list:
        for attention_type, layer, head in masked_heads(head_mask):
            print(f"{attention_type}\t{layer}\t{head}")
    if args.out:
        if not args.out.lower().endswith((".json", ".tsv")):
            raise CommandError(f"--out must end in .json or .tsv: {args.out}")
        write_mask_file(head_mask, args.out)
        print(f"wrote\t{args.out}")
    return 0


def command_importance(args) -> int:
    import torch

    from .evaluation import (
        ImportanceEstimator,
        load_task_and_model,
        parse_mask_for_model,
        single_head_loss_increase,
    )
    from .head_mask import combine_masks
    from .importance import summarize, write_importance_json, write_importance_tsv
    from .masked_multihead_attention import current_head_mask, head_layout, set_head_mask
    from .plots import plot_importance

    for name in ("max_tokens", "max_sentences", "limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise CommandError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0.0 <= args.label_smoothing < 1.0:
        raise CommandError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    fairseq_args = []
    if args.source_lang:
        fairseq_args += ["--source-lang", args.source_lang]
    if args.target_lang:
        fairseq_args += ["--target-lang", args.target_lang]
    _, task, model = load_task_and_model(args.data, args.path, fairseq_args, cpu=args.cpu)
    layout = head_layout(model)
    base_mask = combine_masks(current_head_mask(model), parse_mask_for_model(args.head_mask, layout))
    set_head_mask(model, base_mask)
    estimator = ImportanceEstimator(
        task, model, args.subset, limit=args.limit, max_tokens=args.max_tokens,
        max_sentences=args.max_sentences, loss=args.loss, granularity=args.granularity,
        label_smoothing=args.label_smoothing,
    )
    progress = not args.no_progress
    result = estimator.estimate(None, progress=progress)
    if args.loss_ablation:
        result.loss_increase, base_loss = single_head_loss_increase(
            model, estimator.criterion, estimator.samples, base_mask, layout, progress=progress
        )
        result.settings["loss_ablation_base_loss_per_token"] = base_loss
    result.settings.update(
        {
            "checkpoint": os.path.abspath(args.path),
            "data": os.path.abspath(args.data),
            "head_mask": args.head_mask,
            "torch": torch.__version__,
        }
    )
    prefix = os.path.join(args.out_dir, "importance")
    write_importance_json(result, prefix + ".json")
    write_importance_tsv(result, prefix + ".tsv")
    plot_importance(result, prefix + ".png")
    sentences = int(result.settings["sentences"])
    print(
        f"estimated on {sentences} sentences ({', '.join(args.subset)}), {args.granularity} level; "
        "heads as layer:head"
    )
    for line in summarize(result):
        print(line)
    print(f"wrote\t{prefix}.json {prefix}.tsv {prefix}.png")
    return 0


def command_shrink(args) -> int:
    import torch

    from .atomic_files import atomic_path
    from .checkpoint_info import (
        HEAD_MASK_KEY,
        config_value,
        load_checkpoint_state,
        model_config_object,
        record_config_value,
        state_head_layout,
    )
    from .head_mask import combine_masks, count_masked, head_mask_to_spec, parse_head_mask
    from .shrink import (
        PRUNED_HEADS_KEY,
        parameter_report,
        pruned_heads_of,
        shrink_state_dict,
        state_parameter_counts,
    )

    if os.path.exists(args.out) and os.path.samefile(args.out, args.path) or (
        os.path.abspath(args.out) == os.path.abspath(args.path)
    ):
        raise CommandError(f"--out {args.out} is the input checkpoint; write the pruned model elsewhere")
    state = load_checkpoint_state(args.path)
    config = model_config_object(state)
    if config is None:
        raise CommandError(f"{args.path} has no model config (neither cfg nor args)")
    previous = pruned_heads_of(config)
    if previous:
        raise CommandError(
            f"{args.path} already has heads removed ({previous}); shrink the original checkpoint "
            "with every head to remove"
        )
    layout = state_head_layout(state)
    head_mask = parse_head_mask(args.head_mask, layout)
    recorded = config_value(config, HEAD_MASK_KEY)
    if recorded:
        # a model fine-tuned with heads masked: those heads go too, and the record with them
        head_mask = combine_masks(parse_head_mask(recorded, layout), head_mask)
    if count_masked(head_mask) == 0:
        raise CommandError(f"--head-mask {args.head_mask!r} removes no head")
    before = state_parameter_counts(state["model"], layout)
    shrink_state_dict(state["model"], head_mask)
    after = state_parameter_counts(state["model"], layout)
    spec = head_mask_to_spec(head_mask)
    record_config_value(config, PRUNED_HEADS_KEY, spec)
    if recorded:
        record_config_value(config, HEAD_MASK_KEY, None)
    # optimizer moments have the old shapes: fine-tune with --reset-optimizer
    state["last_optimizer_state"] = None
    with atomic_path(args.out) as temporary:
        torch.save(state, temporary)
    total = sum(layers * heads for layers, heads in layout.values())
    if recorded:
        print(f"recorded\tthe checkpoint's masked heads ({recorded}) are removed too")
    print(f"removed\t{count_masked(head_mask)} of {total} heads: {spec}")
    report = parameter_report(before, after)
    for line in report:
        print(line)
    if args.report:
        with open(args.report, "w") as stream:
            stream.write("\n".join(report) + "\n")
    print(f"wrote\t{args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Mask, score and prune the attention heads of fairseq Transformers "
        "(Michel et al. 2019, 'Are Sixteen Heads Really Better than One?').",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    corpus = commands.add_parser(
        "corpus",
        help="write the built-in synthetic En-Fr demo corpus (raw text)",
        description="Write train/valid/test and a domain-shifted test-shifted split "
        "as SPLIT.en / SPLIT.fr; the same seed gives the same corpus.",
    )
    corpus.add_argument("out_dir", help="directory for the text files")
    corpus.add_argument("--seed", type=int, default=1, help="corpus seed (default 1)")
    corpus.add_argument(
        "--scale", type=float, default=1.0,
        help="multiply every split's size (default 1.0: 20000/500/1000/1000 pairs)",
    )
    corpus.set_defaults(handler=command_corpus)

    mask = commands.add_parser(
        "mask",
        help="check a head-mask spec against a checkpoint; print or save it",
        description="Parse SPEC for the model in CKPT, print its canonical form and "
        "the number of masked heads, and optionally write it as a .json/.tsv mask file.",
    )
    mask.add_argument("spec", metavar="SPEC", help='head-mask spec, e.g. "E:1:6 A:2:1,3"')
    mask.add_argument("--path", required=True, metavar="CKPT", help="fairseq checkpoint")
    mask.add_argument("--out", metavar="FILE", help="write the mask to FILE (.json or .tsv)")
    mask.add_argument("--list", action="store_true", help="list every masked head")
    mask.set_defaults(handler=command_mask)

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
        "--granularity", choices=["sentence", "token", "batch"], default="sentence",
        help="|dL/dxi_h| per sentence (the paper, default), per target token (the "
        "authors' code) or per batch",
    )
    importance.add_argument(
        "--loss", choices=["label_smoothed", "nll"], default="label_smoothed",
        help="loss to differentiate (default: label-smoothed cross-entropy)",
    )
    importance.add_argument(
        "--label-smoothing", type=float, default=0.1, help="label smoothing epsilon (default 0.1)"
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
    importance.add_argument("--cpu", action="store_true", help="run on the CPU even if a GPU is present")
    importance.add_argument("--no-progress", action="store_true", help="no progress bar")
    importance.set_defaults(handler=command_importance)

    shrink = commands.add_parser(
        "shrink",
        help="remove heads for real: write a smaller checkpoint (paper section 4.3)",
        description="Remove the heads SPEC masks from CKPT: their rows of the query/key/value "
        "projections and columns of the output projection (a layer left with no head keeps "
        "only its output bias). The pruned checkpoint records the removed heads; load it with "
        "the plugin's task (fairseq-headprune generate, or fairseq-generate --user-dir "
        "fairseq_headprune --task fairseq-headprune). Optimizer state is dropped: fine-tune "
        "with --reset-optimizer.",
    )
    shrink.add_argument("--path", required=True, metavar="CKPT", help="checkpoint to prune")
    shrink.add_argument("--head-mask", required=True, metavar="SPEC", help="heads to remove (spec or mask file)")
    shrink.add_argument("--out", required=True, metavar="PRUNED.pt", help="pruned checkpoint to write")
    shrink.add_argument("--report", metavar="FILE.tsv", help="also write the parameter report here")
    shrink.set_defaults(handler=command_shrink)

    from .ablate_command import add_parsers as add_ablation_parsers

    add_ablation_parsers(commands)
    from .prune_command import add_parser as add_prune_parser

    add_prune_parser(commands)
    from .dynamics_command import add_parser as add_dynamics_parser

    add_dynamics_parser(commands)
    from .report import add_parser as add_report_parser

    add_report_parser(commands)

    for command in FAIRSEQ_COMMANDS:
        commands.add_parser(
            command,
            add_help=False,
            help=f"fairseq-{command} with --user-dir and --task fairseq-headprune set "
            f"(all fairseq-{command} options, plus --head-mask)",
        )
    return parser


def _quiet_libraries() -> None:
    """Keep the study commands' console to their own output and real problems."""
    import logging
    import warnings

    # fairseq's config conversion goes through hydra, which warns about its own API
    # and may turn the root logger to DEBUG
    warnings.filterwarnings("ignore", module=r"hydra(\.|$)")
    warnings.filterwarnings("ignore", message=r"\s*'config' is validated against ConfigStore")
    warnings.filterwarnings("ignore", message=r"\s*The strict flag in the compose API")
    # fairseq's batch iterator asks for pinned memory on machines without a GPU too
    warnings.filterwarnings("ignore", message=r".*'pin_memory' argument is set as true")
    for name in ("fairseq", "fairseq_headprune", "hydra", "matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FAIRSEQ_COMMANDS:
        return run_fairseq_command(argv[0], argv[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_fairseq_args", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.fairseq_args = unknown
    _quiet_libraries()
    from .evaluation import StudyError
    from .head_mask import HeadMaskError

    try:
        return args.handler(args)
    except (CommandError, HeadMaskError, StudyError) as error:
        print(f"fairseq-headprune {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
