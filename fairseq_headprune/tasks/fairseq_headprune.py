"""The ``fairseq-headprune`` task: translation with per-head attention masks."""

import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from omegaconf import DictConfig, open_dict

from fairseq import checkpoint_utils
from fairseq.logging import metrics
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..engine.checkpoint_info import HEAD_MASK_KEY, config_value, record_config_value
from ..errors import HeadPruneError, exit_with_error
from ..study.head_mask import combine_masks, count_masked, head_mask_to_spec, parse_head_mask, validate_spec_syntax
from ..modules.masked_multihead_attention import (
    head_layout,
    install_masked_attention,
    masked_head_slices,
    set_head_mask,
)
from ..engine.shrink import rebuild_pruned

logger = logging.getLogger(__name__)

TASK_NAME = "fairseq-headprune"


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
        except HeadPruneError as error:
            exit_with_error(f"--head-mask: {error}")
        super().__init__(cfg, src_dict, tgt_dict)
        self.criterion = None
        self._frozen_heads = None  # (parameter, dim, index, values) of masked heads

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
        except HeadPruneError as error:
            exit_with_error(f"pruned checkpoint: {error}")
        if removed:
            logger.info("model with heads removed: %s", removed)
        head_mask = self._head_mask(model, cfg)
        if head_mask is not None:
            set_head_mask(model, head_mask)
            spec = head_mask_to_spec(head_mask)
            record_config_value(cfg, HEAD_MASK_KEY, spec)
            logger.info("masking %d heads: %s", count_masked(head_mask), spec)
        return model

    def _head_mask(self, model, model_cfg):
        """The checkpoint's recorded mask and ``--head-mask``, combined (None: no head masked)."""
        head_mask = None
        for name, spec in (("recorded head mask", config_value(model_cfg, HEAD_MASK_KEY)),
                           ("--head-mask", self.cfg.head_mask)):
            if spec is None:
                continue
            try:
                parsed = parse_head_mask(spec, head_layout(model))
            except HeadPruneError as error:
                exit_with_error(f"{name}: {error}")
            head_mask = combine_masks(head_mask, parsed)
        if head_mask is None or count_masked(head_mask) == 0:
            return None
        return head_mask

    def optimizer_step(self, optimizer, model, update_num):
        """The optimizer's step, after which masked heads get their weights back.

        Their gradients are exactly zero (the mask multiplies their output by
        0), but decoupled weight decay and stale optimizer moments would still
        move them; restoring keeps a pruned head pruned if the mask is ever lifted.
        """
        if self._frozen_heads is None:
            unwrapped = model
            while hasattr(unwrapped, "module"):  # distributed / legacy wrappers
                unwrapped = unwrapped.module
            self._frozen_heads = [
                (parameter, dim, index, parameter.detach().index_select(dim, index).clone())
                for parameter, dim, index in masked_head_slices(unwrapped)
            ]
        super().optimizer_step(optimizer, model, update_num)
        with torch.no_grad():
            for parameter, dim, index, values in self._frozen_heads:
                parameter.index_copy_(dim, index, values.to(parameter.dtype))


def _save_epoch_importance(criterion, save_dir: str, epoch: int) -> None:
    from fairseq.distributed import utils as distributed_utils

    from ..criterions.headprune_importance import importance_from_meters
    from ..study.importance import ImportanceResult, write_importance_json, write_importance_tsv

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
