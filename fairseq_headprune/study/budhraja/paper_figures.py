"""Budhraja et al. (2020)'s own numbers, as its tables print them, and the figures the findings compare with.

Table 1 (Transformer, BLEU, EN-RU and EN-DE), Table 2 (important layers
kept / pruned, EN-RU), Table 3 (per-type budgets, EN-RU), Tables 4-6 (BERT,
accuracy on MNLI-M, QQP, QNLI, SST-2). The paper states its BERT claims on
the mean of its four tasks ("an average accuracy drop of under 1%", "2 of 4
cases each way"), so a BERT figure here is that mean.
"""

from typing import Dict, Optional, Tuple

from fairseq_headprune.study.statistics.intervals import NORMAL_975

TABLE1_BASELINE = (29.09, 27.95)  # EN-RU, EN-DE
TABLE1 = {25: (29.59, 28.19), 35: (29.29, 27.94), 50: (29.38, 28.02), 55: (29.00, 28.24), 60: (28.94, 27.88),
          75: (28.22, 27.49), 81: (27.97, 26.80), 87: (27.47, 26.92)}  # % pruned -> BLEU; 87: one head per layer
ONE_HEAD_LEVEL = 87
TABLE2 = {25: (29.62, 29.43), 40: (29.17, 29.57), 50: (29.01, 29.35), 60: (28.99, 28.78),
          75: (28.48, 28.35)}  # level -> BLEU with the important layers (kept, pruned)
TABLE3 = {48: {"ES": 28.96, "ED": 29.00, "DS": 29.13}, 60: {"ES": 28.48, "ED": 28.78, "DS": 28.48},
          75: {"ES": 27.95, "ED": 27.96, "DS": 28.04}, 82: {"ES": 27.24, "ED": 26.95, "DS": 27.83}}  # fewest in X
TABLE4_BASELINE = (83.69, 91.22, 91.66, 92.88)  # MNLI-M, QQP, QNLI, SST-2
TABLE4 = {10: (83.70, 91.39, 91.60, 92.48), 20: (82.80, 91.09, 90.33, 92.25), 30: (82.87, 91.19, 90.84, 92.48),
          40: (82.48, 91.05, 90.40, 92.27), 50: (83.02, 90.90, 90.04, 92.00), 60: (81.35, 90.56, 87.31, 91.89),
          70: (80.40, 89.83, 86.85, 90.86), 80: (78.93, 90.03, 86.40, 89.96), 90: (75.08, 87.44, 81.80, 87.11)}
# Table 5 (and 6): layers pruned (strategy, K of 12) -> accuracy on the four tasks
LAYERS = {("top", 1): (82.95, 91.33, 91.48, 91.85), ("bottom", 1): (83.65, 91.42, 91.17, 93.11),
          ("top", 3): (82.58, 90.85, 89.2, 92.31), ("bottom", 3): (83.36, 90.95, 90.88, 92.54),
          ("top", 6): (80.98, 90.52, 87.44, 90.02), ("bottom", 6): (79.29, 90.17, 87.40, 91.05),
          ("top", 8): (77.59, 89.34, 85.08, 88.53), ("bottom", 8): (78.07, 89.67, 84.22, 87.95),
          ("top+bottom", 2): (83.33, 91.23, 90.70, 92.88), ("middle", 2): (83.60, 91.08, 90.80, 91.74),
          ("top+bottom", 4): (82.41, 91.11, 90.48, 92.20), ("middle", 4): (81.84, 90.87, 86.14, 90.94),
          ("top+bottom", 6): (81.72, 90.67, 88.30, 92.31), ("middle", 6): (80.08, 90.49, 87.07, 87.84),
          ("top+bottom", 8): (79.47, 89.57, 86.01, 90.36), ("middle", 8): (78.88, 89.55, 83.67, 88.87),
          ("even", 6): (81.54, 90.74, 86.39, 90.36), ("odd", 6): (81.95, 90.58, 90.18, 92.20)}
PAPER_DEPTH = 12
# "The standard deviations are 0.668% and 0.778% of the reported average values for Transformer and BERT" (of the
# three draws each configuration averages)
PAPER_RELATIVE_STD = {False: 0.00668, True: 0.00778}
PAPER_DRAWS = 3
# a loss one point beyond the paper's figure contradicts it (the unit of its headline: "a drop of less than 1 BLEU
# point", "an average accuracy drop of under 1%")
CONTRADICTION_POINTS = 1.0
FIGURE2_SPREAD = 0.10  # "the average change in attention parameters for any two layers differs by less than 10%"
BERT_TASKS = 4
TABLE3_LEVELS = tuple(TABLE3)


def _mean(values) -> float:
    return sum(values) / len(values)


def paper_level(percent: float, levels, within: float = 3.0) -> Optional[int]:
    """The paper's level nearest ``percent`` (None if none is within ``within`` points: the study's 61.1% is 60)."""
    nearest = min(levels, key=lambda level: abs(level - percent))
    return nearest if abs(nearest - percent) <= within else None


def table1_figure(level: int) -> Tuple[float, float]:
    """Table 1's change against the unpruned model at ``level``: (EN-RU, EN-DE)."""
    return tuple(round(score - base, 2) for score, base in zip(TABLE1[level], TABLE1_BASELINE))


def table4_figure(level: int) -> Tuple[float, float]:
    """Table 4's change at ``level``: (MNLI-M, the mean of the four tasks)."""
    changes = [score - base for score, base in zip(TABLE4[level], TABLE4_BASELINE)]
    return round(changes[0], 2), round(_mean(changes), 2)


def _mean_spread(scores, bert: bool) -> float:
    """The standard error of a mean of the paper's three draws, for each score in ``scores`` averaged (BERT: the
    mean of its tasks), from its reported relative standard deviation."""
    errors = [PAPER_RELATIVE_STD[bert] * score / PAPER_DRAWS ** 0.5 for score in scores]
    return sum(error ** 2 for error in errors) ** 0.5 / len(errors)


def allowance(*configurations, bert: bool) -> float:
    """The 95% half-width of a paper figure from its own spread: ``configurations`` are the score tuples whose means
    the figure is built from (one for a change against the unpruned model, whose baseline has no draws; two for a
    difference of two configurations); a Transformer figure is one language pair's."""
    variance = sum(_mean_spread(scores, bert) ** 2 for scores in configurations)
    return round(NORMAL_975 * variance ** 0.5, 2)


def table1_pair(level: int) -> Tuple[float, ...]:
    """The pruned score of the language pair whose loss Table 1's figure at ``level`` is (the larger loss)."""
    ru, de = table1_figure(level)
    return (TABLE1[level][0],) if ru <= de else (TABLE1[level][1],)


def table2_largest_gap() -> float:
    """The largest difference between Table 2's two configurations of a level (kept minus pruned, in size)."""
    return round(max(abs(kept - pruned) for kept, pruned in TABLE2.values()), 2)


def table2_gaps() -> Dict[int, float]:
    return {level: round(kept - pruned, 2) for level, (kept, pruned) in TABLE2.items()}


def table3_best() -> Dict[int, Tuple[str, float]]:
    """At each level of Table 3, the configuration best and its margin over the second."""
    best = {}
    for level, arms in TABLE3.items():
        ranked = sorted(arms, key=arms.get, reverse=True)
        best[level] = (ranked[0], round(arms[ranked[0]] - arms[ranked[1]], 2))
    return best


def paper_count(percent: float, depth_share: Optional[float] = None) -> int:
    """The paper's K (of 12 layers) pruning the same share of the layers as a study's ``percent`` pruned."""
    share = percent / 100.0 if depth_share is None else depth_share
    return max(1, round(share * PAPER_DEPTH))


def layers_difference(first: Tuple[str, int], second: Tuple[str, int]) -> Optional[Tuple[float, float]]:
    """Accuracy with ``first`` pruned minus with ``second`` (strategy, K), (MNLI-M, mean of the four tasks); None
    where the paper has no such row."""
    if first not in LAYERS or second not in LAYERS:
        return None
    changes = [a - b for a, b in zip(LAYERS[first], LAYERS[second])]
    return round(changes[0], 2), round(_mean(changes), 2)


def nearest_count(name: str, count: int) -> int:
    """The K of the paper's rows for strategy ``name`` nearest ``count`` (of 12 layers)."""
    counts = sorted(k for strategy, k in LAYERS if strategy == name)
    return min(counts, key=lambda k: (abs(k - count), k))
