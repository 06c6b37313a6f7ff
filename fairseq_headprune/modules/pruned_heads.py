"""Heads and FFN neurons removed for real from a built model: narrower projections (Michel et al. section 4.3).

A removed head loses the tensors ``unit_weights.HEAD_PARAMETERS`` says it
owns (its rows of the query, key and value projections, its columns of the
output projection); a removed FFN neuron those of ``NEURON_PARAMETERS`` (its
row of ``fc1``, weight and bias, and its column of ``fc2``). The narrowing is
``unit_weights.narrow_block``, the slicing the state dict and the export use
too. A layer that keeps no head keeps only the output bias, so the residual
path is unchanged; an FFN with no neuron left outputs ``fc2``'s bias. The
tasks call ``rebuild_pruned`` and ``rebuild_pruned_neurons`` so that a
shrunk checkpoint's model gets its shapes back before fairseq loads the
weights.
"""

from typing import Dict, List, Optional

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_ffn import ffn_layers, ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import head_layout, install_masked_attention
from fairseq_headprune.modules.model_config import PRUNED_HEADS_KEY, PRUNED_NEURONS_KEY, config_value
from fairseq_headprune.modules.unit_weights import HEAD_PARAMETERS, NEURON_PARAMETERS, kept_units, narrow_block
from fairseq_headprune.study.masks.ffn_mask import FfnMask, parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import HeadMask, parse_head_mask


def kept_heads(head_mask: HeadMask) -> Dict[str, List[List[int]]]:
    """0-based heads kept, per attention type and layer."""
    return {attention_type: [list(kept_units(layer_mask)) for layer_mask in mask]
            for attention_type, mask in head_mask.items()}


def shrink_attention(module, keep: List[int]) -> None:
    """Keep only the heads ``keep`` (0-based, original numbering) of one module; with none, only the output bias."""
    if list(keep) == list(range(module.num_heads)):
        return
    narrow_block(module, HEAD_PARAMETERS, keep)
    module.num_heads = len(keep)
    module.embed_dim = module.head_dim * len(keep)
    # the query keeps the model's width while q/k/v are narrower
    module._set_skip_embed_dim_check()


def shrink_model(model, head_mask: HeadMask) -> Dict[str, List[int]]:
    """Remove the heads ``head_mask`` masks; returns heads kept per type and layer."""
    modules = install_masked_attention(model)
    plan = kept_heads(head_mask)
    for (attention_type, layer), module in modules.items():
        if attention_type in plan:
            if module.num_heads != head_mask[attention_type].shape[1]:
                raise HeadMaskError(f"{attention_type} layer {layer + 1} is already pruned")
            shrink_attention(module, plan[attention_type][layer])
    return {t: [len(layer) for layer in plan[t]] for t in plan}


def pruned_heads_of(model_cfg) -> Optional[str]:
    """The removed-heads spec recorded in a model config (Namespace or DictConfig)."""
    return config_value(model_cfg, PRUNED_HEADS_KEY)


def rebuild_pruned(model, model_cfg) -> Optional[str]:
    """Give a freshly built full-size model the shapes its checkpoint was pruned to."""
    spec = pruned_heads_of(model_cfg)
    if not spec:
        return None
    shrink_model(model, parse_head_mask(spec, head_layout(model)))
    return spec


def shrink_ffn(layer, keep: List[int]) -> None:
    """Keep only the hidden units ``keep`` (0-based) of one layer's FFN: fc1's rows, fc2's columns."""
    if list(keep) == list(range(layer.fc1.out_features)):
        return
    narrow_block(layer, NEURON_PARAMETERS, keep)


def shrink_ffn_model(model, ffn_mask: FfnMask) -> Dict[str, List[int]]:
    """Remove the neurons ``ffn_mask`` masks; returns neurons kept per type and layer."""
    kept = {}
    for (ffn_type, layer_index), layer in ffn_layers(model).items():
        if ffn_type not in ffn_mask:
            continue
        mask = ffn_mask[ffn_type][layer_index]
        if layer.fc1.out_features != mask.numel():
            raise HeadMaskError(f"{ffn_type} layer {layer_index + 1} is already pruned")
        keep = list(kept_units(mask))
        shrink_ffn(layer, keep)
        kept.setdefault(ffn_type, []).append(len(keep))
    return kept


def rebuild_pruned_neurons(model, model_cfg) -> Optional[str]:
    """Give a freshly built full-size model the FFN widths its checkpoint was pruned to."""
    spec = config_value(model_cfg, PRUNED_NEURONS_KEY)
    if not spec:
        return None
    shrink_ffn_model(model, parse_ffn_mask(spec, ffn_layout(model)))
    return spec
