"""Metric objects: one per corpus metric a study reports and tests.

A metric says what it is called, how it turns one example (a hypothesis and
its reference) into sufficient statistics, how a corpus score follows from
the sums of those statistics, which direction is better, and which
significance tests apply. Resampling tests then work on statistics alone
(``significance.py``), whatever the metric: accuracy, Matthews correlation or
perplexity are new ``Metric`` objects, not new branches.

BLEU is implemented three ways, each reproducing one tool exactly
(``bleu_stats.py``): fairseq's tokenized BLEU, sacreBLEU, and compare-mt's
BLEU, which its own paired bootstrap resamples. Classification has accuracy
and Matthews correlation, on (gold label, predicted label) strings, each in
percent as fairseq's ``sentence_prediction`` criterion reports it. Language
models have perplexity, on each sentence's summed loss and token count.
"""

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from fairseq_headprune.constants import BLEU_TESTS, CORRECTNESS_TESTS
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.statistics import bleu_stats


@dataclass(frozen=True)
class Metric:
    """A corpus metric computed from per-example sufficient statistics."""

    name: str  # what --bleu (or a later --metric) names it
    column: str  # its column in result tables
    description: str  # one line for captions and console output
    statistics: Callable[[Sequence[str], Sequence[str]], np.ndarray]  # (references, hypotheses) -> rows
    from_sums: Callable[[np.ndarray], np.ndarray]  # (n, columns) summed statistics -> n scores
    higher_is_better: bool = True
    tests: Tuple[str, ...] = BLEU_TESTS  # significance tests that apply to it
    label: str = "BLEU"  # its name in console lines, captions and axes ("ΔBLEU")

    @property
    def title(self) -> str:
        """``label`` at the start of a sentence."""
        return self.label[:1].upper() + self.label[1:]

    def example_statistics(self, references: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        """One row of sufficient statistics per example."""
        return self.statistics(references, hypotheses)

    def scores(self, sums: np.ndarray) -> np.ndarray:
        """The score of each row of summed statistics (resamples, corpora)."""
        return self.from_sums(np.atleast_2d(np.asarray(sums, dtype=np.float64)))

    def score(self, statistics: np.ndarray) -> float:
        """Corpus score of per-example statistics."""
        return float(self.scores(np.asarray(statistics).sum(axis=0))[0])

    def for_test(self, test: str) -> "Metric":
        """The metric whose statistics ``test`` resamples (compare-mt's test uses its own BLEU)."""
        if test not in self.tests:
            raise SettingsError(f"the test {test} does not apply to {self.name}; choose from {', '.join(self.tests)}",
                                setting="test")
        return COMPARE_MT_BLEU if test == "compare-mt" else self


TOKENIZED_BLEU = Metric(
    name="tokenized",
    column="bleu",
    description="tokenized BLEU (fairseq's bleu scorer, as fairseq-generate prints)",
    statistics=bleu_stats.fairseq_bleu_stats,
    from_sums=bleu_stats.fairseq_bleu_from_sums,
)
SACREBLEU = Metric(
    name="sacrebleu",
    column="bleu",
    description="detokenized sacreBLEU (13a)",
    statistics=bleu_stats.sacrebleu_stats,
    from_sums=bleu_stats.sacrebleu_from_sums,
)
COMPARE_MT_BLEU = Metric(
    name="compare-mt",
    column="bleu",
    description="compare-mt's BLEU (space-separated tokens)",
    statistics=bleu_stats.compare_mt_stats,
    from_sums=bleu_stats.compare_mt_bleu_from_sums,
    tests=("compare-mt",),
)

# the BLEU a study reports (--bleu)
BLEU_METRICS: Dict[str, Metric] = {metric.name: metric for metric in (TOKENIZED_BLEU, SACREBLEU)}


def _accuracy_statistics(references: Sequence[str], predictions: Sequence[str]) -> np.ndarray:
    """One row per example: [1 if the predicted label is the gold one else 0, 1 (the example)]."""
    if len(references) != len(predictions):
        raise SettingsError(f"{len(predictions)} predictions for {len(references)} gold labels")
    correct = np.array([float(r == p) for r, p in zip(references, predictions)])
    return np.stack([correct, np.ones_like(correct)], axis=1)


def _labels_of(references: Sequence[str]) -> List[str]:
    return sorted(set(references))


def _confusion_statistics(references: Sequence[str], predictions: Sequence[str]) -> np.ndarray:
    """One row per example: the one-hot (gold, predicted) cell of the K x K confusion matrix.

    K is the number of gold labels; a prediction outside them is an error.
    """
    if len(references) != len(predictions):
        raise SettingsError(f"{len(predictions)} predictions for {len(references)} gold labels")
    labels = _labels_of(references)
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted(set(predictions) - set(index))
    if unknown:
        raise SettingsError(f"predicted labels {', '.join(unknown)} never occur among the gold labels")
    rows = np.zeros((len(references), len(labels) ** 2))
    for row, (gold, predicted) in enumerate(zip(references, predictions)):
        rows[row, index[gold] * len(labels) + index[predicted]] = 1.0
    return rows


def _matthews_from_sums(sums: np.ndarray) -> np.ndarray:
    """Matthews correlation (Gorodkin's K-class form, the one scikit-learn computes), in percent."""
    classes = int(round(np.sqrt(sums.shape[1])))
    confusion = sums.reshape(len(sums), classes, classes)  # [resample, gold, predicted]
    total = confusion.sum(axis=(1, 2))
    correct = np.trace(confusion, axis1=1, axis2=2)
    gold = confusion.sum(axis=2)
    predicted = confusion.sum(axis=1)
    numerator = correct * total - (gold * predicted).sum(axis=1)
    denominator = np.sqrt((total ** 2 - (predicted ** 2).sum(axis=1)) * (total ** 2 - (gold ** 2).sum(axis=1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, 100.0 * numerator / np.where(denominator > 0, denominator, 1.0), 0.0)


ACCURACY = Metric(
    name="accuracy",
    column="accuracy",
    description="accuracy (%, as fairseq's sentence_prediction criterion reports it)",
    statistics=_accuracy_statistics,
    from_sums=lambda sums: 100.0 * sums[:, 0] / np.maximum(sums[:, 1], 1.0),
    tests=("bootstrap",) + CORRECTNESS_TESTS,
    label="accuracy",
)
MATTHEWS = Metric(
    name="mcc",
    column="mcc",
    description="Matthews correlation (x 100, as fairseq's --report-mcc)",
    statistics=_confusion_statistics,
    from_sums=_matthews_from_sums,
    tests=("bootstrap",),
    label="MCC",
)

# the metric a classification study reports (--metric)
CLASSIFICATION_METRICS: Dict[str, Metric] = {metric.name: metric for metric in (ACCURACY, MATTHEWS)}


def _perplexity_statistics(references, lines: Sequence[str]) -> np.ndarray:
    """One row per sentence, [summed loss in base 2, tokens], from ``LOSS TOKENS`` lines.

    No reference is involved (``references`` is ignored); the loss is the
    one fairseq-eval-lm reports ("Loss (base 2)"), summed over the sentence.
    """
    rows = []
    for number, line in enumerate(lines, 1):
        fields = line.split()
        try:
            loss, tokens = float(fields[0]), float(fields[1])
            if len(fields) != 2 or tokens <= 0 or not tokens.is_integer() or not np.isfinite(loss) or loss < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise SettingsError(
                f"line {number} is not 'LOSS TOKENS' (summed loss in base 2 >= 0, a positive token count): {line!r}"
            ) from None
        rows.append((loss, tokens))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 2)


PERPLEXITY = Metric(
    name="ppl",
    column="ppl",
    description="perplexity (2 ** (summed loss in base 2 / tokens), as fairseq-eval-lm reports it)",
    statistics=_perplexity_statistics,
    from_sums=lambda sums: np.exp2(sums[:, 0] / np.maximum(sums[:, 1], 1.0)),
    higher_is_better=False,
    tests=("bootstrap",),
    label="perplexity",
)

def loss_per_token(statistics: np.ndarray) -> float:
    """Summed loss over summed tokens (base 2) of per-sentence perplexity statistics: fairseq-eval-lm's loss."""
    sums = np.asarray(statistics, dtype=np.float64).sum(axis=0)
    return float(sums[0] / max(sums[1], 1.0))


# the metric a language-model study reports
LANGUAGE_MODEL_METRICS: Dict[str, Metric] = {PERPLEXITY.name: PERPLEXITY}


def metric_of_record(settings: Dict[str, object]) -> Metric:
    """The metric a result file's settings were scored with: ``metric`` (classifier, LM) or ``bleu`` (translation)."""
    name = settings.get("metric")
    if name is None:
        return BLEU_METRICS.get(settings.get("bleu", "tokenized"), TOKENIZED_BLEU)
    return {**CLASSIFICATION_METRICS, **LANGUAGE_MODEL_METRICS}[name]
