"""Pruning curves and random head budgets, as plain functions.

Michel et al. (2019, sections 4.2 and 5) prune heads in steps of 10% of the
heads, in order of increasing importance, over the whole model or one
attention type at a time. Budhraja et al. (2020) prune at random: a random
order, or heads drawn at random within per-layer budgets (their ``888444``
strings: heads kept in each layer) or per-type totals (their ``(14,31,30)``
triples: heads kept in Enc-Enc, Enc-Dec and Dec-Dec). Which heads each
step masks is decided here, from scores and seeds; nothing here touches
fairseq.
"""

import hashlib
import math
import re
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .head_mask import ATTENTION_TYPES, HeadLayout, HeadMask, HeadMaskError, full_mask, head_mask_to_spec

SCOPES = ("all",) + ATTENTION_TYPES
ORDERS = ("importance", "iterative", "ablation", "random")
ORDER_TITLES = {
    "importance": "importance (estimated once)",
    "iterative": "importance (re-estimated each step)",
    "ablation": "single-head ablation ΔBLEU",
    "random": "random",
}

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


def step_counts(total: int, step_percent: float = 10.0, max_percent: float = 90.0) -> List[int]:
    """Heads pruned at each level: ``ceil(k * step_percent% of total)`` for k = 0, 1, ...

    Level k prunes k steps' worth of the heads, rounded up (the paper's 10%
    steps), up to ``max_percent``; so the curve's points sit at 0%, 10%, ...
    of the heads whatever their number.
    """
    if total <= 0:
        raise ValueError("no heads to prune")
    if not 0 < step_percent <= 100:
        raise ValueError(f"the step must be in (0, 100] percent, got {step_percent:g}")
    if not 0 <= max_percent <= 100:
        raise ValueError(f"the largest pruning level must be in [0, 100] percent, got {max_percent:g}")
    levels = int(math.floor(max_percent / step_percent + 1e-9))
    counts = [min(total, math.ceil(k * step_percent * total / 100 - 1e-9)) for k in range(levels + 1)]
    return sorted(set(counts))


def ascending(scores: Dict[Head, float], candidates: Sequence[Head]) -> List[Head]:
    """Candidates by increasing score; ties keep (type, layer, head) order."""
    return sorted(candidates, key=lambda head: (scores[head], _position(head)))


def _position(head: Head) -> Tuple[int, int, int]:
    return (ATTENTION_TYPES.index(head[0]), head[1], head[2])


def importance_scores(importance: Dict[str, torch.Tensor], normalize: bool = True) -> Dict[Head, float]:
    """Per-head scores to rank by: per-layer l2-normalised importance (the paper) or raw."""
    from .importance import normalize_per_layer

    scores = normalize_per_layer(importance) if normalize else importance
    return {
        (attention_type, layer, head): float(value)
        for attention_type, tensor in scores.items()
        for layer, row in enumerate(tensor.tolist())
        for head, value in enumerate(row)
    }


def ablation_scores(rows: Sequence[Dict[str, object]], layout: HeadLayout, scope: str, source: str) -> Dict[Head, float]:
    """Pruning scores from a single-head ablation result: minus ΔBLEU.

    The head whose masking cost the least BLEU (or gained the most) comes
    first in ascending order. Every head of the scope must be in the result.
    """
    scores = {}
    for row in rows:
        key = (row.get("attention_type"), row.get("layer"), row.get("head"))
        if key[0] not in layout or not isinstance(key[1], int) or not isinstance(key[2], int):
            continue
        layers, heads = layout[key[0]]
        if not (1 <= key[1] <= layers and 1 <= key[2] <= heads):
            raise HeadMaskError(
                f"{source} scores {key[0]} layer {key[1]} head {key[2]}, which this model "
                f"({key[0]} {layers}x{heads}) does not have"
            )
        scores[(key[0], key[1] - 1, key[2] - 1)] = -float(row["delta"])
    missing = [h for h in heads_in_scope(layout, scope) if h not in scores]
    if missing:
        attention_type, layer, head = missing[0]
        raise HeadMaskError(
            f"{source} has no single-head score for {len(missing)} heads of scope {scope} "
            f"(e.g. {attention_type} layer {layer + 1} head {head + 1}); run ablate --mode single on every head"
        )
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

    @property
    def percent(self) -> float:
        return 100.0 * self.pruned / self.total

    @property
    def config_name(self) -> str:
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


# ----------------------------------------------------------------------------- budgets


@dataclass
class Budget:
    """Budhraja et al.'s structured random configurations: heads kept, per layer or per type."""

    label: str  # as the user wrote it, normalised
    per_layer: Optional[Dict[str, List[int]]] = None
    per_type: Optional[Dict[str, int]] = None

    @property
    def kind(self) -> str:
        return "per-layer" if self.per_layer is not None else "per-type"

    def kept(self, layout: HeadLayout) -> Dict[str, int]:
        if self.per_type is not None:
            return dict(self.per_type)
        return {t: sum(counts) for t, counts in self.per_layer.items()}

    def pruned_percent(self, layout: HeadLayout) -> float:
        total = sum(layers * heads for layers, heads in layout.values())
        return 100.0 * (total - sum(self.kept(layout).values())) / total


def _types_with_layers(layout: HeadLayout) -> List[str]:
    return [t for t in ATTENTION_TYPES if t in layout]


def parse_layer_budget(text: str, layout: HeadLayout) -> Budget:
    """``"888444 444888 888444"``: heads kept in each layer of Enc-Enc, Enc-Dec, Dec-Dec.

    A group is one digit per layer, or comma-separated numbers for models
    with ten heads or more (``"16,16,8,8,4,4 ..."``).
    """
    types = _types_with_layers(layout)
    groups = text.replace("/", " ").split()
    if len(groups) != len(types):
        raise HeadMaskError(
            f"layer budget {text!r} has {len(groups)} groups; the model needs {len(types)} "
            f"({', '.join(types)}), e.g. {' '.join(str(layout[t][1]) * layout[t][0] for t in types)!r}"
        )
    per_layer = {}
    for attention_type, group in zip(types, groups):
        layers, heads = layout[attention_type]
        if "," in group:
            items = group.split(",")
        elif group.isdigit():
            items = list(group)
        else:
            items = [group]
        if not all(item.isdigit() for item in items):
            raise HeadMaskError(f"layer budget {text!r}: {group!r} is not a list of head counts")
        counts = [int(item) for item in items]
        if len(counts) != layers:
            raise HeadMaskError(
                f"layer budget {text!r}: {attention_type} group {group!r} gives {len(counts)} layers, "
                f"the model has {layers}"
            )
        for layer, count in enumerate(counts, start=1):
            if count > heads:
                raise HeadMaskError(
                    f"layer budget {text!r}: {attention_type} layer {layer} keeps {count} heads, "
                    f"the model has {heads} per layer"
                )
        per_layer[attention_type] = counts
    return Budget(" ".join(groups), per_layer=per_layer)


def parse_type_budget(text: str, layout: HeadLayout) -> Budget:
    """``"(14,31,30)"``: heads kept in all of Enc-Enc, Enc-Dec and Dec-Dec."""
    types = _types_with_layers(layout)
    inner = text.strip()
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1]
    items = [item.strip() for item in re.split(r"[,\s]+", inner.strip()) if item.strip()]
    if len(items) != len(types) or not all(item.isdigit() for item in items):
        raise HeadMaskError(
            f"type budget {text!r}: expected {len(types)} head counts ({', '.join(types)}), e.g. '(14,31,30)'"
        )
    per_type = {}
    for attention_type, item in zip(types, items):
        layers, heads = layout[attention_type]
        if int(item) > layers * heads:
            raise HeadMaskError(
                f"type budget {text!r}: {attention_type} keeps {item} heads, the model has {layers * heads}"
            )
        per_type[attention_type] = int(item)
    return Budget("(" + ",".join(items) + ")", per_type=per_type)


def budget_mask(budget: Budget, layout: HeadLayout, seed: int, draw: int) -> HeadMask:
    """Heads kept at random within the budget, reproducible from (seed, draw, budget)."""
    head_mask = {t: torch.zeros(layers, heads) for t, (layers, heads) in layout.items()}
    rng = np.random.default_rng([seed, draw, zlib.crc32(budget.label.encode())])
    for attention_type in _types_with_layers(layout):
        layers, heads = layout[attention_type]
        if budget.per_layer is not None:
            for layer, count in enumerate(budget.per_layer[attention_type]):
                kept = rng.choice(heads, size=count, replace=False)
                head_mask[attention_type][layer, torch.as_tensor(kept, dtype=torch.long)] = 1.0
        else:
            kept = rng.choice(layers * heads, size=budget.per_type[attention_type], replace=False)
            flat = head_mask[attention_type].view(-1)
            flat[torch.as_tensor(kept, dtype=torch.long)] = 1.0
    return head_mask


# ----------------------------------------------------------------------------- summaries


def mean_and_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0


def _summarize(rows, keys: Sequence[str], shared: Sequence[str]) -> List[Dict[str, object]]:
    """Group rows by ``keys``; per group the ``shared`` fields, BLEU mean and std, draws, significant draws."""
    groups: Dict[tuple, List[Dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for key, members in groups.items():
        mean, std = mean_and_std([m["bleu"] for m in members])
        delta, _ = mean_and_std([m["delta"] for m in members])
        entry = dict(zip(keys, key))
        entry.update({field: members[0][field] for field in shared})
        entry.update(
            bleu=mean, bleu_std=std, delta=delta, draws=len(members),
            significant=sum(bool(m["significant"]) for m in members),
        )
        summary.append(entry)
    return summary


def summarize_curves(rows: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """One row per (scope, order, step): BLEU mean and standard deviation over draws."""
    return _summarize(rows, ("scope", "order", "step"), ("pruned", "total", "percent"))


def summarize_budgets(rows: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """One row per budget: BLEU mean and standard deviation over draws."""
    return _summarize(rows, ("budget",), ("kind", "percent"))


@dataclass
class DynamicsGrid:
    """Dynamics rows as epochs x pruning levels."""

    epochs: List[int]
    levels: List[int]  # 0 is the unpruned model
    percent: Dict[int, float]  # level -> % of the heads pruned
    cell: Dict[Tuple[int, int], Dict[str, object]]  # (epoch, level) -> row

    def unpruned_bleu(self, epoch: int) -> float:
        return self.cell[(epoch, self.levels[0])]["unpruned_bleu"]


def dynamics_grid(rows: Sequence[Dict[str, object]]) -> DynamicsGrid:
    return DynamicsGrid(
        epochs=sorted({r["epoch"] for r in rows}),
        levels=sorted({r["level"] for r in rows}),
        percent={r["level"]: r["percent"] for r in rows},
        cell={(r["epoch"], r["level"]): r for r in rows},
    )


def markdown_curves(summary: Sequence[Dict[str, object]], baseline_bleu: float, caption: str) -> str:
    """Per scope: % pruned by order, BLEU (mean ± std for random)."""
    parts = [f"{caption}\n"]
    for scope in SCOPES:
        rows = [r for r in summary if r["scope"] == scope]
        if not rows:
            continue
        orders = [o for o in ORDERS if any(r["order"] == o for r in rows)]
        total = rows[0]["total"]
        parts.append(f"\n**{_scope_title(scope)}** ({total} heads; unpruned BLEU {baseline_bleu:.2f})\n\n")
        parts.append("| heads pruned | % | " + " | ".join(ORDER_TITLES[o] for o in orders) + " |\n")
        parts.append("|---:|---:|" + "---:|" * len(orders) + "\n")
        for pruned in sorted({r["pruned"] for r in rows}):
            cells = []
            for order in orders:
                match = [r for r in rows if r["order"] == order and r["pruned"] == pruned]
                cells.append(_curve_cell(match[0]) if match else "")
            percent = 100.0 * pruned / total
            parts.append(f"| {pruned} | {percent:.1f} | " + " | ".join(cells) + " |\n")
    return "".join(parts)


def _curve_cell(row: Dict[str, object]) -> str:
    if row["draws"] > 1:
        return f"{row['bleu']:.2f} ± {row['bleu_std']:.2f}"
    text = f"{row['bleu']:.2f}"
    return f"**{text}**" if row["significant"] else text


def markdown_budgets(summary: Sequence[Dict[str, object]], baseline_bleu: float, caption: str) -> str:
    lines = [
        f"{caption}\n\n",
        "| configuration (heads kept) | kind | % pruned | BLEU (mean ± std) | ΔBLEU | significant draws |\n",
        "|---|---|---:|---:|---:|---:|\n",
        f"| all heads | | 0.0 | {baseline_bleu:.2f} | | |\n",
    ]
    for row in summary:
        lines.append(
            f"| `{row['budget']}` | {row['kind']} | {row['percent']:.1f} | {row['bleu']:.2f} ± {row['bleu_std']:.2f} "
            f"| {row['delta']:+.2f} | {row['significant']} of {row['draws']} |\n"
        )
    return "".join(lines)


def _scope_title(scope: str) -> str:
    from .ablation import TYPE_TITLES

    return "All attention types" if scope == "all" else TYPE_TITLES[scope]
