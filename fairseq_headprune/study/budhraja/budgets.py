"""Budhraja et al. (2020): heads kept at random within a budget, and whole layers pruned by position.

Their configurations, each a ``Budget``:

- per layer (``888444`` strings: heads kept in each layer, one group per
  attention type; Table 2);
- per type (``(14,31,30)`` triples: heads kept in Enc-Enc, Enc-Dec and
  Dec-Dec; Table 3);
- a level (``60%`` of all heads pruned at random, at least one head kept in
  every layer of every type; Tables 1 and 4);
- whole layers (``middle:2``; Tables 5 and 6, ``layer_strategies``): no draw, the
  same mask every time.

and seeded draws of the heads kept. Nothing here touches fairseq.
"""

import re
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.budhraja.layer_strategies import LayerStrategy, parse_layer_strategy, strategy_mask
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask
from fairseq_headprune.study.pruning.curves import pruned_at_level

BUDGET_KINDS = ("per-layer", "per-type", "level", "layers")


ONE_HEAD_PER_LAYER = "one head per layer of each type"  # Table 1's last row (the paper's 87%)


@dataclass
class Budget:
    """One of Budhraja et al.'s configurations: which heads are kept, at random within a budget or by position."""

    label: str  # as the user wrote it, normalised
    per_layer: Optional[Dict[str, List[int]]] = None
    per_type: Optional[Dict[str, int]] = None
    level: Optional[int] = None  # heads pruned anywhere (a level), each layer keeping at least ``min_per_layer``
    min_per_layer: int = 0
    strategy: Optional[LayerStrategy] = None  # whole layers pruned
    # where the configuration comes from in Budhraja et al.: its tables, the level of its row there, which of the
    # row's configurations it is (``important layers kept``, ``fewest in ES``); none for a budget given by hand
    tables: Tuple[int, ...] = ()
    paper_level: Optional[float] = None
    arm: str = ""
    draws: Optional[int] = None  # random draws of this budget (None: the study's --draws)

    @property
    def note(self) -> str:
        """Where it comes from, as the tables say it: ``Table 2, 25%, important layers kept``."""
        if not self.tables:
            return ""
        tables = ", ".join(f"Table {table}" for table in self.tables)
        if self.paper_level is None:
            return tables
        if self.arm == ONE_HEAD_PER_LAYER:
            return f"{tables}, {self.arm} ({self.paper_level:g}% in the paper)"
        return f"{tables}, {self.paper_level:g}%, {self.arm}" if self.arm else f"{tables}, {self.paper_level:g}% pruned"

    @property
    def kind(self) -> str:
        if self.per_layer is not None:
            return "per-layer"
        if self.per_type is not None:
            return "per-type"
        return "level" if self.level is not None else "layers"

    @property
    def random(self) -> bool:
        """Whether the heads are drawn (a whole-layer strategy is one fixed mask)."""
        return self.strategy is None

    def kept(self, layout: HeadLayout) -> Dict[str, int]:
        if self.per_type is not None:
            return dict(self.per_type)
        if self.per_layer is not None:
            return {t: sum(counts) for t, counts in self.per_layer.items()}
        if self.strategy is not None:
            pruned = strategy_mask(self.strategy, layout)
            return {t: int(m.sum()) for t, m in pruned.items()}
        return {"all": _total(layout) - self.level}

    def pruned_percent(self, layout: HeadLayout) -> float:
        return 100.0 * (_total(layout) - sum(self.kept(layout).values())) / _total(layout)


def _total(layout: HeadLayout) -> int:
    return sum(layers * heads for layers, heads in layout.values())


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


def level_budget(percent: float, layout: HeadLayout, min_per_layer: int = 1) -> Budget:
    """``percent`` of all heads pruned at random (rounded up, as the curves' steps), ``min_per_layer`` kept in each
    layer of each type; a level that cannot keep them is a ``HeadMaskError``."""
    if not 0 < percent < 100:
        raise HeadMaskError(f"random level {percent:g}%: a level is a share of the heads pruned, above 0 and below 100")
    total, layers = _total(layout), sum(count for count, _ in layout.values())
    pruned = pruned_at_level(percent, total)
    most = total - min_per_layer * layers
    if pruned > most:
        raise HeadMaskError(
            f"random level {percent:g}% prunes {pruned} of {total} heads, which cannot keep {min_per_layer} head(s) "
            f"in every one of the model's {layers} layers (at most {most} heads, {100.0 * most / total:.1f}%)")
    return Budget(f"{percent:g}%", level=pruned, min_per_layer=min_per_layer)


def one_head_per_layer_budget(layout: HeadLayout) -> Budget:
    """Every layer of every type keeps exactly one head, at random (the paper's 87% on its 8-head model)."""
    layers = sum(count for count, _ in layout.values())
    return Budget("one head per layer", level=_total(layout) - layers, min_per_layer=1)


def strategy_budget(text: str, layout: HeadLayout) -> Budget:
    """Whole layers pruned by position (``layer_strategies``)."""
    strategy = parse_layer_strategy(text, layout)
    return Budget(strategy.label, strategy=strategy)


def budget_mask(budget: Budget, layout: HeadLayout, seed: int, draw: int) -> HeadMask:
    """Heads kept at random within the budget, reproducible from (seed, draw, budget); a strategy's fixed mask."""
    if budget.strategy is not None:
        return strategy_mask(budget.strategy, layout)
    rng = np.random.default_rng([seed, draw, zlib.crc32(budget.label.encode())])
    if budget.level is not None:
        return _level_mask(budget, layout, rng)
    head_mask = {t: torch.zeros(layers, heads) for t, (layers, heads) in layout.items()}
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


def _level_mask(budget: Budget, layout: HeadLayout, rng: np.random.Generator) -> HeadMask:
    """``budget.level`` heads pruned: first ``min_per_layer`` heads of every layer drawn to stay, then the pruned
    heads drawn uniformly from all the others (every head outside the kept minimum equally likely)."""
    head_mask = {t: torch.ones(layers, heads) for t, (layers, heads) in layout.items()}
    candidates: List[Tuple[str, int, int]] = []
    for attention_type in _types_with_layers(layout):
        layers, heads = layout[attention_type]
        for layer in range(layers):
            kept = set(rng.choice(heads, size=budget.min_per_layer, replace=False).tolist())
            candidates += [(attention_type, layer, head) for head in range(heads) if head not in kept]
    for index in rng.choice(len(candidates), size=budget.level, replace=False).tolist():
        attention_type, layer, head = candidates[index]
        head_mask[attention_type][layer, head] = 0.0
    return head_mask


def budget_draws(budget: Budget, draws: int) -> int:
    """How many draws a budget gets: its own count, else the study's ``draws``; one for a whole-layer strategy."""
    return (budget.draws or draws) if budget.random else 1


def draws_text(counts: Sequence[int]) -> str:
    """The random budgets' draws in a caption: ``3 draws``, or ``1 to 3 draws (each row's)`` where they differ."""
    counts = sorted(set(counts)) or [0]
    if len(counts) == 1:
        return f"{counts[0]} draw{'s' if counts[0] != 1 else ''}"
    return f"{counts[0]} to {counts[-1]} draws (each row's)"


def plan_budgets(budgets: Sequence[Budget], layout: HeadLayout, seed: int, draws: int):
    """(budget, draw, mask) for every draw of every budget (``budget_draws``). A draw's mask depends on the seed,
    the draw and the budget's label only: a budget keeps its draws when others are added."""
    return [(budget, draw, budget_mask(budget, layout, seed, draw))
            for budget in budgets for draw in range(1, budget_draws(budget, draws) + 1)]
