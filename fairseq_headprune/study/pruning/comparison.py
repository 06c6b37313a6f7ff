"""The comparison of pruning methods on the same curves (importance, Fisher search, tuning, gates, random).

Plain functions over a ``prune`` run's curve summary and its record of what
each order cost: the cost table, and the check of issue 17's goal for the
tuned search against Michel et al.'s importance order: at 50% of the heads
pruned it loses at most half of the importance order's loss of the metric,
and it is never worse at any level from 10% to 70%.
"""

from typing import Dict, Optional, Sequence

from fairseq_headprune.study.pruning.curves import order_title

TUNED_SEARCH = "fisher-rearranged+tuned"
REFERENCE = "importance"


def _by_pruned(summary: Sequence[Dict[str, object]], order: str, scope: str = "all") -> Dict[int, Dict[str, object]]:
    return {int(r["pruned"]): r for r in summary if r["order"] == order and r["scope"] == scope}


def goal_check(summary: Sequence[Dict[str, object]], baseline: float, column: str = "bleu",
               order: str = TUNED_SEARCH, reference: str = REFERENCE, at: float = 50.0,
               lowest: float = 10.0, highest: float = 70.0, higher_is_better: bool = True) -> Optional[Dict]:
    """The measured figures of the goal, or None when either curve is missing.

    The curves' levels are rounded up (31% for 30% of 72 heads): the goal is
    read at the level nearest ``at``, and "every level from ``lowest`` to
    ``highest``" means every level both curves have within half a step of that range.
    """
    tuned, base = _by_pruned(summary, order), _by_pruned(summary, reference)
    shared = sorted(set(tuned) & set(base))
    if not shared:
        return None
    percent = {p: float(base[p]["percent"]) for p in shared}
    nearest = min(shared, key=lambda p: abs(percent[p] - at))
    sign = 1.0 if higher_is_better else -1.0
    loss_tuned = sign * (baseline - float(tuned[nearest][column]))
    loss_reference = sign * (baseline - float(base[nearest][column]))
    compared = [p for p in shared if lowest - 5.0 <= percent[p] <= highest + 5.0]
    worse = [p for p in compared if sign * (float(tuned[p][column]) - float(base[p][column])) < 0]
    return {
        "at": percent[nearest], "baseline": baseline, "tuned": float(tuned[nearest][column]),
        "reference": float(base[nearest][column]), "loss_tuned": loss_tuned, "loss_reference": loss_reference,
        "half_met": loss_tuned <= loss_reference / 2.0,
        "levels_compared": [percent[p] for p in compared], "levels_worse": [percent[p] for p in worse],
        "never_worse_met": not worse and bool(compared),
    }


def describe_goal(goal: Dict, label: str = "BLEU") -> str:
    """One paragraph: the goal's figures, and whether each half is met."""
    half = "met" if goal["half_met"] else "NOT met"
    never = ("met" if goal["never_worse_met"]
             else f"NOT met (worse at {', '.join(f'{p:.0f}%' for p in goal['levels_worse'])})")
    ratio = goal["loss_tuned"] / goal["loss_reference"] if goal["loss_reference"] else float("nan")
    return (
        f"At {goal['at']:.0f}% of the heads pruned the tuned search keeps {goal['tuned']:.2f} {label} "
        f"(loss {goal['loss_tuned']:.2f}) where the importance order keeps {goal['reference']:.2f} "
        f"(loss {goal['loss_reference']:.2f}): {ratio:.2f} of its loss (goal: at most half: {half}). "
        f"Not worse than the importance order at any of "
        f"{', '.join(f'{p:.0f}%' for p in goal['levels_compared'])} pruned: {never}."
    )


def markdown_costs(costs: Dict[str, Dict[str, object]], label_of=order_title) -> str:
    """What finding each order's masks cost: seconds, and the sentences its estimates and fits used."""
    lines = ["| method | seconds | sentences (scores) | sentences (tuning / training) |\n", "|---|---:|---:|---:|\n"]
    for order, cost in costs.items():
        extra = cost.get("tuning_sentences", cost.get("sentences") if order == "gates" else "")
        scores = "" if order == "gates" else cost.get("sentences", 0) or ""
        lines.append(f"| {label_of(order)} | {float(cost.get('seconds', 0.0)):.1f} | {scores} | {extra} |\n")
    return "".join(lines)
