"""The ``fairseq-headprune`` task: translation with per-head attention masks."""

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import DictConfig, open_dict

from fairseq import checkpoint_utils
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..head_mask import (
    HeadMaskError,
    count_masked,
    head_mask_to_spec,
    parse_head_mask,
    validate_spec_syntax,
)
from ..masked_multihead_attention import head_layout, install_masked_attention, set_head_mask
from ..shrink import rebuild_pruned

logger = logging.getLogger(__name__)

TASK_NAME = "fairseq-headprune"


def exit_with_error(message: str) -> None:
    """End a command-line run with one line on stderr and exit status 1."""
    raise SystemExit(f"fairseq-headprune: error: {message}")


@dataclass
class HeadPruneConfig(TranslationConfig):
    head_mask: Optional[str] = field(
        default=None,
        metadata={
            "help": "heads to mask: space-separated TYPE:LAYERS:HEADS terms, "
            "TYPE one of E/enc-enc, A/enc-dec, D/dec-dec, 1-based layers and "
            "heads as lists, ranges or '*', 'keep=LIST' to mask all other "
            "heads (e.g. \"E:1:6 A:2:1,3 D:*:keep=1\"), 'none', or a "
            ".json/.tsv mask file"
        },
    )


@register_task(TASK_NAME, dataclass=HeadPruneConfig)
class HeadPruneTranslationTask(TranslationTask):
    """Translation whose models can mask any set of attention heads.

    ``build_model`` lets fairseq build the model named by ``--arch`` (or the
    checkpoint), then makes every attention module maskable and applies
    ``--head-mask``.
    """

    cfg: HeadPruneConfig

    def __init__(self, cfg: HeadPruneConfig, src_dict, tgt_dict):
        try:
            validate_spec_syntax(cfg.head_mask)
        except HeadMaskError as error:
            exit_with_error(f"--head-mask: {error}")
        super().__init__(cfg, src_dict, tgt_dict)
        self.criterion = None

    def build_criterion(self, cfg, from_checkpoint=False):
        self.criterion = super().build_criterion(cfg, from_checkpoint)
        return self.criterion

    def begin_valid_epoch(self, epoch, model):
        """Save the importance that ``headprune_importance`` gathered this epoch."""
        super().begin_valid_epoch(epoch, model)
        save_dir = getattr(self.criterion, "importance_save_dir", None)
        if save_dir:
            _save_epoch_importance(self.criterion, save_dir, epoch)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        install_masked_attention(model)
        try:
            removed = rebuild_pruned(model, cfg)
        except HeadMaskError as error:
            exit_with_error(f"pruned checkpoint: {error}")
        if removed:
            logger.info("model with heads removed: %s", removed)
        if self.cfg.head_mask is not None:
            try:
                head_mask = parse_head_mask(self.cfg.head_mask, head_layout(model))
            except HeadMaskError as error:
                exit_with_error(f"--head-mask: {error}")
            if count_masked(head_mask):
                set_head_mask(model, head_mask)
            logger.info(
                "masking %d heads: %s", count_masked(head_mask), head_mask_to_spec(head_mask)
            )
        return model


def _save_epoch_importance(criterion, save_dir: str, epoch: int) -> None:
    from fairseq.distributed import utils as distributed_utils

    from ..criterions.headprune_importance import importance_from_meters
    from ..importance import ImportanceResult, write_importance_json, write_importance_tsv

    if distributed_utils.get_global_rank() != 0:
        return  # every worker holds the same all-reduced sums
    found = importance_from_meters(metrics.get_meters("train") or {})
    if found is None:
        return
    scores, count = found
    result = ImportanceResult(
        importance=scores,
        granularity=criterion.importance_granularity,
        count=count,
        settings={"source": "fairseq-train", "epoch": epoch, "loss": criterion.importance_loss},
    )
    prefix = os.path.join(save_dir, f"importance_epoch{epoch}")
    write_importance_json(result, prefix + ".json")
    write_importance_tsv(result, prefix + ".tsv")
    logger.info("wrote head importance of epoch %d to %s.{json,tsv}", epoch, prefix)


def _select_task_from_overrides(load_checkpoint_to_cpu):
    """Wrap fairseq's checkpoint reader so ``--task fairseq-headprune`` is honoured.

    fairseq-validate builds the task saved in the checkpoint and passes the
    command line only as overrides of that task's existing fields, so for a
    checkpoint trained with ``--task translation`` it would silently drop
    ``--head-mask``.  Old-format checkpoints take every override already; for
    new-format ones we switch the saved task to ours when the overrides ask
    for it.  Nothing changes for any other call.
    """

    @functools.wraps(load_checkpoint_to_cpu)
    def wrapper(path, arg_overrides=None, *args, **kwargs):
        state = load_checkpoint_to_cpu(path, arg_overrides, *args, **kwargs)
        overrides = arg_overrides or {}
        saved_cfg = state.get("cfg")
        task_cfg = saved_cfg.get("task") if saved_cfg is not None else None
        if (
            overrides.get("task") == TASK_NAME
            and isinstance(task_cfg, DictConfig)
            and task_cfg.get("_name") != TASK_NAME
        ):
            with open_dict(task_cfg):
                task_cfg._name = TASK_NAME
                task_cfg.head_mask = overrides.get("head_mask")
        return state

    wrapper._headprune_wrapped = True
    return wrapper


if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_headprune_wrapped", False):
    checkpoint_utils.load_checkpoint_to_cpu = _select_task_from_overrides(
        checkpoint_utils.load_checkpoint_to_cpu
    )
