"""The joint search over heads and FFN neurons (Kwon et al. 2022, section 4.1) against exhaustive enumeration.

Every subset of the units of a tiny model (2 attention layers of 3 heads, 2
FFN layers of 4 neurons: 2^14 masks) is priced and scored directly: the
diagonal-Fisher loss 1/2 sum of the removed units' scores, the cost of the
count each block keeps. The search must find the least loss within the budget.
"""

import json

import numpy as np
import pytest
import torch

from fairseq_headprune.errors import ResultFileError, SettingsError
from fairseq_headprune.study.methods.mask_search import (
    COST_GRID,
    LatencyTable,
    LayerCosts,
    ffn_flops_costs,
    fisher_search,
    flops_costs,
    merge_costs,
    parse_budget,
    read_latency_table,
    search_mask,
    write_latency_table,
)

HEADS = {"enc-enc": (2, 3)}
NEURONS = {"enc-ffn": (2, 4)}
BLOCKS = [("enc-enc", 0), ("enc-enc", 1), ("enc-ffn", 0), ("enc-ffn", 1)]
WIDTH = {"enc-enc": 3, "enc-ffn": 4}


def random_scores(seed):
    generator = torch.Generator().manual_seed(seed)
    heads = {t: torch.rand(*shape, generator=generator, dtype=torch.float64) for t, shape in HEADS.items()}
    neurons = {t: torch.rand(*shape, generator=generator, dtype=torch.float64) for t, shape in NEURONS.items()}
    return heads, neurons


def every_mask():
    """All 2^14 keep/remove flags, one row per mask, columns block by block."""
    units = sum(WIDTH[t] for t, _ in BLOCKS)
    return ((np.arange(2 ** units)[:, None] >> np.arange(units)) & 1).astype(np.float64)


def exhaustive(heads, neurons, costs, budget, allowed=None, uniform=False):
    """The least loss over every mask within the budget (``allowed``: the counts each FFN layer may keep)."""
    flags = every_mask()
    scores = np.concatenate([(heads if t in HEADS else neurons)[t][layer].numpy() for t, layer in BLOCKS])
    loss = 0.5 * (1.0 - flags) @ scores
    cost = np.zeros(len(flags))
    counts = []
    start = 0
    for block in BLOCKS:
        kept = flags[:, start:start + WIDTH[block[0]]].sum(axis=1).astype(int)
        start += WIDTH[block[0]]
        cost += np.asarray(costs.per_layer[block])[kept] if block in costs.per_layer else 0.0
        counts.append(kept)
    fits = cost <= budget + 1e-9
    if allowed is not None:
        for kept, block in zip(counts, BLOCKS):
            if block[0] in NEURONS:
                fits &= np.isin(kept, allowed)
    if uniform:
        fits &= counts[0] == counts[1]
    return float(loss[fits].min())


def random_integer_costs(seed):
    """Latency-like integer costs: a fixed cost for keeping any unit, then uneven steps."""
    rng = np.random.default_rng(seed)
    per_layer = {}
    for block in BLOCKS:
        steps = rng.integers(1, 4, size=WIDTH[block[0]])
        per_layer[block] = [0.0] + list(np.cumsum(steps) + 2.0)
    return LayerCosts("latency", per_layer)


@pytest.mark.parametrize("seed", range(4))
def test_the_joint_search_with_integer_costs_finds_the_exhaustive_optimum(seed):
    heads, neurons = random_scores(seed)
    costs = random_integer_costs(seed)
    for budget in (0.0, 7.0, 13.0, 21.0, costs.full_cost()):
        result = fisher_search(heads, costs, budget, neurons, neuron_step=1)
        assert result.cost <= budget
        assert result.diagonal_loss == pytest.approx(exhaustive(heads, neurons, costs, budget), abs=1e-12)
        # the masks are what the result says: the kept counts, the cost recomputed from them
        assert result.kept_neurons == {b: int(result.ffn_mask[b[0]][b[1]].sum()) for b in BLOCKS if b[0] in NEURONS}
        assert costs.cost_of(result.head_mask, result.ffn_mask) == result.cost


@pytest.mark.parametrize("seed", range(3))
def test_a_neuron_step_searches_exactly_among_its_counts(seed):
    heads, neurons = random_scores(seed + 10)
    costs = random_integer_costs(seed + 10)
    for budget in (6.0, 11.0, 17.0):
        result = fisher_search(heads, costs, budget, neurons, neuron_step=3)
        assert set(result.kept_neurons.values()) <= {0, 3, 4}  # every third count, and the whole layer
        expected = exhaustive(heads, neurons, costs, budget, allowed=[0, 3, 4])
        assert result.diagonal_loss == pytest.approx(expected, abs=1e-12)
        assert result.details["neuron_step"] == 3


@pytest.mark.parametrize("seed", range(3))
def test_real_costs_on_the_budgets_grid_are_searched_exactly(seed):
    """Costs in eighths with a budget of 2.5: every cost is a whole number of the grid's steps (2.5 / 2000)."""
    heads, neurons = random_scores(seed + 20)
    rng = np.random.default_rng(seed)
    costs = LayerCosts("latency", {b: [0.0] + list(np.cumsum(rng.integers(1, 6, size=WIDTH[b[0]])) / 8.0)
                                   for b in BLOCKS})
    assert not all(float(c).is_integer() for v in costs.per_layer.values() for c in v)
    result = fisher_search(heads, costs, 2.5, neurons, neuron_step=1)
    assert result.cost <= 2.5
    assert result.diagonal_loss == pytest.approx(exhaustive(heads, neurons, costs, 2.5), abs=1e-12)


def test_other_real_costs_never_exceed_the_budget_and_lose_at_most_the_grid():
    heads, neurons = random_scores(30)
    rng = np.random.default_rng(3)
    costs = LayerCosts("latency", {b: [0.0] + list(np.cumsum(rng.uniform(0.1, 1.0, size=WIDTH[b[0]]))) for b in BLOCKS})
    for budget in (1.3, 3.7, 6.1):
        result = fisher_search(heads, costs, budget, neurons, neuron_step=1)
        assert result.cost <= budget + 1e-9
        # rounding up costs at most one grid step per block of the budget
        assert exhaustive(heads, neurons, costs, budget) - 1e-12 <= result.diagonal_loss
        assert result.diagonal_loss <= exhaustive(heads, neurons, costs, budget * (1 - 4 / COST_GRID)) + 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_uniform_head_counts_equal_brute_force(seed):
    heads, neurons = random_scores(seed + 40)
    costs = random_integer_costs(seed + 40)
    for budget in (8.0, 14.0, 20.0):
        result = search_mask(heads, None, costs, budget, rearranged=False, neurons=neurons, neuron_step=1,
                             uniform=True)
        assert len({len(result.kept[("enc-enc", layer)]) for layer in range(2)}) == 1
        expected = exhaustive(heads, neurons, costs, budget, uniform=True)
        assert result.diagonal_loss == pytest.approx(expected, abs=1e-12)
        assert result.details["uniform"] is True
    # heads only: one count k for both layers, each keeping its k largest scores
    only_heads = LayerCosts("latency", {b: c for b, c in costs.per_layer.items() if b[0] in HEADS})
    result = fisher_search(heads, only_heads, 9.0, uniform=True)
    assert result.ffn_mask is None and len({len(v) for v in result.kept.values()}) == 1
    removed = lambda layer, k: 0.5 * sum(sorted(heads["enc-enc"][layer].tolist(), reverse=True)[k:])  # noqa: E731
    best = min(removed(0, k) + removed(1, k) for k in range(4)
               if only_heads.per_layer[("enc-enc", 0)][k] + only_heads.per_layer[("enc-enc", 1)][k] <= 9.0)
    assert result.diagonal_loss == pytest.approx(best, abs=1e-12)


def test_flops_of_heads_and_neurons_add_up_as_computed_by_hand():
    """d = 4, d_h = 2, n = 3 positions: a head costs 8*4*2 + 4*3*2 = 88 FLOPs per token, a neuron 4*4 = 16."""
    costs = merge_costs(flops_costs({"enc-enc": (1, 2)}, {"enc-enc": (4, 2)}, 3),
                        ffn_flops_costs({"enc-ffn": (1, 3)}, {"enc-ffn": 4}))
    assert costs.full_cost() == 2 * 88 + 3 * 16 == 224
    assert costs.unit == "attention and FFN FLOPs per token"
    head_mask = {"enc-enc": torch.tensor([[1.0, 0.0]])}
    ffn_mask = {"enc-ffn": torch.tensor([[1.0, 0.0, 1.0]])}
    assert costs.cost_of(head_mask, ffn_mask) == 88 + 2 * 16 == 120
    assert costs.cost_of(head_mask) == 88 + 3 * 16  # no neuron mask: every neuron kept
    assert parse_budget("50%", costs) == 112
    # 112 FLOPs kept: one head and one neuron (104), or no head and every neuron (48): the scores decide
    heads = {"enc-enc": torch.tensor([[0.9, 0.1]], dtype=torch.float64)}
    neurons = {"enc-ffn": torch.tensor([[0.3, 0.05, 0.2]], dtype=torch.float64)}
    result = fisher_search(heads, costs, 112.0, neurons, neuron_step=1)
    assert result.kept[("enc-enc", 0)] == [0] and result.kept_neurons == {("enc-ffn", 0): 1}
    assert result.ffn_mask["enc-ffn"].tolist() == [[1.0, 0.0, 0.0]] and result.cost == 104
    assert result.diagonal_loss == pytest.approx(0.5 * (0.1 + 0.05 + 0.2))


def test_an_ffn_only_search_keeps_every_head_and_the_neurons_of_largest_fisher_score():
    heads, neurons = random_scores(50)
    costs = ffn_flops_costs(NEURONS, {"enc-ffn": 8})
    assert costs.unit == "FFN FLOPs per token"
    result = search_mask(heads, None, costs, parse_budget("50%", costs), rearranged=False, neurons=neurons,
                         neuron_step=1)
    assert all(bool((m == 1).all()) for m in result.head_mask.values())
    flat = neurons["enc-ffn"].reshape(-1)
    expected = torch.zeros(8)
    expected[torch.argsort(flat, descending=True)[:4]] = 1.0  # equal costs: the four largest scores overall
    assert torch.equal(result.ffn_mask["enc-ffn"].reshape(-1), expected)
    assert json.loads(json.dumps(result.to_dict()))["kept_neurons"] == {
        "enc-ffn:1": int(expected[:4].sum()), "enc-ffn:2": int(expected[4:].sum())}


def test_large_integer_costs_are_divided_by_their_divisor_and_stay_exact():
    """Attention FLOPs of a big model: a head costs 532480, a neuron 4096; the search is exact and quick."""
    layout = {"enc-enc": (2, 16)}
    costs = merge_costs(flops_costs(layout, {"enc-enc": (1024, 64)}, 32),
                        ffn_flops_costs({"enc-ffn": (2, 4096)}, {"enc-ffn": 1024}))
    generator = torch.Generator().manual_seed(0)
    heads = {"enc-enc": torch.rand(2, 16, generator=generator, dtype=torch.float64)}
    neurons = {"enc-ffn": torch.rand(2, 4096, generator=generator, dtype=torch.float64) / 100}
    budget = parse_budget("40%", costs)
    result = fisher_search(heads, costs, budget, neurons)
    assert result.cost <= budget and result.details["neuron_step"] == 32  # 4096 / 128 counts per layer
    assert all(k % 32 == 0 for k in result.kept_neurons.values())


def test_missing_neuron_scores_are_named():
    heads, _ = random_scores(0)
    with pytest.raises(SettingsError, match="no Fisher scores for the neurons"):
        fisher_search(heads, ffn_flops_costs(NEURONS, {"enc-ffn": 8}), 10.0)


def test_latency_tables_price_ffn_layers_in_steps_and_record_engine_and_precision(tmp_path):
    architecture = {"layout": {"enc-enc": [1, 2]}, "dims": {"enc-enc": [8, 4]}, "ffn": {"enc-ffn": [1, 4]}}
    table = LatencyTable({("enc-enc", 0): [0.0, 1.0, 1.5], ("enc-ffn", 0): [0.1, 0.6, 1.2]}, "cpu: test",
                         architecture, {}, {("enc-ffn", 0): [0, 2, 4]}, "fairseq", "float32")
    path = str(tmp_path / "latency.json")
    write_latency_table(table, path)
    read = read_latency_table(path, architecture, "cpu: test", "fairseq", "float32")
    assert read.counts == table.counts and read.has_ffn
    costs = read.costs(("heads", "ffn"))
    assert costs.kept_counts(("enc-ffn", 0)) == [0, 2, 4] and costs.cost_at(("enc-ffn", 0), 2) == 0.6
    assert read.costs().per_layer == {("enc-enc", 0): [0.0, 1.0, 1.5]}
    heads = {"enc-enc": torch.tensor([[0.5, 0.4]], dtype=torch.float64)}
    neurons = {"enc-ffn": torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)}
    result = fisher_search(heads, costs, 1.7, neurons, neuron_step=1)
    assert set(result.kept_neurons.values()) <= {0, 2, 4} and result.cost <= 1.7
    for kwargs, message in ((dict(engine="ctranslate2"), "another engine (fairseq), not this one (ctranslate2)"),
                            (dict(precision="float16"), "another precision (float32), not this one (float16)"),
                            (dict(), "another device (cpu: test), not this one (cuda: H100)")):
        device = "cuda: H100" if not kwargs else "cpu: test"
        with pytest.raises(ResultFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_latency_table(path, architecture, device, **kwargs)
    other = dict(architecture, ffn={"enc-ffn": [1, 8]})
    with pytest.raises(ResultFileError, match="another model"):
        read_latency_table(path, other, "cpu: test")


def test_old_latency_tables_read_as_fairseq_tables_of_their_dtype(tmp_path):
    """Tables written before the engine and precision were recorded: fairseq, the settings' dtype."""
    architecture = {"layout": {"enc-enc": [1, 2]}, "dims": {"enc-enc": [8, 4]}}
    old = {"format": "fairseq-headprune latency table", "device": "cpu: test", "architecture": architecture,
           "settings": {"dtype": "torch.float32"}, "per_layer_ms": {"enc-enc:1": [0.0, 1.0, 1.5]}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    model = dict(architecture, ffn={"enc-ffn": [1, 4]})  # today's architecture also names the FFN
    table = read_latency_table(str(path), model, "cpu: test")
    assert (table.engine, table.precision, table.has_ffn) == ("fairseq", "float32", False)
    with pytest.raises(ResultFileError, match="another precision"):
        read_latency_table(str(path), model, "cpu: test", precision="bfloat16")
