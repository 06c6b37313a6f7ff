"""FFN-neuron importance and Fisher scores against their definitions, one sentence at a time with explicit zeta.

I_i = E_x |dL(x)/dzeta_i|, F_i = E_x (dL(x)/dzeta_i)^2 for a mask variable
zeta_i on fc2's input (Kwon et al. 2022), from the same backward pass as the
heads' scores: through the headprune_importance criterion (translation) and
one zeta per example (classifiers and language models).
"""

import pytest
import torch
from test_importance import SENTENCES, criterion_scores, sentence_loss
from test_language_model import build_lm, token_rows

from fairseq_headprune.criterions.headprune_importance import HeadPruneImportanceCriterion
from fairseq_headprune.engine.importance.examples import example_importance
from fairseq_headprune.engine.importance.translation import estimate_importance
from fairseq_headprune.engine.runners.batches import split_batches
from fairseq_headprune.modules.masked_ffn import ffn_layout, install_ffn_masks, set_ffn_mask
from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask


def explicit_zeta_scores(model, losses_of, samples, power):
    """Sum over samples of |dL/dzeta|^power with one leaf zeta per FFN layer, per sample alone."""
    hooks = install_ffn_masks(model)
    layout = ffn_layout(model)
    totals = {t: torch.zeros(layers, width, dtype=torch.float64) for t, (layers, width) in layout.items()}
    for sample in samples:
        zeta = {key: torch.ones(layout[key[0]][1], requires_grad=True) for key in hooks}
        for key, hook in hooks.items():
            hook.mask = zeta[key]
        model.zero_grad()
        losses_of(model, sample).backward()
        for (ffn_type, layer), variable in zeta.items():
            totals[ffn_type][layer] += variable.grad.double().abs() ** power
    set_ffn_mask(model, None)
    return totals


def assert_relative_error(expected, actual, tolerance=1e-4):
    for ffn_type in expected:
        error = (expected[ffn_type] - actual[ffn_type]).abs().max() / expected[ffn_type].abs().max()
        assert error <= tolerance, f"{ffn_type}: relative error {error:.2e}"


@pytest.mark.parametrize("method, power", [("gradient", 1), ("fisher", 2)])
def test_translation_neuron_scores_equal_explicit_zeta_one_sentence_at_a_time(tiny_task_and_model, method, power):
    task, model = tiny_task_and_model
    set_head_mask(model, None)
    set_ffn_mask(model, None)
    dataset, batches = split_batches(task, "valid", max_sentences=8, limit=SENTENCES)
    criterion = HeadPruneImportanceCriterion(task, False, 0.1, importance_loss="nll", importance_method=method,
                                             importance_neurons=True)
    samples = [dataset.collater([dataset[i] for i in batch]) for batch in batches]
    result = estimate_importance(model, criterion, samples, len(samples), progress=False)
    assert sorted(result.neuron_importance) == ["dec-ffn", "enc-ffn"]
    assert {t: tuple(s.shape) for t, s in result.neuron_importance.items()} == ffn_layout(model)
    expected = explicit_zeta_scores(model, lambda m, s: sentence_loss(criterion, m, s),
                                    [dataset.collater([dataset[i]]) for i in range(SENTENCES)], power)
    assert_relative_error({t: v / SENTENCES for t, v in expected.items()}, result.neuron_importance)
    # the heads' scores are those of a pass that scores heads alone
    heads_only, _ = criterion_scores(task, model, "sentence", loss="nll", method=method)
    for attention_type in head_layout(model):
        assert torch.allclose(heads_only.importance[attention_type], result.importance[attention_type], rtol=1e-6)
    assert heads_only.neuron_importance is None


@pytest.mark.parametrize("method, power", [("gradient", 1), ("fisher", 2)])
def test_language_model_neuron_scores_equal_explicit_zeta_one_example_at_a_time(method, power):
    """One zeta per example in one backward pass (the classifier and LM path) against each example alone."""
    model, dictionary = build_lm()
    tokens = token_rows(dictionary, lengths=(10, 8, 10, 6))

    def summed_nll(m, sample):
        logits = m(sample["net_input"]["src_tokens"])[0]
        lprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        target = sample["net_input"]["src_tokens"][:, 1:]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return nll.masked_fill(target.eq(dictionary.pad()), 0.0).sum()

    def criterion(m, sample):
        return summed_nll(m, sample), None, None

    batch = {"net_input": {"src_tokens": tokens}, "nsentences": tokens.size(0)}
    _, count, _, neurons = example_importance(model, criterion, [batch], head_layout(model), method, neurons=True)
    assert count == tokens.size(0)
    alone = [{"net_input": {"src_tokens": tokens[row:row + 1]}, "nsentences": 1} for row in range(tokens.size(0))]
    expected = explicit_zeta_scores(model, summed_nll, alone, power)
    assert_relative_error(expected, neurons)
