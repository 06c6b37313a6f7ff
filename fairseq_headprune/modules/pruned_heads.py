"""Heads and FFN neurons removed for real from a built model: narrower projections (Michel et al. section 4.3).

A removed head loses its rows of the query, key and value projections and
its columns of the output projection; a layer that keeps no head keeps only
the output bias, so the residual path is unchanged. Which rows and
columns a unit owns is ``unit_weights``'s, as for the state dict and the
export. The tasks call
``rebuild_pruned`` so that a shrunk checkpoint's model gets its shapes back
before fairseq loads the weights. A removed FFN neuron loses its row of
``fc1`` (weight and bias) and its column of ``fc2``; an FFN with none left
outputs ``fc2``'s bias (``rebuild_pruned_neurons``).
"""

from typing import Dict, List, Optional

import torch

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_ffn import ffn_layers, ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import head_layout, install_masked_attention
from fairseq_headprune.modules.model_config import PRUNED_HEADS_KEY, PRUNED_NEURONS_KEY, config_value
from fairseq_headprune.modules.unit_weights import kept_units, unit_columns, unit_index, unit_rows
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
    index = unit_index(keep, module.head_dim, device=module.q_proj.weight.device)
    with torch.no_grad():
        for projection in (module.q_proj, module.k_proj, module.v_proj):
            projection.weight = torch.nn.Parameter(unit_rows(projection.weight.detach(), index))
            if projection.bias is not None:
                projection.bias = torch.nn.Parameter(unit_rows(projection.bias.detach(), index))
            projection.out_features = len(index)
        module.out_proj.weight = torch.nn.Parameter(unit_columns(module.out_proj.weight.detach(), index))
    module.num_heads = len(keep)
    module.embed_dim = module.head_dim * len(keep)
    module.out_proj.in_features = module.out_proj.weight.size(1)
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
    index = unit_index(keep, device=layer.fc1.weight.device)
    with torch.no_grad():
        layer.fc1.weight = torch.nn.Parameter(unit_rows(layer.fc1.weight.detach(), index))
        if layer.fc1.bias is not None:
            layer.fc1.bias = torch.nn.Parameter(unit_rows(layer.fc1.bias.detach(), index))
        layer.fc2.weight = torch.nn.Parameter(unit_columns(layer.fc2.weight.detach(), index))
    layer.fc1.out_features = layer.fc2.in_features = len(keep)


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
