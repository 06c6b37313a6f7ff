"""Head-mask specs: parse them into per-layer mask tensors and write them back.

A mask holds one variable xi_h per head (Michel et al. 2019, section 2.3):
1.0 keeps the head, 0.0 masks it.  This module knows nothing about fairseq;
a model is described only by its ``HeadLayout`` (layers and heads per
attention type), so every function here is testable on its own.

Spec grammar (terms separated by whitespace or ``;``)::

    TERM   := TYPE ":" LAYERS ":" HEADS
    TYPE   := E | enc-enc | A | enc-dec | D | dec-dec | *   (case-insensitive)
    LAYERS := * | LIST            (1-based)
    HEADS  := * | LIST | keep=LIST  (1-based; keep= masks every other head)
    LIST   := ITEM ("," ITEM)*,  ITEM := N | N-M

The authors' descriptors (``E:1:6 A:2:1,3``) are terms of this grammar.
``none`` is the empty mask.  A path to a ``.json`` or ``.tsv`` file is read
as a mask file (see ``read_mask_file``).
"""

import csv
import json
import os
import re
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from fairseq_headprune.constants import ATTENTION_TYPES, NO_MASK_SPEC, TYPE_LETTERS
from fairseq_headprune.errors import HeadMaskError, setting_words
from fairseq_headprune.study.masks.ranges import RangeError, format_ranges, parse_ranges

_TYPE_ALIASES = {
    "e": "enc-enc",
    "enc-enc": "enc-enc",
    "encoder": "enc-enc",
    "a": "enc-dec",
    "enc-dec": "enc-dec",
    "d": "dec-dec",
    "dec-dec": "dec-dec",
    "decoder": "dec-dec",
}

# attention type -> (number of layers, heads per layer)
HeadLayout = Dict[str, Tuple[int, int]]
# attention type -> float tensor (layers, heads); 1.0 keeps a head, 0.0 masks it
HeadMask = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class MaskKind:
    """What a spec masks: heads of attention layers, or neurons (hidden units) of FFN blocks.

    The grammar is the same; the names of the types, of the unit and of the
    option differ (``--head-mask E:1:6``, ``--ffn-mask E:2:1-200``).
    """

    option: str  # "head-mask": the spec's name in messages
    unit: str  # "head": what LIST counts
    structure: str  # "attention": what a type is a kind of
    types: Tuple[str, ...]  # canonical type names, in spec order
    letters: Dict[str, str]  # type -> its one-letter name
    aliases: Dict[str, str]  # lower-case alias -> type
    example: str  # a term of the grammar
    type_column: str  # the type's column in a TSV mask file
    block: str  # what a model may lack: "the model has no enc-dec attention"


    @property
    def setting(self) -> str:
        """The setting a spec of this kind is (``head_mask``, ``ffn_mask``): what its errors name."""
        return self.option.replace("-", "_")

    def parse_type(self, name: str) -> str:
        canonical = self.aliases.get(name.strip().lower())
        if canonical is None:
            expected = [f"{self.letters[t]}/{t}" for t in self.types]
            listed = ", ".join(expected[:-1]) + " or " + expected[-1] if len(expected) > 1 else expected[0]
            raise HeadMaskError(f"unknown {self.structure} type {name!r} (expected {listed})")
        return canonical


HEADS = MaskKind("head-mask", "head", "attention", ATTENTION_TYPES, TYPE_LETTERS, _TYPE_ALIASES, "E:1:6",
                 "attention_type", "attention")


def parse_attention_type(name: str) -> str:
    """Canonical attention type ("enc-enc", "enc-dec", "dec-dec") for any alias."""
    return HEADS.parse_type(name)


class _Term(NamedTuple):
    """One parsed spec term; ranges are checked only once a layout is known."""

    text: str
    attention_type: Optional[str]  # None stands for "*": every type
    layers: Optional[List[Tuple[int, int]]]  # 1-based inclusive ranges; None = "*"
    heads: Optional[List[Tuple[int, int]]]
    keep_only: bool


def _parse_ranges(text: str, what: str, term: str) -> Optional[List[Tuple[int, int]]]:
    """'1,3-4' -> [(1, 1), (3, 4)]; '*' -> None."""
    if text == "*":
        return None
    try:
        return parse_ranges(text)
    except RangeError as error:
        if error.kind == "empty range":
            raise HeadMaskError(f"empty {what} range {error.item!r} in term {term!r}") from error
        raise HeadMaskError(f"malformed {what} list {text!r} in term {term!r}") from error


def _parse_terms(spec: str, kind: MaskKind = HEADS) -> List[_Term]:
    """Spec text -> terms, checking grammar only."""
    terms = []
    for text in re.split(r"[\s;]+", spec.strip()):
        parts = text.split(":")
        if len(parts) != 3 or not all(parts):
            raise HeadMaskError(
                f"malformed term {text!r} (expected TYPE:LAYERS:{kind.unit.upper()}S, e.g. {kind.example})"
            )
        type_text, layers_text, heads_text = parts
        keep_only = heads_text.lower().startswith("keep=")
        if keep_only:
            heads_text = heads_text[len("keep="):]
        terms.append(
            _Term(
                text=text,
                attention_type=None if type_text == "*" else kind.parse_type(type_text),
                layers=_parse_ranges(layers_text, "layer", text),
                heads=_parse_ranges(heads_text, kind.unit, text),
                keep_only=keep_only,
            )
        )
    return terms


def _expand(ranges, upper: int, what: str, term: str) -> List[int]:
    """1-based ranges -> 0-based indices, each checked against the model's size."""
    if ranges is None:
        return list(range(upper))
    indices = set()
    for first, last in ranges:
        for number in (first, last):
            if not 1 <= number <= upper:
                raise HeadMaskError(
                    f"{what} {number} out of range 1-{upper} in term {term!r}"
                )
        indices.update(range(first - 1, last))
    return sorted(indices)


def _is_mask_file(spec: str) -> bool:
    return spec.lower().endswith((".json", ".tsv")) or os.path.isfile(spec)


def layer_name(attention_type: str, layer: int) -> str:
    """How result files name a layer: ``enc-dec:2`` for the 0-based layer 1."""
    return f"{attention_type}:{layer + 1}"


def parse_layer_name(name: str) -> Tuple[str, int]:
    """``enc-dec:2`` -> ("enc-dec", 1); ValueError for another form."""
    attention_type, layer = name.rsplit(":", 1)
    return attention_type, int(layer) - 1


def full_mask(layout: HeadLayout) -> HeadMask:
    """The mask that keeps every head."""
    return {
        attention_type: torch.ones(num_layers, num_heads)
        for attention_type, (num_layers, num_heads) in layout.items()
    }


def validate_spec_syntax(spec: Optional[str], kind: MaskKind = HEADS) -> None:
    """Check a spec's grammar before the model, and so its layout, is known."""
    if spec is None:
        return
    if not spec.strip():
        raise HeadMaskError(f"empty {kind.option} spec (use 'none' for no mask)")
    spec = spec.strip()
    if _is_mask_file(spec):
        if not os.path.isfile(spec):
            raise HeadMaskError(f"{kind.option} file not found: {spec}")
    elif spec.lower() != NO_MASK_SPEC:
        _parse_terms(spec, kind)


def check_mask_layout(mask: HeadMask, layout: HeadLayout, kind: MaskKind = HEADS) -> None:
    """A mask object handed in (not parsed here) must be one of a model of ``layout``: every type, each
    ``(layers, units)``; ``HeadMaskError`` (its setting: the kind's) names the first that differs."""
    for unit_type in sorted(set(mask) | set(layout)):
        shape = tuple(mask[unit_type].shape) if unit_type in mask else None
        if shape != layout.get(unit_type):
            have = "none" if shape is None else " x ".join(map(str, shape))
            want = "none" if unit_type not in layout else f"{layout[unit_type][0]} x {layout[unit_type][1]}"
            raise HeadMaskError(f"{setting_words(kind.setting)} is not one of this model: its {unit_type} layers "
                                f"and {kind.unit}s are {have}, the model's {want}", setting=kind.setting)


def parse_head_mask(spec: str, layout: HeadLayout, kind: MaskKind = HEADS) -> HeadMask:
    """Spec text (or a mask file path) -> mask tensors for a model of ``layout``.

    Raises ``HeadMaskError`` with a one-line message for a malformed spec or
    one that names a type, layer or head the model does not have. ``kind``:
    what the spec masks (heads; ``ffn_mask.NEURONS`` for FFN neurons).
    """
    validate_spec_syntax(spec if spec is not None else "", kind)
    spec = spec.strip()
    if _is_mask_file(spec):
        return read_mask_file(spec, layout, kind)
    head_mask = full_mask(layout)
    if spec.lower() == NO_MASK_SPEC:
        return head_mask
    for term in _parse_terms(spec, kind):
        types = list(layout) if term.attention_type is None else [term.attention_type]
        for attention_type in types:
            if attention_type not in layout:
                raise HeadMaskError(
                    f"the model has no {attention_type} {kind.block} (term {term.text!r})"
                )
            num_layers, num_heads = layout[attention_type]
            layers = _expand(term.layers, num_layers, "layer", term.text)
            heads = _expand(term.heads, num_heads, kind.unit, term.text)
            if term.keep_only:
                heads = [h for h in range(num_heads) if h not in heads]
            for layer in layers:
                head_mask[attention_type][layer, heads] = 0.0
    return head_mask


def _compress(indices: List[int]) -> str:
    """0-based indices -> 1-based list text with ranges, e.g. [0,1,2,5] -> '1-3,6'."""
    return format_ranges(index + 1 for index in indices)


def head_mask_to_spec(head_mask: HeadMask, kind: MaskKind = HEADS) -> str:
    """Mask tensors -> canonical spec text; ``parse_head_mask`` inverts it."""
    terms = []
    for attention_type in kind.types:
        if attention_type not in head_mask:
            continue
        letter = kind.letters[attention_type]
        for layer, layer_mask in enumerate(head_mask[attention_type]):
            masked = [h for h, xi in enumerate(layer_mask.tolist()) if xi == 0.0]
            kept = [h for h, xi in enumerate(layer_mask.tolist()) if xi != 0.0]
            if not masked:
                continue
            if not kept:
                heads_text = "*"
            elif len(kept) < len(masked):
                heads_text = "keep=" + _compress(kept)
            else:
                heads_text = _compress(masked)
            terms.append(f"{letter}:{layer + 1}:{heads_text}")
    return " ".join(terms) if terms else NO_MASK_SPEC


def combine_masks(base: Optional[HeadMask], extra: Optional[HeadMask]) -> Optional[HeadMask]:
    """A head is masked when either mask masks it (None: no mask)."""
    if base is None:
        return extra
    if extra is None:
        return base
    return {t: base[t] * extra[t] for t in base}


def masked_heads(head_mask: HeadMask, kind: MaskKind = HEADS) -> List[Tuple[str, int, int]]:
    """(attention_type, 1-based layer, 1-based head) of every masked head (or unit of ``kind``)."""
    return [
        (attention_type, layer + 1, head + 1)
        for attention_type in kind.types
        if attention_type in head_mask
        for layer, head in (head_mask[attention_type] == 0).nonzero().tolist()
    ]


def same_units_masked(first: Optional[HeadMask], second: Optional[HeadMask], kind: MaskKind = HEADS) -> bool:
    """Whether two masks mask the same units (None: no mask), compared as masks, not as spec text
    (``masked_heads`` lists units in one order: by ``kind``'s types, then layer and head)."""
    return masked_heads(first or {}, kind) == masked_heads(second or {}, kind)


def count_masked(head_mask: HeadMask) -> int:
    return sum(int((mask == 0).sum()) for mask in head_mask.values())


def read_mask_file(path: str, layout: HeadLayout, kind: MaskKind = HEADS) -> HeadMask:
    """Read a mask file.

    JSON: ``{"spec": "E:1:6 A:2:1,3"}``, a list of spec terms, or
    ``{"masked": {"enc-enc": {"1": [6]}, ...}}`` (1-based layers and heads).
    TSV: a header with ``attention_type``, ``layer``, ``head`` (1-based) and an
    optional ``mask`` column; rows without ``mask``, or with ``mask`` 0, are
    masked heads.
    """
    if not os.path.isfile(path):
        raise HeadMaskError(f"{kind.option} file not found: {path}")
    if path.lower().endswith(".json"):
        try:
            with open(path) as handle:
                content = json.load(handle)
        except json.JSONDecodeError as error:
            raise HeadMaskError(f"head-mask file {path} is not valid JSON: {error}") from error
        if isinstance(content, list) and all(isinstance(t, str) for t in content):
            return parse_head_mask(" ".join(content) or "", layout, kind)
        if isinstance(content, dict) and isinstance(content.get("spec"), str):
            return parse_head_mask(content["spec"], layout, kind)
        if isinstance(content, dict) and isinstance(content.get("masked"), dict):
            terms = []
            for type_name, layers in content["masked"].items():
                if not isinstance(layers, dict):
                    raise HeadMaskError(f"{path}: 'masked.{type_name}' is not an object")
                for layer, heads in layers.items():
                    if not isinstance(heads, list) or not heads:
                        continue
                    heads_text = ",".join(str(h) for h in heads)
                    terms.append(f"{type_name}:{layer}:{heads_text}")
            return parse_head_mask(" ".join(terms) or NO_MASK_SPEC, layout, kind)
        raise HeadMaskError(
            f"{path}: expected {{'spec': ...}}, {{'masked': ...}} or a list of terms"
        )
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if not rows or not {kind.type_column, "layer", kind.unit} <= set(rows[0]):
        raise HeadMaskError(
            f"{path}: expected a TSV header with {kind.type_column}, layer and {kind.unit}"
        )
    terms = []
    for line, row in enumerate(rows, start=2):
        if "mask" in row and row["mask"] not in ("0", "0.0", "1", "1.0"):
            raise HeadMaskError(f"{path}:{line}: mask must be 0 or 1, got {row['mask']!r}")
        if "mask" in row and float(row["mask"]) != 0.0:
            continue
        terms.append(f"{row[kind.type_column]}:{row['layer']}:{row[kind.unit]}")
    return parse_head_mask(" ".join(terms) or NO_MASK_SPEC, layout, kind)


def write_mask_file(head_mask: HeadMask, path: str, kind: MaskKind = HEADS) -> None:
    """Write a mask as JSON (spec plus masked heads) or TSV (one row per head, or unit of ``kind``)."""
    if path.lower().endswith(".json"):
        masked: Dict[str, Dict[str, List[int]]] = {}
        for attention_type, layer, head in masked_heads(head_mask, kind):
            masked.setdefault(attention_type, {}).setdefault(str(layer), []).append(head)
        with open(path, "w") as handle:
            json.dump({"spec": head_mask_to_spec(head_mask, kind), "masked": masked}, handle, indent=2)
            handle.write("\n")
        return
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow([kind.type_column, "layer", kind.unit, "mask"])
        for attention_type in kind.types:
            for layer, layer_mask in enumerate(head_mask.get(attention_type, [])):
                for head, xi in enumerate(layer_mask.tolist()):
                    writer.writerow([attention_type, layer + 1, head + 1, int(xi != 0.0)])
