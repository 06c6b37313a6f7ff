"""Options that do nothing in the combination given, refused in one line naming both.

Each rule says, for the commands that take an option, what must hold for that option to act when a user gives
it (``OPTION_RULES``); ``check_option_rules`` refuses a given option whose rule does not hold, before any work.
An option counts as given when the command line sets it, whatever its value (its default included): the
parser is run a second time with a mark as every default (``given_settings``). ``docs/cli.md`` lists the
rules (``scripts/dev/make_cli_reference.py``).
"""

import argparse
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Set

from fairseq_headprune.errors import SettingsError

_NOT_GIVEN = object()

# the options that shape how importance is estimated, idle when it is read from --importance FILE (the method
# and structures are not: they say what the file holds)
IMPORTANCE_ESTIMATION = ("importance_subset", "importance_limit", "importance_max_tokens", "importance_batch_size",
                         "importance_granularity", "importance_loss", "importance_label_smoothing")
# the options of the tuning of kept heads' scales (Kwon et al.'s mask tuning)
TUNING_OPTIONS = ("tune_subset", "tune_limit", "tune_max_tokens", "tune_scale_bound", "tune_max_condition",
                  "tune_held_aside", "tune_layers")


def _orders(args) -> List[str]:
    return [o for o in str(getattr(args, "orders", "") or "").replace(",", " ").split() if o]


def _estimates_importance(args) -> bool:
    """prune: whether a curve estimates importance though --importance FILE is given (iterative re-estimates it
    on the pruned model; a fisher order without --fisher FILE estimates its scores with the same options)."""
    orders = _orders(args)
    return "iterative" in orders or (any(o.startswith("fisher") for o in orders) and not getattr(args, "fisher", None))


@dataclass(frozen=True)
class OptionRule:
    """``settings`` (given) act only where ``holds(args)``; ``why`` says why they would not, in the user's flags."""

    settings: Sequence[str]
    holds: Callable[[argparse.Namespace], bool]
    why: str
    commands: Sequence[str] = ()  # empty: every command that takes the setting


OPTION_RULES = (
    OptionRule(("importance_label_smoothing",), lambda a: getattr(a, "importance_loss", None) == "label_smoothed",
               "it needs --importance-loss label_smoothed (the loss it smooths)"),
    OptionRule(("heads",), lambda a: a.mode in ("single", "cross-domain"), "it needs --mode single or cross-domain",
               ("ablate",)),
    OptionRule(("select_subset",), lambda a: a.mode == "all-but-one", "it needs --mode all-but-one", ("ablate",)),
    OptionRule(("cross_subset", "cross_data"), lambda a: a.mode == "cross-domain", "it needs --mode cross-domain",
               ("ablate",)),
    OptionRule(("fisher",), lambda a: any(o.startswith("fisher") for o in _orders(a)),
               "it needs a fisher order in --orders (fisher, fisher-rearranged)", ("prune",)),
    OptionRule(("ablation",), lambda a: "ablation" in _orders(a), "it needs --orders ablation", ("prune",)),
    OptionRule(IMPORTANCE_ESTIMATION, lambda a: not a.importance or _estimates_importance(a),
               "the importance is read from --importance FILE, not estimated (the iterative order, or a fisher order "
               "without --fisher FILE, would estimate it)", ("prune",)),
    OptionRule(("quantization_tolerance",), lambda a: a.quantization == "auto", "it needs --quantization auto",
               ("compress",)),
    OptionRule(TUNING_OPTIONS, lambda a: not a.no_tune, "--no-tune turns the tuning off", ("compress",)),
    OptionRule(TUNING_OPTIONS + ("tune_orders",), lambda a: a.tune_masks, "it needs --tune-masks", ("prune", "search")),
    OptionRule(("bleu",), lambda a: a.metric is None, "it chooses the BLEU, and --metric scores the files otherwise",
               ("significance",)),
    OptionRule(("vocabulary_map_candidates", "vocabulary_map_common"), lambda a: a.vocabulary_map,
               "it needs --vocabulary-map", ("export",)),
)


def given_settings(subparser: argparse.ArgumentParser, argv: Sequence[str]) -> Set[str]:
    """The settings the command line ``argv`` (the command's own arguments) sets, whatever their values."""
    actions = [a for a in subparser._actions if a.dest != argparse.SUPPRESS]
    marked = {a.dest: a.default for a in actions}
    # an action that adds to its value (append, count) starts from None: given when it is no longer None
    accumulating = {a.dest for a in actions
                    if isinstance(a, (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction))}
    subparser.set_defaults(**{dest: None if dest in accumulating else _NOT_GIVEN for dest in marked})
    try:
        parsed, _ = subparser.parse_known_args(list(argv))
    finally:
        subparser.set_defaults(**marked)
    return {dest for dest, value in vars(parsed).items()
            if value is not _NOT_GIVEN and not (dest in accumulating and value is None)}


def rules_of(command: str, subparser: argparse.ArgumentParser):
    """(rule, settings of it that ``command`` takes) for every rule that applies to the command."""
    dests = {a.dest for a in subparser._actions}
    for rule in OPTION_RULES:
        taken = [s for s in rule.settings if s in dests]
        if taken and (not rule.commands or command in rule.commands):
            yield rule, taken


def check_option_rules(command: str, subparser: argparse.ArgumentParser, argv: Sequence[str],
                       args: argparse.Namespace, flags: Dict[str, str]) -> None:
    """Refuse a given option that does nothing in this combination (``SettingsError`` naming it and why), and a
    number that is none (``nan``: no option means anything by it)."""
    for setting, value in sorted(vars(args).items()):
        if isinstance(value, float) and math.isnan(value):
            raise SettingsError(f"{flags.get(setting, setting)} is not a number (nan); nothing was written")
    given = None
    for rule, taken in rules_of(command, subparser):
        if rule.holds(args):
            continue
        given = given_settings(subparser, argv) if given is None else given
        idle = [s for s in taken if s in given]
        if idle:
            flag = flags.get(idle[0], idle[0])
            raise SettingsError(f"{flag} does nothing here: {rule.why}; nothing was written")
