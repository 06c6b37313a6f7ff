"""A CTranslate2 model built from a masked, tuned or shrunk fairseq Transformer's tensors.

CTranslate2 has one head count per encoder and one per decoder (its
cross-attention uses the decoder's) and splits each projection by that count,
while a pruned model keeps uneven heads per layer. Each layer's kept heads are
therefore written first and padded with zero heads (zero query/key/value rows
and biases, zero output-projection columns: a zero head adds exactly nothing)
up to the stack's largest kept count, with the head size stated explicitly.
A masked head is left out as a removed one is; a head's mask value other than
0 or 1 (a tuned scale) scales its output-projection columns. FFN widths are
read from the weights, so masked neurons are simply left out (an FFN layer
without neurons keeps one zero neuron: its output is ``fc2``'s bias). The
tensors a kept head or neuron owns, and their slicing and scaling, are
``modules.unit_weights``'s (``HEAD_PARAMETERS``, ``NEURON_PARAMETERS``), as
for the shrink and the state dict.

This builds CTranslate2's documented spec objects (``ctranslate2.specs``)
from the fairseq modules; the stock ``ct2-fairseq-converter`` rebuilds the
unpruned architecture and cannot read narrower shapes.
"""

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from fairseq_headprune.constants import LANGUAGE_MODEL_FAMILY, TRANSLATION_FAMILY
from fairseq_headprune.engine.export.base import StackHeads
from fairseq_headprune.engine.export.ctranslate2.library import import_ctranslate2
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.modules.masked_ffn import install_ffn_masks
from fairseq_headprune.modules.masked_multihead_attention import install_masked_attention
from fairseq_headprune.modules.unit_weights import (
    HEAD_PARAMETERS,
    NEURON_PARAMETERS,
    block_tensor,
    kept_unit_scales,
    owned_tensors,
    scaled_columns,
    unit_index,
)

# fairseq's --activation-fn -> CTranslate2's activation, by name
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_accurate": "GELUTanh", "gelu_fast": "GELUTanh", "swish": "SWISH"}


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _kept_heads(module) -> List[Tuple[int, float]]:
    """(head, scale) of every head the module still computes: its mask is not 0 (scale: the mask's value)."""
    mask = module.head_mask
    if mask is not None and mask.dim() != 1:
        raise SettingsError("a model holding per-sentence masks cannot be exported")
    return kept_unit_scales(mask, module.num_heads)


def _kept_weights(block, owner, kept: List[Tuple[int, float]]):
    """What the ``kept`` units (unit, scale) of ``owner`` (``HEAD_PARAMETERS`` or ``NEURON_PARAMETERS``) own
    in ``block``, as float32 on the CPU: (weight, bias) rows of each input projection in ``owner``'s order (bias
    None where it has none), and the output projection's columns multiplied by the units' scales."""
    index = unit_index([unit for unit, _ in kept], owner.width(block))

    def cpu_tensor(name):
        tensor = block_tensor(block, name)
        return None if tensor is None else tensor.detach().float().cpu()

    weights = owned_tensors(cpu_tensor, owner, index)
    inputs = [(weights[linear + ".weight"], weights.get(linear + ".bias")) for linear in owner.input_projections]
    output = scaled_columns(weights[owner.output_projection + ".weight"], [scale for _, scale in kept])
    return inputs, output


def _attention_weights(module, num_heads: int):
    """(q, k, v, out) weights and biases of the kept heads, zero-padded to ``num_heads`` heads."""
    kept = _kept_heads(module)
    inputs, out_weight = _kept_weights(module, HEAD_PARAMETERS, kept)
    padding = (num_heads - len(kept)) * module.head_dim

    def projection(weight, bias):
        bias = torch.zeros(weight.size(0)) if bias is None else bias
        weight = torch.cat([weight, torch.zeros(padding, weight.size(1))])
        bias = torch.cat([bias, torch.zeros(padding)])
        return weight.numpy(), bias.numpy()

    out_proj = HEAD_PARAMETERS.output_linear(module)
    width = out_proj.out_features
    out_weight = torch.cat([out_weight, torch.zeros(width, padding)], dim=1)
    out_bias = out_proj.bias.detach().float().cpu() if out_proj.bias is not None else torch.zeros(width)
    query, key, value = (projection(weight, bias) for weight, bias in inputs)
    return query, key, value, (out_weight.numpy(), out_bias.numpy())


def _set_linear(spec, weight: np.ndarray, bias: Optional[np.ndarray]) -> None:
    spec.weight = weight
    if bias is not None:
        spec.bias = bias


def _set_layer_norm(spec, norm) -> None:
    spec.gamma = _numpy(norm.weight)
    spec.beta = _numpy(norm.bias)


def _set_attention(spec, module, num_heads: int, self_attention: bool) -> None:
    (q, qb), (k, kb), (v, vb), (out, outb) = _attention_weights(module, num_heads)
    if self_attention:  # one fused q/k/v projection
        _set_linear(spec.linear[0], np.concatenate([q, k, v]), np.concatenate([qb, kb, vb]))
    else:  # queries from the decoder, fused keys/values from the encoder output
        _set_linear(spec.linear[0], q, qb)
        _set_linear(spec.linear[1], np.concatenate([k, v]), np.concatenate([kb, vb]))
    _set_linear(spec.linear[-1], out, outb)


def _set_ffn(spec, layer, neuron_mask) -> None:
    """fc1 and fc2 with the masked neurons left out (a mask value other than 1 scales the neuron)."""
    _set_layer_norm(spec.layer_norm, layer.final_layer_norm)
    mask = None if neuron_mask.mask is None else neuron_mask.mask.detach().float().cpu()
    fc2 = NEURON_PARAMETERS.output_linear(layer)
    kept = kept_unit_scales(mask, fc2.in_features)
    [(fc1_weight, fc1_bias)], fc2_weight = _kept_weights(layer, NEURON_PARAMETERS, kept)
    if fc1_weight.size(0) == 0:  # CTranslate2 holds no empty weight: one zero neuron, whose output adds nothing
        fc1_weight, fc2_weight = torch.zeros(1, fc1_weight.size(1)), torch.zeros(fc2_weight.size(0), 1)
        fc1_bias = None if fc1_bias is None else torch.zeros(1)
    _set_linear(spec.linear_0, fc1_weight.numpy(), None if fc1_bias is None else fc1_bias.numpy())
    _set_linear(spec.linear_1, fc2_weight.numpy(), _numpy(fc2.bias) if fc2.bias is not None else None)


def _set_input_layers(spec, module) -> None:
    positions = module.embed_positions
    weight = positions.weight if isinstance(positions, torch.nn.Embedding) else positions.weights
    spec.position_encodings.encodings = _numpy(weight)[positions.padding_idx + 1:]
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _numpy(module.embed_tokens.weight)
    spec.scale_embeddings = module.embed_scale


def _set_stack(spec, stack, heads: Dict[str, StackHeads], attention, neuron_masks, side: str) -> None:
    _set_input_layers(spec, stack)
    for index, (layer_spec, layer) in enumerate(zip(spec.layer, stack.layers)):
        ffn_type = "enc-ffn" if side == "encoder" else "dec-ffn"
        _set_ffn(layer_spec.ffn, layer, neuron_masks[(ffn_type, index)])
        self_type = "enc-enc" if side == "encoder" else "dec-dec"
        _set_attention(layer_spec.self_attention, attention[(self_type, index)], heads[side].num_heads, True)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        if side == "decoder" and getattr(layer, "encoder_attn", None) is not None:
            _set_attention(layer_spec.attention, attention[("enc-dec", index)], heads[side].num_heads, False)
            _set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
    if getattr(stack, "layer_norm", None) is not None:
        _set_layer_norm(spec.layer_norm, stack.layer_norm)
    if getattr(stack, "layernorm_embedding", None) is not None:
        _set_layer_norm(spec.layernorm_embedding, stack.layernorm_embedding)


def stack_heads(model) -> Dict[str, StackHeads]:
    """Heads kept per attention layer, grouped by the stack whose head count CTranslate2 shares."""
    heads = {"encoder": StackHeads(), "decoder": StackHeads()}
    for key, module in install_masked_attention(model).items():
        heads["encoder" if key[0] == "enc-enc" else "decoder"].kept[key] = len(_kept_heads(module))
    return heads


def _vocabulary(dictionary) -> List[str]:
    return ["<blank>" if token == "<pad>" else token for token in dictionary.symbols]


def _activation(specs, stacks):
    """CTranslate2's activation for the layers' --activation-fn (read from fairseq's layer config)."""
    names = {str(getattr(getattr(layer, "cfg", None), "activation_fn", "relu")) for stack in stacks
             for layer in stack.layers}
    unsupported = sorted(names - set(ACTIVATIONS))
    if unsupported or len(names) != 1:
        raise SettingsError(f"the model's activation function {', '.join(unsupported or sorted(names))} "
                            f"(fairseq's --activation-fn) has no CTranslate2 equivalent here (it has "
                            f"{', '.join(sorted(ACTIVATIONS))})")
    for stack in stacks:
        if getattr(stack, "embed_positions", None) is None:
            raise SettingsError("a model without positional embeddings cannot be exported to CTranslate2")
    return specs.common_spec.Activation[ACTIVATIONS[names.pop()]]


def _pre_norm(stacks) -> bool:
    """Whether the layers normalise before each block (fairseq's --*-normalize-before), alike in every stack."""
    values = {bool(layer.normalize_before) for stack in stacks for layer in stack.layers}
    if len(values) != 1:
        raise SettingsError("CTranslate2 needs the model's encoder and decoder normalized alike (fairseq's "
                            "--encoder-normalize-before and --decoder-normalize-before)")
    return values.pop()


def translation_spec(model, source_dictionary, target_dictionary):
    """(spec, heads per stack) of an encoder-decoder model: a ``ctranslate2.specs.TransformerSpec``."""
    specs = import_ctranslate2().specs
    stacks = (model.encoder, model.decoder)
    heads = stack_heads(model)
    attention, neuron_masks = install_masked_attention(model), install_ffn_masks(model)
    head_dim = next(iter(attention.values())).head_dim
    common = dict(pre_norm=_pre_norm(stacks), activation=_activation(specs, stacks),
                  layernorm_embedding=getattr(model.encoder, "layernorm_embedding", None) is not None,
                  head_dim=head_dim)
    model_cfg = getattr(model, "cfg", None)
    encoder = specs.TransformerEncoderSpec(len(model.encoder.layers), heads["encoder"].num_heads, **common)
    decoder = specs.TransformerDecoderSpec(
        len(model.decoder.layers), heads["decoder"].num_heads,
        alignment_layer=getattr(model_cfg, "alignment_layer", None) or -1,
        alignment_heads=getattr(model_cfg, "alignment_heads", None) or 0, **common)
    spec = specs.TransformerSpec(encoder, decoder)
    _set_stack(spec.encoder, model.encoder, heads, attention, neuron_masks, "encoder")
    _set_stack(spec.decoder, model.decoder, heads, attention, neuron_masks, "decoder")
    _set_linear(spec.decoder.projection, _numpy(model.decoder.output_projection.weight), None)
    spec.register_source_vocabulary(_vocabulary(source_dictionary))
    spec.register_target_vocabulary(_vocabulary(target_dictionary))
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts decoding with </s>
    spec.config.add_source_eos = True
    return spec, heads


def language_model_spec(model, dictionary, add_bos_token: bool):
    """(spec, heads per stack) of a decoder-only ``transformer_lm``: a ``TransformerDecoderModelSpec``."""
    specs = import_ctranslate2().specs
    stack = model.decoder
    heads = stack_heads(model)
    attention, neuron_masks = install_masked_attention(model), install_ffn_masks(model)
    decoder = specs.TransformerDecoderSpec(
        len(stack.layers), heads["decoder"].num_heads, pre_norm=_pre_norm([stack]),
        activation=_activation(specs, [stack]),
        layernorm_embedding=getattr(stack, "layernorm_embedding", None) is not None,
        no_final_norm=getattr(stack, "layer_norm", None) is None and _pre_norm([stack]),
        with_encoder_attention=False, head_dim=next(iter(attention.values())).head_dim,
        project_in_out=getattr(stack, "project_in_dim", None) is not None)
    spec = specs.TransformerDecoderModelSpec(decoder)
    _set_stack(spec.decoder, model.decoder, heads, attention, neuron_masks, "decoder")
    _set_linear(spec.decoder.projection, _numpy(model.decoder.output_projection.weight), None)
    for name, linear in (("project_in", model.decoder.project_in_dim), ("project_out", model.decoder.project_out_dim)):
        if linear is not None:
            _set_linear(getattr(spec.decoder, name), _numpy(linear.weight), None)
    spec.register_vocabulary(_vocabulary(dictionary))
    if not add_bos_token:
        spec.config.bos_token = spec.config.eos_token
    return spec, heads


def model_spec(family: str, cfg, task, model):
    """(spec, heads per stack): the model of ``family`` as CTranslate2 runs it (its masks and removals applied)."""
    if family == TRANSLATION_FAMILY:
        return translation_spec(model, task.source_dictionary, task.target_dictionary)
    if family == LANGUAGE_MODEL_FAMILY:
        return language_model_spec(model, task.target_dictionary, bool(getattr(cfg.task, "add_bos_token", False)))
    raise SettingsError(f"a {family.replace('_', ' ')} cannot be exported to CTranslate2, which runs "
                        "translation models and generators (language models)")
