"""Whole layers pruned by position (Budhraja et al. 2020, Tables 5 and 6), for any depth.

The paper prunes every head of chosen BERT layers: the top K, the bottom K,
K/2 of each (``top+bottom``), the K in the middle, and the even- or
odd-numbered layers (its 12 layers: top/bottom K in 1, 3, 6, 8; top+bottom
and middle K in 2, 4, 6, 8; even and odd: 6 layers each). A strategy is
written ``[TYPE:]NAME[:K]``:

- ``top:K`` the K layers nearest the output, ``bottom:K`` the K nearest the input;
- ``top+bottom:K`` floor(K/2) bottom layers and ceil(K/2) top layers;
- ``middle:K`` the K central layers (layers ``(L-K)//2 + 1`` ... ``(L-K)//2 + K``, 1-based);
- ``even``, ``odd`` every second layer (1-based numbering: ``odd`` is 1, 3, 5 ...).

Without TYPE a strategy applies to every attention type of the model (the
one type of an encoder-only or decoder-only model); with one
(``enc-enc:middle:2``) to that type alone, as a translation model's strategies
are given. ``paper_strategies`` scales the paper's K to a model's depth.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, full_mask, parse_attention_type

COUNTED = ("top", "bottom", "top+bottom", "middle")
PARITY = ("even", "odd")
STRATEGY_NAMES = COUNTED + PARITY
PAPER_DEPTH = 12  # BERT-base, the model of the paper's Tables 5 and 6
# Table 5's K for each counted strategy; Table 6 prunes half of the layers (6 of 12)
PAPER_COUNTS = {"top": (1, 3, 6, 8), "bottom": (1, 3, 6, 8), "top+bottom": (2, 4, 6, 8), "middle": (2, 4, 6, 8)}
PAPER_HALF = 6


@dataclass(frozen=True)
class LayerStrategy:
    """Which layers lose all their heads: a named position rule, its layer count, the attention type (None: all)."""

    name: str
    count: Optional[int] = None  # K; None for even and odd
    attention_type: Optional[str] = None

    @property
    def label(self) -> str:
        text = self.name if self.count is None else f"{self.name}:{self.count}"
        return text if self.attention_type is None else f"{self.attention_type}:{text}"

    def layers(self, depth: int) -> List[int]:
        """The 1-based layers this strategy prunes in a stack of ``depth`` layers."""
        if self.name in PARITY:
            return [layer for layer in range(1, depth + 1) if layer % 2 == (0 if self.name == "even" else 1)]
        k = self.count
        if self.name == "top":
            return list(range(depth - k + 1, depth + 1))
        if self.name == "bottom":
            return list(range(1, k + 1))
        if self.name == "top+bottom":
            return list(range(1, k // 2 + 1)) + list(range(depth - (k - k // 2) + 1, depth + 1))
        start = (depth - k) // 2 + 1  # middle
        return list(range(start, start + k))


def parse_layer_strategy(text: str, layout: HeadLayout) -> LayerStrategy:
    """``[TYPE:]NAME[:K]`` for a model of ``layout``; a strategy the model cannot take is a ``HeadMaskError``."""
    parts = [part.strip() for part in str(text).strip().split(":")]
    attention_type = None
    if len(parts) > 1 and parts[0].lower() not in STRATEGY_NAMES:
        try:
            attention_type = parse_attention_type(parts[0])
        except HeadMaskError:
            raise HeadMaskError(f"layer strategy {text!r}: unknown strategy or attention type {parts[0]!r} "
                                f"(strategies: {', '.join(STRATEGY_NAMES)})") from None
        parts = parts[1:]
    name = parts[0].lower()
    if name not in STRATEGY_NAMES or len(parts) > 2:
        raise HeadMaskError(f"layer strategy {text!r}: expected [TYPE:]NAME[:K] with NAME one of "
                            f"{', '.join(STRATEGY_NAMES)} (e.g. middle:2, enc-enc:top:1, odd)")
    count = None
    if name in COUNTED:
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise HeadMaskError(f"layer strategy {text!r}: {name} needs a number of layers K >= 1 ({name}:K)")
        count = int(parts[1])
    elif len(parts) == 2:
        raise HeadMaskError(f"layer strategy {text!r}: {name} takes no number (every second layer)")
    strategy = LayerStrategy(name, count, attention_type)
    for strategy_type in strategy_types(strategy, layout):
        depth = layout[strategy_type][0]
        if count is not None and count > depth:
            raise HeadMaskError(f"layer strategy {text!r} prunes {count} layers; {strategy_type} has {depth}")
        if name == "top+bottom" and count < 2:
            raise HeadMaskError(f"layer strategy {text!r}: top+bottom needs K >= 2 (one layer at each end)")
        if not strategy.layers(depth):
            raise HeadMaskError(f"layer strategy {text!r} prunes no layer of {strategy_type} ({depth} layers)")
    return strategy


def strategy_types(strategy: LayerStrategy, layout: HeadLayout) -> List[str]:
    """The attention types a strategy prunes layers of."""
    if strategy.attention_type is None:
        return [t for t in ATTENTION_TYPES if t in layout]
    if strategy.attention_type not in layout:
        raise HeadMaskError(f"layer strategy {strategy.label}: the model has no {strategy.attention_type} attention")
    return [strategy.attention_type]


def strategy_mask(strategy: LayerStrategy, layout: HeadLayout) -> HeadMask:
    """Every head of the strategy's layers masked (ξ = 0), the rest kept."""
    head_mask = full_mask(layout)
    for attention_type in strategy_types(strategy, layout):
        for layer in strategy.layers(layout[attention_type][0]):
            head_mask[attention_type][layer - 1] = 0.0
    return head_mask


def scaled_layer_count(paper_count: int, depth: int, paper_depth: int = PAPER_DEPTH) -> int:
    """The paper's K for ``paper_depth`` layers at a model's ``depth``: K * depth / paper_depth, half up, >= 1."""
    return max(1, min(depth, math.floor(paper_count * depth / paper_depth + 0.5)))


def paper_strategies(depth: int, tables: Sequence[int] = (5, 6), attention_type: Optional[str] = None
                     ) -> List[LayerStrategy]:
    """Table 5's and Table 6's strategies at ``depth`` (the paper's K scaled; coinciding ones once), in its order.

    Table 5: top/bottom K and top+bottom/middle K (pairs); Table 6: half of the
    layers by top, bottom, even, odd, top+bottom and middle.
    """
    wanted: List[LayerStrategy] = []
    if 5 in tables:
        for pair in (("top", "bottom"), ("top+bottom", "middle")):  # the rows Table 5 sets side by side
            for paper_count in PAPER_COUNTS[pair[0]]:
                k = scaled_layer_count(paper_count, depth)
                k = max(k, 2) if pair[0] == "top+bottom" else k  # one layer at each end at least
                wanted += [LayerStrategy(name, k, attention_type) for name in pair if k <= depth]
    if 6 in tables:
        half = scaled_layer_count(PAPER_HALF, depth)
        wanted += [LayerStrategy("top", half, attention_type), LayerStrategy("bottom", half, attention_type),
                   LayerStrategy("even", None, attention_type), LayerStrategy("odd", None, attention_type)]
        if depth >= 2:
            wanted += [LayerStrategy("top+bottom", max(2, half), attention_type),
                       LayerStrategy("middle", max(2, half), attention_type)]
    unique: Dict[str, LayerStrategy] = {}
    for strategy in wanted:
        if strategy.layers(depth):
            unique.setdefault(strategy.label, strategy)
    return list(unique.values())


def layers_text(strategy: LayerStrategy, layout: HeadLayout) -> str:
    """Which layers a strategy prunes, per type: ``enc-enc 1,3,5``."""
    return "; ".join(f"{t} {','.join(map(str, strategy.layers(layout[t][0])))}"
                     for t in strategy_types(strategy, layout))
