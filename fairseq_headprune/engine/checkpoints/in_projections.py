"""The query, key and value in-projection weights of every attention layer of a checkpoint, read from its state dict.

For the compensation analysis (``study.budhraja.compensation``, Budhraja et
al. 2020, Figure 2), which compares two checkpoints of one architecture
head by head without building either model.
"""

from typing import Any, Dict, Optional

from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state, model_config_object, state_head_layout
from fairseq_headprune.engine.checkpoints.state_dict import module_prefixes, unpack_in_proj
from fairseq_headprune.errors import CheckpointError
from fairseq_headprune.modules.model_config import HEAD_MASK_KEY, PRUNED_HEADS_KEY, config_value
from fairseq_headprune.study.budhraja.compensation import InProjections
from fairseq_headprune.study.masks.head_mask import HeadLayout


def state_in_projections(state: Dict[str, Any], layout: HeadLayout, path: str) -> InProjections:
    """(type, 0-based layer) -> the q, k, v projection weights (old packed ``in_proj`` split as fairseq does)."""
    weights = dict(state["model"])
    prefixes = module_prefixes(weights)
    projections: InProjections = {}
    for attention_type, (layers, _) in layout.items():
        for layer in range(layers):
            prefix = prefixes[attention_type].format(layer)
            unpack_in_proj(weights, prefix)
            try:
                projections[(attention_type, layer)] = tuple(
                    weights[prefix + name + ".weight"].float() for name in ("q_proj", "k_proj", "v_proj"))
            except KeyError as error:
                raise CheckpointError(f"{path}: no {error.args[0]} (not a fairseq Transformer?)") from error
    return projections


def recorded_head_mask(state: Dict[str, Any]) -> Optional[str]:
    """The head-mask spec a checkpoint fine-tuned with ``--head-mask`` records (None if none)."""
    return config_value(model_config_object(state), HEAD_MASK_KEY)


def compared_checkpoints(before: str, after: str):
    """Layout and in-projections of two checkpoints of one architecture, and the mask ``after`` records.

    Refuses checkpoints whose layouts or projection shapes differ, or a
    shrunk checkpoint (its heads' rows no longer line up with the other's).
    """
    states = [load_checkpoint_state(path) for path in (before, after)]
    for path, state in zip((before, after), states):
        if config_value(model_config_object(state), PRUNED_HEADS_KEY):
            raise CheckpointError(f"{path} is shrunk (heads removed): compare the masked checkpoints instead")
    layouts = [state_head_layout(state) for state in states]
    if layouts[0] != layouts[1]:
        raise CheckpointError(f"{before} and {after} are of different architectures: "
                              f"heads {_layout_text(layouts[0])} against {_layout_text(layouts[1])}")
    projections = [state_in_projections(state, layouts[0], path) for state, path in zip(states, (before, after))]
    for key, weights in projections[0].items():
        shapes = [tuple(w.shape) for w in weights], [tuple(w.shape) for w in projections[1][key]]
        if shapes[0] != shapes[1]:
            raise CheckpointError(f"{before} and {after} are of different architectures: "
                                  f"{key[0]} layer {key[1] + 1} in-projections {shapes[0][0]} against {shapes[1][0]}")
    return layouts[0], projections[0], projections[1], recorded_head_mask(states[1])


def _layout_text(layout: HeadLayout) -> str:
    return ", ".join(f"{t} {layers}x{heads}" for t, (layers, heads) in sorted(layout.items()))
