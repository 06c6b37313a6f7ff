"""Build a fairseq task and model from a checkpoint and a data directory, as fairseq's own commands do.

One loader per job, each reading its options with the parser of the fairseq
command whose meaning they keep:
- ``load_generation_model``: a translation model as ``fairseq-generate``
  loads it (``--beam``, ``--source-lang``, ``--head-mask`` ...);
- ``load_evaluation_model``: a classifier as ``fairseq-validate`` loads it,
  a language model as ``fairseq-eval-lm`` does;
- ``load_with_saved_task``: a classifier or language model with the task
  settings it was trained with (what its importance is estimated on).
The task is always the plugin's head-masking variant, so ``--head-mask``
applies. Failures are the project's errors, the library's error chained.
"""

import os
from typing import Sequence

import torch
from fairseq import checkpoint_utils, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_headprune.constants import CLASSIFIER_FAMILY, CLASSIFIER_TASK, LANGUAGE_MODEL_TASK, TRANSLATION_TASK
from fairseq_headprune.engine.checkpoints.info import (
    checkpoint_weights,
    classification_head_override,
    lazy_checkpoint_state,
    saved_option,
)
from fairseq_headprune.errors import CheckpointError, StudyError, first_line, library_errors_as
from fairseq_headprune.registry import register_components


def load_generation_model(data: str, checkpoint: str, fairseq_args: Sequence[str] = (), cpu: bool = False):
    """(cfg, task, model) of a translation ``checkpoint`` with the dictionaries in ``data``.

    ``fairseq_args`` are fairseq-generate options. The model is in eval mode,
    on the GPU unless ``cpu`` or none is available.
    """

    _check_inputs(data, checkpoint)
    cfg = _parse_options(options.get_generation_parser(), [data, "--task", TRANSLATION_TASK, "--path", checkpoint],
                         fairseq_args, cpu)
    utils.import_user_module(cfg.common)
    with library_errors_as(lambda error: StudyError(f"cannot set up the translation task on {data}: "
                                                    f"{first_line(error)}")):
        task = tasks.setup_task(cfg.task)
    _check_dictionaries(checkpoint, data, task)
    with library_errors_as(lambda error: CheckpointError(f"cannot load checkpoint {checkpoint}: {first_line(error)}")):
        models, _ = checkpoint_utils.load_model_ensemble([checkpoint], arg_overrides={"data": data}, task=task)
    return cfg, task, _ready(models[0], cpu)


def load_evaluation_model(family: str, data: str, checkpoint: str, fairseq_args: Sequence[str] = (),
                          cpu: bool = False):
    """(cfg, task, model) of a classifier or language-model checkpoint, as fairseq's own commands load it.

    A classifier (``sentence_prediction``) is read with fairseq-validate's
    options and its own saved task settings; a language model
    (``language_modeling``) with fairseq-eval-lm's, so ``--sample-break-mode``,
    ``--tokens-per-sample``, ``--context-window``, ``--add-bos-token`` ...
    mean what they mean there.
    """

    _check_inputs(data, checkpoint)
    classifier = family == CLASSIFIER_FAMILY
    task_name = CLASSIFIER_TASK if classifier else LANGUAGE_MODEL_TASK
    parser = options.get_validation_parser() if classifier else options.get_eval_lm_parser()
    argv = [data, "--task", task_name, "--path", checkpoint]
    if classifier:
        argv += ["--criterion", "sentence_prediction"]
    cfg = _parse_options(parser, argv, fairseq_args, cpu)
    if not classifier and cfg.eval_lm.context_window > 0:
        cfg.task.tokens_per_sample -= cfg.eval_lm.context_window  # as fairseq-eval-lm does
    if classifier:  # as fairseq-validate: the saved task settings, this data and mask
        head = classification_head_override(checkpoint)
        overrides = {"data": data, "task": task_name, "head_mask": cfg.task.head_mask, **head}
        if head:  # the criterion built from these options scores that head too
            cfg.criterion.classification_head_name = head["classification_head_name"]
    cannot_load = lambda error: CheckpointError(  # noqa: E731
        f"cannot load {checkpoint} with the data in {data}: {first_line(error)}")
    with library_errors_as(cannot_load):
        if classifier:
            models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
        else:  # as fairseq-eval-lm: the task from the command line
            task = tasks.setup_task(cfg.task)
            models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], task=task)
    return cfg, task, _ready(models[0], cpu)


def load_with_saved_task(family: str, data: str, checkpoint: str, cpu: bool = False):
    """(cfg, task, model): a classifier or LM with the task settings saved in its checkpoint and this data (no
    ``--head-mask`` of the saved task's: the model applies the mask its config records).

    An example is then a sample as the model was trained on it (sample break
    mode, tokens per sample); ``cfg`` is the saved configuration (its criterion).
    """

    register_components()
    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    classifier = family == CLASSIFIER_FAMILY
    overrides = {"data": data, "task": CLASSIFIER_TASK if classifier else LANGUAGE_MODEL_TASK, "head_mask": None}
    if classifier:
        overrides.update(classification_head_override(checkpoint))
    kind = "classifier" if classifier else "language model"
    with library_errors_as(lambda error: CheckpointError(
            f"cannot load {kind} {checkpoint} with the data in {data}: {first_line(error)}")):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
    return cfg, task, _ready(models[0], cpu)


def _check_direction(checkpoint: str, task) -> None:
    """The languages asked for (``-s``/``-t``, or inferred from ``data``) must be those the checkpoint says it
    was trained on, where it says so (fairseq saves them when they were given): a shared dictionary would
    otherwise score the reversed direction without a word."""
    state = lazy_checkpoint_state(checkpoint)
    trained = saved_option(state, "task", "source_lang"), saved_option(state, "task", "target_lang")
    asked = task.cfg.source_lang, task.cfg.target_lang
    if None not in trained and None not in asked and tuple(trained) != tuple(asked):
        raise CheckpointError(f"checkpoint {checkpoint} translates {trained[0]}-{trained[1]}, not {asked[0]}-"
                              f"{asked[1]}: give the source lang and the target lang it was trained on",
                              setting=("source_lang", "target_lang"))


def _check_dictionaries(checkpoint: str, data: str, task) -> None:
    """The checkpoint's embedding tables must have a row per word of the dictionaries in ``data``."""
    _check_direction(checkpoint, task)
    weights = checkpoint_weights(checkpoint)
    for key, dictionary in (("encoder.embed_tokens.weight", task.source_dictionary),
                            ("decoder.embed_tokens.weight", task.target_dictionary)):
        rows = int(weights[key].shape[0]) if key in weights else None
        if rows is not None and rows != len(dictionary):
            raise CheckpointError(
                f"checkpoint {checkpoint} does not match the dictionaries in {data} ({key} has {rows} rows, "
                f"the dictionary {len(dictionary)} words)"
            )


def _check_inputs(data: str, checkpoint: str) -> None:
    register_components()
    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    if not os.path.isfile(checkpoint):
        raise StudyError(f"checkpoint not found: {checkpoint}")


def _parse_options(parser, argv, fairseq_args: Sequence[str], cpu: bool):
    """fairseq's config from its command's own parser, with one-line errors instead of usage text and an exit."""

    argv = [*argv, *fairseq_args]
    if cpu or not torch.cuda.is_available():
        argv.append("--cpu")

    def refuse(message):
        raise StudyError(f"fairseq option: {message}")

    parser.error = refuse
    try:
        return convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, argv))
    except SystemExit as error:  # --help, or a sub-parser's own error
        raise StudyError(f"bad fairseq options: {' '.join(fairseq_args)}") from error


def _ready(model, cpu: bool):
    """The model in eval mode, on the GPU unless ``cpu`` or none is available."""
    if not cpu and torch.cuda.is_available():
        model.cuda()
    model.eval()
    return model
