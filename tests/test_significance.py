"""BLEU statistics and paired tests against the tools they reproduce.

compare-mt and sacreBLEU are called directly; no expected number is typed in.
"""

import random
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fairseq_headprune.study.importance.ablation import (
    ConfigScores,
    all_but_one_configs,
    best_per_layer,
    compare_with_baseline,
    result_rows,
    single_head_configs,
)
from fairseq_headprune.study.masks.head_mask import count_masked, full_mask
from fairseq_headprune.study.output.tables import latex_single_table, markdown_single_table
from fairseq_headprune.study.statistics.bleu_stats import compare_mt_stats, fairseq_bleu_stats, sacrebleu_stats
from fairseq_headprune.study.statistics.metrics import COMPARE_MT_BLEU, SACREBLEU, TOKENIZED_BLEU
from fairseq_headprune.study.statistics.significance import (
    SignificanceSettings,
    p_value_cell,
    p_value_text,
    paired_bootstrap,
    resample_counts,
    resampled_scores,
    sacrebleu_paired_tests,
)

WORDS = "le la les un une chat chien mange voit petit grand rouge vert ne pas , . qui que".split()


def corpus(seed=0, sentences=300):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) for _ in range(sentences)]


def corrupt(lines, rate, seed):
    """Replace, and sometimes drop, words: a system of known quality."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = [w if rng.random() > rate else rng.choice(WORDS) for w in line.split()]
        if rng.random() < rate and len(words) > 1:
            words.pop(rng.randrange(len(words)))
        out.append(" ".join(words))
    return out


def test_corpus_bleu_from_statistics_equals_each_tool():
    import sacrebleu
    from compare_mt.scorers import BleuScorer
    from fairseq.data import Dictionary
    from fairseq.scoring.bleu import BleuConfig, Scorer

    references = corpus()
    hypotheses = corrupt(references, 0.3, 1)
    hypotheses[0] = "zzz"  # no match at all
    hypotheses[1] = ""  # empty output
    references[2] = "le <unk> chat"  # fairseq never matches a reference <unk>
    hypotheses[2] = "le <unk> chat"

    dictionary = Dictionary()
    scorer = Scorer(BleuConfig(pad=dictionary.pad(), eos=dictionary.eos(), unk=dictionary.unk()))
    for reference, hypothesis in zip(references, hypotheses):
        scorer.add(
            dictionary.encode_line(reference, add_if_not_exist=True).int(),
            dictionary.encode_line(hypothesis, add_if_not_exist=True).int(),
        )
    assert TOKENIZED_BLEU.score(fairseq_bleu_stats(references, hypotheses)) == pytest.approx(scorer.score(), abs=1e-12)
    assert SACREBLEU.score(sacrebleu_stats(references, hypotheses)) == pytest.approx(
        sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-12
    )
    split = lambda lines: [line.strip().split(" ") for line in lines]  # noqa: E731  (compare-mt's reader)
    assert COMPARE_MT_BLEU.score(compare_mt_stats(references, hypotheses)) == pytest.approx(
        BleuScorer().score_corpus(split(references), split(hypotheses))[0], abs=1e-12
    )


def test_resampled_statistics_are_sums_over_the_drawn_sentences():
    settings = SignificanceSettings(samples=100, seed=3)
    counts = resample_counts(40, settings)
    assert counts.shape == (100, 40)
    assert (counts.sum(axis=1) == 40).all()
    assert np.array_equal(counts, resample_counts(40, SignificanceSettings(samples=100, seed=3)))
    assert not np.array_equal(counts, resample_counts(40, SignificanceSettings(samples=100, seed=4)))
    half = resample_counts(40, SignificanceSettings(test="compare-mt", samples=100, seed=3))
    assert (half.sum(axis=1) == 20).all()

    references = corpus(sentences=40)
    hypotheses = corrupt(references, 0.3, 2)
    stats = fairseq_bleu_stats(references, hypotheses)
    by_product = resampled_scores(stats, counts, TOKENIZED_BLEU)
    # resample 7 re-scored from its drawn sentences, one by one
    drawn = [i for i in range(40) for _ in range(int(counts[7, i]))]
    assert by_product[7] == pytest.approx(TOKENIZED_BLEU.score(stats[drawn]), abs=1e-9)


@pytest.mark.parametrize("seed", [1, 2019])
def test_compare_mt_mode_reproduces_compare_mt_win_fractions(seed):
    from compare_mt.scorers import BleuScorer
    from compare_mt.sign_utils import eval_with_paired_bootstrap

    references = corpus(seed=seed)
    baseline = corrupt(references, 0.2, seed + 1)
    system = corrupt(references, 0.22, seed + 2)  # close: wins split both ways
    split = lambda lines: [line.strip().split(" ") for line in lines]  # noqa: E731

    np.random.seed(seed)
    wins, _ = eval_with_paired_bootstrap(
        split(references), [split(baseline), split(system)], None, BleuScorer(), num_samples=300
    )
    settings = SignificanceSettings(test="compare-mt", samples=300, seed=seed)
    result = paired_bootstrap(
        compare_mt_stats(references, baseline), compare_mt_stats(references, system),
        resample_counts(len(references), settings), COMPARE_MT_BLEU, settings,
    )
    assert [result.baseline_wins, result.system_wins, result.ties] == wins[0]
    assert 0 < result.system_wins < 1  # the comparison is not trivially one-sided
    assert result.p_value == pytest.approx(1 - max(wins[0][0], wins[0][1]))


def test_default_bootstrap_agrees_with_sacrebleu_paired_bootstrap():
    references = corpus(seed=5, sentences=400)
    baseline = corrupt(references, 0.2, 6)
    systems = [corrupt(references, rate, 7 + i) for i, rate in enumerate((0.2, 0.21, 0.3))]
    settings = SignificanceSettings(samples=1000, seed=11)
    ours = compare_with_baseline(
        ConfigScores("b", "", {}, 0, 0, sacrebleu_stats(references, baseline)),
        [ConfigScores(f"s{i}", "", {}, 0, 0, sacrebleu_stats(references, s)) for i, s in enumerate(systems)],
        settings, SACREBLEU,
    )
    theirs = sacrebleu_paired_tests(
        references, baseline, systems, SignificanceSettings(test="sacrebleu-bs", samples=1000, seed=11)
    )
    for mine, reference in zip(ours, theirs):
        assert mine.score == pytest.approx(reference.score, abs=1e-9)
        assert mine.baseline_score == pytest.approx(reference.baseline_score, abs=1e-9)
        # same bootstrap distribution of the system's BLEU, within resampling noise
        assert mine.mean == pytest.approx(reference.mean, abs=0.3)
        assert mine.ci_high - mine.ci_low == pytest.approx(reference.ci_high - reference.ci_low, rel=0.25)
        # Koehn's p (1 - win fraction) and sacreBLEU's (centred |difference|) are
        # different estimates of the same evidence: close, and the same decision
        assert mine.significant == reference.significant
        assert abs(mine.p_value - reference.p_value) < 0.05
    assert ours[2].significant and not ours[0].significant


def test_identical_system_is_never_significant():
    references = corpus()
    hypotheses = corrupt(references, 0.3, 1)
    stats = fairseq_bleu_stats(references, hypotheses)
    settings = SignificanceSettings(samples=200)
    result = paired_bootstrap(stats, stats.copy(), resample_counts(len(stats), settings), TOKENIZED_BLEU, settings)
    assert result.delta == 0 and result.p_value == 1.0 and not result.significant


def test_a_bootstrap_with_no_resample_against_the_better_system_bounds_p_below_one_resample():
    references = corpus(seed=3)
    stats = fairseq_bleu_stats(references, corrupt(references, 0.3, 4))
    perfect = fairseq_bleu_stats(references, references)
    settings = SignificanceSettings(samples=1000)
    result = paired_bootstrap(stats, perfect, resample_counts(len(stats), settings), TOKENIZED_BLEU, settings)
    assert result.p_value == 0.0 and result.system_wins == 1.0  # better on every resample
    assert p_value_text(result.p_value, settings.samples) == "p < 0.001"  # not "p = 0"
    assert p_value_cell(result.p_value, settings.samples) == "< 0.001"
    assert p_value_text(0.0292, 1000) == "p = 0.0292" and p_value_cell(0.5, 200) == "0.5"
    assert p_value_text(0.0, 200) == "p < 0.005"


def test_the_bootstrap_and_the_t_test_give_the_95_percent_interval_of_the_difference():
    """The bootstrap's interval: the 2.5 and 97.5 percentiles of the resampled differences, each resample's
    accuracies computed here from the drawn indices; the t-test's: scipy's ``ttest_rel`` interval."""
    from fairseq_headprune.study.statistics.metrics import ACCURACY
    from fairseq_headprune.study.statistics.significance import paired_t_test

    rng = np.random.default_rng(5)
    baseline = np.stack([(rng.random(400) < 0.7).astype(float), np.ones(400)], axis=1)  # [correct, examples]
    system = np.stack([(rng.random(400) < 0.6).astype(float), np.ones(400)], axis=1)
    settings = SignificanceSettings(samples=500, seed=9)
    result = paired_bootstrap(baseline, system, resample_counts(400, settings), ACCURACY, settings)
    drawn = np.random.default_rng(9).integers(0, 400, size=(500, 400))  # the draws resample_counts documents
    differences = np.sort(100 * (system[drawn, 0].mean(axis=1) - baseline[drawn, 0].mean(axis=1)))
    assert (result.delta_low, result.delta_high) == pytest.approx((differences[12], differences[487]))
    assert result.delta_low < result.delta < result.delta_high
    t_result = paired_t_test(baseline[:, 0], system[:, 0], SignificanceSettings(test="t-test"))
    reference = scipy_stats.ttest_rel(100 * system[:, 0], 100 * baseline[:, 0]).confidence_interval()
    assert (t_result.delta_low, t_result.delta_high) == pytest.approx((reference.low, reference.high))


def test_the_commands_print_a_bootstrap_p_of_0_through_the_one_formatter(capsys, tmp_path):
    """``prune``'s fine-tuned lines, ``ablate``'s summary, the Budhraja table and ``significance``'s column print
    a p-value of 0 from N resamples as ``p < 1/N``, never ``p = 0``."""
    from types import SimpleNamespace

    from fairseq_headprune import cli
    from fairseq_headprune.commands.ablate import print_single
    from fairseq_headprune.commands.prune import print_finetuned
    from fairseq_headprune.study.budhraja.records import FinetuneRecord, TestAgainst
    from fairseq_headprune.study.budhraja.report import markdown_finetuned

    references = corpus(seed=3, sentences=60)
    stats = fairseq_bleu_stats(references, corrupt(references, 0.3, 4))
    perfect = fairseq_bleu_stats(references, references)
    settings = SignificanceSettings(samples=1000)
    result = paired_bootstrap(stats, perfect, resample_counts(len(stats), settings), TOKENIZED_BLEU, settings)
    assert result.p_value == 0.0
    record = FinetuneRecord("l0", "60% draw 1", "x", 20.0, 40.0, "bleu", "500 updates",
                            tests={"control": TestAgainst(result.delta, result.p_value, True)},
                            significance=settings.to_dict())
    print_finetuned(SimpleNamespace(finetune_records=[record], finetune_results="results.json"), "BLEU",
                    settings.resamples)
    rows = [{"config": "single.enc-dec.L1.H1", "spec": "A:1:1", "delta": result.delta, "p_value": result.p_value,
             "significant": True},
            {"config": "single.enc-dec.L1.H2", "spec": "A:1:2", "delta": 0.1, "p_value": 0.5, "significant": False}]
    sweep = SimpleNamespace(test=settings, metric=TOKENIZED_BLEU)
    print_single(SimpleNamespace(rows=rows, baseline_score=40.0, written=["single"]), SimpleNamespace(sweep=sweep))
    printed = capsys.readouterr().out
    assert printed.count("p < 0.001") == 2 and "(p = 0.5)" in printed and "A:1:1 (p < 0.001)" in printed
    assert not re.search(r"p = 0(\.0+)?(?![.\d])", printed)
    table = markdown_finetuned([record])
    assert "| < 0.001 |" in table and "| 0.000 |" not in table
    for name, lines in (("ref", references), ("base", corrupt(references, 0.3, 4)), ("sys", references)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    assert cli.main(["significance", *(str(tmp_path / n) for n in ("ref", "base", "sys"))]) == 0
    assert "< 0.001  yes" in capsys.readouterr().out
    # a t-test's p is not a resampled share: no bound from resamples
    assert SignificanceSettings(test="t-test").resamples is None and settings.resamples == 1000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"test": "wilcoxon"}, "unknown test"),
        ({"samples": 0}, "resamples must be positive"),
        ({"alpha": 1.5}, "significance level"),
        ({"sample_ratio": 0.0}, "sample ratio"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SignificanceSettings(**kwargs)


def test_configurations_mask_what_their_study_says():
    layout = {"enc-enc": (3, 4), "enc-dec": (3, 4), "dec-dec": (3, 4)}
    single = single_head_configs(layout)
    assert len(single) == 36 and len({c.name for c in single}) == 36
    for config in single:
        assert count_masked(config.head_mask) == 1
        assert config.head_mask[config.attention_type][config.layer - 1, config.head - 1] == 0
    selection = full_mask(layout)
    selection["enc-dec"][2, :2] = 0
    assert [c.name for c in single_head_configs(layout, selection)] == [
        "single.enc-dec.L3.H1", "single.enc-dec.L3.H2"
    ]
    keep = all_but_one_configs(layout, ["dec-dec"])
    assert len(keep) == 12
    for config in keep:
        row = config.head_mask["dec-dec"][config.layer - 1]
        assert row.sum() == 1 and row[config.head - 1] == 1 and count_masked(config.head_mask) == 3


def test_tables_mark_significant_cells_and_pick_the_best_kept_head():
    references = corpus(sentences=200)
    baseline = ConfigScores("baseline", "none", {}, 0, 0, fairseq_bleu_stats(references, corrupt(references, 0.2, 1)))
    systems = []
    for head, rate in ((1, 0.2), (2, 0.6), (3, 0.25)):
        stats = fairseq_bleu_stats(references, corrupt(references, rate, 10 + head))
        systems.append(ConfigScores(
            f"keep.enc-dec.L1.H{head}", f"A:1:keep={head}",
            {"attention_type": "enc-dec", "layer": 1, "head": head}, TOKENIZED_BLEU.score(stats), 0, stats,
        ))
    baseline.bleu = TOKENIZED_BLEU.score(baseline.stats)
    results = compare_with_baseline(baseline, systems, SignificanceSettings(samples=300), TOKENIZED_BLEU)
    rows = result_rows(baseline, systems, results, "tokenized")
    assert [r["delta"] for r in rows] == pytest.approx([s.bleu - baseline.bleu for s in systems])
    heavy = rows[1]
    assert heavy["significant"] and heavy["delta"] < -10
    markdown = markdown_single_table(rows, baseline.bleu, "caption")
    assert f"**{heavy['delta']:+.2f}**" in markdown
    assert f"\\underline{{{heavy['delta']:+.2f}}}" in latex_single_table(rows, baseline.bleu, "caption")
    (best,) = best_per_layer(rows)
    assert best["bleu"] == max(r["bleu"] for r in rows)
