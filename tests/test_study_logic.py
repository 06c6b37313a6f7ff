"""The study logic that used to live in the commands, tested as plain functions (no model).

Each is compared with an independent computation: a brute-force re-ranking for
iterative pruning, scipy for the cross-domain correlation, hand-built rows for
the best-head selection, the file system for epoch checkpoints.
"""

import math

import pytest
import torch
from scipy import stats

from fairseq_headprune.cli import command_flags
from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.study.importance.ablation import best_heads, cross_domain_correlation, cross_domain_rows
from fairseq_headprune.study.importance.dynamics import dynamics_grid, epoch_checkpoints, parse_epochs, relative_rows
from fairseq_headprune.study.masks.ranges import RangeError, format_ranges, parse_ranges
from fairseq_headprune.study.pruning.curves import (
    CurvePlan,
    CurveScores,
    heads_in_scope,
    importance_scores,
    iterative_steps,
    plan_curves,
    step_counts,
)
from fairseq_headprune.study.pruning.settings import CurveSettings, PruneSettings
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings, parse_choices, parse_types
from fairseq_headprune.study.statistics.metrics import BLEU_METRICS, COMPARE_MT_BLEU, SACREBLEU, TOKENIZED_BLEU

LAYOUT = {"enc-enc": (2, 4), "enc-dec": (2, 4), "dec-dec": (2, 4)}


# ----------------------------------------------------------------------------- ranges and epochs


@pytest.mark.parametrize("numbers", [[1], [1, 2, 3, 6], [2, 4, 5, 6, 9, 10], list(range(1, 30))])
def test_ranges_round_trip(numbers):
    text = format_ranges(numbers)
    back = sorted({n for first, last in parse_ranges(text) for n in range(first, last + 1)})
    assert back == numbers
    assert len(text) <= len(",".join(map(str, numbers)))


def test_range_errors_say_what_is_wrong():
    with pytest.raises(RangeError) as error:
        parse_ranges("1,x")
    assert (error.value.kind, error.value.item) == ("malformed item", "x")
    with pytest.raises(RangeError) as error:
        parse_ranges("5-3")
    assert error.value.kind == "empty range"


def test_epochs_are_parsed_with_the_shared_range_parser():
    assert parse_epochs("1-3, 8,10-11") == [1, 2, 3, 8, 10, 11]
    assert parse_epochs(None) is None
    with pytest.raises(SettingsError, match=r"the epochs: malformed item 'a'") as error:
        parse_epochs("1,a")
    assert error.value.setting == "epochs"
    assert error.value.worded(command_flags("dynamics")).startswith("--epochs: malformed item 'a'")
    with pytest.raises(SettingsError, match=r"the epochs: empty range '4-2'"):
        parse_epochs("4-2")


def test_epoch_checkpoints_are_found_in_epoch_order(tmp_path):
    for name in ("checkpoint10.pt", "checkpoint2.pt", "checkpoint1.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [e for e, _ in epoch_checkpoints(str(tmp_path))] == [1, 2, 10]
    assert [e for e, _ in epoch_checkpoints(str(tmp_path), [2, 10])] == [2, 10]
    with pytest.raises(StudyError, match=r"no checkpoint3.pt in .* \(epochs there: 1-2,10\)"):
        epoch_checkpoints(str(tmp_path), [3])
    with pytest.raises(StudyError, match="not found"):
        epoch_checkpoints(str(tmp_path / "missing"))


def test_dynamics_rows_are_relative_to_each_epochs_unpruned_bleu():
    curve = [{"step": s, "pruned": 2 * s, "percent": 25.0 * s, "bleu": 40.0 - 10 * s} for s in (2, 0, 1)]
    rows = relative_rows(3, "/x/checkpoint3.pt", 40.0, curve)
    assert [r["level"] for r in rows] == [0, 1, 2]
    assert [r["relative"] for r in rows] == [1.0, 0.75, 0.5]
    grid = dynamics_grid(rows + relative_rows(1, "checkpoint1.pt", 20.0, curve))
    assert grid.epochs == [1, 3] and grid.levels == [0, 1, 2]
    assert grid.unpruned_score(1) == 20.0 and grid.cell[(1, 2)]["relative"] == 1.0
    assert math.isnan(relative_rows(1, "c", 0.0, curve)[0]["relative"])


# ----------------------------------------------------------------------------- iterative pruning


def _importance_with(pruned):
    """A model whose heads matter more the closer they sit to a pruned head of their layer."""
    scores = {t: torch.arange(1, 9, dtype=torch.float64).reshape(2, 4).clone() for t in LAYOUT}
    for attention_type, layer, head in pruned:
        for other in range(4):
            scores[attention_type][layer, other] += 10.0 / (1 + abs(other - head))
    return scores


def test_iterative_pruning_re_ranks_on_the_pruned_model():
    calls = []

    def importance_of(pruned, description):
        calls.append(list(pruned))
        return _importance_with(pruned)

    counts = step_counts(24, 25.0, 75.0)  # 0, 6, 12, 18 heads
    steps = iterative_steps(LAYOUT, "all", counts, importance_of, normalize=False)
    # brute force: at every step rank the remaining heads on the model with the heads so far pruned
    pruned = []
    for step, count in zip(steps, counts):
        if count > len(pruned):
            scores = importance_scores(_importance_with(pruned), normalize=False)
            remaining = [h for h in heads_in_scope(LAYOUT, "all") if h not in pruned]
            remaining.sort(key=lambda h: (scores[h], ("enc-enc", "enc-dec", "dec-dec").index(h[0]), h[1], h[2]))
            pruned += remaining[: count - len(pruned)]
        masked = {(t, layer, h) for t, m in step.head_mask.items() for layer in range(2) for h in range(4)
                  if m[layer, h] == 0}
        assert masked == set(pruned) and step.pruned == count and step.order == "iterative"
    # estimated once per level that prunes more, each time on exactly the heads pruned before it
    assert [len(c) for c in calls] == [0, 6, 12]
    for step, call in zip(steps, calls):
        assert set(call) == {(t, layer, h) for t, m in step.head_mask.items() for layer in range(2) for h in range(4)
                             if m[layer, h] == 0}
    # the once-estimated order differs: re-estimation is what this order is for
    once = plan_curves(LAYOUT, CurvePlan(["importance"], ["all"], normalize=False, step_percent=25.0, max_percent=75.0),
                       CurveScores(importance_of))
    assert torch.equal(once[1].head_mask["enc-enc"], steps[1].head_mask["enc-enc"])
    assert any(not torch.equal(a.head_mask[t], b.head_mask[t]) for a, b in zip(once, steps) for t in LAYOUT)


def test_plan_curves_estimates_the_unpruned_model_once_for_both_importance_orders():
    calls = []

    def importance_of(pruned, description):
        calls.append((list(pruned), description))
        return _importance_with(pruned)

    steps = plan_curves(LAYOUT, CurvePlan(["importance", "iterative", "random"], ["all", "enc-dec"],
                                          step_percent=50.0, max_percent=50.0, draws=2, seed=3),
                        CurveScores(importance_of))
    assert sum(1 for pruned, _ in calls if not pruned) == 1
    assert {(s.scope, s.order, s.draw) for s in steps} == {
        (scope, order, draw) for scope in ("all", "enc-dec")
        for order, draw in (("importance", None), ("iterative", None), ("random", 1), ("random", 2))
    }
    for step in steps:
        if step.scope == "enc-dec":  # a type scope masks only that type
            assert step.head_mask["enc-enc"].min() == 1 and step.head_mask["dec-dec"].min() == 1


# ----------------------------------------------------------------------------- ablation tables


def _row(attention_type, layer, head, delta, significant=False):
    return {"config": f"keep.{attention_type}.L{layer}.H{head}", "attention_type": attention_type, "layer": layer,
            "head": head, "bleu": 30.0 + delta, "delta": delta, "p_value": 0.5, "significant": significant}


def test_best_heads_choose_on_the_selection_split_and_report_on_the_test_split():
    test_rows = [_row("enc-enc", 1, h, d) for h, d in ((1, -3.0), (2, -1.0), (3, -2.0))]
    test_rows += [_row("dec-dec", 1, h, d) for h, d in ((1, -5.0), (2, -4.0))]
    select_rows = [_row("enc-enc", 1, h, d) for h, d in ((1, -0.5), (2, -9.0), (3, -1.0))]
    select_rows += [_row("dec-dec", 1, h, d) for h, d in ((1, -1.0), (2, -2.0))]
    best, entries, selected = best_heads(test_rows, select_rows, "valid")
    assert [(r["attention_type"], r["head"]) for r in best] == [("enc-enc", 2), ("dec-dec", 2)]
    # chosen on valid (head 1 in both), scored on test
    assert [(e["selected_head"], e["selected_delta"]) for e in entries] == [(1, -3.0), (1, -5.0)]
    assert selected[("enc-enc", 1)]["selected_on"] == "valid"
    best_only, entries_only, none = best_heads(test_rows)
    assert none is None and "selected_head" not in entries_only[0] and best_only == best


def test_cross_domain_rows_and_correlation_equal_scipy():
    rows = [dict(_row(t, 1, h, -0.3 * h + (t == "enc-dec")), config=f"single.{t}.{h}")
            for t in ("enc-enc", "enc-dec") for h in range(1, 6)]
    cross = [dict(r, delta=r["delta"] * 2 + 0.1 * (r["head"] % 2), significant=True) for r in reversed(rows)]
    joined = cross_domain_rows(rows, cross)
    assert [j["config"] for j in joined] == [r["config"] for r in rows]
    assert all(j["cross_significant"] for j in joined)
    (r, p), per_type = cross_domain_correlation(joined)
    expected = stats.pearsonr([j["delta"] for j in joined], [j["cross_delta"] for j in joined])
    assert r == pytest.approx(expected[0], abs=1e-12) and p == pytest.approx(expected[1], rel=1e-9)
    subset = [j for j in joined if j["attention_type"] == "enc-dec"]
    assert per_type["enc-dec"][0] == pytest.approx(
        stats.pearsonr([j["delta"] for j in subset], [j["cross_delta"] for j in subset])[0], abs=1e-12
    )
    assert set(per_type) == {"enc-enc", "enc-dec"}


# ----------------------------------------------------------------------------- metrics and settings


def test_metric_objects_score_from_statistics_and_name_their_test_statistics():
    references = ["le chat mange", "un chien voit le chat", "la maison"]
    hypotheses = ["le chat mange", "un chien voit un chat", "une maison"]
    for metric in (TOKENIZED_BLEU, SACREBLEU, COMPARE_MT_BLEU):
        rows = metric.example_statistics(references, hypotheses)
        assert rows.shape == (3, 10)
        # the score of summed statistics is the corpus score; scores() takes many sums at once
        assert metric.scores(rows.sum(axis=0)[None].repeat(2, axis=0)) == pytest.approx([metric.score(rows)] * 2)
        assert metric.higher_is_better
    assert TOKENIZED_BLEU.for_test("bootstrap") is TOKENIZED_BLEU
    assert SACREBLEU.for_test("compare-mt") is COMPARE_MT_BLEU
    assert set(BLEU_METRICS) == {"tokenized", "sacrebleu"}
    with pytest.raises(ValueError):
        COMPARE_MT_BLEU.for_test("bootstrap")


@pytest.mark.parametrize(
    "make, setting, words, command, message",
    [
        (lambda: SweepSettings("d", "c", "o", configs_per_batch=0), "configs_per_batch",
         "the configs per batch must be positive, got 0", "prune", "--configs-per-batch must be positive, got 0"),
        (lambda: SweepSettings("d", "c", "o", references="r.txt"), "references",
         "the references (raw reference text) is used by the BLEU sacrebleu only", "ablate",
         "--references (raw reference text) is used by --bleu sacrebleu only"),
        (lambda: SweepSettings("d", "c", "o", bleu="chrf"), "bleu", "the BLEU must be one of tokenized, sacrebleu",
         "dynamics", "--bleu must be one of tokenized, sacrebleu"),
        (lambda: ImportanceSettings(limit=0), "importance_limit", "the importance limit must be positive, got 0",
         "importance", "--importance-limit must be positive, got 0"),
        (lambda: ImportanceSettings(max_tokens=-1), "importance_max_tokens",
         "the importance max tokens must be positive, got -1", "prune",
         "--importance-max-tokens must be positive, got -1"),
        (lambda: ImportanceSettings(label_smoothing=1.0), "importance_label_smoothing",
         "the importance label smoothing must be in [0, 1), got 1.0", "search",
         "--importance-label-smoothing must be in [0, 1), got 1.0"),
        (lambda: PruneSettings(SweepSettings("d", "c", "o"), draws=0), "draws", "the draws must be positive, got 0",
         "prune", "--draws must be positive, got 0"),
        (lambda: PruneSettings(SweepSettings("d", "c", "o"), orders=[], scopes=["all"]), "orders", "nothing to do",
         "prune", "nothing to do: neither --orders with --scopes nor --layer-budget, --type-budget, --random-level, "
         "--layer-strategy or --budhraja-tables"),
        (lambda: parse_choices("all,both", ("all", "enc-enc"), "scopes"), "scopes", "the scopes: unknown value 'both'",
         "prune", "--scopes: unknown value 'both'"),
        (lambda: parse_types("E,X"), "types", "the types: unknown attention type 'X'", "ablate",
         "--types: unknown attention type 'X'"),
    ],
)
def test_settings_name_the_setting_to_correct_and_commands_word_it_by_their_flag(make, setting, words, command,
                                                                               message):
    """Below the commands an error names its setting in plain words (``error.setting`` says which); the command a
    user ran words it with the flag the user gave it by (``cli.command_flags``)."""
    with pytest.raises(SettingsError) as error:
        make()
    assert error.value.setting == setting
    assert str(error.value).startswith(words) and "--" not in str(error.value)
    assert error.value.worded(command_flags(command)).startswith(message)


def test_sweep_settings_score_every_sentence_and_keep_the_users_batching():
    assert SweepSettings("d", "c", "o").generation_args == ["--required-batch-size-multiple", "1"]
    mine = ["--required-batch-size-multiple", "8"]
    assert SweepSettings("d", "c", "o", generation_args=mine).generation_args == mine
    curve = CurveSettings()
    assert curve.importance.setting("limit") == "importance_limit" and curve.importance.subsets == ["valid"]
    assert command_flags("prune")["importance_limit"] == "--importance-limit"


def test_the_paired_test_follows_the_metrics_direction():
    """The same evidence as accuracy (higher is better) and as error rate (lower is better)."""
    import numpy as np

    from fairseq_headprune.study.statistics.metrics import Metric
    from fairseq_headprune.study.statistics.significance import SignificanceSettings, paired_bootstrap, resample_counts

    def correct_and_count(references, hypotheses):
        return np.array([[float(r == h), 1.0] for r, h in zip(references, hypotheses)])

    accuracy = Metric("accuracy", "accuracy", "accuracy", correct_and_count, lambda s: 100 * s[:, 0] / s[:, 1])
    error = Metric("error", "error", "error rate", correct_and_count, lambda s: 100 * (1 - s[:, 0] / s[:, 1]),
                   higher_is_better=False)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 400)
    baseline = np.where(rng.random(400) < 0.8, labels, (labels + 1) % 3)
    system = np.where(rng.random(400) < 0.7, labels, (labels + 1) % 3)
    settings = SignificanceSettings(samples=500, seed=4)
    counts = resample_counts(400, settings)
    results = {}
    for metric in (accuracy, error):
        results[metric.name] = paired_bootstrap(
            metric.example_statistics(labels, baseline), metric.example_statistics(labels, system), counts, metric,
            settings,
        )
    # independently: the system is worse; the baseline wins where it is right more often
    right_base, right_system = counts @ (baseline == labels), counts @ (system == labels)
    expected_baseline_wins = float(np.mean(right_base > right_system))
    for result in results.values():
        assert result.baseline_wins == pytest.approx(expected_baseline_wins)
        assert result.p_value == pytest.approx(1 - expected_baseline_wins)
    assert results["accuracy"].delta == pytest.approx(-results["error"].delta)


def test_library_errors_become_one_line_and_the_plugins_own_bugs_keep_their_traceback():
    """``errors.library_errors_as``: what a library raises is reported as the project's error with the cause chained;
    an error raised in the plugin's own code (a bug) and the project's own errors pass through unchanged."""
    import json

    from fairseq_headprune.errors import CheckpointError, library_errors_as, raised_by_the_plugin

    def report(error):
        return CheckpointError(f"cannot read: {error}")

    with pytest.raises(CheckpointError, match="cannot read") as caught:
        with library_errors_as(report):
            json.loads("{not json")  # the standard library's error: bad input
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    assert not raised_by_the_plugin(caught.value.__cause__)
    with pytest.raises(AttributeError) as bug:  # raised inside the plugin: a bug, not bad input
        with library_errors_as(report):
            parse_ranges(None)
    assert raised_by_the_plugin(bug.value)
    with pytest.raises(SettingsError, match="mine"):
        with library_errors_as(report):
            raise SettingsError("mine")


def test_only_a_cut_save_counts_as_cut(tmp_path):
    """A killed save leaves an empty or unterminated zip (torch's EOFError or RuntimeError); a fine-tune resumes from
    the newest whole save, and any other failure to read one is raised, not taken for a cut file."""
    import os

    import torch

    from fairseq_headprune.engine.finetune.resume import cut_file, resume_point

    train = tmp_path / "train"
    train.mkdir()
    torch.save({"updates": 2}, train / "checkpoint_1_2.pt")
    whole = (train / "checkpoint_1_2.pt").read_bytes()
    (train / "checkpoint_last.pt").write_bytes(whole[: len(whole) // 2])  # killed while saving
    os.utime(train / "checkpoint_1_2.pt", (1, 1))
    resume_point(str(train))
    assert torch.load(train / "checkpoint_last.pt")["updates"] == 2
    for error, cut in ((EOFError("Ran out of input"), True),
                       (RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central"), True),
                       (RuntimeError("CUDA out of memory"), False), (MemoryError(), False), (TypeError("bug"), False)):
        assert cut_file(error) == cut, error


def test_options_passed_on_are_settings_in_any_order_and_a_command_line_again():
    from fairseq_headprune.study.settings import options_as_settings, settings_as_options

    given = ["--beam", "5", "--lenpen", "1", "--fp16", "--unkpen", "-1.5", "--print-alignment=hard"]
    reordered = ["--print-alignment=hard", "--unkpen", "-1.5", "--fp16", "--lenpen", "1", "--beam", "5"]
    settings = options_as_settings(given)
    assert settings == options_as_settings(reordered)
    assert settings == {"--beam": "5", "--fp16": True, "--lenpen": "1", "--print-alignment": "hard",
                        "--unkpen": "-1.5"}
    assert settings != options_as_settings(["--beam", "4", "--lenpen", "1"])
    assert options_as_settings(["--lenpen", "1", "--lenpen", "0.6"]) == {"--lenpen": "0.6"}  # as argparse: the last
    assert options_as_settings(settings_as_options(settings)) == settings
    assert settings_as_options(given) == given  # a record from before options were settings
