#!/usr/bin/env python3
"""Write docs/cli.md, the command-line reference, from the argparse parsers of ``fairseq-headprune``.

Every sub-command's help is formatted by argparse itself, at a fixed width
(WIDTH columns, whatever the terminal), so the page changes only when an
option does. ``train``, ``generate``, ``validate``, ``interactive`` and
``eval-lm`` hand their arguments to fairseq's own command: for them the page
lists the options the plugin's head-masking tasks add to fairseq's.

    python scripts/dev/make_cli_reference.py            # rewrite docs/cli.md
    python scripts/dev/make_cli_reference.py --check    # exit 1 if docs/cli.md is stale

tests/test_cli_reference.py fails when docs/cli.md differs from what this
script generates.
"""

import argparse
import dataclasses
import functools
import sys
from pathlib import Path
from typing import List, Tuple

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "docs" / "cli.md"
WIDTH = 100
REGENERATE = "python scripts/dev/make_cli_reference.py"


def _fixed_width(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)
    return parser


def _sub_commands(parser: argparse.ArgumentParser):
    """(name, sub-parser, one-line help) in the order ``fairseq-headprune --help`` lists them."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]


def _task_options() -> List[Tuple[List[str], str]]:
    """The options each head-masking task adds to the fairseq task it extends, formatted by argparse."""
    from fairseq.tasks.language_modeling import LanguageModelingConfig
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig
    from fairseq.tasks.translation import TranslationConfig

    from fairseq_headprune.registry import register_components

    register_components()
    from fairseq_headprune.tasks.fairseq_headprune import TASK_NAME, HeadPruneConfig
    from fairseq_headprune.tasks.headprune_language_modeling import TASK_NAME as LM_TASK
    from fairseq_headprune.tasks.headprune_language_modeling import HeadPruneLanguageModelingConfig
    from fairseq_headprune.tasks.headprune_sentence_prediction import TASK_NAME as SENTENCE_TASK
    from fairseq_headprune.tasks.headprune_sentence_prediction import HeadPruneSentencePredictionConfig

    tasks = [
        (TASK_NAME, "translation", HeadPruneConfig, TranslationConfig),
        (SENTENCE_TASK, "sentence_prediction", HeadPruneSentencePredictionConfig, SentencePredictionConfig),
        (LM_TASK, "language_modeling", HeadPruneLanguageModelingConfig, LanguageModelingConfig),
    ]
    bodies = {}  # the options' help text -> the tasks that add exactly these options
    for task, base_name, config, base in tasks:
        inherited = {f.name for f in dataclasses.fields(base)}
        parser = _fixed_width(argparse.ArgumentParser(prog=task, add_help=False))
        group = parser.add_argument_group("OPTIONS")
        for field in dataclasses.fields(config):
            if field.name not in inherited:
                group.add_argument("--" + field.name.replace("_", "-"), metavar=field.name.upper(),
                                   help=field.metadata.get("help"))
        body = parser.format_help().split("OPTIONS:\n", 1)[1].rstrip()
        bodies.setdefault(body, []).append(f"`{task}` (to `{base_name}`)")
    return [(names, body) for body, names in bodies.items()]


def _safeguards(parser, commands) -> List[str]:
    """What every command checks before it works, with the table of options refused as idle."""
    from fairseq_headprune.cli import command_flags
    from fairseq_headprune.commands.option_rules import rules_of
    from fairseq_headprune.commands.run_identity import PARTS, RUN_RECORD

    lines = [
        "## Before any work: outputs, run records, idle options",
        "",
        "Every study command checks, before it loads a model, and ends in one line with exit status 2 when a "
        "check fails (nothing written):",
        "",
        "- **outputs**: an output directory that is a file, lies under a file or cannot be written; a file "
        "output whose directory is missing or read-only, that exists (replaced only with `--overwrite`), or "
        "that the command also reads.",
        f"- **one run per directory**: a command that writes a directory records its settings there "
        f"(`{RUN_RECORD}`) and refuses a directory that holds another run's results, naming the first setting "
        "that differs; fairseq's options count as settings in any order. "
        + ", ".join(f"`{c}`" for c in PARTS) + " directories gather several parts (a curve per scope or "
        "structure, the budgets; a study per mode), each with settings of its own beside the ones all share. "
        "A second process into a directory in use ends at once, naming the first (the shares of "
        "`prune --config-shard` write one directory together).",
        "- **a clean stop**: Ctrl-C or SIGTERM ends a run with `stopped; run the same command again to "
        "resume` (exit 130 or 143); the same command continues it.",
        "- **idle options**: an option that does nothing in the combination given is refused:",
        "",
        "| command | option given | refused because |",
        "| --- | --- | --- |",
    ]
    for name, sub, _ in commands:
        flags = command_flags(name, parser)
        for rule, taken in rules_of(name, sub):
            options = ", ".join(f"`{flags.get(s, s)}`" for s in taken)
            lines.append(f"| {name} | {options} | {rule.why} |")
    return lines + [""]


def render() -> str:
    from fairseq_headprune.cli import build_parser
    from fairseq_headprune.commands.fairseq_commands import FAIRSEQ_COMMANDS
    from fairseq_headprune.version import __version__

    parser = _fixed_width(build_parser())
    commands = _sub_commands(parser)
    lines = [
        "# Command-line reference",
        "",
        f"<!-- generated by `{REGENERATE}` from the argparse parsers (fairseq-headprune {__version__}, "
        f"Python {sys.version_info.major}.{sys.version_info.minor}, {WIDTH} columns); do not edit by hand -->",
        "",
        "Every sub-command of `fairseq-headprune`, with its usage and options as `--help` prints them. "
        "Options a study command does not know go to fairseq's parser (generation, validation or "
        "eval-lm options such as `--beam`, `--batch-size`, `--max-tokens`).",
        "",
    ]
    lines += [f"- [`{name}`](#fairseq-headprune-{name}): {' '.join(help_text.split())}"
              for name, _, help_text in commands]
    lines += ["", "## fairseq-headprune", "", "```", parser.format_help().rstrip(), "```", ""]
    wrappers = []
    for name, sub, help_text in commands:
        if name in FAIRSEQ_COMMANDS:
            wrappers.append((name, help_text))
            continue
        lines += [f"## fairseq-headprune {name}", "", "```", _fixed_width(sub).format_help().rstrip(), "```", ""]
    lines += [
        "## fairseq's own commands",
        "",
        "`fairseq-headprune " + "|".join(name for name, _ in wrappers) + " ARGS` runs `fairseq-COMMAND ARGS` with "
        "`--user-dir` and `--task` filled in: the head-masking task that extends the task the `--path` "
        "checkpoint was trained with, otherwise `fairseq-headprune` (translation). Every option is "
        "fairseq's; `fairseq-headprune COMMAND --help` prints fairseq's help with the task's options in it.",
        "",
    ]
    lines += [f"### fairseq-headprune {name}\n\n{' '.join(help_text.split())}\n" for name, help_text in wrappers]
    lines += ["### The head-masking tasks' options", ""]
    for tasks, body in _task_options():
        lines += [f"Added by the task{'s' if len(tasks) > 1 else ''} {', '.join(tasks)}:", "", "```", body, "```", ""]
    lines += _safeguards(parser, commands)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md is not what would be written")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="where to write (default: docs/cli.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote\t{args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
