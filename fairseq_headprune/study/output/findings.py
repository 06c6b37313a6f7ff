"""Each finding of the papers, checked against a study's own result files.

Michel et al. (2019) and Budhraja et al. (2020) state findings that a study
directory can confirm or contradict. Every row gives the study's estimate
with its 95% interval beside the paper's own figure, and the verdict that
follows from both (``finding.Claim``): consistent with the paper where the
interval contains the figure or lies on the side of it the paper claims,
differs where it lies wholly on the other side, inconclusive where there is
no interval or the evidence falls short. A finding whose results are
missing is left out. Plain logic: ``load(relative_path)`` returns a result
file's JSON or None.

The intervals: a configuration's change has the paired bootstrap's interval
of the difference (``delta_low``/``delta_high``; in files that predate it,
the configuration's own bootstrap interval less the unmasked score); a share
of heads or layers Wilson's interval; a correlation Fisher's z interval; two
configurations compared with each other the sum of their half-widths (each
was tested against the unmasked model, not against the other).

A translation study is held to the papers' WMT findings, a classifier's to
their BERT (MNLI) findings, in the study's own metric; the papers state none
for language models, so an LM study has no findings table.
"""

import math
from typing import Callable, Dict, List, Optional

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_TITLES
from fairseq_headprune.study.budhraja.findings import budhraja_findings, unjudged
from fairseq_headprune.study.output.finding import AT_LEAST, AT_MOST, CONSISTENT, Claim, Finding, every, judged_row
from fairseq_headprune.study.statistics.intervals import Estimate, correlation_interval, wilson_interval
from fairseq_headprune.study.statistics.metrics import CLASSIFICATION_METRICS, Metric, metric_of_record

Load = Callable[[str], Optional[dict]]

# what the papers report, for the WMT model and for BERT on MNLI
PAPER = {
    "single": ("8 of 96 Enc-Enc heads significant; largest drop −0.53 BLEU",
               "most of the 144 heads can be masked alone with little change in accuracy (Figure 1(b))"),
    "all_but_one": ("every layer within −1.55 BLEU but Enc-Dec layer 6: −13.56",
                    "every layer within −0.96% accuracy with one head kept, none significant (Table 3)"),
    "selected": ("no significant change for 50% of the layers with the head chosen on held-out data",
                 "no significant change for 100% of the layers with the head chosen on held-out data"),
    "cross_domain": ("positive correlation (newstest2013 vs MTNT)",
                     "positive correlation (MNLI matched vs mismatched)"),
    "pruned_share": ("20% of the heads pruned by importance with no noticeable loss",
                     "40% of the heads pruned by importance with no noticeable loss"),
}
PRUNED_SHARE = (20, 40)  # % of the heads the papers prune with no noticeable loss (WMT, BERT)
# the papers' figures: the share of heads significantly worse alone (WMT: 8 of 96; BERT: "most" are not), a layer's
# loss with its best head kept (WMT, BERT) and the WMT exception, the share of layers without a significant change
# with the head chosen on held-out data, Table 4's speed-up at large batches
SINGLE_SHARE = (8 / 96, 0.5)
ALL_BUT_ONE = (-1.55, -0.96)
ENC_DEC_LAST = -13.56
SELECTED_SHARE = (0.5, 1.0)
SPEEDUP = 1.175  # "up to 17.5% at higher batch sizes"


class _Study:
    """The metric a study was scored with, and which of the papers' models it is held to."""

    def __init__(self, metric: Metric):
        self.metric, self.column, self.label = metric, metric.column, metric.label
        self.bert = metric.name in CLASSIFICATION_METRICS

    def paper(self, finding: str) -> str:
        return PAPER[finding][self.bert]

    def baseline(self, settings: Dict) -> Optional[float]:
        return settings.get(f"baseline_{self.column}")


def _evidence(settings: Dict, what: str) -> str:
    """A Michel et al. row's protocol: what was measured, on which split, and the test."""
    test = settings.get("test") or {}
    text = f"{what}; {settings.get('split', 'test')} split"
    if test:
        name = "paired bootstrap" if test.get("test") == "bootstrap" else test.get("test")
        text += f"; {name}" + (f", {test['samples']} resamples" if test.get("samples") else "")
        text += f", p < {test['alpha']:g}" if test.get("alpha") is not None else ""
    return text


def change(row: Dict, column: str) -> Estimate:
    """A configuration's change against the unmasked model with its 95% interval (none where the file has none)."""
    if row.get("delta_low") is not None:
        return Estimate(row["delta"], row["delta_low"], row["delta_high"], "paired bootstrap")
    if row.get("ci_low") is not None and column in row:
        unmasked = row[column] - row["delta"]
        return Estimate(row["delta"], row["ci_low"] - unmasked, row["ci_high"] - unmasked,
                        "bootstrap interval less the unmasked score")
    return Estimate(row["delta"])


def difference(first: Estimate, second: Estimate) -> Estimate:
    """first - second, the two half-widths added (they were not resampled against each other)."""
    value = first.value - second.value
    if not (first.has_interval and second.has_interval):
        return Estimate(value)
    return Estimate(value, value - (first.value - first.low) - (second.high - second.value),
                    value + (first.high - first.value) + (second.value - second.low), "half-widths added")


def _share(estimate: Estimate) -> str:
    return f"{estimate.value:.0%} [{estimate.low:.0%}, {estimate.high:.0%}]"


def curve_point(rows: List[Dict], order: str, percent: float) -> Optional[Dict]:
    """The point of a pruning curve (summary rows) nearest to ``percent`` pruned."""
    points = [r for r in rows if r["order"] == order]
    return min(points, key=lambda r: abs(r["percent"] - percent)) if points else None


def _single(load: Load, study: _Study) -> Optional[Finding]:
    table = load("ablation/single.json")
    if not table:
        return None
    rows = table["rows"]
    dropping = [r for r in rows if r["significant"] and r["delta"] < 0]
    worst = min(rows, key=lambda r: r["delta"])
    share = wilson_interval(len(dropping), len(rows))
    claim = Claim(SINGLE_SHARE[study.bert], AT_MOST)
    return judged_row(
        "masking one head at a time rarely hurts significantly (Table 1)",
        study.paper("single"),
        f"{len(dropping)} of {len(rows)} heads significantly worse: {_share(share)}; largest drop "
        f"{change(worst, study.column).text(study.label)}",
        f"the 95% interval of the share significantly worse reaches {claim.figure:.0%} or below",
        claim.judge(share), None,
        _evidence(table.get("settings", {}), "every head masked alone") + "; Wilson interval over the heads",
    )


def _all_but_one(load: Load, study: _Study) -> List[Finding]:
    table = load("ablation/all_but_one_best.json")
    if not table:
        return []
    rows, settings = table["rows"], table["settings"]
    findings = []
    bound = Claim(ALL_BUT_ONE[study.bert], AT_LEAST)
    last = None if study.bert else max((r for r in rows if r["attention_type"] == "enc-dec"),
                                       key=lambda r: r["layer"], default=None)
    others = [r for r in rows if r is not last]
    outcomes = [bound.judge(change(r, study.column)) for r in others]
    reaching = outcomes.count(CONSISTENT)
    unknown = outcomes.count(None)  # a table without intervals: neither reaching nor missing the figure
    worst = min(others, key=lambda r: r["delta"])
    study_text = (f"{reaching} of {len(others)} layers reach {bound.figure:+.2f} or above with their best head"
                  + (f" ({unknown} without an interval)" if unknown else "")
                  + f"; the largest loss: {TYPE_TITLES[worst['attention_type']]} layer {worst['layer']} "
                  f"{change(worst, study.column).text(study.label)}")
    rule = f"every layer's 95% interval reaches {bound.figure:+.2f} {study.label} or above"
    if last is not None:
        exception = Claim(ENC_DEC_LAST, AT_MOST)
        outcomes.append(exception.judge(change(last, study.column)))
        study_text += (f"; the last Enc-Dec layer (layer {last['layer']}): "
                       f"{change(last, study.column).text(study.label)}")
        rule = (f"every layer's 95% interval but the last Enc-Dec layer's reaches {bound.figure:+.2f} or above, and "
                f"the last Enc-Dec layer's reaches {ENC_DEC_LAST:+.2f} or below")
    findings.append(judged_row(
        "every layer can be reduced to one head (Table 3)" if study.bert
        else "most layers can be reduced to one head, but not the last Enc-Dec layer (Table 2)",
        study.paper("all_but_one"), study_text, rule, every(outcomes), None,
        _evidence(settings, "every head kept alone in its layer"),
    ))
    if settings.get("select_subset") and all("selected_delta" in r for r in rows):
        calm = sum(1 for r in rows if not r.get("selected_significant"))
        share = wilson_interval(calm, len(rows))
        claim = Claim(SELECTED_SHARE[study.bert], AT_LEAST)
        agree = sum(1 for r in rows if r.get("selected_head") == r["head"])
        findings.append(judged_row(
            "the head chosen on held-out data generalises (appendix A)",
            study.paper("selected"),
            f"with the head chosen on {settings['select_subset']}, {calm} of {len(rows)} layers without a significant "
            f"change: {_share(share)}; the test set's best head chosen in {agree} of {len(rows)} layers",
            f"the 95% interval of the share without a significant change reaches {claim.figure:.0%} or above",
            claim.judge(share), None,
            _evidence(settings, f"the head chosen on {settings['select_subset']}") + "; Wilson interval over the "
            "layers",
        ))
    return findings


def _cross_domain(load: Load, study: _Study) -> Optional[Finding]:
    table = load("ablation/cross_domain.json")
    if not table:
        return None
    r = table["settings"]["pearson_r"]
    estimate = correlation_interval(r, len(table.get("rows") or []))
    claim = Claim(0.0, AT_LEAST)
    return judged_row(
        "a head's effect correlates across domains (Figure 2)",
        study.paper("cross_domain"),
        f"Pearson r = {estimate.text()} between Δ{study.label} on the two test sets",
        "the 95% interval of r reaches above 0",
        claim.judge(estimate), None,
        _evidence(table.get("settings", {}), "every head masked alone on both test sets") + f"; {estimate.method}",
    )


def _steps(load: Load, scope: str = "all") -> List[Dict]:
    table = load(f"pruning/prune_steps.{scope}.json")
    return table["rows"] if table else []


def _step_change(steps: List[Dict], point: Dict, column: str) -> Estimate:
    """The change of a curve's point (one mask) with the interval its step row holds (none without the step)."""
    step = next((s for s in steps if s.get("order") == point["order"] and s.get("percent") == point["percent"]), None)
    return change(step, column) if step else Estimate(point.get("delta", 0.0))


def _curves(load: Load, study: _Study) -> List[Finding]:
    table = load("pruning/prune_curves.all.json")
    if not table:
        return []
    rows, baseline, column, label = table["rows"], study.baseline(table["settings"]), study.column, study.label
    steps = _steps(load)
    findings = []
    share = PRUNED_SHARE[study.bert]
    at_share = curve_point(rows, "importance", share)
    if at_share and baseline:
        estimate = _step_change(steps, at_share, column)
        claim = Claim(0.0, AT_LEAST)
        findings.append(judged_row(
            "a share of the heads can be pruned with little loss (Figure 3)",
            study.paper("pruned_share"),
            f"{at_share['percent']:.0f}% pruned by importance: {label} {at_share[column]:.2f}, "
            f"{estimate.text(label)} against the unpruned {baseline:.2f}",
            "the 95% interval of the change reaches 0 (no loss the test can see) or above",
            claim.judge(estimate), None,
            _evidence(table["settings"], "pruned by importance, no fine-tuning (the paper's protocol)"),
        ))
    levels = sorted({r["percent"] for r in rows if 0 < r["percent"] <= 70.5})
    orders = {r["order"] for r in rows}
    if "ablation" in orders and "importance" in orders and levels:
        gaps = [difference(_step_change(steps, curve_point(rows, "importance", p), column),
                           _step_change(steps, curve_point(rows, "ablation", p), column)) for p in levels]
        mean = Estimate(sum(g.value for g in gaps) / len(gaps))
        if all(g.has_interval for g in gaps):
            mean = Estimate(mean.value, sum(g.low for g in gaps) / len(gaps), sum(g.high for g in gaps) / len(gaps))
        findings.append(judged_row(
            "importance is a better pruning order than single-head ablation scores (Figure 3)",
            "importance as good, and far cheaper",
            f"importance minus ablation order, mean over {levels[0]:.0f}-{levels[-1]:.0f}% pruned: "
            f"{mean.text(label)}",
            "the 95% interval reaches 0 (importance as good) or above",
            Claim(0.0, AT_LEAST).judge(mean), None,
            _evidence(table["settings"], "no fine-tuning (the paper's protocol)")
            + "; the mean of the levels' intervals, the two orders' half-widths added",
        ))
    if "random" in orders and "importance" in orders:
        importance, random = curve_point(rows, "importance", 50), curve_point(rows, "random", 50)
        findings.append(Finding(
            "random against importance-ordered pruning (extension: this project's comparison; neither paper makes it)",
            "—",
            f"{importance['percent']:.0f}% pruned: importance {importance[column]:.2f}, random "
            f"{random[column]:.2f} ± {random[column + '_std']:.2f} ({random['draws']} draws)",
            "not judged: no claim of the papers",
            None,
            _evidence(table["settings"], "no fine-tuning"),
        ))
    return findings


def _types(load: Load, study: _Study) -> Optional[Finding]:
    if study.bert:
        return None  # Figure 4 is the translation model's (three attention types)
    last, column = {}, study.column
    for attention_type in ATTENTION_TYPES:
        table = load(f"pruning/prune_curves.{attention_type}.json")
        if table:
            points = [r for r in table["rows"] if r["order"] == "importance"]
            point = max(points, key=lambda r: r["percent"])
            last[attention_type] = (point, _step_change(_steps(load, attention_type), point, column))
    if len(last) < 2 or "enc-dec" not in last:
        return None
    other = min((t for t in last if t != "enc-dec"), key=lambda t: last[t][0][column])
    gap = difference(last["enc-dec"][1], last[other][1])
    gap = Estimate(last["enc-dec"][0][column] - last[other][0][column], gap.low, gap.high)
    return judged_row(
        "Enc-Dec attention is the most sensitive to pruning (Figure 4)",
        "pruning > 60% of Enc-Dec heads is catastrophic, self-attention much less so",
        "; ".join(f"{point['percent']:.0f}% of {TYPE_TITLES[t]} pruned: {point[column]:.2f}"
                  for t, (point, _) in last.items())
        + f"; Enc-Dec minus {TYPE_TITLES[other]}: {gap.text(study.label)}",
        "the 95% interval of Enc-Dec minus the lowest other type at the largest level reaches 0 or below",
        Claim(0.0, AT_MOST).judge(gap), None,
        "each attention type pruned by importance alone, no fine-tuning (the paper's protocol); the two types' "
        "half-widths added",
    )


def _dynamics(load: Load, study: _Study) -> Optional[Finding]:
    table = load("dynamics/dynamics.json")
    if not table:
        return None
    rows = table["rows"]
    level = max(r["level"] for r in rows if r["percent"] <= 50.0 + 1e-9)
    at_level = sorted((r for r in rows if r["level"] == level and r["relative"] == r["relative"]),
                      key=lambda r: r["epoch"])
    if len(at_level) < 2:
        return None
    first, last = at_level[0], at_level[-1]

    def relative(row) -> Estimate:
        unpruned = row[f"unpruned_{study.column}"]
        if row.get("ci_low") is None or not unpruned:
            return Estimate(row["relative"])
        return Estimate(row["relative"], row["ci_low"] / unpruned, row["ci_high"] / unpruned)

    gap = difference(relative(last), relative(first))
    shown = Estimate(100 * gap.value, *((100 * gap.low, 100 * gap.high) if gap.has_interval else (None, None)))
    return judged_row(
        "unimportant heads emerge as training goes on (Figure 5)",
        "early epochs lose BLEU linearly with pruning; later ones keep it",
        f"{first['percent']:.0f}% pruned: {100 * first['relative']:.0f}% of {study.label} kept "
        f"at epoch {first['epoch']}, {100 * last['relative']:.0f}% at epoch {last['epoch']}: "
        f"{shown.text('points')}",
        "the 95% interval of the last epoch's share minus the first's reaches 0 or above",
        Claim(0.0, AT_LEAST).judge(gap), None,
        f"{len({r['epoch'] for r in rows})} epoch checkpoints, each pruned by its own importance; the two epochs' "
        "bootstrap half-widths added",
    )


def speedup_interval(measurement: Dict) -> Estimate:
    """The shrunk model's speed-up over the unpruned one with a t interval: on the log ratios of the rounds where
    the benchmark paired them (each round's two passes, so the machine's drift between rounds cancels; the
    estimate is their geometric mean), else on the log times of the timed rounds (Welch; none under two rounds
    of each)."""
    from fairseq_headprune.study.statistics.intervals import t_interval, welch_interval

    paired = (measurement.get("paired_ratios") or {}).get("speedup_shrunk_vs_unpruned") or []
    if len(paired) >= 2:
        logs = t_interval([math.log(r) for r in paired])
        return Estimate(math.exp(logs.value), math.exp(logs.low), math.exp(logs.high),
                        f"t on the log ratios of {len(paired)} paired rounds")
    value = measurement["speedup_shrunk_vs_unpruned"]
    unpruned, shrunk = _log_round_times(measurement, "unpruned"), _log_round_times(measurement, "shrunk")
    if min(len(unpruned), len(shrunk)) < 2:
        return Estimate(value, method="one timing round")
    logs = welch_interval(unpruned, shrunk)
    return Estimate(value, math.exp(logs.low), math.exp(logs.high), f"t on log times, {len(shrunk)} rounds")


def _log_round_times(measurement: Dict, system: str) -> List[float]:
    """The log time of each timed round of ``system``: from its seconds (translation benchmarks) or from its rate
    (the classifier benchmark records examples per second); both systems time the same examples, so the difference
    of the logs is the same either way."""
    seconds = (measurement.get("seconds") or {}).get(system)
    if seconds:
        return [math.log(s) for s in seconds]
    return [-math.log(rate) for rate in (measurement.get("examples_per_second") or {}).get(system) or []]


def _speed(load: Load, study: _Study) -> Optional[Finding]:
    payload = load("shrink/speed.json") or load("shrink/classifier_speed.json")
    if not payload or not payload.get("measurements"):
        return None
    by_batch = sorted(payload["measurements"], key=lambda m: m["batch_size"])
    small, large = by_batch[0], by_batch[-1]
    estimate = speedup_interval(large)
    return judged_row(
        "removing heads speeds inference up, mostly at large batches (§4.3, Table 4)",
        "up to 17.5% faster (BERT, large batches), little at batch 1",
        f"{small['removed_heads']} of {small['total_heads']} heads removed: {small['speedup_shrunk_vs_unpruned']:.2f}x "
        f"at batch {small['batch_size']}, {estimate.text(signed=False)}x at batch {large['batch_size']} "
        f"({payload['device']}; wall-clock)",
        f"the 95% interval at the largest batch reaches {SPEEDUP:.3f}x or above",
        Claim(SPEEDUP, AT_LEAST).judge(estimate), None,
        f"each model timed in turn; {estimate.method}",
    )


def _budgets(load: Load, study: _Study) -> Optional[Finding]:
    table = load("pruning/budgets_summary.json")
    # where the heads are: per-layer and per-type budgets (a random level spreads them anywhere)
    rows = [r for r in table["rows"] if r.get("kind") in ("per-layer", "per-type")] if table else []
    if len(rows) < 2:
        return None
    column = study.column
    best, worst = max(rows, key=lambda r: r[column]), min(rows, key=lambda r: r[column])
    spread = max(r[column + "_std"] for r in rows)
    return unjudged(
        "where the kept heads are (Budhraja et al. Tables 2, 3)",
        "no consistent preference between budgets, after fine-tuning",
        f"best budget `{best['budget']}` {best[column]:.2f}, worst `{worst['budget']}` {worst[column]:.2f} "
        f"(largest std over draws {spread:.2f})",
        f"no fine-tuning; {max(r['draws'] for r in rows)} draws",
    )


# result files that record the metric the study was scored with
_SCORED_FILES = ("ablation/single.json", "ablation/all_but_one_best.json", "pruning/prune_curves.all.json",
                 "pruning/budgets_summary.json", "dynamics/dynamics.json")


def paper_findings(load: Load) -> List[Finding]:
    """Every finding with results: Michel et al.'s, then Budhraja et al.'s (and the extensions beside them)."""
    table = next((t for t in (load(path) for path in _SCORED_FILES) if t and "settings" in t), None)
    metric = metric_of_record(table["settings"] if table else {})
    if not metric.higher_is_better:
        return []  # perplexity: the papers state no finding for language models
    study = _Study(metric)
    found = [_single(load, study), *_all_but_one(load, study), _cross_domain(load, study), *_curves(load, study),
             _types(load, study), _dynamics(load, study), _speed(load, study), _budgets(load, study),
             *budhraja_findings(load, study.bert, study.label)]
    return [row for row in found if row is not None]


def markdown_findings(rows: List[Finding]) -> str:
    lines = [
        "| finding of the papers | the paper's figure | this study: estimate [95% interval] | protocol and strength "
        "of the evidence | verdict rule | verdict |\n",
        "|---|---|---|---|---|---|\n",
    ]
    for row in rows:
        lines.append(f"| {row.finding} | {row.paper} | {row.study} | {row.evidence} | {row.rule} | {row.shown()} |\n")
    return "".join(lines)
