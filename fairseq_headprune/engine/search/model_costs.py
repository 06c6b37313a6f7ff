"""What a model costs by its shape: its architecture as cost tables record it, FLOPs per token, precision, device.

A latency table or a FLOPs count is valid only for the model shape, the
parameters' type and the device it was made for; these are the records both
keep and check (``study.search.costs``).
"""

from typing import Dict, Tuple

import torch

from fairseq_headprune.engine.timing.isolated import cpu_model_and_flags
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_ffn import ffn_layers, ffn_layout
from fairseq_headprune.modules.masked_multihead_attention import attention_modules, head_layout
from fairseq_headprune.study.search.costs import (
    DecodingShape,
    LayerCosts,
    decoding_flops_costs,
    ffn_flops_costs,
    flops_costs,
    merge_costs,
)


def model_architecture(model) -> Dict[str, object]:
    """What a latency table must match: heads per layer and dimensions of each attention type; FFN shapes.

    ``ffn``: per FFN type [layers, neurons, model dimension], left out when
    a type's layers differ in width (neurons removed by ``shrink``).
    """
    layout = head_layout(model)
    dims = {}
    for (attention_type, _), module in attention_modules(model).items():
        dims.setdefault(attention_type, [int(module.out_proj.out_features), int(module.head_dim)])
    architecture = {"layout": {t: list(shape) for t, shape in layout.items()}, "dims": dims}
    try:
        widths = ffn_layout(model)
    except HeadMaskError:
        return architecture
    layers = ffn_layers(model)
    architecture["ffn"] = {t: [layers_count, neurons, int(layers[(t, 0)].fc1.in_features)]
                           for t, (layers_count, neurons) in widths.items()}
    return architecture


def model_flops(model, architecture, sequence_length: int, parts=("heads", "ffn")) -> LayerCosts:
    """FLOPs per token of the model's attention layers (``heads``) and FFN layers (``ffn``)."""
    costs = []
    if "heads" in parts:
        costs.append(flops_costs(head_layout(model), {t: tuple(d) for t, d in architecture["dims"].items()},
                                 sequence_length))
    if "ffn" in parts and "ffn" in architecture:
        costs.append(ffn_flops_costs(*_ffn_shapes(architecture)))
    return merge_costs(*costs)


def _ffn_shapes(architecture) -> Tuple[Dict[str, Tuple[int, int]], Dict[str, int]]:
    """The FFN layout (layers, neurons per type) and each type's model dimension, as ``model_architecture`` holds
    them."""
    shapes = architecture.get("ffn", {})
    return {t: tuple(s[:2]) for t, s in shapes.items()}, {t: s[2] for t, s in shapes.items()}


def model_decoding_flops(model, architecture, shape: DecodingShape, parts=("heads", "ffn")) -> LayerCosts:
    """Per-sentence decoding FLOPs of a translation model's attention layers (``heads``) and FFN layers (``ffn``)
    in beam search of ``shape`` (``search_costs.decoding_flops_costs``)."""
    dims = {t: tuple(d) for t, d in architecture["dims"].items()} if "heads" in parts else {}
    layout = head_layout(model) if "heads" in parts else {}
    ffn_layout_, embed_dims = _ffn_shapes(architecture) if "ffn" in parts else ({}, {})
    return decoding_flops_costs(layout, dims, ffn_layout_, embed_dims, shape)


def model_precision(model) -> str:
    """The parameters' type, as a latency table records it (``float32``, ``float16`` ...)."""
    return str(next(model.parameters()).dtype).replace("torch.", "")


def device_description(device: torch.device) -> str:
    """The device a latency table holds for: the GPU's name, or the CPU's model and threads."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {cpu_model_and_flags()[0]}, {torch.get_num_threads()} threads"
