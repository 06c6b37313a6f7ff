"""Head importance of one checkpoint, written as the importance command's files.

I_h = E_x |dL(x)/dxi_h| (Michel et al. section 4.1) on some splits, with an
optional check of the proxy: the loss increase when each head alone is masked.
"""

import os
from typing import Optional, Sequence

import torch

from fairseq_headprune.engine.families import family_of_checkpoint
from fairseq_headprune.engine.importance.head_loss import single_head_loss_increase
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask
from fairseq_headprune.study.importance.scores import ImportanceResult, write_importance_json, write_importance_tsv
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.output.plots import plot_importance
from fairseq_headprune.study.settings import ImportanceSettings


def run_importance(
    data: str,
    checkpoint: str,
    settings: ImportanceSettings,
    out_dir: str,
    head_mask: Optional[HeadMask] = None,
    loss_ablation: bool = False,
    fairseq_args: Sequence[str] = (),
    cpu: bool = False,
    progress: bool = True,
    head_mask_spec: Optional[str] = None,
) -> Optional[ImportanceResult]:
    """Estimate, write OUT/importance.{json,tsv,png} and return the result (rank 0; others None).

    ``head_mask``: heads masked besides the checkpoint's own (a mask of the model as loaded); ``head_mask_spec``:
    the text it was given as, recorded in the settings."""
    family = family_of_checkpoint(checkpoint)
    cfg, task, model = family.load_for_importance(data, checkpoint, head_mask, fairseq_args, cpu=cpu)
    estimator = family.importance_estimator(cfg, task, model, settings)
    result = estimator.estimate(None, progress=progress)  # sharded over ranks, if any
    if not current_ranks().is_main:
        return None  # rank 0 checks the proxy and writes
    if loss_ablation:
        result.loss_increase, base_loss = single_head_loss_increase(
            model, estimator.criterion, estimator.samples, current_head_mask(model), estimator.layout,
            progress=progress,
        )
        result.settings["loss_ablation_base_loss_per_token"] = base_loss
    result.settings.update(
        {
            "checkpoint": os.path.abspath(checkpoint),
            "data": os.path.abspath(data),
            "head_mask": head_mask_spec,
            "torch": torch.__version__,
        }
    )
    prefix = importance_prefix(out_dir)
    write_importance_json(result, prefix + ".json")
    write_importance_tsv(result, prefix + ".tsv")
    plot_importance(result, prefix + ".png")
    return result


def importance_prefix(out_dir: str) -> str:
    return os.path.join(out_dir, "importance")
