"""``compensation``: how much each head's weights moved between two checkpoints (Budhraja et al. 2020, Figure 2)."""

from typing import Optional

from fairseq_headprune.engine.checkpoints.in_projections import compared_checkpoints
from fairseq_headprune.study.budhraja.compensation import Compensation, measure_compensation
from fairseq_headprune.study.masks.head_mask import parse_head_mask


def checkpoint_compensation(before: str, after: str, pruned_spec: Optional[str] = None) -> Compensation:
    """Both change measures per head from ``before`` (the start) to ``after`` (fine-tuned).

    The pruned heads are ``pruned_spec`` (a spec or mask file), else the mask
    ``after`` was fine-tuned with (recorded in its config), else none.
    """
    layout, old, new, recorded = compared_checkpoints(before, after)
    spec = pruned_spec if pruned_spec is not None else recorded
    pruned = parse_head_mask(spec, layout) if spec else None
    return measure_compensation(old, new, layout, pruned)
