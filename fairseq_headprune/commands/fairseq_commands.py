"""``fairseq-headprune train|generate|validate|interactive``: fairseq's own commands with the plugin.

``--user-dir`` and ``--task fairseq-headprune`` are filled in unless given;
every other option is fairseq's, ``--head-mask`` included.
"""

import importlib
import os
import sys
from typing import List

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sub-command -> fairseq_cli module whose cli_main runs it
FAIRSEQ_COMMANDS = {
    "train": "fairseq_cli.train",
    "generate": "fairseq_cli.generate",
    "validate": "fairseq_cli.validate",
    "interactive": "fairseq_cli.interactive",
}


def run_fairseq_command(command: str, args: List[str]) -> int:
    """Run a fairseq command with ``--user-dir`` and ``--task`` filled in."""
    from .. import register_components
    from ..tasks.fairseq_headprune import TASK_NAME

    register_components()
    argv = list(args)
    if not any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        argv += ["--user-dir", PACKAGE_DIR]
    if not any(a == "--task" or a.startswith("--task=") for a in argv):
        argv += ["--task", TASK_NAME]
    module = importlib.import_module(FAIRSEQ_COMMANDS[command])
    sys.argv = [f"fairseq-{command}"] + argv
    module.cli_main()
    return 0


def add_parsers(commands) -> None:
    """Listed in --help only: ``cli.main`` hands these commands to fairseq before parsing."""
    for command in FAIRSEQ_COMMANDS:
        commands.add_parser(
            command,
            add_help=False,
            help=f"fairseq-{command} with --user-dir and --task fairseq-headprune set "
            f"(all fairseq-{command} options, plus --head-mask)",
        )
