"""Remove heads and FFN neurons for real from a checkpoint file (Michel et al. section 4.3).

The masked heads and neurons are sliced out of the state dict
(``state_dict``) and recorded in the model's config as mask specs
(``headprune_pruned_heads``, ``headprune_pruned_neurons``), so that the task
rebuilds the smaller model (``modules.pruned_heads``) before fairseq loads
the weights. The masks come as mask objects, parsed where their specs are
read (the ``shrink`` command, against ``shrink_layouts``; a stage's record).
"""

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_headprune.constants import NO_MASK_SPEC
from fairseq_headprune.engine.checkpoints.info import (
    lazy_checkpoint_state,
    load_checkpoint_state,
    model_config_object,
    state_ffn_layout,
    state_head_layout,
)
from fairseq_headprune.engine.checkpoints.layers import drop_state_layers, state_depths
from fairseq_headprune.engine.checkpoints.state_dict import (
    fold_tuning_into_state,
    shrink_ffn_state_dict,
    shrink_state_dict,
    state_ffn_parameter_counts,
    state_parameter_counts,
)
from fairseq_headprune.errors import CheckpointError, HeadMaskError, SettingsError
from fairseq_headprune.modules.model_config import (
    FFN_MASK_KEY,
    HEAD_MASK_KEY,
    PRUNED_HEADS_KEY,
    PRUNED_NEURONS_KEY,
    config_value,
    record_config_value,
)
from fairseq_headprune.modules.pruned_heads import pruned_heads_of
from fairseq_headprune.study.masks.ffn_mask import NEURONS, FfnLayout, FfnMask, ffn_mask_to_spec, parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import (
    HEADS,
    HeadLayout,
    HeadMask,
    check_mask_layout,
    combine_masks,
    count_masked,
    head_mask_to_spec,
    parse_head_mask,
    same_units_masked,
)
from fairseq_headprune.study.masks.layer_drop import LayerDrop, checked_layer_drop, layer_drop_to_spec
from fairseq_headprune.study.output.files import atomic_path
from fairseq_headprune.study.search.tuning import read_tuning


def parameter_report(before: Dict[str, int], after: Dict[str, int]) -> List[str]:
    """TSV lines: part, parameters before, after, fraction removed."""
    lines = ["part\tbefore\tafter\tremoved"]
    for part in list(before):
        removed = 1.0 - after[part] / before[part] if before[part] else 0.0
        lines.append(f"{part}\t{before[part]}\t{after[part]}\t{removed:.1%}")
    return lines


@dataclass
class ShrinkOutcome:
    """What ``shrink_checkpoint`` removed and how much smaller the model got."""

    heads_pruned: int  # heads removed
    heads_total: int  # heads the model had
    spec: str  # the removed heads, as recorded in the new checkpoint
    recorded: Optional[str]  # the mask the checkpoint had been fine-tuned with, removed too
    report: List[str]  # TSV lines: part, parameters before, after, fraction removed
    neurons_pruned: int = 0  # FFN neurons removed
    neurons_total: int = 0
    ffn_spec: Optional[str] = None  # the removed neurons, as recorded
    recorded_neurons: Optional[str] = None  # the neuron mask it had been fine-tuned with, removed too
    dropped_layers: Optional[str] = None  # the whole layers removed (a layer-drop spec of the input's layers)
    depths: Optional[Dict[str, List[int]]] = None  # stack -> [layers before, after]


def checkpoint_parameters(path: str) -> int:
    """Parameters of a checkpoint (shared embeddings counted once)."""
    return _total_parameters(load_checkpoint_state(path))


def _total_parameters(state) -> int:
    """Parameters of a loaded checkpoint (shared embeddings counted once)."""
    return int(state_parameter_counts(state["model"], state_head_layout(state))["total"])


def shrink_layouts(path: str) -> Tuple[Dict[str, int], HeadLayout, FfnLayout]:
    """What the masks of a shrink of ``path`` are parsed against (read lazily): its depths (stack -> layers), head
    layout and FFN layout; a checkpoint with units removed already is refused, as ``shrink_checkpoint`` refuses it.
    Masks that go with layers to drop number the layers that stay (``layer_drop.layout_after_drop``)."""
    state = lazy_checkpoint_state(path)
    _refuse_removed(path, _config_of(path, state))
    return state_depths(state), state_head_layout(state), state_ffn_layout(state)


def _config_of(path: str, state):
    config = model_config_object(state)
    if config is None:
        raise CheckpointError(f"{path} has no model config (neither cfg nor args)")
    return config


def _refuse_removed(path: str, config) -> None:
    for what, previous in (("heads", pruned_heads_of(config)),
                           ("FFN neurons", config_value(config, PRUNED_NEURONS_KEY))):
        if previous:
            raise CheckpointError(
                f"{path} already has {what} removed ({previous}); shrink the original checkpoint "
                "with everything to remove at once"
            )


def shrink_checkpoint(path: str, out: str, head_mask: Optional[HeadMask] = None, tuning_file: Optional[str] = None,
                      ffn_mask: Optional[FfnMask] = None, drop_layers: Optional[LayerDrop] = None) -> ShrinkOutcome:
    """Write ``out``: ``path`` with the heads ``head_mask`` masks and the FFN neurons ``ffn_mask`` masks (and those
    it recorded) removed.

    ``drop_layers`` (stack -> 0-based layers, ``layer_drop.parse_layer_drop``):
    whole layers removed first (``checkpoints.layers``); ``head_mask`` and
    ``ffn_mask`` then are masks of the layers that stay.

    ``tuning_file`` (``search --tune-masks``): its scales and bias corrections
    are folded into the output projections first, and its mask is removed
    (``head_mask``, if given too, must be the same mask).
    """
    if os.path.exists(out) and os.path.samefile(out, path) or os.path.abspath(out) == os.path.abspath(path):
        raise SettingsError(f"the output file {out} is the input checkpoint; write the pruned model elsewhere",
                            setting="out")
    if head_mask is None and tuning_file is None and ffn_mask is None and drop_layers is None:
        raise SettingsError("give the head mask SPEC, the FFN mask SPEC, the layers to drop SPEC or the tuning file "
                            "FILE (its mask)",
                            setting=("head_mask", "ffn_mask", "drop_layers", "tuning"))
    if drop_layers is not None and tuning_file is not None:
        raise SettingsError("the layers to drop with the tuning file: the tuning numbers the layers of the model it "
                            "was tuned on; remove the layers first, then search and tune on the shallower model",
                            setting=("drop_layers", "tuning"))
    state = load_checkpoint_state(path)
    config = _config_of(path, state)
    parameters_before = None
    if drop_layers is not None:
        parameters_before = _total_parameters(state)
        depths = state_depths(state)
        drop_layers = checked_layer_drop(drop_layers, depths)
        drop_state_layers(state, drop_layers)
        after = state_depths(state)
        dropped_spec = layer_drop_to_spec(drop_layers)
        drop_depths = {s: [depths[s], after[s]] for s in depths}
    _refuse_removed(path, config)
    layout = state_head_layout(state)
    neuron_layout = state_ffn_layout(state)
    for mask, mask_layout, kind in ((head_mask, layout, HEADS), (ffn_mask, neuron_layout, NEURONS)):
        if mask is not None:
            check_mask_layout(mask, mask_layout, kind)
    before = state_parameter_counts(state["model"], layout)
    before.update(state_ffn_parameter_counts(state["model"], neuron_layout))
    outcome = ShrinkOutcome(heads_pruned=0, heads_total=sum(layers * heads for layers, heads in layout.values()),
                            spec=NO_MASK_SPEC, recorded=None, report=[])
    if drop_layers is not None:
        outcome.dropped_layers, outcome.depths = dropped_spec, drop_depths
        # the parts below count the layers that stay; the total counts the removed layers too
        before["total"] = parameters_before
    tuning = None
    if tuning_file is not None:
        tuning = read_tuning(tuning_file, layout, neuron_layout)
        head_mask, ffn_mask = _tuned_masks(tuning, tuning_file, head_mask, ffn_mask)
        for what, recorded in (("heads", config_value(config, HEAD_MASK_KEY)),
                               ("FFN neurons", config_value(config, FFN_MASK_KEY))):
            if recorded:
                raise CheckpointError(f"{path} was fine-tuned with {what} masked ({recorded}); "
                                      "tune its masks with those units masked")
        fold_tuning_into_state(state["model"], tuning)
    if head_mask is not None:
        _remove_heads(state, config, layout, head_mask, outcome)
    if ffn_mask is not None:
        _remove_neurons(state, config, neuron_layout, ffn_mask, outcome)
    after = state_parameter_counts(state["model"], layout)
    after.update(state_ffn_parameter_counts(state["model"], neuron_layout))
    before["total"], after["total"] = before.pop("total"), after.pop("total")  # the total last
    if ffn_mask is None and tuning is None:  # heads only: the report counts attention alone
        for counts in (before, after):
            for ffn_type in neuron_layout:
                counts.pop(ffn_type, None)
    outcome.report = parameter_report(before, after)
    # optimizer moments have the old shapes: fine-tune with --reset-optimizer
    state["last_optimizer_state"] = None
    with atomic_path(out) as temporary:
        torch.save(state, temporary)
    return outcome


def _tuned_masks(tuning, tuning_file, head_mask, ffn_mask):
    """The head and neuron masks to remove with ``tuning``: its masks (a given mask must be the same mask)."""
    if head_mask is not None and not same_units_masked(head_mask, tuning.head_mask):
        raise HeadMaskError(f"the head mask {head_mask_to_spec(head_mask)!r} is not the mask {tuning_file} was "
                            f"tuned for ({tuning.spec})", setting="head_mask")
    if ffn_mask is not None and not same_units_masked(ffn_mask, tuning.ffn_mask, NEURONS):
        tuned_neurons = tuning.ffn_spec if tuning.ffn_mask is not None else NO_MASK_SPEC
        raise HeadMaskError(f"the FFN mask {ffn_mask_to_spec(ffn_mask)!r} is not the neuron mask {tuning_file} was "
                            f"tuned for ({tuned_neurons})", setting="ffn_mask")
    head_mask = tuning.head_mask if count_masked(tuning.head_mask) else None
    ffn_mask = tuning.ffn_mask if tuning.ffn_mask is not None and count_masked(tuning.ffn_mask) else None
    return head_mask, ffn_mask


def _remove_heads(state, config, layout, head_mask: HeadMask, outcome: ShrinkOutcome) -> None:
    recorded = config_value(config, HEAD_MASK_KEY)
    if recorded:
        # a model fine-tuned with heads masked: those heads go too, and the record with them
        head_mask = combine_masks(parse_head_mask(recorded, layout), head_mask)
    if count_masked(head_mask) == 0:
        raise HeadMaskError(f"the head mask {head_mask_to_spec(head_mask)!r} removes no head", setting="head_mask")
    shrink_state_dict(state["model"], head_mask)
    outcome.spec = head_mask_to_spec(head_mask)
    outcome.heads_pruned, outcome.recorded = count_masked(head_mask), recorded
    record_config_value(config, PRUNED_HEADS_KEY, outcome.spec)
    if recorded:
        record_config_value(config, HEAD_MASK_KEY, None)


def _remove_neurons(state, config, ffn_layout, ffn_mask: FfnMask, outcome: ShrinkOutcome) -> None:
    recorded = config_value(config, FFN_MASK_KEY)
    if recorded:  # fine-tuned with neurons masked: they go too
        ffn_mask = combine_masks(parse_ffn_mask(recorded, ffn_layout), ffn_mask)
    if count_masked(ffn_mask) == 0:
        raise HeadMaskError(f"the FFN mask {ffn_mask_to_spec(ffn_mask)!r} removes no neuron", setting="ffn_mask")
    shrink_ffn_state_dict(state["model"], ffn_mask)
    outcome.ffn_spec = ffn_mask_to_spec(ffn_mask)
    outcome.neurons_pruned, outcome.recorded_neurons = count_masked(ffn_mask), recorded
    outcome.neurons_total = sum(layers * width for layers, width in ffn_layout.values())
    record_config_value(config, PRUNED_NEURONS_KEY, outcome.ffn_spec)
    if recorded:
        record_config_value(config, FFN_MASK_KEY, None)
