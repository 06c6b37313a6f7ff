"""Whole layers to remove: ``encoder:1 decoder:2-3`` <-> {"encoder": [0], "decoder": [1, 2]}.

Removing a layer entirely (its attention, FFN, layer norms and biases) is
not the same as masking all its heads and neurons: a fully masked layer
still adds its output biases and applies its layer norms. A model whose
decoder lost layers this way is the shallow decoder of Kasai et al. (2021)
and Hsu et al. (2020). Layers are numbered from 1, as in head-mask specs.
This module knows nothing about fairseq.

Spec grammar (terms separated by whitespace or ``;``)::

    TERM  := STACK ":" LIST      STACK := encoder | decoder   (1-based layers)
"""

import re
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Mapping, Optional, Tuple

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.masks.ranges import RangeError, expand_ranges, format_ranges, parse_ranges
from fairseq_headprune.study.output.serialisation import PlainRecord

STACKS = ("encoder", "decoder")
# a stack's layers to remove, 0-based, sorted
LayerDrop = Dict[str, List[int]]


def parse_layer_drop(spec: str, depths: Mapping[str, int]) -> LayerDrop:
    """The layers ``spec`` removes, checked against ``depths`` (stack -> number of layers).

    Every stack keeps at least one layer.
    """
    dropped: LayerDrop = {}
    text = str(spec).strip()
    if not text:
        raise _wrong("empty spec (expected e.g. decoder:2-3)")
    for term in re.split(r"[\s;]+", text):
        stack, separator, layers = term.partition(":")
        stack = stack.strip().lower()
        if not separator or not layers:
            raise _wrong(f"malformed term {term!r} (expected STACK:LAYERS, e.g. decoder:2-3)")
        if stack not in STACKS:
            raise _wrong(f"unknown stack {stack!r} in {term!r} (expected encoder or decoder)")
        if stack not in depths:
            raise _wrong(f"the model has no {stack}")
        try:
            numbers = expand_ranges(parse_ranges(layers))
        except RangeError:
            raise _wrong(f"malformed layer list {layers!r} in {term!r}") from None
        depth = depths[stack]
        outside = [n for n in numbers if not 1 <= n <= depth]
        if outside:
            raise _wrong(f"the {stack} has layers 1-{depth}, not {outside[0]}")
        dropped[stack] = sorted(set(dropped.get(stack, [])) | {n - 1 for n in numbers})
    return checked_layer_drop(dropped, depths)


def checked_layer_drop(dropped: Mapping[str, List[int]], depths: Mapping[str, int]) -> LayerDrop:
    """``dropped`` (stack -> 0-based layers, a parsed spec or a ``LayerChoice``'s) checked against ``depths``, each
    stack's layers sorted, stacks that lose none left out; every stack keeps at least one layer."""
    checked: LayerDrop = {}
    for stack, layers in dropped.items():
        if not layers:
            continue
        if stack not in depths:
            raise _wrong(f"the model has no {stack}")
        outside = [n + 1 for n in layers if not 0 <= n < depths[stack]]
        if outside:
            raise _wrong(f"the {stack} has layers 1-{depths[stack]}, not {outside[0]}")
        checked[stack] = sorted(set(layers))
        if len(checked[stack]) >= depths[stack]:
            raise _wrong(f"the {stack} must keep at least one of its {depths[stack]} layers")
    return checked


def _wrong(problem: str) -> HeadMaskError:
    return HeadMaskError(f"the layers to drop: {problem}", setting="drop_layers")


# the stack whose layers hold each attention and FFN type
STACK_OF_TYPE = {"enc-enc": "encoder", "enc-dec": "decoder", "dec-dec": "decoder", "enc-ffn": "encoder",
                 "dec-ffn": "decoder"}


def layout_after_drop(layout: Mapping[str, Tuple[int, int]], dropped: Optional[Mapping[str, List[int]]]
                      ) -> Dict[str, Tuple[int, int]]:
    """A head or FFN layout (type -> layers, units) once the layers ``dropped`` are removed: what a mask of the
    shallower model numbers."""
    dropped = dropped or {}
    return {unit_type: (layers - len(dropped.get(STACK_OF_TYPE[unit_type], [])), units)
            for unit_type, (layers, units) in layout.items()}


def layer_drop_to_spec(dropped: Mapping[str, List[int]]) -> str:
    """The spec of ``dropped`` (1-based), stacks in model order; ``none`` when nothing is dropped."""
    terms = [f"{stack}:{format_ranges([n + 1 for n in dropped[stack]])}" for stack in STACKS if dropped.get(stack)]
    return " ".join(terms) if terms else "none"


def kept_layers(dropped: Mapping[str, List[int]], depths: Mapping[str, int]) -> Dict[str, List[int]]:
    """stack -> the layers (0-based) that stay, in order."""
    return {stack: [i for i in range(depth) if i not in set(dropped.get(stack, []))]
            for stack, depth in depths.items()}


@dataclass
class LayerStep(PlainRecord):
    """One layer chosen: its stack, its number (1-based, in the full model), the loss without it (and the layers
    chosen before it) and the loss each candidate gave (``decoder:3`` -> loss)."""

    stack: str
    layer: int
    loss: float
    candidates: Dict[str, float] = field(default_factory=dict)


@dataclass
class LayerChoice(PlainRecord):
    """Whole layers chosen for removal one at a time by a measured loss (``engine.compression.layer_choice``):
    the layers, the loss with every layer, and each step's stack, layer (1-based, numbered in the full model),
    the loss after it and the loss each candidate gave."""

    DERIVED: ClassVar[Tuple[str, ...]] = ("spec",)
    ORDER: ClassVar[Tuple[str, ...]] = ("spec",)

    dropped: LayerDrop
    base_loss: float
    steps: List[LayerStep] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return layer_drop_to_spec(self.dropped)

    @property
    def loss(self) -> float:
        """The loss with the chosen layers removed."""
        return self.steps[-1].loss if self.steps else self.base_loss
