"""Head masks on encoder-only fairseq models (RoBERTa with a classification head).

The model is built by fairseq itself from its registered ``roberta`` family
architectures at small dimensions (randomly initialized: these are identities
that hold for any weights). References: the same model without the plugin's
attention, with the masked heads' output-projection columns zeroed, and one
example at a time with explicit mask variables and autograd.
"""

import argparse
import copy

import pytest
import torch

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.modules.masked_multihead_attention import (
    MaskedMultiheadAttention,
    head_layout,
    install_masked_attention,
    set_head_mask,
)
from fairseq_headprune.study.masks.head_mask import full_mask, parse_head_mask

from conftest import zeroed_copy

LAYERS, HEADS = 3, 4
CLASSES = 3


def roberta_archs():
    from fairseq.models import ARCH_MODEL_REGISTRY

    return sorted(a for a, model in ARCH_MODEL_REGISTRY.items() if model.__name__ == "RobertaModel")


def build_roberta(arch="roberta_base", seed=1):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    dictionary = Dictionary()
    for index in range(40):
        dictionary.add_symbol(f"w{index}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    args = argparse.Namespace(
        arch=arch, encoder_layers=LAYERS, encoder_embed_dim=32, encoder_ffn_embed_dim=64,
        encoder_attention_heads=HEADS, max_positions=64,
    )
    ARCH_CONFIG_REGISTRY[arch](args)  # the architecture's own defaults for everything else
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    model.register_classification_head("sentence_classification_head", num_classes=CLASSES)
    return model.eval(), dictionary


def batch(dictionary, lengths=(12, 9, 7, 12), seed=2):
    """Right-padded token rows starting with <s>, as sentence_prediction builds them."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.full((len(lengths), max(lengths)), dictionary.pad())
    for row, length in enumerate(lengths):
        rows[row, 0] = dictionary.bos()
        rows[row, 1:length] = torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=generator)
    return rows


def classify(model, tokens):
    logits, _ = model(tokens, features_only=True, classification_head_name="sentence_classification_head")
    return logits


@pytest.fixture(scope="module")
def roberta():
    plain, dictionary = build_roberta()
    masked = copy.deepcopy(plain)
    install_masked_attention(masked)
    return plain, masked, dictionary


@pytest.mark.parametrize("arch", roberta_archs())
def test_every_roberta_architecture_is_maskable(arch):
    model, _ = build_roberta(arch)
    modules = install_masked_attention(model)
    assert sorted(modules) == [("enc-enc", layer) for layer in range(LAYERS)]
    assert all(isinstance(m, MaskedMultiheadAttention) for m in modules.values())
    assert head_layout(model) == {"enc-enc": (LAYERS, HEADS)}


def test_unmasked_and_all_ones_equal_plain_fairseq(roberta):
    plain, masked, dictionary = roberta
    tokens = batch(dictionary)
    assert not any(isinstance(m, MaskedMultiheadAttention) for m in plain.modules())
    with torch.no_grad():
        reference = classify(plain, tokens)
        set_head_mask(masked, None)
        assert (classify(masked, tokens) - reference).abs().max() <= 1e-5
        set_head_mask(masked, full_mask(head_layout(masked)))  # explicit xi = 1: the unfused path
        assert (classify(masked, tokens) - reference).abs().max() <= 1e-5
    set_head_mask(masked, None)


@pytest.mark.parametrize("spec", ["E:1:2", "E:2:keep=1 E:3:3-4", "E:1:*", "*:*:4"])
def test_masking_heads_equals_zeroing_their_output_projection_columns(roberta, spec):
    plain, masked, dictionary = roberta
    tokens = batch(dictionary)
    head_mask = parse_head_mask(spec, head_layout(masked))
    zeroed = zeroed_copy(plain, head_mask)
    set_head_mask(masked, head_mask)
    try:
        with torch.no_grad():
            result = classify(masked, tokens)
            reference = classify(zeroed, tokens)
            unmasked = classify(plain, tokens)
    finally:
        set_head_mask(masked, None)
    assert (result - reference).abs().max() <= 1e-5
    assert (result - unmasked).abs().max() > 1e-4  # the mask did something


def test_per_example_masks_and_gradients(roberta):
    """One mask per example in a padded batch equals each example alone, values and dL/dxi."""
    _, masked, dictionary = roberta
    lengths = (12, 9, 7, 12)
    tokens = batch(dictionary, lengths)
    generator = torch.Generator().manual_seed(3)
    xi = (torch.rand(LAYERS, len(lengths), HEADS, generator=generator) > 0.3).float()
    xi[0, 1] = 0.0  # a whole layer masked for one example
    targets = torch.tensor([0, 2, 1, 1])

    def loss_of(logits, target):
        return torch.nn.functional.cross_entropy(logits, target, reduction="sum")

    batched_xi = xi.clone().requires_grad_()
    set_head_mask(masked, {"enc-enc": batched_xi})
    try:
        batched_logits = classify(masked, tokens)
        loss_of(batched_logits, targets).backward()
        for row, length in enumerate(lengths):
            alone_xi = xi[:, row].clone().requires_grad_()
            set_head_mask(masked, {"enc-enc": alone_xi})
            alone_logits = classify(masked, tokens[row:row + 1, :length])
            loss_of(alone_logits, targets[row:row + 1]).backward()
            assert (batched_logits[row] - alone_logits[0]).abs().max() <= 1e-5
            torch.testing.assert_close(batched_xi.grad[:, row], alone_xi.grad, rtol=1e-4, atol=1e-6)
    finally:
        set_head_mask(masked, None)
    assert batched_xi.grad.abs().sum() > 0


@pytest.mark.parametrize("spec, message", [
    ("A:1:1", "the model has no enc-dec attention"),
    ("D:*:2", "the model has no dec-dec attention"),
    ("E:4:1", "layer"),
])
def test_specs_that_do_not_fit_an_encoder_only_model_are_refused(roberta, spec, message):
    _, masked, _ = roberta
    with pytest.raises(HeadMaskError, match=message):
        parse_head_mask(spec, head_layout(masked))
