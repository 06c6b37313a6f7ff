"""The fine-tuning split as the fine-tune's updates see it (``study.finetune.settings.FinetuneData``): fairseq's
own batches of the training split at the checkpoint's batch, grouped as its updates accumulate them, and the
target tokens of that split and of the validation split."""

import math
import tempfile

import numpy as np
from fairseq import tasks, utils

from fairseq_headprune.engine.finetune.held import training_config
from fairseq_headprune.errors import StudyError, first_line, library_errors_as
from fairseq_headprune.registry import register_components
from fairseq_headprune.study.finetune.settings import FinetuneData, FinetuneSettings


def finetune_data(checkpoint: str, data: str, family: str, settings: FinetuneSettings, validation: str
                  ) -> FinetuneData:
    """Count what one epoch of ``checkpoint``'s fine-tune on ``data`` holds: its updates (fairseq's batches of the
    training split at the checkpoint's --max-tokens / --batch-size, over its --update-freq, as fairseq-train's
    epoch iterator groups them) and target tokens, and the target tokens of the ``validation`` split."""
    register_components()
    with tempfile.TemporaryDirectory(prefix="headprune-data-") as directory:
        cfg, _, _ = training_config(checkpoint, data, directory, family, settings, True, False, None)
    with library_errors_as(lambda error: StudyError(f"cannot count the fine-tuning's data in {data}: "
                                                    f"{first_line(error)}")):
        task = tasks.setup_task(cfg.task)
        split = cfg.dataset.train_subset
        task.load_dataset(split, combine=False, epoch=1)
        task.load_dataset(validation, combine=False, epoch=1)
        train = task.dataset(split)
        max_positions = utils.resolve_max_positions(
            task.max_positions(),
            (getattr(cfg.model, "max_source_positions", None), getattr(cfg.model, "max_target_positions", None)),
            cfg.dataset.max_tokens)
        batches = task.get_batch_iterator(
            dataset=train, max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
            max_positions=max_positions, ignore_invalid_inputs=True,
            required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
            num_shards=1, shard_id=0, num_workers=0, epoch=1, disable_iterator_cache=True)
        update_freq = int(cfg.optimization.update_freq[0])
        return FinetuneData(updates_per_epoch=max(1, math.ceil(len(batches) / update_freq)),
                            target_tokens=_target_tokens(train), validation=validation,
                            validation_tokens=_target_tokens(task.dataset(validation)))


def _target_tokens(dataset) -> int:
    """A split's target tokens (</s> included, as fairseq counts ``ntokens``): a pair's target side, a language
    model's samples."""
    sizes = getattr(dataset, "tgt_sizes", None)
    return int(np.sum(np.asarray(dataset.sizes if sizes is None else sizes, dtype=np.int64)))
