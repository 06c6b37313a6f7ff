"""``fairseq-headprune report``: one Markdown report of a study directory."""

import argparse

from fairseq_headprune.study.output.report import DEFAULT_TITLE, write_report


def command_report(args: argparse.Namespace) -> int:
    path = write_report(args.directory, args.title)
    print(f"wrote\t{path}")
    return 0


def add_parser(commands) -> None:
    report = commands.add_parser(
        "report",
        help="one Markdown report of a study directory (tables, figures, commands)",
        description="Write DIR/report.md from the results in DIR (generate/ or eval-lm/, importance/, ablation/, "
        "pruning/, shrink/, dynamics/, as scripts/demos/run_demo.sh lays them out): every table and figure, "
        "each with a sentence on how to read it and the command that made it (from DIR/commands/).",
    )
    report.add_argument("directory", metavar="DIR", help="study directory (e.g. results/demo)")
    report.add_argument("--title", default=DEFAULT_TITLE, help=f"report title (default: {DEFAULT_TITLE!r})")
    report.set_defaults(handler=command_report)
