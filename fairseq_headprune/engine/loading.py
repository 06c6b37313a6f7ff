"""Load a checkpoint once and batch its data splits with fairseq's own code.

Every study shares this: building the task and model from a data directory
and a checkpoint (with one-line errors for the usual mistakes), and batching
a split as fairseq's dataset code does. The passes that score heads are in
``scoring.py``.
"""

import logging
import os
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

from ..errors import HeadMaskError, StudyError
from ..study.head_mask import HeadMask, parse_head_mask

logger = logging.getLogger(__name__)
BATCHING_SEED = 1  # fairseq's default --seed


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_task_and_model(
    data: str,
    checkpoint: str,
    fairseq_args: Sequence[str] = (),
    cpu: bool = False,
):
    """(cfg, task, model) for ``checkpoint`` with the dictionaries in ``data``.

    ``fairseq_args`` are fairseq-generate options (``--source-lang``,
    ``--beam``, ``--head-mask`` …); the task is always ``fairseq-headprune``.
    The model is in eval mode, on the GPU unless ``cpu`` or none is available.
    """
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .. import register_components
    from ..tasks.fairseq_headprune import TASK_NAME

    register_components()

    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    if not os.path.isfile(checkpoint):
        raise StudyError(f"checkpoint not found: {checkpoint}")
    use_cuda = torch.cuda.is_available() and not cpu
    argv = [data, "--task", TASK_NAME, "--path", checkpoint, *fairseq_args]
    if not use_cuda:
        argv.append("--cpu")
    # fairseq-generate's own parser reads the options, as fairseq-generate would
    parser = options.get_generation_parser()

    def refuse(message):
        raise StudyError(f"fairseq option: {message}")

    parser.error = refuse  # one line instead of argparse's usage text and exit
    try:
        generation_options = options.parse_args_and_arch(parser, argv)
    except SystemExit as error:  # --help, or a sub-parser's own error
        raise StudyError(f"bad fairseq options: {' '.join(fairseq_args)}") from error
    cfg = convert_namespace_to_omegaconf(generation_options)
    utils.import_user_module(cfg.common)
    try:
        task = tasks.setup_task(cfg.task)
    except Exception as error:  # fairseq raises bare Exceptions here
        _refuse_other_tasks(checkpoint)
        raise StudyError(f"cannot set up the translation task on {data}: {_first_line(error)}")
    try:
        models, _ = checkpoint_utils.load_model_ensemble(
            [checkpoint], arg_overrides={"data": data}, task=task
        )
    except RuntimeError as error:
        _refuse_other_tasks(checkpoint)
        message = _first_line(error)
        if "size mismatch" in str(error) or "Error(s) in loading state_dict" in message:
            detail = next(
                (line.strip() for line in str(error).splitlines() if "size mismatch" in line), message
            )
            raise StudyError(
                f"checkpoint {checkpoint} does not match the dictionaries in {data} ({detail})"
            )
        raise StudyError(f"cannot load checkpoint {checkpoint}: {message}")
    except Exception as error:  # torch.load raises many types for files that are no checkpoint
        _refuse_other_tasks(checkpoint)
        raise StudyError(f"cannot load checkpoint {checkpoint}: {_first_line(error)}")
    model = models[0]
    if use_cuda:
        model.cuda()
    model.eval()
    return cfg, task, model


def load_study_model(sweep_settings, data: str):
    """(cfg, task, model) of a sweep's checkpoint (``SweepSettings``) with the data in ``data``, by its family."""
    return load_family_model(sweep_settings.family, data, sweep_settings.checkpoint, sweep_settings.generation_args,
                             cpu=sweep_settings.cpu)


def load_family_model(family: str, data: str, checkpoint: str, fairseq_args: Sequence[str] = (), cpu: bool = False):
    """(cfg, task, model): a translation model as fairseq-generate loads it, a classifier or LM as its scorer does."""
    from ..constants import TRANSLATION_FAMILY

    if family == TRANSLATION_FAMILY:
        return load_task_and_model(data, checkpoint, fairseq_args, cpu=cpu)
    return load_scoring_model(family, data, checkpoint, fairseq_args, cpu=cpu)


def load_scoring_model(family: str, data: str, checkpoint: str, fairseq_args: Sequence[str] = (), cpu: bool = False):
    """(cfg, task, model) of a classifier or language-model checkpoint, as fairseq's own commands load it.

    A classifier (``sentence_prediction``) is read with fairseq-validate's
    options and its own saved task settings; a language model
    (``language_modeling``) with fairseq-eval-lm's, so ``--sample-break-mode``,
    ``--tokens-per-sample``, ``--context-window``, ``--add-bos-token`` …
    mean what they mean there. The task is the plugin's head-masking
    variant of the saved one, so ``--head-mask`` applies.
    """
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .. import register_components
    from ..constants import CLASSIFIER_FAMILY
    from .checkpoint_info import classification_head_override
    from ..tasks.headprune_language_modeling import TASK_NAME as LM_TASK_NAME
    from ..tasks.headprune_sentence_prediction import TASK_NAME as CLASSIFIER_TASK_NAME

    register_components()
    if not os.path.isdir(data):
        raise StudyError(f"data directory not found: {data}")
    if not os.path.isfile(checkpoint):
        raise StudyError(f"checkpoint not found: {checkpoint}")
    classifier = family == CLASSIFIER_FAMILY
    task_name = CLASSIFIER_TASK_NAME if classifier else LM_TASK_NAME
    parser = options.get_validation_parser() if classifier else options.get_eval_lm_parser()
    argv = [data, "--task", task_name, "--path", checkpoint, *fairseq_args]
    if classifier:
        argv += ["--criterion", "sentence_prediction"]
    if cpu or not torch.cuda.is_available():
        argv.append("--cpu")

    def refuse(message):
        raise StudyError(f"fairseq option: {message}")

    parser.error = refuse
    try:
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, argv))
    except SystemExit as error:
        raise StudyError(f"bad fairseq options: {' '.join(fairseq_args)}") from error
    if not classifier and cfg.eval_lm.context_window > 0:
        cfg.task.tokens_per_sample -= cfg.eval_lm.context_window  # as fairseq-eval-lm does
    try:
        if classifier:  # as fairseq-validate: the saved task settings, this data and mask
            head = classification_head_override(checkpoint)
            overrides = {"data": data, "task": task_name, "head_mask": cfg.task.head_mask, **head}
            if head:  # the criterion built from these options scores that head too
                cfg.criterion.classification_head_name = head["classification_head_name"]
            models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides)
        else:  # as fairseq-eval-lm: the task from the command line
            task = tasks.setup_task(cfg.task)
            models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], task=task)
    except SystemExit as error:  # the task's one-line errors (--head-mask)
        raise StudyError(str(error).split("error: ", 1)[-1])
    except Exception as error:
        raise StudyError(f"cannot load {checkpoint} with the data in {data}: {_first_line(error)}")
    model = models[0]
    if not cpu and torch.cuda.is_available():
        model.cuda()
    model.eval()
    return cfg, task, model


def _refuse_other_tasks(checkpoint: str) -> None:
    """One clear line when a translation loader is given a checkpoint of a task no study takes (read on failure)."""
    from ..errors import HeadPruneError
    from ..tasks.fairseq_headprune import TASK_NAME
    from .checkpoint_info import load_checkpoint_state, saved_task_name

    try:
        task = saved_task_name(load_checkpoint_state(checkpoint))
    except HeadPruneError:
        return  # not a readable checkpoint: the caller's own message says so
    if task is not None and "translation" not in task and task != TASK_NAME:
        raise StudyError(
            f"{checkpoint} is a {task} checkpoint; the studies take translation, sentence_prediction "
            "and language_modeling checkpoints"
        )


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def split_batches(
    task,
    split: str,
    max_tokens: Optional[int] = None,
    max_sentences: Optional[int] = None,
    limit: Optional[int] = None,
) -> Tuple[object, List[List[int]]]:
    """fairseq's batches (lists of sentence indices) for the first ``limit`` sentences of ``split``."""
    import numpy as np

    from fairseq.data.data_utils import numpy_seed

    load_split(task, split)
    dataset = task.dataset(split)
    # fairseq breaks ties between sentences of one length with a random permutation:
    # seeded, so every run and every rank of a sharded study gets the same batches
    with numpy_seed(BATCHING_SEED):
        indices = dataset.ordered_indices()
    if limit is not None:
        indices = indices[indices < limit]
    if len(indices) == 0:
        raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences")
    if max_tokens is None and max_sentences is None:
        max_sentences = 64
    longest = max(int(dataset.num_tokens(i)) for i in indices)
    if max_tokens is not None and longest > max_tokens:
        raise StudyError(
            f"split {split!r} has a sentence of {longest} tokens, more than --max-tokens {max_tokens}"
        )
    batches = dataset.batch_by_size(
        np.asarray(indices, dtype=np.int64), max_tokens=max_tokens, max_sentences=max_sentences
    )
    return dataset, [list(batch) for batch in batches]


def load_split(task, split: str) -> None:
    """Load ``split`` into ``task``, with one-line errors for missing or empty splits."""
    _check_split_not_empty(task, split)
    try:
        task.load_dataset(split, combine=False, epoch=1)
    except FileNotFoundError as error:
        raise StudyError(f"split {split!r} not found in {task.cfg.data} ({_first_line(error)})")
    except Exception as error:  # fairseq's dataset readers raise assorted types
        raise StudyError(f"cannot read split {split!r} in {task.cfg.data}: {_first_line(error)}")


def _check_split_not_empty(task, split: str) -> None:
    """fairseq cannot even open an empty binarized split (it cannot mmap 0 bytes)."""
    source, target = getattr(task.cfg, "source_lang", None), getattr(task.cfg, "target_lang", None)
    if source is None or target is None:
        return  # not a translation task: fairseq's own reader reports its files
    for pair in (f"{source}-{target}", f"{target}-{source}"):
        for lang in (source, target):
            path = os.path.join(task.cfg.data, f"{split}.{pair}.{lang}.bin")
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                raise StudyError(f"split {split!r} in {task.cfg.data} has no sentences ({path} is empty)")


def iterate_samples(dataset, batches: Iterable[List[int]], device: torch.device):
    """Collated samples (fairseq's dict with net_input, target, ntokens …) on ``device``."""
    from fairseq import utils

    for batch in batches:
        sample = dataset.collater([dataset[i] for i in batch])
        if device.type == "cuda":
            sample = utils.move_to_cuda(sample, device=device)
        yield sample


def parse_mask_for_model(spec: Optional[str], layout) -> Optional[HeadMask]:
    if spec is None:
        return None
    try:
        return parse_head_mask(spec, layout)
    except HeadMaskError as error:
        raise StudyError(f"--head-mask: {error}")
