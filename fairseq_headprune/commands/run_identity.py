"""One run per output directory: its settings recorded, another run's directory refused.

A command that writes a directory records there (``RUN_RECORD``) the command and every setting its results
depend on, as parsed, before it works; a later run into that directory must be the same run (a resumed or a
repeated one) and is refused otherwise, in one line naming the first setting that differs by its flag, before
any model is loaded. Options passed on to fairseq count as settings, not as an ordered list
(``options_as_settings``). Settings that only change how a run works (the device, the progress bar, how many
configurations share a batch, a fine-tune's share, printing its plan) are left out; so is a setting the record
does not hold (an option newer than the run that wrote it). A run that ends in an error before it wrote
anything else takes its record (or what it added to one) away again, so a corrected command is not refused by
a run that never ran.

A command whose directory is meant to gather several runs' results, each in files of its own (``prune``: a
curve per scope or structure and the budgets beside them; ``ablate``: a study per mode), records the settings
those files depend on per part (``PARTS``): another part may join the directory with other settings of its
own (its test's too), the same part only with the same; the settings all parts share (the model, the split,
the generation) must be the same throughout. Settings a command checks itself, in finer words, are left to it
(``prune``'s fine-tuning recipe, recorded with each fine-tuned configuration).

``compress`` keeps its own, finer record (``compress.json``: what each stage depends on) and ``export`` writes
a model directory it refuses unless new or empty: neither is recorded here.
"""

import argparse
import contextlib
import json
import os
from typing import Dict, Iterator, List, Optional

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.output.files import file_sha256, write_json
from fairseq_headprune.study.settings import options_as_settings

RUN_RECORD = "headprune-run.json"
RECORD_FORMAT = 1

# commands whose output directory holds a record of their own (compress), or only what they wrote, in a directory
# they refuse unless new or empty (export: a CTranslate2 model directory)
OWN_RECORD_COMMANDS = ("compress", "export")
# parser bookkeeping, not settings
NOT_SETTINGS = ("handler", "command", "accepts_fairseq_args", "setting_flags", "fairseq_args", "debug")
# settings that change how a run works, never what it finds
RUN_ONLY_SETTINGS = ("cpu", "no_progress", "config_shard", "configs_per_batch", "no_encoder_reuse", "overwrite",
                     "finetune_plan")
# settings a command checks itself, per result, naming what differs in its own words
OWN_CHECKS = {"prune": ("finetune_updates", "finetune_epochs", "finetune_lr", "finetune_warmup", "finetune_seed",
                        "finetune_curve", "finetune_levels")}


def _prune_parts(args) -> List[str]:
    """The parts of a prune directory this run writes: a curve per scope (heads) or the structure's (ffn, joint),
    and the random budgets and Budhraja et al.'s tables (one summary)."""
    parts = []
    if str(args.orders).strip().lower() not in ("", "none"):
        scopes = [s for s in str(args.scopes).replace(",", " ").split() if s]
        parts += [f"curve {s}" for s in scopes] if args.structure == "heads" else [f"curve {args.structure}"]
    if args.layer_budget or args.type_budget or args.random_level or args.layer_strategy or args.budhraja_tables:
        parts.append("budgets")
    return parts


# the settings of the tests a part's tables hold (each table states its own)
TEST_SETTINGS = ("metric", "bleu", "test", "samples", "test_seed", "sample_ratio", "alpha")

# command -> (the parts a run writes, the settings that may differ between parts)
PARTS = {
    "prune": (_prune_parts, ("orders", "scopes", "structure", "x_axis", "sequence_length", "step_percent",
                             "max_percent", "raw_importance", "importance", "ablation", "gate_masks", "fisher",
                             "layer_budget", "type_budget", "random_level", "layer_strategy", "budhraja_tables",
                             "budhraja_draws", "importance_subset", "importance_limit", "importance_max_tokens",
                             "importance_granularity", "importance_method", "importance_structures",
                             "importance_loss", "importance_label_smoothing", "tune_masks", "tune_orders",
                             "tune_subset", "tune_limit", "tune_max_tokens", "tune_scale_bound", "tune_max_condition",
                             "tune_held_aside", "tune_layers", *TEST_SETTINGS)),
    "ablate": (lambda args: [args.mode], ("mode", "types", "heads", "select_subset", "cross_subset", "cross_data",
                                          *TEST_SETTINGS)),
}

# settings that name an input file or directory: recorded as absolute paths, so a run from elsewhere matches
PATH_SETTINGS = ("data", "path", "checkpoints", "references", "importance", "ablation", "fisher", "gate_masks",
                 "cross_data", "latency_table", "vocabulary_map", "tuning")


def _absolute(value):
    if isinstance(value, str):
        return os.path.abspath(value)
    if isinstance(value, (list, tuple)):
        return [_absolute(v) for v in value]
    return value


def _plain(value):
    """A parsed value as JSON holds it (tuples as lists), so a recorded setting compares equal to a parsed one."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def run_settings(args: argparse.Namespace, command: str = "") -> Dict[str, object]:
    """The settings of a parsed command that its results depend on (setting -> value)."""
    settings = {}
    for setting, value in sorted(vars(args).items()):
        if (setting in NOT_SETTINGS or setting in RUN_ONLY_SETTINGS or setting == "out_dir"
                or setting in OWN_CHECKS.get(command, ())):
            continue
        settings[setting] = _plain(_absolute(value) if setting in PATH_SETTINGS else value)
    if getattr(args, "fairseq_args", None):
        settings["fairseq_args"] = options_as_settings(args.fairseq_args)
    checkpoint = getattr(args, "path", None)
    if isinstance(checkpoint, str) and os.path.isfile(checkpoint):  # the same path, another model: another run
        settings["path_sha256"] = file_sha256(checkpoint)
    return settings


def _flag(flags: Dict[str, str], setting: str) -> str:
    if setting == "path_sha256":
        return f"the checkpoint {flags.get('path', '--path')} names (SHA-256)"
    return flags.get(setting, setting.upper())


def run_record(args: argparse.Namespace, command: str) -> Dict[str, object]:
    """What ``RUN_RECORD`` holds of this run: the command, its shared settings, and each part's own."""
    settings = run_settings(args, command)
    parts: Dict[str, Dict[str, object]] = {}
    if command in PARTS:
        parts_of, own = PARTS[command]
        mine = {s: settings.pop(s) for s in own if s in settings}
        parts = {part: mine for part in parts_of(args)}
    return {"format": RECORD_FORMAT, "command": command, "settings": settings, "parts": parts}


def _recorded(path: str, flag: str) -> Dict[str, object]:
    try:
        with open(path, encoding="utf-8") as stream:
            record = json.load(stream)
        return {"command": record["command"], "settings": dict(record["settings"]),
                "parts": dict(record.get("parts") or {})}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise SettingsError(f"{flag}: {path} is not a run record ({error}); give another directory") from None


def difference(recorded: Dict[str, object], settings: Dict[str, object], flags: Dict[str, str]) -> Optional[str]:
    """The first setting the recorded run and this one differ in, worded by its flag (None: the same run)."""
    for setting in sorted(set(recorded) & set(settings)):
        old, new = recorded[setting], settings[setting]
        if old == new:
            continue
        if setting == "fairseq_args" and isinstance(old, dict) and isinstance(new, dict):
            option = next(o for o in sorted(set(old) | set(new)) if old.get(o) != new.get(o))
            return f"{option} {_shown(old.get(option))} there, {_shown(new.get(option))} now"
        return f"{_flag(flags, setting)} {_shown(old)} there, {_shown(new)} now"
    if ("fairseq_args" in recorded) != ("fairseq_args" in settings):  # options passed on by one of the two only
        options = recorded.get("fairseq_args") or settings.get("fairseq_args")
        return f"{', '.join(options)} given {'there' if 'fairseq_args' in recorded else 'now'} only"
    return None


def _in_part(part: str, differs: Optional[str]) -> Optional[str]:
    return None if differs is None else f"{part}: {differs}"


def _shown(value) -> str:
    if value is None:
        return "not given"
    if value is True:
        return "given"
    return json.dumps(value) if not isinstance(value, str) else repr(value)


@contextlib.contextmanager
def run_recorded(args: argparse.Namespace, flags: Dict[str, str], command: str) -> Iterator[None]:
    """Record this run in its output directory (if the command writes one), or refuse a directory that holds
    another run's results (``SettingsError`` naming the setting that differs); take a fresh record away again
    if the run ends before it wrote anything else."""
    directory = getattr(args, "out_dir", None)
    if not isinstance(directory, str) or command in OWN_RECORD_COMMANDS:
        yield
        return
    flag = _flag(flags, "out_dir")
    path = os.path.join(directory, RUN_RECORD)
    record = run_record(args, command)
    planning = bool(getattr(args, "finetune_plan", False))  # prints the plan, writes nothing
    made = not os.path.isdir(directory)
    earlier = None
    if os.path.isfile(path):
        recorded = _recorded(path, flag)
        if recorded["command"] != command:
            raise SettingsError(f"{flag}: {directory} holds a run of fairseq-headprune {recorded['command']}; "
                                "give another directory")
        differs = difference(recorded["settings"], record["settings"], flags)
        for part in sorted(set(recorded["parts"]) & set(record["parts"])):
            differs = differs or _in_part(part, difference(recorded["parts"][part], record["parts"][part], flags))
        if differs is not None:
            raise SettingsError(f"{flag}: {directory} holds another run's results ({differs}); give another "
                                "directory, or the same settings to resume it")
        joined = {**record["parts"], **recorded["parts"]}
        if joined == recorded["parts"] or planning:
            yield
            return
        earlier = {"format": RECORD_FORMAT, **recorded}
        record["parts"] = joined  # another part joins the directory
    if planning:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    before = sorted(os.listdir(directory))
    write_json(record, path, indent=1)
    try:
        yield
    except BaseException:
        if sorted(os.listdir(directory)) == sorted(set(before) | {RUN_RECORD}):  # the run wrote nothing
            if earlier is not None:
                write_json(earlier, path, indent=1)
            else:
                os.remove(path)
                if made:
                    os.rmdir(directory)
        raise
