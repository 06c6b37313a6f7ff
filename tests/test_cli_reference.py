"""docs/cli.md is what scripts/dev/make_cli_reference.py generates from today's parsers.

The page is regenerated in memory and compared with the file: an option
added, renamed or re-worded without regenerating the page fails here.
argparse formats help slightly differently from one Python version to the
next, so the comparison is made on the Python version that wrote the page
(recorded in its header), and skipped on another.
"""

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "dev" / "make_cli_reference.py"
PAGE = REPO / "docs" / "cli.md"


def _generator():
    spec = importlib.util.spec_from_file_location("make_cli_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_up_to_date():
    generator = _generator()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    recorded = re.search(r"Python (\d+\.\d+)", current)
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if recorded and recorded.group(1) != running:
        pytest.skip(f"docs/cli.md was generated with Python {recorded.group(1)}; "
                    f"argparse of {running} formats differently")
    fresh = generator.render()
    if fresh != current:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), fresh.splitlines(True),
                                                 "docs/cli.md", "generated"))[:60])
        pytest.fail(f"docs/cli.md is stale: regenerate it with `{generator.REGENERATE}`\n{diff}", pytrace=False)


def test_the_reference_lists_every_sub_command():
    from fairseq_headprune.cli import build_parser

    generator = _generator()
    names = [name for name, _, _ in generator._sub_commands(build_parser())]
    page = PAGE.read_text(encoding="utf-8")
    for name in names:
        assert re.search(rf"^#+ fairseq-headprune {re.escape(name)}$", page, re.MULTILINE), name
    assert "--head-mask HEAD_MASK" in page  # the tasks' options, for fairseq's own commands


def test_the_reference_does_not_depend_on_the_terminal(monkeypatch):
    generator = _generator()
    monkeypatch.setenv("COLUMNS", "40")
    narrow = generator.render()
    monkeypatch.setenv("COLUMNS", "250")
    assert generator.render() == narrow
