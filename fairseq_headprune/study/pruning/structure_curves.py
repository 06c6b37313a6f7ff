"""Pruning curves of FFN neurons, and of heads and neurons searched together, in steps of FLOPs.

Beside Michel et al.'s head curves (``pruning``): FFN neurons pruned by an
order (their importance or Fisher scores, lowest first, or at random) in
steps of the FFN layers' FLOPs removed, and Kwon et al.'s (2022) search at
each level of FLOPs kept, over the FFN layers (``ffn``) or over the
attention and FFN layers together (``joint``). Any curve can be drawn against
the share of the attention and FFN layers' FLOPs per token removed
(``x_axis="flops"``), so that head, neuron and joint curves share one axis.
Nothing here depends on fairseq.
"""

import hashlib
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_headprune.constants import ATTENTION_TYPES, FFN_TYPES, STRUCTURE_ORDERS, TYPE_TITLES
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.masks.ffn_mask import FfnLayout, FfnMask, count_masked_neurons, ffn_mask_to_spec
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, count_masked, full_mask
from fairseq_headprune.study.pruning.curves import (
    CurvePlan,
    PruneStep,
    curve_orders,
    importance_scores,
    order_title,
    random_order,
    step_counts,
)
from fairseq_headprune.study.search.costs import LayerCosts
from fairseq_headprune.study.search.mask_search import search_mask

STRUCTURE_TITLES = {"ffn": "FFN neurons", "joint": "Heads and FFN neurons (joint search)"}
FLOPS_AXIS_TITLE = "the attention and FFN layers' FLOPs per token removed"

# (FFN type, 0-based layer, 0-based neuron)
Neuron = Tuple[str, int, int]


@dataclass
class StructureStep(PruneStep):
    """A curve's point that may mask FFN neurons too: what it removes, and where it sits on the x-axis.

    ``pruned`` / ``total`` count the curve's units: heads, neurons, or (joint) both.
    """

    ffn_mask: Optional[FfnMask] = None  # None: every neuron kept
    heads_pruned: int = 0
    neurons_pruned: int = 0
    flops_removed_percent: float = 0.0  # of the attention and FFN layers' FLOPs per token
    x_axis: str = "units"

    @property
    def percent(self) -> float:
        return self.flops_removed_percent if self.x_axis == "flops" else 100.0 * self.pruned / self.total

    @property
    def config_name(self) -> str:
        name = PruneStep.config_name.fget(self)
        if self.ffn_mask is None:
            return name
        return f"{name}.ffn-{hashlib.sha1(ffn_mask_to_spec(self.ffn_mask).encode()).hexdigest()[:16]}"

    def columns(self) -> Dict[str, object]:
        """What a step's row adds to a head curve's."""
        return {"heads_pruned": self.heads_pruned, "neurons_pruned": self.neurons_pruned,
                "flops_removed_percent": self.flops_removed_percent, "x_axis": self.x_axis,
                "ffn_spec": "none" if self.ffn_mask is None else ffn_mask_to_spec(self.ffn_mask)}


# fields a summary row shares across draws, beside pruned, total and percent
SHARED_COLUMNS = ("heads_pruned", "neurons_pruned", "flops_removed_percent", "x_axis")


def structure_point(scope: str, order: str, draw: Optional[int], step: int, head_mask: HeadMask,
                    ffn_mask: Optional[FfnMask], flops: LayerCosts, units: Tuple[int, int], x_axis: str
                    ) -> StructureStep:
    """A step of the masks given; ``units``: (pruned, total) of the curve's units; ``flops``: every layer's FLOPs."""
    if ffn_mask is not None and count_masked_neurons(ffn_mask) == 0:
        ffn_mask = None
    removed = 100.0 * (1.0 - flops.cost_of(head_mask, ffn_mask) / flops.full_cost())
    return StructureStep(scope, order, draw, step, units[0], units[1], head_mask, None, ffn_mask,
                         count_masked(head_mask), 0 if ffn_mask is None else count_masked_neurons(ffn_mask),
                         removed, x_axis)


def flops_axis_steps(steps: Sequence[PruneStep], flops: LayerCosts) -> List[StructureStep]:
    """Head curves' steps placed on the FLOPs axis (the same masks)."""
    return [structure_point(s.scope, s.order, s.draw, s.step, s.head_mask, None, flops, (s.pruned, s.total), "flops")
            for s in steps]


def neurons_of(ffn_layout: FfnLayout) -> List[Neuron]:
    return [(t, layer, n) for t in FFN_TYPES if t in ffn_layout
            for layer in range(ffn_layout[t][0]) for n in range(ffn_layout[t][1])]


def ascending_neurons(scores: Dict[Neuron, float], candidates: Sequence[Neuron]) -> List[Neuron]:
    """Neurons by increasing score; ties in (FFN type, layer, neuron) order."""
    return sorted(candidates, key=lambda n: (scores[n], FFN_TYPES.index(n[0]), n[1], n[2]))


def flops_step_counts(unit_costs: Sequence[float], step_percent: float, max_percent: float) -> List[int]:
    """Units pruned at each level: the fewest of the order whose FLOPs reach ``k * step_percent``% of all of them.

    With equal costs this is ``step_counts``' ``ceil(k * step_percent% of the units)``.
    """
    step_counts(1, step_percent, max_percent)  # the same checks of the percentages
    cumulative = np.cumsum(np.asarray(unit_costs, dtype=np.float64))
    total = float(cumulative[-1])
    counts = []
    for k in range(int(math.floor(max_percent / step_percent + 1e-9)) + 1):
        target = k * step_percent * total / 100.0 - 1e-9 * total
        counts.append(0 if target <= 0 else min(len(unit_costs), int(np.searchsorted(cumulative, target)) + 1))
    return sorted(set(counts))


def ordered_neuron_steps(layout: HeadLayout, ffn_layout: FfnLayout, flops: LayerCosts, order: str,
                         ranking: Sequence[Neuron], plan: CurvePlan, x_axis: str, draw: Optional[int] = None
                         ) -> List[StructureStep]:
    """Neurons pruned first to last along ``ranking``, in steps of the FFN layers' FLOPs."""
    unit_costs = [flops.cost_at((t, layer), 1) - flops.cost_at((t, layer), 0) for t, layer, _ in ranking]
    steps = []
    for step, count in enumerate(flops_step_counts(unit_costs, plan.step_percent, plan.max_percent)):
        ffn_mask = {t: torch.ones(shape) for t, shape in ffn_layout.items()}
        for t, layer, neuron in ranking[:count]:
            ffn_mask[t][layer, neuron] = 0.0
        steps.append(structure_point("ffn", order, draw, step, full_mask(layout), ffn_mask, flops,
                                     (count, len(ranking)), x_axis))
    return steps


@dataclass
class StructureScores:
    """Where the curves' scores come from: neuron importance; head Fisher scores and blocks; neuron Fisher scores."""

    neuron_importance: Optional[Dict[str, torch.Tensor]] = None
    fisher: Optional[Dict[str, torch.Tensor]] = None
    fisher_blocks: Optional[Dict[str, torch.Tensor]] = None
    neuron_fisher: Optional[Dict[str, torch.Tensor]] = None


def search_steps(structure: str, layout: HeadLayout, ffn_layout: FfnLayout, flops: LayerCosts, order: str,
                 scores: StructureScores, plan: CurvePlan, x_axis: str) -> List[StructureStep]:
    """Kwon et al.'s search at every level: ``k * step_percent``% of the structure's FLOPs removed (at least: the
    search never exceeds the budget kept)."""
    types = FFN_TYPES if structure == "ffn" else ATTENTION_TYPES + FFN_TYPES
    costs = LayerCosts("flops", {b: c for b, c in flops.per_layer.items() if b[0] in types})
    step_counts(1, plan.step_percent, plan.max_percent)  # the same checks of the percentages
    total_units = sum(layers * units for layers, units in ffn_layout.values())
    if structure == "joint":
        total_units += sum(layers * heads for layers, heads in layout.values())
    steps = []
    for step in range(int(math.floor(plan.max_percent / plan.step_percent + 1e-9)) + 1):
        head_mask, ffn_mask = full_mask(layout), None
        if step:
            budget = max(0.0, costs.full_cost() * (1.0 - step * plan.step_percent / 100.0))
            result = search_mask(scores.fisher, scores.fisher_blocks, costs, budget, order == "fisher-rearranged",
                                 neurons=scores.neuron_fisher)
            head_mask, ffn_mask = result.head_mask, result.ffn_mask
        pruned = 0 if ffn_mask is None else count_masked_neurons(ffn_mask)
        if structure == "joint":
            pruned += count_masked(head_mask)
        steps.append(structure_point(structure, order, None, step, head_mask, ffn_mask, flops,
                                     (pruned, total_units), x_axis))
    return steps


def plan_structure_curves(structure: str, layout: HeadLayout, ffn_layout: FfnLayout, flops: LayerCosts,
                          plan: CurvePlan, scores: StructureScores, x_axis: str) -> List[StructureStep]:
    """Every step of every requested curve of FFN neurons (``ffn``) or of the joint search (``joint``)."""
    steps: List[StructureStep] = []
    for order in plan.orders:
        if order not in STRUCTURE_ORDERS[structure]:
            raise SettingsError(f"the orders {order}: not an order of the structure {structure} "
                                f"({', '.join(STRUCTURE_ORDERS[structure])})", setting=("orders", "structure"))
        if order.startswith("fisher"):
            if scores.fisher is None or scores.neuron_fisher is None:
                raise SettingsError(f"the orders {order} needs the Fisher scores of heads and FFN neurons",
                                    setting="orders")
            steps += search_steps(structure, layout, ffn_layout, flops, order, scores, plan, x_axis)
            continue
        candidates = neurons_of(ffn_layout)
        if order == "importance":
            ranking = ascending_neurons(importance_scores(scores.neuron_importance, plan.normalize), candidates)
            steps += ordered_neuron_steps(layout, ffn_layout, flops, order, ranking, plan, x_axis)
        else:  # random
            for draw in range(1, plan.draws + 1):
                ranking = random_order(candidates, plan.seed, draw, structure)
                steps += ordered_neuron_steps(layout, ffn_layout, flops, order, ranking, plan, x_axis, draw)
    return steps


# ----------------------------------------------------------------------------- labels and tables


def scope_title(scope: str) -> str:
    if scope in STRUCTURE_TITLES:
        return STRUCTURE_TITLES[scope]
    return "All attention types" if scope == "all" else TYPE_TITLES[scope]


def axis_title(scope: str, x_axis: str, total: int) -> str:
    """What a curve's x-axis holds: the share of its units pruned, or of the layers' FLOPs removed."""
    if x_axis == "flops":
        return f"% of {FLOPS_AXIS_TITLE}"
    if scope == "ffn":
        return f"% of the FFN neurons pruned ({total} neurons)"
    what = "all heads" if scope == "all" else f"{TYPE_TITLES[scope]} heads"
    return f"% of {what} pruned ({total} heads)"


def markdown_structure_curves(summary: Sequence[Dict[str, object]], baseline: float, column: str = "bleu",
                              label: str = "BLEU") -> str:
    """Per scope, one row per level: heads and neurons pruned, FLOPs removed, and each order's score.

    A cell whose order sits elsewhere on the x-axis than the level's first
    order (a search within a budget removes at least the level's FLOPs) says where.
    """
    parts = []
    for scope in ("all",) + ATTENTION_TYPES + tuple(STRUCTURE_TITLES):
        rows = [r for r in summary if r["scope"] == scope]
        if not rows:
            continue
        orders = curve_orders(r["order"] for r in rows)
        x_axis = rows[0]["x_axis"]
        parts.append(f"\n**{scope_title(scope)}** (x: {axis_title(scope, x_axis, rows[0]['total'])}; "
                     f"unpruned {label} {baseline:.2f})\n\n")
        parts.append("| step | heads pruned | neurons pruned | % FLOPs removed | "
                     + " | ".join(order_title(o, label) for o in orders) + " |\n")
        parts.append("|---:|---:|---:|---:|" + "---:|" * len(orders) + "\n")
        for step in sorted({r["step"] for r in rows}):
            level = [r for o in orders for r in rows if r["order"] == o and r["step"] == step]
            first = level[0]
            cells = []
            for order in orders:
                match = [r for r in level if r["order"] == order]
                cells.append(_cell(match[0], first, column) if match else "")
            parts.append(f"| {step} | {first['heads_pruned']} | {first['neurons_pruned']} | "
                         f"{first['flops_removed_percent']:.1f} | " + " | ".join(cells) + " |\n")
    return "".join(parts)


def _cell(row: Dict[str, object], first: Dict[str, object], column: str) -> str:
    if row["draws"] > 1:
        text = f"{row[column]:.2f} ± {row[column + '_std']:.2f}"
    else:
        text = f"**{row[column]:.2f}**" if row["significant"] else f"{row[column]:.2f}"
    if abs(row["percent"] - first["percent"]) > 0.05:
        text += f" (at {row['percent']:.1f}%)"
    return text
