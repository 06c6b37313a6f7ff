"""Head importance: the criterion against the definition computed independently."""

import json

import pytest
import torch

from fairseq_headprune.criterions.headprune_importance import HeadPruneImportanceCriterion
from fairseq_headprune.engine.importance.translation import estimate_importance
from fairseq_headprune.engine.runners.batches import split_batches
from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.modules.masked_multihead_attention import (
    attention_modules,
    head_layout,
    set_head_mask,
)
from fairseq_headprune.study.importance.scores import (
    ImportanceResult,
    fisher_block_terms,
    normalize_per_layer,
    read_importance_file,
    reduce_contributions,
    write_importance_json,
    write_importance_tsv,
)
from fairseq_headprune.study.masks.head_mask import parse_head_mask

SENTENCES = 24


# ---- pure functions ---------------------------------------------------------


def test_reduce_contributions_takes_the_absolute_value_where_the_granularity_says():
    # T=2 positions, B=2 sentences, H=2 heads
    contributions = torch.tensor(
        [[[1.0, -2.0], [3.0, 1.0]],
         [[-4.0, 1.0], [1.0, -5.0]]]
    )
    # sentence: |sum_t| per sentence, summed: head0 |1-4| + |3+1| = 7; head1 |-2+1| + |1-5| = 5
    assert reduce_contributions(contributions, "sentence").tolist() == [7.0, 5.0]
    # token: sum of |c|: head0 1+3+4+1 = 9; head1 2+1+1+5 = 9
    assert reduce_contributions(contributions, "token").tolist() == [9.0, 9.0]
    # batch: |sum over everything|: head0 |1+3-4+1| = 1; head1 |-2+1+1-5| = 5
    assert reduce_contributions(contributions, "batch").tolist() == [1.0, 5.0]
    with pytest.raises(ValueError, match="granularity"):
        reduce_contributions(contributions, "layer")
    # fisher squares instead: sentence (1-4)^2 + (3+1)^2 = 25, (-2+1)^2 + (1-5)^2 = 17
    assert reduce_contributions(contributions, "sentence", "fisher").tolist() == [25.0, 17.0]
    assert reduce_contributions(contributions, "token", "fisher").tolist() == [27.0, 31.0]
    with pytest.raises(ValueError, match="method"):
        reduce_contributions(contributions, "sentence", "hessian")
    # the Fisher block: sentence g = (-3, -1), (4, -4): g g^T summed = [[9+16, 3-16], [3-16, 1+16]]
    assert fisher_block_terms(contributions, "sentence").tolist() == [[25.0, -13.0], [-13.0, 17.0]]
    for granularity in ("sentence", "token", "batch"):  # its diagonal is the Fisher score
        block = fisher_block_terms(contributions, granularity)
        assert torch.equal(block.diagonal(), reduce_contributions(contributions, granularity, "fisher"))


def test_normalize_per_layer_gives_unit_l2_norm_and_keeps_zero_layers():
    scores = {"enc-enc": torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)}
    normalized = normalize_per_layer(scores)["enc-enc"]
    assert torch.allclose(normalized[0], torch.tensor([0.6, 0.8], dtype=torch.float64))
    assert normalized[1].tolist() == [0.0, 0.0]


def test_importance_files_round_trip_and_reject_another_model(tmp_path):
    result = ImportanceResult(
        importance={
            "enc-enc": torch.rand(2, 4, dtype=torch.float64),
            "dec-dec": torch.rand(2, 4, dtype=torch.float64),
        },
        granularity="token",
        count=17.0,
        settings={"subsets": ["valid"]},
        loss_increase={
            "enc-enc": torch.rand(2, 4, dtype=torch.float64),
            "dec-dec": torch.rand(2, 4, dtype=torch.float64),
        },
    )
    write_importance_json(result, str(tmp_path / "i.json"))
    write_importance_tsv(result, str(tmp_path / "i.tsv"))
    back = read_importance_file(str(tmp_path / "i.json"), {"enc-enc": (2, 4), "dec-dec": (2, 4)})
    assert back.granularity == "token" and back.count == 17.0
    for attention_type in result.importance:
        assert torch.equal(back.importance[attention_type], result.importance[attention_type])
        assert torch.equal(back.loss_increase[attention_type], result.loss_increase[attention_type])
    rows = (tmp_path / "i.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["attention_type", "layer", "head", "importance", "normalized", "loss_increase"]
    assert len(rows) == 1 + 2 * 2 * 4
    with pytest.raises(ResultFileError, match="enc-enc=2x4"):
        read_importance_file(str(tmp_path / "i.json"), {"enc-enc": (6, 16), "dec-dec": (2, 4)})
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ResultFileError, match="not a fairseq-headprune importance file"):
        read_importance_file(str(tmp_path / "bad.json"))


# ---- the criterion against plain autograd ------------------------------------


@pytest.fixture
def loaded(tiny_task_and_model):
    task, model = tiny_task_and_model
    set_head_mask(model, None)
    model.zero_grad(set_to_none=True)
    yield task, model
    set_head_mask(model, None)
    model.zero_grad(set_to_none=True)
    for parameter in model.parameters():
        parameter.requires_grad_(True)


def criterion_scores(task, model, granularity, batches=None, loss="label_smoothed", method="gradient"):
    dataset, default_batches = split_batches(task, "valid", max_sentences=8, limit=SENTENCES)
    criterion = HeadPruneImportanceCriterion(
        task, False, 0.1, importance_loss=loss, importance_granularity=granularity, importance_method=method
    )
    batches = batches or default_batches
    samples = [dataset.collater([dataset[i] for i in batch]) for batch in batches]
    return estimate_importance(model, criterion, samples, len(samples), progress=False), criterion


def sentence_loss(criterion, model, sample):
    net_output = model(**sample["net_input"])
    loss, nll_loss = criterion.compute_loss(model, net_output, sample)
    return loss if criterion.importance_loss == "label_smoothed" else nll_loss


def add_abs_xi_gradients(expected, model, modules, criterion, sample, power=None, blocks=None):
    """Add |dL/dxi_h| (``power=2``: (dL/dxi_h)^2) for ``sample``, with one explicit xi leaf variable per head;
    ``blocks``: also add the outer product g g^T of each layer's gradient vector."""
    xi = {key: torch.ones(module.num_heads, requires_grad=True) for key, module in modules.items()}
    for key, module in modules.items():
        module.head_mask = xi[key]
    sentence_loss(criterion, model, sample).backward()
    for (attention_type, layer), variable in xi.items():
        gradient = variable.grad.double()
        expected[attention_type][layer] += gradient.abs() if power is None else gradient ** power
        if blocks is not None:
            blocks[attention_type][layer] += torch.outer(gradient, gradient)


def zeros_like_layout(layout):
    return {t: torch.zeros(layers, heads, dtype=torch.float64) for t, (layers, heads) in layout.items()}


def assert_mean_matches(result, expected_sums, count):
    """The criterion's scores equal the independent sums divided by ``count``."""
    assert result.count == count
    assert_close({t: sums / count for t, sums in expected_sums.items()}, result.importance)


def assert_close(expected, actual, tolerance=1e-4):
    for attention_type in expected:
        scale = expected[attention_type].abs().max()
        error = (expected[attention_type] - actual[attention_type]).abs().max() / scale
        assert error <= tolerance, f"{attention_type}: relative error {error:.2e}"


@pytest.mark.parametrize("loss", ["label_smoothed", "nll"])
def test_sentence_level_matches_explicit_xi_one_sentence_at_a_time(loaded, loss):
    task, model = loaded
    result, criterion = criterion_scores(task, model, "sentence", loss=loss)
    dataset = task.dataset("valid")
    modules = attention_modules(model)
    expected = zeros_like_layout(head_layout(model))
    for index in range(SENTENCES):
        add_abs_xi_gradients(expected, model, modules, criterion, dataset.collater([dataset[index]]))
    set_head_mask(model, None)
    assert_mean_matches(result, expected, SENTENCES)


def test_fisher_scores_equal_the_squared_gradients_of_explicit_xi_one_sentence_at_a_time(loaded):
    """F_h = E_x (dL(x)/dxi_h)^2 (Kwon et al. 2022): the same backward pass, squared where I_h takes |.|."""
    task, model = loaded
    result, criterion = criterion_scores(task, model, "sentence", loss="nll", method="fisher")
    assert result.method == "fisher"
    dataset = task.dataset("valid")
    modules = attention_modules(model)
    expected = zeros_like_layout(head_layout(model))
    blocks = {t: torch.zeros(layers, heads, heads, dtype=torch.float64)
              for t, (layers, heads) in head_layout(model).items()}
    for index in range(SENTENCES):
        add_abs_xi_gradients(expected, model, modules, criterion, dataset.collater([dataset[index]]), power=2,
                             blocks=blocks)
    set_head_mask(model, None)
    assert_mean_matches(result, expected, SENTENCES)
    # the block-diagonal Fisher (Kwon et al. section 4.2): E_x g g^T per layer, off-diagonal terms included
    for attention_type in blocks:
        expected_block = blocks[attention_type] / SENTENCES
        error = (expected_block - result.fisher_blocks[attention_type]).abs().max() / expected_block.abs().max()
        assert error <= 1e-4, f"{attention_type}: relative error {error:.2e}"
        off_diagonal = expected_block - torch.diag_embed(expected_block.diagonal(dim1=-2, dim2=-1))
        assert off_diagonal.abs().max() > 1e-3 * expected_block.abs().max()  # the test sees them
    gradient, _ = criterion_scores(task, model, "sentence", loss="nll")
    for attention_type in expected:  # a different score: E(g^2) >= (E|g|)^2, strictly unless |g| is constant
        assert (result.importance[attention_type] >= gradient.importance[attention_type] ** 2 - 1e-9).all()
        assert not torch.allclose(result.importance[attention_type], gradient.importance[attention_type])


def test_token_level_matches_one_xi_per_head_and_position(loaded):
    """The authors' variant: |dL/dxi_{h,t}| with one variable per query position t."""
    task, model = loaded
    result, criterion = criterion_scores(task, model, "token")
    dataset = task.dataset("valid")
    modules = attention_modules(model)
    expected = zeros_like_layout(head_layout(model))
    tokens = 0
    for index in range(SENTENCES):
        sample = dataset.collater([dataset[index]])
        tokens += int(sample["ntokens"])
        xi = {}
        handles = []
        for key, module in modules.items():
            module.head_mask = torch.ones(module.num_heads)  # routes through out_proj

            def per_position(out_proj, inputs, key=key, heads=module.num_heads):
                (attn,) = inputs  # T x 1 x (H * d)
                length = attn.size(0)
                xi[key] = torch.ones(length, 1, heads, 1, requires_grad=True)
                return ((attn.view(length, 1, heads, -1) * xi[key]).view_as(attn),)

            handles.append(module.out_proj.register_forward_pre_hook(per_position))
        try:
            sentence_loss(criterion, model, sample).backward()
        finally:
            for handle in handles:
                handle.remove()
        for (attention_type, layer), variable in xi.items():
            expected[attention_type][layer] += variable.grad.abs().sum(dim=(0, 1, 3)).double()
    set_head_mask(model, None)
    assert_mean_matches(result, expected, tokens)


def test_batch_level_matches_one_xi_per_batch(loaded):
    task, model = loaded
    dataset, batches = split_batches(task, "valid", max_sentences=8, limit=SENTENCES)
    result, criterion = criterion_scores(task, model, "batch", batches=batches)
    modules = attention_modules(model)
    expected = zeros_like_layout(head_layout(model))
    for batch in batches:
        add_abs_xi_gradients(expected, model, modules, criterion, dataset.collater([dataset[i] for i in batch]))
    set_head_mask(model, None)
    assert_mean_matches(result, expected, len(batches))


def test_estimation_with_a_mask_scores_masked_heads_and_restores_the_model(loaded):
    task, model = loaded
    layout = head_layout(model)
    head_mask = parse_head_mask("E:1:1-4 A:2:*", layout)
    set_head_mask(model, head_mask)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    result, _ = criterion_scores(task, model, "sentence")
    # a masked head still has a gradient: the loss change if it came back
    assert (result.importance["enc-dec"][1] > 0).all()
    # the mask set before is in place again, parameters untouched and trainable
    for (attention_type, layer), module in attention_modules(model).items():
        assert torch.equal(module.head_mask, head_mask[attention_type][layer])
        assert module.head_output_hook is None
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]) and parameter.requires_grad and parameter.grad is None


def test_forward_without_gradients_records_nothing(loaded):
    task, model = loaded
    dataset, batches = split_batches(task, "valid", max_sentences=8, limit=8)
    sample = dataset.collater([dataset[i] for i in batches[0]])
    criterion = HeadPruneImportanceCriterion(task, False, 0.1)
    with torch.no_grad():
        _, _, logging_output = criterion(model, sample)
    assert logging_output["head_importance_count"] == 0
    assert all(module.head_mask is None for module in attention_modules(model).values())


def test_importance_json_is_valid_json_with_settings(tmp_path, loaded):
    task, model = loaded
    result, _ = criterion_scores(task, model, "sentence")
    write_importance_json(result, str(tmp_path / "importance.json"))
    payload = json.loads((tmp_path / "importance.json").read_text())
    assert payload["granularity"] == "sentence"
    assert payload["layout"] == {"enc-enc": [2, 8], "enc-dec": [2, 8], "dec-dec": [2, 8]}
    assert payload["settings"]["sentences"] == SENTENCES
