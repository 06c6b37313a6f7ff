"""The ``fairseq-headprune`` command: builds the parser from ``commands/`` and dispatches.

Study sub-commands turn their options into settings and call the engine;
``train``/``generate``/``validate``/``interactive`` run fairseq's own
commands with this plugin and its task already selected.
"""

import argparse
import os
import sys
from typing import List, Optional

from .commands import (
    ablate,
    corpus,
    dynamics,
    fairseq_commands,
    importance,
    mask,
    prune,
    report,
    search,
    shrink,
    significance,
)
from .commands.fairseq_commands import FAIRSEQ_COMMANDS, run_fairseq_command

# in the order --help lists them
COMMAND_MODULES = (corpus, mask, importance, shrink, ablate, significance, prune, search, dynamics, report,
                   fairseq_commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Mask, score and prune the attention heads of fairseq Transformers "
        "(Michel et al. 2019, 'Are Sixteen Heads Really Better than One?').",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for module in COMMAND_MODULES:
        add = getattr(module, "add_parser", None) or module.add_parsers
        add(commands)
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
    # fairseq's fused path hands torch a boolean padding mask beside a float causal mask (LMs)
    warnings.filterwarnings("ignore", message=r"Support for mismatched key_padding_mask and attn_mask")
    for name in ("fairseq", "fairseq_headprune", "hydra", "matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in FAIRSEQ_COMMANDS:
        from .errors import HeadPruneError

        try:
            return run_fairseq_command(argv[0], argv[1:])
        except HeadPruneError as error:  # the --path checkpoint the task is chosen from
            print(f"fairseq-headprune {argv[0]}: error: {error}", file=sys.stderr)
            return 2
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_fairseq_args", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.fairseq_args = unknown
    _quiet_libraries()
    from .engine.ranks import SHARDED_COMMANDS, join_ranks, launched_world_size, leave_ranks
    from .errors import HeadPruneError

    if launched_world_size() > 1 and args.command not in SHARDED_COMMANDS:
        print(f"fairseq-headprune {args.command}: error: runs in one process; under torchrun only "
              f"{', '.join(SHARDED_COMMANDS)} are sharded", file=sys.stderr)
        return 2
    ranks = join_ranks()
    if not ranks.is_main:  # rank 0 speaks for all
        sys.stdout = open(os.devnull, "w")
        if hasattr(args, "no_progress"):
            args.no_progress = True
    try:
        return args.handler(args)
    except HeadPruneError as error:
        if ranks.is_main:
            print(f"fairseq-headprune {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        leave_ranks()


if __name__ == "__main__":
    sys.exit(main())
