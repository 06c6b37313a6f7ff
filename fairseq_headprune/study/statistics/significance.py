"""Paired significance tests of a system against a baseline on the same sentences.

``bootstrap`` (default) is Koehn's (2004) paired bootstrap: resamples of the
full test set, drawn with replacement; the p-value is the fraction of
resamples in which the system that scored better on the whole set does not
score better (1 - its win fraction).

``compare-mt`` reproduces ``compare_mt.sign_utils.eval_with_paired_bootstrap``
with its ``BleuScorer``: resamples of half the set (``sample_ratio=0.5``),
drawn by ``numpy.random.choice`` from a RandomState seeded with the seed (what
compare-mt's global RNG gives after ``numpy.random.seed(seed)``), win fractions
with compare-mt's tie count (which counts every resample in which the
baseline is not worse) and p = 1 - max(win fractions).

``sacrebleu-bs`` and ``sacrebleu-ar`` run sacreBLEU's own ``PairedTest``
(paired bootstrap or approximate randomisation; two-sided, its own p-value).

For classification, on per-example correctness: ``t-test`` is the paired
t-test Michel et al. (2019, section 3.2) use for BERT (two-sided), and
``mcnemar`` McNemar's exact test (two-sided binomial test on the examples
the two systems disagree on); the bootstrap resamples accuracy or Matthews
correlation like BLEU.

Each result carries the 95% interval of the difference: the 2.5 and 97.5
percentiles of the resampled differences (the bootstrap), Student's t
interval of the mean paired difference (the t-test, McNemar's).

Resamples are drawn once per sweep as a (resamples x sentences) count matrix,
so every configuration is compared on the same resamples, and resampled
statistics are one matrix product.
"""

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
from sacrebleu.significance import PairedTest

from fairseq_headprune.constants import (
    CORRECTNESS_TESTS,
    DEFAULT_ALPHA,
    DEFAULT_RESAMPLES,
    DEFAULT_SIGNIFICANCE_SEED,
    SIGNIFICANCE_TESTS,
)
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.output.serialisation import PlainRecord
from fairseq_headprune.study.statistics.bleu_stats import sacrebleu_metric
from fairseq_headprune.study.statistics.metrics import Metric


@dataclass
class SignificanceSettings(PlainRecord):
    """Everything that decides a test's outcome; written beside every result."""

    test: str = "bootstrap"
    samples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SIGNIFICANCE_SEED
    sample_ratio: Optional[float] = None  # None: 1.0, or 0.5 for compare-mt
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self):
        if self.test not in SIGNIFICANCE_TESTS:
            raise SettingsError(f"the test: unknown test {self.test!r}; choose from {', '.join(SIGNIFICANCE_TESTS)}",
                                setting="test")
        if self.samples <= 0:
            raise SettingsError(f"the samples: the number of resamples must be positive, got {self.samples}",
                                setting="samples")
        if not isinstance(self.seed, int) or self.seed < 0:  # numpy's generators take no negative seed
            raise SettingsError(f"the test seed must be 0 or more, got {self.seed}", setting="test_seed")
        if not 0.0 < self.alpha < 1.0:
            raise SettingsError(f"the alpha: the significance level must be in (0, 1), got {self.alpha}",
                                setting="alpha")
        least = math.ceil(1.0 / self.alpha - 1e-9)
        if self.test not in CORRECTNESS_TESTS and self.samples < least:
            raise SettingsError(f"the samples: {self.samples} resamples cannot resolve the significance level "
                                f"{self.alpha:g} (a p-value of 0 only says p < 1/{self.samples}); use at least {least}",
                                setting="samples")
        if self.sample_ratio is None:
            self.sample_ratio = 0.5 if self.test == "compare-mt" else 1.0
        if not 0.0 < self.sample_ratio <= 1.0:
            raise SettingsError(f"the sample ratio must be in (0, 1], got {self.sample_ratio}",
                                setting="sample_ratio")

    @property
    def resamples(self) -> Optional[int]:
        """The resamples a p-value of 0 is bounded by (``p < 1/resamples``); None for a test that does not resample
        (the t-test, McNemar's)."""
        return None if self.test in CORRECTNESS_TESTS else self.samples


@dataclass
class PairedResult(PlainRecord):
    """A system against the baseline; scores in the metric the test resampled."""

    score: float  # the system's, in the metric the test resampled
    baseline_score: float
    delta: float
    p_value: float
    significant: bool
    system_wins: Optional[float] = None  # fraction of resamples
    baseline_wins: Optional[float] = None
    ties: Optional[float] = None  # compare-mt's third win count, in compare-mt mode
    mean: Optional[float] = None  # system BLEU over resamples
    ci_low: Optional[float] = None  # 95% interval of the system's resampled BLEU
    ci_high: Optional[float] = None
    delta_low: Optional[float] = None  # 95% interval of the difference (bootstrap percentiles; the t-test's interval)
    delta_high: Optional[float] = None
    extra: Dict[str, float] = field(default_factory=dict)


def p_value_cell(p_value: float, samples: Optional[int] = None) -> str:
    """A p-value for a table. A bootstrap in which no resample goes against the better system gives 0, which
    bounds p below one resample's share (p < 1/resamples), not p = 0 (Koehn 2004)."""
    if p_value == 0.0 and samples:
        return f"< {1.0 / samples:.2g}"
    return f"{p_value:.3g}"


def p_value_text(p_value: float, samples: Optional[int] = None) -> str:
    """``p = 0.292`` or ``p < 0.001``: a p-value for a sentence (``p_value_cell``)."""
    cell = p_value_cell(p_value, samples)
    return "p " + (cell if cell.startswith("<") else "= " + cell)


def resample_counts(n_sentences: int, settings: SignificanceSettings) -> np.ndarray:
    """(resamples x sentences) matrix: how often each sentence is drawn in each resample."""
    if n_sentences <= 0:
        raise ValueError("no sentences to resample")
    size = int(n_sentences * settings.sample_ratio)
    if size <= 0:
        raise ValueError(f"sample ratio {settings.sample_ratio} of {n_sentences} sentences draws none")
    if settings.test == "compare-mt":
        generator = np.random.RandomState(settings.seed)
        # one call per resample, as compare-mt makes them
        drawn = np.stack([generator.choice(n_sentences, size=size, replace=True) for _ in range(settings.samples)])
    else:
        drawn = np.random.default_rng(settings.seed).integers(0, n_sentences, size=(settings.samples, size))
    rows = np.repeat(np.arange(settings.samples), size)
    counts = np.bincount(rows * n_sentences + drawn.ravel(), minlength=settings.samples * n_sentences)
    return counts.reshape(settings.samples, n_sentences).astype(np.float64)


def resampled_scores(stats: np.ndarray, counts: np.ndarray, metric: Metric) -> np.ndarray:
    """The metric on every resample: summed statistics are ``counts @ stats``."""
    stats = np.asarray(stats, dtype=np.float64)
    if counts.shape[1] != len(stats):
        raise ValueError(f"resamples are over {counts.shape[1]} sentences, statistics over {len(stats)}")
    return metric.scores(counts @ stats)


def paired_bootstrap(
    baseline_stats: np.ndarray,
    system_stats: np.ndarray,
    counts: np.ndarray,
    metric: Metric,
    settings: SignificanceSettings,
    baseline_resampled: Optional[np.ndarray] = None,
) -> PairedResult:
    """Koehn's paired bootstrap, or compare-mt's, on precomputed resample counts."""
    if len(baseline_stats) != len(system_stats):
        raise ValueError(f"{len(system_stats)} system sentences for {len(baseline_stats)} baseline sentences")
    if baseline_resampled is None:
        baseline_resampled = resampled_scores(baseline_stats, counts, metric)
    system_resampled = resampled_scores(system_stats, counts, metric)
    baseline_score = metric.score(baseline_stats)
    score = metric.score(system_stats)
    # a win is a resample on which a system scores better, in the metric's own direction
    sign = 1.0 if metric.higher_is_better else -1.0
    system_wins = float(np.mean(sign * system_resampled > sign * baseline_resampled))
    baseline_wins = float(np.mean(sign * system_resampled < sign * baseline_resampled))
    ties = None
    if settings.test == "compare-mt":
        # compare-mt counts a tie whenever the first system (the baseline) is not worse
        ties = float(np.mean(~(baseline_resampled < system_resampled)))
        p_value = 1.0 - max(system_wins, baseline_wins)
    elif sign * score > sign * baseline_score:
        p_value = 1.0 - system_wins
    elif sign * score < sign * baseline_score:
        p_value = 1.0 - baseline_wins
    else:
        p_value = 1.0
    ordered = np.sort(system_resampled)
    low_index = int(len(ordered) * 0.025)
    high_index = min(int(len(ordered) * 0.975), len(ordered) - 1)
    differences = np.sort(system_resampled - baseline_resampled)
    return PairedResult(
        score=score,
        baseline_score=baseline_score,
        delta=score - baseline_score,
        p_value=p_value,
        significant=p_value < settings.alpha,
        system_wins=system_wins,
        baseline_wins=baseline_wins,
        ties=ties,
        mean=float(np.mean(system_resampled)),
        ci_low=float(ordered[low_index]),
        ci_high=float(ordered[high_index]),
        delta_low=float(differences[low_index]),
        delta_high=float(differences[high_index]),
    )


@contextlib.contextmanager
def _sacrebleu_seed(seed: int):
    """sacreBLEU reads its seed from the environment."""
    previous = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = previous


def sacrebleu_paired_tests(
    references: Sequence[str],
    baseline: Sequence[str],
    systems: Sequence[Sequence[str]],
    settings: SignificanceSettings,
    tokenize: str = "13a",
) -> List[PairedResult]:
    """sacreBLEU's PairedTest (bs or ar) of each system against the baseline."""


    test_type = {"sacrebleu-bs": "bs", "sacrebleu-ar": "ar"}[settings.test]
    named = [("baseline", list(baseline))] + [(f"system{i}", list(s)) for i, s in enumerate(systems)]
    with _sacrebleu_seed(settings.seed):
        test = PairedTest(
            named, {"BLEU": sacrebleu_metric(tokenize)}, [list(references)],
            test_type=test_type, n_samples=settings.samples,
        )
        _, scores = test()
    (results,) = [value for key, value in scores.items() if key != "System"]
    baseline_result = results[0]
    out = []
    for result in results[1:]:
        out.append(
            PairedResult(
                score=result.score,
                baseline_score=baseline_result.score,
                delta=result.score - baseline_result.score,
                p_value=float(result.p_value),
                significant=float(result.p_value) < settings.alpha,
                mean=None if result.mean is None else float(result.mean),
                ci_low=None if result.ci is None else float(result.mean - result.ci),
                ci_high=None if result.ci is None else float(result.mean + result.ci),
            )
        )
    return out


def _correctness_result(baseline_correct, system_correct, p_value: float, settings: SignificanceSettings,
                        extra: Dict[str, float]) -> PairedResult:
    """The result in accuracy points, with the t interval of the mean paired difference (none for one example)."""
    from scipy.stats import t

    score, baseline_score = 100.0 * float(np.mean(system_correct)), 100.0 * float(np.mean(baseline_correct))
    differences = 100.0 * (system_correct - baseline_correct)
    low = high = None
    if len(differences) > 1:
        half = float(t.ppf(0.975, len(differences) - 1) * differences.std(ddof=1) / math.sqrt(len(differences)))
        low, high = float(differences.mean()) - half, float(differences.mean()) + half
    return PairedResult(score=score, baseline_score=baseline_score, delta=score - baseline_score,
                        p_value=p_value, significant=p_value < settings.alpha, delta_low=low, delta_high=high,
                        extra=extra)


def _correctness(baseline_correct, system_correct):
    baseline_correct = np.asarray(baseline_correct, dtype=np.float64)
    system_correct = np.asarray(system_correct, dtype=np.float64)
    if baseline_correct.shape != system_correct.shape or baseline_correct.ndim != 1:
        raise ValueError(f"{system_correct.shape} system examples for {baseline_correct.shape} baseline examples")
    if len(baseline_correct) == 0:
        raise ValueError("no examples to test")
    return baseline_correct, system_correct


def paired_t_test(baseline_correct, system_correct, settings: SignificanceSettings) -> PairedResult:
    """Two-sided paired t-test on per-example correctness (0/1), as Michel et al. test BERT's heads."""
    from scipy.special import stdtr

    baseline_correct, system_correct = _correctness(baseline_correct, system_correct)
    differences = system_correct - baseline_correct
    count = len(differences)
    mean = float(differences.mean())
    spread = float(differences.std(ddof=1)) if count > 1 else 0.0
    if spread == 0.0:  # every difference the same: no variance to test against
        t_value, p_value = (0.0, 1.0) if mean == 0.0 else (math.copysign(math.inf, mean), 0.0)
    else:
        t_value = mean / (spread / math.sqrt(count))
        p_value = float(2.0 * stdtr(count - 1, -abs(t_value)))
    return _correctness_result(baseline_correct, system_correct, p_value, settings,
                               {"t": t_value, "degrees_of_freedom": count - 1})


def mcnemar_exact(baseline_correct, system_correct, settings: SignificanceSettings) -> PairedResult:
    """McNemar's exact test: two-sided binomial test (p = 1/2) on the examples only one system gets right."""
    baseline_correct, system_correct = _correctness(baseline_correct, system_correct)
    baseline_only = int(np.sum((baseline_correct == 1) & (system_correct == 0)))
    system_only = int(np.sum((baseline_correct == 0) & (system_correct == 1)))
    disagreements = baseline_only + system_only
    if disagreements == 0:
        p_value = 1.0
    else:
        tail = sum(math.comb(disagreements, k) for k in range(min(baseline_only, system_only) + 1))
        p_value = min(1.0, 2.0 * tail / 2.0 ** disagreements)
    return _correctness_result(baseline_correct, system_correct, p_value, settings,
                               {"baseline_only_correct": baseline_only, "system_only_correct": system_only})


# test name -> test on per-example correctness
CORRECTNESS_TEST_FUNCTIONS = {"t-test": paired_t_test, "mcnemar": mcnemar_exact}
