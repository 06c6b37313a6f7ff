"""The ``fairseq-headprune`` command: builds the parser from ``commands/`` and dispatches.

Study sub-commands turn their options into settings and call the engine;
``train``/``generate``/``validate``/``interactive`` run fairseq's own
commands with this plugin and its task already selected.
"""

import argparse
import contextlib
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.commands import (
    ablate,
    compensation,
    compress,
    corpus,
    dynamics,
    export,
    fairseq_commands,
    importance,
    mask,
    prune,
    report,
    search,
    shrink,
    significance,
)
from fairseq_headprune.commands.fairseq_commands import FAIRSEQ_COMMANDS, FAIRSEQ_FLAGS, run_fairseq_command
from fairseq_headprune.commands.option_rules import check_option_rules
from fairseq_headprune.commands.outputs import add_overwrite_option, check_output_paths, output_directory_locked
from fairseq_headprune.commands.run_identity import run_recorded
from fairseq_headprune.commands.stop_signals import STOPS, Terminated, stops_raised
from fairseq_headprune.engine.runtime.console import quiet_libraries  # noqa: F401  (the scripts' and commands' entry)
from fairseq_headprune.engine.runtime.ranks import SHARDED_COMMANDS, join_ranks, launched_world_size, leave_ranks
from fairseq_headprune.errors import DEBUG_VARIABLE, HeadPruneError, debugging
from fairseq_headprune.version import __version__

# in the order --help lists them
COMMAND_MODULES = (corpus, mask, importance, shrink, export, ablate, significance, prune, search, compress, dynamics,
                   compensation, report, fairseq_commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-headprune",
        description="Mask, score and prune the attention heads of fairseq Transformers "
        "(Michel et al. 2019, 'Are Sixteen Heads Really Better than One?').",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an error instead of one line (or set {DEBUG_VARIABLE}=1)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for module in COMMAND_MODULES:
        add = getattr(module, "add_parser", None) or module.add_parsers
        add(commands)
    for subparser in commands.choices.values():
        add_overwrite_option(subparser)
    return parser


def command_flags(command: str, parser: Optional[argparse.ArgumentParser] = None) -> Dict[str, str]:
    """setting -> the flag a user of ``command`` gives it by, to word the command's errors (``HeadPruneError.worded``).

    Every option of the command names the setting it stores (``--finetune-updates`` -> finetune_updates, the
    first spelling of an option with aliases); the command adds those it takes by another flag with
    ``set_defaults(setting_flags=...)`` (compress: budget by ``--target``; None: no flag). A command that passes
    fairseq's options on takes fairseq's and the plugin task's settings by their flags (``FAIRSEQ_OPTION_FLAGS``).
    A setting the command fills in itself (compress's head mask) has no flag: its errors keep their plain words.
    """
    if command in FAIRSEQ_COMMANDS:
        return dict(FAIRSEQ_FLAGS)
    subparser = _subparser(parser or build_parser(), command)
    options: Dict[str, str] = {}
    for action in subparser._actions:
        spelled = [option for option in action.option_strings if option.startswith("--")]
        if spelled and action.dest != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            options.setdefault(action.dest, spelled[0])
    # a command that passes fairseq's options on takes these settings by fairseq's own flags, unless by its own
    passed_on = FAIRSEQ_OPTION_FLAGS if subparser.get_default("accepts_fairseq_args") else {}
    return {**passed_on, **options, **(subparser.get_default("setting_flags") or {})}


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


# settings below the commands that are fairseq's own options, or the plugin task's, given through (``--beam 5``)
FAIRSEQ_OPTION_FLAGS = {"beam": "--beam", "max_tokens": "--max-tokens", "batch_size": "--batch-size", **FAIRSEQ_FLAGS}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--debug"]:  # before the command: fairseq's commands are handed over unparsed
        os.environ[DEBUG_VARIABLE] = "1"
        argv = argv[1:]
    if argv and argv[0] in FAIRSEQ_COMMANDS:
        try:
            return run_fairseq_command(argv[0], argv[1:])
        except HeadPruneError as error:  # the --path checkpoint the task is chosen from
            return _report(argv[0], error, FAIRSEQ_FLAGS)
    try:
        parser = build_parser()  # its --export choices name the export engines (HEADPRUNE_EXPORT_ENGINES may fail)
    except HeadPruneError as error:
        return _report(argv[0] if argv else "", error, {})
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_fairseq_args", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.fairseq_args = unknown
    quiet_libraries()

    if launched_world_size() > 1 and args.command not in SHARDED_COMMANDS:
        print(f"fairseq-headprune {args.command}: error: runs in one process; under torchrun only "
              f"{', '.join(SHARDED_COMMANDS)} are sharded", file=sys.stderr)
        return 2
    ranks = join_ranks()
    if not ranks.is_main:  # rank 0 speaks for all
        sys.stdout = open(os.devnull, "w")
        if hasattr(args, "no_progress"):
            args.no_progress = True
    flags = command_flags(args.command, parser)
    try:
        with stops_raised():
            check_option_rules(args.command, _subparser(parser, args.command), argv[1:], args, flags)
            check_output_paths(args, flags)
            with contextlib.ExitStack() as run:
                if ranks.is_main:
                    run.enter_context(output_directory_locked(args, flags, args.command))
                    run.enter_context(run_recorded(args, flags, args.command))
                return args.handler(args)
    except HeadPruneError as error:
        return _report(args.command, error, flags, speak=ranks.is_main)
    except STOPS as stop:
        if debugging():
            raise
        if ranks.is_main:
            print(f"fairseq-headprune {args.command}: stopped; run the same command again to resume", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    finally:
        leave_ranks()


def _report(command: str, error: HeadPruneError, flags: Dict[str, str], speak: bool = True) -> int:
    """The one place an error becomes one line and exit status 2 (or, debugging, its traceback), worded with the
    command's flags (``command_flags``)."""
    if debugging():
        raise error
    if speak:
        print(f"fairseq-headprune {command}: error: {error.worded(flags)}", file=sys.stderr)
    return 2


def run_in_own_process(arguments: Sequence[object], caller: str) -> str:
    """Run ``fairseq-headprune ARGUMENTS`` in a process of its own and return what it printed.

    For the benchmark scripts, which keep every engine and model out of their own process; the command's
    one-line error ends ``caller`` with that line and exit status 1.
    """
    command = [os.path.join(os.path.dirname(sys.executable), "fairseq-headprune"), *map(str, arguments)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{caller}: {arguments[0]} failed: {result.stderr.strip()}")
    return result.stdout


if __name__ == "__main__":
    sys.exit(main())
