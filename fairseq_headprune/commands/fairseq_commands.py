"""``fairseq-headprune train|generate|validate|interactive|eval-lm``: fairseq's own commands with the plugin.

``--user-dir`` and ``--task`` are filled in unless given: the head-masking
task that extends the task the ``--path`` checkpoint was trained with
(``headprune_sentence_prediction`` for ``sentence_prediction``, with its
``--criterion sentence_prediction``; ``headprune_language_modeling`` for
``language_modeling``), otherwise ``fairseq-headprune`` (translation). A
classifier whose one classification head is not the one its config names
(``roberta.large.mnli``: ``mnli``) gets ``--model-overrides`` naming it,
unless given. Every other option is fairseq's, ``--head-mask`` included.
"""

import importlib
import os
import sys
from typing import List, Optional

from fairseq_headprune.constants import CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY
from fairseq_headprune.errors import CheckpointError, HeadPruneError, debugging

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sub-command -> fairseq's parser of that command (for --help with the task's options)
PARSERS = {
    "train": "get_training_parser",
    "generate": "get_generation_parser",
    "validate": "get_validation_parser",
    "interactive": "get_interactive_generation_parser",
    "eval-lm": "get_eval_lm_parser",
}
# the settings fairseq's own commands take as options: the plugin's tasks' and criteria's, and fairseq's own that
# their errors name (the errors worded with these flags)
FAIRSEQ_FLAGS = {"head_mask": "--head-mask", "ffn_mask": "--ffn-mask", "distill_teacher": "--distill-teacher",
                 "distill_weight": "--distill-weight", "gate_target_heads": "--gate-target-heads",
                 "criterion": "--criterion", "task": "--task"}
# sub-command -> fairseq_cli module whose cli_main runs it
FAIRSEQ_COMMANDS = {
    "train": "fairseq_cli.train",
    "generate": "fairseq_cli.generate",
    "validate": "fairseq_cli.validate",
    "interactive": "fairseq_cli.interactive",
    "eval-lm": "fairseq_cli.eval_lm",
}


def _given(argv: List[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def _option_value(argv: List[str], option: str) -> Optional[str]:
    for index, argument in enumerate(argv):
        if argument == option and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith(option + "="):
            return argument.split("=", 1)[1]
    return None


def _task_for(argv: List[str]) -> List[str]:
    """``--task`` (and the criterion it needs) for the ``--path`` checkpoint's task."""
    from fairseq_headprune.engine.checkpoints.info import (
        load_checkpoint_state,
        saved_task_name,
        state_classification_head_override,
        task_family,
    )
    from fairseq_headprune.tasks.fairseq_headprune import TASK_NAME
    from fairseq_headprune.tasks.headprune_language_modeling import TASK_NAME as LM_TASK_NAME
    from fairseq_headprune.tasks.headprune_sentence_prediction import TASK_NAME as SENTENCE_TASK_NAME

    path = _option_value(argv, "--path")  # run_fairseq_command checked that its files exist
    checkpoint = path.split(":")[0] if path is not None else None
    if checkpoint is None:  # fairseq-train from scratch: the translation task unless --task says otherwise
        return ["--task", TASK_NAME]
    state = load_checkpoint_state(checkpoint)
    family = task_family(saved_task_name(state), checkpoint)
    if family == CLASSIFIER_FAMILY:
        # fairseq-validate cannot resolve the task's criterion interpolations without it
        criterion = [] if _given(argv, "--criterion") else ["--criterion", "sentence_prediction"]
        # a released classifier's one head under another name (roberta.large.mnli: mnli) is kept
        head = state_classification_head_override(state, checkpoint)
        overrides = [] if _given(argv, "--model-overrides") or not head else ["--model-overrides", repr(head)]
        return ["--task", SENTENCE_TASK_NAME, *criterion, *overrides]
    if family == LANGUAGE_MODEL_FAMILY:
        return ["--task", LM_TASK_NAME]
    return ["--task", TASK_NAME]


def _direction_for(argv: List[str]) -> List[str]:
    """``--source-lang``/``--target-lang`` as fairseq-train would infer them from the data's file names, given
    explicitly so that the checkpoint records its direction (fairseq keeps an inferred pair out of the saved
    configuration), and a later run on the reversed pair is refused; nothing for another task or a pair given."""
    from fairseq.data import data_utils

    from fairseq_headprune.tasks.fairseq_headprune import TASK_NAME

    if (_option_value(argv, "--task") != TASK_NAME or any(_given(argv, option) for option in
                                                            ("-s", "--source-lang", "-t", "--target-lang"))):
        return []
    data = argv[0] if argv and not argv[0].startswith("-") else None  # DATA first, as fairseq-train documents
    if data is None or not os.path.isdir(data.split(":")[0]):
        return []  # fairseq's parser reports it
    source, target = data_utils.infer_language_pair(data.split(":")[0])
    return [] if source is None or target is None else ["--source-lang", source, "--target-lang", target]


def run_fairseq_command(command: str, args: List[str]) -> int:
    """Run a fairseq command with ``--user-dir`` and ``--task`` filled in."""
    from fairseq_headprune.registry import register_components

    register_components()
    argv = list(args)
    path = _option_value(argv, "--path")
    for checkpoint in (path.split(":") if path else []):
        if not os.path.isfile(checkpoint):
            raise CheckpointError(f"--path: checkpoint not found: {checkpoint}")
    if not _given(argv, "--user-dir"):
        argv += ["--user-dir", PACKAGE_DIR]
    if not _given(argv, "--task"):
        argv += _task_for(argv)
    if command == "train":
        argv += _direction_for(argv)
    if "-h" in argv or "--help" in argv:
        return _print_help(command, argv)
    module = importlib.import_module(FAIRSEQ_COMMANDS[command])
    sys.argv = [f"fairseq-{command}"] + argv
    try:
        module.cli_main()
    except HeadPruneError as error:  # raised inside fairseq's command: reported as fairseq-<command> would
        if debugging():
            raise
        print(f"fairseq-headprune: error: {error.worded(FAIRSEQ_FLAGS)}", file=sys.stderr)
        return 1
    return 0


def _print_help(command: str, argv: List[str]) -> int:
    """fairseq's help of the command with the plugin's task options (--head-mask) in it.

    fairseq adds a task's options to its parser only after reading --task,
    and argparse answers --help before that: parse first, then print.
    """
    from fairseq import options

    parser = getattr(options, PARSERS[command])()
    rest = [a for a in argv if a not in ("-h", "--help")]
    if not any(not a.startswith("-") for a in rest[:1]):
        rest = ["DATA", *rest]  # the data directory fairseq's parser requires
    if command == "train" and not _given(rest, "--arch"):
        rest += ["--arch", "transformer"]  # fairseq lists a model's options only for a known --arch
    try:
        options.parse_args_and_arch(parser, rest, parse_known=True)
    except SystemExit:
        pass  # a missing option: the help below still lists every option fairseq knows by now
    parser.prog = f"fairseq-headprune {command}"
    parser.print_help()
    return 0


def add_parsers(commands) -> None:
    """Listed in --help only: ``cli.main`` hands these commands to fairseq before parsing."""
    for command in FAIRSEQ_COMMANDS:
        commands.add_parser(
            command,
            add_help=False,
            help=f"fairseq-{command} with --user-dir and the head-masking --task set (fairseq-headprune; "
            "headprune_sentence_prediction or headprune_language_modeling for a --path checkpoint of "
            f"those tasks; all fairseq-{command} options, plus --head-mask"
            + ("; a translation run without -s/-t gets the pair fairseq would infer from DATA, so that the "
               "checkpoint records its direction)" if command == "train" else ")"),
        )
