"""Pruning curves and random head budgets, as plain functions.

Michel et al. (2019, sections 4.2 and 5) prune heads in steps of 10% of the
heads, in order of increasing importance, over the whole model or one
attention type at a time. Budhraja et al. (2020) prune at random: a random
order here, or heads drawn within budgets (``budgets.py``). Which heads each
step masks is decided here, from scores and seeds; nothing here touches
fairseq.
"""

import csv
import hashlib
import json
import math
import os
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_headprune.constants import (
    ATTENTION_TYPES,
    DEFAULT_MAX_PERCENT,
    DEFAULT_PRUNING_SEED,
    DEFAULT_STEP_PERCENT,
    ORDERS,
    SCOPES,
    TYPE_TITLES,
)
from fairseq_headprune.errors import HeadMaskError, ResultFileError, SettingsError
from fairseq_headprune.study.importance.scores import normalize_per_layer
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, count_masked, full_mask, head_mask_to_spec
from fairseq_headprune.study.search.mask_search import pruned_count_search

ORDER_TITLES = {
    "importance": "importance (estimated once)",
    "iterative": "importance (re-estimated each step)",
    "ablation": "single-head ablation ΔBLEU",
    "random": "random",
    "fisher": "Fisher search (Kwon et al.)",
    "fisher-rearranged": "Fisher search + rearrangement",
    "gates": "learned gates (hard concrete, exact budget)",
}
# an order's curve with every mask tuned by least squares (prune --tune-masks)
TUNED_SUFFIX = "+tuned"


def order_title(order: str, label: str = "BLEU") -> str:
    """An order's title in tables and figures, naming the study's metric (``label``)."""
    if order.endswith(TUNED_SUFFIX):
        return order_title(order[: -len(TUNED_SUFFIX)], label) + " + mask tuning"
    return ORDER_TITLES[order].replace("BLEU", label)


def curve_orders(present) -> List[str]:
    """The orders among ``present``, in ``ORDERS``' order, each followed by its tuned variant."""
    present = set(present)
    return [name for order in ORDERS for name in (order, order + TUNED_SUFFIX) if name in present]


# (attention type, 0-based layer, 0-based head)
Head = Tuple[str, int, int]


def heads_in_scope(layout: HeadLayout, scope: str) -> List[Head]:
    """Every head the scope may prune, in (type, layer, head) order."""
    if scope not in SCOPES:
        raise HeadMaskError(f"unknown pruning scope {scope!r} (expected one of {', '.join(SCOPES)})")
    types = [t for t in ATTENTION_TYPES if t in layout and scope in ("all", t)]
    if not types:
        raise HeadMaskError(f"the model has no {scope} attention")
    return [
        (attention_type, layer, head)
        for attention_type in types
        for layer in range(layout[attention_type][0])
        for head in range(layout[attention_type][1])
    ]


def pruned_at_level(percent: float, total: int) -> int:
    """Heads pruned at ``percent``% of ``total``: rounded up (the curves' steps, random levels, fine-tuned levels)."""
    return min(total, math.ceil(percent * total / 100 - 1e-9))


def step_counts(total: int, step_percent: float = DEFAULT_STEP_PERCENT,
                max_percent: float = DEFAULT_MAX_PERCENT) -> List[int]:
    """Heads pruned at each level: ``ceil(k * step_percent% of total)`` for k = 0, 1, ...

    Level k prunes k steps' worth of the heads, rounded up (the paper's 10%
    steps), up to ``max_percent``; so the curve's points sit at 0%, 10%, ...
    of the heads whatever their number.
    """
    if total <= 0:
        raise SettingsError("no heads to prune")
    if not 0 < step_percent <= 100:
        raise SettingsError(f"the step must be in (0, 100] percent, got {step_percent:g}")
    if not 0 <= max_percent <= 100:
        raise SettingsError(f"the largest pruning level must be in [0, 100] percent, got {max_percent:g}")
    levels = int(math.floor(max_percent / step_percent + 1e-9))
    counts = [pruned_at_level(k * step_percent, total) for k in range(levels + 1)]
    return sorted(set(counts))


def ascending(scores: Dict[Head, float], candidates: Sequence[Head]) -> List[Head]:
    """Candidates by increasing score; ties keep (type, layer, head) order."""
    return sorted(candidates, key=lambda head: (scores[head], _position(head)))


def _position(head: Head) -> Tuple[int, int, int]:
    return (ATTENTION_TYPES.index(head[0]), head[1], head[2])


def importance_scores(importance: Dict[str, torch.Tensor], normalize: bool = True) -> Dict[Head, float]:
    """Per-head scores to rank by: per-layer l2-normalised importance (the paper) or raw."""

    scores = normalize_per_layer(importance) if normalize else importance
    return {
        (attention_type, layer, head): float(value)
        for attention_type, tensor in scores.items()
        for layer, row in enumerate(tensor.tolist())
        for head, value in enumerate(row)
    }


def ablation_scores(rows: Sequence[Dict[str, object]], layout: HeadLayout, scope: str, source: str,
                    higher_is_better: bool = True) -> Dict[Head, float]:
    """Pruning scores from a single-head ablation result (``source``): minus ΔBLEU (ΔBLEU, Δaccuracy; +Δperplexity).

    The head whose masking cost the least (or gained the most) comes first in
    ascending order. Every head of the scope must be in the result.
    """
    sign = -1.0 if higher_is_better else 1.0
    scores = {}
    for row in rows:
        key = (row.get("attention_type"), row.get("layer"), row.get("head"))
        if key[0] not in layout or not isinstance(key[1], int) or not isinstance(key[2], int):
            continue
        layers, heads = layout[key[0]]
        if not (1 <= key[1] <= layers and 1 <= key[2] <= heads):
            raise HeadMaskError(
                f"the ablation file {source} scores {key[0]} layer {key[1]} head {key[2]}, which this model "
                f"({key[0]} {layers}x{heads}) does not have", setting="ablation"
            )
        scores[(key[0], key[1] - 1, key[2] - 1)] = sign * float(row["delta"])
    missing = [h for h in heads_in_scope(layout, scope) if h not in scores]
    if missing:
        attention_type, layer, head = missing[0]
        raise HeadMaskError(
            f"the ablation file {source} has no single-head score for {len(missing)} heads of scope {scope} "
            f"(e.g. {attention_type} layer {layer + 1} head {head + 1}); run ablate --mode single on every head",
            setting="ablation")
    return scores


def random_order(candidates: Sequence[Head], seed: int, draw: int, label: str = "") -> List[Head]:
    """A random permutation, reproducible from (seed, draw, label)."""
    rng = np.random.default_rng([seed, draw, zlib.crc32(label.encode())])
    return [candidates[i] for i in rng.permutation(len(candidates))]


def pruning_mask(layout: HeadLayout, pruned: Sequence[Head]) -> HeadMask:
    head_mask = full_mask(layout)
    for attention_type, layer, head in pruned:
        head_mask[attention_type][layer, head] = 0.0
    return head_mask


def mask_name(head_mask: HeadMask) -> str:
    """A result-file name that depends only on which heads are masked (shared across orders)."""
    return "mask." + hashlib.sha1(head_mask_to_spec(head_mask).encode()).hexdigest()[:16]


@dataclass
class PruneStep:
    """One point of one pruning curve."""

    scope: str
    order: str
    draw: Optional[int]  # random draws: 1..N; None otherwise
    step: int
    pruned: int  # heads of the scope pruned
    total: int  # heads in the scope
    head_mask: HeadMask
    tuning: Optional[object] = None  # a least_squares_tuning.MaskTuning for ORDER+tuned steps, once fitted

    @property
    def percent(self) -> float:
        return 100.0 * self.pruned / self.total

    @property
    def config_name(self) -> str:
        if self.tuning is not None and self.tuning.layers:
            return f"{mask_name(self.head_mask)}.tuned-{self.tuning.fingerprint()}"
        return mask_name(self.head_mask)


def curve_steps(
    layout: HeadLayout, scope: str, order: str, ranking: Sequence[Head], counts: Sequence[int],
    draw: Optional[int] = None,
) -> List[PruneStep]:
    """Steps that prune the first ``count`` heads of ``ranking``: each mask contains the previous one."""
    total = len(heads_in_scope(layout, scope))
    return [
        PruneStep(scope, order, draw, step, count, total, pruning_mask(layout, ranking[:count]))
        for step, count in enumerate(counts)
    ]


# (pruned heads, progress description) -> raw importance of every head with those heads pruned
ImportanceOf = Callable[[List[Head], str], Dict[str, torch.Tensor]]


def iterative_steps(
    layout: HeadLayout, scope: str, counts: Sequence[int], importance_of: ImportanceOf, normalize: bool = True,
) -> List[PruneStep]:
    """Each step prunes the least important remaining heads, importance re-estimated on the pruned model.

    Michel et al. (section 4.2) estimate I_h once; re-estimating after every
    step is the iterative variant they mention. ``importance_of(pruned, ...)``
    estimates on the model with ``pruned`` masked (``[]``: the unpruned model).
    """
    candidates = heads_in_scope(layout, scope)
    pruned: List[Head] = []
    steps = []
    for step, count in enumerate(counts):
        if count > len(pruned):
            description = "importance" if not pruned else f"importance {scope} step {step}/{len(counts) - 1}"
            importance = importance_of(list(pruned), description)
            remaining = [h for h in candidates if h not in set(pruned)]
            pruned += ascending(importance_scores(importance, normalize), remaining)[: count - len(pruned)]
        steps.append(PruneStep(scope, "iterative", None, step, count, len(candidates), pruning_mask(layout, pruned)))
    return steps


def fisher_steps(
    layout: HeadLayout, scope: str, order: str, counts: Sequence[int],
    scores: Dict[str, torch.Tensor], blocks: Optional[Dict[str, torch.Tensor]],
) -> List[PruneStep]:
    """Kwon et al.'s mask search at each level (heads kept = the rest), rearranged for ``fisher-rearranged``.

    With a budget of heads the search keeps the heads of largest raw F_hh,
    so the ``fisher`` curve's masks contain each other; rearranged masks
    need not. A single-type scope searches among that type's heads only.
    """

    types = [t for t in ATTENTION_TYPES if t in layout and scope in ("all", t)]
    scoped_scores = {t: scores[t] for t in types}
    scoped_blocks = None if blocks is None else {t: blocks[t] for t in types}
    total = len(heads_in_scope(layout, scope))
    steps = []
    for step, count in enumerate(counts):
        head_mask = full_mask(layout)
        head_mask.update(pruned_count_search(scoped_scores, scoped_blocks, count, order == "fisher-rearranged"))
        steps.append(PruneStep(scope, order, None, step, count, total, head_mask))
    return steps


def given_mask_steps(layout: HeadLayout, order: str, head_masks: Sequence[HeadMask]) -> List[PruneStep]:
    """A curve through given masks (learned gates at the levels trained), by heads pruned, from the unpruned model."""

    total = len(heads_in_scope(layout, "all"))
    ordered = sorted(head_masks, key=count_masked)
    points = [full_mask(layout)] + [m for m in ordered if count_masked(m) > 0]
    return [PruneStep("all", order, None, step, count_masked(m), total, m) for step, m in enumerate(points)]


def tuned_steps(steps: Sequence[PruneStep], tune_orders: Sequence[str]) -> List[PruneStep]:
    """A copy of every step of the ``tune_orders`` curves under the order ``ORDER+tuned`` (same masks)."""
    return [
        PruneStep(s.scope, s.order + TUNED_SUFFIX, s.draw, s.step, s.pruned, s.total, s.head_mask)
        for s in steps if s.order in tune_orders
    ]


@dataclass
class CurvePlan:
    """Which curves ``plan_curves`` draws and at which levels."""

    orders: Sequence[str]
    scopes: Sequence[str]
    normalize: bool = True  # rank by I_h normalised per layer (the paper), not raw
    step_percent: float = DEFAULT_STEP_PERCENT
    max_percent: float = DEFAULT_MAX_PERCENT
    draws: int = 1  # random orders drawn
    seed: int = DEFAULT_PRUNING_SEED


@dataclass
class CurveScores:
    """Where the orders' scores come from: importance on demand, an ablation's rows, Fisher scores and blocks."""

    importance_of: Optional[ImportanceOf] = None
    ablation_rows: Optional[Sequence[Dict[str, object]]] = None
    ablation_source: str = ""  # the ablation file's path
    higher_is_better: bool = True  # the direction of the ablation result's metric (False for perplexity)
    fisher: Optional[Tuple[Dict[str, torch.Tensor], Optional[Dict[str, torch.Tensor]]]] = None


def plan_curves(layout: HeadLayout, plan: CurvePlan, scores: CurveScores) -> List[PruneStep]:
    """Every step of every requested curve (scope x order, and draw for random), with its mask."""
    orders, importance_of, normalize = plan.orders, scores.importance_of, plan.normalize
    steps: List[PruneStep] = []
    once = importance_of([], "importance") if {"importance", "iterative"} & set(orders) else None
    for scope in plan.scopes:
        candidates = heads_in_scope(layout, scope)
        counts = step_counts(len(candidates), plan.step_percent, plan.max_percent)
        for order in orders:
            if order == "importance":
                steps += curve_steps(layout, scope, order, ascending(importance_scores(once, normalize), candidates),
                                     counts)
            elif order == "ablation":
                ablation = ablation_scores(scores.ablation_rows, layout, scope, scores.ablation_source,
                                        scores.higher_is_better)
                steps += curve_steps(layout, scope, order, ascending(ablation, candidates), counts)
            elif order == "random":
                for draw in range(1, plan.draws + 1):
                    steps += curve_steps(layout, scope, order, random_order(candidates, plan.seed, draw, scope),
                                         counts, draw=draw)
            elif order == "iterative":
                reuse_once = lambda pruned, text: once if not pruned else importance_of(pruned, text)  # noqa: E731
                steps += iterative_steps(layout, scope, counts, reuse_once, normalize)
            elif order in ("fisher", "fisher-rearranged"):
                if scores.fisher is None:
                    raise SettingsError(f"the orders {order} needs the Fisher scores", setting="orders")
                steps += fisher_steps(layout, scope, order, counts, *scores.fisher)
            elif order == "gates":
                continue  # the learned masks make their own curve (given_mask_steps)
            else:
                raise SettingsError(f"the orders: unknown {order!r} (expected {', '.join(ORDERS)})", setting="orders")
    return steps


def read_ablation_rows(path: str) -> List[Dict[str, object]]:
    """Rows of an ``ablate --mode single`` result (single.json or single.tsv), for the ablation order."""
    if not os.path.isfile(path):
        raise ResultFileError(f"the ablation file {path} is not found", setting="ablation")
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as stream:
                rows = json.load(stream)["rows"]
        else:
            with open(path, encoding="utf-8", newline="") as stream:
                rows = list(csv.DictReader(stream, delimiter="\t"))
            for row in rows:
                row["layer"], row["head"] = int(row["layer"]), int(row["head"])
                row["delta"] = float(row["delta"])
        for row in rows:
            float(row["delta"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ResultFileError(f"the ablation file {path} is not an ablate --mode single result ({error})",
                              setting="ablation") from error
    return rows


# ----------------------------------------------------------------------------- summaries


def mean_and_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _summarize(rows, keys: Sequence[str], shared: Sequence[str], column: str = "bleu") -> List[Dict[str, object]]:
    """Group rows by ``keys``; per group the ``shared`` fields, the score's mean and std, draws, significant draws."""
    groups: Dict[tuple, List[Dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for key, members in groups.items():
        mean, std = mean_and_std([m[column] for m in members])
        delta, _ = mean_and_std([m["delta"] for m in members])
        entry = dict(zip(keys, key))
        entry.update({field: members[0].get(field) for field in shared})
        entry.update({column: mean, f"{column}_std": std, "delta": delta, "draws": len(members),
                      "significant": sum(bool(m["significant"]) for m in members)})
        summary.append(entry)
    return summary


def summarize_curves(rows: Sequence[Dict[str, object]], column: str = "bleu", shared: Sequence[str] = ()
                     ) -> List[Dict[str, object]]:
    """One row per (scope, order, step): the score's (``column``'s) mean and standard deviation over draws.

    ``shared``: more fields of the steps (the first draw's) kept in each row.
    """
    return _summarize(rows, ("scope", "order", "step"), ("pruned", "total", "percent") + tuple(shared), column)


def summarize_budgets(rows: Sequence[Dict[str, object]], column: str = "bleu") -> List[Dict[str, object]]:
    """One row per budget: the score's mean and standard deviation over draws."""
    return _summarize(rows, ("budget",), ("kind", "percent", "note"), column)


def markdown_curves(summary: Sequence[Dict[str, object]], baseline_bleu: float, caption: str,
                    column: str = "bleu", label: str = "BLEU") -> str:
    """Per scope: % pruned by order, the score (mean ± std for random)."""
    parts = [f"{caption}\n"]
    for scope in SCOPES:
        rows = [r for r in summary if r["scope"] == scope]
        if not rows:
            continue
        orders = curve_orders(r["order"] for r in rows)
        total = rows[0]["total"]
        parts.append(f"\n**{_scope_title(scope)}** ({total} heads; unpruned {label} {baseline_bleu:.2f})\n\n")
        parts.append("| heads pruned | % | " + " | ".join(order_title(o, label) for o in orders) + " |\n")
        parts.append("|---:|---:|" + "---:|" * len(orders) + "\n")
        for pruned in sorted({r["pruned"] for r in rows}):
            cells = []
            for order in orders:
                match = [r for r in rows if r["order"] == order and r["pruned"] == pruned]
                cells.append(_curve_cell(match[0], column) if match else "")
            percent = 100.0 * pruned / total
            parts.append(f"| {pruned} | {percent:.1f} | " + " | ".join(cells) + " |\n")
    return "".join(parts)


def _curve_cell(row: Dict[str, object], column: str = "bleu") -> str:
    if row["draws"] > 1:
        return f"{row[column]:.2f} ± {row[column + '_std']:.2f}"
    text = f"{row[column]:.2f}"
    return f"**{text}**" if row["significant"] else text


def markdown_budgets(summary: Sequence[Dict[str, object]], baseline_bleu: float, caption: str,
                     column: str = "bleu", label: str = "BLEU") -> str:
    """One row per budget; a "paper" column naming the table and row where Budhraja et al.'s configurations are."""
    noted = any(row.get("note") for row in summary)
    paper = " paper |" if noted else ""
    lines = [
        f"{caption}\n\n",
        f"| configuration (heads kept) | kind |{paper} % pruned | {label} (mean ± std) | Δ{label} | "
        f"significant draws |\n",
        "|---|---|" + ("---|" if noted else "") + "---:|---:|---:|---:|\n",
        f"| all heads | |{' |' if noted else ''} 0.0 | {baseline_bleu:.2f} | | |\n",
    ]
    for row in summary:
        note = f" {row.get('note') or ''} |" if noted else ""
        lines.append(
            f"| `{row['budget']}` | {row['kind']} |{note} {row['percent']:.1f} | {row[column]:.2f} ± "
            f"{row[column + '_std']:.2f} | {row['delta']:+.2f} | {row['significant']} of {row['draws']} |\n"
        )
    return "".join(lines)


def _scope_title(scope: str) -> str:
    return "All attention types" if scope == "all" else TYPE_TITLES[scope]
