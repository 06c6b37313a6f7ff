"""Each finding of the papers, checked against a study's own result files.

Michel et al. (2019) and Budhraja et al. (2020) state findings that a study
directory can confirm or contradict. Every row gives the study's estimate
with its 95% interval beside the paper's own figure, the margin that would
contradict the paper's sentence, and the verdict that follows
(``finding.Claim``, an equivalence test): consistent where the interval
holds the paper's side and excludes the contradiction, differs where it lies
wholly on the wrong side of the figure, inconclusive where it holds both
(saying how much narrower it must be) or the evidence falls short. A finding
whose results are missing is left out. Plain logic: ``load(relative_path)``
returns a result file's JSON or None.

Each rule tests the paper's sentence, and names its margin's source: Table 1
the share of Enc-Enc heads whose masking changes the score significantly
either way (the paper's 8 of 96; the contradiction: three times that
share); Table 2 "most layers" (a majority) within the
paper's largest ordinary loss and the last Enc-Dec layer's exception, Table
3 (BERT) every layer and "none significant"; Figure 2 r > 0.5 (the
contradiction: no positive correlation); Figure 3 "no noticeable loss" and
importance "yields better results" (strict); Table 4 both halves: faster at
large batches, not at batch 1. Figure 5 is judged only for a model trained
from scratch, as the paper's was.

The intervals: a configuration's change has the paired bootstrap's interval
of the difference (``delta_low``/``delta_high``; in files that predate it,
the configuration's own bootstrap interval less the unmasked score); a share
of heads or layers Wilson's interval; a correlation Fisher's z interval; two
configurations compared with each other the sum of their half-widths (each
was tested against the unmasked model, not against the other: the widest
their correlation allows).

A translation study is held to the papers' WMT findings, a classifier's to
their BERT (MNLI) findings, in the study's own metric; the papers state none
for language models, so an LM study has no findings table.
"""

from typing import Callable, Dict, List, Optional

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_TITLES
from fairseq_headprune.study.budhraja.findings import budhraja_findings, unjudged
from fairseq_headprune.study.output.finding import (
    AT_LEAST,
    AT_MOST,
    CONSISTENT,
    DIFFERS,
    INCONCLUSIVE,
    Claim,
    Finding,
    every,
    judged_row,
    most,
)
from fairseq_headprune.study.output.michel_figures import (
    ALL_BUT_ONE,
    CORRELATION,
    ENC_DEC_LAST,
    NOTICEABLE,
    PAPER,
    PRUNED_SHARE,
    SELECTED_COUNT,
    SENTENCES,
    SINGLE_CONTRADICTION,
    SINGLE_COUNT,
    SPEED_UNITS,
    SPEEDUP,
    TABLE3_CONTRADICTION,
    TABLE3_SIGNIFICANT,
    share_claim,
)
from fairseq_headprune.study.statistics.intervals import Estimate, correlation_interval, wilson_interval
from fairseq_headprune.study.statistics.metrics import CLASSIFICATION_METRICS, Metric, metric_of_record
from fairseq_headprune.study.statistics.speed_intervals import speedup_interval

Load = Callable[[str], Optional[dict]]

# what the papers report, for the WMT model and for BERT on MNLI
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
    # Table 1 zooms in on the Enc-Enc heads; a classifier has one attention type, all of its heads
    counted = [r for r in rows if r.get("attention_type") == "enc-enc"] if not study.bert else rows
    counted = counted or rows
    changing = [r for r in counted if r["significant"]]
    better = sum(1 for r in changing if r["delta"] > 0)
    worst = min(rows, key=lambda r: r["delta"])
    share = wilson_interval(len(changing), len(counted))
    paper = SINGLE_COUNT[study.bert]
    claim = (share_claim(paper, AT_MOST, SINGLE_CONTRADICTION[0]) if paper
             else Claim(SINGLE_CONTRADICTION[1], AT_MOST))
    which = "heads" if study.bert or counted is rows else "Enc-Enc heads"
    figure = f"{paper[0]} of {paper[1]} ({claim.figure:.1%})" if paper else f"under {claim.figure:.0%}"
    return judged_row(
        "masking one head at a time rarely changes the score significantly (Table 1)",
        study.paper("single"),
        f"{len(changing)} of {len(counted)} {which} change significantly: {_share(share)}, {better} of them for the "
        f"better; largest drop over all {len(rows)} heads {change(worst, study.column).text(study.label)}",
        f"the share of {which} changing significantly either way against the paper's {figure}",
        claim.judge(share, which), None,
        _evidence(table.get("settings", {}), "every head masked alone") + "; Wilson interval over the heads",
        claim.margin_text(percent=True) + (" (three times the paper's share)" if paper
                                           else " (\"most\": a majority)"),
    )


def _all_but_one(load: Load, study: _Study) -> List[Finding]:
    table = load("ablation/all_but_one_best.json")
    if not table:
        return []
    rows, settings = table["rows"], table["settings"]
    findings = []
    figure = ALL_BUT_ONE[study.bert]
    bound = Claim(figure, AT_LEAST, margin=-figure)
    last = None if study.bert else max((r for r in rows if r["attention_type"] == "enc-dec"),
                                       key=lambda r: r["layer"], default=None)
    others = [r for r in rows if r is not last]
    judgements = [bound.judge(change(r, study.column), SENTENCES) for r in others]
    verdicts = [j.verdict for j in judgements]
    unknown = verdicts.count(None)  # a table without intervals: neither reaching nor missing the figure
    worst = min(others, key=lambda r: r["delta"])
    study_text = (f"of {len(others)} layers with their best head, {verdicts.count(CONSISTENT)} within the margin, "
                  f"{verdicts.count(DIFFERS)} below {figure:+.2f}, {verdicts.count(INCONCLUSIVE)} cannot tell"
                  + (f" ({unknown} without an interval)" if unknown else "")
                  + f"; the largest loss: {TYPE_TITLES.get(worst['attention_type'], worst['attention_type'])} layer "
                  f"{worst['layer']} {change(worst, study.column).text(study.label)}")
    margin = bound.margin_text(study.label) + " for a layer (twice the paper's largest ordinary loss)"
    if study.bert:
        judgement = every(judgements)
        if all("significant" in r for r in rows):
            significant = [r for r in rows if r["significant"]]
            none_claim = share_claim(TABLE3_SIGNIFICANT, AT_MOST, TABLE3_CONTRADICTION)
            share = wilson_interval(len(significant), len(rows))
            judgement = every([judgement, none_claim.judge(share, "layers")])
            study_text += f"; {len(significant)} of {len(rows)} layers significant: {_share(share)}"
            margin += (f"; a share of significant layers {none_claim.margin_text(percent=True)} (a quarter of the "
                       "layers)")
        rule = (f"every layer's change within the margin of {figure:+.2f} {study.label}, and the share of layers "
                "significant within the margin of none")
    else:
        judgement = most(judgements)
        rule = f"most layers' (a majority's) change within the margin of {figure:+.2f} {study.label}"
    if last is not None:
        exception = Claim(ENC_DEC_LAST, AT_MOST, margin=figure - ENC_DEC_LAST)
        judgement = every([judgement, exception.judge(change(last, study.column), SENTENCES)])
        study_text += (f"; the last Enc-Dec layer (layer {last['layer']}): "
                       f"{change(last, study.column).text(study.label)}")
        rule += f", and the last Enc-Dec layer's at most {ENC_DEC_LAST:+.2f}"
        margin += (f"; for the last Enc-Dec layer {exception.margin_text(study.label)} (no worse than the paper's "
                   "ordinary layers)")
    findings.append(judged_row(
        "every layer can be reduced to one head (Table 3)" if study.bert
        else "most layers can be reduced to one head, but not the last Enc-Dec layer (Table 2)",
        study.paper("all_but_one"), study_text, rule, judgement, None,
        _evidence(settings, "every head kept alone in its layer"), margin,
    ))
    if settings.get("select_subset") and all("selected_delta" in r for r in rows):
        calm = sum(1 for r in rows if not r.get("selected_significant"))
        share = wilson_interval(calm, len(rows))
        paper = SELECTED_COUNT[study.bert]
        claim = share_claim(paper, AT_LEAST, paper[0] / paper[1] / 2)
        agree = sum(1 for r in rows if r.get("selected_head") == r["head"])
        findings.append(judged_row(
            "a layer reduced to the head chosen on held-out data keeps its score (appendix A)",
            study.paper("selected"),
            f"with the head chosen on {settings['select_subset']}, {calm} of {len(rows)} layers without a significant "
            f"change: {_share(share)}; the test set's best head chosen in {agree} of {len(rows)} layers",
            f"the share of layers without a significant change against the paper's {claim.figure:.0%}",
            claim.judge(share, "layers"), None,
            _evidence(settings, f"the head chosen on {settings['select_subset']}") + "; Wilson interval over the "
            "layers",
            claim.margin_text(percent=True) + " (half the paper's share)",
        ))
    return findings


def _cross_domain(load: Load, study: _Study) -> Optional[Finding]:
    table = load("ablation/cross_domain.json")
    if not table:
        return None
    r = table["settings"]["pearson_r"]
    estimate = correlation_interval(r, len(table.get("rows") or []))
    claim = Claim(CORRELATION, AT_LEAST, margin=CORRELATION)
    return judged_row(
        "a head's effect correlates across domains (Figure 2)",
        study.paper("cross_domain"),
        f"Pearson r = {estimate.text()} between Δ{study.label} on the two test sets",
        f"r against the paper's {CORRELATION}",
        claim.judge(estimate, "heads"), None,
        _evidence(table.get("settings", {}), "every head masked alone on both test sets") + f"; {estimate.method}",
        claim.margin_text() + " (no positive correlation)",
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
        claim = Claim(0.0, AT_LEAST, margin=NOTICEABLE[study.bert])
        findings.append(judged_row(
            "a share of the heads can be pruned with little loss (Figure 3)",
            study.paper("pruned_share"),
            f"{at_share['percent']:.0f}% pruned by importance: {label} {at_share[column]:.2f}, "
            f"{estimate.text(label)} against the unpruned {baseline:.2f}",
            "the change against no loss, within the margin of a noticeable one",
            claim.judge(estimate, SENTENCES), None,
            _evidence(table["settings"], "pruned by importance, no fine-tuning (the paper's protocol)"),
            claim.margin_text(label) + (" (noticeable: the paper's largest single-head drop, Table 1)" if not study.bert
                                        else " (noticeable: the paper's largest one-head layer loss, Table 3)"),
        ))
    levels = sorted({r["percent"] for r in rows if 0 < r["percent"] <= 70.5})
    orders = {r["order"] for r in rows}
    if "ablation" in orders and "importance" in orders and levels:
        gaps = [difference(_step_change(steps, curve_point(rows, "importance", p), column),
                           _step_change(steps, curve_point(rows, "ablation", p), column)) for p in levels]
        mean = Estimate(sum(g.value for g in gaps) / len(gaps))
        if all(g.has_interval for g in gaps):
            mean = Estimate(mean.value, sum(g.low for g in gaps) / len(gaps), sum(g.high for g in gaps) / len(gaps))
        claim = Claim(0.0, AT_LEAST)
        findings.append(judged_row(
            "importance is a better pruning order than single-head ablation scores (Figure 3)",
            "importance \"is faster and yields better results\"",
            f"importance minus ablation order, mean over {levels[0]:.0f}-{levels[-1]:.0f}% pruned: "
            f"{mean.text(label)}",
            "importance better: the interval above 0",
            claim.judge(mean, SENTENCES), None,
            _evidence(table["settings"], "no fine-tuning (the paper's protocol)")
            + "; the mean of the levels' intervals, the two orders' half-widths added",
            claim.margin_text(label),
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
    claim = Claim(0.0, AT_MOST)
    return judged_row(
        "Enc-Dec attention is the most sensitive to pruning (Figure 4)",
        "pruning > 60% of Enc-Dec heads is catastrophic, self-attention much less so",
        "; ".join(f"{point['percent']:.0f}% of {TYPE_TITLES[t]} pruned: {point[column]:.2f}"
                  for t, (point, _) in last.items())
        + f"; Enc-Dec minus {TYPE_TITLES[other]}: {gap.text(study.label)}",
        "Enc-Dec lower than the lowest other type at the largest level: the interval below 0",
        claim.judge(gap, SENTENCES), None,
        "each attention type pruned by importance alone, no fine-tuning (the paper's protocol); the two types' "
        "half-widths added",
        claim.margin_text(study.label),
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
    finding = "unimportant heads emerge as training goes on (Figure 5)"
    paper = "early epochs lose BLEU linearly with pruning; later ones keep it"
    study_text = (f"{first['percent']:.0f}% pruned: {100 * first['relative']:.0f}% of {study.label} kept "
                  f"at epoch {first['epoch']}, {100 * last['relative']:.0f}% at epoch {last['epoch']}: "
                  f"{shown.text('points')}")
    evidence = (f"{len({r['epoch'] for r in rows})} epoch checkpoints, each pruned by its own importance; the two "
                "epochs' bootstrap half-widths added")
    if study.bert:
        return Finding(finding + " (a classifier fine-tuned from a pretrained model: not the paper's protocol)", paper,
                       study_text, "not judged: the paper's Figure 5 trains a translation model from scratch",
                       None, evidence)
    claim = Claim(0.0, AT_LEAST)
    return judged_row(
        finding, paper, study_text,
        "the last epoch keeps more than the first: the interval above 0",
        claim.judge(gap, SENTENCES), None, evidence, claim.margin_text("points"),
    )


def _speed(load: Load, study: _Study) -> Optional[Finding]:
    payload = load("shrink/speed.json") or load("shrink/classifier_speed.json")
    if not payload or not payload.get("measurements"):
        return None
    by_batch = sorted(payload["measurements"], key=lambda m: m["batch_size"])
    small, large = by_batch[0], by_batch[-1]
    large_estimate, small_estimate = speedup_interval(large), speedup_interval(small)
    faster = Claim(SPEEDUP, AT_LEAST, margin=SPEEDUP - 1.0)
    judgements = [faster.judge(large_estimate, SPEED_UNITS)]
    margin = f"at batch {large['batch_size']}: {faster.margin_text()} (no speed-up)"
    rule = f"at the largest batch at least {SPEEDUP:.3f}x"
    if small is not large:
        vanishing = Claim(1.0, AT_MOST, margin=SPEEDUP - 1.0)
        judgements.append(vanishing.judge(small_estimate, SPEED_UNITS))
        margin += (f"; at batch {small['batch_size']}: {vanishing.margin_text()} (as fast as the paper's large "
                   "batches)")
        rule += ", and at the smallest no faster than the unpruned model (the difference vanishes)"
    return judged_row(
        "removing heads speeds inference up, mostly at large batches (§4.3, Table 4)",
        "up to 17.5% faster (BERT, large batches); \"this difference vanishes for smaller batch sizes\"",
        f"{small['removed_heads']} of {small['total_heads']} heads removed: "
        f"{small_estimate.text(signed=False)}x at batch {small['batch_size']}, "
        f"{large_estimate.text(signed=False)}x at batch {large['batch_size']} ({payload['device']}; wall-clock)",
        rule, every(judgements), None,
        f"each model timed in turn; {large_estimate.method}", margin,
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
