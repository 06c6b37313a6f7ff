"""Each finding of the papers, checked against a study's own result files.

Michel et al. (2019) and Budhraja et al. (2020) state findings that a study
directory can confirm or contradict.  Every verdict here is computed from the
numbers the study wrote, by a rule stated in the table (so a reader can
disagree with the rule, not with the arithmetic); a finding whose results are
missing is left out.  Plain logic: ``load(relative_path)`` returns a result
file's JSON or None.

A translation study is held to the papers' WMT findings, a classifier's to
their BERT (MNLI) findings, in the study's own metric; the papers state none
for language models, so an LM study has no findings table.
"""

from typing import Callable, Dict, List, Optional

from fairseq_headprune.constants import ATTENTION_TYPES, TYPE_TITLES
from fairseq_headprune.study.budhraja.findings import budhraja_findings, unjudged
from fairseq_headprune.study.output.finding import Finding, verdict_of
from fairseq_headprune.study.statistics.metrics import CLASSIFICATION_METRICS, Metric, metric_of_record

Load = Callable[[str], Optional[dict]]

# what the papers report, for the WMT model and for BERT on MNLI
PAPER = {
    "single": ("8 of 96 Enc-Enc heads significant; largest drop −0.53 BLEU",
               "most of the 144 heads can be masked alone with little change in accuracy (Figure 1(b))"),
    "all_but_one": ("every layer within −1.55 BLEU but Enc-Dec layer 6: −13.56",
                    "every layer within −0.96% accuracy with one head kept, none significant (Table 3)"),
    "selected": ("small differences between the two choices",
                 "no significant change for 100% of the layers with the head chosen on held-out data"),
    "cross_domain": ("positive correlation (newstest2013 vs MTNT)",
                     "positive correlation (MNLI matched vs mismatched)"),
    "pruned_share": ("20% of the heads pruned by importance with no noticeable loss",
                     "40% of the heads pruned by importance with no noticeable loss"),
}
PRUNED_SHARE = (20, 40)  # % of the heads the papers prune with no noticeable loss (WMT, BERT)


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
    return Finding(
        "masking one head at a time rarely hurts significantly (Table 1)",
        study.paper("single"),
        f"{len(dropping)} of {len(rows)} heads significantly worse; largest drop {worst['delta']:+.2f}",
        "fewer than half of the heads significantly worse",
        verdict_of(len(dropping) < len(rows) / 2),
        _evidence(table.get("settings", {}), "every head masked alone"),
    )


def _all_but_one(load: Load, study: _Study) -> List[Finding]:
    table = load("ablation/all_but_one_best.json")
    if not table:
        return []
    rows, settings = table["rows"], table["settings"]
    baseline = study.baseline(settings)
    worst = min(rows, key=lambda r: r["delta"])
    findings = []
    if baseline:
        kept = [r for r in rows if baseline + r["delta"] >= 0.9 * baseline]
        if study.bert:  # one attention type
            finding, rule = ("every layer can be reduced to one head (Table 3)",
                             "more than half of the layers keep ≥ 90%")
            verdict = len(kept) > len(rows) / 2
        else:
            finding = "most layers can be reduced to one head, but not the last Enc-Dec layer (Table 2)"
            rule = "more than half of the layers keep ≥ 90%, and the most sensitive layer is Enc-Dec"
            verdict = len(kept) > len(rows) / 2 and worst["attention_type"] == "enc-dec"
        findings.append(Finding(
            finding,
            study.paper("all_but_one"),
            f"{len(kept)} of {len(rows)} layers keep ≥ 90% of {study.label} with their best head; most sensitive: "
            f"{TYPE_TITLES[worst['attention_type']]} layer {worst['layer']} ({worst['delta']:+.2f})",
            rule,
            verdict_of(verdict),
            _evidence(settings, "every head kept alone in its layer"),
        ))
    if settings.get("select_subset") and all("selected_delta" in r for r in rows):
        gaps = [r["delta"] - r["selected_delta"] for r in rows]
        agree = sum(1 for r in rows if r.get("selected_head") == r["head"])
        findings.append(Finding(
            "the head chosen on held-out data generalises (appendix A)",
            study.paper("selected"),
            f"the head chosen on {settings['select_subset']} is the test set's best in {agree} of {len(rows)} "
            f"layers; mean loss against the best {sum(gaps) / len(gaps):.2f} {study.label}",
            f"mean loss against the test set's best ≤ 1 {study.label}",
            verdict_of(sum(gaps) / len(gaps) <= 1.0),
            _evidence(settings, f"the head chosen on {settings['select_subset']}"),
        ))
    return findings


def _cross_domain(load: Load, study: _Study) -> Optional[Finding]:
    table = load("ablation/cross_domain.json")
    if not table:
        return None
    r = table["settings"]["pearson_r"]
    return Finding(
        "a head's effect correlates across domains (Figure 2)",
        study.paper("cross_domain"),
        f"Pearson r = {r:.2f} between Δ{study.label} on the two test sets",
        "r > 0.5",
        verdict_of(r > 0.5),
        _evidence(table.get("settings", {}), "every head masked alone on both test sets"),
    )


def _curves(load: Load, study: _Study) -> List[Finding]:
    table = load("pruning/prune_curves.all.json")
    if not table:
        return []
    rows, baseline, column, label = table["rows"], study.baseline(table["settings"]), study.column, study.label
    findings = []
    share = PRUNED_SHARE[study.bert]
    at_share = curve_point(rows, "importance", share)
    if at_share and baseline:
        findings.append(Finding(
            "a share of the heads can be pruned with little loss (Figure 3)",
            study.paper("pruned_share"),
            f"{at_share['percent']:.0f}% pruned by importance: {label} {at_share[column]:.2f} "
            f"({100 * at_share[column] / baseline:.0f}% of {baseline:.2f})",
            f"≥ 95% of the unpruned {label} at about {share}% pruned",
            verdict_of(at_share[column] >= 0.95 * baseline),
            _evidence(table["settings"], "pruned by importance, no fine-tuning (the paper's protocol)"),
        ))
    levels = sorted({r["percent"] for r in rows if 0 < r["percent"] <= 70.5})
    orders = {r["order"] for r in rows}
    if "ablation" in orders and "importance" in orders and levels:
        mean = {o: sum(curve_point(rows, o, p)[column] for p in levels) / len(levels)
                for o in ("importance", "ablation")}
        findings.append(Finding(
            "importance is a better pruning order than single-head ablation scores (Figure 3)",
            "importance as good, and far cheaper",
            f"mean {label} over {levels[0]:.0f}-{levels[-1]:.0f}% pruned: importance {mean['importance']:.2f}, "
            f"ablation order {mean['ablation']:.2f}",
            "importance's mean ≥ the ablation order's",
            verdict_of(mean["importance"] >= mean["ablation"]),
            _evidence(table["settings"], "no fine-tuning (the paper's protocol)"),
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
    last = {}
    for attention_type in ATTENTION_TYPES:
        table = load(f"pruning/prune_curves.{attention_type}.json")
        if table:
            points = [r for r in table["rows"] if r["order"] == "importance"]
            last[attention_type] = max(points, key=lambda r: r["percent"])
    if len(last) < 2:
        return None
    weakest = min(last, key=lambda t: last[t]["bleu"])
    return Finding(
        "Enc-Dec attention is the most sensitive to pruning (Figure 4)",
        "pruning > 60% of Enc-Dec heads is catastrophic, self-attention much less so",
        "; ".join(f"{last[t]['percent']:.0f}% of {TYPE_TITLES[t]} pruned: {last[t]['bleu']:.2f}" for t in last),
        "Enc-Dec has the lowest BLEU at the largest level",
        verdict_of(weakest == "enc-dec"),
        "each attention type pruned by importance alone, no fine-tuning (the paper's protocol)",
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
    return Finding(
        "unimportant heads emerge as training goes on (Figure 5)",
        "early epochs lose BLEU linearly with pruning; later ones keep it",
        f"{first['percent']:.0f}% pruned: {100 * first['relative']:.0f}% of {study.label} kept "
        f"at epoch {first['epoch']}, {100 * last['relative']:.0f}% at epoch {last['epoch']}",
        "the last epoch keeps a larger share than the first scored one",
        verdict_of(last["relative"] > first["relative"]),
        f"{len({r['epoch'] for r in rows})} epoch checkpoints, each pruned by its own importance",
    )


def _speed(load: Load, study: _Study) -> Optional[Finding]:
    payload = load("shrink/speed.json") or load("shrink/classifier_speed.json")
    if not payload or not payload.get("measurements"):
        return None
    by_batch = sorted(payload["measurements"], key=lambda m: m["batch_size"])
    small, large = by_batch[0], by_batch[-1]
    return Finding(
        "removing heads speeds inference up, mostly at large batches (§4.3, Table 4)",
        "up to 17.5% faster (BERT, large batches), little at batch 1",
        f"{small['removed_heads']} of {small['total_heads']} heads removed: {small['speedup_shrunk_vs_unpruned']:.2f}x "
        f"at batch {small['batch_size']}, {large['speedup_shrunk_vs_unpruned']:.2f}x at batch {large['batch_size']} "
        f"({payload['device']}; wall-clock, varies between runs)",
        "faster at the largest batch than at the smallest, and > 1x",
        verdict_of(large["speedup_shrunk_vs_unpruned"] > max(1.0, small["speedup_shrunk_vs_unpruned"])),
        "one timing run, each model in turn (wall-clock)",
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
        "| finding of the papers | paper | this study | protocol and evidence | reproduces if | reproduces? |\n",
        "|---|---|---|---|---|---|\n",
    ]
    for row in rows:
        lines.append(f"| {row.finding} | {row.paper} | {row.study} | {row.evidence} | {row.rule} | {row.shown()} |\n")
    return "".join(lines)
