"""The ``fairseq-headprune`` task: translation with per-head attention masks."""

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import DictConfig, open_dict

from fairseq_headprune.constants import TRANSLATION_TASK
from fairseq_headprune.criterions.headprune_importance import fisher_blocks_from_meters, importance_from_meters
from fairseq_headprune.study.importance.scores import ImportanceResult, write_importance_json, write_importance_tsv
from fairseq_headprune.tasks.headprune_language_modeling import TASK_NAME as LM_TASK_NAME
from fairseq_headprune.tasks.headprune_sentence_prediction import TASK_NAME as SENTENCE_TASK_NAME
from fairseq_headprune.tasks.masking import FFN_MASK_HELP, HEAD_MASK_HELP, HeadMaskingMixin

logger = logging.getLogger(__name__)

TASK_NAME = TRANSLATION_TASK


@dataclass
class HeadPruneConfig(TranslationConfig):
    head_mask: Optional[str] = field(default=None, metadata={"help": HEAD_MASK_HELP})
    ffn_mask: Optional[str] = field(default=None, metadata={"help": FFN_MASK_HELP})


@register_task(TASK_NAME, dataclass=HeadPruneConfig)
class HeadPruneTranslationTask(HeadMaskingMixin, TranslationTask):
    """Translation whose models can mask any set of attention heads.

    ``build_model`` lets fairseq build the model named by ``--arch`` (or the
    checkpoint), then makes every attention module maskable and applies
    ``--head-mask`` (``HeadMaskingMixin``).
    """

    cfg: HeadPruneConfig

    def build_criterion(self, cfg, from_checkpoint=False):
        self.criterion = super().build_criterion(cfg, from_checkpoint)
        return self.criterion

    def begin_valid_epoch(self, epoch, model):
        """Save the importance that ``headprune_importance`` gathered this epoch."""
        super().begin_valid_epoch(epoch, model)
        save_dir = getattr(self.criterion, "importance_save_dir", None)
        if save_dir:
            _save_epoch_importance(self.criterion, save_dir, epoch)


def _save_epoch_importance(criterion, save_dir: str, epoch: int) -> None:


    if distributed_utils.get_global_rank() != 0:
        return  # every worker holds the same all-reduced sums
    meters = metrics.get_meters("train") or {}
    found = importance_from_meters(meters)
    if found is None:
        return
    scores, count = found
    result = ImportanceResult(
        importance=scores,
        granularity=criterion.importance_granularity,
        method=criterion.importance_method,
        fisher_blocks=fisher_blocks_from_meters(meters, count),
        count=count,
        settings={"source": "fairseq-train", "epoch": epoch, "loss": criterion.importance_loss},
    )
    prefix = os.path.join(save_dir, f"importance_epoch{epoch}")
    write_importance_json(result, prefix + ".json")
    write_importance_tsv(result, prefix + ".tsv")
    logger.info("wrote head importance of epoch %d to %s.{json,tsv}", epoch, prefix)


def _select_task_from_overrides(load_checkpoint_to_cpu):
    """Wrap fairseq's checkpoint reader so a head-masking ``--task`` is honoured.

    fairseq-validate builds the task saved in the checkpoint and passes the
    command line only as overrides of that task's existing fields, so for a
    checkpoint trained with ``--task translation`` (or ``sentence_prediction``)
    it would silently drop ``--head-mask``. Old-format checkpoints take every
    override already; for new-format ones we switch the saved task to ours
    (``fairseq-headprune``, ``headprune_sentence_prediction`` or
    ``headprune_language_modeling``, each extending the task it replaces) when
    the overrides ask for it. Nothing changes for
    any other call.
    """

    ours = (TASK_NAME, SENTENCE_TASK_NAME, LM_TASK_NAME)

    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, arg_overrides=None, *args, **kwargs):
        state = load_checkpoint_to_cpu(path, arg_overrides, *args, **kwargs)
        overrides = arg_overrides or {}
        saved_cfg = state.get("cfg")
        task_cfg = saved_cfg.get("task") if saved_cfg is not None else None
        wanted = overrides.get("task")
        if wanted in ours and isinstance(task_cfg, DictConfig) and task_cfg.get("_name") != wanted:
            with open_dict(task_cfg):
                task_cfg._name = wanted
                task_cfg.head_mask = overrides.get("head_mask")
        return state

    wrapper._headprune_wrapped = True
    return wrapper


if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_headprune_wrapped", False):
    checkpoint_utils.load_checkpoint_to_cpu = _select_task_from_overrides(
        checkpoint_utils.load_checkpoint_to_cpu
    )
