"""What a head and an FFN neuron own, stated once (``modules.unit_weights``) and read alike by every path.

On a small encoder-decoder Transformer that fairseq builds in-process (random weights, biases included:
these are identities that hold for any weights): the table names fairseq's parameters; the state-dict path
removes exactly what the shrink of the built model removes, and nothing the table does not name; the masked
modules' held slices are what the shrink removes; the CTranslate2 export of the masked model is the export
of the shrunk one.
"""

import argparse
import copy

import numpy as np
import pytest
import torch

from fairseq_headprune.engine.checkpoints.state_dict import (
    ffn_prefixes,
    module_prefixes,
    shrink_ffn_state_dict,
    shrink_state_dict,
)
from fairseq_headprune.modules.masked_ffn import ffn_layers, ffn_layout, masked_neuron_slices, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import (
    head_layout,
    install_masked_attention,
    masked_head_slices,
    set_head_mask,
)
from fairseq_headprune.modules.pruned_heads import shrink_ffn_model, shrink_model
from fairseq_headprune.modules.unit_weights import HEAD_PARAMETERS, NEURON_PARAMETERS, kept_unit_scales
from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask
from fairseq_headprune.study.masks.head_mask import parse_head_mask

LAYERS, HEADS, EMBED, FFN = 2, 4, 16, 12
HEAD_SPEC = "E:1:2 A:2:* D:1:1,3"   # one head, a whole layer, two heads
NEURON_SPEC = "E:1:1-5 D:2:*"       # some neurons, a whole FFN


def build_transformer(seed=1):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    dictionary = Dictionary()
    for index in range(30):
        dictionary.add_symbol(f"w{index}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    args = argparse.Namespace(
        arch="transformer", encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_embed_dim=EMBED,
        decoder_embed_dim=EMBED, encoder_ffn_embed_dim=FFN, decoder_ffn_embed_dim=FFN,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, max_source_positions=64,
        max_target_positions=64,
    )
    ARCH_CONFIG_REGISTRY["transformer"](args)  # the architecture's own defaults for everything else
    model = ARCH_MODEL_REGISTRY["transformer"].build_model(args, task).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():  # fairseq starts some biases at 0: every value distinct instead
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return model, dictionary


@pytest.fixture(scope="module")
def models():
    """(unpruned, masked, shrunk, head mask, neuron mask, dictionary)."""
    model, dictionary = build_transformer()
    head_mask = parse_head_mask(HEAD_SPEC, head_layout(model))
    ffn_mask = parse_ffn_mask(NEURON_SPEC, ffn_layout(model))
    masked, shrunk = copy.deepcopy(model), copy.deepcopy(model)
    set_head_mask(masked, head_mask)
    set_ffn_mask(masked, ffn_mask)
    shrink_model(shrunk, head_mask)
    shrink_ffn_model(shrunk, ffn_mask)
    return model, masked, shrunk, head_mask, ffn_mask, dictionary


def test_the_table_names_the_parameters_fairseq_gives_a_head_and_a_neuron(models):
    model = models[0]
    assert HEAD_PARAMETERS.parameters == (
        ("q_proj.weight", 0), ("q_proj.bias", 0), ("k_proj.weight", 0), ("k_proj.bias", 0),
        ("v_proj.weight", 0), ("v_proj.bias", 0), ("out_proj.weight", 1))
    assert NEURON_PARAMETERS.parameters == (("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1))
    for module in install_masked_attention(model).values():
        parameters = dict(module.named_parameters())
        # every parameter of the module is a head's, but the output bias (the layer's)
        assert set(parameters) - {name for name, _ in HEAD_PARAMETERS.parameters} == {"out_proj.bias"}
        for name, dim in HEAD_PARAMETERS.parameters:
            assert parameters[name].size(dim) == HEADS * HEAD_PARAMETERS.width(module)
    for layer in ffn_layers(model).values():
        parameters = dict(layer.named_parameters())
        for name, dim in NEURON_PARAMETERS.parameters:
            assert parameters[name].size(dim) == FFN * NEURON_PARAMETERS.width(layer)


def owned_keys(weights, head_mask, ffn_mask):
    """State-dict keys the table says the masked units own, in the layers that mask some."""
    keys = set()
    for masks, prefixes, owner in ((head_mask, module_prefixes(weights), HEAD_PARAMETERS),
                                   (ffn_mask, ffn_prefixes(weights), NEURON_PARAMETERS)):
        for unit_type, mask in masks.items():
            for layer, layer_mask in enumerate(mask):
                if bool((layer_mask == 0).any()):
                    keys.update(prefixes[unit_type].format(layer) + name for name, _ in owner.parameters)
    return keys


def test_the_state_dict_path_removes_what_the_shrink_of_the_built_model_removes(models):
    model, _, shrunk, head_mask, ffn_mask, _ = models
    original = model.state_dict()
    weights = {key: tensor.clone() for key, tensor in original.items()}
    shrink_state_dict(weights, head_mask)
    shrink_ffn_state_dict(weights, ffn_mask)
    live = shrunk.state_dict()
    assert set(weights) == set(live)
    for key, tensor in live.items():
        assert torch.equal(weights[key], tensor), key
    changed = {key for key, tensor in original.items() if tensor.shape != live[key].shape}
    assert changed == owned_keys(original, head_mask, ffn_mask)
    for key in set(original) - changed:
        assert torch.equal(original[key], live[key]), key


def test_the_masked_modules_hold_what_the_shrink_removes(models):
    model, masked, shrunk, head_mask, ffn_mask, _ = models
    names = {id(parameter): name for name, parameter in masked.named_parameters()}
    live = dict(shrunk.named_parameters())
    held = set()
    for parameter, dim, index in masked_head_slices(masked) + masked_neuron_slices(masked):
        name = names[id(parameter)]
        held.add(name)
        kept = [i for i in range(parameter.size(dim)) if i not in set(index.tolist())]
        assert torch.equal(parameter.detach().index_select(dim, torch.tensor(kept, dtype=torch.long)), live[name]), name
    assert held == owned_keys(model.state_dict(), head_mask, ffn_mask)


def test_kept_units_scales_are_their_mask_values():
    assert kept_unit_scales(torch.tensor([0.0, 0.5, 1.0, 0.0]), 4) == [(1, 0.5), (2, 1.0)]
    assert kept_unit_scales(None, 3) == [(0, 1.0), (1, 1.0), (2, 1.0)]


def test_the_export_of_the_masked_model_is_the_export_of_the_shrunk_one(models):
    pytest.importorskip("ctranslate2")
    from fairseq_headprune.engine.export.ctranslate2.spec import translation_spec

    _, masked, shrunk, _, _, dictionary = models
    masked_spec, masked_heads = translation_spec(masked, dictionary, dictionary)
    shrunk_spec, shrunk_heads = translation_spec(shrunk, dictionary, dictionary)
    assert masked_heads == shrunk_heads
    masked_variables, shrunk_variables = masked_spec.variables(), shrunk_spec.variables()
    assert set(masked_variables) == set(shrunk_variables)
    for name, value in masked_variables.items():
        assert np.array_equal(np.asarray(value), np.asarray(shrunk_variables[name])), name
