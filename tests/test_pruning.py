"""Pruning orders, steps and random budgets (pruning.py), without fairseq."""

import pytest
import torch

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.budhraja.budgets import budget_mask, parse_layer_budget, parse_type_budget
from fairseq_headprune.study.masks.head_mask import count_masked, full_mask
from fairseq_headprune.study.pruning.curves import (
    ablation_scores,
    ascending,
    curve_steps,
    heads_in_scope,
    importance_scores,
    mask_name,
    random_order,
    step_counts,
    summarize_curves,
)

WMT = {"enc-enc": (6, 16), "enc-dec": (6, 16), "dec-dec": (6, 16)}
DEMO = {"enc-enc": (3, 8), "enc-dec": (3, 8), "dec-dec": (3, 8)}
BASE = {"enc-enc": (6, 8), "enc-dec": (6, 8), "dec-dec": (6, 8)}  # Budhraja et al.'s Transformer


def test_steps_are_tenths_of_the_heads_rounded_up():
    assert step_counts(288) == [0, 29, 58, 87, 116, 144, 173, 202, 231, 260]
    assert step_counts(96) == [0, 10, 20, 29, 39, 48, 58, 68, 77, 87]
    assert step_counts(72, max_percent=100) == [0, 8, 15, 22, 29, 36, 44, 51, 58, 65, 72]
    assert step_counts(24, step_percent=25, max_percent=50) == [0, 6, 12]
    for bad in [dict(step_percent=0), dict(max_percent=120), dict(step_percent=-5)]:
        with pytest.raises(ValueError):
            step_counts(24, **bad)


def test_a_type_scope_masks_only_that_type_and_masks_are_nested():
    candidates = heads_in_scope(DEMO, "enc-dec")
    assert len(candidates) == 24 and {h[0] for h in candidates} == {"enc-dec"}
    steps = curve_steps(DEMO, "enc-dec", "random", random_order(candidates, 1, 1, "enc-dec"), step_counts(24))
    assert [s.pruned for s in steps] == step_counts(24)
    assert count_masked(steps[0].head_mask) == 0
    for previous, step in zip(steps, steps[1:]):
        assert count_masked(step.head_mask) == step.pruned
        assert step.head_mask["enc-enc"].all() and step.head_mask["dec-dec"].all()
        # every head masked at the previous step stays masked
        assert bool((step.head_mask["enc-dec"] <= previous.head_mask["enc-dec"]).all())
    with pytest.raises(HeadMaskError, match="unknown pruning scope"):
        heads_in_scope(DEMO, "decoder")


def test_importance_order_prunes_the_lowest_normalised_scores_first():
    importance = {t: torch.rand(layers, heads, generator=torch.Generator().manual_seed(i))
                  for i, (t, (layers, heads)) in enumerate(DEMO.items())}
    importance["enc-enc"][0] *= 100  # a layer with large raw scores: normalisation must undo it
    scores = importance_scores(importance)
    ranking = ascending(scores, heads_in_scope(DEMO, "all"))
    values = [scores[h] for h in ranking]
    assert values == sorted(values)
    normalised_row = importance["enc-enc"][0] / importance["enc-enc"][0].norm()
    assert scores[("enc-enc", 0, 0)] == pytest.approx(float(normalised_row[0]))
    raw_ranking = ascending(importance_scores(importance, normalize=False), heads_in_scope(DEMO, "all"))
    assert all(h[:2] != ("enc-enc", 0) for h in raw_ranking[:24])  # raw scores put that layer last


def test_ablation_order_prunes_the_least_harmful_head_first():
    rows = [{"attention_type": t, "layer": layer + 1, "head": head + 1, "delta": -float(layer * 8 + head)}
            for t, (layers, heads) in DEMO.items() for layer in range(layers) for head in range(heads)]
    rows[5]["delta"] = 0.5  # masking this head alone helped
    ranking = ascending(ablation_scores(rows, DEMO, "all", "single.json"), heads_in_scope(DEMO, "all"))
    assert ranking[0] == ("enc-enc", 0, 5)
    assert ranking[1][1:] == (0, 0)
    with pytest.raises(HeadMaskError, match="no single-head score for 1 heads of scope enc-enc"):
        ablation_scores(rows[1:], DEMO, "enc-enc", "single.json")
    with pytest.raises(HeadMaskError, match="does not have"):
        ablation_scores(rows, {"enc-enc": (2, 8), "enc-dec": (3, 8), "dec-dec": (3, 8)}, "all", "single.json")


def test_random_orders_and_budgets_are_reproducible_from_their_seed():
    candidates = heads_in_scope(WMT, "all")
    assert random_order(candidates, 7, 1, "all") == random_order(candidates, 7, 1, "all")
    assert random_order(candidates, 7, 1, "all") != random_order(candidates, 8, 1, "all")
    assert random_order(candidates, 7, 1, "all") != random_order(candidates, 7, 2, "all")
    budget = parse_layer_budget("888444 444888 888444", WMT)
    first, again = budget_mask(budget, WMT, 3, 1), budget_mask(budget, WMT, 3, 1)
    assert mask_name(first) == mask_name(again)
    assert mask_name(first) != mask_name(budget_mask(budget, WMT, 3, 2))


def test_layer_budgets_keep_that_many_heads_per_layer():
    assert parse_layer_budget("888444 444888 888444", BASE).pruned_percent(BASE) == pytest.approx(25.0)
    assert parse_layer_budget("333111 111333 333111", BASE).pruned_percent(BASE) == pytest.approx(75.0)
    budget = parse_layer_budget("888444 444888 888444", WMT)
    assert budget.kind == "per-layer" and budget.pruned_percent(WMT) == pytest.approx(100 * (288 - 108) / 288)
    head_mask = budget_mask(budget, WMT, 1, 1)
    assert head_mask["enc-enc"].sum(dim=1).tolist() == [8, 8, 8, 4, 4, 4]
    assert head_mask["enc-dec"].sum(dim=1).tolist() == [4, 4, 4, 8, 8, 8]
    wide = parse_layer_budget("16,16,8,8,4,4 16,16,16,16,16,16 1,1,1,1,1,0", WMT)
    assert budget_mask(wide, WMT, 1, 1)["dec-dec"].sum(dim=1).tolist() == [1, 1, 1, 1, 1, 0]


def test_type_budgets_keep_that_many_heads_per_type():
    budget = parse_type_budget("(14,31,30)", WMT)
    assert budget.kind == "per-type" and budget.label == "(14,31,30)"
    head_mask = budget_mask(budget, WMT, 1, 2)
    assert [int(head_mask[t].sum()) for t in ("enc-enc", "enc-dec", "dec-dec")] == [14, 31, 30]
    assert parse_type_budget("14 31 30", WMT).per_type == budget.per_type


@pytest.mark.parametrize(
    "text, message",
    [
        ("88844 444888 888444", "enc-enc group '88844' gives 5 layers, the model has 6"),
        ("888944 444888 888444", None),  # 9 <= 16 heads: fine for WMT
        ("888444 444888", "has 2 groups; the model needs 3"),
        ("888444 4x4888 888444", "is not a list of head counts"),
        ("888444 444888 17,8,8,4,4,4", "dec-dec layer 1 keeps 17 heads, the model has 16 per layer"),
    ],
)
def test_bad_layer_budgets_are_refused_with_one_line(text, message):
    if message is None:
        parse_layer_budget(text, WMT)
        return
    with pytest.raises(HeadMaskError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_layer_budget(text, WMT)


def test_a_digit_larger_than_the_head_count_is_refused():
    with pytest.raises(HeadMaskError, match="enc-enc layer 1 keeps 9 heads, the model has 8 per layer"):
        parse_layer_budget("988 888 888", DEMO)


@pytest.mark.parametrize("text", ["(14,31)", "(14,31,30,2)", "(a,b,c)", "(14,31,97)"])
def test_bad_type_budgets_are_refused(text):
    with pytest.raises(HeadMaskError, match="type budget"):
        parse_type_budget(text, WMT)


def test_curves_average_random_draws():
    rows = [
        {"scope": "all", "order": "random", "draw": d, "step": 1, "pruned": 8, "total": 72, "percent": 11.1,
         "bleu": bleu, "delta": bleu - 30, "significant": bleu < 25}
        for d, bleu in enumerate([20.0, 24.0, 28.0], start=1)
    ]
    (summary,) = summarize_curves(rows)
    assert summary["bleu"] == pytest.approx(24.0) and summary["bleu_std"] == pytest.approx(4.0)
    assert summary["draws"] == 3 and summary["significant"] == 2 and summary["delta"] == pytest.approx(-6.0)
    assert count_masked(full_mask(DEMO)) == 0


# ---- FFN neurons and the joint search, in steps of FLOPs (structure_curves.py) ------------------------------


def tiny_flops():
    """d = 4, d_h = 2, 3 positions: a head 88 FLOPs per token, a neuron 16; 2 attention layers of 2 heads, 2 FFN
    layers of 5 neurons: 352 + 160 = 512."""
    from fairseq_headprune.study.search.costs import ffn_flops_costs, flops_costs, merge_costs

    return merge_costs(flops_costs({"enc-enc": (2, 2)}, {"enc-enc": (4, 2)}, 3),
                       ffn_flops_costs({"enc-ffn": (2, 5)}, {"enc-ffn": 4}))


def test_flops_steps_equal_the_head_steps_for_equal_costs_and_follow_the_costs_otherwise():
    from fairseq_headprune.study.pruning.structure_curves import flops_step_counts

    for total, step, largest in ((288, 10, 90), (96, 10, 90), (72, 10, 100), (24, 25, 50), (7, 30, 100)):
        assert flops_step_counts([3.0] * total, step, largest) == step_counts(total, step, largest)
    # uneven costs: each level is the fewest units whose FLOPs reach k * 25% of 10
    assert flops_step_counts([4.0, 1.0, 1.0, 4.0], 25, 100) == [0, 1, 2, 4]
    with pytest.raises(ValueError):
        flops_step_counts([1.0], 0, 50)


def test_ffn_curves_prune_neurons_by_normalised_importance_in_steps_of_ffn_flops():
    from fairseq_headprune.study.pruning.curves import CurvePlan
    from fairseq_headprune.study.pruning.structure_curves import StructureScores, plan_structure_curves

    scores = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.2], [4.0, 2.0, 1.0, 3.0, 5.0]], dtype=torch.float64)
    plan = CurvePlan(["importance"], ["all"], step_percent=20, max_percent=60)
    steps = plan_structure_curves("ffn", {"enc-enc": (2, 2)}, {"enc-ffn": (2, 5)}, tiny_flops(), plan,
                                  StructureScores(neuron_importance={"enc-ffn": scores}), "units")
    assert [s.pruned for s in steps] == [0, 2, 4, 6] and all(s.total == 10 for s in steps)
    # by hand: scores / per-layer l2 norm (sqrt 1.2 and sqrt 55), ascending: .091 .135 .183 .270 .274 .405
    order = [(1, 2), (0, 1), (0, 4), (1, 1), (0, 3), (1, 3)]
    for step in steps[1:]:
        masked = {(layer, n) for layer, n in (step.ffn_mask["enc-ffn"] == 0).nonzero().tolist()}
        assert masked == set(order[:step.pruned])
        assert count_masked(step.head_mask) == 0
        assert step.percent == 100.0 * step.pruned / 10
        assert step.flops_removed_percent == pytest.approx(100.0 * 16 * step.pruned / 512)
    assert steps[0].ffn_mask is None and steps[0].config_name == mask_name(full_mask({"enc-enc": (2, 2)}))
    assert steps[1].config_name.startswith(steps[0].config_name + ".ffn-")
    on_flops = plan_structure_curves("ffn", {"enc-enc": (2, 2)}, {"enc-ffn": (2, 5)}, tiny_flops(), plan,
                                     StructureScores(neuron_importance={"enc-ffn": scores}), "flops")
    assert [s.percent for s in on_flops] == pytest.approx([0.0, 6.25, 12.5, 18.75])


def test_joint_curves_search_each_level_of_all_flops():
    from fairseq_headprune.study.pruning.curves import CurvePlan
    from fairseq_headprune.study.pruning.structure_curves import StructureScores, plan_structure_curves
    from fairseq_headprune.study.search.mask_search import fisher_search

    generator = torch.Generator().manual_seed(2)
    heads = {"enc-enc": torch.rand(2, 2, generator=generator, dtype=torch.float64)}
    neurons = {"enc-ffn": torch.rand(2, 5, generator=generator, dtype=torch.float64) / 4}
    plan = CurvePlan(["fisher"], ["all"], step_percent=30, max_percent=90)
    steps = plan_structure_curves("joint", {"enc-enc": (2, 2)}, {"enc-ffn": (2, 5)}, tiny_flops(), plan,
                                  StructureScores(fisher=heads, neuron_fisher=neurons), "flops")
    assert len(steps) == 4 and steps[0].pruned == 0 and steps[0].percent == 0.0
    for level, step in enumerate(steps[1:], start=1):
        expected = fisher_search(heads, tiny_flops(), 512 * (1 - 0.3 * level), neurons)
        assert torch.equal(step.head_mask["enc-enc"], expected.head_mask["enc-enc"])
        kept = 512 * (1 - step.flops_removed_percent / 100)
        assert kept == pytest.approx(expected.cost) and kept <= 512 * (1 - 0.3 * level) + 1e-9
        assert step.percent == step.flops_removed_percent
        assert step.pruned == step.heads_pruned + step.neurons_pruned and step.total == 14
    with pytest.raises(Exception, match="not an order of the structure joint"):
        plan_structure_curves("joint", {"enc-enc": (2, 2)}, {"enc-ffn": (2, 5)}, tiny_flops(),
                              CurvePlan(["random"], ["all"]), StructureScores(), "flops")
