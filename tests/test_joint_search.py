"""The joint search over heads and FFN neurons (Kwon et al. 2022, section 4.1) against exhaustive enumeration.

Every subset of the units of a tiny model (2 attention layers of 3 heads, 2
FFN layers of 4 neurons: 2^14 masks) is priced and scored directly: the
diagonal-Fisher loss 1/2 sum of the removed units' scores, the cost of the
count each block keeps. The search must find the least loss within the budget.
Then the searches on the tiny model with its costs (FLOPs, latency tables),
and CTranslate2's latency table: its prices from the variants it timed (how
well it predicts measured decoding is a benchmark,
scripts/benchmarks/benchmark_latency_prediction.py).
"""

import json
import statistics

import numpy as np
import pytest
import torch

from fairseq_headprune.errors import ResultFileError, SettingsError
from fairseq_headprune.study.search.costs import (
    LatencyTable,
    LayerCosts,
    SearchBudget,
    ffn_flops_costs,
    flops_costs,
    merge_costs,
    read_latency_table,
    write_latency_table,
)
from fairseq_headprune.study.search.mask_search import COST_GRID, fisher_search, search_mask

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


@pytest.mark.parametrize("width", [0.25, 0.5, 0.75, 1.0])
def test_a_planned_width_keeps_that_share_of_every_layer_its_best_units_whatever_the_budget(width):
    """A speed-up plan's shape (``--narrowing plan``): each layer keeps round(width x units), at least one, those
    of the largest scores; the budget chooses nothing, and the loss is what removing the rest costs."""
    heads, neurons = random_scores(60)
    costs = random_integer_costs(60)
    result = fisher_search(heads, costs, 0.0, neurons, neuron_step=1, width=width)
    expected_loss = 0.0
    for unit_type, layer in BLOCKS:
        scores = (heads if unit_type in HEADS else neurons)[unit_type][layer].tolist()
        keep = max(1, round(width * len(scores)))
        best = sorted(range(len(scores)), key=lambda unit: -scores[unit])[:keep]
        mask = (result.head_mask if unit_type in HEADS else result.ffn_mask)[unit_type][layer]
        assert sorted(int(unit) for unit in torch.nonzero(mask).flatten()) == sorted(best)
        expected_loss += 0.5 * sum(score for unit, score in enumerate(scores) if unit not in best)
    assert result.diagonal_loss == pytest.approx(expected_loss, abs=1e-12)
    assert result.cost == costs.cost_of(result.head_mask, result.ffn_mask) and result.details["width"] == width


@pytest.mark.parametrize("seed", range(3))
def test_tied_types_keep_one_count_for_the_whole_stack_as_brute_force_finds(seed):
    """CTranslate2's decoder: self- and cross-attention layers keep one head count, chosen once for all four."""
    generator = torch.Generator().manual_seed(seed + 70)
    scores = {t: torch.rand(2, 3, generator=generator, dtype=torch.float64) for t in ("dec-dec", "enc-dec")}
    rng = np.random.default_rng(seed + 70)
    blocks = [(t, layer) for t in ("dec-dec", "enc-dec") for layer in range(2)]
    per_layer = {b: [0.0] + list(np.cumsum(rng.integers(1, 4, size=3)) + 1.0) for b in blocks}
    costs = LayerCosts("latency", per_layer, tied_types=(("dec-dec", "enc-dec"),))
    with pytest.raises(SettingsError, match="search with the uniform") as error:  # the search command: --uniform
        fisher_search(scores, costs, 10.0)
    assert error.value.setting == "uniform"
    flags = ((np.arange(2 ** 12)[:, None] >> np.arange(12)) & 1).astype(np.float64)
    flat = np.concatenate([scores[t][layer].numpy() for t, layer in blocks])
    loss = 0.5 * (1.0 - flags) @ flat
    kept = flags.reshape(len(flags), 4, 3).sum(axis=2).astype(int)
    cost = sum(np.asarray(per_layer[b])[kept[:, i]] for i, b in enumerate(blocks))
    one_count = (kept == kept[:, :1]).all(axis=1)
    for budget in (6.0, 12.0, 20.0, 40.0):
        fits = one_count & (cost <= budget + 1e-9)
        if not fits.any():
            with pytest.raises(SettingsError, match="below the least any mask costs"):
                fisher_search(scores, costs, budget, uniform=True)
            continue
        result = fisher_search(scores, costs, budget, uniform=True)
        assert len({len(heads) for heads in result.kept.values()}) == 1
        assert result.diagonal_loss == pytest.approx(float(loss[fits].min()), abs=1e-12)
        assert result.cost <= budget + 1e-9


def test_model_flops_equal_torchs_flop_counter_on_every_layer_and_head_count(tiny_task_and_model):
    """The FLOPs cost of every attention layer at every head count and of every FFN layer, against torch's own count
    of the narrowed layers' matrix products (FlopCounterMode)."""
    from fairseq_headprune.engine.search.model_costs import model_architecture, model_flops

    from conftest import counted_flops_per_token

    _, model = tiny_task_and_model
    costs = model_flops(model, model_architecture(model), 32)
    counted = counted_flops_per_token(model, 32)
    for block, found in counted.items():
        if isinstance(found, list):  # an attention layer: 1 .. H heads
            assert [costs.cost_at(block, kept) for kept in range(1, len(found) + 1)] == found, block
            assert costs.cost_at(block, 0) == 0
        else:
            assert costs.cost_at(block, costs.kept_counts(block)[-1]) == found, block


@pytest.mark.parametrize("narrowed", [False, True])
def test_decoding_flops_equal_torchs_flop_counter_in_fairseqs_beam_search(tiny_task_and_model, narrowed):
    """The per-sentence decoding cost (``decoding_flops_costs``) and the output projection's, against torch's count
    of every matrix product of fairseq's own beam search (SequenceGenerator, incremental state, fixed length) on
    random source sentences: the unpruned model, and a copy with heads and FFN neurons removed unevenly."""
    import copy

    from fairseq.sequence_generator import SequenceGenerator
    from torch.utils.flop_counter import FlopCounterMode

    from fairseq_headprune.engine.search.model_costs import model_architecture, model_decoding_flops
    from fairseq_headprune.modules.masked_ffn import ffn_layout
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask, unfused_attention
    from fairseq_headprune.modules.pruned_heads import shrink_ffn_model, shrink_model
    from fairseq_headprune.study.search.costs import DecodingShape, output_projection_flops

    task, model = tiny_task_and_model
    model = copy.deepcopy(model)
    length, beam, source_length, sentences = 6, 3, 9, 4
    shape = DecodingShape(source_length, length + 1, beam)
    architecture = model_architecture(model)
    costs = model_decoding_flops(model, architecture, shape)  # priced on the unpruned model
    generator = torch.Generator().manual_seed(3)
    head_mask = {t: torch.ones(size) for t, size in head_layout(model).items()}
    ffn_mask = {t: torch.ones(size) for t, size in ffn_layout(model).items()}
    if narrowed:  # every layer keeps its own number of heads (1 .. H) and neurons
        for masks in (head_mask, ffn_mask):
            for mask in masks.values():
                for layer in range(mask.shape[0]):
                    kept = int(torch.randint(1, mask.shape[1] + 1, (1,), generator=generator))
                    mask[layer, torch.randperm(mask.shape[1], generator=generator)[kept:]] = 0.0
        shrink_model(model, head_mask)
        shrink_ffn_model(model, ffn_mask)
        assert costs.cost_of(head_mask, ffn_mask) < costs.full_cost()
    else:
        set_head_mask(model, head_mask)  # all ones: the explicit products (the counter does not see CPU SDPA)
    dictionary = task.source_dictionary
    words = torch.randint(dictionary.nspecial, len(dictionary), (sentences, source_length - 1), generator=generator)
    sample = {"net_input": {"src_tokens": torch.cat([words, torch.full((sentences, 1), dictionary.eos())], 1),
                            "src_lengths": torch.full((sentences,), source_length)}, "id": torch.arange(sentences)}
    search = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                               min_len=length)
    with torch.no_grad(), unfused_attention(), FlopCounterMode(display=False) as counter:
        hypotheses = search.generate([model], sample)
    assert all(len(h[0]["tokens"]) == length + 1 for h in hypotheses)  # exactly the steps priced
    output = output_projection_flops(architecture["dims"]["dec-dec"][0], len(task.target_dictionary), shape)
    assert counter.get_total_flops() == pytest.approx(sentences * (costs.cost_of(head_mask, ffn_mask) + output),
                                                      rel=1e-9)


def test_decoding_flops_of_a_sentence_as_computed_by_hand():
    """d = 4, d_h = 2, S = 3 source tokens, T = 2 steps, beam 2: the terms of each head and neuron."""
    from fairseq_headprune.study.search.costs import (
        DecodingShape,
        decoding_flops_costs,
        output_projection_flops,
    )

    shape = DecodingShape(3, 2, 2)
    costs = decoding_flops_costs({"enc-enc": (1, 1), "dec-dec": (1, 1), "enc-dec": (1, 1)},
                                 {t: (4, 2) for t in ("enc-enc", "dec-dec", "enc-dec")},
                                 {"enc-ffn": (1, 1), "dec-ffn": (1, 1)}, {"enc-ffn": 4, "dec-ffn": 4}, shape)
    assert costs.cost_at(("enc-enc", 0), 1) == 3 * (8 * 4 * 2 + 4 * 3 * 2)  # 3 tokens, each attending to 3
    assert costs.cost_at(("dec-dec", 0), 1) == 2 * (2 * 8 * 4 * 2 + 4 * 2 * (1 + 2))  # steps attend to 1, then 2
    assert costs.cost_at(("enc-dec", 0), 1) == 2 * (3 * 4 * 4 * 2 + 2 * (4 * 4 * 2 + 4 * 3 * 2))
    assert costs.cost_at(("enc-ffn", 0), 1) == 3 * 4 * 4 and costs.cost_at(("dec-ffn", 0), 1) == 2 * 2 * 4 * 4
    assert output_projection_flops(4, 10, shape) == 2 * 2 * 2 * 4 * 10
    assert costs.unit == "attention and FFN FLOPs per translated sentence"
    with pytest.raises(SettingsError, match="a decoding cost needs a positive beam, got 0"):
        DecodingShape(3, 2, 0)


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
    assert SearchBudget.parse("50%").resolve(costs) == 112
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
    result = search_mask(heads, None, costs, SearchBudget.parse("50%").resolve(costs), rearranged=False,
                         neurons=neurons,
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
    budget = SearchBudget.parse("40%").resolve(costs)
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


# ---- the search and latency commands on the tiny trained model ----------------------------------------


def search(tiny_model, out_dir, *extra, check=True, capsys=None):
    """The command in a process of its own, or with ``capsys`` in this one (for the refusals)."""
    from conftest import run, run_in_process

    command = ["search", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out-dir", out_dir, "--no-progress",
               *extra]
    if capsys is not None:
        return run_in_process(command, capsys)
    return run(["fairseq-headprune", *command], check=check)


@pytest.fixture
def neuron_fisher(neuron_scores):
    """An importance file of Fisher scores for heads (with blocks) and FFN neurons (conftest's, shared)."""
    return neuron_scores


def test_a_joint_search_writes_masks_that_fairseq_generate_applies_as_search_json_says(tiny_model, neuron_fisher,
                                                                                       tiny_task_and_model, tmp_path):
    """The heads and neurons search.json reports are exactly those --head-mask and --ffn-mask mask: fairseq-generate
    with both files equals stock fairseq on a checkpoint with those heads' and neurons' output columns zeroed."""
    from test_fairseq_cli import generate, hypotheses

    import fairseq_headprune.compat.torch_load  # noqa: F401  (allow-list)
    from fairseq_headprune.study.masks.ffn_mask import parse_ffn_mask, read_ffn_mask_file
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    from conftest import save_zeroed_checkpoint

    out = tmp_path / "joint"
    result = search(tiny_model, out, "--fisher", neuron_fisher, "--structure", "joint", "--cost", "flops",
                    "--budget", "80%")  # a pruning the tiny model still translates with (beams comparable)
    record = json.loads((out / "search.json").read_text())
    ffn_layout, head_layout = ({"enc-ffn": (2, 128), "dec-ffn": (2, 128)},
                               {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")})
    ffn_mask = parse_ffn_mask(record["ffn_spec"], ffn_layout)
    head_mask = parse_head_mask(record["spec"], head_layout)
    written = read_ffn_mask_file(str(out / "ffn_mask.json"), ffn_layout)
    assert all(torch.equal(written[t], ffn_mask[t]) for t in ffn_layout)
    assert record["neurons_pruned"] == sum(int((m == 0).sum()) for m in ffn_mask.values())
    assert record["result"]["kept_neurons"] == {f"{t}:{layer + 1}": int(ffn_mask[t][layer].sum())
                                                for t in ffn_layout for layer in range(2)}
    assert 0 < record["neurons_pruned"] < 512 and 0 < record["heads_pruned"] < 48  # both structures pruned here
    assert f"pruned {record['neurons_pruned']} of 512 FFN neurons: {record['ffn_spec']}" in result.stdout
    assert f"pruned {record['heads_pruned']} of 48 heads" in result.stdout
    # the FLOPs kept, counted by torch's FlopCounterMode on the narrowed layers (32 positions)
    from conftest import counted_flops_per_token

    counted = counted_flops_per_token(tiny_task_and_model[1], 32)
    kept = sum(counted[(t, layer)][int(m[layer].sum()) - 1] for t, m in head_mask.items() for layer in range(len(m))
               if m[layer].sum() > 0)
    kept += sum(counted[(t, layer)] * float(m[layer].sum()) / m.size(1) for t, m in ffn_mask.items()
                for layer in range(len(m)))
    assert record["flops"]["kept"] == record["result"]["cost"] == pytest.approx(kept)
    full = sum(v[-1] if isinstance(v, list) else v for v in counted.values())
    assert record["flops"]["full"] == record["full_cost"] == full
    assert record["result"]["cost"] <= 0.8 * record["full_cost"]
    assert f"({100 * record['flops']['kept'] / record['flops']['full']:.1f}%" in result.stdout
    # through fairseq-generate: the two mask files against stock fairseq on zeroed columns
    zeroed = tmp_path / "zeroed.pt"
    checkpoint = str(tiny_model["checkpoint"])
    for attention_type, prefix in (("enc-enc", "encoder.layers.{}.self_attn."),
                                   ("enc-dec", "decoder.layers.{}.encoder_attn."),
                                   ("dec-dec", "decoder.layers.{}.self_attn.")):
        save_zeroed_checkpoint(checkpoint, prefix, 8, head_mask[attention_type], zeroed)
        checkpoint = str(zeroed)
    state = torch.load(zeroed, map_location="cpu")
    for ffn_type, stack in (("enc-ffn", "encoder"), ("dec-ffn", "decoder")):
        for layer in range(2):
            state["model"][f"{stack}.layers.{layer}.fc2.weight"][:, ffn_mask[ffn_type][layer] == 0] = 0.0
    torch.save(state, zeroed)
    stock = generate(dict(tiny_model, checkpoint=zeroed), "--task", "translation").stdout
    masked = generate(tiny_model, "--task", "fairseq-headprune", "--head-mask", out / "mask.json",
                      "--ffn-mask", out / "ffn_mask.json")
    ours, theirs = ([line.split("\t") for line in hypotheses(text)] for text in (masked.stdout, stock))
    assert [(h[0], h[2]) for h in ours] == [(h[0], h[2]) for h in theirs] and len(theirs) > 0
    # masked heads take the plugin's attention path, zeroed ones fairseq's: scores agree to float rounding
    assert max(abs(float(a[1]) - float(b[1])) for a, b in zip(ours, theirs)) < 1e-4
    assert f"masking {record['neurons_pruned']} FFN neurons" in masked.stderr


def test_an_ffn_search_keeps_every_head_and_uniform_keeps_one_head_count_per_type(tiny_model, neuron_fisher, tmp_path,
                                                                                  capsys):
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    search(tiny_model, tmp_path / "ffn", "--fisher", neuron_fisher, "--structure", "ffn", "--cost", "flops",
           "--budget", "50%")
    record = json.loads((tmp_path / "ffn" / "search.json").read_text())
    assert record["spec"] == "none" and record["heads_pruned"] == 0
    assert record["full_cost"] == 256 * 512 and record["result"]["cost"] <= 256 * 256  # 256 of 512 neurons kept
    assert record["neurons_pruned"] >= 256
    search(tiny_model, tmp_path / "uniform", "--fisher", neuron_fisher, "--structure", "joint", "--cost", "flops",
           "--budget", "50%", "--uniform", "--neuron-step", "16")
    record = json.loads((tmp_path / "uniform" / "search.json").read_text())
    head_mask = parse_head_mask(record["spec"], {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")})
    assert record["heads_pruned"] > 0 and all(m.sum(dim=1)[0] == m.sum(dim=1)[1] for m in head_mask.values())
    assert all(k % 16 == 0 for k in record["result"]["kept_neurons"].values())
    assert record["result"]["uniform"] and record["uniform"]
    # the decoder's self- and cross-attention at one count too: exported to CTranslate2 without padding
    search(tiny_model, tmp_path / "tied", "--fisher", neuron_fisher, "--structure", "joint", "--cost", "flops",
           "--budget", "40%", "--uniform", "--tie-decoder-heads", "--neuron-step", "16")
    record = json.loads((tmp_path / "tied" / "search.json").read_text())
    head_mask = parse_head_mask(record["spec"], {t: (2, 8) for t in ("enc-enc", "enc-dec", "dec-dec")})
    decoder = {int(count) for t in ("enc-dec", "dec-dec") for count in head_mask[t].sum(dim=1)}
    assert record["heads_pruned"] > 0 and len(decoder) == 1, record["spec"]
    refused = search(tiny_model, tmp_path / "refused", "--fisher", neuron_fisher, "--structure", "joint", "--cost",
                     "flops", "--budget", "40%", "--tie-decoder-heads", capsys=capsys)
    assert refused.returncode == 2 and refused.stderr.strip().endswith("--tie-decoder-heads goes with --uniform")


def test_latency_tables_time_ffn_layers_and_price_a_joint_search(tiny_model, tmp_path):
    """The table times FFN layers in steps; a joint search estimates its neuron scores itself."""
    from conftest import run

    table = tmp_path / "latency.json"
    run(["fairseq-headprune", "latency", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out", table,
         "--repeats", "2", "--sentences", "4", "--sequence-length", "8", "--neuron-step", "32", "--no-progress"])
    payload = json.loads(table.read_text())
    assert (payload["engine"], payload["precision"]) == ("fairseq", "float32")
    assert payload["kept_counts"] == {f"{t}:{layer}": [0, 32, 64, 96, 128] for t in ("enc-ffn", "dec-ffn")
                                      for layer in (1, 2)}
    assert sorted(payload["per_layer_ms"]) == sorted(f"{t}:{layer}" for t in ("enc-enc", "enc-dec", "dec-dec")
                                                     for layer in (1, 2))
    assert all(len(payload["ffn_layer_ms"][name]) == 5 for name in payload["kept_counts"])
    out = tmp_path / "search"
    result = search(tiny_model, out, "--structure", "joint", "--cost", "latency", "--latency-table", table,
                    "--budget", "50%", "--importance-limit", "16")
    record = json.loads((out / "search.json").read_text())
    assert record["fisher_sentences"] == 16 and "ms" in result.stdout
    assert record["result"]["cost"] <= record["full_cost"] / 2 + 1e-9
    assert set(record["result"]["kept_neurons"].values()) <= {0, 32, 64, 96, 128}
    timings = list(payload["per_layer_ms"].values()) + list(payload["ffn_layer_ms"].values())
    assert record["full_cost"] == pytest.approx(sum(v[-1] for v in timings))


# the shape of the CTranslate2 latency table below
SENTENCES, SOURCE_TOKENS, GENERATED, BEAM, REPEATS = 8, 12, 6, 2, 3


def ctranslate2_latency_table(data, checkpoint, table, *options):
    from conftest import run

    return run(["fairseq-headprune", "latency", data, "--path", checkpoint, "--out", table, "--engine", "ctranslate2",
                "--sentences", SENTENCES, "--sequence-length", SOURCE_TOKENS, "--target-length", GENERATED,
                "--beam", BEAM, "--repeats", REPEATS, *options, "--no-progress", "--cpu"])


@pytest.fixture(scope="module")
def tiny_ctranslate2_table(tiny_model, tmp_path_factory):
    """The tiny model's CTranslate2 latency table (FFN layers priced every 32 neurons) and the command's output."""
    pytest.importorskip("ctranslate2")
    table = tmp_path_factory.mktemp("ct2_latency") / "latency.json"
    result = ctranslate2_latency_table(tiny_model["data"], tiny_model["checkpoint"], table, "--neuron-step", "32")
    return table, result.stdout


def test_ctranslate2_latency_tables_price_whole_stacks_and_a_uniform_search_exports_unpadded(
        tiny_model, tiny_ctranslate2_table, tmp_path, capsys):
    """Timed in CTranslate2: the decoder's self- and cross-attention priced alike; the search must be uniform."""
    from conftest import run

    table, stdout = tiny_ctranslate2_table
    assert "use with search --uniform --latency-engine ctranslate2 --latency-precision float32" in stdout
    payload = json.loads(table.read_text())
    assert (payload["engine"], payload["precision"]) == ("ctranslate2", "float32")
    shape = payload["settings"]
    assert (shape["beam"], shape["target_length"], shape["sequence_length"], shape["batch_size"]) == (2, 6, 12, 8)
    assert "beam 2, 8 sentences of 12 source tokens, 6 generated; the whole model decodes in " in stdout
    priced_neurons = [0, 32, 64, 96, 128]
    assert payload["kept_counts"] == {f"{t}:{layer}": priced_neurons
                                      for t in ("enc-ffn", "dec-ffn") for layer in (1, 2)}
    prices = dict(payload["per_layer_ms"], **payload["ffn_layer_ms"])
    for name, costs in prices.items():
        assert costs[0] == 0.0 and costs == sorted(costs), name  # over the narrowest, non-decreasing
    for layer in (1, 2):  # one stack: its time is shared evenly by every layer of both types
        assert prices[f"dec-dec:{layer}"] == prices[f"enc-dec:{layer}"] == prices["dec-dec:1"]
    # the prices from the variants' recorded times: each group timed keeping none, half and all of its units (the
    # widest is the whole model), its price at every count read off the straight lines between them (numpy's
    # interp) less the narrowest's, never below 0 and non-decreasing, shared by the group's layers
    variants, whole = shape["variants_ms"], shape["whole_model_ms"]
    assert whole == pytest.approx(1000.0 * statistics.median(shape["whole_model_seconds"]))
    assert len(shape["whole_model_seconds"]) == REPEATS
    for group, blocks, units in (("enc-enc", ["enc-enc:1", "enc-enc:2"], 8), ("dec-dec+enc-dec", [
            f"{t}:{layer}" for t in ("dec-dec", "enc-dec") for layer in (1, 2)], 8),
            ("enc-ffn", ["enc-ffn:1", "enc-ffn:2"], 128), ("dec-ffn", ["dec-ffn:1", "dec-ffn:2"], 128)):
        kept = [int(k) for k in variants[group]]
        assert kept == [0, units // 2, units] and variants[group][str(units)] == whole, group
        priced = range(units + 1) if units == 8 else priced_neurons
        times = np.interp(priced, kept, list(variants[group].values()))
        expected = np.maximum.accumulate(np.clip(np.minimum(times, whole) - times[0], 0.0, None)) / len(blocks)
        assert prices[blocks[0]] == pytest.approx(list(expected), abs=1e-9), group
    search_command = ["--structure", "joint", "--cost", "latency", "--latency-table", table, "--budget", "60%",
                      "--importance-limit", "16", "--latency-engine", "ctranslate2"]
    refused = search(tiny_model, tmp_path / "refused", *search_command, capsys=capsys)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "price dec-dec+enc-dec as one stack" in refused.stderr and "search with --uniform" in refused.stderr
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "search"
    search(tiny_model, out, *search_command, "--uniform")
    record = json.loads((out / "search.json").read_text())
    kept = record["result"]["kept"]
    assert len({len(kept[f"{t}:{layer}"]) for t in ("dec-dec", "enc-dec") for layer in (1, 2)}) == 1
    assert len({len(kept[f"enc-enc:{layer}"]) for layer in (1, 2)}) == 1
    assert record["result"]["cost"] <= record["full_cost"] * 0.6 + 1e-9
    # the speed-up the table predicts: the whole model's time over what is left once the mask saves its prices
    saved = record["full_cost"] - record["result"]["cost"]
    assert saved > 0
    if whole > saved:
        assert record["predicted_speedup"] == pytest.approx(whole / (whole - saved))
    else:  # timings too noisy to add up (e.g. beside other work): no prediction, and said so
        assert record["predicted_speedup"] is None
    exported = run(["fairseq-headprune", "export", tiny_model["data"], "--path", tiny_model["checkpoint"],
                    "--head-mask", out / "mask.json", "--ffn-mask", out / "ffn_mask.json", "--out-dir",
                    tmp_path / "ct2", "--cpu"])
    assert "zero heads pad" not in exported.stdout


@pytest.mark.parametrize("change, message", [
    ({"engine": "ctranslate2"}, "was measured on another engine (ctranslate2), not this one (fairseq)"),
    ({"precision": "float16"}, "was measured on another precision (float16), not this one (float32)"),
    ({"device": "cuda: NVIDIA H100"}, "was measured on another device (cuda: NVIDIA H100), not this one (cpu: "),
])
def test_a_latency_table_of_another_engine_device_or_precision_is_one_line(tiny_model, tmp_path, change, message,
                                                                         capsys):
    from conftest import run

    table = tmp_path / "latency.json"
    run(["fairseq-headprune", "latency", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out", table,
         "--repeats", "1", "--sentences", "2", "--sequence-length", "4", "--neuron-step", "64", "--no-progress"])
    table.write_text(json.dumps(dict(json.loads(table.read_text()), **change)))
    result = search(tiny_model, tmp_path / "search", "--structure", "joint", "--cost", "latency",
                    "--latency-table", table, "--budget", "50%", capsys=capsys)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith(f"fairseq-headprune search: error: --latency-table {table} {message}")
    assert not (tmp_path / "search").exists()


def test_bad_structure_input_is_one_line(tiny_model, heads_only_scores, tmp_path, capsys):
    heads_only = heads_only_scores
    cases = [
        (["--fisher", heads_only, "--structure", "ffn", "--cost", "flops"],
         f"--fisher {heads_only} has no FFN neuron scores; estimate them with importance --importance-method fisher "
         "--importance-structures heads,ffn"),
        (["--structure", "joint"], "--structure joint prunes FFN neurons: a budget of heads cannot count them; "
                                   "use --cost flops or --cost latency"),
        (["--neuron-step", "4"], "--neuron-step is for --structure ffn or joint"),
        (["--structure", "ffn", "--cost", "flops", "--uniform"],
         "--uniform evens the heads kept per attention type: --structure heads or joint"),
        (["--structure", "ffn", "--cost", "flops", "--neuron-step", "0"], "--neuron-step must be positive, got 0"),
    ]
    for args, message in cases:
        result = search(tiny_model, tmp_path / "out", "--budget", "50%", *args, capsys=capsys)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == f"fairseq-headprune search: error: {message}"
        assert not (tmp_path / "out").exists()


def test_a_decoding_flops_search_prices_the_valid_splits_sentence_at_fairseqs_beam(tiny_model, neuron_scores, tmp_path,
                                                                                   capsys):
    """search --cost decoding-flops: the sentence priced is the valid split's mean source and target lengths (read
    here from fairseq's binarized sizes) plus </s>, at fairseq's --beam; the mask keeps at most the budget; lengths
    outside this cost are refused in one line."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from fairseq_headprune.study.search.costs import DecodingShape, output_projection_flops

    out = tmp_path / "search"
    result = search(tiny_model, out, "--structure", "joint", "--cost", "decoding-flops", "--budget", "50%",
                    "--fisher", neuron_scores, "--beam", "4", "--cpu")
    record = json.loads((out / "search.json").read_text())
    decoding = record["decoding_flops"]
    datasets = {side: MMapIndexedDataset(str(tiny_model["data"] / f"valid.en-fr.{side}")) for side in ("en", "fr")}
    source, target = (int(round(float(np.mean(np.array(datasets[side].sizes))) - 1)) for side in ("en", "fr"))
    assert (decoding["source_length"], decoding["target_steps"], decoding["beam"]) == (source + 1, target + 1, 4)
    assert record["cost"] == "decoding-flops" and decoding["layers_full"] == record["full_cost"]
    assert decoding["layers_kept"] == record["result"]["cost"] <= 0.5 * record["full_cost"] + 1e-6
    dictionary = len((tiny_model["data"] / "dict.fr.txt").read_text().splitlines()) + 4  # and the 4 specials
    assert decoding["output_projection"] == output_projection_flops(64, dictionary, DecodingShape(source + 1,
                                                                                                  target + 1, 4))
    assert "decoding FLOPs per sentence (beam 4," in result.stdout and "the layers keep" in result.stdout
    refused = search(tiny_model, tmp_path / "refused", "--structure", "joint", "--cost", "flops", "--budget", "50%",
                     "--source-length", "12", capsys=capsys)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "--source-length and --target-length shape the sentence --cost decoding-flops prices" in refused.stderr
    assert not (tmp_path / "refused").exists()
