"""Whole layers removed from a checkpoint, or from a loaded model for a while.

A checkpoint loses its layers through fairseq's own LayerDrop pruning
(``checkpoint_utils.prune_state_dict``, which renumbers the kept layers as
``--encoder-layers-to-keep``/``--decoder-layers-to-keep`` do at load time);
its config then records the smaller depth, so the checkpoint loads as a
plain shallower model everywhere (fairseq, the export to CTranslate2).
"""

import contextlib
import re
from typing import Any, Dict, Iterator, List, Mapping

import torch
from fairseq.checkpoint_utils import prune_state_dict

from fairseq_headprune.engine.checkpoints.info import model_config_object
from fairseq_headprune.errors import CheckpointError, HeadMaskError
from fairseq_headprune.modules.model_config import (
    FFN_MASK_KEY,
    HEAD_MASK_KEY,
    PRUNED_HEADS_KEY,
    PRUNED_NEURONS_KEY,
    config_value,
    record_config_value,
)
from fairseq_headprune.study.masks.layer_drop import STACKS, kept_layers

# encoder-decoder and decoder-only: (encoder|decoder).layers.N; RoBERTa: encoder.sentence_encoder.layers.N
_LAYER_KEY = re.compile(r"(encoder|decoder)\.(?:sentence_encoder\.)?layers\.(\d+)\.")


def state_depths(state: Dict[str, Any]) -> Dict[str, int]:
    """stack -> number of layers, counted in the weights."""
    indices: Dict[str, set] = {}
    for key in state["model"]:
        match = _LAYER_KEY.match(key)
        if match:
            indices.setdefault(match.group(1), set()).add(int(match.group(2)))
    return {stack: max(found) + 1 for stack, found in indices.items()}


def drop_state_layers(state: Dict[str, Any], dropped: Mapping[str, List[int]]) -> None:
    """Remove ``dropped`` (stack -> 0-based layers) from a loaded checkpoint, in place."""
    config = model_config_object(state)
    if config is None:
        raise CheckpointError("the checkpoint has no model config (neither cfg nor args)")
    for what, key in (("heads removed", PRUNED_HEADS_KEY), ("FFN neurons removed", PRUNED_NEURONS_KEY),
                      ("heads masked", HEAD_MASK_KEY), ("FFN neurons masked", FFN_MASK_KEY)):
        if config_value(config, key):
            raise CheckpointError(f"the checkpoint has {what} ({config_value(config, key)}), numbered by its "
                                  "layers: remove whole layers from the checkpoint before its heads and neurons")
    depths = state_depths(state)
    kept = kept_layers({stack: list(layers) for stack, layers in dropped.items() if layers}, depths)
    for stack in dropped:
        if stack not in depths:
            raise HeadMaskError(f"the layers to drop: the model has no {stack}", setting="drop_layers")
    # fairseq's pass keeps only the listed layers of each listed stack (and drops every layer of an unlisted one)
    for stack in depths:
        record_config_value(config, f"{stack}_layers_to_keep", ",".join(str(i) for i in kept[stack]))
    state["model"] = prune_state_dict(state["model"], config)
    for stack in depths:
        record_config_value(config, f"{stack}_layers_to_keep", None)
        record_config_value(config, f"{stack}_layers", len(kept[stack]))
    state["last_optimizer_state"] = None  # the moments belong to the removed layers too


def _stacks(model) -> Dict[str, torch.nn.Module]:
    """stack -> the module holding its ``layers`` (translation, language models, RoBERTa)."""
    stacks = {}
    for stack in STACKS:
        module = getattr(model, stack, None)
        module = getattr(module, "sentence_encoder", module)
        if module is not None and isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
            stacks[stack] = module
    return stacks


def model_depths(model) -> Dict[str, int]:
    """stack -> number of layers of a loaded model."""
    return {stack: len(module.layers) for stack, module in _stacks(model).items()}


@contextlib.contextmanager
def layers_removed(model, dropped: Mapping[str, List[int]]) -> Iterator[None]:
    """The model runs without ``dropped`` (stack -> 0-based layers) inside the block, as fairseq's
    ``--*-layers-to-keep`` would build it; every layer is back afterwards."""
    stacks, saved = _stacks(model), {}
    try:
        for stack, layers in dropped.items():
            module = stacks[stack]
            saved[stack] = module.layers
            module.layers = torch.nn.ModuleList([layer for i, layer in enumerate(module.layers) if i not in layers])
            if hasattr(module, "num_layers"):
                module.num_layers = len(module.layers)
        yield
    finally:
        for stack, layers in saved.items():
            stacks[stack].layers = layers
            if hasattr(stacks[stack], "num_layers"):
                stacks[stack].num_layers = len(layers)
