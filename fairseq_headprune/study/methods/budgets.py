"""Budhraja et al. (2020): heads kept at random within a budget.

Their per-layer budgets (``888444`` strings: heads kept in each layer, one
group per attention type) and per-type totals (``(14,31,30)`` triples: heads
kept in Enc-Enc, Enc-Dec and Dec-Dec), and seeded draws of the heads kept.
Nothing here touches fairseq.
"""

import re
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ...constants import ATTENTION_TYPES
from ...errors import HeadMaskError
from ..masks.head_mask import HeadLayout, HeadMask


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


def plan_budgets(budgets: Sequence[Budget], layout: HeadLayout, seed: int, draws: int):
    """(budget, draw, mask) for every draw of every budget."""
    return [(budget, draw, budget_mask(budget, layout, seed, draw)) for budget in budgets for draw in range(1, draws + 1)]
