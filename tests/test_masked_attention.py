"""Masked multi-head attention on a real (tiny, trained) fairseq Transformer."""


import copy
import os

import pytest
import torch

from fairseq_headprune.modules.masked_multihead_attention import (
    MaskedMultiheadAttention,
    attention_modules,
    head_layout,
    set_head_mask,
)
from fairseq_headprune.study.masks.head_mask import full_mask, parse_head_mask

from conftest import zeroed_copy


def batch_of(task, count=6, split="valid"):
    task.load_dataset(split)
    dataset = task.dataset(split)
    return dataset.collater([dataset[i] for i in range(count)])


def logits(model, sample):
    net_output = model(**sample["net_input"])
    return net_output[0]


@pytest.fixture
def loaded(tiny_task_and_model):
    task, model = tiny_task_and_model
    set_head_mask(model, None)
    return task, model


def test_every_attention_module_is_masked(loaded):
    _, model = loaded
    modules = attention_modules(model)
    assert len(modules) == 6  # 2 layers x 3 attention types
    assert all(isinstance(m, MaskedMultiheadAttention) for m in modules.values())
    assert head_layout(model) == {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}


def test_unmasked_and_all_ones_equal_plain_fairseq(loaded, tiny_model):
    task, model = loaded
    sample = batch_of(task)
    from fairseq import checkpoint_utils
    from fairseq.tasks.translation import TranslationTask

    plain_task = TranslationTask(task.cfg, task.src_dict, task.tgt_dict)
    plain_models, _ = checkpoint_utils.load_model_ensemble(
        [str(tiny_model["checkpoint"])], task=plain_task
    )
    plain = plain_models[0].eval()
    assert not any(isinstance(m, MaskedMultiheadAttention) for m in plain.modules())
    with torch.no_grad():
        reference = logits(plain, sample)
        assert (logits(model, sample) - reference).abs().max() <= 1e-5
        set_head_mask(model, full_mask(head_layout(model)))  # explicit xi = 1: unfused path
        assert (logits(model, sample) - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("spec", ["E:1:3", "A:2:1,8", "D:1:keep=2 E:2:5-7", "*:*:4"])
def test_masking_a_head_equals_zeroing_its_output_projection_columns(loaded, spec):
    task, model = loaded
    sample = batch_of(task)
    head_mask = parse_head_mask(spec, head_layout(model))
    set_head_mask(model, head_mask)
    with torch.no_grad():
        masked = logits(model, sample)
    set_head_mask(model, None)
    zeroed = zeroed_copy(model, head_mask)
    with torch.no_grad():
        reference = logits(zeroed, sample)
        unmasked = logits(model, sample)
    assert (masked - reference).abs().max() <= 1e-5
    assert (masked - unmasked).abs().max() > 1e-3  # the mask did something


def test_a_layer_with_every_head_masked_outputs_only_the_bias(loaded):
    task, model = loaded
    sample = batch_of(task)
    set_head_mask(model, parse_head_mask("A:1:*", head_layout(model)))
    module = attention_modules(model)[("enc-dec", 0)]
    outputs = []
    handle = module.register_forward_hook(lambda m, i, o: outputs.append(o[0]))
    try:
        with torch.no_grad():
            logits(model, sample)
    finally:
        handle.remove()
        set_head_mask(model, None)
    expected = module.out_proj.bias.view(1, 1, -1).expand_as(outputs[0])
    assert torch.allclose(outputs[0], expected)


def per_sentence_losses(model, sample):
    """Summed token NLL per sentence (B,)."""
    net_output = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    nll = nll.masked_fill(target.eq(1), 0.0)  # padding index of fairseq dictionaries
    return nll.sum(1)


def test_per_sentence_masks_and_gradients(loaded):
    task, model = loaded
    sample = batch_of(task, count=4)
    layout = head_layout(model)
    batch = sample["target"].size(0)
    generator = torch.Generator().manual_seed(0)
    # a different random mask for each sentence, and xi in (0, 1) for gradients
    mask_values = {
        t: torch.rand(layers, batch, heads, generator=generator) for t, (layers, heads) in layout.items()
    }
    batch_mask = {t: v.clone().requires_grad_(True) for t, v in mask_values.items()}
    set_head_mask(model, batch_mask)
    losses = per_sentence_losses(model, sample)
    losses.sum().backward()

    for index in range(batch):
        one = batch_of(task, count=4)
        one = {
            "net_input": {
                "src_tokens": one["net_input"]["src_tokens"][index:index + 1],
                "src_lengths": one["net_input"]["src_lengths"][index:index + 1],
                "prev_output_tokens": one["net_input"]["prev_output_tokens"][index:index + 1],
            },
            "target": one["target"][index:index + 1],
        }
        sentence_mask = {
            t: v[:, index].clone().requires_grad_(True) for t, v in mask_values.items()
        }  # (layers, heads): shared by the batch of one
        set_head_mask(model, sentence_mask)
        loss = per_sentence_losses(model, one)
        assert torch.allclose(loss, losses[index:index + 1].detach(), atol=1e-4)
        loss.sum().backward()
        for t in layout:
            assert torch.allclose(
                sentence_mask[t].grad, batch_mask[t].grad[:, index], rtol=1e-4, atol=1e-6
            ), t
    set_head_mask(model, None)
    assert all(batch_mask[t].grad.abs().sum() > 0 for t in layout)


def beam_hypotheses(task, model, sample):
    generator = task.build_generator([model], type("Args", (), {"beam": 5})())
    with torch.no_grad():
        outputs = generator.generate([model], sample)
    return [[(h["tokens"].tolist(), round(float(h["score"]), 4)) for h in beams] for beams in outputs]


@pytest.mark.parametrize("per_sentence", [False, True])
def test_fused_attention_equals_fairseqs_unfused_path(loaded, monkeypatch, per_sentence):
    """Masked modules run F.scaled_dot_product_attention (incremental state
    included); fairseq's own unfused path gives the same logits and beams."""
    task, model = loaded
    sample = batch_of(task)
    if os.environ.get("HEADPRUNE_TEST_GPU") and torch.cuda.is_available():  # scripts/dev/gpu_check.sh
        from fairseq import utils

        model, sample = copy.deepcopy(model).cuda(), utils.move_to_cuda(sample)
    layout = head_layout(model)
    if per_sentence:  # one mask per sentence, as in batched configurations
        generator = torch.Generator().manual_seed(1)
        head_mask = {
            t: (torch.rand(layers, sample["target"].size(0), heads, generator=generator) > 0.4).float()
            for t, (layers, heads) in layout.items()
        }
    else:
        head_mask = parse_head_mask("E:1:3 A:2:1,8 D:1:keep=2 D:2:5", layout)
    for layer in model.decoder.layers:  # as fairseq-generate: no attention weights wanted
        monkeypatch.setattr(layer, "need_attn", False)
    fused_types = set()
    fused_forward = MaskedMultiheadAttention._sdpa_forward

    def counting_forward(module, *args):
        fused_types.add(module.attention_type)
        return fused_forward(module, *args)

    monkeypatch.setattr(MaskedMultiheadAttention, "_sdpa_forward", counting_forward)
    set_head_mask(model, head_mask)
    try:
        with torch.no_grad():
            fused_logits = logits(model, sample)
        fused_beams = beam_hypotheses(task, model, sample) if not per_sentence else None
        assert fused_types == {"enc-enc", "enc-dec", "dec-dec"}
        monkeypatch.setattr(MaskedMultiheadAttention, "use_sdpa", False)
        fused_types.clear()
        with torch.no_grad():
            reference_logits = logits(model, sample)
        reference_beams = beam_hypotheses(task, model, sample) if not per_sentence else None
        assert not fused_types
    finally:
        set_head_mask(model, None)
    assert (fused_logits - reference_logits).abs().max() <= 1e-5
    assert fused_beams == reference_beams
