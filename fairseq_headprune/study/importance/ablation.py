"""The ablation studies of Michel et al. (2019, section 3), as plain functions.

Which configurations a study translates (``single_head_configs``,
``all_but_one_configs``), how their scores become the paper's tables (one
row per configuration, best head per layer, cross-domain correlation), and
how those tables are written (``ablation_tables.py``). Nothing here
touches fairseq: results come in as BLEU statistics per configuration.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from fairseq_headprune.constants import ATTENTION_TYPES, NO_MASK_SPEC
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, full_mask, head_mask_to_spec
from fairseq_headprune.study.statistics.metrics import PERPLEXITY, SACREBLEU, TOKENIZED_BLEU, Metric, loss_per_token
from fairseq_headprune.study.statistics.significance import (
    CORRECTNESS_TEST_FUNCTIONS,
    PairedResult,
    SignificanceSettings,
    paired_bootstrap,
    resample_counts,
    resampled_scores,
    sacrebleu_paired_tests,
)

BASELINE = "baseline"


@dataclass
class HeadConfig:
    """A configuration of a study: its result-file name, mask and where it sits in the tables."""

    name: str
    head_mask: Optional[HeadMask]
    attention_type: Optional[str] = None
    layer: Optional[int] = None  # 1-based, as in the paper's tables
    head: Optional[int] = None
    tuning: Optional[object] = None  # a mask_tuning.MaskTuning whose scales and corrections apply with the mask
    ffn_mask: Optional[Dict[str, object]] = None  # FFN neurons masked too (per FFN type, layers x neurons)

    @property
    def labels(self) -> Dict[str, object]:
        return {"attention_type": self.attention_type, "layer": self.layer, "head": self.head}

    @property
    def spec(self) -> str:
        return NO_MASK_SPEC if self.head_mask is None else head_mask_to_spec(self.head_mask)


def baseline_config() -> HeadConfig:
    return HeadConfig(BASELINE, None)


def single_head_configs(layout: HeadLayout, heads: Optional[HeadMask] = None) -> List[HeadConfig]:
    """Mask one head at a time; ``heads`` (0 = selected) limits which heads."""
    configs = []
    for attention_type in ATTENTION_TYPES:
        if attention_type not in layout:
            continue
        layers, count = layout[attention_type]
        for layer in range(layers):
            for head in range(count):
                if heads is not None and heads[attention_type][layer, head] != 0:
                    continue
                head_mask = full_mask(layout)
                head_mask[attention_type][layer, head] = 0.0
                name = f"single.{attention_type}.L{layer + 1}.H{head + 1}"
                configs.append(HeadConfig(name, head_mask, attention_type, layer + 1, head + 1))
    return configs


def all_but_one_configs(layout: HeadLayout, types: Sequence[str] = ATTENTION_TYPES) -> List[HeadConfig]:
    """In each layer of each type, keep one head and mask the others (Table 2)."""
    configs = []
    for attention_type in types:
        layers, count = layout[attention_type]
        for layer in range(layers):
            for head in range(count):
                head_mask = full_mask(layout)
                head_mask[attention_type][layer, :] = 0.0
                head_mask[attention_type][layer, head] = 1.0
                name = f"keep.{attention_type}.L{layer + 1}.H{head + 1}"
                configs.append(HeadConfig(name, head_mask, attention_type, layer + 1, head + 1))
    return configs


@dataclass
class ConfigScores:
    """What the tables need of one configuration's stored result."""

    name: str
    spec: str
    labels: Dict[str, object]
    bleu: float  # tokenized
    sacrebleu: float
    stats: np.ndarray  # per-sentence statistics of the metric the test resamples
    hypotheses: Optional[List[str]] = None  # for sacreBLEU's own tests


def compare_with_baseline(
    baseline: ConfigScores,
    systems: Sequence[ConfigScores],
    settings: SignificanceSettings,
    metric: Metric,
    references: Optional[Sequence[str]] = None,
    tokenize: str = "13a",
) -> List[PairedResult]:
    """Every system against the baseline, on one shared set of resamples.

    ``metric`` is the one the test resamples (``Metric.for_test``); the
    systems' ``stats`` are its statistics.
    """
    if settings.test.startswith("sacrebleu"):
        return sacrebleu_paired_tests(
            references, baseline.hypotheses, [s.hypotheses for s in systems], settings, tokenize
        )
    if settings.test in CORRECTNESS_TEST_FUNCTIONS:  # accuracy's statistics: column 0 is correctness
        test = CORRECTNESS_TEST_FUNCTIONS[settings.test]
        return [test(baseline.stats[:, 0], s.stats[:, 0], settings) for s in systems]
    counts = resample_counts(len(baseline.stats), settings)
    baseline_resampled = resampled_scores(baseline.stats, counts, metric)
    return [
        paired_bootstrap(baseline.stats, s.stats, counts, metric, settings, baseline_resampled)
        for s in systems
    ]


def text_scores(name: str, references: Sequence[str], hypotheses: Sequence[str], test_metric: Metric) -> ConfigScores:
    """Scores of one system's hypothesis text (the significance command's files)."""

    statistics = {metric.name: metric.example_statistics(references, hypotheses)
                  for metric in (TOKENIZED_BLEU, SACREBLEU)}
    if test_metric.name not in statistics:
        statistics[test_metric.name] = test_metric.example_statistics(references, hypotheses)
    return ConfigScores(
        name, "", {}, TOKENIZED_BLEU.score(statistics["tokenized"]), SACREBLEU.score(statistics["sacrebleu"]),
        statistics[test_metric.name], list(hypotheses),
    )


def reported_bleu(scores: ConfigScores, bleu: str) -> float:
    return scores.bleu if bleu == "tokenized" else scores.sacrebleu


def result_rows(
    baseline: ConfigScores, systems: Sequence[ConfigScores], results: Sequence[PairedResult], bleu: str
) -> List[Dict[str, object]]:
    """One row per configuration: the columns of the TSV/JSON result tables.

    ``bleu`` and ``delta`` are in the reported BLEU (``tokenized`` or
    ``sacrebleu``); ``test_bleu`` is the BLEU the test resampled (compare-mt's
    own in compare-mt mode).
    """
    rows = []
    for system, result in zip(systems, results):
        reported = reported_bleu(system, bleu)
        rows.append(
            {
                "config": system.name,
                "attention_type": system.labels.get("attention_type"),
                "layer": system.labels.get("layer"),
                "head": system.labels.get("head"),
                "spec": system.spec,
                "bleu": reported,
                "delta": reported - reported_bleu(baseline, bleu),
                "bleu_tokenized": system.bleu,
                "bleu_sacrebleu": system.sacrebleu,
                "p_value": result.p_value,
                "significant": bool(result.significant),
                "test_bleu": result.score,
                "ci_low": result.ci_low,
                "ci_high": result.ci_high,
                "delta_low": result.delta_low,
                "delta_high": result.delta_high,
                "system_wins": result.system_wins,
                "baseline_wins": result.baseline_wins,
                "ties": result.ties,
            }
        )
    return rows


def metric_result_rows(
    baseline: ConfigScores, systems: Sequence[ConfigScores], results: Sequence[PairedResult], metric: Metric
) -> List[Dict[str, object]]:
    """One row per configuration of a classifier or LM sweep: the metric's own column and its change.

    ``stats`` are ``metric``'s statistics; a perplexity row also has the
    loss per token (base 2), as fairseq-eval-lm prints it.
    """
    base = metric.score(baseline.stats)
    rows = []
    for system, result in zip(systems, results):
        value = metric.score(system.stats)
        row = {
            "config": system.name,
            "attention_type": system.labels.get("attention_type"),
            "layer": system.labels.get("layer"),
            "head": system.labels.get("head"),
            "spec": system.spec,
            metric.column: value,
            "delta": value - base,
        }
        if metric is PERPLEXITY:
            row["loss"] = loss_per_token(system.stats)
        row.update({
            "p_value": result.p_value,
            "significant": bool(result.significant),
            "ci_low": result.ci_low,
            "ci_high": result.ci_high,
            "delta_low": result.delta_low,
            "delta_high": result.delta_high,
            "system_wins": result.system_wins,
            "baseline_wins": result.baseline_wins,
            "ties": result.ties,
        })
        rows.append(row)
    return rows


def best_per_layer(rows: Sequence[Dict[str, object]], column: str = "bleu",
                   higher_is_better: bool = True) -> List[Dict[str, object]]:
    """Table 2: per attention type and layer, the kept head with the best score in ``column``."""
    best: Dict[Tuple[str, int], Dict[str, object]] = {}
    sign = 1.0 if higher_is_better else -1.0
    for row in rows:
        key = (row["attention_type"], row["layer"])
        if key not in best or sign * row[column] > sign * best[key][column]:
            best[key] = row
    return [best[key] for key in sorted(best, key=lambda k: (ATTENTION_TYPES.index(k[0]), k[1]))]


def best_columns(column: str = "bleu") -> Tuple[str, ...]:
    return ("attention_type", "layer", "head", "config", column, "delta", "p_value", "significant")


# the paired test's 95% interval of the change and of the score, carried where the sweep's rows have them (the
# findings judge each layer's best head by its interval against the paper's figure)
INTERVAL_COLUMNS = ("delta_low", "delta_high", "ci_low", "ci_high")


def selected_columns(column: str = "bleu") -> Dict[str, str]:
    return {key: f"selected_{key}" for key in ("head", column, "delta", "p_value", "significant")}


def best_heads(
    rows: Sequence[Dict[str, object]],
    select_rows: Optional[Sequence[Dict[str, object]]] = None,
    select_split: Optional[str] = None,
    column: str = "bleu",
    higher_is_better: bool = True,
) -> Tuple[List[Dict[str, object]], List[Dict[str, object]], Optional[Dict[Tuple[str, int], Dict[str, object]]]]:
    """Table 2 and its appendix-A variant: the best kept head per layer.

    Returns the best rows of ``rows`` (chosen on the test split itself), the
    table entries, and, when ``select_rows`` (the same sweep on another
    split) is given, per (type, layer) the head chosen there with its score
    on the test split (``selected``), so the choice is not made on the data
    it is reported on. ``column`` is the score compared (lower is better for perplexity).
    """
    best = best_per_layer(rows, column, higher_is_better)
    selected = None
    if select_rows is not None:
        by_name = {r["config"]: r for r in rows}
        selected = {}
        for chosen in best_per_layer(select_rows, column, higher_is_better):
            row = dict(by_name[chosen["config"]])
            row["selected_on"] = select_split
            selected[(row["attention_type"], row["layer"])] = row
    entries = []
    for row in best:
        entry = {k: row[k] for k in best_columns(column)}
        entry.update({k: row[k] for k in INTERVAL_COLUMNS if row.get(k) is not None})
        if selected is not None:
            chosen = selected[(row["attention_type"], row["layer"])]
            entry.update({name: chosen[key] for key, name in selected_columns(column).items()})
        entries.append(entry)
    return best, entries, selected


def cross_domain_rows(rows: Sequence[Dict[str, object]],
                      cross_rows: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """Figure 2: each configuration's change on the test split beside its change on the shifted split."""
    by_config = {r["config"]: r for r in cross_rows}
    joined = []
    for row in rows:
        other = by_config[row["config"]]
        joined.append(
            {
                "config": row["config"],
                "attention_type": row["attention_type"],
                "layer": row["layer"],
                "head": row["head"],
                "delta": row["delta"],
                "p_value": row["p_value"],
                "significant": row["significant"],
                "cross_delta": other["delta"],
                "cross_p_value": other["p_value"],
                "cross_significant": other["significant"],
            }
        )
    return joined


def cross_domain_correlation(
    joined: Sequence[Dict[str, object]],
) -> Tuple[Tuple[float, float], Dict[str, Tuple[float, float]]]:
    """Pearson (r, p) of the two splits' changes: over all heads, and per attention type present."""
    overall = pearson([j["delta"] for j in joined], [j["cross_delta"] for j in joined])
    per_type = {}
    for attention_type in ATTENTION_TYPES:
        subset = [j for j in joined if j["attention_type"] == attention_type]
        if subset:
            per_type[attention_type] = pearson([j["delta"] for j in subset], [j["cross_delta"] for j in subset])
    return overall, per_type


def markdown_cross_domain(
    overall: Tuple[float, float], per_type: Dict[str, Tuple[float, float]], split: str, cross_split: str,
    metric_description: str,
    label: str = "BLEU",
) -> str:
    lines = [
        f"Δ{label} per masked head on {split} and {cross_split} ({metric_description}).\n\n",
        "| heads | Pearson r | p-value |\n|---|---:|---:|\n",
        f"| all | {overall[0]:.3f} | {overall[1]:.3g} |\n",
    ]
    for attention_type, (type_r, type_p) in per_type.items():
        lines.append(f"| {attention_type} | {type_r:.3f} | {type_p:.3g} |\n")
    return "".join(lines)


def ablation_summary(rows: Sequence[Dict[str, object]], higher_is_better: bool = True
                     ) -> Tuple[int, Dict[str, object], Dict[str, object]]:
    """(significant configurations, worst change, best change) of a single-head sweep.

    For BLEU or accuracy the worst change is the largest drop; for perplexity, the largest rise.
    """
    significant = sum(1 for r in rows if r["significant"])
    worst, best = (min, max) if higher_is_better else (max, min)
    return significant, worst(rows, key=lambda r: r["delta"]), best(rows, key=lambda r: r["delta"])


def pearson(x: Sequence[float], y: Sequence[float]) -> Tuple[float, float]:
    """Pearson r and its two-sided p-value; nan when either side is constant."""
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    r, p = stats.pearsonr(x, y)
    return float(r), float(p)
