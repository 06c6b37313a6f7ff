"""Per-sentence BLEU sufficient statistics, and corpus BLEU from their sums.

Significance tests resample sentences. Summing per-sentence statistics and
computing BLEU from the sums, instead of re-scoring text, is what makes 1000
resamples of hundreds of configurations take seconds.

Every statistics array has one row per sentence and the columns
``STAT_COLUMNS``. Three BLEU definitions are kept apart, each reproducing one
tool exactly (``metrics.py`` makes each a metric object):

- ``fairseq``: fairseq's ``bleu`` scorer (tokenized BLEU, the number
  ``fairseq-generate`` prints; no smoothing). Statistics come from fairseq's
  own C scorer, one sentence at a time.
- ``sacrebleu``: sacreBLEU's corpus BLEU (13a tokenizer, exp smoothing), on
  detokenized text; statistics and scores come from sacreBLEU itself.
- ``compare-mt``: compare-mt's ``BleuScorer`` on space-separated tokens, with
  its quirks: each sentence's n-gram total is at least 1, and a zero precision
  adds nothing to the log-sum instead of zeroing the score.
"""

from collections import Counter
from typing import List, Sequence

import numpy as np
from sacrebleu.metrics import BLEU

STAT_COLUMNS = (
    "hyp_len", "ref_len",
    "match1", "match2", "match3", "match4",
    "total1", "total2", "total3", "total4",
)
ORDER = 4


def fairseq_bleu_stats(references: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
    """fairseq's tokenized BLEU statistics of space-separated sentences.

    Words are mapped to ids as ``fairseq-generate`` does after ``--remove-bpe``
    (``encode_line(..., add_if_not_exist=True)``), then scored by fairseq's C
    scorer, which never matches a reference ``<unk>``.
    """
    from fairseq.data import Dictionary

    _check_same_length(references, hypotheses)
    dictionary = Dictionary()
    scorer = fairseq_scorer(dictionary)
    rows = []
    for reference, hypothesis in zip(references, hypotheses):
        rows.append(
            fairseq_sentence_stats(
                scorer,
                dictionary.encode_line(reference, add_if_not_exist=True),
                dictionary.encode_line(hypothesis, add_if_not_exist=True),
            )
        )
    return np.asarray(rows, dtype=np.int64).reshape(-1, len(STAT_COLUMNS))


def fairseq_scorer(dictionary):
    from fairseq.scoring.bleu import BleuConfig, Scorer

    return Scorer(BleuConfig(pad=dictionary.pad(), eos=dictionary.eos(), unk=dictionary.unk()))


def fairseq_sentence_stats(scorer, reference_ids, hypothesis_ids) -> List[int]:
    """One sentence through fairseq's scorer, read back as a ``STAT_COLUMNS`` row."""
    scorer.reset()
    scorer.add(reference_ids.int(), hypothesis_ids.int())
    stat = scorer.stat
    return [
        stat.predlen, stat.reflen,
        stat.match1, stat.match2, stat.match3, stat.match4,
        stat.count1, stat.count2, stat.count3, stat.count4,
    ]


def sacrebleu_metric(tokenize: str = "13a"):
    """sacreBLEU's BLEU as the studies score with it (``none``: text already tokenized)."""

    return BLEU(tokenize=tokenize, force=tokenize == "none")


def sacrebleu_stats(references: Sequence[str], hypotheses: Sequence[str], tokenize: str = "13a") -> np.ndarray:
    """``STAT_COLUMNS`` rows from sacreBLEU's public per-sentence scores (lengths, n-gram matches and totals).

    ``effective_order`` changes only a sentence's own score, which is not kept, and keeps sacreBLEU from
    warning about it once per sentence.
    """

    _check_same_length(references, hypotheses)
    metric = BLEU(tokenize=tokenize, force=tokenize == "none", effective_order=True)
    rows = []
    for hypothesis, reference in zip(hypotheses, references):
        score = metric.sentence_score(hypothesis, [reference])
        rows.append([score.sys_len, score.ref_len, *score.counts, *score.totals])
    return np.asarray(rows, dtype=np.int64).reshape(-1, len(STAT_COLUMNS))


def sacrebleu_from_sums(sums: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU of each row of summed ``STAT_COLUMNS`` statistics (its default exp smoothing)."""

    return np.array([BLEU.compute_bleu(correct=row[2:6], total=row[6:10], sys_len=int(row[0]), ref_len=int(row[1]),
                                       smooth_method="exp").score for row in np.atleast_2d(sums)])


def compare_mt_stats(references: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
    """compare-mt's ``BleuScorer.cache_stats`` on lines split at single spaces."""
    _check_same_length(references, hypotheses)
    rows = []
    for reference, hypothesis in zip(references, hypotheses):
        ref_words = reference.strip().split(" ")
        hyp_words = hypothesis.strip().split(" ")
        matches, totals = [], []
        for n in range(1, ORDER + 1):
            hyp_ngrams = Counter(tuple(hyp_words[i:i + n]) for i in range(len(hyp_words) - n + 1))
            ref_ngrams = Counter(tuple(ref_words[i:i + n]) for i in range(len(ref_words) - n + 1))
            matches.append(sum(min(count, ref_ngrams[g]) for g, count in hyp_ngrams.items()))
            totals.append(max(1, sum(hyp_ngrams.values())))
        rows.append([len(hyp_words), len(ref_words), *matches, *totals])
    return np.asarray(rows, dtype=np.int64).reshape(-1, len(STAT_COLUMNS))


def fairseq_bleu_from_sums(sums: np.ndarray) -> np.ndarray:
    """fairseq's BLEU of each row of summed statistics (no smoothing)."""
    hyp_len, ref_len = sums[:, 0], sums[:, 1]
    matches, totals = sums[:, 2:2 + ORDER], sums[:, 2 + ORDER:]
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(totals > 0, matches / np.where(totals > 0, totals, 1), 0.0)
        log_sum = np.where(precision > 0, np.log(np.where(precision > 0, precision, 1)), -np.inf).sum(axis=1)
        brevity = np.minimum(1.0, np.exp(1.0 - ref_len / hyp_len))
    return brevity * np.exp(log_sum / ORDER) * 100.0


def compare_mt_bleu_from_sums(sums: np.ndarray) -> np.ndarray:
    """compare-mt's BLEU of each row of summed statistics, quirks included."""
    hyp_len, ref_len = sums[:, 0], sums[:, 1]
    matches, totals = sums[:, 2:2 + ORDER], sums[:, 2 + ORDER:]
    log_sum = np.zeros(len(sums))
    with np.errstate(divide="ignore", invalid="ignore"):
        for n in range(ORDER):  # the same order of additions as compare-mt
            precision = np.where(totals[:, n] != 0, matches[:, n] / np.where(totals[:, n] != 0, totals[:, n], 1), 0.0)
            log_sum = log_sum + np.where(precision > 0, np.log(np.where(precision > 0, precision, 1)), 0.0) * 0.25
        brevity = np.where(hyp_len != 0, np.minimum(1.0, np.exp(1.0 - ref_len / np.where(hyp_len != 0, hyp_len, 1))),
                           0.0)
    scores = 100.0 * brevity * np.exp(log_sum)
    return np.where(matches[:, 0] == 0, 0.0, scores)


def _check_same_length(references: Sequence[str], hypotheses: Sequence[str]) -> None:
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
