"""Head importance of one checkpoint, written as the importance command's files.

I_h = E_x |dL(x)/dxi_h| (Michel et al. section 4.1) on some splits, with an
optional check of the proxy: the loss increase when each head alone is masked.
"""

import os
from typing import Optional, Sequence

from ..study.importance import ImportanceResult, write_importance_json, write_importance_tsv
from ..study.settings import ImportanceSettings


def run_importance(
    data: str,
    checkpoint: str,
    settings: ImportanceSettings,
    out_dir: str,
    head_mask: Optional[str] = None,
    loss_ablation: bool = False,
    fairseq_args: Sequence[str] = (),
    cpu: bool = False,
    progress: bool = True,
) -> Optional[ImportanceResult]:
    """Estimate, write OUT/importance.{json,tsv,png} and return the result (rank 0; others None)."""
    import torch

    from ..modules.masked_multihead_attention import current_head_mask, head_layout, set_head_mask
    from ..study.head_mask import combine_masks
    from .loading import load_task_and_model, parse_mask_for_model
    from .ranks import current_ranks
    from .scoring import ImportanceEstimator, single_head_loss_increase

    from ..constants import TRANSLATION_FAMILY
    from .checkpoint_info import checkpoint_family
    from .scored_importance import run_example_importance

    family = checkpoint_family(checkpoint)
    if family != TRANSLATION_FAMILY:
        result = run_example_importance(family, data, checkpoint, settings, head_mask, loss_ablation, cpu, progress)
        return None if result is None else _write(result, out_dir)
    _, task, model = load_task_and_model(data, checkpoint, fairseq_args, cpu=cpu)
    layout = head_layout(model)
    base_mask = combine_masks(current_head_mask(model), parse_mask_for_model(head_mask, layout))
    set_head_mask(model, base_mask)
    estimator = ImportanceEstimator(task, model, settings)
    result = estimator.estimate(None, progress=progress)  # sharded over ranks, if any
    if not current_ranks().is_main:
        return None  # rank 0 checks the proxy and writes
    if loss_ablation:
        result.loss_increase, base_loss = single_head_loss_increase(
            model, estimator.criterion, estimator.samples, base_mask, layout, progress=progress
        )
        result.settings["loss_ablation_base_loss_per_token"] = base_loss
    result.settings.update(
        {
            "checkpoint": os.path.abspath(checkpoint),
            "data": os.path.abspath(data),
            "head_mask": head_mask,
            "torch": torch.__version__,
        }
    )
    return _write(result, out_dir)


def _write(result: ImportanceResult, out_dir: str) -> ImportanceResult:
    from ..study.plots import plot_importance

    prefix = importance_prefix(out_dir)
    write_importance_json(result, prefix + ".json")
    write_importance_tsv(result, prefix + ".tsv")
    plot_importance(result, prefix + ".png")
    return result


def importance_prefix(out_dir: str) -> str:
    return os.path.join(out_dir, "importance")
