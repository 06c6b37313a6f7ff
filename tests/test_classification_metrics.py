"""Accuracy, Matthews correlation and the tests on per-example correctness, against scipy.

Plain functions and the ``significance`` command on label files; no model.
"""

import json

import numpy as np
import pytest
import scipy.stats

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.importance.ablation import ConfigScores, compare_with_baseline
from fairseq_headprune.study.settings import SweepSettings
from fairseq_headprune.study.statistics.metrics import ACCURACY, MATTHEWS, TOKENIZED_BLEU
from fairseq_headprune.study.statistics.significance import SignificanceSettings, mcnemar_exact, paired_t_test

from conftest import run


def labels(count, classes, seed):
    rng = np.random.default_rng(seed)
    return [f"c{k}" for k in rng.integers(0, classes, count)]


def noisy(gold, error_rate, classes, seed):
    rng = np.random.default_rng(seed)
    return [g if rng.random() >= error_rate else f"c{rng.integers(0, classes)}" for g in gold]


def matthews_reference(gold, predicted):
    """MCC as the correlation of the one-hot label matrices (covariances summed over classes)."""
    classes = sorted(set(gold))
    x = np.array([[float(g == c) for c in classes] for g in gold])
    y = np.array([[float(p == c) for c in classes] for p in predicted])
    x -= x.mean(axis=0)
    y -= y.mean(axis=0)
    return 100.0 * (x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum())


@pytest.mark.parametrize("classes", [2, 3])
def test_accuracy_and_matthews_from_statistics(classes):
    gold = labels(500, classes, seed=1)
    predicted = noisy(gold, 0.4, classes, seed=2)
    accuracy = 100.0 * np.mean([g == p for g, p in zip(gold, predicted)])
    assert ACCURACY.score(ACCURACY.example_statistics(gold, predicted)) == pytest.approx(accuracy, abs=1e-12)
    mcc = MATTHEWS.score(MATTHEWS.example_statistics(gold, predicted))
    assert mcc == pytest.approx(matthews_reference(gold, predicted), abs=1e-9)
    if classes == 2:  # the phi coefficient: Pearson's r of the indicators
        r = scipy.stats.pearsonr([g == "c1" for g in gold], [p == "c1" for p in predicted])[0]
        assert mcc == pytest.approx(100.0 * r, abs=1e-9)
    # a resample's score is the score of the examples it draws
    drawn = np.random.default_rng(3).integers(0, len(gold), len(gold))
    counts = np.bincount(drawn, minlength=len(gold)).astype(float)
    resampled = MATTHEWS.scores(counts @ MATTHEWS.example_statistics(gold, predicted))[0]
    assert resampled == pytest.approx(matthews_reference([gold[i] for i in drawn], [predicted[i] for i in drawn]))


def test_predicted_labels_outside_the_gold_ones_are_refused():
    with pytest.raises(SettingsError, match="predicted labels maybe never occur among the gold labels"):
        MATTHEWS.example_statistics(["yes", "no"], ["yes", "maybe"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_paired_t_test_and_mcnemar_equal_scipy(seed):
    rng = np.random.default_rng(seed)
    baseline = (rng.random(300) < 0.8).astype(float)
    system = np.where(rng.random(300) < 0.15, 1 - baseline, baseline)  # disagrees on about 15%
    settings = SignificanceSettings(test="t-test")
    t_test = paired_t_test(baseline, system, settings)
    reference = scipy.stats.ttest_rel(system, baseline)
    assert t_test.p_value == pytest.approx(reference.pvalue, rel=1e-9)
    assert t_test.extra["t"] == pytest.approx(reference.statistic, rel=1e-9)
    assert t_test.delta == pytest.approx(100.0 * (system.mean() - baseline.mean()))
    b = int(((baseline == 1) & (system == 0)).sum())
    c = int(((baseline == 0) & (system == 1)).sum())
    mcnemar = mcnemar_exact(baseline, system, SignificanceSettings(test="mcnemar"))
    assert mcnemar.p_value == pytest.approx(scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue, rel=1e-12)
    assert (mcnemar.extra["baseline_only_correct"], mcnemar.extra["system_only_correct"]) == (b, c)


def test_identical_predictions_are_never_significant():
    correct = np.array([1.0, 0.0, 1.0, 1.0])
    for test in (paired_t_test, mcnemar_exact):
        result = test(correct, correct, SignificanceSettings(test="mcnemar"))
        assert result.p_value == 1.0 and not result.significant


def test_bootstrap_on_accuracy_through_compare_with_baseline():
    gold = labels(400, 2, seed=4)
    baseline_predictions = noisy(gold, 0.2, 2, seed=5)
    worse_predictions = noisy(gold, 0.6, 2, seed=6)
    scores = [ConfigScores(n, "", {}, None, None, ACCURACY.example_statistics(gold, p), p)
              for n, p in (("base", baseline_predictions), ("worse", worse_predictions))]
    (result,) = compare_with_baseline(scores[0], scores[1:], SignificanceSettings(), ACCURACY)
    assert result.delta == pytest.approx(ACCURACY.score(scores[1].stats) - ACCURACY.score(scores[0].stats))
    assert result.delta < -10 and result.p_value < 0.01
    (t_test,) = compare_with_baseline(scores[0], scores[1:], SignificanceSettings(test="t-test"), ACCURACY)
    assert t_test.p_value == pytest.approx(scipy.stats.ttest_rel(
        [float(g == p) for g, p in zip(gold, worse_predictions)],
        [float(g == p) for g, p in zip(gold, baseline_predictions)]).pvalue)


def test_a_test_that_does_not_apply_to_the_metric_is_refused_before_any_work():
    with pytest.raises(SettingsError, match="the test mcnemar does not apply to tokenized") as error:
        SweepSettings("d", "c", "o", test=SignificanceSettings(test="mcnemar"))
    assert error.value.setting == "test"  # a command that took it from --test says so
    assert error.value.worded({"test": "--test"}).startswith("--test mcnemar does not apply to tokenized")
    with pytest.raises(SettingsError, match="the test t-test does not apply to mcc"):
        MATTHEWS.for_test("t-test")
    assert TOKENIZED_BLEU.for_test("bootstrap") is TOKENIZED_BLEU


def test_significance_command_on_label_files(tmp_path):
    gold = labels(200, 2, seed=7)
    files = {"gold": gold, "base": noisy(gold, 0.2, 2, seed=8), "other": noisy(gold, 0.5, 2, seed=9)}
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    paths = [str(tmp_path / n) for n in files]
    result = run(["fairseq-headprune", "significance", *paths, "--metric", "accuracy", "--test", "mcnemar",
                  "--json", str(tmp_path / "out.json")])
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    base = np.array([float(g == p) for g, p in zip(gold, files["base"])])
    other = np.array([float(g == p) for g, p in zip(gold, files["other"])])
    assert rows[0]["accuracy"] == pytest.approx(100 * other.mean())
    assert rows[0]["p_value"] == pytest.approx(mcnemar_exact(base, other, SignificanceSettings()).p_value)
    assert "McNemar" not in result.stdout and "mcnemar test" in result.stdout
    bad = run(["fairseq-headprune", "significance", *paths, "--metric", "mcc", "--test", "t-test"], check=False)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "fairseq-headprune significance: error: --test t-test does not apply to mcc; choose from bootstrap"
    ]


def loss_lines(losses, tokens):
    return "".join(f"{loss:.6f} {count}\n" for loss, count in zip(losses, tokens))


def test_perplexity_significance_is_a_paired_bootstrap_over_sentences(tmp_path, capsys):
    """``significance --metric ppl``: perplexity as fairseq-eval-lm computes it
    (2 ** total base-2 loss / total tokens), tested by the definition of the
    paired bootstrap over sentences with the settings' seed."""
    from fairseq_headprune import cli
    from fairseq_headprune.constants import DEFAULT_RESAMPLES, DEFAULT_SIGNIFICANCE_SEED

    rng = np.random.default_rng(3)
    sentences = 250
    tokens = rng.integers(5, 40, size=sentences)
    bits_per_token = rng.gamma(4.0, 1.0, size=sentences)
    losses = {"base": bits_per_token * tokens,
              "worse": (bits_per_token + np.abs(rng.normal(0.1, 0.3, sentences))) * tokens,
              "same": bits_per_token * tokens}
    for name, values in losses.items():
        (tmp_path / name).write_text(loss_lines(values, tokens))
    losses = {name: np.array([float(line.split()[0]) for line in (tmp_path / name).read_text().splitlines()])
              for name in losses}
    paths = [str(tmp_path / name) for name in losses]
    assert cli.main(["significance", *paths, "--metric", "ppl", "--json", str(tmp_path / "out.json")]) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    worse, same = result["rows"]
    ppl = {name: 2.0 ** (values.sum() / tokens.sum()) for name, values in losses.items()}
    assert result["settings"]["baseline_ppl"] == pytest.approx(ppl["base"])
    assert worse["ppl"] == pytest.approx(ppl["worse"]) and worse["delta"] > 0
    drawn = np.random.default_rng(DEFAULT_SIGNIFICANCE_SEED).integers(0, sentences, size=(DEFAULT_RESAMPLES, sentences))

    def resampled_ppl(values):
        return np.array([2.0 ** (values[d].sum() / tokens[d].sum()) for d in drawn])

    # the worse system's p-value: the share of resamples on which it is not worse
    expected = np.mean(resampled_ppl(losses["worse"]) <= resampled_ppl(losses["base"]))
    assert worse["p_value"] == pytest.approx(expected) and worse["significant"] == (expected < 0.01)
    assert same["p_value"] == 1.0 and not same["significant"]
    assert result["settings"]["test"]["seed"] == DEFAULT_SIGNIFICANCE_SEED

    # bad input: one line each, nothing written
    (tmp_path / "short").write_text(loss_lines(losses["base"][:-1], tokens[:-1]))
    (tmp_path / "garbled").write_text("1.0 3\nnan-ish 4\n")
    for files, message in (
        ([paths[0], str(tmp_path / "short")], "does not score the sentences of"),
        ([paths[0], str(tmp_path / "garbled")], "line 2 is not 'LOSS TOKENS'"),
    ):
        capsys.readouterr()
        assert cli.main(["significance", *files, "--metric", "ppl", "--json", str(tmp_path / "bad.json")]) != 0
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0], error
        assert not (tmp_path / "bad.json").exists()
