"""What a budgeted mask search counts (Kwon et al. 2022, section 4.1): each block's cost per unit count kept.

A block is an attention layer (its units: heads) or an FFN layer (its units:
neurons, the hidden units between ``fc1`` and ``fc2``). Its cost is a
function of how many units it keeps: the number of heads, FLOPs per token,
or latency measured per layer on a device (``LatencyTable``, written by the
``latency`` command). A budget counts what the pruned model keeps, of the
blocks searched. Nothing here depends on fairseq.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from fairseq_headprune.constants import ATTENTION_TYPES, CTRANSLATE2_ENGINE, FAIRSEQ_ENGINE, FFN_TYPES
from fairseq_headprune.errors import ResultFileError, SettingsError
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask, layer_name, parse_layer_name
from fairseq_headprune.study.output.files import read_json_of_format, write_json

LATENCY_TABLE_FORMAT = "fairseq-headprune latency table"
# CTranslate2 gives a decoder one head count, shared by its self- and cross-attention layers
CTRANSLATE2_TIED_TYPES = (("dec-dec", "enc-dec"),)
DEFAULT_PRECISION = "float32"  # tables written before precision was recorded were float32

# (attention or FFN type, 0-based layer): an attention layer (units: heads) or an FFN layer (units: neurons)
Block = Tuple[str, int]
Layer = Block


def block_order(blocks) -> List[Block]:
    """Attention layers in the paper's type order, then FFN layers, each by layer."""
    types = ATTENTION_TYPES + FFN_TYPES
    return sorted(blocks, key=lambda block: (types.index(block[0]), block[1]))


@dataclass
class LayerCosts:
    """Cost of every block as a function of the units it keeps.

    ``per_layer[block][i]`` is the cost of keeping ``counts[block][i]`` units;
    a block missing from ``counts`` is priced at every count, ``i`` units at
    index ``i`` (a measured latency table prices FFN layers at some counts only).
    """

    kind: str  # heads, flops, decoding-flops or latency
    per_layer: Dict[Block, List[float]]
    counts: Dict[Block, List[int]] = field(default_factory=dict)
    # attention types priced as one stack that keeps one head count in every layer (CTranslate2's decoder):
    # only a uniform search, choosing that count once for all their layers, is priced right
    tied_types: Tuple[Tuple[str, ...], ...] = ()

    @property
    def unit(self) -> str:
        if self.kind == "heads":
            return "heads"
        if self.kind == "latency":
            return "ms"
        what = " and ".join(name for name, present in (("attention", self.prices_heads), ("FFN", self.prices_neurons))
                            if present)
        return f"{what} FLOPs per {'translated sentence' if self.kind == 'decoding-flops' else 'token'}"

    @property
    def prices_heads(self) -> bool:
        return any(t in ATTENTION_TYPES for t, _ in self.per_layer)

    @property
    def prices_neurons(self) -> bool:
        return any(t in FFN_TYPES for t, _ in self.per_layer)

    def kept_counts(self, block: Block) -> List[int]:
        """The unit counts the block is priced at, ascending."""
        return list(self.counts.get(block, range(len(self.per_layer[block]))))

    def cost_at(self, block: Block, kept: int) -> float:
        counts = self.kept_counts(block)
        if kept not in counts:
            raise SettingsError(f"{layer_name(*block)} is priced keeping {_ranges(counts)} units, not {kept}")
        return float(self.per_layer[block][counts.index(kept)])

    def check_uniform(self, uniform: bool) -> None:
        """Tied types are priced right only by a uniform search."""
        if self.tied_types and not uniform:
            raise SettingsError(
                f"these costs price {' and '.join('+'.join(group) for group in self.tied_types)} as one stack "
                "with one head count in every layer (CTranslate2 pads each layer to the stack's largest): "
                "search with the uniform", setting="uniform")

    def full_cost(self) -> float:
        return float(sum(costs[-1] for costs in self.per_layer.values()))

    def cost_of(self, head_mask: Optional[HeadMask], ffn_mask: Optional[Dict[str, object]] = None) -> float:
        """The cost of a head mask and a neuron mask (None: every unit kept) over the blocks priced."""
        total = 0.0
        for block in self.per_layer:
            mask = head_mask if block[0] in ATTENTION_TYPES else ffn_mask
            kept = self.kept_counts(block)[-1] if mask is None else int(mask[block[0]][block[1]].sum().item())
            total += self.cost_at(block, kept)
        return float(total)


def _ranges(counts: Sequence[int]) -> str:
    return f"{counts[0]}..{counts[-1]}" if len(counts) > 3 else ", ".join(map(str, counts))


def merge_costs(*parts: LayerCosts) -> LayerCosts:
    """Costs of one kind over the blocks of every part (attention layers and FFN layers together)."""
    kinds = {part.kind for part in parts}
    if len(kinds) != 1:
        raise SettingsError(f"cannot add costs of different kinds ({', '.join(sorted(kinds))})")
    per_layer, counts = {}, {}
    for part in parts:
        per_layer.update(part.per_layer)
        counts.update(part.counts)
    tied = tuple(dict.fromkeys(group for part in parts for group in part.tied_types))
    return LayerCosts(kinds.pop(), {b: per_layer[b] for b in block_order(per_layer)}, counts, tied)


def head_count_costs(layout: HeadLayout) -> LayerCosts:
    """One unit per head kept: the budget is a number of heads."""
    return LayerCosts("heads", {
        (t, layer): [float(k) for k in range(heads + 1)]
        for t in ATTENTION_TYPES if t in layout
        for layer in range(layout[t][0])
        for heads in [layout[t][1]]
    })


def attention_flops_per_head(embed_dim: int, head_dim: int, length: int) -> float:
    """FLOPs per token of one head: its q, k, v rows and out-projection columns, scores and weighted sum.

    2 d d_h for each of the four projections, and 2 n d_h each for q k^T and
    the weighted sum of the values over ``length`` = n attended positions
    (source and target taken to be equally long).
    """
    return 8.0 * embed_dim * head_dim + 4.0 * length * head_dim


def neuron_flops(embed_dim: int) -> float:
    """FLOPs per token of one FFN neuron: its row of ``fc1`` and its column of ``fc2``, 2 d each (biases left out)."""
    return 4.0 * embed_dim


def flops_costs(layout: HeadLayout, dims: Dict[str, Tuple[int, int]], length: int) -> LayerCosts:
    """Attention FLOPs per token; ``dims``: per type (embedding dimension, head dimension)."""
    if length <= 0:
        raise SettingsError(f"the sequence length must be positive, got {length}", setting="sequence_length")
    per_layer = {}
    for t in ATTENTION_TYPES:
        if t not in layout:
            continue
        per_head = attention_flops_per_head(*dims[t], length)
        for layer in range(layout[t][0]):
            per_layer[(t, layer)] = [k * per_head for k in range(layout[t][1] + 1)]
    return LayerCosts("flops", per_layer)


def ffn_flops_costs(ffn_layout: Dict[str, Tuple[int, int]], embed_dims: Dict[str, int]) -> LayerCosts:
    """FFN FLOPs per token: ``neuron_flops`` per neuron kept; ``embed_dims``: per FFN type, the model dimension d."""
    per_layer = {}
    for t in FFN_TYPES:
        if t in ffn_layout:
            layers, neurons = ffn_layout[t]
            per_neuron = neuron_flops(embed_dims[t])
            for layer in range(layers):
                per_layer[(t, layer)] = [k * per_neuron for k in range(neurons + 1)]
    return LayerCosts("flops", per_layer)


@dataclass(frozen=True)
class DecodingShape:
    """What one translated sentence costs to decode: its source tokens and decoder steps (both with </s>) and
    the beam; the encoder runs once per sentence, the decoder once per step for every beam row."""

    source_length: int
    target_steps: int
    beam: int

    def __post_init__(self):
        for value, name in ((self.source_length, "source length"), (self.target_steps, "target steps"),
                            (self.beam, "beam")):
            if value < 1:
                raise SettingsError(f"a decoding cost needs a positive {name}, got {value}")


def decoding_flops_per_head(attention_type: str, embed_dim: int, head_dim: int, shape: DecodingShape) -> float:
    """FLOPs one head costs per translated sentence in beam search with an incremental state.

    Encoder self-attention: its four projections (2 d d_h each) for each of the S source tokens, and the
    scores and weighted sum (2 S d_h each) for each. Decoder self-attention: at step t (1 .. T) one new
    position per beam row, projected (8 d d_h) and attending to t positions (4 t d_h). Cross-attention: the
    keys and values of the S encoder states once per beam row (4 d d_h each), then at every step the query and
    output projections (4 d d_h) and S attended positions (4 S d_h).
    """
    source, steps, beam = shape.source_length, shape.target_steps, shape.beam
    d, d_h = float(embed_dim), float(head_dim)
    if attention_type == "enc-enc":
        return source * (8.0 * d * d_h + 4.0 * source * d_h)
    if attention_type == "dec-dec":
        return beam * (steps * 8.0 * d * d_h + 2.0 * d_h * steps * (steps + 1))
    if attention_type == "enc-dec":
        return beam * (source * 4.0 * d * d_h + steps * (4.0 * d * d_h + 4.0 * source * d_h))
    raise SettingsError(f"no decoding cost for attention type {attention_type!r}")


def decoding_flops_per_neuron(ffn_type: str, embed_dim: int, shape: DecodingShape) -> float:
    """FLOPs one FFN neuron costs per translated sentence: 4 d per encoder token, 4 d per decoder step and beam row."""
    rows = shape.source_length if ffn_type == "enc-ffn" else shape.beam * shape.target_steps
    return 4.0 * embed_dim * rows


def output_projection_flops(embed_dim: int, vocabulary: int, shape: DecodingShape) -> float:
    """The output projection's FLOPs per translated sentence (2 d V per step and beam row): what no pruning of
    heads or neurons removes."""
    return 2.0 * embed_dim * vocabulary * shape.beam * shape.target_steps


def decoding_flops_costs(layout: HeadLayout, dims: Dict[str, Tuple[int, int]], ffn_layout: Dict[str, Tuple[int, int]],
                         embed_dims: Dict[str, int], shape: DecodingShape) -> LayerCosts:
    """Per-sentence decoding FLOPs of every attention layer keeping 0 .. H heads and every FFN layer keeping
    0 .. N neurons (``decoding_flops_per_head``, ``decoding_flops_per_neuron``)."""
    per_layer = {}
    for t in ATTENTION_TYPES:
        if t in layout:
            per_head = decoding_flops_per_head(t, *dims[t], shape)
            for layer in range(layout[t][0]):
                per_layer[(t, layer)] = [k * per_head for k in range(layout[t][1] + 1)]
    for t in FFN_TYPES:
        if t in ffn_layout:
            layers, neurons = ffn_layout[t]
            per_neuron = decoding_flops_per_neuron(t, embed_dims[t], shape)
            for layer in range(layers):
                per_layer[(t, layer)] = [k * per_neuron for k in range(neurons + 1)]
    return LayerCosts("decoding-flops", per_layer)


def _exact_text(value: float) -> str:
    """A number's shortest text that reads back to it: whole numbers without a decimal point."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 2 ** 53 else repr(float(value))


@dataclass(frozen=True)
class SearchBudget:
    """What a search may keep: ``amount`` in the costs' unit (heads, FLOPs per token, ms), or ``percent`` of the
    unpruned model's cost. Parsed once from the command line (``parse``), resolved against a model's costs by the
    engine (``resolve``)."""

    amount: Optional[float] = None
    percent: Optional[float] = None

    def __post_init__(self):
        if (self.amount is None) == (self.percent is None):
            raise SettingsError("the budget is an amount or a percentage, one of the two", setting="budget")
        value = self.amount if self.amount is not None else self.percent
        if not math.isfinite(value) or value < 0:
            raise SettingsError(f"the budget must be non-negative, got {self.text}", setting="budget")

    @classmethod
    def parse(cls, text: Union[str, float]) -> "SearchBudget":
        """``N`` (a number, or its text) or ``P%``."""
        if isinstance(text, (int, float)):
            return cls(amount=float(text))
        stripped = str(text).strip()
        percent = stripped.endswith("%")
        try:
            value = float(stripped[:-1] if percent else stripped)
        except ValueError:
            raise SettingsError(f"the budget: expected a number or a percentage, got {text!r}",
                                setting="budget") from None
        return cls(percent=value) if percent else cls(amount=value)

    @property
    def text(self) -> str:
        """The budget as ``parse`` reads it back to the same number: search.json records it, so no digit is lost
        (an amount compress hands over, e.g. 37576704 FLOPs per token, is not rounded to 3.75767e+07)."""
        return f"{_exact_text(self.percent)}%" if self.percent is not None else _exact_text(self.amount)

    def resolve(self, costs: LayerCosts) -> float:
        """The budget in the costs' unit; a number of heads must be whole, a percentage of them allows the whole heads
        within it."""
        full = costs.full_cost()
        value = self.amount if self.amount is not None else self.percent * full / 100.0
        if value > full * (1 + 1e-9):
            raise SettingsError(f"the budget {self.text} is more than the unpruned model costs ({full:g} "
                                f"{costs.unit}); nothing would be pruned", setting="budget")
        if costs.kind == "heads":
            if self.amount is not None and value != int(value):
                raise SettingsError(f"the budget: a number of heads must be whole, got {self.text}",
                                    setting="budget")
            value = float(math.floor(value + 1e-9))
        return value


# ----------------------------------------------------------------------------- latency tables


@dataclass
class LatencyTable:
    """Measured latency (ms) of every attention layer keeping k = 0 .. H heads (and FFN layer keeping k neurons).

    ``counts``: the neuron counts each FFN layer was timed at (in steps);
    attention layers are timed at every head count. ``engine`` and
    ``precision`` say what ran the layers, ``device`` where. A CTranslate2
    table prices a decoder's self- and cross-attention layers as one stack
    keeping one head count (``CTRANSLATE2_TIED_TYPES``).
    """

    per_layer: Dict[Block, List[float]]
    device: str
    architecture: Dict[str, object]  # layout and dimensions of the model measured
    settings: Dict[str, object] = field(default_factory=dict)
    counts: Dict[Block, List[int]] = field(default_factory=dict)
    engine: str = FAIRSEQ_ENGINE
    precision: str = DEFAULT_PRECISION

    def costs(self, structures: Sequence[str] = ("heads",)) -> LayerCosts:
        """The latency of the blocks of ``structures`` (heads, ffn)."""
        types = (ATTENTION_TYPES if "heads" in structures else ()) + (FFN_TYPES if "ffn" in structures else ())
        blocks = {b: c for b, c in self.per_layer.items() if b[0] in types}
        tied = CTRANSLATE2_TIED_TYPES if self.engine == CTRANSLATE2_ENGINE and "heads" in structures else ()
        return LayerCosts("latency", blocks, {b: c for b, c in self.counts.items() if b in blocks},
                          tuple(group for group in tied if any(b[0] in group for b in blocks)))

    @property
    def has_ffn(self) -> bool:
        return any(t in FFN_TYPES for t, _ in self.per_layer)


def write_latency_table(table: LatencyTable, path: str) -> None:
    write_json({
        "format": LATENCY_TABLE_FORMAT,
        "engine": table.engine,
        "device": table.device,
        "precision": table.precision,
        "architecture": table.architecture,
        "settings": table.settings,
        "per_layer_ms": {layer_name(*block): costs for block, costs in table.per_layer.items()
                         if block[0] in ATTENTION_TYPES},
        "ffn_layer_ms": {layer_name(*block): costs for block, costs in table.per_layer.items()
                         if block[0] in FFN_TYPES},
        "kept_counts": {layer_name(*block): counts for block, counts in table.counts.items()},
    }, path, indent=1)


def read_latency_table(path: str, architecture: Dict[str, object], device: str, engine: str = FAIRSEQ_ENGINE,
                       precision: str = DEFAULT_PRECISION) -> LatencyTable:
    """Read a latency table and check it was measured for this model, device, engine and precision.

    A table written before engines and precisions were recorded is a
    fairseq table of its settings' dtype (float32 if none).
    """
    description = "a latency table of the latency command"
    payload = read_json_of_format(path, LATENCY_TABLE_FORMAT, "latency_table", description)
    try:
        timed = dict(payload["per_layer_ms"], **payload.get("ffn_layer_ms", {}))  # attention layers, FFN layers
        per_layer = {parse_layer_name(name): [float(c) for c in costs] for name, costs in timed.items()}
        counts = {parse_layer_name(name): [int(c) for c in kept]
                  for name, kept in payload.get("kept_counts", {}).items()}
        settings = payload.get("settings", {})
        table = LatencyTable(per_layer, payload["device"], payload["architecture"], settings, counts,
                             payload.get("engine", FAIRSEQ_ENGINE),  # tables written before the engine was recorded
                             payload.get("precision",
                                         str(settings.get("dtype", DEFAULT_PRECISION)).replace("torch.", "")))
        if any(len(table.per_layer[b]) != len(c) for b, c in counts.items()):
            raise ValueError("a layer's timings and counts differ in length")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResultFileError(f"the latency table {path} is not {description} ({error})",
                              setting="latency_table") from error
    if not _same_model(table.architecture, architecture):
        raise ResultFileError(
            f"the latency table {path} was measured on another model ({_describe(table.architecture)}), "
            f"not this one ({_describe(architecture)})", setting="latency_table"
        )
    for what, theirs, ours in (("device", table.device, device), ("engine", table.engine, engine),
                               ("precision", table.precision, precision)):
        if theirs != ours:
            raise ResultFileError(
                f"the latency table {path} was measured on another {what} ({theirs}), not this one ({ours}); "
                "measure it here with the latency command", setting="latency_table"
            )
    return table


def _same_model(measured: Dict[str, object], model: Dict[str, object]) -> bool:
    """Same attention layout and dimensions; the same FFN shape when the table has FFN layers."""
    if any(measured.get(key) != model.get(key) for key in ("layout", "dims")):
        return False
    return "ffn" not in measured or measured["ffn"] == model.get("ffn")


def _describe(architecture: Dict[str, object]) -> str:
    parts = [
        f"{t} {layers}x{heads}, d={dims[0]}" for t, (layers, heads), dims in
        ((t, architecture["layout"][t], architecture["dims"][t]) for t in ATTENTION_TYPES
         if t in architecture["layout"])
    ]
    parts += [f"{t} {shape[0]}x{shape[1]}" for t, shape in architecture.get("ffn", {}).items()]
    return ", ".join(parts)


def predicted_speedup(whole_model_ms: float, full_cost: float, mask_cost: float) -> Optional[float]:
    """The speed-up a latency table predicts for a mask: the whole model's time over the time left once the
    mask saves what its layers' prices say (``full_cost - mask_cost``, prices above each layer's narrowest).
    None when the saving is not below the whole model's time: the table's timings were too noisy to say."""
    left = whole_model_ms - (full_cost - mask_cost)
    return whole_model_ms / left if left > 0 else None
