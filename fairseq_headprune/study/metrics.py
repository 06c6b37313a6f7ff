"""Metric objects: one per corpus metric a study reports and tests.

A metric says what it is called, how it turns one example (a hypothesis and
its reference) into sufficient statistics, how a corpus score follows from
the sums of those statistics, which direction is better, and which
significance tests apply. Resampling tests then work on statistics alone
(``significance.py``), whatever the metric: accuracy, Matthews correlation or
perplexity are new ``Metric`` objects, not new branches.

BLEU is implemented three ways, each reproducing one tool exactly
(``bleu_stats.py``): fairseq's tokenized BLEU, sacreBLEU, and compare-mt's
BLEU, which its own paired bootstrap resamples.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Sequence, Tuple

import numpy as np

from ..constants import SIGNIFICANCE_TESTS
from . import bleu_stats


@dataclass(frozen=True)
class Metric:
    """A corpus metric computed from per-example sufficient statistics."""

    name: str  # what --bleu (or a later --metric) names it
    column: str  # its column in result tables
    description: str  # one line for captions and console output
    statistics: Callable[[Sequence[str], Sequence[str]], np.ndarray]  # (references, hypotheses) -> rows
    from_sums: Callable[[np.ndarray], np.ndarray]  # (n, columns) summed statistics -> n scores
    higher_is_better: bool = True
    tests: Tuple[str, ...] = SIGNIFICANCE_TESTS  # significance tests that apply to it

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
            raise ValueError(f"the {test} test does not apply to {self.name}")
        return COMPARE_MT_BLEU if test == "compare-mt" else self


def _sacrebleu_from_sums(sums: np.ndarray) -> np.ndarray:
    metric = bleu_stats.sacrebleu_metric()
    return np.array([metric._compute_score_from_stats(row).score for row in sums])


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
    from_sums=_sacrebleu_from_sums,
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
