"""Budhraja et al. (2020)'s configurations: layer strategies, random levels, the paper's tables, compensation.

References: the paper's own layer lists and counts (Tables 1-6, for its
12-layer BERT and 6-layer Transformer), and for compensation a direct
per-head computation over the raw state dicts of two checkpoints.
"""

import math

import numpy as np
import pytest
import torch

from fairseq_headprune.cli import command_flags
from fairseq_headprune.errors import HeadMaskError, SettingsError
from fairseq_headprune.study.budhraja.budgets import budget_mask, level_budget, one_head_per_layer_budget, plan_budgets
from fairseq_headprune.study.budhraja.compensation import measure_compensation
from fairseq_headprune.study.budhraja.configurations import (
    TABLE2,
    paper_budgets,
    parse_tables,
    resample_profile,
    table1_budgets,
    table2_budgets,
    table3_budgets,
)
from fairseq_headprune.study.budhraja.layer_strategies import (
    PAPER_COUNTS,
    paper_strategies,
    parse_layer_strategy,
    strategy_mask,
)

BERT = {"enc-enc": (12, 12)}
PAPER_TRANSFORMER = {"enc-enc": (6, 8), "enc-dec": (6, 8), "dec-dec": (6, 8)}
DEMO = {"enc-enc": (3, 8), "enc-dec": (3, 8), "dec-dec": (3, 8)}


@pytest.mark.parametrize("text, layers", [
    ("top:1", [12]), ("top:3", [10, 11, 12]), ("bottom:3", [1, 2, 3]), ("bottom:8", list(range(1, 9))),
    ("top+bottom:2", [1, 12]), ("top+bottom:4", [1, 2, 11, 12]), ("top+bottom:6", [1, 2, 3, 10, 11, 12]),
    ("middle:2", [6, 7]), ("middle:4", [5, 6, 7, 8]), ("middle:6", [4, 5, 6, 7, 8, 9]),
    ("middle:8", [3, 4, 5, 6, 7, 8, 9, 10]),
    ("even", [2, 4, 6, 8, 10, 12]), ("odd", [1, 3, 5, 7, 9, 11]),
])
def test_layer_strategies_expand_to_the_papers_layers_of_a_12_layer_model(text, layers):
    strategy = parse_layer_strategy(text, BERT)
    assert strategy.layers(12) == layers
    mask = strategy_mask(strategy, BERT)["enc-enc"]
    assert [layer + 1 for layer in range(12) if mask[layer].sum() == 0] == layers
    assert all(mask[layer - 1].sum() == 0 for layer in layers)
    assert int(mask.sum()) == 12 * (12 - len(layers))


def test_paper_strategies_at_12_layers_are_tables_5_and_6_exactly():
    table5 = {s.label for s in paper_strategies(12, (5,))}
    expected = {f"{name}:{k}" for name, counts in PAPER_COUNTS.items() for k in counts}
    assert table5 == expected
    table6 = {s.label for s in paper_strategies(12, (6,))}
    assert table6 == {"top:6", "bottom:6", "even", "odd", "top+bottom:6", "middle:6"}
    # every Table 6 strategy prunes half of the layers
    assert all(len(s.layers(12)) == 6 for s in paper_strategies(12, (6,)))


def test_a_strategy_per_attention_type_prunes_that_type_only():
    mask = strategy_mask(parse_layer_strategy("enc-dec:middle:1", DEMO), DEMO)
    assert mask["enc-dec"][1].sum() == 0 and mask["enc-dec"].sum() == 16
    assert mask["enc-enc"].sum() == 24 and mask["dec-dec"].sum() == 24


@pytest.mark.parametrize("text, message", [
    ("top:4", "prunes 4 layers; enc-enc has 3"), ("middle", "needs a number of layers"), ("odd:2", "takes no number"),
    ("sideways:1", "unknown strategy or attention type"), ("top+bottom:1", "needs K >= 2"),
])
def test_a_strategy_the_model_cannot_take_is_one_clear_error(text, message):
    with pytest.raises(HeadMaskError, match=message):
        parse_layer_strategy(text, DEMO)


def test_the_87_percent_sampler_keeps_exactly_one_head_per_layer_of_each_type():
    budget = one_head_per_layer_budget(PAPER_TRANSFORMER)
    assert budget.pruned_percent(PAPER_TRANSFORMER) == pytest.approx(87.5)
    kept_heads = set()
    for draw in range(1, 21):
        mask = budget_mask(budget, PAPER_TRANSFORMER, seed=1, draw=draw)
        for attention_type, values in mask.items():
            assert values.sum(dim=1).tolist() == [1.0] * 6, (attention_type, draw)
            kept_heads |= {(attention_type, layer, int(values[layer].argmax())) for layer in range(6)}
    # the kept head is drawn, not fixed: over 20 draws most of the 144 heads are kept at least once
    assert len(kept_heads) > 100


@pytest.mark.parametrize("percent", [25, 35, 50, 55, 60, 75, 81])
def test_random_levels_prune_the_rounded_up_count_and_keep_a_head_in_every_layer(percent):
    budget = level_budget(percent, PAPER_TRANSFORMER)
    assert budget.level == math.ceil(percent * 144 / 100)
    for draw in (1, 2, 3):
        mask = budget_mask(budget, PAPER_TRANSFORMER, seed=7, draw=draw)
        assert sum(int((m == 0).sum()) for m in mask.values()) == budget.level
        assert all(bool((m.sum(dim=1) >= 1).all()) for m in mask.values())
    # draws differ, and the same (seed, draw) gives the same mask
    first, again = (budget_mask(budget, PAPER_TRANSFORMER, seed=7, draw=1) for _ in range(2))
    other = budget_mask(budget, PAPER_TRANSFORMER, seed=7, draw=2)
    assert all(torch.equal(first[t], again[t]) for t in first)
    assert not all(torch.equal(first[t], other[t]) for t in first)


def test_a_level_that_cannot_keep_one_head_per_layer_is_refused():
    with pytest.raises(HeadMaskError, match=r"cannot keep 1 head\(s\) in every one of the model's 9 layers"):
        level_budget(90, DEMO)  # 65 of 72 pruned; at most 63 leave a head in each of 9 layers


def test_table1_on_the_papers_model_has_its_levels_and_87_percent():
    budgets = table1_budgets(PAPER_TRANSFORMER)
    assert [round(b.pruned_percent(PAPER_TRANSFORMER)) for b in budgets] == [25, 35, 50, 56, 60, 75, 81, 88]
    assert budgets[-1].label == "one head per layer"


def test_table2_and_table3_reproduce_the_papers_counts_on_its_own_model():
    # at the paper's depth and width the resampled profiles are the paper's digits
    for profiles in TABLE2.values():
        for profile in profiles:
            assert resample_profile([int(c) for c in profile], 6, 8) == [int(c) for c in profile]
    kept = [b for b in table2_budgets(PAPER_TRANSFORMER) if b.note.endswith("kept")]
    assert [b.label for b in kept] == [" ".join(p) for p in TABLE2.values()]
    # the "pruned" configurations are the kept ones reversed, layer by layer
    pruned = [b for b in table2_budgets(PAPER_TRANSFORMER) if b.note.endswith("pruned")]
    for keep, prune in zip(kept, pruned):
        assert all(prune.per_layer[t] == keep.per_layer[t][::-1] for t in keep.per_layer)
    triples = [tuple(b.per_type[t] for t in ("enc-enc", "enc-dec", "dec-dec"))
               for b in table3_budgets(PAPER_TRANSFORMER)]
    assert triples[:3] == [(14, 31, 30), (31, 14, 30), (30, 31, 14)] and triples[-1] == (12, 9, 5)


def test_table2_resampled_to_a_shallower_model_keeps_the_papers_share():
    for level, profiles in TABLE2.items():
        for profile in profiles:
            counts = resample_profile([int(c) for c in profile], 3, 8)
            paper_share = sum(int(c) for c in profile) / 48
            assert all(1 <= c <= 8 for c in counts)
            assert abs(sum(counts) / 24 - paper_share) <= 1 / 24 + 1e-9, (level, profile, counts)


def test_paper_budgets_refuse_translation_tables_on_an_encoder_and_parse_table_lists():
    with pytest.raises(SettingsError, match="Table 2 budgets the three attention types"):
        paper_budgets([2], BERT)
    assert parse_tables("all") == [1, 2, 3, 4, 5, 6] and parse_tables("3,1") == [1, 3]
    with pytest.raises(SettingsError, match="expected table numbers from 1-6"):
        parse_tables("7")
    bert = paper_budgets([4, 5, 6], BERT)
    assert sum(b.kind == "level" for b in bert) == 9  # 10 ... 90%: one head in each of 12 layers keeps 90% possible
    assert len(plan_budgets(bert, BERT, seed=1, draws=3)) == 9 * 3 + sum(b.kind == "layers" for b in bert)


def test_the_tables_draws_leave_the_hand_given_levels_and_their_masks_as_they_were(tmp_path):
    """The long study's grid: Table 1's 50, 60, 75% by hand with 3 draws, the rest of Tables 1-3 with 1. The levels
    given by hand keep their draws and masks (a finished run's configurations are found again) and take the table's
    place; the others get one draw each."""
    from fairseq_headprune.study.budhraja.configurations import requested_budgets
    from fairseq_headprune.study.finetune.settings import FinetuneSettings
    from fairseq_headprune.study.pruning.settings import PruneSettings
    from fairseq_headprune.study.settings import SweepSettings

    (tmp_path / "train.en-fr.en.bin").write_bytes(b"")

    def study(**options):
        return PruneSettings(SweepSettings(str(tmp_path), "c", "o"), orders=[], draws=3,
                             finetune=FinetuneSettings(updates=10), **options)

    grid = study(random_levels=[50.0, 60.0, 75.0], budhraja_tables=[1, 2, 3], budhraja_draws=1)
    drawn = plan_budgets(requested_budgets(grid, DEMO), DEMO, seed=1, draws=grid.draws)
    counts = {}
    for budget, _, _ in drawn:
        counts[budget.label] = counts.get(budget.label, 0) + 1
    assert [counts[level] for level in ("50%", "60%", "75%")] == [3, 3, 3]
    assert counts["25%"] == counts["one head per layer"] == 1 and len(counts) == 8 + 10 + 12
    assert len(drawn) == 3 * 3 + 5 + 10 + 12
    fifty = next(budget for budget, _, _ in drawn if budget.label == "50%")
    assert fifty.note == "Table 1, 50% pruned"  # the table's place, on the hand-given level
    before = plan_budgets(requested_budgets(study(random_levels=[50.0, 60.0, 75.0]), DEMO), DEMO, seed=1, draws=3)
    masks = {(b.label, d): m for b, d, m in drawn}
    assert all(torch.equal(masks[(b.label, d)][t], m[t]) for b, d, m in before for t in m)
    with pytest.raises(SettingsError, match="the budhraja draws goes with the budhraja tables") as error:
        study(random_levels=[50.0], budhraja_draws=1)
    assert error.value.worded(command_flags("prune")) == "--budhraja-draws goes with --budhraja-tables"


def test_the_pairs_tested_against_each_other_are_the_papers_side_by_side():
    from fairseq_headprune.study.budhraja.pairs import within_pairs
    from fairseq_headprune.study.budhraja.records import FinetuneRecord

    def layers(label, tables=(5,)):
        return FinetuneRecord(label, label, "x", 0.0, 0.0, "accuracy", "2 updates", kind="layers", tables=list(tables))

    records = [layers(label) for label in ("middle:2", "top+bottom:2", "middle:4", "top:1", "bottom:1", "top:2",
                                           "enc-enc:middle:2", "enc-enc:top+bottom:2", "dec-dec:middle:2")]
    records += [layers("odd", (6,)), layers("even", (6,)), layers("top:3", (5, 6)), layers("bottom:3", (5, 6)),
                layers("enc-enc:top:3", (6,))]
    records.append(FinetuneRecord("control", "unpruned (control)", "none", 0.0, 0.0, "accuracy", "2 updates"))
    pairs = {(first.label, second.label) for first, second in within_pairs(records)}
    assert pairs == {("middle:2", "top+bottom:2"), ("top:1", "bottom:1"), ("enc-enc:middle:2", "enc-enc:top+bottom:2"),
                     ("top:3", "bottom:3"), ("odd", "top:3"), ("odd", "bottom:3")}


def test_the_plan_lists_the_configurations_by_table_and_what_is_finished():
    from fairseq_headprune.study.budhraja.finetune_plan import (
        PlannedConfiguration,
        TrainingHistory,
        plan_line,
        plan_text,
    )

    planned = [PlannedConfiguration("unpruned (control)", "the control", True, 600.0)]
    planned += [PlannedConfiguration("50%", "Table 1", draw < 2, 900.0 if draw < 2 else None) for draw in range(3)]
    planned += [PlannedConfiguration("25%", "Table 1"), PlannedConfiguration("864 468 864", "Table 2")]
    line = plan_line(len(planned), 4, 500, 0, 12, TrainingHistory(490, 10, 490 * 1.86), "left, one at a time")
    text = plan_text(planned, line)
    assert text.splitlines() == [
        "the fine-tuning plan (nothing is run): 6 configurations, 3 finished",
        "  the control (1, 1 finished): unpruned (control)",
        "  Table 1 (4, 2 finished): 50% ×3, 25%",
        "  Table 2 (1, 0 finished): 864 468 864",
        line,
        "the 3 finished took a median 15 min each as they ran (their record.json; processes that ran at once shared "
        "the cores)"]
    assert line.endswith("about 16 min per configuration, 62 min for the 4 left, one at a time")


def test_compensation_equals_a_direct_per_head_computation():
    generator = torch.Generator().manual_seed(0)
    layout = {"enc-enc": (2, 4), "enc-dec": (2, 4), "dec-dec": (2, 4)}
    before = {(t, layer): tuple(torch.randn(16, 16, generator=generator) for _ in range(3))
              for t in layout for layer in range(2)}
    after = {key: tuple(w + 0.1 * (1 + key[1]) * torch.randn(16, 16, generator=generator) for w in weights)
             for key, weights in before.items()}
    pruned = {t: torch.ones(2, 4) for t in layout}
    pruned["enc-enc"][0, 3] = 0
    result = measure_compensation(before, after, layout, pruned)
    for (attention_type, layer), weights in before.items():
        letter = {"enc-enc": "E", "enc-dec": "A", "dec-dec": "D"}[attention_type]
        for head in range(4):
            old = np.concatenate([w.numpy()[head * 4:(head + 1) * 4] for w in weights])
            new = np.concatenate([w.numpy()[head * 4:(head + 1) * 4] for w in after[(attention_type, layer)]])
            values = result.heads[f"{letter}:{layer + 1}:{head + 1}"]
            assert values["mean_abs_change"] == pytest.approx(np.abs(new - old).mean(), rel=1e-6)
            assert values["relative_change"] == pytest.approx(
                np.linalg.norm(new - old) / np.linalg.norm(old), rel=1e-6)
    assert result.pruned == ["E:1:4"]
    means = result.layer_means["mean_abs_change"]["enc-enc"]
    assert means[0] == pytest.approx(np.mean([result.heads[f"E:1:{h}"]["mean_abs_change"] for h in (1, 2, 3)]))
    every = [m for t in layout for m in result.layer_means["mean_abs_change"][t]]
    assert result.spread() == pytest.approx((max(every) - min(every)) / min(every))


def test_finetuning_settings_name_the_option_to_correct(tmp_path):
    from fairseq_headprune.study.finetune.settings import FinetuneSettings
    from fairseq_headprune.study.pruning.settings import PruneSettings
    from fairseq_headprune.study.settings import SweepSettings

    (tmp_path / "train.en-fr.en.bin").write_bytes(b"")
    data = str(tmp_path)

    def prune(**options):
        return PruneSettings(SweepSettings(data, "c", "o"), **options)

    cases = [
        (lambda: FinetuneSettings(updates=10, epochs=2), "not both"),
        (lambda: FinetuneSettings(lr=0.1), "go with --finetune-updates/--finetune-epochs"),
        (lambda: prune(finetune=FinetuneSettings(updates=10)), "nothing to fine-tune"),
        (lambda: prune(finetune_levels=[50.0]), "--finetune-levels goes with --finetune-updates/--finetune-epochs N"),
        (lambda: prune(config_shard=(3, 2), finetune=FinetuneSettings(updates=10), random_levels=[50.0]),
         "--config-shard 3/2"),
        (lambda: prune(config_shard=(1, 2)), "--config-shard shares the fine-tuned configurations"),
        (lambda: prune(random_levels=[100.0]), "--random-level 100"),
        (lambda: FinetuneSettings(updates=500, curve=[600]), "--finetune-curve 600: a point is an update count"),
        (lambda: FinetuneSettings(epochs=3, curve=[40]), "with --finetune-epochs the curve is scored at every epoch"),
        (lambda: prune(orders=[], random_levels=[50.0], finetune=FinetuneSettings(updates=10), finetune_levels=[50.0]),
         "--finetune-levels fine-tunes the curves' steps"),
        (lambda: PruneSettings(SweepSettings(str(tmp_path / "elsewhere"), "c", "o"), random_levels=[50.0],
                               finetune=FinetuneSettings(updates=10)), "has no training split"),
    ]
    for make, message in cases:  # as the prune command words them
        with pytest.raises(SettingsError) as error:
            make()
        assert message in error.value.worded(command_flags("prune")), (message, str(error.value))
    settings = prune(random_levels=[50.0], finetune=FinetuneSettings(epochs=30), finetune_levels=[60.0])
    assert settings.has_budgets and settings.finetune.length() == "30 epochs"
    assert settings.finetune.warmup_updates() == 0
    # the recovery curve: the default points below the length and the end; every epoch; given points; none
    assert settings.finetune.curve_stops() == [("epoch", epoch) for epoch in range(1, 31)]
    assert FinetuneSettings(updates=500).curve_stops() == [("update", u) for u in (40, 100, 200, 500)]
    assert FinetuneSettings(updates=300, curve=[250, 50]).curve_stops() == [("update", u) for u in (50, 250, 300)]
    assert FinetuneSettings(updates=300, curve=[]).curve_stops() == [] == FinetuneSettings().curve_stops()


def test_the_fine_tuning_plan_states_each_configurations_time_at_the_checkpoints_speed():
    """``prune``'s plan line: 40 updates at 0.192 s/update (600 s for 3,125 updates) are 8 s each, 13 of them 2 min;
    600 updates at 1.86 s/update are 19 min each."""
    from fairseq_headprune.study.budhraja.finetune_plan import TrainingHistory, plan_line

    line = plan_line(25, 13, 40, 0, 2, TrainingHistory(3125, 5, 600.0))
    assert line.startswith("fine-tuning 25 configurations, 40 updates (0.1 epochs) each, scored at 2 points")
    assert line.endswith("about 8 s per configuration, 2 min for the 13 left to this process")
    line = plan_line(31, 16, 600, 0, 0, TrainingHistory(490, 10, 490 * 1.86))
    assert line.endswith("about 19 min per configuration, 5.0 h for the 16 left to this process")


def test_the_papers_figures_are_the_differences_its_tables_print():
    """Budhraja et al. print each Table 1-3 row's difference from the baseline in brackets: the figures the findings
    compare with are those, and the BERT figures the mean of the four tasks' changes, computed by hand here."""
    from fairseq_headprune.study.budhraja import paper_figures as paper

    brackets = {25: (0.50, 0.24), 35: (0.20, -0.01), 50: (0.29, 0.07), 55: (-0.09, 0.29), 60: (-0.15, -0.07),
                75: (-0.87, -0.46), 81: (-1.12, -1.15), 87: (-1.62, -1.03)}  # Table 1, EN-RU and EN-DE
    assert {level: paper.table1_figure(level) for level in brackets} == brackets
    kept, pruned = (0.53, 0.08, -0.08, -0.10, -0.61), (0.34, 0.48, 0.26, -0.31, -0.74)  # Table 2's brackets
    assert list(paper.table2_gaps().values()) == [round(k - p, 2) for k, p in zip(kept, pruned)]
    assert paper.table2_largest_gap() == 0.40  # 40%: 29.17 against 29.57
    # Table 3's brackets: (-0.13, -0.09, +0.04), (-0.61, -0.31, -0.61), (-1.14, -1.13, -1.05), (-1.85, -2.14, -1.26)
    assert paper.table3_best() == {48: ("DS", 0.13), 60: ("ED", 0.30), 75: ("DS", 0.08), 82: ("DS", 0.59)}
    # Table 4 at 50%: MNLI-M 83.02 - 83.69; the mean of -0.67, -0.32, -1.62, -0.88 ("under 1%")
    assert paper.table4_figure(50) == (-0.67, -0.87)
    # Table 5, top minus bottom, mean of the tasks: 2 of 4 K each way, as the paper says
    signs = [paper.layers_difference(("top", k), ("bottom", k))[1] > 0 for k in (1, 3, 6, 8)]
    assert signs.count(True) == 2
    # middle minus top+bottom: worse in 14 of the 16 task cases
    cases = [m - t for k in (2, 4, 6, 8)
             for m, t in zip(paper.LAYERS[("middle", k)], paper.LAYERS[("top+bottom", k)])]
    assert sum(c < 0 for c in cases) == 14
    assert paper.paper_level(61.1, [25, 50, 60, 75]) == 60 and paper.paper_level(67.0, [60, 75]) is None
