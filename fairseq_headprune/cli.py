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

    for command in FAIRSEQ_COMMANDS:
        commands.add_parser(
            command,
            add_help=False,
            help=f"fairseq-{command} with --user-dir and --task fairseq-headprune set "
            f"(all fairseq-{command} options, plus --head-mask)",
        )
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FAIRSEQ_COMMANDS:
        return run_fairseq_command(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    from .head_mask import HeadMaskError

    try:
        return args.handler(args)
    except (CommandError, HeadMaskError) as error:
        print(f"fairseq-headprune {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
