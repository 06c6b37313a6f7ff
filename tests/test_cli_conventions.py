"""One convention across the sub-commands, checked on their parsers.

Every help text renders; no option of a command that passes unknown options
on to fairseq shadows one of fairseq's (except those it forwards with the
same meaning); importance options are named ``--importance-*`` everywhere;
a directory is ``--out-dir``, a file ``--out``.
"""

import argparse

import pytest

from fairseq_headprune.cli import build_parser
from fairseq_headprune.commands.fairseq_commands import FAIRSEQ_COMMANDS

# options a study reads itself with the meaning fairseq gives them (the masks: the plugin's task's own options)
SAME_MEANING = {"-h", "--help", "--path", "--cpu", "--gen-subset", "--head-mask", "--ffn-mask"}


def sub_commands():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub for name, sub in action.choices.items() if name not in FAIRSEQ_COMMANDS}


def visible_options(parser):
    return {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


@pytest.fixture(scope="module")
def fairseq_generation_options():
    from fairseq import options

    from fairseq_headprune.registry import register_components

    register_components()
    parser = options.get_generation_parser()
    options.parse_args_and_arch(parser, ["DATA", "--task", "fairseq-headprune", "--path", "x.pt"], parse_known=True)
    return {o for a in parser._actions for o in a.option_strings}


@pytest.mark.parametrize("name", sorted(sub_commands()))
def test_every_help_renders(name):
    text = sub_commands()[name].format_help()
    assert "%%" not in text and "usage:" in text


@pytest.mark.parametrize("name", sorted(n for n, p in sub_commands().items() if p.get_default("accepts_fairseq_args")))
def test_no_option_shadows_fairseqs(name, fairseq_generation_options):
    ours = {o for a in sub_commands()[name]._actions for o in a.option_strings}
    assert sorted((ours & fairseq_generation_options) - SAME_MEANING) == []


def test_importance_options_are_named_alike_everywhere():
    spellings = {}
    for name, parser in sub_commands().items():
        for option in visible_options(parser):
            if option.startswith("--importance-"):
                spellings.setdefault(option, set()).add(name)
    assert "--importance-subset" in spellings
    assert {"importance", "prune", "dynamics", "search"} <= spellings["--importance-subset"]
    assert {"importance", "prune", "dynamics", "search"} <= spellings["--importance-loss"]


def test_outputs_are_out_dir_for_directories_and_out_for_files():
    for name, parser in sub_commands().items():
        for action in parser._actions:
            if "--out-dir" in action.option_strings:
                assert action.metavar in (None, "DIR"), (name, action.metavar)
            if "--out" in action.option_strings:
                assert action.metavar is None or "DIR" not in action.metavar, (name, action.metavar)


def test_the_fairseq_commands_help_shows_the_head_mask(capsys):
    from fairseq_headprune.commands.fairseq_commands import run_fairseq_command

    assert run_fairseq_command("generate", ["--help"]) == 0
    assert "--head-mask" in capsys.readouterr().out
