"""Remove heads for real from a checkpoint file (Michel et al. section 4.3).

The masked heads are sliced out of the state dict (``state_dict``) and
recorded in the model's config as a head-mask spec
(``headprune_pruned_heads``), so that the task rebuilds the smaller model
(``modules.pruned_heads``) before fairseq loads the weights.
"""

import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from ...errors import CheckpointError, HeadMaskError, SettingsError
from ...modules.model_config import HEAD_MASK_KEY, PRUNED_HEADS_KEY, config_value, record_config_value
from ...modules.pruned_heads import pruned_heads_of
from ...study.masks.head_mask import combine_masks, count_masked, head_mask_to_spec, parse_head_mask
from ...study.methods.mask_tuning import read_tuning
from ...study.output.files import atomic_path
from .info import load_checkpoint_state, model_config_object, state_head_layout
from .state_dict import fold_tuning_into_state, shrink_state_dict, state_parameter_counts


def parameter_report(before: Dict[str, int], after: Dict[str, int]) -> List[str]:
    """TSV lines: part, parameters before, after, fraction removed."""
    lines = ["part\tbefore\tafter\tremoved"]
    for part in list(before):
        removed = 1.0 - after[part] / before[part] if before[part] else 0.0
        lines.append(f"{part}\t{before[part]}\t{after[part]}\t{removed:.1%}")
    return lines


# ---- on a checkpoint's state dict (no dictionaries needed) -------------------


# ---- a whole checkpoint -------------------------------------------------------


@dataclass
class ShrinkOutcome:
    """What ``shrink_checkpoint`` removed and how much smaller the model got."""

    removed: int  # heads removed
    total: int  # heads the model had
    spec: str  # the removed heads, as recorded in the new checkpoint
    recorded: Optional[str]  # the mask the checkpoint had been fine-tuned with, removed too
    report: List[str]  # TSV lines: part, parameters before, after, fraction removed


def shrink_checkpoint(path: str, out: str, spec: Optional[str], tuning_file: Optional[str] = None) -> ShrinkOutcome:
    """Write ``out``: ``path`` with the heads ``spec`` masks (and those it recorded) removed.

    ``tuning_file`` (``search --tune-masks``): its scales and bias corrections
    are folded into the output projections first, and its mask is removed
    (``spec``, if given too, must be the same mask).
    """

    if os.path.exists(out) and os.path.samefile(out, path) or os.path.abspath(out) == os.path.abspath(path):
        raise SettingsError(f"--out {out} is the input checkpoint; write the pruned model elsewhere")
    state = load_checkpoint_state(path)
    config = model_config_object(state)
    if config is None:
        raise CheckpointError(f"{path} has no model config (neither cfg nor args)")
    previous = pruned_heads_of(config)
    if previous:
        raise CheckpointError(
            f"{path} already has heads removed ({previous}); shrink the original checkpoint "
            "with every head to remove"
        )
    layout = state_head_layout(state)
    tuning = None
    if tuning_file is not None:
        tuning = read_tuning(tuning_file, layout)
        if spec is not None and head_mask_to_spec(parse_head_mask(spec, layout)) != tuning.spec:
            raise HeadMaskError(f"--head-mask {spec!r} is not the mask {tuning_file} was tuned for ({tuning.spec})")
        spec = tuning.spec
    if spec is None:
        raise SettingsError("give --head-mask SPEC, or --tuning FILE (its mask)")
    head_mask = parse_head_mask(spec, layout)
    recorded = config_value(config, HEAD_MASK_KEY)
    if recorded and tuning is not None:
        raise CheckpointError(f"{path} was fine-tuned with heads masked ({recorded}); tune its masks with those heads")
    if recorded:
        # a model fine-tuned with heads masked: those heads go too, and the record with them
        head_mask = combine_masks(parse_head_mask(recorded, layout), head_mask)
    if count_masked(head_mask) == 0:
        raise HeadMaskError(f"--head-mask {spec!r} removes no head")
    before = state_parameter_counts(state["model"], layout)
    if tuning is not None:
        fold_tuning_into_state(state["model"], tuning)
    shrink_state_dict(state["model"], head_mask)
    after = state_parameter_counts(state["model"], layout)
    removed_spec = head_mask_to_spec(head_mask)
    record_config_value(config, PRUNED_HEADS_KEY, removed_spec)
    if recorded:
        record_config_value(config, HEAD_MASK_KEY, None)
    # optimizer moments have the old shapes: fine-tune with --reset-optimizer
    state["last_optimizer_state"] = None
    with atomic_path(out) as temporary:
        torch.save(state, temporary)
    return ShrinkOutcome(
        removed=count_masked(head_mask), total=sum(layers * heads for layers, heads in layout.values()),
        spec=removed_spec, recorded=recorded, report=parameter_report(before, after),
    )
