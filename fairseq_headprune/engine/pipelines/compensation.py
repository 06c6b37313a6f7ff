"""``compensation``: how much each head's weights moved between two checkpoints (Budhraja et al. 2020, Figure 2)."""

from typing import Optional

from fairseq_headprune.engine.checkpoints.in_projections import compared_checkpoints
from fairseq_headprune.study.budhraja.compensation import Compensation, measure_compensation
from fairseq_headprune.study.masks.head_mask import HeadMask, check_mask_layout, parse_head_mask


def checkpoint_compensation(before: str, after: str, pruned: Optional[HeadMask] = None) -> Compensation:
    """Both change measures per head from ``before`` (the start) to ``after`` (fine-tuned).

    The pruned heads are ``pruned`` (a mask of their layout), else the mask
    ``after`` was fine-tuned with (recorded in its config), else none.
    """
    layout, old, new, recorded = compared_checkpoints(before, after)
    if pruned is not None:
        check_mask_layout(pruned, layout)
    elif recorded:
        pruned = parse_head_mask(recorded, layout)
    return measure_compensation(old, new, layout, pruned)
