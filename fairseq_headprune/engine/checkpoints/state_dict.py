"""A fairseq Transformer's state dict changed in place: heads and FFN neurons sliced out, tuned scales folded in.

Works on the tensors alone (no model, no dictionaries), for ``shrink`` and
for counting parameters. Which tensors a unit owns (``HEAD_PARAMETERS``,
``NEURON_PARAMETERS``: their names are the keys after a layer's prefix) and
how they are sliced is ``modules.unit_weights``'s, as for the built model,
the masked modules and the export; this module knows only the prefixes.
"""

from typing import Dict

import torch

from fairseq_headprune.modules.unit_weights import (
    HEAD_PARAMETERS,
    NEURON_PARAMETERS,
    UnitParameters,
    folded_tuning,
    kept_units,
    owned_tensors,
    unit_index,
)
from fairseq_headprune.study.masks.ffn_mask import FfnMask
from fairseq_headprune.study.masks.head_mask import HeadMask
from fairseq_headprune.study.search.tuning import MaskTuning

_MODULE_PREFIXES = {
    "enc-enc": "encoder.layers.{}.self_attn.",
    "enc-dec": "decoder.layers.{}.encoder_attn.",
    "dec-dec": "decoder.layers.{}.self_attn.",
}


# RoBERTa's encoder layers sit one level deeper, under "decoder" in checkpoints released
# before fairseq renamed it (roberta.large.mnli; fairseq renames it on load)
_SENTENCE_ENCODER_PREFIXES = ("encoder.sentence_encoder.layers.", "decoder.sentence_encoder.layers.")


def module_prefixes(weights: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """State-dict key prefix of each attention type's layer N (``.format(N)``)."""
    for prefix in _SENTENCE_ENCODER_PREFIXES:
        if any(key.startswith(prefix) for key in weights):
            return dict(_MODULE_PREFIXES, **{"enc-enc": prefix + "{}.self_attn."})
    return _MODULE_PREFIXES


def unpack_in_proj(weights: Dict[str, torch.Tensor], prefix: str) -> None:
    """Old checkpoints pack q, k, v into in_proj_*; split them as fairseq does on load."""
    for kind in ("weight", "bias"):
        packed = weights.pop(prefix + "in_proj_" + kind, None)
        if packed is not None:
            for name, part in zip(("q_proj.", "k_proj.", "v_proj."), packed.chunk(3, dim=0)):
                weights[prefix + name + kind] = part.clone()


def shrink_units_state(weights: Dict[str, torch.Tensor], masks: Dict[str, torch.Tensor], prefixes: Dict[str, str],
                       owner: UnitParameters) -> None:
    """Slice the masked units out of a state dict, in place: in each layer of each type in ``masks``, the
    tensors ``owner`` says a unit owns (keys after the layer's ``prefixes``), narrowed to the kept units."""
    for unit_type, mask in masks.items():
        for layer, layer_mask in enumerate(mask):
            prefix = prefixes[unit_type].format(layer)
            unpack_in_proj(weights, prefix)  # an old checkpoint's packed q, k, v (an FFN has none)
            input_rows = weights[prefix + owner.input_projections[0] + ".weight"].size(0)
            width = owner.width_in_state(input_rows, layer_mask.numel(), f"{unit_type} layer {layer + 1}")
            index = unit_index(kept_units(layer_mask), width)
            narrowed = owned_tensors(lambda name: weights.get(prefix + name), owner, index)
            weights.update({prefix + name: tensor for name, tensor in narrowed.items()})


def shrink_state_dict(weights: Dict[str, torch.Tensor], head_mask: HeadMask) -> None:
    """Slice the masked heads out of a fairseq Transformer state dict, in place."""
    shrink_units_state(weights, head_mask, module_prefixes(weights), HEAD_PARAMETERS)


def unique_parameter_count(tensors) -> int:
    """Elements of distinct tensors (shared embeddings counted once)."""
    seen, total = set(), 0
    for tensor in tensors:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    return total


def state_parameter_counts(weights: Dict[str, torch.Tensor], layout) -> Dict[str, int]:
    """Attention-projection parameters per type and the model total, from a state dict."""
    counts = {}
    type_prefixes = module_prefixes(weights)
    for attention_type, (layers, _) in layout.items():
        prefixes = tuple(type_prefixes[attention_type].format(layer) for layer in range(layers))
        counts[attention_type] = sum(
            tensor.numel() for key, tensor in weights.items() if key.startswith(prefixes)
        )
    counts["total"] = unique_parameter_count(
        tensor
        for key, tensor in weights.items()
        # buffers fairseq keeps in the state dict are no parameters
        if tensor.is_floating_point() and not key.endswith((".version", "_float_tensor"))
    )
    return counts


def fold_tuning_into_state(weights: Dict[str, torch.Tensor], tuning: MaskTuning) -> None:
    """The scales and corrections written into a state dict's ``out_proj`` and ``fc2`` (before ``shrink``)."""
    attention_prefixes, neuron_prefixes = module_prefixes(weights), ffn_prefixes(weights)
    for (layer_type, layer), values in tuning.layers.items():
        if layer_type in neuron_prefixes:
            prefix = neuron_prefixes[layer_type].format(layer) + NEURON_PARAMETERS.output_projection + "."
        else:
            prefix = attention_prefixes[layer_type].format(layer) + HEAD_PARAMETERS.output_projection + "."
        weight, bias = folded_tuning(weights[prefix + "weight"], weights.get(prefix + "bias"), values.scales,
                                     values.bias)
        weights[prefix + "weight"] = weight
        if bias is not None:
            weights[prefix + "bias"] = bias


def ffn_prefixes(weights: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """State-dict key prefix of each FFN type's layer N (``.format(N)``)."""
    encoder = "encoder.layers.{}."
    for prefix in _SENTENCE_ENCODER_PREFIXES:
        if any(key.startswith(prefix) for key in weights):
            encoder = prefix + "{}."
    return {"enc-ffn": encoder, "dec-ffn": "decoder.layers.{}."}


def shrink_ffn_state_dict(weights: Dict[str, torch.Tensor], ffn_mask: FfnMask) -> None:
    """Slice the masked neurons out of a state dict, in place: their fc1 rows and biases, their fc2 columns."""
    shrink_units_state(weights, ffn_mask, ffn_prefixes(weights), NEURON_PARAMETERS)


def state_ffn_parameter_counts(weights: Dict[str, torch.Tensor], layout) -> Dict[str, int]:
    """FFN parameters (fc1 and fc2) per FFN type, from a state dict."""
    prefixes = ffn_prefixes(weights)
    linears = NEURON_PARAMETERS.input_projections + (NEURON_PARAMETERS.output_projection,)
    counts = {}
    for ffn_type, (layers, _) in layout.items():
        starts = tuple(prefixes[ffn_type].format(layer) + linear + "." for layer in range(layers) for linear in linears)
        counts[ffn_type] = sum(tensor.numel() for key, tensor in weights.items() if key.startswith(starts))
    return counts
