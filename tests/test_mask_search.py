"""Budgeted Fisher mask search and rearrangement (Kwon et al. 2022) against exhaustive enumeration."""

import itertools

import pytest
import torch

from fairseq_headprune.errors import ResultFileError, SettingsError
from fairseq_headprune.study.search.costs import (
    LatencyTable,
    LayerCosts,
    SearchBudget,
    flops_costs,
    head_count_costs,
    read_latency_table,
    write_latency_table,
)
from fairseq_headprune.study.search.mask_search import (
    fisher_search,
    layer_loss,
    pruned_count_search,
    rearrange_layer,
    search_mask,
)

LAYOUT = {"enc-enc": (2, 3), "dec-dec": (2, 3)}


def random_fisher(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {t: torch.rand(layers, heads, generator=generator, dtype=torch.float64)
            for t, (layers, heads) in LAYOUT.items()}


def random_blocks(seed=0, coupling=1.0):
    """Positive semi-definite per-layer blocks E g g^T from random per-sentence gradients."""
    generator = torch.Generator().manual_seed(seed)
    blocks = {}
    for t, (layers, heads) in LAYOUT.items():
        gradients = torch.randn(layers, 50, heads, generator=generator, dtype=torch.float64)
        gradients[..., 1] += coupling * gradients[..., 0]  # heads 1 and 2 interact
        blocks[t] = gradients.transpose(1, 2) @ gradients / 50
    return blocks


def all_heads():
    return [(t, layer, head) for t, (layers, heads) in LAYOUT.items() for layer in range(layers)
            for head in range(heads)]


def exhaustive_best(fisher, costs, budget):
    """The least diagonal loss over every mask whose cost is within the budget."""
    heads = all_heads()
    best = None
    for kept_flags in itertools.product((0, 1), repeat=len(heads)):
        mask = {t: torch.zeros(shape) for t, shape in LAYOUT.items()}
        for flag, (t, layer, head) in zip(kept_flags, heads):
            mask[t][layer, head] = flag
        if costs.cost_of(mask) > budget + 1e-9:
            continue
        loss = 0.5 * sum(float(fisher[t][layer, head]) for flag, (t, layer, head) in zip(kept_flags, heads) if not flag)
        best = loss if best is None else min(best, loss)
    return best


def test_a_head_budget_keeps_the_heads_with_the_largest_fisher_scores():
    fisher = random_fisher()
    for kept in range(0, 13):
        result = fisher_search(fisher, head_count_costs(LAYOUT), kept)
        ranked = sorted(all_heads(), key=lambda h: -float(fisher[h[0]][h[1], h[2]]))[:kept]
        expected = {t: torch.zeros(shape) for t, shape in LAYOUT.items()}
        for t, layer, head in ranked:
            expected[t][layer, head] = 1.0
        assert all(torch.equal(result.head_mask[t], expected[t]) for t in LAYOUT), kept
        assert result.cost == kept


@pytest.mark.parametrize("seed", range(4))
def test_the_search_with_layer_costs_finds_the_exhaustive_optimum(seed):
    """Integer per-layer costs that are not linear (a fixed cost per layer that keeps any head): exact."""
    fisher = random_fisher(seed)
    costs = LayerCosts("latency", {key: [0.0] + [3.0 + 2.0 * k for k in range(1, 4)]
                                   for key in [(t, layer) for t, (layers, _) in LAYOUT.items()
                                               for layer in range(layers)]})
    for budget in (5.0, 11.0, 17.0, 24.0):
        result = fisher_search(fisher, costs, budget)
        assert result.cost <= budget
        assert result.diagonal_loss == pytest.approx(exhaustive_best(fisher, costs, budget), abs=1e-12)


def test_real_valued_costs_never_exceed_the_budget_and_come_close_to_the_optimum():
    fisher = random_fisher(7)
    generator = torch.Generator().manual_seed(3)
    per_head = {key: float(torch.rand(1, generator=generator)) + 0.5
                for key in [(t, layer) for t, (layers, _) in LAYOUT.items() for layer in range(layers)]}
    costs = LayerCosts("latency", {key: [0.1 * (k > 0) + k * c for k in range(4)] for key, c in per_head.items()})
    for budget in (2.0, 4.5, 7.3):
        result = fisher_search(fisher, costs, budget)
        assert result.cost <= budget + 1e-9
        # the grid costs at most one grid step per layer of the budget
        assert result.diagonal_loss <= exhaustive_best(fisher, costs, budget * (1 - 4 / 2000)) + 1e-12


def test_rearrangement_keeps_the_counts_and_reaches_the_exhaustive_optimum_of_each_layer():
    blocks = random_blocks(coupling=-3.0)
    for t, (layers, heads) in LAYOUT.items():
        for layer in range(layers):
            block = blocks[t][layer]
            diagonal_choice = sorted(sorted(range(heads), key=lambda h: -float(block[h, h]))[:1])
            kept, _ = rearrange_layer(block, diagonal_choice)
            assert len(kept) == 1
            best = min(layer_loss(block, list(c)) for c in itertools.combinations(range(heads), 1))
            assert layer_loss(block, kept) == pytest.approx(best)
            assert layer_loss(block, kept) <= layer_loss(block, diagonal_choice)


def test_rearrangement_changes_the_mask_where_heads_interact():
    # head 0 and head 1 cancel: removing both costs nothing, removing either alone is expensive
    gradients = torch.tensor([[1.0, -1.0, 0.3], [2.0, -2.0, -0.3], [-1.0, 1.0, 0.2]], dtype=torch.float64)
    block = gradients.T @ gradients / 3
    diagonal_keep = [0]  # keeps the largest F_hh; removing 1 and 2 costs 1/2 (F_11 + F_22 + 2 F_12)
    kept, swaps = rearrange_layer(block, diagonal_keep)
    assert kept == [2] and swaps == 1
    assert layer_loss(block, kept) < layer_loss(block, diagonal_keep)


def test_search_mask_reports_both_estimates_and_rearranged_masks_keep_the_layer_counts():
    blocks = random_blocks(1)
    fisher = {t: b.diagonal(dim1=-2, dim2=-1).clone() for t, b in blocks.items()}
    costs = head_count_costs(LAYOUT)
    plain = search_mask(fisher, blocks, costs, 6, rearranged=False)
    tuned = search_mask(fisher, blocks, costs, 6, rearranged=True)
    assert {k: len(v) for k, v in plain.kept.items()} == {k: len(v) for k, v in tuned.kept.items()}
    assert tuned.block_loss <= plain.block_loss
    unpruned = pruned_count_search(fisher, blocks, 0, True)
    assert all(bool((unpruned[t] == 1).all()) for t in LAYOUT)
    assert int(sum(m.sum() for m in pruned_count_search(fisher, blocks, 5, True).values())) == 7
    with pytest.raises(SettingsError, match="Fisher blocks"):
        search_mask(fisher, None, costs, 6, rearranged=True)


def test_budgets_parse_numbers_and_percentages_and_refuse_more_than_the_model():
    costs = head_count_costs(LAYOUT)
    assert SearchBudget.parse("6").resolve(costs) == 6
    assert SearchBudget.parse("50%").resolve(costs) == 6
    assert SearchBudget.parse("40%").resolve(costs) == 4  # 4.8 heads: the whole heads it allows
    for text, message in (("13", "more than the unpruned model costs"), ("-1", "non-negative"),
                          ("half", "a number or a percentage"), ("2.5", "whole")):
        with pytest.raises(SettingsError, match=message):
            SearchBudget.parse(text).resolve(costs)
    flops = flops_costs(LAYOUT, {"enc-enc": (64, 16), "dec-dec": (64, 16)}, 10)
    assert flops.full_cost() == 12 * (8 * 64 * 16 + 4 * 10 * 16)
    assert SearchBudget.parse("50%").resolve(flops) == pytest.approx(flops.full_cost() / 2)
    # a budget already in the costs' unit (compress after removing whole layers: a share of the unpruned model's
    # cost as an amount): a fraction of a head is the whole heads within it, a number of FLOPs as it is
    assert SearchBudget(amount=4.0).resolve(costs) == 4 and SearchBudget.parse(6).text == "6"
    assert SearchBudget(amount=1000.5).resolve(flops) == 1000.5
    # search.json records the budget's text: it reads back to the same number, however many digits it has
    for budget in (SearchBudget(amount=37576704.0), SearchBudget(amount=1000.5), SearchBudget(amount=1 / 3),
                   SearchBudget(percent=100 / 3), SearchBudget.parse("50%")):
        assert SearchBudget.parse(budget.text) == budget
    assert SearchBudget(amount=37576704.0).text == "37576704" and SearchBudget.parse("50%").text == "50%"
    with pytest.raises(SettingsError, match="an amount or a percentage"):
        SearchBudget()


def test_latency_tables_are_refused_for_another_model_or_device(tmp_path):
    architecture = {"layout": {"enc-enc": [2, 3]}, "dims": {"enc-enc": [64, 16]}}
    table = LatencyTable({("enc-enc", 0): [0.0, 1.0, 1.5, 2.0], ("enc-enc", 1): [0.0, 1.1, 1.6, 2.1]},
                         "cpu: test", architecture, {"batch_size": 8})
    path = str(tmp_path / "latency.json")
    write_latency_table(table, path)
    assert read_latency_table(path, architecture, "cpu: test").per_layer == table.per_layer
    other = {"layout": {"enc-enc": [2, 4]}, "dims": {"enc-enc": [64, 16]}}
    with pytest.raises(ResultFileError, match="another model"):
        read_latency_table(path, other, "cpu: test")
    with pytest.raises(ResultFileError, match="another device"):
        read_latency_table(path, architecture, "cuda: H100")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ResultFileError, match="not a latency table"):
        read_latency_table(str(tmp_path / "bad.json"), architecture, "cpu: test")


def test_search_json_is_a_record_and_older_files_are_read_under_its_names():
    from fairseq_headprune.study.search.records import SearchFile

    record = SearchFile(checkpoint="/c.pt", budget="50%", cost="heads", structure="heads", full_cost=48.0,
                        spec="E:1:1-4", heads_pruned=4, heads_total=48, result={"cost": 44.0})
    assert SearchFile.from_dict(record.to_dict()) == record
    older = {key: value for key, value in record.to_dict().items() if key not in ("heads_pruned", "heads_total")}
    assert SearchFile.from_dict({**older, "pruned": 4, "total": 48}) == record
