"""Budhraja et al. (2020)'s findings, each judged under the protocol the paper used: fine-tuning after pruning.

The paper fine-tunes every pruned configuration before scoring it (section
3.1). Its claims: randomly pruning 60% of the heads and fine-tuning costs at
most 0.15 BLEU (Table 1; one head per layer, 87%: -1.62 / -1.03); half of
BERT's heads cost under 1% accuracy (Table 4); keeping or pruning the layers
Voita et al. call important, or per-type budgets, make no consistent
difference (Tables 2, 3); pruning the middle layers hurts more than as many
top and bottom layers (Table 5: 14 of 16 cases), top against bottom shows no
preference; and the unpruned heads of all layers compensate alike, "the
average change in attention parameters for any two layers differs by less
than 10%" (Figure 2).

Judged from ``finetune/results.json`` (``prune --finetune-updates``). A study
without fine-tuning gets the same rows with its un-fine-tuned numbers and
no verdict (None): the paper states nothing about that protocol. Where both
exist, the row says whether the verdict without fine-tuning would differ.
"""

import re
import statistics
from typing import Callable, Dict, List, Optional, Sequence

Load = Callable[[str], Optional[object]]
RESULTS = ("pruning/finetune/results.json",)
NOT_JUDGED = "not judged: the paper fine-tunes every configuration (prune --finetune-updates N)"


def _records(load: Load) -> List[dict]:
    return next((records for records in (load(path) for path in RESULTS) if records), [])


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _by_budget(records: List[dict]) -> Dict[str, List[dict]]:
    groups: Dict[str, List[dict]] = {}
    for record in records:
        if record["name"] != "control":
            groups.setdefault(record.get("budget") or re.sub(r" draw \d+$", "", record["label"]), []).append(record)
    return groups


def random_level_finding(records: List[dict], bert: bool, label: str) -> Optional[List]:
    """Table 1 (translation, 60%) or Table 4 (BERT, 50%): random heads pruned, then fine-tuned."""
    level = 50 if bert else 60
    groups = {name: members for name, members in _by_budget(records).items() if members[0].get("kind") == "level"}
    control = next((r for r in records if r["name"] == "control"), None)
    if not groups or control is None:
        return None
    name, members = min(groups.items(), key=lambda item: abs(item[1][0]["percent"] - level))
    after = _mean([r["score_after"] for r in members]) - control["score_after"]
    before = _mean([r["score_before"] for r in members]) - control["score_before"]
    tolerance = 1.0
    differs = (abs(before) <= tolerance) != (abs(after) <= tolerance) and after >= -tolerance
    return [
        f"randomly pruning {'half of' if bert else '60% of'} the heads and fine-tuning loses little "
        f"(Budhraja et al. Table {4 if bert else 1}; fine-tuned)",
        "50%: average accuracy drop under 1%" if bert else "60%: at most −0.15 BLEU; one head per layer (87%): "
        "−1.62 / −1.03",
        f"{members[0]['percent']:.0f}% at random ({len(members)} draws), fine-tuned {members[0]['finetune']}: "
        f"{after:+.2f} {label} against the unpruned model fine-tuned alike; without fine-tuning {before:+.2f}"
        + (" (would not reproduce)" if differs else ""),
        f"fine-tuned mean within {tolerance:g} {label} of the fine-tuned unpruned model",
        after >= -tolerance,
    ]


def budget_finding(records: List[dict], label: str) -> Optional[List]:
    """Tables 2 and 3: budgets of one level (per layer, per type) against each other, after fine-tuning."""
    groups = {name: members for name, members in _by_budget(records).items()
              if members[0].get("kind") in ("per-layer", "per-type")}
    levels: Dict[int, Dict[str, List[dict]]] = {}
    for name, members in groups.items():
        levels.setdefault(round(members[0]["percent"]), {})[name] = members
    compared = {level: budgets for level, budgets in levels.items() if len(budgets) > 1}
    if not compared:
        return None

    def worst_gap(score: str):
        gaps = []
        for level, budgets in compared.items():
            means = {name: _mean([r[score] for r in members]) for name, members in budgets.items()}
            spread = max((statistics.pstdev([r[score] for r in members]) for members in budgets.values()),
                         default=0.0)
            gaps.append((max(means.values()) - min(means.values()), spread, level,
                         max(means, key=means.get), min(means, key=means.get)))
        return max(gaps)

    gap, spread, level, best, worst = worst_gap("score_after")
    gap_before, spread_before, *_ = worst_gap("score_before")
    allowed = max(1.0, 2 * spread)
    verdict = gap <= allowed
    differs = verdict != (gap_before <= max(1.0, 2 * spread_before))
    return [
        "where the kept heads are does not matter after fine-tuning (Budhraja et al. Tables 2, 3; fine-tuned)",
        "no consistent preference between budgets of one level",
        f"largest gap between budgets of one level: {gap:.2f} {label} at {level}% (`{best}` over `{worst}`; "
        f"largest std over draws {spread:.2f}); without fine-tuning {gap_before:.2f}"
        + (" (the verdict differs)" if differs else ""),
        f"the gap at every level within max(1 {label}, twice the largest std)",
        verdict,
    ]


def layer_strategy_finding(records: List[dict], label: str) -> Optional[List]:
    """Table 5: middle layers against as many top and bottom layers, after fine-tuning."""
    scores = {r["label"]: r["score_after"] for r in records if r.get("kind") == "layers"}
    pairs = []
    for name, score in scores.items():
        match = re.fullmatch(r"(.*?)middle:(\d+)", name)
        if match and f"{match.group(1)}top+bottom:{match.group(2)}" in scores:
            pairs.append((name, score, scores[f"{match.group(1)}top+bottom:{match.group(2)}"]))
    if not pairs:
        return None
    worse = sum(middle < ends for _, middle, ends in pairs)
    return [
        "pruning the middle layers hurts more than as many top and bottom layers (Budhraja et al. Table 5; "
        "fine-tuned)",
        "middle worse in 14 of 16 cases (BERT, 4 tasks)",
        f"middle worse in {worse} of {len(pairs)} pairs ("
        + ", ".join(f"{name} {middle:.2f} vs {ends:.2f}" for name, middle, ends in pairs[:4])
        + (" ..." if len(pairs) > 4 else "") + f" {label})",
        "middle worse in more than half of the pairs",
        worse > len(pairs) / 2,
    ]


def compensation_finding(records: List[dict]) -> Optional[List]:
    """Figure 2: the layers' mean change of W_q, W_k, W_v during fine-tuning, per configuration."""
    spreads = [r["layer_spread"] for r in records if r.get("layer_spread") is not None and r["name"] != "control"]
    if not spreads:
        return None
    median = statistics.median(spreads)
    return [
        "the unpruned heads of all layers compensate alike during fine-tuning (Budhraja et al. Figure 2)",
        "the average change of any two layers differs by less than 10%",
        f"largest relative difference between two layers' mean absolute change: median {median:.0%} over {len(spreads)} "
        f"fine-tuned configurations ({min(spreads):.0%}-{max(spreads):.0%})",
        "median below 10%",
        median < 0.10,
    ]


def unjudged(finding: str, paper: str, study: str) -> List:
    """A finding the study measured without fine-tuning: shown, not judged."""
    return [f"{finding} (without fine-tuning: not the paper's protocol)", paper, study, NOT_JUDGED, None]


def budhraja_findings(load: Load, bert: bool, label: str) -> List[List]:
    """The rows judged on fine-tuned configurations (none if the study fine-tuned nothing)."""
    records = _records(load)
    if not records:
        return []
    found = [random_level_finding(records, bert, label), budget_finding(records, label),
             layer_strategy_finding(records, label), compensation_finding(records)]
    return [row for row in found if row is not None]
